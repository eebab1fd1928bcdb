//! A connection as the auditor and the operator see it, kept beside its handler: the audit
//! events of its login (AUD-1, AUD-2) and the pause after a failed one (AUD-5), the pause before
//! a refused OPEN goes out (CONN-15), and its place in the detail endpoints' registry, from
//! which it answers their probes (OBS-1 … OBS-4). [`Observing`] wraps a bridge's handlers in
//! [`Observed`]; the driver runs them like any handler and knows none of this.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::auth::audit;
use crate::auth::throttle::LoginThrottle;
use crate::detail::{self, LinkLabels, Membership, Probe, Registry};
use crate::driver::{Arrival, Handler, HandlerFactory, Hold};
use crate::engine::{Connection, Event, SaslResult};

/// How long a refusal at OPEN waits before it is written (CONN-15).
const REFUSAL_PAUSE: Duration = Duration::from_secs(1);
/// Refused connections waiting out [`REFUSAL_PAUSE`] at a time, in the whole process: they no
/// longer hold a handshake place, so this bounds the sockets they keep.
const MAX_PACED: usize = 256;
static PACED: Semaphore = Semaphore::const_new(MAX_PACED);

/// Makes an [`Observed`] handler of each of `factory`'s.
pub struct Observing<F> {
    factory: F,
    registry: Arc<Registry>,
    /// Failed logins by source (AUD-5).
    logins: Arc<LoginThrottle>,
}

impl<F> Observing<F> {
    /// `factory`'s handlers, listed in `registry` once open.
    pub fn new(factory: F, registry: Arc<Registry>) -> Self {
        Observing {
            factory,
            registry,
            logins: Arc::default(),
        }
    }
}

impl<F> HandlerFactory for Observing<F>
where
    F: HandlerFactory,
    F::Handler: LinkLabels,
{
    type Handler = Observed<F::Handler>;

    fn new_handler(&self, arrival: &Arrival) -> Observed<F::Handler> {
        Observed {
            inner: self.factory.new_handler(arrival),
            arrival: *arrival,
            registry: self.registry.clone(),
            logins: self.logins.clone(),
            listed: None,
            probes: Vec::new(),
            hold: None,
        }
    }
}

/// One connection's handler, audited and listed.
pub struct Observed<H> {
    inner: H,
    arrival: Arrival,
    registry: Arc<Registry>,
    logins: Arc<LoginThrottle>,
    /// Joined at OPEN, left at the connection's end: what the detail endpoints list, and how
    /// they ask.
    listed: Option<(detail::Identity, Membership)>,
    /// Probes to answer on the next [`Handler::on_ready`].
    probes: Vec<Probe>,
    /// How long this turn's output waits.
    hold: Option<Hold>,
}

impl<H> Observed<H> {
    /// Audits one SASL exchange; a failure holds its outcome back (AUD-5).
    fn authenticated(&mut self, report: &crate::engine::SaslReport) {
        let source = self.arrival.peer.ip();
        if !matches!(report.outcome, SaslResult::Failure { .. }) {
            audit::authenticated(source, report);
            return;
        }
        crate::failures::FAILURES.authentication_failed();
        let verdict = self
            .logins
            .failed(source, tokio::time::Instant::now().into_std());
        if verdict.logged {
            audit::authenticated(source, report);
        }
        if let Some(count) = verdict.summary {
            audit::failures_summarized(source, count);
        }
        self.hold = Some(Hold {
            delay: verdict.delay,
            permit: None,
        });
    }
}

impl<H: Handler + LinkLabels> Handler for Observed<H> {
    fn on_event(&mut self, conn: &mut Connection, event: Event) {
        match &event {
            Event::Authenticated(report) => self.authenticated(report),
            Event::OpenRefused { error } => {
                tracing::debug!(%error, "connection refused at open");
                // CONN-15: the refusal (already in the engine's output) waits, so that a client
                // reconnecting at once asks about once a second, not thousands of times, while
                // the broker is away or the slots are full. At most MAX_PACED wait at a time;
                // past that a refusal goes at once.
                if let Ok(permit) = PACED.try_acquire() {
                    self.hold = Some(Hold {
                        delay: REFUSAL_PAUSE,
                        permit: Some(permit),
                    });
                }
            }
            Event::Opened {
                client_id,
                container_id,
                product,
                version,
                ..
            } => {
                let identity = detail::Identity {
                    client_id: client_id.clone(),
                    container_id: crate::engine::sanitize_client_id(container_id),
                    product: product.clone(),
                    version: version.clone(),
                    connected_at: self.arrival.connected_at,
                    source_ip: self.arrival.peer.ip(),
                    tls: self.arrival.tls,
                };
                self.listed = Some((identity, self.registry.join()));
            }
            // Closed: no longer listed.
            Event::Closed { .. } => self.listed = None,
            _ => {}
        }
        self.inner.on_event(conn, event);
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some((_, membership)) = &mut self.listed {
            while let Poll::Ready(Some(probe)) = membership.poll_probe(cx) {
                self.probes.push(probe);
            }
        }
        let inner = self.inner.poll_ready(cx);
        if inner.is_ready() || !self.probes.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    fn on_ready(&mut self, conn: &mut Connection) {
        // A probe of a connection no longer listed is dropped: the endpoint leaves it out.
        let probes = std::mem::take(&mut self.probes);
        if let Some((identity, _)) = &self.listed {
            for probe in probes {
                let _ = probe.send(identity.snapshot(conn, &self.inner));
            }
        }
        self.inner.on_ready(conn);
    }

    fn after_turn(&mut self, conn: &mut Connection) {
        self.inner.after_turn(conn);
    }

    fn hold_output(&mut self) -> Option<Hold> {
        self.hold.take()
    }
}

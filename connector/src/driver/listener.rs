//! The listener: accepts connections, spawns one task each, and on shutdown closes every
//! connection with `amqp:connection:forced` and waits a bounded time.
//!
//! Two bounds keep clients that never authenticate from keeping out those that do. Every socket
//! is accepted at once into a pool of handshake places ([`handshake_pool`]); when the pool is
//! full, a handshake of the address holding the most places is dropped to make room (its oldest
//! that has had a first turn), so a newcomer always gets a turn, a flood from one address pushes
//! out only its own sockets, and a socket whose bytes are already there is looked at before it
//! can go. A MaxConnections slot and the broker's readiness (CONN-15) are looked at only at the
//! client's OPEN, which comes after SASL: a socket that sends nothing, or only a protocol header,
//! never holds a slot.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ops::accept::AcceptBackoff;
use ops::held::{Held, Hold};
use ops::logs::RateLimited;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::connection::Wire;
use super::tls::TlsSource;
use super::{run_connection, Accepted, Arrival, HandlerFactory, Surroundings};
use crate::engine::{Admission, AmqpError, Condition, EngineConfig, Transport};

/// How the listener runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Connections open at once; 0 = unlimited (CFG-8).
    pub max_connections: u32,
    /// How long shutdown waits for connections to finish their CLOSE exchange.
    pub shutdown_grace: Duration,
    /// The broker's readiness (`backend::readiness`): while false, new connections are refused
    /// at OPEN with `amqp:not-allowed`, `broker not ready` (CONN-15), and when it turns false the
    /// open ones are closed with `amqp:connection:forced` (CONN-16). None: always ready.
    pub broker_ready: Option<watch::Receiver<bool>>,
}

/// Places for connections that have not opened yet (TLS, protocol header, SASL, up to OPEN):
/// as many as `max_connections` and at least 256, or 4,096 when connections are unlimited.
pub fn handshake_pool(max_connections: u32) -> usize {
    if max_connections == 0 {
        4096
    } else {
        (max_connections as usize).max(256)
    }
}

/// The sockets AMQP is served on.
#[derive(Debug, Default)]
pub struct Listeners {
    /// Plain AMQP (`Port`).
    pub plain: Option<TcpListener>,
    /// AMQP inside TLS (`TlsPort`), and where its handshakes get their configuration (TLS-1).
    pub tls: Option<(TcpListener, Arc<TlsSource>)>,
}

impl From<TcpListener> for Listeners {
    fn from(plain: TcpListener) -> Self {
        Listeners {
            plain: Some(plain),
            tls: None,
        }
    }
}

/// What every connection task shares.
struct Shared<F> {
    /// Connections before their OPEN; the oldest goes when a newcomer needs the place.
    handshakes: Held,
    /// MaxConnections, taken at OPEN.
    slots: Arc<Semaphore>,
    /// Handshakes dropped to make room, for a rate-limited warning.
    dropped: RateLimited,
    cfg: Arc<EngineConfig>,
    factory: Arc<F>,
    stop: watch::Receiver<bool>,
    ready: Option<watch::Receiver<bool>>,
}

/// Serves AMQP on `listeners` until `shutdown` resolves, then closes every connection.
pub async fn serve<F: HandlerFactory>(
    listeners: impl Into<Listeners>,
    cfg: Arc<EngineConfig>,
    opts: ServeOptions,
    factory: Arc<F>,
    shutdown: impl Future<Output = ()>,
) {
    let Listeners { plain, tls } = listeners.into();
    let (stop_tx, stop_rx) = watch::channel(false);
    let slots = if opts.max_connections == 0 {
        Semaphore::MAX_PERMITS
    } else {
        opts.max_connections as usize
    };
    let shared = Arc::new(Shared {
        handshakes: Held::new(handshake_pool(opts.max_connections)),
        slots: Arc::new(Semaphore::new(slots)),
        dropped: RateLimited::default(),
        cfg,
        factory,
        stop: stop_rx,
        ready: opts.broker_ready.clone(),
    });
    let mut tasks = JoinSet::new();
    let mut next_id: u64 = 0;
    let mut plain_backoff = AcceptBackoff::new("AMQP");
    let mut tls_backoff = AcceptBackoff::new("AMQPS");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = accept(plain.as_ref()) => {
                let Some((stream, peer)) = settle(accepted, &mut plain_backoff).await else {
                    continue;
                };
                next_id += 1;
                let span = tracing::info_span!("conn", id = next_id, %peer);
                spawn_plain(&mut tasks, &shared, stream, peer, span);
                // A flood of connects must not keep the accept loop from the handshakes.
                tokio::task::yield_now().await;
            }
            accepted = accept(tls.as_ref().map(|(l, _)| l)) => {
                let Some((stream, peer)) = settle(accepted, &mut tls_backoff).await else {
                    continue;
                };
                let Some((_, source)) = tls.as_ref() else { continue };
                next_id += 1;
                let span = tracing::info_span!("conn", id = next_id, %peer, tls = true);
                spawn_tls(&mut tasks, &shared, stream, peer, source.clone(), span);
                tokio::task::yield_now().await;
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop((plain, tls));
    tracing::info!(
        connections = tasks.len(),
        "shutting down: closing connections"
    );
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(opts.shutdown_grace, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            left = tasks.len(),
            "shutdown grace elapsed; aborting the remaining connections"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}

/// The next connection on `listener`; never, when there is none.
async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// The accepted socket, or `None` after pausing on a failed accept.
async fn settle(
    accepted: std::io::Result<(TcpStream, SocketAddr)>,
    backoff: &mut AcceptBackoff,
) -> Option<(TcpStream, SocketAddr)> {
    match accepted {
        Ok((stream, peer)) => {
            backoff.succeeded();
            let _ = stream.set_nodelay(true);
            Some((stream, peer))
        }
        Err(e) => {
            backoff.failed(&e).await;
            None
        }
    }
}

/// Runs a plain connection.
fn spawn_plain<F: HandlerFactory>(
    tasks: &mut JoinSet<()>,
    shared: &Arc<Shared<F>>,
    stream: TcpStream,
    peer: SocketAddr,
    span: tracing::Span,
) {
    spawn(tasks, shared, peer, span, |_| async move { Some(stream) });
}

/// Runs a TLS connection: its handshake first, with the TLS files as they are now (looked at in
/// the connection's task, not the accept loop), which must finish before the handshake
/// deadline, then the AMQP protocol header inside TLS (TLS-5).
fn spawn_tls<F: HandlerFactory>(
    tasks: &mut JoinSet<()>,
    shared: &Arc<Shared<F>>,
    stream: TcpStream,
    peer: SocketAddr,
    source: Arc<TlsSource>,
    span: tracing::Span,
) {
    spawn(tasks, shared, peer, span, |deadline| async move {
        let acceptor = source.acceptor();
        match tokio::time::timeout_at(deadline.into(), acceptor.accept(stream)).await {
            Ok(Ok(tls)) => Some(tls),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "TLS handshake failed");
                crate::failures::FAILURES.tls_handshake_failed();
                None
            }
            Err(_) => {
                tracing::debug!("TLS handshake not finished in time; dropped");
                crate::failures::FAILURES.tls_handshake_failed();
                None
            }
        }
    });
}

/// Runs one connection whose stream `open` makes (given the handshake deadline, counted from
/// accept), holding a handshake place until its OPEN.
fn spawn<F, S, O, Fut>(
    tasks: &mut JoinSet<()>,
    shared: &Arc<Shared<F>>,
    peer: SocketAddr,
    span: tracing::Span,
    open: O,
) where
    F: HandlerFactory,
    S: Wire,
    O: FnOnce(Instant) -> Fut,
    Fut: Future<Output = Option<S>> + Send + 'static,
{
    let at = Instant::now();
    let deadline = at + shared.cfg.handshake_timeout;
    let place = shared.handshakes.admit_waiting(peer.ip());
    let opening = open(deadline);
    let shared = shared.clone();
    tasks.spawn(
        async move {
            // Its first turn: from now on it can be dropped as the oldest handshake, not before
            // (a newcomer's bytes may all be there already, however many sockets followed it).
            place.hold.started();
            let mut evicted = place.evicted;
            let opened = Arc::new(AtomicBool::new(false));
            let admission = SlotAtOpen {
                slots: shared.slots.clone(),
                ready: shared.ready.clone(),
                handshake: Some(place.hold),
                slot: None,
                opened: opened.clone(),
            };
            let run = async {
                let Some(stream) = opening.await else {
                    return;
                };
                tracing::debug!("accepted");
                let arrival = Arrival {
                    peer,
                    tls: stream.transport() != Transport::Plain,
                    connected_at: std::time::SystemTime::now() - at.elapsed(),
                };
                let socket = Accepted {
                    stream,
                    read: BytesMut::new(),
                    at,
                    peer,
                };
                let around = Surroundings {
                    cfg: shared.cfg.clone(),
                    admission: Box::new(admission),
                    shutdown: shared.stop.clone(),
                    broker_ready: shared.ready.clone(),
                };
                let handler = shared.factory.new_handler(&arrival);
                run_connection(socket, around, handler).await;
                tracing::debug!("finished");
            };
            tokio::pin!(run);
            tokio::select! {
                _ = &mut run => {}
                // Only a connection still in its handshake is told to go: one told so in the
                // turn it reached OPEN has left the handshakes already and runs on.
                Ok(()) = &mut evicted => {
                    if opened.load(Ordering::Acquire) {
                        run.await;
                    } else {
                        shared.dropped.note(|n| {
                            tracing::warn!(%peer, dropped = n, "handshake places full: dropping the oldest handshake");
                        });
                    }
                }
            }
        }
        .instrument(span),
    );
}

/// The connection's admission at OPEN: the broker must be ready, and a MaxConnections slot free;
/// the slot is then held for the connection's life, and its handshake place given up.
struct SlotAtOpen {
    slots: Arc<Semaphore>,
    ready: Option<watch::Receiver<bool>>,
    handshake: Option<Hold>,
    slot: Option<OwnedSemaphorePermit>,
    /// Set at OPEN: the connection is past its handshake, whatever the handshake places say.
    opened: Arc<AtomicBool>,
}

impl Admission for SlotAtOpen {
    fn at_open(&mut self) -> Option<AmqpError> {
        // Decided either way: the handshake place goes, so a refusal held back for its pause
        // (CONN-15) cannot be dropped as the oldest handshake instead of being told why.
        self.handshake = None;
        self.opened.store(true, Ordering::Release);
        if !self.ready.as_ref().is_none_or(|r| *r.borrow()) {
            return Some(AmqpError::new(Condition::NotAllowed, "broker not ready"));
        }
        match self.slots.clone().try_acquire_owned() {
            Ok(slot) => {
                self.slot = Some(slot);
                None
            }
            Err(_) => Some(AmqpError::new(
                Condition::ResourceLimitExceeded,
                "connection limit reached",
            )),
        }
    }
}

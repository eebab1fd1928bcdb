//! The listener: accepts connections, applies MaxConnections and the broker's readiness (CONN-15),
//! spawns one task each, and on shutdown closes every connection with `amqp:connection:forced` and
//! waits a bounded time.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ops::accept::AcceptBackoff;
use ops::logs::RateLimited;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::connection::Wire;
use super::tls::TlsSource;
use super::{run_connection, Accepted, HandlerFactory, Surroundings};
use crate::detail::Registry;
use crate::engine::{AmqpError, Condition, EngineConfig};

/// How the listener runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Connections served at once; 0 = unlimited (CFG-8).
    pub max_connections: u32,
    /// How long shutdown waits for connections to finish their CLOSE exchange.
    pub shutdown_grace: Duration,
    /// The broker's readiness (`backend::readiness`): while false, new connections are refused
    /// at OPEN with `amqp:not-allowed`, `broker not ready` (CONN-15), and when it turns false the
    /// open ones are closed with `amqp:connection:forced` (CONN-16). None: always ready.
    pub broker_ready: Option<watch::Receiver<bool>>,
    /// Count a connection against `max_connections` only once its 8-byte protocol header came:
    /// sockets that say nothing then wait in a pool of their own (`waiting_pool` places; past
    /// it they are dropped at once) until the handshake timeout, holding no connection slot.
    pub count_after_header: bool,
    /// Where open connections are listed for the detail endpoints (OBS-1).
    pub registry: Arc<Registry>,
}

/// Places for sockets that have not sent their protocol header yet, with
/// `count_after_header`: 4 × `max_connections` and at least 64 (unlimited when it is), so that
/// clients arriving among silent sockets still find a place.
pub fn waiting_pool(max_connections: u32) -> usize {
    if max_connections == 0 {
        Semaphore::MAX_PERMITS
    } else {
        (max_connections as usize).saturating_mul(4).max(64)
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
    gate: Gate,
    cfg: Arc<EngineConfig>,
    factory: Arc<F>,
    stop: watch::Receiver<bool>,
    ready: Option<watch::Receiver<bool>>,
    count_after_header: bool,
    registry: Arc<Registry>,
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
    let shared = Arc::new(Shared {
        gate: Gate::new(&opts),
        cfg,
        factory,
        stop: stop_rx,
        ready: opts.broker_ready.clone(),
        count_after_header: opts.count_after_header,
        registry: opts.registry.clone(),
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
            }
            accepted = accept(tls.as_ref().map(|(l, _)| l)) => {
                let Some((stream, peer)) = settle(accepted, &mut tls_backoff).await else {
                    continue;
                };
                let Some((_, source)) = tls.as_ref() else { continue };
                next_id += 1;
                let span = tracing::info_span!("conn", id = next_id, %peer, tls = true);
                spawn_tls(&mut tasks, &shared, stream, peer, source.clone(), span);
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
                None
            }
            Err(_) => {
                tracing::debug!("TLS handshake not finished in time; dropped");
                None
            }
        }
    });
}

/// Runs one connection whose stream `open` makes (given the handshake deadline, counted from
/// accept): admitted at accept, or with `count_after_header` once its protocol header came,
/// holding a waiting place until then.
fn spawn<F, S, O, Fut>(
    tasks: &mut JoinSet<()>,
    shared: &Arc<Shared<F>>,
    peer: SocketAddr,
    span: tracing::Span,
    open: O,
) where
    F: HandlerFactory,
    S: Wire + AsyncRead + Unpin,
    O: FnOnce(Instant) -> Fut,
    Fut: Future<Output = Option<S>> + Send + 'static,
{
    let at = Instant::now();
    let deadline = at + shared.cfg.handshake_timeout;
    let early = if shared.count_after_header {
        match shared.gate.waiting_place(peer) {
            Some(waiting) => Err(waiting),
            None => return,
        }
    } else {
        match Admitted::now(shared, peer) {
            Some(admitted) => Ok(admitted),
            None => return,
        }
    };
    let opening = open(deadline);
    let shared = shared.clone();
    tasks.spawn(
        async move {
            let Some(stream) = opening.await else {
                return;
            };
            let (admitted, stream, header) = match early {
                Ok(admitted) => (admitted, stream, BytesMut::new()),
                Err(waiting) => {
                    let Some((stream, header)) = read_header(stream, deadline).await else {
                        tracing::debug!("no protocol header in time; dropped");
                        return;
                    };
                    drop(waiting);
                    let Some(admitted) = Admitted::now(&shared, peer) else {
                        return;
                    };
                    (admitted, stream, header)
                }
            };
            admitted.run(stream, header, at).await;
        }
        .instrument(span),
    );
}

/// A connection that holds its slot (or a refusal's), with what its task needs.
struct Admitted<F: HandlerFactory> {
    permit: OwnedSemaphorePermit,
    refusal: Option<AmqpError>,
    handler: F::Handler,
    cfg: Arc<EngineConfig>,
    stop: watch::Receiver<bool>,
    ready: Option<watch::Receiver<bool>>,
    registry: Arc<Registry>,
    peer: SocketAddr,
}

impl<F: HandlerFactory> Admitted<F> {
    /// Admits a connection from `peer` now; `None` when it is to be dropped.
    fn now(shared: &Shared<F>, peer: SocketAddr) -> Option<Admitted<F>> {
        let (permit, refusal) = shared.gate.admit(peer)?;
        Some(Admitted {
            permit,
            refusal,
            handler: shared.factory.new_handler(peer),
            cfg: shared.cfg.clone(),
            stop: shared.stop.clone(),
            ready: shared.ready.clone(),
            registry: shared.registry.clone(),
            peer,
        })
    }

    async fn run<S: Wire>(self, stream: S, read: BytesMut, at: Instant) {
        tracing::debug!("accepted");
        let socket = Accepted {
            stream,
            read,
            at,
            peer: self.peer,
        };
        let around = Surroundings {
            cfg: self.cfg,
            admission: self.refusal,
            shutdown: self.stop,
            broker_ready: self.ready,
            registry: self.registry,
        };
        run_connection(socket, around, self.handler).await;
        tracing::debug!("finished");
        drop(self.permit);
    }
}

/// The first 8 bytes a client sends (its protocol header, checked by the engine), before
/// `deadline`; `None` when they do not come.
async fn read_header<S: AsyncRead + Unpin>(
    mut stream: S,
    deadline: Instant,
) -> Option<(S, BytesMut)> {
    let mut header = [0u8; 8];
    match tokio::time::timeout_at(deadline.into(), stream.read_exact(&mut header)).await {
        Ok(Ok(_)) => Some((stream, BytesMut::from(&header[..]))),
        _ => None,
    }
}

/// Who gets in: MaxConnections slots, the broker's readiness, and a pool for refusals.
struct Gate {
    permits: Arc<Semaphore>,
    /// Refused connections get OPEN + CLOSE, which takes a task too; past this many, drop at once.
    refusals: Arc<Semaphore>,
    /// Connections that have not sent their protocol header (with `count_after_header`).
    waiting: Arc<Semaphore>,
    broker_ready: Option<watch::Receiver<bool>>,
    drops: RateLimited,
}

impl Gate {
    fn new(opts: &ServeOptions) -> Gate {
        let slots = if opts.max_connections == 0 {
            Semaphore::MAX_PERMITS
        } else {
            opts.max_connections as usize
        };
        Gate {
            permits: Arc::new(Semaphore::new(slots)),
            refusals: Arc::new(Semaphore::new(opts.max_connections.max(16) as usize)),
            waiting: Arc::new(Semaphore::new(waiting_pool(opts.max_connections))),
            broker_ready: opts.broker_ready.clone(),
            drops: RateLimited::default(),
        }
    }

    /// A place among the sockets waiting for their protocol header (with
    /// `count_after_header`); `None` when the pool is full and the socket is to be dropped.
    fn waiting_place(&self, peer: SocketAddr) -> Option<OwnedSemaphorePermit> {
        let place = self.waiting.clone().try_acquire_owned().ok();
        if place.is_none() {
            self.drops.note(|n| {
                tracing::warn!(%peer, dropped = n, "too many connections waiting for their protocol header; dropping");
            });
        }
        place
    }

    /// A slot for a new connection, with the refusal it is to get at OPEN if any (CONN-15); `None`
    /// when even the refusal pool is full and the socket is to be dropped.
    fn admit(&self, peer: SocketAddr) -> Option<(OwnedSemaphorePermit, Option<AmqpError>)> {
        let ready = self.broker_ready.as_ref().is_none_or(|r| *r.borrow());
        let admitted = if ready {
            self.permits.clone().try_acquire_owned().map_err(|_| {
                AmqpError::new(Condition::ResourceLimitExceeded, "connection limit reached")
            })
        } else {
            Err(AmqpError::new(Condition::NotAllowed, "broker not ready"))
        };
        match admitted {
            Ok(p) => Some((p, None)),
            Err(refusal) => match self.refusals.clone().try_acquire_owned() {
                Ok(p) => Some((p, Some(refusal))),
                Err(_) => {
                    self.drops.note(|n| {
                        tracing::warn!(%peer, dropped = n, reason = %refusal.description.as_deref().unwrap_or(""), "refusing too many connections at once; dropping");
                    });
                    None
                }
            },
        }
    }
}

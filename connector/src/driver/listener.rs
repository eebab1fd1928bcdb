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
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::{run_connection, Accepted, HandlerFactory};
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
    /// sockets that say nothing then wait in a pool of their own ([`waiting_pool`] places; past
    /// it they are dropped at once) until the handshake timeout, holding no connection slot.
    pub count_after_header: bool,
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

/// Serves AMQP on `listener` until `shutdown` resolves, then closes every connection.
pub async fn serve<F: HandlerFactory>(
    listener: TcpListener,
    cfg: Arc<EngineConfig>,
    opts: ServeOptions,
    factory: Arc<F>,
    shutdown: impl Future<Output = ()>,
) {
    let gate = Arc::new(Gate::new(&opts));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut next_id: u64 = 0;
    let mut backoff = AcceptBackoff::new("AMQP");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => {
                        backoff.succeeded();
                        a
                    }
                    Err(e) => {
                        backoff.failed(&e).await;
                        continue;
                    }
                };
                next_id += 1;
                let accepted_at = Instant::now();
                let span = tracing::info_span!("conn", id = next_id, %peer);
                let (gate, cfg, factory) = (gate.clone(), cfg.clone(), factory.clone());
                let (stop, ready) = (stop_rx.clone(), opts.broker_ready.clone());
                if !opts.count_after_header {
                    let Some((permit, admission)) = gate.admit(peer) else {
                        continue;
                    };
                    let handler = factory.new_handler(peer);
                    let socket = Accepted { stream, read: BytesMut::new(), at: accepted_at };
                    let fut = run_connection(socket, cfg, admission, handler, stop, ready);
                    tasks.spawn(async move {
                        tracing::debug!("accepted");
                        fut.await;
                        tracing::debug!("finished");
                        drop(permit);
                    }.instrument(span));
                    continue;
                }
                let Ok(waiting) = gate.waiting.clone().try_acquire_owned() else {
                    gate.drops.note(|n| {
                        tracing::warn!(%peer, dropped = n, "too many connections waiting for their protocol header; dropping");
                    });
                    continue;
                };
                tasks.spawn(async move {
                    let Some((stream, header)) = read_header(stream, cfg.handshake_timeout).await else {
                        tracing::debug!("no protocol header in time; dropped");
                        return;
                    };
                    drop(waiting);
                    let Some((permit, admission)) = gate.admit(peer) else {
                        return;
                    };
                    tracing::debug!("accepted");
                    let handler = factory.new_handler(peer);
                    let socket = Accepted { stream, read: header, at: accepted_at };
                    run_connection(socket, cfg, admission, handler, stop, ready).await;
                    tracing::debug!("finished");
                    drop(permit);
                }.instrument(span));
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
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

/// The first 8 bytes a client sends (its protocol header, checked by the engine), within
/// `timeout`; `None` when they do not come.
async fn read_header(mut stream: TcpStream, timeout: Duration) -> Option<(TcpStream, BytesMut)> {
    let mut header = [0u8; 8];
    match tokio::time::timeout(timeout, stream.read_exact(&mut header)).await {
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

//! The listener: accepts connections, applies MaxConnections and the broker's readiness (CONN-15),
//! spawns one task each, and on shutdown closes every connection with `amqp:connection:forced` and
//! waits a bounded time.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::{run_connection, HandlerFactory};
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
}

/// Serves AMQP on `listener` until `shutdown` resolves, then closes every connection.
pub async fn serve<F: HandlerFactory>(
    listener: TcpListener,
    cfg: Arc<EngineConfig>,
    opts: ServeOptions,
    factory: Arc<F>,
    shutdown: impl Future<Output = ()>,
) {
    let unlimited = opts.max_connections == 0;
    let permits = Arc::new(Semaphore::new(if unlimited {
        Semaphore::MAX_PERMITS
    } else {
        opts.max_connections as usize
    }));
    // Refused connections get OPEN + CLOSE, which takes a task too; past this many, drop at once.
    let refusals = Arc::new(Semaphore::new(opts.max_connections.max(16) as usize));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut next_id: u64 = 0;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                next_id += 1;
                let ready = opts.broker_ready.as_ref().is_none_or(|r| *r.borrow());
                let admitted = if ready {
                    permits.clone().try_acquire_owned().map_err(|_| {
                        AmqpError::new(Condition::ResourceLimitExceeded, "connection limit reached")
                    })
                } else {
                    Err(AmqpError::new(Condition::NotAllowed, "broker not ready"))
                };
                let (permit, admission) = match admitted {
                    Ok(p) => (p, None),
                    Err(refusal) => match refusals.clone().try_acquire_owned() {
                        Ok(p) => (p, Some(refusal)),
                        Err(_) => {
                            tracing::warn!(%peer, reason = %refusal.description.as_deref().unwrap_or(""), "refusing too many connections at once; dropping");
                            continue;
                        }
                    },
                };
                let handler = factory.new_handler(peer);
                let span = tracing::info_span!("conn", id = next_id, %peer);
                let fut = run_connection(stream, cfg.clone(), admission, handler, stop_rx.clone(), opts.broker_ready.clone());
                tasks.spawn(async move {
                    tracing::debug!("accepted");
                    fut.await;
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

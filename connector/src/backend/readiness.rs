//! Whether the broker is ready: a ping now and then every second. The state answers `/readyz`,
//! decides admission (while the broker is not ready, new connections are refused at OPEN with
//! `amqp:not-allowed`, `broker not ready`, CONN-15), and its loss closes the open connections with
//! `amqp:connection:forced` (CONN-16).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::Backend;

/// How often readiness is checked.
pub const EVERY: Duration = Duration::from_secs(1);
/// How long one ping may take before it counts as no answer (a ping against a broker that is
/// down would otherwise retry for the gRPC client's whole deadline).
pub const PING_LIMIT: Duration = Duration::from_secs(1);
/// Checks in a row without an answer before a ready broker counts as lost: one slow ping must
/// not close every connection.
pub const LOST_AFTER: u32 = 3;

/// Pings `backend` once (so the state is right before the first connection), then keeps the
/// state up to date from a task of its own, which ends when every receiver is gone.
pub async fn watch<B: Backend>(backend: Arc<B>) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(answers(&*backend).await);
    tokio::spawn(async move {
        let mut misses = 0;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(EVERY) => {}
                _ = tx.closed() => return,
            }
            if answers(&*backend).await {
                misses = 0;
            } else {
                misses += 1;
            }
            let ready = *tx.borrow();
            let now = if ready {
                misses < LOST_AFTER
            } else {
                misses == 0
            };
            if now != ready {
                if now {
                    tracing::info!("broker ready: connections are admitted");
                } else {
                    tracing::warn!("broker not ready: connections are closed and new ones refused");
                }
                tx.send_replace(now);
            }
        }
    });
    rx
}

async fn answers<B: Backend>(backend: &B) -> bool {
    matches!(
        tokio::time::timeout(PING_LIMIT, backend.ping()).await,
        Ok(Ok(_))
    )
}

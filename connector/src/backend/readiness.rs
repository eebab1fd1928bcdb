//! Whether the broker is ready: a ping now and then every second. The flag answers `/readyz` and
//! decides admission — while the broker does not answer, new connections are refused at OPEN
//! with `amqp:not-allowed`, `broker not ready` (CONN-15).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::Backend;

/// How often readiness is checked.
pub const EVERY: Duration = Duration::from_secs(1);
/// How long one ping may take before the broker counts as not ready (a ping against a broker that
/// is down would otherwise retry until the client's whole deadline).
pub const PING_LIMIT: Duration = Duration::from_secs(1);

/// Pings `backend` once (so the flag is right before the first connection), then keeps the flag
/// up to date from a task of its own until the runtime ends.
pub async fn watch<B: Backend>(backend: Arc<B>) -> Arc<AtomicBool> {
    let ready = Arc::new(AtomicBool::new(answers(&*backend).await));
    let flag = ready.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(EVERY).await;
            let now = answers(&*backend).await;
            if flag.swap(now, Ordering::AcqRel) != now {
                if now {
                    tracing::info!("broker ready: connections are admitted");
                } else {
                    tracing::warn!("broker not ready: new connections are refused");
                }
            }
        }
    });
    ready
}

async fn answers<B: Backend>(backend: &B) -> bool {
    matches!(
        tokio::time::timeout(PING_LIMIT, backend.ping()).await,
        Ok(Ok(_))
    )
}

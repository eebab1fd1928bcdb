//! What the pattern code of one connection borrows from it: who the connection is and the
//! backend its calls go through.

use std::sync::Arc;

use super::caller::Caller;
use crate::engine::Credential;
use crate::metrics::Metrics;

/// One connection as its pattern code sees it.
pub(crate) struct Ctx<B> {
    /// The backend this connection's calls go through: the shared one, or one presenting the
    /// client's token to KubeMQ (SASL-3).
    pub(crate) backend: Arc<B>,
    /// That token, when the backend presents it.
    pub(crate) credential: Option<Credential>,
    /// Who this connection's KubeMQ calls are made as (AUTHZ-9).
    pub(crate) caller: Caller,
    /// The connection's number in this process (its consumers' keys, its dynamic nodes' names).
    pub(crate) connection: u64,
    /// The connection's ClientID (SASL-6).
    pub(crate) client_id: String,
    /// The OPEN container-id as sent: with a link's name, it names a durable subscription
    /// (DUR-2).
    pub(crate) container_id: String,
    /// The process's metrics.
    pub(crate) metrics: Arc<Metrics>,
}

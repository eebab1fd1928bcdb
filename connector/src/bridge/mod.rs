//! Pattern bridges: what sits between AMQP links and the KubeMQ backend.
//!
//! A message's way through: [`connection`] is the one handler of each connection; it resolves a
//! link's address ([`address`]) into a [`links::LinkEntry`] and hands each engine event of that
//! link to the part that serves it — [`queues`], [`events`] (events and events-store), [`rpc`]
//! (commands and queries) or [`dynamic`] (the connection's private nodes). Every part reads and
//! writes the `amqp10` [`envelope`], tells the client what became of its messages through
//! [`outcome`], and makes its backend calls through the connection's [`context::Ctx`].
//! [`Bridge`] is the process-wide part.

pub mod address;
pub mod caller;
pub mod connection;
mod context;
pub mod dynamic;
pub mod envelope;
pub mod events;
mod in_flight;
mod links;
mod outbound;
mod outcome;
pub mod queues;
pub mod rpc;
pub mod selector;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::Access;
use crate::backend::Backend;
use crate::config::Settings;
use crate::metrics::Metrics;
use crate::pattern::Pattern;

/// A channel's Get loop ends after this long without consumers (and closes its session).
const FETCH_IDLE_EXIT: Duration = Duration::from_secs(60);

/// The process-wide part of the bridge: the backend, the policy, the settings every connection
/// shares, and each pattern's shared state.
pub struct Bridge<B: Backend> {
    /// The backend every connection's calls go through, unless it presents the client's token.
    pub(crate) backend: Arc<B>,
    /// The process's metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// Who may read and write which channel (AUTHZ-1).
    pub(crate) access: Access,
    /// Whether clients authenticate, so that their KubeMQ calls are made as them (AUTHZ-9).
    pub(crate) authenticated: bool,
    /// The pattern of an address that names none (ADDR-8).
    pub(crate) default_pattern: Pattern,
    /// The number of the next connection.
    pub(crate) next_connection: AtomicU64,
    /// The credit window of every link the client sends on (CFG-21).
    pub(crate) produce_credit_window: u32,
    /// The queues bridge's process-wide part.
    pub(crate) queues: queues::Shared,
    /// The events and events-store bridge's process-wide part.
    pub(crate) events: events::Shared,
    /// The commands and queries bridge's settings.
    pub(crate) rpc: rpc::Shared,
}

impl<B: Backend> Bridge<B> {
    /// The bridge over `backend` with the connector's settings, deciding links and messages
    /// with `access`.
    pub fn new(
        backend: B,
        settings: &Settings,
        metrics: Arc<Metrics>,
        access: Access,
    ) -> Arc<Self> {
        let max_unsettled = settings.max_unsettled_per_link.max(1);
        Arc::new(Bridge {
            backend: Arc::new(backend),
            metrics,
            access,
            authenticated: settings.authentication,
            default_pattern: settings.default_pattern,
            next_connection: AtomicU64::new(1),
            produce_credit_window: settings.produce_credit_window(),
            queues: queues::Shared {
                max_unsettled,
                limits: queues::fetcher::FetchLimits {
                    max_batch: 1000.max(settings.get_batch_size),
                    idle_exit: FETCH_IDLE_EXIT,
                },
                fetchers: queues::fetcher::Registry::default(),
                next_lane: AtomicU64::new(0),
            },
            events: events::Shared {
                durable: Default::default(),
                buffer: max_unsettled as usize,
            },
            rpc: rpc::Shared {
                max_pending: settings.rpc_max_pending.max(1) as usize,
                default_timeout: Duration::from_secs(u64::from(
                    settings.default_rpc_timeout_seconds.max(1),
                )),
            },
        })
    }
}

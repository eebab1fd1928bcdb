//! The thin tokio driver: a listener, one task per connection that moves bytes between the socket
//! and the sans-IO engine, timers, and graceful shutdown. All protocol decisions live in the
//! engine; all pattern logic lives in a [`Handler`].

mod connection;
mod listener;
mod tls;

use std::net::SocketAddr;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use crate::engine::{Connection, Event};

pub use connection::{run_connection, Accepted, Surroundings, Wire};
pub use listener::{serve, Listeners, ServeOptions};
pub use tls::{TlsError, TlsSource};

/// The application side of one connection: it reacts to engine events by issuing commands on the
/// engine, and may have background work (backend calls, messages from other connections) that
/// wakes the connection task through [`Handler::poll_ready`].
pub trait Handler: Send + 'static {
    /// Reacts to one event.
    fn on_event(&mut self, conn: &mut Connection, event: Event);

    /// Ready when background work wants the engine; the default never is.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }

    /// Does the work announced by `poll_ready`.
    fn on_ready(&mut self, _conn: &mut Connection) {}

    /// Called once per turn of the connection loop, after that turn's events: for engine state
    /// that changes without an event (a BEGIN or END, error tallies).
    fn after_turn(&mut self, _conn: &mut Connection) {}

    /// Asked after each turn: how long that turn's output waits before it is written (a refusal
    /// paced, so that a client retrying at once does not spin); none by default.
    fn hold_output(&mut self) -> Option<Hold> {
        None
    }
}

/// A wait before a turn's output is written.
#[derive(Debug)]
pub struct Hold {
    /// How long.
    pub delay: Duration,
    /// A place among a bounded number of waits, given back when the wait ends.
    pub permit: Option<tokio::sync::SemaphorePermit<'static>>,
}

/// Where and when a connection came from.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    /// The client's address.
    pub peer: SocketAddr,
    /// Whether it came over TLS.
    pub tls: bool,
    /// When its socket was accepted.
    pub connected_at: SystemTime,
}

/// Makes one [`Handler`] per accepted connection.
pub trait HandlerFactory: Send + Sync + 'static {
    /// The handler type.
    type Handler: Handler;
    /// A handler for a new connection.
    fn new_handler(&self, arrival: &Arrival) -> Self::Handler;
}

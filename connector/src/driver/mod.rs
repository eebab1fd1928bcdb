//! The thin tokio driver: a listener, one task per connection that moves bytes between the socket
//! and the sans-IO engine, timers, and graceful shutdown. All protocol decisions live in the
//! engine; all pattern logic lives in a [`Handler`].

mod connection;
mod listener;
mod tls;

use std::net::SocketAddr;
use std::task::{Context, Poll};

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
}

/// Makes one [`Handler`] per accepted connection.
pub trait HandlerFactory: Send + Sync + 'static {
    /// The handler type.
    type Handler: Handler;
    /// A handler for a new connection from `peer`.
    fn new_handler(&self, peer: SocketAddr) -> Self::Handler;
}

//! Listening sockets with a deep accept queue: a burst of connects (a flood of hostile sockets
//! reconnecting, every client coming back after a restart) waits in the kernel's queue instead
//! of having its SYNs dropped and retried a second later.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

/// Connections the kernel may hold completed for the accept loop (Linux caps it at
/// `net.core.somaxconn`, 4,096 by default).
pub const ACCEPT_QUEUE: u32 = 4096;

/// A listener on `addr` (address reuse on, as `TcpListener::bind` sets it) with an accept queue
/// of [`ACCEPT_QUEUE`].
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_QUEUE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The listener accepts, on the port it was given or one the system chose.
    #[tokio::test]
    async fn listens_and_accepts() {
        let l = listen("127.0.0.1:0".parse().expect("address")).expect("listen");
        let addr = l.local_addr().expect("bound");
        let connect = tokio::net::TcpStream::connect(addr);
        let (accepted, connected) = tokio::join!(l.accept(), connect);
        assert!(accepted.is_ok() && connected.is_ok());
    }
}

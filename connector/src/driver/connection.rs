//! One connection's task: socket ⇄ engine ⇄ handler, until the engine says the connection is over.

use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Handler;
use crate::engine::{AmqpError, Connection, EngineConfig, Transport};

/// Reading stops while this much output waits for the client, so a client that does not read
/// cannot make the server buffer without bound.
const MAX_PENDING_WRITE: usize = 4 * 1024 * 1024;
/// Spare room kept in the read buffer before each read: a client's window of a hundred or two
/// 1 KiB messages arrives as one read and one turn (only the touched part costs memory).
const READ_CHUNK: usize = 256 * 1024;
/// How long the last bytes (a CLOSE) may take to leave once the connection is over.
const FINAL_FLUSH: Duration = Duration::from_secs(2);

/// An accepted socket: the stream, what was already read from it (the protocol header, when the
/// listener waited for it), and when it was accepted (the handshake deadline counts from then).
#[derive(Debug)]
pub struct Accepted {
    /// The socket.
    pub stream: TcpStream,
    /// Bytes read from it before the connection task took it.
    pub read: BytesMut,
    /// When it was accepted.
    pub at: std::time::Instant,
}

/// Runs one accepted connection to its end. `admission` refuses it at OPEN (CONN-15); a `true` on
/// `shutdown`, or `broker_ready` turning false, closes it with `amqp:connection:forced` (CONN-16).
pub async fn run_connection<H: Handler>(
    socket: Accepted,
    cfg: Arc<EngineConfig>,
    admission: Option<AmqpError>,
    mut handler: H,
    mut shutdown: watch::Receiver<bool>,
    mut broker_ready: Option<watch::Receiver<bool>>,
) {
    let Accepted {
        stream,
        read: mut rbuf,
        at,
    } = socket;
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let mut engine = Connection::new(cfg, Transport::Plain, admission, at);
    let mut wbuf = BytesMut::new();
    let mut shutting_down = *shutdown.borrow();
    if shutting_down {
        return;
    }
    // Only a change from now on closes this connection (admission already saw the state).
    if let Some(r) = broker_ready.as_mut() {
        r.borrow_and_update();
    }
    if !rbuf.is_empty() {
        engine.handle_input(Instant::now().into_std(), &mut rbuf);
    }
    loop {
        while let Some(ev) = engine.poll_event() {
            handler.on_event(&mut engine, ev);
        }
        handler.after_turn(&mut engine);
        engine.poll_transmit(&mut wbuf);
        // Write this turn's output now if the socket takes it: the client sees it one select
        // round sooner, and the next turn's output starts a fresh buffer instead of being copied
        // behind this one.
        if !wbuf.is_empty() {
            match wr.try_write(&wbuf) {
                Ok(n) => wbuf.advance(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => engine.transport_lost(),
            }
        }
        if engine.is_closed() {
            break;
        }
        if rbuf.capacity() - rbuf.len() < READ_CHUNK {
            rbuf.reserve(READ_CHUNK);
        }
        let deadline = engine.poll_timeout().map(Instant::from_std);
        tokio::select! {
            r = rd.read_buf(&mut rbuf), if wbuf.len() < MAX_PENDING_WRITE => match r {
                Ok(0) | Err(_) => engine.transport_lost(),
                Ok(_) => engine.handle_input(Instant::now().into_std(), &mut rbuf),
            },
            r = wr.write_buf(&mut wbuf), if !wbuf.is_empty() => {
                if r.is_err() {
                    engine.transport_lost();
                }
            }
            _ = sleep_until_opt(deadline) => engine.handle_timeout(Instant::now().into_std()),
            _ = poll_fn(|cx| handler.poll_ready(cx)) => handler.on_ready(&mut engine),
            r = shutdown.changed(), if !shutting_down => {
                shutting_down = true;
                if r.is_ok() {
                    engine.shutdown(Instant::now().into_std());
                }
            }
            r = changed(&mut broker_ready), if !shutting_down => match r {
                Ok(false) => {
                    shutting_down = true;
                    engine.broker_lost(Instant::now().into_std());
                }
                Ok(true) => {}
                // Nobody watches the broker any more (the process is ending).
                Err(_) => broker_ready = None,
            }
        }
    }
    while let Some(ev) = engine.poll_event() {
        handler.on_event(&mut engine, ev);
    }
    handler.after_turn(&mut engine);
    if !wbuf.is_empty() {
        let _ = tokio::time::timeout(FINAL_FLUSH, wr.write_all(&wbuf)).await;
    }
    let _ = wr.shutdown().await;
}

/// The broker's readiness once it changed; never, when nothing reports it.
async fn changed(
    ready: &mut Option<watch::Receiver<bool>>,
) -> Result<bool, watch::error::RecvError> {
    match ready {
        Some(r) => {
            r.changed().await?;
            Ok(*r.borrow_and_update())
        }
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

//! One connection's task: socket ⇄ engine ⇄ handler, until the engine says the connection is over.

use std::future::poll_fn;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::StreamExt;

use super::Handler;
use crate::engine::{Admission, Connection, EngineConfig, Transport, MAX_UNWRITTEN};

/// Spare room kept in the read buffer before each read: a client's window of a hundred or two
/// 1 KiB messages arrives as one read and one turn (only the touched part costs memory).
const READ_CHUNK: usize = 256 * 1024;
/// Output at least this large is written at the end of a turn even when more input is ready.
const EAGER_WRITE: usize = 64 * 1024;
/// Turns whose output may gather before it is written even when more input is ready.
const EAGER_TURNS: u32 = 16;
/// How long the last bytes (a CLOSE) may take to leave once the connection is over.
const FINAL_FLUSH: Duration = Duration::from_secs(2);

/// A stream one connection runs over: TCP, or TLS over TCP.
pub trait Wire: Send + 'static {
    /// The half the connection task reads.
    type Read: AsyncRead + Unpin + Send;
    /// The half it writes.
    type Write: AsyncWrite + Unpin + Send;
    /// What the engine is told: TLS, and a verified client certificate, change the headers and
    /// SASL mechanisms it accepts.
    fn transport(&self) -> Transport;
    /// Whether written bytes can wait inside the stream until flushed (TLS records).
    const BUFFERS_WRITES: bool;
    /// The two halves, used at once.
    fn split(self) -> (Self::Read, Self::Write);
}

impl Wire for TcpStream {
    type Read = OwnedReadHalf;
    type Write = OwnedWriteHalf;
    const BUFFERS_WRITES: bool = false;

    fn transport(&self) -> Transport {
        Transport::Plain
    }

    fn split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        self.into_split()
    }
}

impl Wire for TlsStream<TcpStream> {
    type Read = tokio::io::ReadHalf<Self>;
    type Write = tokio::io::WriteHalf<Self>;
    const BUFFERS_WRITES: bool = true;

    fn transport(&self) -> Transport {
        Transport::Tls {
            client_certificate: super::tls::client_certificate(self.get_ref().1),
        }
    }

    fn split(self) -> (Self::Read, Self::Write) {
        tokio::io::split(self)
    }
}

/// An accepted socket: the stream, what was already read from it (the protocol header, when the
/// listener waited for it), and when it was accepted (the handshake deadline counts from then).
#[derive(Debug)]
pub struct Accepted<S> {
    /// The socket (after its TLS handshake, on the TLS listener).
    pub stream: S,
    /// Bytes read from it before the connection task took it.
    pub read: BytesMut,
    /// When it was accepted.
    pub at: std::time::Instant,
    /// The client's address.
    pub peer: std::net::SocketAddr,
}

/// What a connection runs under, besides its socket and handler.
pub struct Surroundings {
    /// The engine's limits and policies.
    pub cfg: Arc<EngineConfig>,
    /// Asked at the client's OPEN whether the connection may open (CONN-15).
    pub admission: Box<dyn Admission>,
    /// A `true` closes the connection with `amqp:connection:forced` (CONN-16).
    pub shutdown: watch::Receiver<bool>,
    /// The broker's readiness; turning false closes the connection like `shutdown`.
    pub broker_ready: Option<watch::Receiver<bool>>,
}

/// Runs one accepted connection to its end.
pub async fn run_connection<S: Wire, H: Handler>(
    socket: Accepted<S>,
    around: Surroundings,
    mut handler: H,
) {
    let Surroundings {
        cfg,
        admission,
        shutdown,
        mut broker_ready,
    } = around;
    let Accepted {
        stream,
        read: mut rbuf,
        at,
        ..
    } = socket;
    let transport = stream.transport();
    let (mut rd, mut wr) = stream.split();
    let mut engine = Connection::new(cfg, transport, admission, at);
    let mut wbuf = BytesMut::new();
    // TLS records written but still inside the TLS stream, waiting for the socket.
    let mut unflushed = false;
    // Turns since output was last written.
    let mut turns_unwritten = 0u32;
    let mut shutting_down = *shutdown.borrow();
    if shutting_down {
        return;
    }
    // Only a change from now on closes this connection (admission already saw the state).
    if let Some(r) = broker_ready.as_mut() {
        r.borrow_and_update();
    }
    // The rare inputs wait in futures kept across turns: made afresh every turn, each would join
    // and leave a waiter list (or the timer wheel) on every message.
    let mut shutdown = WatchStream::from_changes(shutdown);
    let mut broker_ready = broker_ready.map(WatchStream::from_changes);
    let mut timer = pin!(tokio::time::sleep_until(Instant::now()));
    let mut armed: Option<Instant> = None;
    if !rbuf.is_empty() {
        engine.handle_input(Instant::now().into_std(), &mut rbuf);
    }
    loop {
        while let Some(ev) = engine.poll_event() {
            handler.on_event(&mut engine, ev);
        }
        handler.after_turn(&mut engine);
        if let Some(hold) = handler.hold_output() {
            // The turn's output (a refusal) waits; `hold` keeps its place meanwhile.
            tokio::time::sleep(hold.delay).await;
        }
        engine.poll_transmit(&mut wbuf);
        // Output waits while more input is ready at once (the select below takes input before
        // writing), so one write carries the replies to many frames and arrivals: on a busy
        // connection most of a message's CPU is the write syscall. It leaves now, without
        // waiting, once enough has gathered or enough turns have passed, so a steady stream of
        // input cannot hold it back.
        turns_unwritten += 1;
        if !wbuf.is_empty() && (wbuf.len() >= EAGER_WRITE || turns_unwritten >= EAGER_TURNS) {
            // One attempt, without waiting: a socket that cannot take it now is waited for below.
            match Pin::new(&mut wr).poll_write(&mut Context::from_waker(Waker::noop()), &wbuf) {
                Poll::Ready(Ok(n)) => {
                    wbuf.advance(n);
                    engine.set_unwritten(wbuf.len());
                    unflushed = S::BUFFERS_WRITES;
                    turns_unwritten = 0;
                }
                Poll::Ready(Err(_)) => engine.transport_lost(),
                Poll::Pending => {}
            }
            if engine.has_events() || engine.has_output() {
                // The write made room: transfers held for it are output now, and senders may
                // have heard they can go on.
                continue;
            }
        }
        if engine.is_closed() {
            break;
        }
        if rbuf.capacity() - rbuf.len() < READ_CHUNK {
            rbuf.reserve(READ_CHUNK);
        }
        let deadline = engine.poll_timeout().map(Instant::from_std);
        if deadline != armed {
            if let Some(d) = deadline {
                timer.as_mut().reset(d);
            }
            armed = deadline;
        }
        // A client that does not read cannot make the server buffer without bound: past
        // MAX_UNWRITTEN the engine holds transfers back (counted in the budget) and reading
        // stops.
        let may_read = wbuf.len() < MAX_UNWRITTEN;
        let input = tokio::select! {
            biased;
            // Any input that is ready, in random order (fair among them)...
            input = async {
                tokio::select! {
                    r = rd.read_buf(&mut rbuf), if may_read => Input::Read(r),
                    () = &mut timer, if armed.is_some() => Input::Timeout,
                    _ = poll_fn(|cx| handler.poll_ready(cx)) => Input::Work,
                    r = shutdown.next(), if !shutting_down => Input::Shutdown(r.is_some()),
                    r = changed(&mut broker_ready), if !shutting_down => Input::Broker(r),
                }
            } => input,
            // ... before output: written when nothing else is ready.
            r = write_or_flush(&mut wr, &mut wbuf), if !wbuf.is_empty() || unflushed => Input::Wrote(r),
        };
        match input {
            Input::Read(Ok(0) | Err(_)) => engine.transport_lost(),
            Input::Read(Ok(_)) => engine.handle_input(Instant::now().into_std(), &mut rbuf),
            Input::Wrote(r) => {
                turns_unwritten = 0;
                engine.set_unwritten(wbuf.len());
                match r {
                    Ok(Written::Some) => unflushed = S::BUFFERS_WRITES,
                    Ok(Written::Flushed) => unflushed = false,
                    Err(_) => engine.transport_lost(),
                }
            }
            Input::Timeout => engine.handle_timeout(Instant::now().into_std()),
            Input::Work => handler.on_ready(&mut engine),
            Input::Shutdown(sent) => {
                shutting_down = true;
                if sent {
                    engine.shutdown(Instant::now().into_std());
                }
            }
            Input::Broker(r) => match r {
                Some(false) => {
                    shutting_down = true;
                    engine.broker_lost(Instant::now().into_std());
                }
                Some(true) => {}
                // Nobody watches the broker any more (the process is ending).
                None => broker_ready = None,
            },
        }
    }
    while let Some(ev) = engine.poll_event() {
        handler.on_event(&mut engine, ev);
    }
    handler.after_turn(&mut engine);
    // A client that reads nothing cannot hold the task: the last bytes, the TLS close_notify and
    // the FIN get FINAL_FLUSH together.
    let _ = tokio::time::timeout(FINAL_FLUSH, async {
        wr.write_all(&wbuf).await?;
        wr.shutdown().await
    })
    .await;
}

/// What woke the connection loop.
enum Input {
    /// The socket read (0 bytes: the client closed it).
    Read(std::io::Result<usize>),
    /// Pending output was written or flushed.
    Wrote(std::io::Result<Written>),
    /// The engine's next deadline passed.
    Timeout,
    /// The handler has background work.
    Work,
    /// The process is shutting down (`false`: nobody will say so any more).
    Shutdown(bool),
    /// The broker's readiness changed (`None`: nobody will say so any more).
    Broker(Option<bool>),
}

/// What [`write_or_flush`] did.
enum Written {
    /// Wrote some of the buffer.
    Some,
    /// The buffer was empty: flushed what the stream held.
    Flushed,
}

/// Writes some of `buf`, or with nothing left to write, flushes the stream (TLS records that
/// waited for the socket).
async fn write_or_flush<W: AsyncWrite + Unpin>(
    wr: &mut W,
    buf: &mut BytesMut,
) -> std::io::Result<Written> {
    if buf.is_empty() {
        wr.flush().await.map(|()| Written::Flushed)
    } else {
        wr.write_buf(buf).await.map(|_| Written::Some)
    }
}

/// The broker's readiness once it changed; never, when nothing reports it.
async fn changed(ready: &mut Option<WatchStream<bool>>) -> Option<bool> {
    match ready {
        Some(r) => r.next().await,
        None => std::future::pending().await,
    }
}

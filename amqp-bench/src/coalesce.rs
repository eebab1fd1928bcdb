//! A client socket that sends each burst of frames in one write. fe2o3-amqp writes and flushes
//! every frame on its own, one `writev` per frame: on a shared two-core machine that made the load
//! tool the heaviest process in the measurement (26 µs of CPU per message, BENCHMARKS.md). Here
//! writes go to a buffer and a writer task sends it once the client's task has yielded, the way
//! a kernel's auto-corking would, so the frames of one burst leave together. Flushing returns at
//! once: the writer task sends within one scheduler turn.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Above this many unsent bytes, writes wait for the writer task.
const LIMIT: usize = 1 << 20;

/// A TCP stream whose writes are coalesced by a writer task.
#[derive(Debug)]
pub struct Coalesced {
    read: OwnedReadHalf,
    out: Arc<Outbox>,
}

#[derive(Debug, Default)]
struct Outbox {
    state: Mutex<State>,
    wake_writer: Notify,
}

#[derive(Debug, Default)]
struct State {
    buf: Vec<u8>,
    closing: bool,
    failed: Option<io::ErrorKind>,
    /// A write waiting for room.
    blocked: Option<Waker>,
}

impl Outbox {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Coalesced {
    /// Wraps `stream` and starts its writer task (needs a tokio runtime).
    pub fn new(stream: TcpStream) -> Coalesced {
        let (read, write) = stream.into_split();
        let out = Arc::new(Outbox::default());
        tokio::spawn(send_bursts(out.clone(), write));
        Coalesced { read, out }
    }
}

async fn send_bursts(out: Arc<Outbox>, mut write: OwnedWriteHalf) {
    let mut burst = Vec::new();
    loop {
        out.wake_writer.notified().await;
        // Let the task that woke us finish its burst before taking it.
        tokio::task::yield_now().await;
        let closing = {
            let mut s = out.lock();
            std::mem::swap(&mut s.buf, &mut burst);
            if let Some(w) = s.blocked.take() {
                w.wake();
            }
            s.closing
        };
        if !burst.is_empty() {
            if let Err(e) = write.write_all(&burst).await {
                let mut s = out.lock();
                s.failed = Some(e.kind());
                if let Some(w) = s.blocked.take() {
                    w.wake();
                }
                return;
            }
            burst.clear();
        }
        if closing && out.lock().buf.is_empty() {
            let _ = write.shutdown().await;
            return;
        }
    }
}

impl AsyncRead for Coalesced {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.read).poll_read(cx, buf)
    }
}

impl AsyncWrite for Coalesced {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut s = self.out.lock();
        if let Some(kind) = s.failed {
            return Poll::Ready(Err(kind.into()));
        }
        if s.buf.len() >= LIMIT {
            s.blocked = Some(cx.waker().clone());
            return Poll::Pending;
        }
        s.buf.extend_from_slice(data);
        drop(s);
        self.out.wake_writer.notify_one();
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.out.lock().failed {
            Some(kind) => Poll::Ready(Err(kind.into())),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.out.lock().closing = true;
        self.out.wake_writer.notify_one();
        Poll::Ready(Ok(()))
    }
}

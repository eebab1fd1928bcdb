//! The backend calls a connection has in flight, and those that finished since it last applied
//! them: one stream, polled on the connection's task.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;

/// A boxed future, as the bridges keep their backend calls in flight.
type Pending<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Calls in flight, each ending in a `T`.
pub(crate) struct InFlight<T> {
    pending: FuturesUnordered<Pending<T>>,
    finished: Vec<T>,
}

impl<T> Default for InFlight<T> {
    fn default() -> Self {
        InFlight {
            pending: FuturesUnordered::new(),
            finished: Vec::new(),
        }
    }
}

impl<T: Send + 'static> InFlight<T> {
    /// Starts following `call`.
    pub(crate) fn push(&mut self, call: impl Future<Output = T> + Send + 'static) {
        self.pending.push(Box::pin(call));
    }

    /// Collects the calls that finished; whether some wait to be applied.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> bool {
        while let Poll::Ready(Some(t)) = self.pending.poll_next_unpin(cx) {
            self.finished.push(t);
        }
        !self.finished.is_empty()
    }

    /// The finished calls, to apply.
    pub(crate) fn take(&mut self) -> Vec<T> {
        std::mem::take(&mut self.finished)
    }

    /// Lets the calls still in flight run to their end in a task of their own, `each` seeing
    /// every outcome (the connection ended). `false` when there is no runtime to run them on
    /// (they are dropped, as at process exit).
    pub(crate) fn run_out(&mut self, mut each: impl FnMut(T) + Send + 'static) -> bool {
        let mut pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            return true;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return false;
        }
        tokio::spawn(async move {
            while let Some(outcome) = pending.next().await {
                each(outcome);
            }
        });
        true
    }
}

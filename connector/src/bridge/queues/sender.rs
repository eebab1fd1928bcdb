//! One produce link's path to the backend, driven by its connection's task (no task of its own,
//! so a batch's outcomes reach the client without a hop between tasks): messages are stored in
//! the order they arrived, in batches (every message waiting, up to 1,000, is one backend send,
//! so a fast producer gets batching and group commit), one batch at a time, and after a large
//! batch the next waits for the client's refill (`refill_wait`). A batch the backend has not
//! answered for [`SEND_STALL`] no longer holds back the next: KubeMQ can leave a send it stored
//! unanswered for good (KMQ-19), and the link must not stop for the minute it takes to give up
//! on it. Each message still gets its own outcome (Q-6: `accepted` only once stored). Messages a
//! link received before it or its connection ended are still stored ([`finish`]).

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use fe2o3_amqp_types::messaging::{Accepted, DeliveryState};
#[cfg(test)]
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::refill_wait::{came_in_a_burst, RefillWait};
use crate::backend::{Backend, BackendError, SEND_STALL};
use crate::bridge::outcome::{rejected, send_failure};
use crate::engine::{Condition, LinkId};
use crate::kubemq::{QueueMessage, SendQueueMessageResult};
use crate::spans::Traced;

/// Most messages in one backend send.
const MAX_BATCH: usize = 1000;
/// Most batches of one link waiting for the backend at once: the first, and those started after
/// each of the ones before it stalled.
const MAX_FLIGHTS: usize = 8;

/// A produce that finished in the backend.
pub(super) struct Done {
    pub link: LinkId,
    pub delivery_id: u32,
    pub presettled: bool,
    /// When its delivery was complete.
    pub received: Instant,
    pub state: DeliveryState,
    /// Its trace and its batch's backend call, when its spans are recorded.
    pub store_span: Option<StoreSpan>,
}

/// A traced message's store: its trace, and when the backend call of its batch began and ended.
pub(super) struct StoreSpan {
    pub traced: Box<Traced>,
    pub from: std::time::Instant,
    pub to: std::time::Instant,
}

/// One message to store, with the delivery it came in.
#[derive(Debug)]
pub(super) struct ToStore {
    /// The delivery-id to settle once it is stored.
    pub delivery_id: u32,
    /// The client sent it pre-settled: no disposition will be sent.
    pub presettled: bool,
    /// When its delivery was complete.
    pub received: Instant,
    /// What to store.
    pub message: QueueMessage,
    /// Its trace, when its spans are recorded.
    pub traced: Option<Box<Traced>>,
}

/// A message of a batch being stored: the delivery to settle once it is.
#[derive(Debug)]
struct Storing {
    delivery_id: u32,
    presettled: bool,
    received: Instant,
    traced: Option<Box<Traced>>,
}

type Results = Result<Vec<SendQueueMessageResult>, BackendError>;

/// A batch being stored: its deliveries, the backend call, and when it started.
struct InFlight {
    ids: Vec<Storing>,
    call: Pin<Box<dyn Future<Output = Results> + Send>>,
    started: Instant,
    /// When the batch before it started.
    previous: Option<Instant>,
    /// Later batches went beside it (logged once).
    stalled: bool,
}

/// One produce link's sends: the messages waiting, the batches being stored (one, plus one more
/// for each that stalled), and the wait for the client's refill after a large one.
pub(super) struct Lane {
    lane: u64,
    link: LinkId,
    queued: VecDeque<ToStore>,
    /// Oldest first; only the newest can be unstalled.
    flights: VecDeque<InFlight>,
    refill_wait: Option<RefillWait>,
    /// When the latest batch started.
    last_start: Option<Instant>,
    /// The link ended: nothing more will come, so no batch waits for a refill.
    closing: bool,
}

impl Lane {
    /// The sends of `link`, stored in `lane`'s order.
    pub(super) fn new(lane: u64, link: LinkId) -> Lane {
        Lane {
            lane,
            link,
            queued: VecDeque::new(),
            flights: VecDeque::new(),
            refill_wait: None,
            last_start: None,
            closing: false,
        }
    }

    /// A message to store after those already queued.
    pub(super) fn push(&mut self, m: ToStore) {
        self.queued.push_back(m);
    }

    /// The link ended; what it queued is still stored.
    pub(super) fn close(&mut self) {
        self.closing = true;
        self.refill_wait = None;
    }

    /// Nothing queued and nothing being stored.
    pub(super) fn is_idle(&self) -> bool {
        self.flights.is_empty() && self.queued.is_empty()
    }

    /// When a batch held back may start: the wait for a refill ends, or the batch in flight
    /// counts as stalled.
    pub(super) fn wake_at(&self) -> Option<Instant> {
        if self.queued.is_empty() {
            return None;
        }
        match self.flights.back() {
            None => self.refill_wait.map(|m| Instant::from_std(m.until())),
            Some(_) if self.flights.len() >= MAX_FLIGHTS => None,
            Some(f) => Some(f.started + SEND_STALL),
        }
    }

    /// Whether the next batch may start beside the ones in flight: every one of them stalled.
    fn may_start(&self) -> bool {
        match self.flights.back() {
            None => true,
            Some(_) if self.flights.len() >= MAX_FLIGHTS => false,
            Some(f) => f.started.elapsed() >= SEND_STALL,
        }
    }

    /// Moves the lane on: a finished batch's outcomes are appended to `done`, and the next batch
    /// is started (and polled once, which takes its place in the lane's order) when one is due.
    /// Registers `cx` for the batch in flight; the caller wakes itself for [`Lane::wake_at`].
    pub(super) fn poll<B: Backend>(
        &mut self,
        cx: &mut Context<'_>,
        backend: &Arc<B>,
        done: &mut Vec<Done>,
    ) {
        loop {
            let mut at = 0;
            while let Some(f) = self.flights.get_mut(at) {
                let Poll::Ready(results) = f.call.as_mut().poll(cx) else {
                    at += 1;
                    continue;
                };
                let Some(f) = self.flights.remove(at) else {
                    break;
                };
                let stored = f.ids.len();
                let burst = match (f.ids.first(), f.ids.last()) {
                    (Some(a), Some(z)) => {
                        let std = Instant::into_std;
                        came_in_a_burst(
                            std(a.received),
                            std(z.received),
                            f.previous.map(std),
                            std(f.started),
                        )
                    }
                    _ => false,
                };
                report(self.link, done, (f.ids, f.started), results);
                // Expect as many back as were just stored, if they came as a refill.
                if !self.closing && self.flights.is_empty() && burst {
                    self.refill_wait = RefillWait::after(
                        stored,
                        (self.queued.len() + stored).min(MAX_BATCH),
                        Instant::now().into_std(),
                    );
                }
            }
            if self
                .refill_wait
                .is_some_and(|m| m.over(self.queued.len(), None, Instant::now().into_std()))
            {
                self.refill_wait = None;
            }
            let waiting = self.flights.is_empty() && self.refill_wait.is_some();
            if waiting || self.queued.is_empty() || !self.may_start() {
                return;
            }
            let take = self.queued.len().min(MAX_BATCH);
            let mut ids = Vec::with_capacity(take);
            let mut messages = Vec::with_capacity(take);
            for m in self.queued.drain(..take) {
                ids.push(Storing {
                    delivery_id: m.delivery_id,
                    presettled: m.presettled,
                    received: m.received,
                    traced: m.traced,
                });
                messages.push(m.message);
            }
            let (backend, lane) = (backend.clone(), self.lane);
            let call = Box::pin(async move { backend.send_queue(lane, messages).await });
            if let Some(stalled) = self.flights.back_mut().filter(|f| !f.stalled) {
                stalled.stalled = true;
                tracing::warn!(link = ?self.link, messages = stalled.ids.len(), "a send is unanswered after {} s; the link's later batches go beside it", SEND_STALL.as_secs());
            }
            let started = Instant::now();
            self.flights.push_back(InFlight {
                ids,
                call,
                started,
                previous: self.last_start.replace(started),
                stalled: false,
            });
        }
    }
}

/// Drives `lanes` to their end in a task of their own (their connection ended): every message
/// they hold is still stored; the outcomes have no one to go to.
pub(super) fn finish<B: Backend>(backend: Arc<B>, mut lanes: Vec<Lane>) {
    lanes.retain(|l| !l.is_idle());
    if lanes.is_empty() {
        return;
    }
    for l in &mut lanes {
        l.close();
    }
    tokio::spawn(poll_fn(move |cx| {
        let mut done = Vec::new();
        for l in &mut lanes {
            l.poll(cx, &backend, &mut done);
        }
        lanes.retain(|l| !l.is_idle());
        if lanes.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }));
}

/// Runs one lane in a task of its own, fed by the returned sender, with its outcomes sent to
/// `done`: the lane as a connection drives it, for tests.
#[cfg(test)]
pub(super) fn spawn_sender<B: Backend>(
    backend: Arc<B>,
    lane: u64,
    link: LinkId,
    done_tx: mpsc::UnboundedSender<Done>,
) -> mpsc::UnboundedSender<ToStore> {
    let (tx, mut rx) = mpsc::unbounded_channel::<ToStore>();
    tokio::spawn(async move {
        let mut lane = Lane::new(lane, link);
        let mut open = true;
        while open || !lane.is_idle() {
            let mut done = Vec::new();
            let wake = lane.wake_at();
            tokio::select! {
                m = rx.recv(), if open => match m {
                    Some(m) => {
                        lane.push(m);
                        while let Ok(m) = rx.try_recv() {
                            lane.push(m);
                        }
                    }
                    None => {
                        open = false;
                        lane.close();
                    }
                },
                _ = poll_fn(|cx| {
                    lane.poll(cx, &backend, &mut done);
                    if done.is_empty() { Poll::Pending } else { Poll::Ready(()) }
                }), if !lane.is_idle() => {}
                _ = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {}
            }
            for d in done {
                let _ = done_tx.send(d);
            }
        }
    });
    tx
}

/// Each message's outcome (ERR-9, ERR-10: the bridge's one mapping of backend failures).
fn report(
    link: LinkId,
    done: &mut Vec<Done>,
    (ids, started): (Vec<Storing>, Instant),
    results: Results,
) {
    // Read only for a batch with a traced message: nothing is spent on traces while off.
    let mut answered = None;
    // Every send that is not `accepted` is logged with why: once for a call that failed as a
    // whole, once per message KubeMQ refused.
    match &results {
        Err(e @ BackendError::Unknown(_)) => {
            tracing::warn!(?link, messages = ids.len(), error = %e, "send outcome unknown; answered released")
        }
        Err(e) => {
            tracing::warn!(?link, messages = ids.len(), error = %e, "send failed; answered rejected")
        }
        Ok(results) => {
            for (r, m) in results.iter().zip(&ids).filter(|(r, _)| r.is_error) {
                tracing::warn!(?link, delivery_id = m.delivery_id, error = %r.error, "KubeMQ refused a message; answered rejected");
            }
        }
    }
    for (i, m) in ids.into_iter().enumerate() {
        let state = match &results {
            Ok(r) => match r.get(i) {
                Some(r) if !r.is_error => DeliveryState::Accepted(Accepted {}),
                // A message's own refusal reads like any other: one mapping for every pattern.
                Some(r) => send_failure(&BackendError::refusal(r.error.clone())),
                None => rejected(Condition::InternalError, "no result for the message"),
            },
            Err(e) => send_failure(e),
        };
        done.push(Done {
            link,
            delivery_id: m.delivery_id,
            presettled: m.presettled,
            received: m.received,
            state,
            store_span: m.traced.map(|traced| StoreSpan {
                traced,
                from: started.into_std(),
                to: *answered.get_or_insert_with(std::time::Instant::now),
            }),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::double::{Double, Overrides};
    use crate::backend::embedded::Embedded;
    use crate::store::Store;
    use std::sync::Mutex;
    use std::time::Duration;

    /// A backend that stores one call at a time and takes 20 ms for each, like a lane whose
    /// every request waits for an fsync; it records how many messages each call carried.
    struct OneAtATime {
        inner: Embedded,
        lane: tokio::sync::Mutex<()>,
        sizes: Mutex<Vec<usize>>,
        /// When each call started.
        starts: Mutex<Vec<Instant>>,
        /// The first call is never answered, as KubeMQ leaves some sends it stored (KMQ-19).
        lose_first_answer: std::sync::atomic::AtomicBool,
    }

    impl Overrides for OneAtATime {
        type Inner = Embedded;
        type Downstream = <Embedded as Backend>::Downstream;

        fn inner(&self) -> &Embedded {
            &self.inner
        }

        async fn open_downstream(&self) -> Result<Self::Downstream, BackendError> {
            self.inner.open_downstream().await
        }

        async fn send_queue(
            &self,
            _lane: u64,
            messages: Vec<QueueMessage>,
        ) -> Result<Vec<SendQueueMessageResult>, BackendError> {
            if self
                .lose_first_answer
                .swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                std::future::pending::<()>().await;
            }
            let _turn = self.lane.lock().await;
            self.sizes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(messages.len());
            self.starts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Instant::now());
            tokio::time::sleep(STORE_TIME).await;
            Ok(vec![SendQueueMessageResult::default(); messages.len()])
        }
    }

    /// How long [`OneAtATime`] takes to store a batch.
    const STORE_TIME: Duration = Duration::from_millis(20);

    fn backend() -> (Arc<Double<OneAtATime>>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("dir");
        let (store, _) = Store::open(dir.path()).expect("store");
        let b = OneAtATime {
            inner: Embedded::new(store),
            lane: tokio::sync::Mutex::new(()),
            sizes: Mutex::new(Vec::new()),
            starts: Mutex::new(Vec::new()),
            lose_first_answer: false.into(),
        };
        (Arc::new(Double(b)), dir)
    }

    fn storing(delivery_id: u32) -> Storing {
        Storing {
            delivery_id,
            presettled: false,
            received: Instant::now(),
            traced: None,
        }
    }

    fn message(id: u32) -> ToStore {
        let m = QueueMessage {
            channel: "q".into(),
            ..Default::default()
        };
        ToStore {
            delivery_id: id,
            presettled: false,
            received: Instant::now(),
            message: m,
            traced: None,
        }
    }

    /// ERR-9 and ERR-10: a send KubeMQ could not be reached for is `rejected` "broker not
    /// ready"; one whose fate is unknown (the request left and no answer came) is `released`,
    /// never `rejected`; a message KubeMQ refused is `rejected` with its text.
    #[test]
    fn a_send_of_unknown_outcome_is_released_not_rejected() {
        let outcome = |results: Results| {
            let mut done = Vec::new();
            report(1, &mut done, (vec![storing(7)], Instant::now()), results);
            done.pop().expect("an outcome").state
        };
        assert!(matches!(
            outcome(Err(BackendError::Unknown("no answer".into()))),
            DeliveryState::Released(_)
        ));
        let DeliveryState::Rejected(r) = outcome(Err(BackendError::Unavailable("down".into())))
        else {
            panic!("rejected")
        };
        let e = r.error.expect("an error");
        assert!(
            format!("{:?}", e.condition).contains("amqp:not-allowed"),
            "{:?}",
            e.condition
        );
        assert!(e
            .description
            .unwrap_or_default()
            .starts_with("broker not ready"));
        let refused = SendQueueMessageResult {
            is_error: true,
            error: "Error 120: invalid channel".into(),
            ..Default::default()
        };
        let DeliveryState::Rejected(r) = outcome(Ok(vec![refused])) else {
            panic!("rejected")
        };
        assert_eq!(
            r.error.and_then(|e| e.description).as_deref(),
            Some("Error 120: invalid channel")
        );
    }

    /// ERR-9, AUTHZ-9: a message KubeMQ refused is mapped as any backend failure is — its
    /// validation (`Error 1xx`) is the message's, `Error 500` the broker's, and `Error 412` (a
    /// KubeMQ that authorizes denied it) `amqp:unauthorized-access`.
    #[test]
    fn a_refused_message_maps_as_every_backend_failure_does() {
        let condition = |text: &str| {
            let refused = SendQueueMessageResult {
                is_error: true,
                error: text.into(),
                ..Default::default()
            };
            let mut done = Vec::new();
            report(
                1,
                &mut done,
                (vec![storing(7)], Instant::now()),
                Ok(vec![refused]),
            );
            match done.pop().expect("an outcome").state {
                DeliveryState::Rejected(r) => format!("{:?}", r.error.expect("an error").condition),
                other => panic!("{other:?}"),
            }
        };
        assert!(
            condition("Error 110: invalid message, cannot be empty").contains("amqp:invalid-field")
        );
        assert!(condition("Error 500: internal server error").contains("amqp:internal-error"));
        assert!(
            condition("Error 412: access denied to resource").contains("amqp:unauthorized-access")
        );
    }

    /// A client with 100 in flight whose window reached the link split (60, then 40 while the
    /// 60 were being stored) and that refills each slot as its outcome arrives: the refill
    /// joins the waiting part, so the window is stored whole again instead of alternating
    /// 60 / 40 for ever (the split halves a link's throughput, BENCHMARKS.md). Outcomes stay in
    /// delivery order. On a paused clock, so the refill wait is measured in the test's
    /// time, not in how soon a loaded machine runs the refilling client.
    #[tokio::test(start_paused = true)]
    async fn a_split_window_is_stored_whole_again() {
        let (backend, _dir) = backend();
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let tx = spawn_sender(backend.clone(), 0, 1, done_tx);
        for id in 0..60 {
            tx.send(message(id)).expect("sender runs");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        for id in 60..100 {
            tx.send(message(id)).expect("sender runs");
        }
        let (total, mut next) = (2000u32, 100u32);
        for expected in 0..total {
            let d = done_rx.recv().await.expect("an outcome");
            assert_eq!(d.delivery_id, expected, "outcomes in order");
            assert!(matches!(d.state, DeliveryState::Accepted(_)));
            if next < total {
                tx.send(message(next)).expect("sender runs");
                next += 1;
            }
        }
        let sizes = backend
            .sizes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        assert_eq!(sizes.iter().sum::<usize>(), total as usize);
        // Split, the batches alternate 60 / 40; whole, every one after the first (60) is the
        // full window, but the last, which has only what is left.
        let middle = sizes
            .get(1..sizes.len().saturating_sub(1))
            .unwrap_or_default();
        assert!(
            !middle.is_empty() && middle.iter().all(|&n| n == 100),
            "batches of whole windows: {sizes:?}"
        );
    }

    /// A client sending at a steady rate (one message a millisecond, on a paused clock) is not
    /// held for a refill: its messages spread over the whole time between two batches, so each
    /// batch of 20 starts the moment the one before it is stored, where waiting for a whole
    /// window would hold each for the full wait.
    #[tokio::test(start_paused = true)]
    async fn a_steady_rate_is_never_held_for_a_refill() {
        use super::super::refill_wait::REFILL_MIN;
        let (backend, _dir) = backend();
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let tx = spawn_sender(backend.clone(), 0, 1, done_tx);
        let total = 200u32;
        let paced = tokio::spawn(async move {
            for id in 0..total {
                tx.send(message(id)).expect("sender runs");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            tx
        });
        for expected in 0..total {
            let d = done_rx.recv().await.expect("an outcome");
            assert_eq!(d.delivery_id, expected, "outcomes in order");
        }
        drop(paced.await.expect("the producer"));
        let sizes = backend
            .sizes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let starts = backend
            .starts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        assert!(
            sizes.iter().filter(|n| **n >= REFILL_MIN).count() >= 5,
            "batches large enough to wait after: {sizes:?}"
        );
        for (i, pair) in starts.windows(2).enumerate() {
            assert_eq!(
                pair[1] - pair[0],
                STORE_TIME,
                "batch {} started as the one before it was stored: {sizes:?}",
                i + 1
            );
        }
    }

    /// The wait for a refill ends even when none comes: a message sent after a large batch is
    /// still stored (the wait is REFILL_WAIT at most), and a link sending one message at a time never waits.
    // One thread: the sender task first runs once all REFILL_MIN messages are queued, so they
    // make one batch whatever the machine's load.
    #[tokio::test(flavor = "current_thread")]
    async fn a_refill_that_never_comes_does_not_hold_a_message() {
        let (backend, _dir) = backend();
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let tx = spawn_sender(backend.clone(), 0, 1, done_tx);
        let within = Duration::from_secs(10);
        use super::super::refill_wait::REFILL_MIN;
        for id in 0..REFILL_MIN as u32 {
            tx.send(message(id)).expect("sender runs");
        }
        for _ in 0..REFILL_MIN {
            tokio::time::timeout(within, done_rx.recv())
                .await
                .expect("outcome, not a hang")
                .expect("an outcome");
        }
        for id in REFILL_MIN as u32..REFILL_MIN as u32 + 3 {
            tx.send(message(id)).expect("sender runs");
            let d = tokio::time::timeout(within, done_rx.recv())
                .await
                .expect("stored, not held for a refill that never comes")
                .expect("an outcome");
            assert_eq!(d.delivery_id, id);
        }
        let sizes = backend
            .sizes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        assert_eq!(sizes, vec![REFILL_MIN, 1, 1, 1]);
    }

    /// KMQ-19: a send the backend never answers holds back the link's later sends only until it
    /// counts as stalled; they are stored and accepted while it still waits for its answer.
    #[tokio::test(flavor = "current_thread")]
    async fn an_unanswered_send_does_not_stop_the_link() {
        let (backend, _dir) = backend();
        backend
            .lose_first_answer
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let tx = spawn_sender(backend.clone(), 0, 1, done_tx);
        tx.send(message(0)).expect("sender runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
        for id in 1..4 {
            tx.send(message(id)).expect("sender runs");
        }
        let within = SEND_STALL * 4;
        for id in 1..4 {
            let d = tokio::time::timeout(within, done_rx.recv())
                .await
                .expect("stored beside the unanswered send, not behind it")
                .expect("an outcome");
            assert_eq!(d.delivery_id, id);
            assert!(matches!(d.state, DeliveryState::Accepted(_)));
        }
        assert!(
            done_rx.try_recv().is_err(),
            "the lost answer is still awaited"
        );
    }
}

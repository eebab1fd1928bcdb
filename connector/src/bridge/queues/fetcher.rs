//! One channel's Get loop, shared by every consume link of that channel in this process
//! (docs/queues-consume-design.md): it owns the channel's downstream session, sizes Gets to the
//! links' total demand (1 while the queue looks idle, doubling after full batches), hands
//! messages out by demand, and sends settlements grouped by transaction before each Get.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::backend::{Backend, Downstream};
use crate::kubemq::QueueMessage;

/// Identifies a consumer link across the process: (connection number, link id).
pub type ConsumerKey = (u64, u64);

/// A message handed to a consumer.
#[derive(Debug)]
pub struct Handout {
    /// The consumer it is for.
    pub consumer: ConsumerKey,
    /// The transaction that owns it.
    pub transaction: Arc<str>,
    /// Its sequence.
    pub sequence: u64,
    /// The message.
    pub message: QueueMessage,
}

/// What the fetcher sends to a consumer's connection.
#[derive(Debug)]
pub enum ToConsumer {
    /// A message to deliver within credit.
    Message(Box<Handout>),
    /// The consumer's drain is complete: everything immediately available was handed out.
    DrainDone(ConsumerKey),
}

/// How a delivery ends (Q-20 … Q-25).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// AckRange: gone for good.
    Ack,
    /// NAckRange: back to the tail with ReceiveCount + 1.
    Nack,
    /// CloseByClient on the whole transaction: back unchanged (only for transactions none of
    /// whose messages were handed out).
    Close,
}

/// What consumers tell the fetcher.
#[derive(Debug)]
pub enum Command {
    /// A consumer joined; its messages go to `to`.
    Join(ConsumerKey, mpsc::UnboundedSender<ToConsumer>),
    /// A consumer's demand (credit it can still take), as an absolute value.
    Demand(ConsumerKey, u32),
    /// A consumer drains (FLOW-5): hand it what is immediately available within `demand`, then
    /// report DrainDone. Never waits for new messages.
    Drain(ConsumerKey, u32),
    /// A consumer left; its remaining demand is gone (its unsettled deliveries come as Settle).
    Leave(ConsumerKey),
    /// A delivery was settled.
    Settle(Arc<str>, u64, Outcome),
    /// A handed-out message could not be delivered (credit gone): offer it again.
    Return(Box<Handout>),
}

/// Batch size limits of the adaptive Get.
#[derive(Debug, Clone, Copy)]
pub struct FetchLimits {
    /// Largest MaxItems per Get.
    pub max_batch: u32,
    /// ClientID for Gets.
    pub client_id: &'static str,
}

struct Consumer {
    demand: u32,
    draining: bool,
    to: mpsc::UnboundedSender<ToConsumer>,
}

/// Runs the loop for `channel` until every consumer has left and nothing is pending.
pub async fn run<B: Backend>(
    backend: Arc<B>,
    channel: String,
    limits: FetchLimits,
    mut rx: mpsc::UnboundedReceiver<Command>,
) {
    let mut consumers: HashMap<ConsumerKey, Consumer> = HashMap::new();
    let mut order: VecDeque<ConsumerKey> = VecDeque::new();
    let mut buffer: VecDeque<(Arc<str>, u64, QueueMessage)> = VecDeque::new();
    let mut settle: Vec<(Arc<str>, u64, Outcome)> = Vec::new();
    // Transactions some of whose messages were handed out (those cannot be closed unchanged).
    let mut handed: std::collections::HashSet<Arc<str>> = std::collections::HashSet::new();
    let mut ds: Option<B::Downstream> = None;
    let mut batch: u32 = 1;
    loop {
        // Take every command that is already waiting.
        while let Ok(cmd) = rx.try_recv() {
            apply(
                cmd,
                &mut consumers,
                &mut order,
                &mut buffer,
                &mut settle,
                &mut handed,
            );
        }
        if buffer.is_empty() {
            // Only buffered messages are ever closed unchanged; with none left, forget the record.
            handed.clear();
        }
        hand_out(&mut consumers, &mut order, &mut buffer, &mut handed);
        // Drains complete once nothing more is immediately available for them: with an exact
        // ready count another Get can still be answered at once; without one it cannot.
        let ready_now = buffer.is_empty() && backend.ready_hint(&channel).is_some_and(|r| r > 0);
        for (k, c) in consumers.iter_mut() {
            if c.draining && (c.demand == 0 || !ready_now) {
                c.draining = false;
                c.demand = 0;
                let _ = c.to.send(ToConsumer::DrainDone(*k));
            }
        }
        if !settle.is_empty() {
            if let Some(d) = ds.as_mut() {
                flush(d, &mut settle).await;
            }
        }
        let demand: u32 = consumers
            .values()
            .map(|c| c.demand)
            .fold(0u32, u32::saturating_add);
        if consumers.is_empty() && buffer.is_empty() && settle.is_empty() {
            // Everyone left: make sure nothing is held, then wait for a new consumer.
            match rx.recv().await {
                Some(cmd) => {
                    apply(
                        cmd,
                        &mut consumers,
                        &mut order,
                        &mut buffer,
                        &mut settle,
                        &mut handed,
                    );
                    continue;
                }
                None => return,
            }
        }
        if consumers.is_empty() && !buffer.is_empty() {
            // Nobody can take these: a transaction never touched goes back unchanged, leftovers
            // of one that was partly delivered are NAcked.
            for (t, s, _) in buffer.drain(..) {
                let o = if handed.contains(&t) {
                    Outcome::Nack
                } else {
                    Outcome::Close
                };
                settle.push((t, s, o));
            }
            continue;
        }
        if demand == 0 || !buffer.is_empty() {
            match rx.recv().await {
                Some(cmd) => apply(
                    cmd,
                    &mut consumers,
                    &mut order,
                    &mut buffer,
                    &mut settle,
                    &mut handed,
                ),
                None => return,
            }
            continue;
        }
        if ds.is_none() {
            match backend.open_downstream().await {
                Ok(d) => ds = Some(d),
                Err(e) => {
                    tracing::warn!(channel, error = %e, "cannot open a downstream session; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    continue;
                }
            }
        }
        let Some(d) = ds.as_mut() else { continue };
        // With an exact count of ready messages, ask for just those (or 1 to wait for the next);
        // otherwise grow the batch after full ones.
        let want = match backend.ready_hint(&channel) {
            Some(ready) => demand
                .min(limits.max_batch)
                .min(u32::try_from(ready).unwrap_or(u32::MAX))
                .max(1),
            None => demand.min(batch).min(limits.max_batch).max(1),
        };
        // Commands that arrive while the Get waits are queued, not lost; settlements wait for it
        // because the stream processes requests in order anyway (kubemq-grpc.md 4.3.1).
        let got = {
            let get = d.get(&channel, limits.client_id, want as i32, 1000);
            tokio::pin!(get);
            loop {
                tokio::select! {
                    r = &mut get => break r,
                    cmd = rx.recv() => match cmd {
                        Some(cmd) => apply(cmd, &mut consumers, &mut order, &mut buffer, &mut settle, &mut handed),
                        None => return,
                    },
                }
            }
        };
        match got {
            Ok(b) => {
                let n = b.messages.len() as u32;
                batch = if n >= want {
                    (want * 2).min(limits.max_batch)
                } else {
                    1
                };
                let txn: Arc<str> = Arc::from(b.transaction_id.as_str());
                let mut seen = std::collections::HashSet::new();
                for m in b.messages {
                    let seq = m.attributes.as_ref().map_or(0, |a| a.sequence);
                    // A real KubeMQ has been seen to repeat a sequence in one reply.
                    if seen.insert(seq) {
                        buffer.push_back((txn.clone(), seq, m));
                    }
                }
            }
            Err(e) => {
                // The session is gone, and with it its transactions: KubeMQ returns their
                // messages, so whatever is buffered or pending for them is dropped here.
                tracing::warn!(channel, error = %e, "Get failed; reopening the session");
                ds = None;
                buffer.clear();
                settle.clear();
                handed.clear();
                batch = 1;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

fn apply(
    cmd: Command,
    consumers: &mut HashMap<ConsumerKey, Consumer>,
    order: &mut VecDeque<ConsumerKey>,
    buffer: &mut VecDeque<(Arc<str>, u64, QueueMessage)>,
    settle: &mut Vec<(Arc<str>, u64, Outcome)>,
    handed: &mut std::collections::HashSet<Arc<str>>,
) {
    match cmd {
        Command::Join(k, to) => {
            consumers.insert(
                k,
                Consumer {
                    demand: 0,
                    draining: false,
                    to,
                },
            );
            order.push_back(k);
        }
        Command::Demand(k, d) => {
            if let Some(c) = consumers.get_mut(&k) {
                if !c.draining {
                    c.demand = d;
                }
            }
        }
        Command::Drain(k, d) => {
            if let Some(c) = consumers.get_mut(&k) {
                c.demand = d;
                c.draining = true;
            }
        }
        Command::Leave(k) => {
            consumers.remove(&k);
            order.retain(|x| *x != k);
        }
        Command::Settle(t, s, o) => settle.push((t, s, o)),
        Command::Return(h) => {
            let h = *h;
            handed.insert(h.transaction.clone());
            buffer.push_front((h.transaction, h.sequence, h.message));
        }
    }
}

/// Hands buffered messages to consumers with demand, round robin.
fn hand_out(
    consumers: &mut HashMap<ConsumerKey, Consumer>,
    order: &mut VecDeque<ConsumerKey>,
    buffer: &mut VecDeque<(Arc<str>, u64, QueueMessage)>,
    handed: &mut std::collections::HashSet<Arc<str>>,
) {
    let mut idle_rounds = 0;
    while !buffer.is_empty() && idle_rounds < order.len() {
        let Some(k) = order.pop_front() else { break };
        order.push_back(k);
        let Some(c) = consumers.get_mut(&k) else {
            continue;
        };
        if c.demand == 0 {
            idle_rounds += 1;
            continue;
        }
        idle_rounds = 0;
        let Some((transaction, sequence, message)) = buffer.pop_front() else {
            break;
        };
        c.demand -= 1;
        handed.insert(transaction.clone());
        let h = Handout {
            consumer: k,
            transaction,
            sequence,
            message,
        };
        if let Err(mpsc::error::SendError(ToConsumer::Message(h))) =
            c.to.send(ToConsumer::Message(Box::new(h)))
        {
            // The connection is gone: keep the message for someone else.
            c.demand = 0;
            buffer.push_front((h.transaction, h.sequence, h.message));
        }
    }
}

/// Sends pending settlements: per transaction and outcome one request, sequences de-duplicated
/// and ascending (Q-27; a duplicate would make KubeMQ fail the rest of the range).
async fn flush<D: Downstream>(d: &mut D, settle: &mut Vec<(Arc<str>, u64, Outcome)>) {
    let mut groups: HashMap<(Arc<str>, Outcome), Vec<u64>> = HashMap::new();
    for (t, s, o) in settle.drain(..) {
        groups.entry((t, o)).or_default().push(s);
    }
    for ((t, o), mut seqs) in groups {
        seqs.sort_unstable();
        seqs.dedup();
        let r = match o {
            Outcome::Ack => d.ack(&t, &seqs).await,
            Outcome::Nack => d.nack(&t, &seqs).await,
            Outcome::Close => d.close(&t).await,
        };
        if let Err(e) = r {
            tracing::warn!(transaction = %t, error = %e, "settlement failed; KubeMQ returns the messages when the session ends");
        }
    }
}

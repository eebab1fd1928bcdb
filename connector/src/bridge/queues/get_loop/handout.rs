//! The words the Get loop and its consumers speak: messages handed out, settlements, demand.

use std::sync::Arc;

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
    /// When the Get loop took it.
    pub taken: Taken,
}

/// When the Get loop took a message, and how long the message had waited in its queue before.
#[derive(Clone, Copy, Debug)]
pub struct Taken {
    /// When it was taken.
    pub at: std::time::Instant,
    /// From the store's timestamp of the message (`stored_ns`, Unix nanoseconds) to then.
    pub waited: std::time::Duration,
}

impl Taken {
    /// A message stored at `stored_ns` (Unix nanoseconds; 0 when unknown), taken at `at`, when
    /// the wall clock read `wall_ns`: the clocks are read once for all the messages of a Get.
    pub fn at(at: std::time::Instant, wall_ns: i64, stored_ns: i64) -> Taken {
        let waited = if stored_ns > 0 {
            u64::try_from(wall_ns.saturating_sub(stored_ns)).unwrap_or(0)
        } else {
            0
        };
        Taken {
            at,
            waited: std::time::Duration::from_nanos(waited),
        }
    }
}

/// What the loop sends to a consumer's connection.
#[derive(Debug)]
pub enum ToConsumer {
    /// Messages to deliver within credit, in order (one send per hand-out round, not per
    /// message).
    Messages(Vec<Handout>),
    /// The consumer's drain is complete: everything immediately available was handed out.
    DrainDone(ConsumerKey),
    /// The loop has processed the consumer's Leave: nothing more comes for it.
    Left(ConsumerKey),
    /// KubeMQ refused the credential the loop's calls carry: the consumer's link is to end
    /// with `amqp:unauthorized-access`.
    Refused(ConsumerKey),
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

/// A settled delivery: which message of which transaction, and how it ended.
#[derive(Debug, Clone)]
pub struct Settlement {
    /// The transaction that owns the message.
    pub transaction: Arc<str>,
    /// The message's sequence.
    pub sequence: u64,
    /// How it was settled.
    pub outcome: Outcome,
}

/// A consumer's demand (credit it can still use) as an absolute value, and how many hand-outs
/// it had taken when it computed it: hand-outs still on their way are not demand any more.
#[derive(Debug, Clone, Copy)]
pub struct DemandReport {
    /// Who reports.
    pub consumer: ConsumerKey,
    /// Deliveries it can still take.
    pub credit: u32,
    /// Hand-outs it had taken when it computed `credit`.
    pub taken: u64,
}

/// Batch size limits of the adaptive Get.
#[derive(Debug, Clone, Copy)]
pub struct FetchLimits {
    /// Largest MaxItems per Get.
    pub max_batch: u32,
    /// How long a loop with no consumer and nothing held lives before it ends and closes its
    /// downstream session.
    pub idle_exit: std::time::Duration,
}

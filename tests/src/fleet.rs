//! Consumers on many queues at once, one per queue, as a deployment has them: most wait on queues
//! nothing is sent to, some get a message now and then. Each counts what reaches it, and either
//! accepts it or holds it unsettled until its link closes (which gives the message back to its
//! queue).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::messaging::Body;
use fe2o3_amqp::types::primitives::Value;
use fe2o3_amqp::{Connection, Receiver, Session};
use tokio::task::JoinHandle;

/// Receivers attached over one connection: few enough that a connection's attaches are not the
/// whole wait, as many as a client would put on one.
const PER_CONNECTION: usize = 50;

/// What a fleet's consumers do with what reaches them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Accept each message as it arrives.
    Accept,
    /// Keep each message unsettled until the link closes.
    Hold,
}

/// One receiver per queue `queues/<prefix>.<i>` for each `i` of the fleet's range, over
/// connections of [`PER_CONNECTION`] receivers, all attached at once.
pub struct Fleet {
    /// Per queue index (from the range's start), the messages that reached its consumer.
    arrivals: Arc<Vec<AtomicU32>>,
    stop: tokio::sync::watch::Sender<bool>,
    connections: Vec<JoinHandle<()>>,
}

impl Fleet {
    /// Attaches the fleet, each receiver granting `credit`; returns once every one is attached.
    pub async fn attach(
        url: &str,
        prefix: &str,
        queues: std::ops::Range<usize>,
        credit: u32,
        settle: Settle,
    ) -> Fleet {
        let first = queues.start;
        let arrivals: Arc<Vec<AtomicU32>> =
            Arc::new(queues.clone().map(|_| AtomicU32::new(0)).collect());
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut attached = Vec::new();
        let mut connections = Vec::new();
        let indices: Vec<usize> = queues.collect();
        for (c, chunk) in indices.chunks(PER_CONNECTION).enumerate() {
            let (ready, is_ready) = tokio::sync::oneshot::channel();
            attached.push(is_ready);
            let (url, prefix, chunk) = (url.to_string(), prefix.to_string(), chunk.to_vec());
            let (arrivals, stopped) = (arrivals.clone(), stopped.clone());
            connections.push(tokio::spawn(async move {
                let container = format!("fleet-{prefix}-{c}");
                let mut conn = Connection::open(container, url.as_str())
                    .await
                    .expect("a fleet connection opens");
                let mut session = Session::begin(&mut conn).await.expect("its session");
                let mut receivers = Vec::new();
                for i in chunk {
                    let r = Receiver::builder()
                        .name(format!("{prefix}-{i}"))
                        .source(format!("queues/{prefix}.{i}"))
                        .credit_mode(CreditMode::Auto(credit))
                        .attach(&mut session)
                        .await
                        .expect("a fleet receiver attaches");
                    receivers.push((i - first, r));
                }
                let _ = ready.send(());
                let consumers: Vec<JoinHandle<()>> = receivers
                    .into_iter()
                    .map(|(slot, r)| {
                        tokio::spawn(consume(r, settle, arrivals.clone(), slot, stopped.clone()))
                    })
                    .collect();
                for c in consumers {
                    c.await.expect("a fleet consumer ends cleanly");
                }
                let _ = session.end().await;
                let _ = conn.close().await;
            }));
        }
        for a in attached {
            a.await
                .expect("every fleet connection attaches its receivers");
        }
        Fleet {
            arrivals,
            stop,
            connections,
        }
    }

    /// The messages that reached the consumer of the `slot`-th queue of the range.
    pub fn arrivals(&self, slot: usize) -> u32 {
        self.arrivals[slot].load(Ordering::Relaxed)
    }

    /// The messages that reached any of the fleet's consumers.
    pub fn received(&self) -> u32 {
        self.arrivals
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .sum()
    }

    /// How many consumers of the fleet got no message yet.
    pub fn still_waiting(&self) -> usize {
        self.arrivals
            .iter()
            .filter(|a| a.load(Ordering::Relaxed) == 0)
            .count()
    }

    /// Detaches every receiver (what a holding consumer holds goes back to its queue) and
    /// closes the connections; panics if a consumer's link failed before.
    pub async fn detach(self) {
        let _ = self.stop.send(true);
        for c in self.connections {
            c.await.expect("a fleet connection ends cleanly");
        }
    }
}

/// One consumer: counts each arrival in its slot and settles it as told, until the fleet stops.
async fn consume(
    mut r: Receiver,
    settle: Settle,
    arrivals: Arc<Vec<AtomicU32>>,
    slot: usize,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let mut held = Vec::new();
    loop {
        tokio::select! {
            d = r.recv::<Body<Value>>() => {
                let d = d.expect("a fleet receiver's link stays up");
                arrivals[slot].fetch_add(1, Ordering::Relaxed);
                match settle {
                    Settle::Accept => r.accept(&d).await.expect("an acceptance goes out"),
                    Settle::Hold => held.push(d),
                }
            }
            _ = stopped.changed() => break,
        }
    }
    drop(held);
    r.close().await.expect("a fleet receiver detaches");
}

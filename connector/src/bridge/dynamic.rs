//! Dynamic nodes (ADDR-11, ADDR-12): private mailboxes a connection mints for its links,
//! reached only through that connection's own messages (an anonymous sender's `to`, or a link to
//! the node) and the replies to its requests (RPC-9). A receiver with a dynamic source mints one
//! and consumes it; a sender with a dynamic target mints one (a JMS temporary queue) that a
//! receiver of the same connection then attaches to by its address. A node lives as long as the
//! link that minted it. Each holds what waits for its receiver's credit, bounded in
//! count and bytes and charged to the connection's memory budget; a request reserves room for
//! its reply, so replies never overflow a node and a requester that grants no credit has its
//! requests refused instead of growing the connector.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::engine::{
    AmqpError, BudgetExceeded, Charge, Condition, Connection, ConnectionBudget, DeliveryOutcome,
    FastMap, LinkId,
};

use super::outbound::{DeliveryToken, Outbound};

/// Bytes a dynamic node holds for its receiver at most, beyond a first message of any size.
const MAILBOX_BYTES: u64 = 16 * 1024 * 1024;

/// Prefix of the dynamic node addresses the connector mints (ADDR-11).
pub const DYNAMIC_PREFIX: &str = "_amqp10.tmp.";

/// A node's consumer.
#[derive(Debug, Clone, Copy)]
struct Consumer {
    link: LinkId,
    presettled: bool,
}

/// A node and what waits in it.
#[derive(Debug)]
struct Node {
    /// The link whose ATTACH minted it: the node ends with it.
    owner: LinkId,
    /// The receiver it delivers to, when one is attached.
    consumer: Option<Consumer>,
    waiting: VecDeque<Bytes>,
    /// Holds the bytes of `waiting`, exactly.
    charge: Charge,
    /// Replies on their way: requests sent with this node as their reply-to.
    reserved: usize,
}

impl Node {
    /// Whether one more message fits: an empty node takes any message (up to
    /// MaxMessageSize), a busy one up to [`MAILBOX_BYTES`]; at most `count` wait or are on
    /// their way.
    fn has_room(&self, count: usize, bytes: u64) -> bool {
        (self.waiting.is_empty() && self.reserved == 0)
            || (self.waiting.len() + self.reserved < count
                && self.charge.bytes() + bytes <= MAILBOX_BYTES)
    }
}

/// The refusal when a node is full.
fn full() -> AmqpError {
    AmqpError::new(
        Condition::ResourceLimitExceeded,
        "dynamic node is full: its receiver is not taking messages",
    )
}

/// One connection's dynamic nodes.
#[derive(Debug)]
pub struct DynamicNodes {
    /// By address. The addresses are the connector's own, and a connection has few: a fast
    /// hash is safe with them.
    nodes: FastMap<String, Node>,
    /// Unsettled deliveries: token → (address, message), offered again if released.
    unsettled: FastMap<DeliveryToken, (String, Bytes)>,
    /// Numbers the deliveries sent.
    outbound: Outbound,
    /// Messages a node holds at most (MaxUnsettledPerLink).
    capacity: usize,
}

impl DynamicNodes {
    /// No nodes yet; each will hold at most `capacity` messages.
    pub fn new(capacity: usize) -> Self {
        DynamicNodes {
            nodes: FastMap::default(),
            unsettled: FastMap::default(),
            outbound: Outbound::default(),
            capacity: capacity.max(1),
        }
    }

    /// Registers the node minted at `address` for the accepted link `owner`; a receiver that
    /// minted it (`presettled` as it asked) is its consumer at once.
    pub fn add(
        &mut self,
        owner: LinkId,
        address: String,
        consumer: Option<bool>,
        budget: &ConnectionBudget,
    ) {
        self.nodes.insert(
            address,
            Node {
                owner,
                consumer: consumer.map(|presettled| Consumer {
                    link: owner,
                    presettled,
                }),
                waiting: VecDeque::new(),
                charge: budget.empty(),
                reserved: 0,
            },
        );
    }

    /// Makes the accepted receiver `link` the consumer of the node at `address` (one a sender
    /// of this connection minted); `false` when there is no such node, or it has a consumer.
    pub fn consume(&mut self, link: LinkId, address: &str, presettled: bool) -> bool {
        match self.nodes.get_mut(address) {
            Some(node) if node.consumer.is_none() => {
                node.consumer = Some(Consumer { link, presettled });
                true
            }
            _ => false,
        }
    }

    /// Whether the node at `address` can take a consumer now.
    pub fn awaits_consumer(&self, address: &str) -> bool {
        self.nodes
            .get(address)
            .is_some_and(|n| n.consumer.is_none())
    }

    /// Whether `address` is a node of this connection.
    pub fn owns(&self, address: &str) -> bool {
        self.nodes.contains_key(address)
    }

    /// Takes a message a client of this connection sent to `address` (ADDR-12), or the refusal.
    pub fn push(&mut self, address: &str, message: Bytes) -> Result<(), AmqpError> {
        let capacity = self.capacity;
        let node = self.nodes.get_mut(address).ok_or_else(|| {
            AmqpError::new(
                Condition::PreconditionFailed,
                "dynamic node the connection cannot reach",
            )
        })?;
        if !node.has_room(capacity, message.len() as u64) {
            return Err(full());
        }
        node.charge
            .grow(message.len() as u64)
            .map_err(BudgetExceeded::to_error)?;
        node.waiting.push_back(message);
        Ok(())
    }

    /// Reserves room in `address` for the reply to a request (RPC-2, and the bound on what a
    /// requester that grants no credit can make the node hold).
    pub fn reserve(&mut self, address: &str) -> Result<(), AmqpError> {
        let capacity = self.capacity;
        let node = self.nodes.get_mut(address).ok_or_else(|| {
            AmqpError::new(
                Condition::NotAllowed,
                "reply-to is not a node this connection owns",
            )
        })?;
        if !node.has_room(capacity, 0) {
            return Err(full());
        }
        node.reserved += 1;
        Ok(())
    }

    /// Gives back a reservation whose reply will not come.
    pub fn unreserve(&mut self, address: &str) {
        if let Some(node) = self.nodes.get_mut(address) {
            node.reserved = node.reserved.saturating_sub(1);
        }
    }

    /// Puts a reply into the node it reserved room in; `false` when the node is gone (its
    /// receiver detached, RPC-14).
    pub fn put_reply(&mut self, address: &str, message: Bytes) -> bool {
        let Some(node) = self.nodes.get_mut(address) else {
            return false;
        };
        node.reserved = node.reserved.saturating_sub(1);
        // Room was reserved: never refused (the budget counts it all the same).
        node.charge.grow_anyway(message.len() as u64);
        node.waiting.push_back(message);
        true
    }

    /// Delivers the waiting messages of `address` within its consumer's credit, while the client
    /// takes what is sent (they stay charged here otherwise).
    pub fn pump(&mut self, conn: &mut Connection, address: &str) {
        let Some(node) = self.nodes.get_mut(address) else {
            return;
        };
        let Some(Consumer { link, presettled }) = node.consumer else {
            return;
        };
        while conn.credit(link) > 0 && conn.has_room(link) {
            let Some(message) = node.waiting.pop_front() else {
                break;
            };
            node.charge.shrink(message.len() as u64);
            match self.outbound.send(conn, link, &message, presettled) {
                Ok(_) if presettled => {}
                Ok(token) => {
                    self.unsettled.insert(token, (address.to_string(), message));
                }
                Err(_) => {
                    node.charge.grow_anyway(message.len() as u64);
                    node.waiting.push_front(message);
                    break;
                }
            }
        }
    }

    /// The client settled a dynamic-node delivery: accepted, rejected or no state ends it;
    /// anything else offers it again.
    pub(crate) fn settled(
        &mut self,
        conn: &mut Connection,
        token: DeliveryToken,
        state: Option<&DeliveryOutcome>,
    ) {
        let Some((address, message)) = self.unsettled.remove(&token) else {
            return;
        };
        if matches!(
            state,
            Some(DeliveryOutcome::Accepted) | Some(DeliveryOutcome::Rejected(_)) | None
        ) {
            return;
        }
        if let Some(node) = self.nodes.get_mut(&address) {
            node.charge.grow_anyway(message.len() as u64);
            node.waiting.push_front(message);
        }
        self.pump(conn, &address);
    }

    /// A link of the node at `address` ended: the link that minted it takes the node and
    /// whatever it holds with it (ADDR-11); a consumer that did not mint it just leaves, and
    /// what it left unsettled waits for the next.
    pub(crate) fn closed(&mut self, link: LinkId, address: &str, unsettled: &[DeliveryToken]) {
        let Some(node) = self.nodes.get_mut(address) else {
            // A consumer whose node ended before it.
            return;
        };
        if node.owner == link {
            // A consumer of its own stays attached to nothing until it detaches.
            self.nodes.remove(address);
            for token in unsettled {
                self.unsettled.remove(token);
            }
            return;
        }
        node.consumer = None;
        for token in unsettled {
            if let Some((_, message)) = self.unsettled.remove(token) {
                node.charge.grow_anyway(message.len() as u64);
                node.waiting.push_front(message);
            }
        }
    }

    /// Delivers what waits on every node with a consumer (the client takes more again).
    pub fn pump_all(&mut self, conn: &mut Connection) {
        let addresses: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.consumer.is_some() && !n.waiting.is_empty())
            .map(|(a, _)| a.clone())
            .collect();
        for address in addresses {
            self.pump(conn, &address);
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

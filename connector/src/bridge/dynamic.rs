//! Dynamic nodes (ADDR-11, ADDR-12): private mailboxes a connection mints for its receivers,
//! reached only through that connection's own messages (an anonymous sender's `to`) and the
//! replies to its requests (RPC-9). Each holds what waits for its receiver's credit, bounded in
//! count and bytes and charged to the connection's memory budget; a request reserves room for
//! its reply, so replies never overflow a node and a requester that grants no credit has its
//! requests refused instead of growing the connector.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use crate::engine::{
    AmqpError, BudgetExceeded, Charge, Condition, Connection, ConnectionBudget, DeliveryOutcome,
    FastMap, LinkId,
};

/// Bytes a dynamic node holds for its receiver at most, beyond a first message of any size.
const MAILBOX_BYTES: u64 = 16 * 1024 * 1024;

/// Delivery tokens of dynamic-node deliveries: a range of their own, apart from the tokens other
/// links of the connection use.
const FIRST_TOKEN: u64 = 1 << 62;

/// Prefix of the dynamic node addresses the connector mints (ADDR-11).
pub const DYNAMIC_PREFIX: &str = "_amqp10.tmp.";

/// A node and what waits in it.
#[derive(Debug)]
struct Node {
    link: LinkId,
    presettled: bool,
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
    nodes: HashMap<String, Node>,
    by_link: FastMap<LinkId, String>,
    /// Unsettled deliveries: token → (address, message), offered again if released.
    unsettled: HashMap<u64, (String, Bytes)>,
    next_token: u64,
    /// Messages a node holds at most (MaxUnsettledPerLink).
    capacity: usize,
}

impl DynamicNodes {
    /// No nodes yet; each will hold at most `capacity` messages.
    pub fn new(capacity: usize) -> Self {
        DynamicNodes {
            nodes: HashMap::new(),
            by_link: FastMap::default(),
            unsettled: HashMap::new(),
            next_token: FIRST_TOKEN,
            capacity: capacity.max(1),
        }
    }

    /// Registers the node minted at `address` for the accepted receiver `link`.
    pub fn add(
        &mut self,
        link: LinkId,
        address: String,
        presettled: bool,
        budget: &ConnectionBudget,
    ) {
        self.by_link.insert(link, address.clone());
        self.nodes.insert(
            address,
            Node {
                link,
                presettled,
                waiting: VecDeque::new(),
                charge: budget.empty(),
                reserved: 0,
            },
        );
    }

    /// Whether `address` is a node of this connection.
    pub fn owns(&self, address: &str) -> bool {
        self.nodes.contains_key(address)
    }

    /// Whether `link` is a dynamic node's receiver.
    pub fn is_node_link(&self, link: LinkId) -> bool {
        self.by_link.contains_key(&link)
    }

    /// Whether `token` is a dynamic-node delivery's.
    pub fn owns_token(token: u64) -> bool {
        token >= FIRST_TOKEN
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

    /// Delivers the waiting messages of `address` within its link's credit.
    pub fn pump(&mut self, conn: &mut Connection, address: &str) {
        let Some(node) = self.nodes.get_mut(address) else {
            return;
        };
        while conn.credit(node.link) > 0 {
            let Some(message) = node.waiting.pop_front() else {
                break;
            };
            node.charge.shrink(message.len() as u64);
            let token = self.next_token;
            self.next_token += 1;
            match conn.send(
                node.link,
                &token.to_be_bytes(),
                &message,
                node.presettled,
                token,
            ) {
                Ok(_) if node.presettled => {}
                Ok(_) => {
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

    /// Delivers what waits on `link`'s node, if it is one (new credit, or a drain).
    pub fn pump_link(&mut self, conn: &mut Connection, link: LinkId) {
        if let Some(address) = self.by_link.get(&link).cloned() {
            self.pump(conn, &address);
        }
    }

    /// The client settled a dynamic-node delivery: accepted, rejected or no state ends it;
    /// anything else offers it again.
    pub fn settled(&mut self, conn: &mut Connection, token: u64, state: Option<&DeliveryOutcome>) {
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

    /// A node's receiver ended (ADDR-11): the node and whatever it holds go with it. `false`
    /// when `link` was no node's.
    pub fn closed(&mut self, link: LinkId, unsettled: &[u64]) -> bool {
        let Some(address) = self.by_link.remove(&link) else {
            return false;
        };
        self.nodes.remove(&address);
        for token in unsettled {
            self.unsettled.remove(token);
        }
        true
    }

    /// Nodes alive.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

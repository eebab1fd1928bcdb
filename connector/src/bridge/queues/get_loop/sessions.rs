//! The loop's downstream sessions and the transactions open on them.
//!
//! A Get goes on a session with no open transaction while there is one, so consumers holding
//! deliveries of a few Gets never make settlements wait behind a Get (KMQ-5); past
//! [`MAX_SESSIONS`] it goes on the one with the fewest, whose settlements then wait for it, as
//! on a single stream. Sessions stay open until the loop retires: settlements get no reply, so
//! one closed just after its last settlement was sent could cancel the stream before KubeMQ read
//! it, and KubeMQ would hand those messages out again.

use std::sync::Arc;

use crate::engine::FastMap;

/// Downstream sessions a loop keeps at most.
pub(super) const MAX_SESSIONS: usize = 4;

/// Names one of the loop's sessions.
pub(in crate::bridge::queues) type SessionId = u64;

/// One session as the loop sees it (the driver holds the stream itself).
#[derive(Debug)]
struct Slot {
    id: SessionId,
    /// Lent to the running Get.
    lent: bool,
    /// Its open transactions (messages returned and not all settled).
    open: usize,
}

/// An open transaction: the session that owns it, how many of its messages are unsettled, and
/// their sequences (to bind them to their deliveries if it is closed under its consumers).
#[derive(Debug)]
pub(super) struct Txn {
    pub session: SessionId,
    pub left: usize,
    pub seqs: Vec<u64>,
}

/// The sessions and their transactions.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    slots: Vec<Slot>,
    next: SessionId,
    /// Open transactions by id.
    pub txns: FastMap<Arc<str>, Txn>,
}

/// Where the next Get goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lend {
    /// On this session, now lent.
    On(SessionId),
    /// On a new session: open it under this id.
    Open(SessionId),
}

impl Sessions {
    /// A session for the next Get, marked lent; or a new one to open while fewer than
    /// [`MAX_SESSIONS`] are.
    pub fn lend(&mut self) -> Lend {
        let free = self.slots.iter().position(|s| s.open == 0 && !s.lent);
        let at = match free {
            Some(at) => Some(at),
            None if self.slots.len() < MAX_SESSIONS => None,
            None => self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.lent)
                .min_by_key(|(_, s)| s.open)
                .map(|(at, _)| at),
        };
        match at.and_then(|at| self.slots.get_mut(at)) {
            Some(slot) => {
                slot.lent = true;
                Lend::On(slot.id)
            }
            None => Lend::Open(self.next + 1),
        }
    }

    /// The session `id` opened.
    pub fn opened(&mut self, id: SessionId) {
        self.next = self.next.max(id);
        self.slots.push(Slot {
            id,
            lent: false,
            open: 0,
        });
    }

    /// The Get on `id` is answered: the session is back.
    pub fn returned(&mut self, id: SessionId) {
        if let Some(s) = self.slots.iter_mut().find(|s| s.id == id) {
            s.lent = false;
        }
    }

    /// Whether `id` is open and not lent: settlements can go on it now.
    pub fn usable(&self, id: SessionId) -> bool {
        self.slots.iter().any(|s| s.id == id && !s.lent)
    }

    /// Whether `id` is open.
    pub fn exists(&self, id: SessionId) -> bool {
        self.slots.iter().any(|s| s.id == id)
    }

    /// A Get on `session` opened `txn`.
    pub fn open_txn(&mut self, id: Arc<str>, txn: Txn) {
        if let Some(s) = self.slots.iter_mut().find(|s| s.id == txn.session) {
            s.open += 1;
        }
        self.txns.insert(id, txn);
    }

    /// A transaction is over (settled, or closed).
    pub fn end_txn(&mut self, id: &Arc<str>) -> Option<Txn> {
        let txn = self.txns.remove(id)?;
        if let Some(s) = self.slots.iter_mut().find(|s| s.id == txn.session) {
            s.open = s.open.saturating_sub(1);
        }
        Some(txn)
    }

    /// Forgets session `id` and its transactions; returns them with how many messages each
    /// still held.
    pub fn lose(&mut self, id: SessionId) -> Vec<(Arc<str>, usize)> {
        self.slots.retain(|s| s.id != id);
        let gone: Vec<(Arc<str>, usize)> = self
            .txns
            .iter()
            .filter(|(_, t)| t.session == id)
            .map(|(t, txn)| (t.clone(), txn.left))
            .collect();
        for (t, _) in &gone {
            self.txns.remove(t);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(session: SessionId) -> Txn {
        Txn {
            session,
            left: 1,
            seqs: vec![1],
        }
    }

    /// A Get goes on a session without open transactions, a new one while there are fewer
    /// than four, else on the one with the fewest.
    #[test]
    fn gets_go_where_no_settlement_waits_for_them() {
        let mut s = Sessions::default();
        assert_eq!(s.lend(), Lend::Open(1));
        s.opened(1);
        assert_eq!(s.lend(), Lend::On(1));
        s.returned(1);
        s.open_txn("a".into(), txn(1));
        assert_eq!(s.lend(), Lend::Open(2), "1 has an open transaction");
        for id in 2..=4 {
            s.opened(id);
            s.open_txn(format!("t{id}").into(), txn(id));
            s.open_txn(format!("u{id}").into(), txn(id));
        }
        assert_eq!(s.lend(), Lend::On(1), "the fewest open");
        assert!(!s.usable(1), "lent");
        s.returned(1);
        assert!(s.usable(1));
        assert!(s.end_txn(&"a".into()).is_some());
        assert_eq!(s.lend(), Lend::On(1));
        let gone = s.lose(2);
        assert_eq!(gone.len(), 2);
        assert!(!s.exists(2));
        assert_eq!(s.txns.len(), 4);
    }
}

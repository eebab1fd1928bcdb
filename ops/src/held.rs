//! A bounded set of sockets where a newcomer is never turned away: when the set is full, the
//! socket that has been quiet the longest is told to go. Clients that connect and say nothing
//! can then fill the set only until someone real arrives, and a socket that is in use (it marks
//! itself active) outlives any number of silent ones.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

/// The set; cheap to clone (clones share it).
#[derive(Debug, Clone)]
pub struct Held {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    limit: usize,
    /// Stamps only grow: each admission and each sign of activity takes the next one.
    next_stamp: u64,
    /// Members by the stamp of their last activity; the first is the one to evict.
    by_stamp: BTreeMap<u64, u64>,
    /// Members by id: their current stamp and how they are told to go.
    members: HashMap<u64, Member>,
}

#[derive(Debug)]
struct Member {
    stamp: u64,
    evict: oneshot::Sender<()>,
}

/// A place in the set, given up when dropped.
#[derive(Debug)]
pub struct Hold {
    inner: Arc<Mutex<Inner>>,
    id: u64,
}

/// A newly admitted member: its place, and what resolves with `Ok` when it is evicted (with
/// `Err` once the place is given up, so a member that leaves the set is never told to go).
#[derive(Debug)]
pub struct Admitted {
    /// The place.
    pub hold: Hold,
    /// Resolves with `Ok(())` when a newcomer needed the place.
    pub evicted: oneshot::Receiver<()>,
}

impl Held {
    /// A set of at most `limit` members (at least one).
    pub fn new(limit: usize) -> Held {
        Held {
            inner: Arc::new(Mutex::new(Inner {
                limit: limit.max(1),
                next_stamp: 0,
                by_stamp: BTreeMap::new(),
                members: HashMap::new(),
            })),
        }
    }

    /// Admits a newcomer, evicting the least recently active member if the set is full.
    pub fn admit(&self) -> Admitted {
        let (evict, evicted) = oneshot::channel();
        let mut inner = lock(&self.inner);
        if inner.members.len() >= inner.limit {
            if let Some((_, oldest)) = inner.by_stamp.pop_first() {
                if let Some(member) = inner.members.remove(&oldest) {
                    let _ = member.evict.send(());
                }
            }
        }
        let id = inner.stamp();
        inner.by_stamp.insert(id, id);
        inner.members.insert(id, Member { stamp: id, evict });
        Admitted {
            hold: Hold {
                inner: self.inner.clone(),
                id,
            },
            evicted,
        }
    }

    /// How many members the set has.
    pub fn len(&self) -> usize {
        lock(&self.inner).members.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Hold {
    /// Marks the member active now: it becomes the last to be evicted.
    pub fn active(&self) {
        let mut inner = lock(&self.inner);
        let stamp = inner.stamp();
        let Inner {
            by_stamp, members, ..
        } = &mut *inner;
        if let Some(member) = members.get_mut(&self.id) {
            by_stamp.remove(&member.stamp);
            member.stamp = stamp;
            by_stamp.insert(stamp, self.id);
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut inner = lock(&self.inner);
        if let Some(member) = inner.members.remove(&self.id) {
            inner.by_stamp.remove(&member.stamp);
        }
    }
}

impl Inner {
    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }
}

/// The set stays consistent under a panic elsewhere (every change is made whole under the lock).
fn lock(inner: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_active_goes_first() {
        let held = Held::new(2);
        let mut first = held.admit();
        let mut second = held.admit();
        first.hold.active();
        let mut third = held.admit();
        assert_eq!(held.len(), 2);
        assert_eq!(
            second.evicted.try_recv(),
            Ok(()),
            "the quiet one is evicted"
        );
        assert!(first.evicted.try_recv().is_err(), "the active one stays");
        drop(second);
        let fourth = held.admit();
        assert_eq!(first.evicted.try_recv(), Ok(()), "then the next quietest");
        assert!(third.evicted.try_recv().is_err());
        drop(fourth);
        drop(third.hold);
        assert_eq!(held.len(), 0);
        assert_eq!(
            third.evicted.try_recv(),
            Err(oneshot::error::TryRecvError::Closed),
            "a member that leaves is never told to go"
        );
    }
}

//! A bounded set of sockets where a newcomer is never turned away: when the set is full, a
//! socket of the source address with the most sockets in the set is told to go, the one of
//! them quiet the longest. Clients that connect and say nothing can then fill the set only until
//! someone real arrives; a flood from one address pushes out its own sockets, never those of
//! another address while it has more; and a socket that is in use (it marks itself active)
//! outlives any number of silent ones. A member can also say it has had its first turn
//! ([`Hold::started`]): until then it goes only when no member of its address that had its turn
//! is left, so newcomers cannot push out a socket whose bytes are already there before it was
//! even looked at.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
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
    /// Members by id.
    members: HashMap<u64, Member>,
    /// Each source address's members.
    sources: HashMap<IpAddr, Source>,
    /// Sources by how many members they have; the last is the one to evict from.
    by_size: BTreeSet<(usize, IpAddr)>,
}

/// One source address's members, by the stamp of their last activity.
#[derive(Debug, Default)]
struct Source {
    /// Those that had their first turn; the first is the one to evict.
    started: BTreeMap<u64, u64>,
    /// Those still waiting for it: evicted only when `started` is empty.
    waiting: BTreeMap<u64, u64>,
}

impl Source {
    fn len(&self) -> usize {
        self.started.len() + self.waiting.len()
    }

    fn list(&mut self, waiting: bool) -> &mut BTreeMap<u64, u64> {
        if waiting {
            &mut self.waiting
        } else {
            &mut self.started
        }
    }
}

#[derive(Debug)]
struct Member {
    source: IpAddr,
    stamp: u64,
    /// Still waiting for its first turn.
    waiting: bool,
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
                members: HashMap::new(),
                sources: HashMap::new(),
                by_size: BTreeSet::new(),
            })),
        }
    }

    /// Admits a newcomer from `source`, evicting a member if the set is full; the newcomer
    /// counts as one that had its turn.
    pub fn admit(&self, source: IpAddr) -> Admitted {
        self.admit_as(source, false)
    }

    /// Admits a newcomer from `source` that waits for its first turn ([`Hold::started`])
    /// before it can be evicted ahead of any member of its address that had its turn.
    pub fn admit_waiting(&self, source: IpAddr) -> Admitted {
        self.admit_as(source, true)
    }

    fn admit_as(&self, source: IpAddr, waits: bool) -> Admitted {
        let (evict, evicted) = oneshot::channel();
        let mut inner = lock(&self.inner);
        if inner.members.len() >= inner.limit {
            inner.evict_one();
        }
        let id = inner.stamp();
        inner.add(
            id,
            Member {
                source,
                stamp: id,
                waiting: waits,
                evict,
            },
        );
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
    /// Marks the member active now: it becomes the last of its address to be evicted.
    pub fn active(&self) {
        lock(&self.inner).restamp(self.id, None);
    }

    /// The member has had its first turn: from now on it is evicted, oldest activity first,
    /// among the others of its address that had theirs (as the most recently active of them).
    pub fn started(&self) {
        lock(&self.inner).restamp(self.id, Some(false));
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        lock(&self.inner).remove(self.id);
    }
}

impl Inner {
    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    fn add(&mut self, id: u64, member: Member) {
        let source = self.sources.entry(member.source).or_default();
        let before = source.len();
        source.list(member.waiting).insert(member.stamp, id);
        self.by_size.remove(&(before, member.source));
        self.by_size.insert((before + 1, member.source));
        self.members.insert(id, member);
    }

    fn remove(&mut self, id: u64) -> Option<Member> {
        let member = self.members.remove(&id)?;
        if let Some(source) = self.sources.get_mut(&member.source) {
            let before = source.len();
            source.list(member.waiting).remove(&member.stamp);
            self.by_size.remove(&(before, member.source));
            if before > 1 {
                self.by_size.insert((before - 1, member.source));
            } else {
                self.sources.remove(&member.source);
            }
        }
        Some(member)
    }

    /// Tells the member to go that the busiest address has had quiet the longest.
    fn evict_one(&mut self) {
        let Some(&(_, busiest)) = self.by_size.last() else {
            return;
        };
        let Some(source) = self.sources.get(&busiest) else {
            return;
        };
        let oldest = source
            .started
            .first_key_value()
            .or_else(|| source.waiting.first_key_value())
            .map(|(_, id)| *id);
        if let Some(member) = oldest.and_then(|id| self.remove(id)) {
            let _ = member.evict.send(());
        }
    }

    /// Gives member `id` a new stamp, and moves it to the started ones if `waiting` says so.
    fn restamp(&mut self, id: u64, waiting: Option<bool>) {
        let stamp = self.stamp();
        let Some(member) = self.members.get_mut(&id) else {
            return;
        };
        if let Some(source) = self.sources.get_mut(&member.source) {
            source.list(member.waiting).remove(&member.stamp);
            member.waiting = waiting.unwrap_or(member.waiting);
            member.stamp = stamp;
            source.list(member.waiting).insert(stamp, id);
        }
    }
}

/// The set stays consistent under a panic elsewhere (every change is made whole under the lock).
fn lock(inner: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

    /// A full set evicts from the address with the most members: a flood from one address
    /// pushes out its own sockets, not another address's, however old they are.
    #[test]
    fn the_busiest_address_gives_way() {
        let held = Held::new(4);
        let mut other = held.admit(B);
        let mut flood: Vec<Admitted> = (0..3).map(|_| held.admit(A)).collect();
        for _ in 0..10 {
            flood.push(held.admit(A));
        }
        assert!(
            other.evicted.try_recv().is_err(),
            "the other address keeps its socket"
        );
        let mut evicted = 0;
        for a in &mut flood {
            evicted += usize::from(a.evicted.try_recv().is_ok());
        }
        assert_eq!(evicted, 10, "the flood evicted its own");
        assert_eq!(held.len(), 4);
    }

    /// A member waiting for its first turn is evicted only when every member that had its turn
    /// is gone; once started it is the newest of those.
    #[test]
    fn a_member_waiting_for_its_first_turn_goes_last() {
        let held = Held::new(3);
        let mut started = held.admit_waiting(A);
        started.hold.started();
        let mut waiting = held.admit_waiting(A);
        let mut quiet = held.admit(A);
        let mut fourth = held.admit_waiting(A);
        assert_eq!(
            started.evicted.try_recv(),
            Ok(()),
            "the oldest that had its turn"
        );
        let mut fifth = held.admit_waiting(A);
        assert_eq!(
            quiet.evicted.try_recv(),
            Ok(()),
            "then the next that had its turn"
        );
        assert!(
            waiting.evicted.try_recv().is_err(),
            "not yet looked at: kept"
        );
        let mut sixth = held.admit_waiting(A);
        assert_eq!(
            waiting.evicted.try_recv(),
            Ok(()),
            "only waiting members left: the oldest goes"
        );
        fourth.hold.started();
        let _seventh = held.admit_waiting(A);
        assert_eq!(fourth.evicted.try_recv(), Ok(()), "started ones go first");
        assert!(fifth.evicted.try_recv().is_err() && sixth.evicted.try_recv().is_err());
        assert_eq!(held.len(), 3);
    }

    #[test]
    fn the_least_recently_active_goes_first() {
        let held = Held::new(2);
        let mut first = held.admit(A);
        let mut second = held.admit(A);
        first.hold.active();
        let mut third = held.admit(A);
        assert_eq!(held.len(), 2);
        assert_eq!(
            second.evicted.try_recv(),
            Ok(()),
            "the quiet one is evicted"
        );
        assert!(first.evicted.try_recv().is_err(), "the active one stays");
        drop(second);
        let fourth = held.admit(A);
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

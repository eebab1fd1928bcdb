//! A JSON object's entries in order, as `serde_json` keeps them: a key seen again keeps its first
//! place and takes the last value. The envelope's maps are small, so they are searched in a list;
//! a large one (a native client's Metadata may hold any JSON) gets an index, so that a hostile
//! envelope costs linear time, not quadratic.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

/// Entries searched in the list up to this many.
const LINEAR: usize = 16;

/// Keys `K` in first-seen order, each with its last value.
pub(super) struct Entries<K, V> {
    list: Vec<(K, V)>,
    index: Option<HashMap<K, usize, foldhash::fast::RandomState>>,
}

impl<K: Borrow<str> + Hash + Eq + Clone, V> Entries<K, V> {
    /// Room for `n` entries.
    pub(super) fn with_capacity(n: usize) -> Self {
        Entries {
            list: Vec::with_capacity(n.min(LINEAR)),
            index: None,
        }
    }

    /// Sets `key` to `value`, in place if it is there, at the end otherwise.
    pub(super) fn insert(&mut self, key: K, value: V) {
        let at = match &self.index {
            Some(index) => index.get(key.borrow()).copied(),
            None => self
                .list
                .iter()
                .position(|(k, _)| k.borrow() == key.borrow()),
        };
        match at.and_then(|i| self.list.get_mut(i)) {
            Some(slot) => slot.1 = value,
            None => {
                if let Some(index) = &mut self.index {
                    index.insert(key.clone(), self.list.len());
                }
                self.list.push((key, value));
                if self.index.is_none() && self.list.len() > LINEAR {
                    self.index = Some(
                        self.list
                            .iter()
                            .enumerate()
                            .map(|(i, (k, _))| (k.clone(), i))
                            .collect(),
                    );
                }
            }
        }
    }
}

impl<K, V> IntoIterator for Entries<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.list.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// First place, last value, in both the listed and the indexed form.
    #[test]
    fn first_place_last_value() {
        for n in [3, 40] {
            let mut e: Entries<String, usize> = Entries::with_capacity(0);
            for i in 0..n {
                e.insert(format!("k{i}"), i);
            }
            e.insert("k1".into(), 100);
            let order: Vec<(String, usize)> = e.into_iter().collect();
            assert_eq!(order.len(), n);
            assert_eq!(order[1], ("k1".to_string(), 100));
            assert_eq!(order[n - 1], (format!("k{}", n - 1), n - 1));
        }
    }
}

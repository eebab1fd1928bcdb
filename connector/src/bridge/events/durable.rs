//! Durable events-store subscriptions (DUR-*): the identity a (container-id, link name) pair
//! names, and this process's registry of identities attached right now (DUR-6).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// The durable identity of DUR-2:
/// `sanitize40(container) + "_" + sanitize40(link) + "_" + fnv1a32hex(container + "|" + link)`.
/// It is also the subscription's ClientID at KubeMQ: only `[A-Za-z0-9_-]`, as KubeMQ requires.
pub fn identity(container_id: &str, link_name: &str) -> String {
    format!(
        "{}_{}_{:08x}",
        sanitize40(container_id),
        sanitize40(link_name),
        fnv1a32(format!("{container_id}|{link_name}").as_bytes())
    )
}

/// DUR-3: every character outside `[A-Za-z0-9_-]` becomes `_`; the first 40 characters are kept.
fn sanitize40(s: &str) -> String {
    crate::engine::sanitize_id(s, 40)
}

/// DUR-3: 32-bit FNV-1a.
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(2_166_136_261u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(16_777_619)
    })
}

/// The identities attached in this process.
#[derive(Debug, Default, Clone)]
pub struct Registry(Arc<Mutex<HashSet<String>>>);

/// An identity held by one live link; released when dropped (detach, session or connection end).
#[derive(Debug)]
pub struct Claim {
    registry: Registry,
    identity: String,
}

impl Claim {
    /// The identity held.
    pub fn identity(&self) -> &str {
        &self.identity
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.registry
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.identity);
    }
}

impl Registry {
    /// Claims `identity` for one link; `None` when another link holds it (DUR-6).
    pub fn claim(&self, identity: &str) -> Option<Claim> {
        let fresh = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(identity.to_string());
        fresh.then(|| Claim {
            registry: self.clone(),
            identity: identity.to_string(),
        })
    }

    /// Whether a live link holds `identity`.
    pub fn in_use(&self, identity: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DUR-2, DUR-3: sanitized parts, the hash of the raw pair, eight lower-case hex digits.
    #[test]
    fn dur_2_identity() {
        // FNV-1a 32 of "a|b": computed by the algorithm's definition.
        let expected = b"a|b".iter().fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
        });
        assert_eq!(identity("a", "b"), format!("a_b_{expected:08x}"));
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(
            fnv1a32(b"a"),
            0xe40c_292c,
            "the published FNV-1a 32 vector for \"a\""
        );
        let id = identity("my app:1", "orders/sub");
        assert!(id.starts_with("my_app_1_orders_sub_"), "{id}");
        let long = identity(&"c".repeat(60), &"l".repeat(60));
        assert_eq!(long.len(), 40 + 1 + 40 + 1 + 8);
        assert_ne!(
            identity("a b", "x"),
            identity("a_b", "x"),
            "hashed before sanitizing"
        );
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
    }

    /// DUR-6: one live claim per identity, released when the claim goes.
    #[test]
    fn dur_6_one_live_claim() {
        let r = Registry::default();
        let c = r.claim("x").expect("free");
        assert!(r.claim("x").is_none());
        assert!(r.in_use("x"));
        drop(c);
        assert!(r.claim("x").is_some());
    }
}

//! Refusals counted for `/metrics/operations` where they happen: failed TLS handshakes (the
//! listener), failed logins (the SASL exchange) and denied actions (the authorization policy).
//! Those places share nothing else, and a process runs one connector, so the counts are one
//! process-wide value each.

use std::sync::atomic::{AtomicU64, Ordering};

/// Refusals counted process-wide where they happen (the TLS listener, the SASL exchange, the
/// authorization policy), which share nothing else.
pub struct Failures {
    tls_handshakes: AtomicU64,
    authentications: AtomicU64,
    authorizations: AtomicU64,
}

/// The process's [`Failures`].
pub static FAILURES: Failures = Failures {
    tls_handshakes: AtomicU64::new(0),
    authentications: AtomicU64::new(0),
    authorizations: AtomicU64::new(0),
};

impl Failures {
    /// TLS handshakes failed so far.
    pub fn tls_handshakes(&self) -> u64 {
        self.tls_handshakes.load(Ordering::Relaxed)
    }

    /// SASL exchanges failed so far.
    pub fn authentications(&self) -> u64 {
        self.authentications.load(Ordering::Relaxed)
    }

    /// Actions denied so far.
    pub fn authorizations(&self) -> u64 {
        self.authorizations.load(Ordering::Relaxed)
    }

    /// A TLS handshake failed or did not finish in time.
    pub fn tls_handshake_failed(&self) {
        self.tls_handshakes.fetch_add(1, Ordering::Relaxed);
    }

    /// A SASL exchange failed.
    pub fn authentication_failed(&self) {
        self.authentications.fetch_add(1, Ordering::Relaxed);
    }

    /// The authorization policy denied an action.
    pub fn authorization_denied(&self) {
        self.authorizations.fetch_add(1, Ordering::Relaxed);
    }
}

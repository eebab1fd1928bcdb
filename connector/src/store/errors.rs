//! KubeMQ's error texts for the queue operations the store implements (KMQ-4, KMQ-7,
//! 5.1). Clients branch on the `Error NNN` code; where the reference's exact wording is not
//! documented (133, 134, 135) the text is ours and says so in docs/decisions.md.

/// Largest ExpirationSeconds and DelaySeconds (KMQ-9).
pub const MAX_POLICY_SECONDS: i32 = 43_200;
/// Largest MaxReceiveCount, and the value 0 is replaced with.
pub const MAX_RECEIVE_COUNT: i32 = 1024;

/// `Error 101`.
pub const CLIENT_ID_EMPTY: &str = "Error 101: invalid clientID value, cannot be empty";
/// `Error 120`.
pub const QUEUE_NAME_INVALID: &str =
    "Error 120: invalid queue name value, cannot be empty, contains wildcards ,white spaces and end with dot";
/// `Error 110`.
pub const MESSAGE_EMPTY: &str = "Error 110: invalid message, cannot be empty";
/// `Error 121`.
pub const CANNOT_SUBSCRIBE: &str = "Error 121: cannot subscribe to a queue";
/// `Error 133` (our wording).
pub const EXPIRATION_INVALID: &str =
    "Error 133: invalid queue message expiration seconds, must be between 0 and 43200";
/// `Error 134` (our wording).
pub const MAX_RECEIVE_INVALID: &str =
    "Error 134: invalid queue message max receive count, must be between 0 and 1024";
/// `Error 135` (our wording).
pub const DELAY_INVALID: &str =
    "Error 135: invalid queue message delay seconds, must be between 0 and 43200";

/// Transaction errors of 4.3.4, trailing spaces and typos included.
pub mod txn {
    /// Any op on a transaction this stream does not know.
    pub const NOT_FOUND: &str = "transaction is completed or transaction id not found";
    /// Ack on a closed transaction.
    pub const ACK_CLOSED: &str = "cannot ack messages with closed response ";
    /// NAck on a closed transaction.
    pub const NACK_CLOSED: &str = "cannot nack messages with closed response ";
    /// ReQueueRange on a closed transaction.
    pub const REQUEUE_CLOSED: &str = "cannot requeue messages with closed response ";
    /// ActiveOffsets on a closed transaction.
    pub const OFFSETS_CLOSED: &str = "cannot get active offsets with closed response ";
    /// AckRange with no sequences.
    pub const ACK_EMPTY: &str = "cannot ack empty list of of offsets";
    /// NAckRange with no sequences.
    pub const NACK_EMPTY: &str = "cannot nack empty list of of offsets";
    /// ReQueueRange with no sequences.
    pub const REQUEUE_EMPTY: &str = "cannot requeue empty list of of offsets";
    /// ReQueue without a destination.
    pub const REQUEUE_NO_CHANNEL: &str = "cannot requeue messages with empty channel destination ";
    /// Unsupported request types.
    pub const UNKNOWN: &str = "request unknown";
}

/// Whether `name` is a valid queue channel: non-empty, no whitespace, no `*` or `>`, no trailing
/// `.`, and the broker's rules (no leading `.`, no empty token, no `/`) that the reference reports
/// later or loses silently (5.1).
pub fn valid_queue_name(name: &str) -> bool {
    !name.is_empty()
        && !name.ends_with('.')
        && !name.starts_with('.')
        && !name.contains("..")
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c == '*' || c == '>' || c == '/')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KMQ-8: queue channel rules.
    #[test]
    fn queue_names() {
        for ok in ["orders", "orders.eu-1.created", "a_b-c", "q:x"] {
            assert!(valid_queue_name(ok), "{ok}");
        }
        for bad in ["", "a.", ".a", "a..b", "a b", "a\tb", "a*", "a>", "a/b"] {
            assert!(!valid_queue_name(bad), "{bad:?}");
        }
    }
}

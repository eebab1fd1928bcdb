//! What a gRPC status from KubeMQ means for the connector: the broker away (worth a retry), a
//! refused credential or access, or one of KubeMQ's own refusals.

use tonic::{Code, Status};

use super::{kubemq_code, BackendError};

/// The broker, or the connection to it, is gone.
pub(super) fn unavailable(s: &Status) -> BackendError {
    BackendError::Unavailable(format!("{}: {}", s.code(), s.message()))
}

/// Whether KubeMQ refused the call's token (its authentication interceptor answers
/// `Unauthenticated`).
pub(super) fn credential_refused(s: &Status) -> bool {
    matches!(s.code(), Code::Unauthenticated | Code::PermissionDenied)
}

/// A call KubeMQ answered with an error that is not transient: a refused credential is
/// told apart from every other refusal.
pub(super) fn refused(s: &Status) -> BackendError {
    if credential_refused(s) {
        BackendError::Unauthorized(s.message().to_string())
    } else {
        BackendError::refusal(s.message().to_string())
    }
}

/// A call's failure: the server or the connection to it gone, or a refusal (see [`refused`]).
pub(super) fn failure(s: &Status) -> BackendError {
    if retryable(s) || connection_cut(s) {
        unavailable(s)
    } else {
        refused(s)
    }
}

/// Whether tonic reports the HTTP/2 connection cut under the call (a reset or GOAWAY with an
/// error reason comes as `Internal`, "h2 protocol error: …"): the broker gone, not a refusal.
/// Not retried as [`retryable`] calls are: the call may have reached KubeMQ.
fn connection_cut(s: &Status) -> bool {
    s.code() == Code::Internal && s.message().starts_with("h2 protocol error")
}

/// Whether a call may succeed when tried again: the server or the connection was away, not a
/// refusal of KubeMQ's (its texts carry a code, `Error NNN: ...`).
pub(super) fn retryable(s: &Status) -> bool {
    matches!(s.code(), Code::Unavailable | Code::Unknown) && kubemq_code(s.message()).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A subscription lost with its connection (tonic reports the cut stream as Unknown,
    /// Unavailable, or Internal with an HTTP/2 reason) is the broker being unavailable; KubeMQ's
    /// own refusals ("Error …") and a refused credential stay refusals.
    #[test]
    fn a_lost_subscription_is_unavailable_a_refusal_is_not() {
        let lost = [
            Status::unknown("h2 protocol error: error reading a body from connection"),
            Status::internal("h2 protocol error: error reading a body from connection"),
            Status::unavailable("connection reset"),
        ];
        for s in lost {
            assert!(matches!(failure(&s), BackendError::Unavailable(_)), "{s:?}");
        }
        let refusal = Status::unknown("Error 207: wrong subscribe type");
        let invalid = Status::unknown("Error 120: invalid queue name");
        assert!(matches!(failure(&invalid), BackendError::Invalid(_)));
        assert!(
            matches!(failure(&refusal), BackendError::Rejected(t) if t.starts_with("Error 207"))
        );
        let internal = Status::internal("Error 301: timeout for request message");
        assert!(matches!(failure(&internal), BackendError::Rejected(_)));
        let credential = Status::unauthenticated("invalid token");
        assert!(matches!(
            failure(&credential),
            BackendError::Unauthorized(_)
        ));
        // Where KubeMQ authorizes, a denied call is its Error 412, in a status or a result.
        let denied = Status::unknown("Error 412: access denied to resource");
        assert!(matches!(failure(&denied), BackendError::Unauthorized(_)));
    }
}

//! The audit events (AUD-1 … AUD-4, and `authz.denied`): structured log lines on the `audit`
//! target, with the fields KubeMQ's audit records carry. Nothing secret is ever a field: the
//! engine's reports hold no password or token, and reasons never quote one.

use std::net::IpAddr;

use crate::engine::{SaslReport, SaslResult};
use crate::pattern::Pattern;

use super::policy::{resource, Action};

/// The transport every event names.
const TRANSPORT: &str = "amqp10";

/// `auth.success` or `auth.failure` for one SASL exchange from `source`.
pub fn authenticated(source: IpAddr, report: &SaslReport) {
    let username = report.username.as_deref().unwrap_or("");
    match &report.outcome {
        SaslResult::Success { client_id } => tracing::info!(
            target: "audit",
            event = "auth.success",
            "ClientID" = %client_id,
            "Transport" = TRANSPORT,
            "SourceIP" = %source,
            "Metadata.mechanism" = %report.mechanism,
            "Metadata.username" = ?username,
            "auth.success"
        ),
        // OP-OBS-4: a failure established no identity, so ClientID is empty.
        SaslResult::Failure { reason } => tracing::warn!(
            target: "audit",
            event = "auth.failure",
            "ClientID" = "",
            "Transport" = TRANSPORT,
            "SourceIP" = %source,
            "Error" = %reason,
            "Metadata.mechanism" = %report.mechanism,
            "Metadata.username" = ?username,
            "auth.failure"
        ),
    }
}

/// `auth.failure` for `count` failed logins from `source` not written one by one, because the
/// source failed too often (AUD-5).
pub fn failures_summarized(source: IpAddr, count: u64) {
    tracing::warn!(
        target: "audit",
        event = "auth.failure",
        "ClientID" = "",
        "Transport" = TRANSPORT,
        "SourceIP" = %source,
        "Error" = "repeated failed logins; outcomes delayed",
        "Metadata.count" = count,
        "auth.failure"
    );
}

/// `authz.denied`: `client_id` may not do `action` on `channel` of `pattern`.
pub fn denied(client_id: &str, pattern: Pattern, channel: &str, action: Action) {
    tracing::warn!(
        target: "audit",
        event = "authz.denied",
        "ClientID" = %client_id,
        "Transport" = TRANSPORT,
        "Resource" = resource(pattern),
        "Channel" = ?channel,
        "Action" = action.as_str(),
        "authz.denied"
    );
}

//! The connector's Prometheus metrics: exactly the 11 families of MET-0 (MET-0 …
//! MET-11). Gauges only move through paired increments and decrements, so they never go
//! negative. Families of patterns that do not exist yet are registered and stay at 0.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use crate::pattern::Direction;
use crate::pattern::Pattern;

/// A link's role from the server's point of view (MET-3).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Role {
    /// The server sends (the client consumes).
    sender,
    /// The server receives (the client produces).
    receiver,
}

/// Label set `role`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabel {
    /// The role.
    pub role: Role,
}

/// What a transfer is counted under (MET-4): a pattern, or a response to a request. Every one
/// has its counters kept at hand, so that counting a message looks up no labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Messages of a pattern.
    Pattern(Pattern),
    /// Responses to requests (`responses/...`).
    Responses,
}

impl Counted {
    /// Every one, in the order of [`Counted::index`].
    const ALL: [Counted; 6] = [
        Counted::Pattern(Pattern::Queues),
        Counted::Pattern(Pattern::Events),
        Counted::Pattern(Pattern::EventsStore),
        Counted::Pattern(Pattern::Commands),
        Counted::Pattern(Pattern::Queries),
        Counted::Responses,
    ];

    /// The `pattern` label's value.
    fn name(self) -> &'static str {
        match self {
            Counted::Pattern(p) => p.name(),
            Counted::Responses => "responses",
        }
    }

    /// Where its counters are in [`Counted::ALL`].
    fn index(self) -> usize {
        match self {
            Counted::Pattern(Pattern::Queues) => 0,
            Counted::Pattern(Pattern::Events) => 1,
            Counted::Pattern(Pattern::EventsStore) => 2,
            Counted::Pattern(Pattern::Commands) => 3,
            Counted::Pattern(Pattern::Queries) => 4,
            Counted::Responses => 5,
        }
    }
}
/// The patterns of MET-6.
const RPC_PATTERNS: [&str; 2] = ["commands", "queries"];

/// Label set `direction`, `pattern`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransferLabels {
    /// `in` or `out`.
    pub direction: String,
    /// Pattern name (`queues`, ...).
    pub pattern: String,
}

impl TransferLabels {
    fn new(direction: Direction, pattern: &str) -> Self {
        TransferLabels {
            direction: match direction {
                Direction::In => "in",
                Direction::Out => "out",
            }
            .to_string(),
            pattern: pattern.to_string(),
        }
    }
}

/// Terminal disposition outcome (MET-5).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    /// accepted
    accepted,
    /// released
    released,
    /// modified
    modified,
    /// rejected
    rejected,
}

/// Label set `outcome`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// The outcome.
    pub outcome: Outcome,
}

/// Label set `pattern` (MET-6).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PatternLabel {
    /// `commands` or `queries`.
    pub pattern: String,
}

/// Where an error condition was carried (MET-7, ERR-6).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Scope {
    /// CLOSE.
    conn,
    /// END.
    session,
    /// DETACH or a rejected outcome.
    link,
}

/// Label set `scope`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLabel {
    /// The scope.
    pub scope: Scope,
}

/// Every metric of the connector.
pub struct Metrics {
    /// MET-1.
    pub connections: Gauge,
    /// MET-2.
    pub sessions: Gauge,
    /// MET-3.
    pub links: Family<RoleLabel, Gauge>,
    /// MET-4.
    pub transfers: Family<TransferLabels, Counter>,
    /// MET-5.
    pub dispositions: Family<OutcomeLabel, Counter>,
    /// MET-6.
    pub rpc_requests: Family<PatternLabel, Counter>,
    /// MET-7.
    pub errors: Family<ScopeLabel, Counter>,
    /// MET-8.
    pub transfers_in_dropped: Counter,
    /// MET-9.
    pub events_dropped_no_credit: Counter,
    /// MET-10.
    pub events_store_dropped_stalled: Counter,
    /// MET-11.
    pub rpc_late_responses: Counter,
    /// RPC entries every connection holds now: requests waiting for their response and
    /// delivered requests waiting for an answer. Not a metric family (MET-0 has exactly 11);
    /// read by tests, to see that nothing is left behind.
    pub rpc_held: std::sync::atomic::AtomicI64,
    /// Where queue messages' time goes, stage by stage: not a metric family either (MET-0);
    /// shown at `/api/amqp10/stages`.
    pub stages: crate::stages::Stages,
    /// Transfers per channel (a bounded number of channels per pattern).
    pub channels: crate::channel_traffic::ChannelTraffic,
    /// The members of `rpc_requests`, by [`RPC_PATTERNS`]: counted without a label set per request.
    rpc_counters: [Counter; 2],
    /// The members of `transfers` by [`Counted::index`] then direction, held so that counting a
    /// message does not build and hash a label set: this is on every message's path.
    pattern_transfers: [[Counter; 2]; Counted::ALL.len()],
    /// The dispositions family's counters, by `Outcome` (counted on every settled delivery).
    outcome_counters: [Counter; 4],
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// All metrics at zero, with every known label set present so each family is exposed from
    /// the start (MET-0).
    pub fn new() -> Self {
        let mut m = Metrics {
            connections: Gauge::default(),
            sessions: Gauge::default(),
            links: Family::default(),
            transfers: Family::default(),
            dispositions: Family::default(),
            rpc_requests: Family::default(),
            errors: Family::default(),
            transfers_in_dropped: Counter::default(),
            events_dropped_no_credit: Counter::default(),
            events_store_dropped_stalled: Counter::default(),
            rpc_late_responses: Counter::default(),
            rpc_held: Default::default(),
            stages: Default::default(),
            channels: Default::default(),
            rpc_counters: Default::default(),
            pattern_transfers: Default::default(),
            outcome_counters: Default::default(),
        };
        for role in [Role::sender, Role::receiver] {
            let _ = m.link(role);
        }
        m.outcome_counters = [
            Outcome::accepted,
            Outcome::released,
            Outcome::modified,
            Outcome::rejected,
        ]
        .map(|outcome| {
            m.dispositions
                .get_or_create(&OutcomeLabel { outcome })
                .clone()
        });
        for scope in [Scope::conn, Scope::session, Scope::link] {
            let _ = m.errors.get_or_create(&ScopeLabel { scope });
        }
        m.rpc_counters = RPC_PATTERNS.map(|pattern| {
            m.rpc_requests
                .get_or_create(&PatternLabel {
                    pattern: pattern.into(),
                })
                .clone()
        });
        m.pattern_transfers = Counted::ALL.map(|counted| {
            [Direction::In, Direction::Out].map(|direction| {
                m.transfers
                    .get_or_create(&TransferLabels::new(direction, counted.name()))
                    .clone()
            })
        });
        m
    }

    /// The text exposition of every family.
    pub fn encode(&self) -> String {
        let mut r = Registry::default();
        r.register(
            "kubemq_amqp10_connections",
            "Open AMQP 1.0 connections",
            self.connections.clone(),
        );
        r.register(
            "kubemq_amqp10_sessions",
            "Open sessions",
            self.sessions.clone(),
        );
        r.register(
            "kubemq_amqp10_links",
            "Attached links by server role",
            self.links.clone(),
        );
        r.register(
            "kubemq_amqp10_transfers",
            "Message transfers by direction and pattern",
            self.transfers.clone(),
        );
        r.register(
            "kubemq_amqp10_dispositions",
            "Terminal dispositions by outcome",
            self.dispositions.clone(),
        );
        r.register(
            "kubemq_amqp10_rpc_requests",
            "RPC requests routed",
            self.rpc_requests.clone(),
        );
        r.register(
            "kubemq_amqp10_errors",
            "Error conditions emitted by scope",
            self.errors.clone(),
        );
        r.register(
            "kubemq_amqp10_transfers_in_dropped",
            "Inbound messages dropped",
            self.transfers_in_dropped.clone(),
        );
        r.register(
            "kubemq_amqp10_events_dropped_no_credit",
            "Events dropped at zero credit",
            self.events_dropped_no_credit.clone(),
        );
        r.register(
            "kubemq_amqp10_events_store_dropped_stalled",
            "Events-store messages dropped by a stall",
            self.events_store_dropped_stalled.clone(),
        );
        r.register(
            "kubemq_amqp10_rpc_late_responses",
            "RPC responses after the requester left",
            self.rpc_late_responses.clone(),
        );
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &r).is_err() {
            out.clear();
        }
        out
    }

    /// Counts one message transfer.
    pub fn transfer(&self, direction: Direction, counted: Counted) {
        if let Some(c) = self
            .pattern_transfers
            .get(counted.index())
            .and_then(|d| d.get(direction as usize))
        {
            c.inc();
        }
    }

    /// Transfers counted so far for `direction` (`in` / `out`) and `pattern`.
    pub fn transfers_counted(&self, direction: &str, pattern: &str) -> u64 {
        let d = if direction == "in" {
            Direction::In
        } else {
            Direction::Out
        };
        self.transfers
            .get_or_create(&TransferLabels::new(d, pattern))
            .get()
    }

    /// Counts one RPC request routed (MET-6); `pattern` is `commands` or `queries`.
    pub fn rpc_request(&self, pattern: &str) {
        match RPC_PATTERNS.iter().position(|p| *p == pattern) {
            Some(i) => {
                if let Some(c) = self.rpc_counters.get(i) {
                    c.inc();
                }
            }
            None => {
                self.rpc_requests
                    .get_or_create(&PatternLabel {
                        pattern: pattern.to_string(),
                    })
                    .inc();
            }
        }
    }

    /// Counts one terminal disposition.
    pub fn disposition(&self, outcome: Outcome) {
        if let Some(c) = self.outcome_counters.get(outcome as usize) {
            c.inc();
        }
    }

    /// Counts emitted error conditions.
    pub fn errors(&self, scope: Scope, n: u64) {
        if n > 0 {
            self.errors.get_or_create(&ScopeLabel { scope }).inc_by(n);
        }
    }

    /// Attached links of a role.
    pub fn link(&self, role: Role) -> Gauge {
        self.links.get_or_create(&RoleLabel { role }).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MET-4: every pattern and responses are counted under their own label, each at the place
    /// its index names.
    #[test]
    fn met_4_each_counted_has_its_counters() {
        let m = Metrics::new();
        for (i, counted) in Counted::ALL.into_iter().enumerate() {
            assert_eq!(counted.index(), i, "{counted:?}");
            for _ in 0..=i {
                m.transfer(Direction::In, counted);
            }
        }
        for (i, counted) in Counted::ALL.into_iter().enumerate() {
            assert_eq!(
                m.transfers_counted("in", counted.name()),
                i as u64 + 1,
                "{counted:?}"
            );
        }
    }

    /// MET-0: exactly 11 families, with their names and types.
    #[test]
    fn met_0_eleven_families() {
        let m = Metrics::new();
        let queues = Counted::Pattern(Pattern::Queues);
        m.transfer(Direction::In, queues);
        m.transfer(Direction::Out, queues);
        m.transfer(Direction::Out, queues);
        m.disposition(Outcome::accepted);
        m.link(Role::receiver).inc();
        let text = m.encode();
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
        assert_eq!(types.len(), 11, "{text}");
        for (name, kind) in [
            ("kubemq_amqp10_connections", "gauge"),
            ("kubemq_amqp10_sessions", "gauge"),
            ("kubemq_amqp10_links", "gauge"),
            ("kubemq_amqp10_transfers", "counter"),
            ("kubemq_amqp10_dispositions", "counter"),
            ("kubemq_amqp10_rpc_requests", "counter"),
            ("kubemq_amqp10_errors", "counter"),
            ("kubemq_amqp10_transfers_in_dropped", "counter"),
            ("kubemq_amqp10_events_dropped_no_credit", "counter"),
            ("kubemq_amqp10_events_store_dropped_stalled", "counter"),
            ("kubemq_amqp10_rpc_late_responses", "counter"),
        ] {
            assert!(
                types.contains(&format!("# TYPE {name} {kind}").as_str()),
                "{name} {kind} in {text}"
            );
        }
        assert!(
            text.contains(r#"kubemq_amqp10_transfers_total{direction="in",pattern="queues"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kubemq_amqp10_transfers_total{direction="out",pattern="queues"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"kubemq_amqp10_dispositions_total{outcome="accepted"} 1"#));
        assert!(text.contains(r#"kubemq_amqp10_links{role="receiver"} 1"#));
    }

    /// MET-5: each outcome lands under its own label (the counters are held by position, so a
    /// reordered enum would move counts between labels).
    #[test]
    fn met_5_each_outcome_under_its_label() {
        let m = Metrics::new();
        let outcomes = [
            Outcome::accepted,
            Outcome::released,
            Outcome::modified,
            Outcome::rejected,
        ];
        for (i, o) in outcomes.into_iter().enumerate() {
            for _ in 0..=i {
                m.disposition(o);
            }
        }
        let text = m.encode();
        for (i, name) in ["accepted", "released", "modified", "rejected"]
            .into_iter()
            .enumerate()
        {
            let line = format!(
                r#"kubemq_amqp10_dispositions_total{{outcome="{name}"}} {}"#,
                i + 1
            );
            assert!(text.contains(&line), "{line} in {text}");
        }
    }
}

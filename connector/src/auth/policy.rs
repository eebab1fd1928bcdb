//! Read / Write decisions from the access control list KubeMQ loads (`authorization.policyData`
//! or its file), evaluated by Casbin with KubeMQ's model (AUTHZ-1 … AUTHZ-4).
//!
//! The list is JSON — an array of rules, optionally base64-encoded — each rule naming the
//! patterns it covers (`Events`, `EventsStore`, `Commands`, `Queries`, `Queues`), a `ClientID`
//! and a `Channel` regular expression, and whether it allows `Read` and `Write`. KubeMQ turns
//! every rule into Casbin policies `resource, clientid, channel, action` with action `read`,
//! `write`, `.*` (both) or `deny` (neither), matched with `regexMatch` (unanchored), and any
//! matching policy allows. Field names are matched without regard to case, as Go's JSON does.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use casbin::function_map::OperatorFunction;
use casbin::rhai::Dynamic;
use casbin::{CoreApi, DefaultModel, Enforcer, MemoryAdapter, MgmtApi};
use lru::LruCache;

use crate::pattern::Pattern;

/// KubeMQ's Casbin model.
const MODEL: &str = "\
[request_definition]
r = res, sub, obj, act

[policy_definition]
p = res, sub, obj, act

[policy_effect]
e = some(where (p.eft == allow))

[matchers]
m = r.res == p.res && regexMatch(r.sub, p.sub) && regexMatch(r.obj, p.obj) && regexMatch(r.act, p.act)
";

/// Decisions remembered (AUTHZ-4).
const CACHE_ENTRIES: usize = 1024;
/// How long one is remembered (AUTHZ-4).
const CACHE_TTL: Duration = Duration::from_secs(60);

/// What a link or message wants to do on a channel (AUTHZ-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Consume: a client receiver.
    Read,
    /// Produce: a client sender, or a message on the anonymous terminus.
    Write,
}

impl Action {
    /// What a link does: a client sender writes, a client receiver reads (AUTHZ-2).
    pub fn of_link(client_sends: bool) -> Action {
        if client_sends {
            Action::Write
        } else {
            Action::Read
        }
    }

    /// The action's name in the policy.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Read => "read",
            Action::Write => "write",
        }
    }
}

/// The policy resource of a pattern (AUTHZ-3).
pub fn resource(pattern: Pattern) -> &'static str {
    match pattern {
        Pattern::Queues => "queues",
        Pattern::Events => "events",
        Pattern::EventsStore => "events_store",
        Pattern::Commands => "commands",
        Pattern::Queries => "queries",
    }
}

/// Why a policy cannot be loaded; says which rule and field.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file cannot be read.
    #[error("cannot read the authorization policy file {path}: {error}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// Not a JSON array of rules (plain or base64).
    #[error("the authorization policy is not a JSON list of rules: {0}")]
    Json(String),
    /// An empty list.
    #[error("the authorization policy has no rules")]
    Empty,
    /// One rule is wrong.
    #[error("authorization policy rule {index}: {problem}")]
    Rule {
        /// Its position, from 0 (as KubeMQ reports it).
        index: usize,
        /// What is wrong.
        problem: String,
    },
    /// Casbin refused the model or a policy.
    #[error("authorization policy: {0}")]
    Casbin(String),
}

/// One access control rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Rule {
    resources: Vec<&'static str>,
    client_id: String,
    channel: String,
    read: bool,
    write: bool,
}

impl Rule {
    /// Reads a rule object; keys in any case, missing flags false.
    fn from_json(index: usize, value: &serde_json::Value) -> Result<Rule, PolicyError> {
        let bad = |problem: String| PolicyError::Rule { index, problem };
        let object = value
            .as_object()
            .ok_or_else(|| bad("is not an object".into()))?;
        let mut rule = Rule::default();
        for (key, v) in object {
            let flag = || {
                v.as_bool()
                    .ok_or_else(|| bad(format!("{key} must be true or false")))
            };
            let text = || {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad(format!("{key} must be a string")))
            };
            let resource = match key.to_ascii_lowercase().as_str() {
                "events" => Some("events"),
                "eventsstore" => Some("events_store"),
                "commands" => Some("commands"),
                "queries" => Some("queries"),
                "queues" => Some("queues"),
                "clientid" => {
                    rule.client_id = text()?;
                    None
                }
                "channel" => {
                    rule.channel = text()?;
                    None
                }
                "read" => {
                    rule.read = flag()?;
                    None
                }
                "write" => {
                    rule.write = flag()?;
                    None
                }
                // Unknown keys are ignored, as Go's JSON decoding does.
                _ => None,
            };
            if let Some(res) = resource {
                if flag()? {
                    rule.resources.push(res);
                }
            }
        }
        for (name, re) in [("ClientID", &rule.client_id), ("Channel", &rule.channel)] {
            if re.is_empty() {
                return Err(bad(format!("{name} regular expression cannot be empty")));
            }
            // Casbin compiles the expression at every decision and panics on a bad one: every
            // expression is compiled here first, with the same regex crate.
            regex::Regex::new(re)
                .map_err(|e| bad(format!("{name} is not a regular expression: {e}")))?;
        }
        Ok(rule)
    }

    /// KubeMQ's action for the rule's flags.
    fn action(&self) -> &'static str {
        match (self.read, self.write) {
            (true, true) => ".*",
            (true, false) => "read",
            (false, true) => "write",
            (false, false) => "deny",
        }
    }
}

/// Patterns compiled so far, by text. Only policy patterns are compiled (the matcher's second
/// argument is always the policy's), so this holds at most the loaded policies' expressions.
static COMPILED: LazyLock<Mutex<HashMap<String, regex::Regex>>> = LazyLock::new(Default::default);

/// `regexMatch(text, pattern)`: whether `pattern` matches anywhere in `text`, as Go's
/// `regexp.MatchString` and casbin's own function do. A pattern that does not compile matches
/// nothing (every policy pattern was compiled at load, so none reaches here).
fn regex_match(text: Dynamic, pattern: Dynamic) -> Dynamic {
    let text = text.into_immutable_string().unwrap_or_default();
    let pattern = pattern.into_immutable_string().unwrap_or_default();
    let Ok(mut compiled) = COMPILED.lock() else {
        return Dynamic::from(false);
    };
    if !compiled.contains_key(pattern.as_str()) {
        match regex::Regex::new(&pattern) {
            Ok(re) => {
                compiled.insert(pattern.to_string(), re);
            }
            Err(_) => return Dynamic::from(false),
        }
    }
    Dynamic::from(
        compiled
            .get(pattern.as_str())
            .is_some_and(|re| re.is_match(&text)),
    )
}

/// Parses the access control list: JSON, or base64 of JSON.
fn parse(text: &str) -> Result<Vec<Rule>, PolicyError> {
    let trimmed = text.trim();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(trimmed)
        .ok()
        .and_then(|b| String::from_utf8(b).ok());
    let json = decoded.as_deref().unwrap_or(trimmed);
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| PolicyError::Json(e.to_string()))?;
    let list = value
        .as_array()
        .ok_or_else(|| PolicyError::Json("expected a list".into()))?;
    if list.is_empty() {
        return Err(PolicyError::Empty);
    }
    list.iter()
        .enumerate()
        .map(|(i, v)| Rule::from_json(i, v))
        .collect()
}

/// The cache key of a decision.
type Key = (String, &'static str, String, Action);

/// A loaded policy and its decision cache.
pub struct Policy {
    enforcer: Enforcer,
    /// Decisions with the time they were made, process-wide (the policy is).
    cache: Mutex<LruCache<Key, (bool, Instant)>>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy").finish_non_exhaustive()
    }
}

impl Policy {
    /// Loads the access control list in `text`.
    pub async fn from_text(text: &str) -> Result<Policy, PolicyError> {
        let rules = parse(text)?;
        let model = DefaultModel::from_str(MODEL)
            .await
            .map_err(|e| PolicyError::Casbin(e.to_string()))?;
        let mut enforcer = Enforcer::new(model, MemoryAdapter::default())
            .await
            .map_err(|e| PolicyError::Casbin(e.to_string()))?;
        // The same matching as casbin's own regexMatch, without compiling the pattern again at
        // every decision (which made a decision cost ~300 µs).
        enforcer.add_function("regexMatch", OperatorFunction::Arg2(regex_match));
        let mut policies: Vec<Vec<String>> = Vec::new();
        for rule in &rules {
            for res in &rule.resources {
                let p = vec![
                    res.to_string(),
                    rule.client_id.clone(),
                    rule.channel.clone(),
                    rule.action().to_string(),
                ];
                // The same policy twice is one policy.
                if !policies.contains(&p) {
                    policies.push(p);
                }
            }
        }
        enforcer
            .add_policies(policies)
            .await
            .map_err(|e| PolicyError::Casbin(e.to_string()))?;
        Ok(Policy {
            enforcer,
            cache: Mutex::new(LruCache::new(
                NonZeroUsize::new(CACHE_ENTRIES).unwrap_or(NonZeroUsize::MIN),
            )),
        })
    }

    /// Loads the access control list file at `path`.
    pub async fn from_file(path: &std::path::Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|error| PolicyError::Read {
            path: path.display().to_string(),
            error,
        })?;
        Policy::from_text(&text).await
    }

    /// Whether `client_id` may do `action` on `channel` of `pattern`, from the cache when it
    /// decided the same question in the last 60 s (AUTHZ-4).
    pub fn allows(&self, client_id: &str, pattern: Pattern, channel: &str, action: Action) -> bool {
        let key: Key = (
            client_id.to_string(),
            resource(pattern),
            channel.to_string(),
            action,
        );
        let now = Instant::now();
        if let Ok(mut cache) = self.cache.lock() {
            if let Some((allowed, at)) = cache.get(&key) {
                if now.duration_since(*at) < CACHE_TTL {
                    return *allowed;
                }
            }
        }
        let allowed = self.decide(&key);
        if let Ok(mut cache) = self.cache.lock() {
            cache.put(key, (allowed, now));
        }
        allowed
    }

    /// Asks Casbin; an evaluation error denies.
    fn decide(&self, (client_id, res, channel, action): &Key) -> bool {
        match self.enforcer.enforce((
            res.to_string(),
            client_id.clone(),
            channel.clone(),
            action.as_str().to_string(),
        )) {
            Ok(allowed) => allowed,
            Err(e) => {
                tracing::warn!(error = %e, "authorization policy evaluation failed; denied");
                false
            }
        }
    }

    /// Decisions cached now (for tests).
    #[cfg(test)]
    fn cached(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACL: &str = r#"[
        {"Queues": true, "Events": true, "ClientID": "^writer$", "Channel": "^orders$", "Read": false, "Write": true},
        {"queues": true, "clientid": "^reader", "channel": "orders", "read": true},
        {"Queues": true, "ClientID": "admin", "Channel": ".*", "Read": true, "Write": true},
        {"Queues": true, "ClientID": "^blocked$", "Channel": ".*"}
    ]"#;

    async fn policy() -> Policy {
        Policy::from_text(ACL).await.unwrap()
    }

    /// AUTHZ-2, AUTHZ-3: Read and Write decided per ClientID, resource and channel as KubeMQ's
    /// model does: regular expressions unanchored unless anchored, both flags give both actions,
    /// neither gives nothing, and a rule covers only the patterns it names.
    #[tokio::test]
    async fn authz_2_decisions() {
        let p = policy().await;
        let q = Pattern::Queues;
        assert!(p.allows("writer", q, "orders", Action::Write));
        assert!(!p.allows("writer", q, "orders", Action::Read));
        assert!(!p.allows("writer", q, "orders-eu", Action::Write));
        assert!(p.allows("writer", Pattern::Events, "orders", Action::Write));
        assert!(!p.allows("writer", Pattern::EventsStore, "orders", Action::Write));
        assert!(p.allows("reader-7", q, "eu.orders.v2", Action::Read));
        assert!(!p.allows("reader-7", q, "eu.orders.v2", Action::Write));
        assert!(!p.allows("the-reader", q, "orders", Action::Read));
        assert!(p.allows("superadmin", q, "anything", Action::Write));
        assert!(p.allows("superadmin", q, "anything", Action::Read));
        assert!(!p.allows("blocked", q, "orders", Action::Read));
        assert!(!p.allows("blocked", q, "orders", Action::Write));
        assert!(!p.allows("stranger", q, "orders", Action::Write));
    }

    /// AUTHZ-4: decisions are cached, at most 1024 of them.
    #[tokio::test]
    async fn authz_4_cache_bounded() {
        let p = policy().await;
        for i in 0..2000 {
            p.allows("admin", Pattern::Queues, &format!("ch{i}"), Action::Write);
        }
        assert_eq!(p.cached(), CACHE_ENTRIES);
        assert!(p.allows("admin", Pattern::Queues, "ch1999", Action::Write));
    }

    /// The policy may be base64 of the JSON, as KubeMQ accepts it.
    #[tokio::test]
    async fn authz_base64_policy() {
        let encoded = base64::engine::general_purpose::STANDARD.encode(ACL);
        let p = Policy::from_text(&encoded).await.unwrap();
        assert!(p.allows("writer", Pattern::Queues, "orders", Action::Write));
    }

    /// A policy that cannot be used says which rule and why, and is refused at start-up.
    #[tokio::test]
    async fn authz_bad_policies_refused() {
        for (text, want) in [
            ("[]", "has no rules"),
            ("{}", "expected a list"),
            ("not json", "not a JSON list"),
            (
                r#"[{"Queues": true, "Channel": ".*"}]"#,
                "rule 0: ClientID regular expression cannot be empty",
            ),
            (
                r#"[{"Queues": true, "ClientID": "a", "Channel": ".*"}, {"Queues": true, "ClientID": "(", "Channel": "x"}]"#,
                "rule 1: ClientID is not a regular expression",
            ),
            (
                r#"[{"Queues": "yes", "ClientID": "a", "Channel": "b"}]"#,
                "rule 0: Queues must be true or false",
            ),
        ] {
            let e = Policy::from_text(text).await.unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    proptest::proptest! {
        /// A policy file of any content is refused or loaded, never a panic; a loaded one
        /// answers any question (its expressions all compiled at load).
        #[test]
        fn authz_any_policy_text_is_answered(
            client_id in "[-a-z().*|^$\\[\\]]{1,12}",
            channel in "[-a-z().*|^$\\[\\]]{1,12}",
            noise in ".{0,64}",
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let _ = rt.block_on(Policy::from_text(&noise));
            let text = serde_json::json!([{"Queues": true, "ClientID": client_id, "Channel": channel, "Read": true}]).to_string();
            if let Ok(p) = rt.block_on(Policy::from_text(&text)) {
                let _ = p.allows("client", Pattern::Queues, "channel", Action::Read);
            }
        }
    }
}

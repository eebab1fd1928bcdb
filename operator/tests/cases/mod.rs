//! What the operator's test binaries share: the examples' AmqpConnector, reading conditions and
//! Events, and the specs the CRD must refuse, each with what it breaks and the message the
//! refusal carries (the client-side checks in crd.rs and the real API server in real_cluster run
//! the same table).

#![allow(dead_code)] // each test binary uses its own part of it

use serde_json::{json, Value};

/// The AmqpConnector document of `examples/<file>` (the examples also create what they need,
/// such as a Namespace and a Secret).
pub fn example(file: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("example");
    let found = serde_yaml::Deserializer::from_str(&text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).expect("a YAML document"))
        .find(|d| d["kind"] == "AmqpConnector");
    found.expect("an AmqpConnector document")
}

/// The condition `kind` of an object as (status, reason).
pub fn condition(o: &Value, kind: &str) -> Option<(String, String)> {
    o["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or("").to_string(),
                c["reason"].as_str().unwrap_or("").to_string(),
            )
        })
}

/// (type, reason, note) of the events.k8s.io Events in `list` about the AmqpConnector `name`.
pub fn events_about(list: &Value, name: &str) -> Vec<(String, String, String)> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["regarding"]["name"] == name && e["regarding"]["kind"] == "AmqpConnector")
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
            (s("type"), s("reason"), s("note"))
        })
        .collect()
}

/// A change to the example's spec that one CEL rule refuses.
pub struct RuleCase {
    /// What it breaks.
    pub name: &'static str,
    /// Applied to `spec` of examples/amqpconnector.yaml.
    pub change: fn(&mut Value),
    /// Part of the rule's message.
    pub message: &'static str,
}

/// Every CEL rule of the CRD, broken once.
pub const RULES: &[RuleCase] = &[
    RuleCase {
        name: "no-listener",
        change: |s| s["listeners"]["amqp"]["enabled"] = false.into(),
        message: "at least one listener",
    },
    RuleCase {
        name: "amqps-without-tls",
        change: |s| s["listeners"]["amqps"]["enabled"] = true.into(),
        message: "the amqps listener needs spec.tls",
    },
    RuleCase {
        name: "client-auth-without-client-ca",
        change: |s| s["tls"] = json!({"secretName": "t", "clientAuth": "Required"}),
        message: "spec.tls.clientCa and spec.tls.clientAuth Required (or Optional) go together",
    },
    RuleCase {
        name: "client-ca-without-client-auth",
        change: |s| s["tls"] = json!({"secretName": "t", "clientCa": {"secretName": "ca"}}),
        message: "spec.tls.clientCa and spec.tls.clientAuth Required (or Optional) go together",
    },
    RuleCase {
        name: "same-listener-ports",
        change: |s| {
            s["tls"] = json!({"secretName": "t"});
            s["listeners"]["amqps"] = json!({"enabled": true, "port": 5672});
        },
        message: "different ports",
    },
    RuleCase {
        name: "external-without-required-client-auth",
        change: |s| {
            s["sasl"] = json!({"mechanisms": ["PLAIN", "EXTERNAL"],
                "jwt": {"secretName": "k", "signatureType": "HS256"}, "authorizeEveryClient": true})
        },
        message: "SASL EXTERNAL needs",
    },
    RuleCase {
        name: "sasl-without-plain",
        change: |s| s["sasl"] = json!({"mechanisms": ["ANONYMOUS"]}),
        message: "must include PLAIN",
    },
    RuleCase {
        name: "sasl-anonymous-with-jwt",
        change: |s| {
            s["sasl"] = json!({"mechanisms": ["PLAIN", "ANONYMOUS"],
                "jwt": {"secretName": "k", "signatureType": "HS256"}})
        },
        message: "spec.sasl.jwt is needed exactly when ANONYMOUS is not offered",
    },
    RuleCase {
        name: "sasl-authentication-without-jwt",
        change: |s| s["sasl"] = json!({"mechanisms": ["PLAIN"]}),
        message: "spec.sasl.jwt is needed exactly when ANONYMOUS is not offered",
    },
    RuleCase {
        name: "sasl-authorization-without-jwt",
        change: |s| {
            s["sasl"] = json!({"mechanisms": ["PLAIN", "ANONYMOUS"],
                "authorization": {"configMapName": "acl"}})
        },
        message: "spec.sasl.authorization needs spec.sasl.jwt",
    },
    RuleCase {
        name: "sasl-authorization-two-sources",
        change: |s| {
            s["sasl"] = json!({"mechanisms": ["PLAIN"],
                "jwt": {"secretName": "k", "signatureType": "HS256"},
                "authorization": {"configMapName": "acl", "secretName": "acl"}})
        },
        message: "names either configMapName or secretName",
    },
    RuleCase {
        name: "sasl-authentication-without-authorization",
        change: |s| {
            s["sasl"] = json!({"mechanisms": ["PLAIN"],
                "jwt": {"secretName": "k", "signatureType": "HS256"}})
        },
        message: "give exactly one of spec.sasl.authorization or authorizeEveryClient: true",
    },
    RuleCase {
        name: "sasl-authorization-and-every-client",
        change: |s| {
            s["sasl"] = json!({"mechanisms": ["PLAIN"],
                "jwt": {"secretName": "k", "signatureType": "HS256"},
                "authorization": {"configMapName": "acl"}, "authorizeEveryClient": true})
        },
        message: "give exactly one of spec.sasl.authorization or authorizeEveryClient: true",
    },
    RuleCase {
        name: "sasl-every-client-without-jwt",
        change: |s| {
            s["sasl"] = json!({"mechanisms": ["PLAIN", "ANONYMOUS"], "authorizeEveryClient": true})
        },
        message: "spec.sasl.authorizeEveryClient needs spec.sasl.jwt",
    },
    RuleCase {
        name: "node-ports-on-cluster-ip",
        change: |s| s["service"] = json!({"type": "ClusterIP", "nodePorts": {"amqp": 30672}}),
        message: "nodePorts needs",
    },
    RuleCase {
        name: "env-sets-pod-name",
        change: |s| s["env"] = json!([{"name": "POD_NAME", "value": "x"}]),
        message: "spec.env may not set",
    },
    RuleCase {
        name: "env-sets-a-connector-setting",
        change: |s| s["env"] = json!([{"name": "CONNECTORS_AMQP10_PORT", "value": "x"}]),
        message: "spec.env may not set",
    },
    RuleCase {
        name: "broker-without-port",
        change: |s| s["broker"]["address"] = "kubemq".into(),
        message: "must be host:port",
    },
    RuleCase {
        name: "broker-url",
        change: |s| s["broker"]["address"] = "http://kubemq:50000".into(),
        message: "must be host:port",
    },
    RuleCase {
        name: "broker-named-port",
        change: |s| s["broker"]["address"] = "kubemq:port".into(),
        message: "must be host:port",
    },
    RuleCase {
        name: "broker-without-host",
        change: |s| s["broker"]["address"] = ":50000".into(),
        message: "must be host:port",
    },
    RuleCase {
        name: "broker-port-above-65535",
        change: |s| s["broker"]["address"] = "kubemq:99999".into(),
        message: "the port from 1 to 65535",
    },
    RuleCase {
        name: "broker-port-zero",
        change: |s| s["broker"]["address"] = "kubemq:0".into(),
        message: "the port from 1 to 65535",
    },
    RuleCase {
        name: "rust-log-and-logging-level",
        change: |s| {
            s["env"] = json!([{"name": "RUST_LOG", "value": "debug"}]);
            s["logging"] = json!({"level": "info"});
        },
        message: "either with spec.logging.level or with RUST_LOG",
    },
    RuleCase {
        name: "external-traffic-policy-on-cluster-ip",
        change: |s| s["service"] = json!({"type": "ClusterIP", "externalTrafficPolicy": "Local"}),
        message: "service.externalTrafficPolicy needs",
    },
    RuleCase {
        name: "load-balancer-class-on-node-port",
        change: |s| {
            s["service"] = json!({"type": "NodePort", "loadBalancerClass": "example.com/lb"})
        },
        message: "need service.type LoadBalancer",
    },
    RuleCase {
        name: "load-balancer-source-ranges-without-type",
        change: |s| s["service"] = json!({"loadBalancerSourceRanges": ["10.0.0.0/8"]}),
        message: "need service.type LoadBalancer",
    },
    RuleCase {
        name: "metrics-port-is-the-amqp-port",
        change: |s| s["metrics"]["port"] = 5672.into(),
        message: "the metrics port",
    },
    RuleCase {
        name: "service-monitor-interval",
        change: |s| s["metrics"]["serviceMonitor"] = json!({"enabled": true, "interval": "soon"}),
        message: "a duration such as 30s",
    },
    RuleCase {
        name: "service-monitor-without-metrics",
        change: |s| s["metrics"] = json!({"enabled": false, "serviceMonitor": {"enabled": true}}),
        message: "spec.metrics.serviceMonitor needs spec.metrics.enabled",
    },
];

/// The rule case called `name`.
pub fn rule(name: &str) -> &'static RuleCase {
    RULES
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no rule case {name}"))
}

/// A spec the structural schema refuses, with the message of each checker.
pub struct SchemaCase {
    /// What it breaks.
    pub name: &'static str,
    /// The spec's YAML, indented by two spaces after its first line.
    pub spec: &'static str,
    /// Part of the message of `jsonschema` (tests/python/validate_cr.py); `None` for what only
    /// the API server checks (list-map keys).
    pub jsonschema: Option<&'static str>,
    /// Part of the message of the Kubernetes API server.
    pub apiserver: &'static str,
}

/// Broken types, bounds, enums and unknown fields.
pub const SCHEMA: &[SchemaCase] = &[
    SchemaCase {
        name: "no-broker",
        spec: "replicas: 1",
        jsonschema: Some("'broker' is a required property"),
        apiserver: "spec.broker: Required value",
    },
    SchemaCase {
        name: "unknown-field",
        spec: "broker: {address: 'k:1'}\n  amqp: {bogus: 1}",
        jsonschema: Some("'bogus' was unexpected"),
        apiserver: "unknown field \"spec.amqp.bogus\"",
    },
    SchemaCase {
        name: "replicas-string",
        spec: "broker: {address: 'k:1'}\n  replicas: two",
        jsonschema: Some("is not of type 'integer'"),
        apiserver: "spec.replicas: Invalid value: \"string\"",
    },
    SchemaCase {
        name: "batch-too-big",
        spec: "broker: {address: 'k:1'}\n  amqp: {getBatchSize: 2000}",
        jsonschema: Some("greater than the maximum of 1024"),
        apiserver: "spec.amqp.getBatchSize: Invalid value: 2000",
    },
    SchemaCase {
        name: "bad-pattern",
        spec: "broker: {address: 'k:1'}\n  amqp: {defaultPattern: topics}",
        jsonschema: Some("is not one of"),
        apiserver: "Unsupported value: \"topics\"",
    },
    SchemaCase {
        name: "frame-too-small",
        spec: "broker: {address: 'k:1'}\n  amqp: {maxFrameSize: 511}",
        jsonschema: Some("less than the minimum of 512"),
        apiserver: "spec.amqp.maxFrameSize: Invalid value: 511",
    },
    SchemaCase {
        // No partial pod template is merged over the rendered one: the pod's options are fields.
        name: "pod-template",
        spec: "broker: {address: 'k:1'}\n  podTemplate: {spec: {hostNetwork: true}}",
        jsonschema: Some("'podTemplate' was unexpected"),
        apiserver: "unknown field \"spec.podTemplate\"",
    },
    SchemaCase {
        name: "bad-quantity",
        spec: "broker: {address: 'k:1'}\n  resources: {limits: {cpu: lots}}",
        jsonschema: Some("'lots' does not match"),
        apiserver: "spec.resources.limits.cpu: Invalid value: \"lots\"",
    },
    SchemaCase {
        name: "bad-request-quantity",
        spec: "broker: {address: 'k:1'}\n  resources: {requests: {memory: 1GB}}",
        jsonschema: Some("'1GB' does not match"),
        apiserver: "spec.resources.requests.memory: Invalid value: \"1GB\"",
    },
    SchemaCase {
        name: "duplicate-env-names",
        spec: "broker: {address: 'k:1'}\n  env: [{name: RUST_BACKTRACE, value: '1'}, {name: RUST_BACKTRACE, value: '0'}]",
        jsonschema: None,
        apiserver: "Duplicate value",
    },
];

impl SchemaCase {
    /// The whole AmqpConnector, named `name`.
    pub fn document(&self, name: &str) -> String {
        format!(
            "apiVersion: amqp.kubemq.io/v1alpha1\nkind: AmqpConnector\nmetadata: {{name: {name}}}\nspec:\n  {}\n",
            self.spec
        )
    }
}

/// Names the CRD refuses (its children could not be named), and one at the limit it accepts.
pub const BAD_NAMES: &[&str] = &[
    "a-name-of-fifty-six-characters-is-one-too-long-for-thisx",
    "Orders",
    "1orders",
    "orders-",
];

/// The longest name the CRD accepts: 55 characters.
pub const LONGEST_NAME: &str = "a-name-of-fifty-five-characters-is-just-short-enough-xx";

/// Part of the refusal of a bad name.
pub const NAME_MESSAGE: &str = "metadata.name must be a DNS-1035 label";

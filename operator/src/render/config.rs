//! The connector's configuration file, rendered from a spec: the flat YAML map of setting names
//! the connector reads with `--config` (connector/src/config.rs). Only settings the
//! spec sets are written, so the connector's own defaults apply to the rest.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::RenderError;
use crate::crd::{AmqpConnectorSpec, DefaultPattern, LogFormat};

/// Where the pod mounts the ConfigMap, and the file in it.
pub const CONFIG_DIR: &str = "/etc/kubemq-amqp";
/// The file name inside [`CONFIG_DIR`] and the ConfigMap key.
pub const CONFIG_FILE: &str = "connector.yaml";

/// The rendered file and its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorConfig {
    /// The YAML text.
    pub text: String,
    /// `sha256:<hex>` of the text: on the pod template, so a change rolls the pods.
    pub hash: String,
}

/// Renders the file; fails on what this connector version cannot do yet, so that the operator
/// reports it instead of starting pods that ignore part of the spec.
pub fn connector_config(spec: &AmqpConnectorSpec) -> Result<ConnectorConfig, RenderError> {
    unsupported(spec)?;
    let mut m: BTreeMap<&str, String> = BTreeMap::new();
    m.insert("KubemqAddress", spec.broker.address.clone());
    m.insert(
        "Port",
        if spec.listeners.amqp.enabled {
            spec.listeners.amqp.port.to_string()
        } else {
            "0".into()
        },
    );
    m.insert("TlsPort", "0".into());
    // Probes need /livez and /readyz even when nobody scrapes /metrics.
    m.insert("HttpAddress", format!("0.0.0.0:{}", super::http_port(spec)));
    if let Some(a) = &spec.amqp {
        let set: [(&str, Option<String>); 11] = [
            ("MaxFrameSize", a.max_frame_size.map(|v| v.to_string())),
            ("MaxMessageSize", a.max_message_size.map(|v| v.to_string())),
            ("SessionMax", a.session_max.map(|v| v.to_string())),
            (
                "MaxLinksPerSession",
                a.max_links_per_session.map(|v| v.to_string()),
            ),
            ("MaxConnections", a.max_connections.map(|v| v.to_string())),
            (
                "IdleTimeoutSeconds",
                a.idle_timeout_seconds.map(|v| v.to_string()),
            ),
            ("DefaultPattern", a.default_pattern.map(pattern_name)),
            ("GetBatchSize", a.get_batch_size.map(|v| v.to_string())),
            (
                "MaxUnsettledPerLink",
                a.max_unsettled_per_link.map(|v| v.to_string()),
            ),
            (
                "DefaultRpcTimeoutSeconds",
                a.default_rpc_timeout_seconds.map(|v| v.to_string()),
            ),
            ("RpcMaxPending", a.rpc_max_pending.map(|v| v.to_string())),
        ];
        for (k, v) in set {
            if let Some(v) = v {
                m.insert(k, v);
            }
        }
    }
    // Text is the connector's default: written only for json, so a spec saying `text` renders
    // (and hashes) like one saying nothing.
    if spec
        .logging
        .as_ref()
        .is_some_and(|l| l.format == Some(LogFormat::Json))
    {
        m.insert("LogFormat", "json".into());
    }
    let mut text =
        String::from("# Rendered by the AmqpConnector operator; edit the AmqpConnector instead.\n");
    for (k, v) in &m {
        // Values are numbers, names and host:port strings; quoting keeps YAML from reading any
        // of them as another type.
        text.push_str(&format!("{k}: {}\n", serde_json::Value::String(v.clone())));
    }
    let hash = format!("sha256:{:x}", Sha256::digest(text.as_bytes()));
    Ok(ConnectorConfig { text, hash })
}

fn pattern_name(p: DefaultPattern) -> String {
    match p {
        DefaultPattern::Queues => "queues",
        DefaultPattern::Events => "events",
        DefaultPattern::EventsStore => "events-store",
        DefaultPattern::Commands => "commands",
        DefaultPattern::Queries => "queries",
    }
    .into()
}

/// Spec fields the connector cannot honour yet, by path.
fn unsupported(spec: &AmqpConnectorSpec) -> Result<(), RenderError> {
    let mut fields = Vec::new();
    if spec.listeners.amqps.enabled {
        fields.push("spec.listeners.amqps");
    }
    if spec.tls.is_some() {
        fields.push("spec.tls");
    }
    if spec.sasl.is_some() {
        fields.push("spec.sasl");
    }
    if spec.broker.tls.is_some() {
        fields.push("spec.broker.tls");
    }
    if spec.broker.client_id_prefix.is_some() {
        fields.push("spec.broker.clientIdPrefix");
    }
    if spec
        .metrics
        .as_ref()
        .and_then(|m| m.service_monitor.as_ref())
        .is_some_and(|m| m.enabled)
    {
        fields.push("spec.metrics.serviceMonitor");
    }
    if fields.is_empty() {
        Ok(())
    } else {
        Err(RenderError::Unsupported(
            fields.into_iter().map(String::from).collect(),
        ))
    }
}

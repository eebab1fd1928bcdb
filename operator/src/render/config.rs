//! The connector's configuration file, rendered from a spec: the flat YAML map of setting names
//! the connector reads with `--config` (connector/src/config.rs). Only settings the
//! spec sets are written, so the connector's own defaults apply to the rest.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::RenderError;
use serde_yaml::Value;

use crate::crd::{AmqpConnectorSpec, AmqpTunables, ClientAuth, LogFormat, TlsVersion};

/// Where the pod mounts the ConfigMap, and the file in it.
pub const CONFIG_DIR: &str = "/etc/kubemq-amqp";
/// The file name inside [`CONFIG_DIR`] and the ConfigMap key.
pub const CONFIG_FILE: &str = "connector.yaml";
/// Where the pod mounts the `spec.tls.secretName` Secret (`tls.crt`, `tls.key`).
pub const TLS_DIR: &str = "/etc/kubemq-amqp/tls";
/// Where the pod mounts the `spec.tls.clientCa` Secret (`ca.crt`).
pub const CLIENT_CA_DIR: &str = "/etc/kubemq-amqp/client-ca";
/// Where the pod mounts the `spec.sasl.jwt` Secret.
pub const JWT_DIR: &str = "/etc/kubemq-amqp/jwt";
/// Where the pod mounts the `spec.sasl.authorization` ConfigMap or Secret.
pub const POLICY_DIR: &str = "/etc/kubemq-amqp/policy";

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
    let mut m: BTreeMap<String, Value> = BTreeMap::new();
    m.insert(
        "KubemqAddress".into(),
        Value::from(spec.broker.address.as_str()),
    );
    let port = if spec.listeners.amqp.enabled {
        spec.listeners.amqp.port
    } else {
        0
    };
    m.insert("Port".into(), Value::from(port));
    match super::amqps(spec) {
        // The Secrets are mounted where these paths point; the connector reads the files again
        // when the kubelet swaps in a renewed certificate.
        Some(tls) => {
            m.insert("TlsPort".into(), Value::from(spec.listeners.amqps.port));
            m.insert(
                "TlsCertFile".into(),
                Value::from(format!("{TLS_DIR}/tls.crt")),
            );
            m.insert(
                "TlsKeyFile".into(),
                Value::from(format!("{TLS_DIR}/tls.key")),
            );
            if tls.client_ca.is_some() {
                m.insert("TlsMode".into(), Value::from("mtls"));
                m.insert(
                    "TlsClientCaFile".into(),
                    Value::from(format!("{CLIENT_CA_DIR}/ca.crt")),
                );
            }
        }
        None => {
            m.insert("TlsPort".into(), Value::from(0));
        }
    }
    // Without ANONYMOUS (jwt set, a CEL rule) clients authenticate; the key and the list are
    // mounted where these paths point.
    if let Some(jwt) = spec.sasl.as_ref().and_then(|s| s.jwt.as_ref()) {
        m.insert("Authentication".into(), Value::from(true));
        let signature = serde_yaml::to_value(jwt.signature_type)
            .map_err(|e| RenderError::Config(e.to_string()))?;
        m.insert("JwtSignatureType".into(), signature);
        m.insert(
            "JwtKeyFile".into(),
            Value::from(format!("{JWT_DIR}/{}", jwt.key)),
        );
        if let Some(policy) = spec.sasl.as_ref().and_then(|s| s.authorization.as_ref()) {
            m.insert(
                "AuthorizationPolicyFile".into(),
                Value::from(format!("{POLICY_DIR}/{}", policy.key)),
            );
        }
        if spec.sasl.as_ref().is_some_and(|s| s.authorize_every_client) {
            m.insert("AuthorizeEveryClient".into(), Value::from(true));
        }
    }
    // Probes need /livez and /readyz even when nobody scrapes /metrics.
    m.insert(
        "HttpAddress".into(),
        Value::from(format!("0.0.0.0:{}", super::http_port(spec))),
    );
    if let Some(a) = &spec.amqp {
        m.extend(tunables(a)?);
    }
    // Text is the connector's default: written only for json, so a spec saying `text` renders
    // (and hashes) like one saying nothing.
    if spec
        .logging
        .as_ref()
        .is_some_and(|l| l.format == Some(LogFormat::Json))
    {
        m.insert("LogFormat".into(), Value::from("json"));
    }
    let yaml = serde_yaml::to_string(&m).map_err(|e| RenderError::Config(e.to_string()))?;
    let text = format!(
        "# Rendered by the AmqpConnector operator; edit the AmqpConnector instead.\n{yaml}"
    );
    let hash = format!("sha256:{:x}", Sha256::digest(text.as_bytes()));
    Ok(ConnectorConfig { text, hash })
}

/// The tunables the spec sets, keyed as the connector reads them: each CRD field is named like
/// the connector's setting, in camelCase (`maxFrameSize` is `MaxFrameSize`), and its values
/// (numbers, pattern names) are the connector's.
fn tunables(a: &AmqpTunables) -> Result<BTreeMap<String, Value>, RenderError> {
    let fields = match serde_yaml::to_value(a) {
        Ok(Value::Mapping(m)) => m,
        Ok(other) => return Err(RenderError::Config(format!("tunables as {other:?}"))),
        Err(e) => return Err(RenderError::Config(e.to_string())),
    };
    let mut out = BTreeMap::new();
    for (k, v) in fields {
        let Some(name) = k.as_str() else {
            return Err(RenderError::Config(format!("tunable key {k:?}")));
        };
        let mut chars = name.chars();
        let key: String = chars
            .next()
            .map(|c| c.to_ascii_uppercase())
            .into_iter()
            .chain(chars)
            .collect();
        out.insert(key, v);
    }
    Ok(out)
}

/// Spec fields the connector cannot honour yet, by path.
fn unsupported(spec: &AmqpConnectorSpec) -> Result<(), RenderError> {
    let mut fields = Vec::new();
    if let Some(tls) = &spec.tls {
        if tls.client_auth == Some(ClientAuth::Optional) {
            fields.push("spec.tls.clientAuth: Optional");
        }
        if tls.min_version == Some(TlsVersion::V13) {
            fields.push("spec.tls.minVersion: \"1.3\"");
        }
    }
    if spec.broker.tls.is_some() {
        fields.push("spec.broker.tls");
    }
    if spec.broker.client_id_prefix.is_some() {
        fields.push("spec.broker.clientIdPrefix");
    }
    if fields.is_empty() {
        Ok(())
    } else {
        Err(RenderError::Unsupported(
            fields.into_iter().map(String::from).collect(),
        ))
    }
}

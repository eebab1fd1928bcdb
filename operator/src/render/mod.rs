//! The objects one `AmqpConnector` wants, as pure functions of it: a ConfigMap with the
//! connector's configuration, a Deployment, the clients' Service, a metrics Service with its
//! ServiceMonitor, and a PodDisruptionBudget. The controller applies what [`desired`] returns
//! with server-side apply and deletes its labelled children that are no longer in the list.

mod config;
mod deployment;
mod service;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use crate::crd::{AmqpConnector, AmqpConnectorSpec};

pub use config::{
    connector_config, ConnectorConfig, CLIENT_CA_DIR, CONFIG_DIR, CONFIG_FILE, JWT_DIR, POLICY_DIR,
    TLS_DIR,
};
pub use deployment::{deployment, CONFIG_HASH_ANNOTATION, PRE_STOP_SECONDS};
pub use service::{amqp_service, metrics_service, service_monitor};

/// The field manager of every server-side apply, and the `managed-by` label of every child.
pub const MANAGER: &str = "amqp-connector-operator";
/// `app.kubernetes.io/name` of every child.
pub const APP_NAME: &str = "amqp-connector";
/// The image used when the spec names none: the connector of the operator's own version.
pub const DEFAULT_IMAGE: &str = concat!(
    "ghcr.io/kubemq-io/kubemq-amqp-connector:",
    env!("CARGO_PKG_VERSION")
);

/// Why a spec cannot be rendered: a permanent condition the user must fix (Degraded, no retry).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The object has no uid yet (it did not come from the API server).
    #[error("the AmqpConnector has no uid, so its children cannot name it as owner")]
    NoOwner,
    /// Fields this connector version cannot honour yet.
    #[error("not supported by this connector version yet: {}", .0.join(", "))]
    Unsupported(Vec<String>),
    /// The connector's configuration file could not be written as YAML.
    #[error("cannot write the connector's configuration: {0}")]
    Config(String),
}

/// Everything one AmqpConnector wants, in apply order.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// `<name>-config`.
    pub config_map: ConfigMap,
    /// `<name>`.
    pub deployment: k8s_openapi::api::apps::v1::Deployment,
    /// `<name>`: the AMQP ports.
    pub service: Service,
    /// `<name>-metrics`, when metrics are on.
    pub metrics_service: Option<Service>,
    /// `<name>`, when replicas ≥ 2 and the budget is on.
    pub pdb: Option<PodDisruptionBudget>,
    /// `<name>`, when metrics and their ServiceMonitor are on.
    pub service_monitor: Option<crate::monitoring::ServiceMonitor>,
    /// The configuration hash (also on the pod template and in the status).
    pub config_hash: String,
}

/// Renders every child of `cr`.
pub fn desired(cr: &AmqpConnector) -> Result<Desired, RenderError> {
    let mut owner = cr.controller_owner_ref(&()).ok_or(RenderError::NoOwner)?;
    // Foreground deletion of the AmqpConnector waits for its children.
    owner.block_owner_deletion = Some(true);
    let cfg = connector_config(&cr.spec)?;
    let name = cr.name_any();
    let meta = |suffix: &str| ObjectMeta {
        name: Some(format!("{name}{suffix}")),
        namespace: cr.namespace(),
        labels: Some(labels(&name)),
        owner_references: Some(vec![owner.clone()]),
        ..ObjectMeta::default()
    };
    let config_map = ConfigMap {
        metadata: meta("-config"),
        data: Some(BTreeMap::from([(
            CONFIG_FILE.to_string(),
            cfg.text.clone(),
        )])),
        ..ConfigMap::default()
    };
    let wants_pdb = cr.spec.replicas >= 2
        && cr
            .spec
            .pod_disruption_budget
            .as_ref()
            .is_none_or(|p| p.enabled);
    let pdb = wants_pdb.then(|| PodDisruptionBudget {
        metadata: meta(""),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(
                cr.spec
                    .pod_disruption_budget
                    .as_ref()
                    .map_or(1, |p| p.max_unavailable),
            )),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(&name)),
                ..LabelSelector::default()
            }),
            // When KubeMQ is down every pod is unready; a node drain must not wait for it.
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    });
    Ok(Desired {
        deployment: deployment(&name, &cr.spec, meta(""), &cfg),
        service: amqp_service(&name, &cr.spec, meta("")),
        metrics_service: metrics_enabled(&cr.spec)
            .then(|| metrics_service(&name, &cr.spec, meta("-metrics"))),
        service_monitor: service_monitor(&name, &cr.spec, meta("")),
        config_map,
        pdb,
        config_hash: cfg.hash,
    })
}

/// The labels of every child of the AmqpConnector `name`.
pub fn labels(name: &str) -> BTreeMap<String, String> {
    let mut l = selector_labels(name);
    l.insert("app.kubernetes.io/component".into(), "connector".into());
    l.insert("app.kubernetes.io/part-of".into(), "kubemq".into());
    l.insert("app.kubernetes.io/managed-by".into(), MANAGER.into());
    l
}

/// The pods' selector: name and instance only (a selector is immutable; nothing that changes
/// with a release may be in it).
pub fn selector_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), APP_NAME.to_string()),
        ("app.kubernetes.io/instance".to_string(), name.to_string()),
    ])
}

/// The selector as the string `status.selector` carries (scale subresource).
pub fn selector_string(name: &str) -> String {
    selector_labels(name)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn metrics_enabled(spec: &AmqpConnectorSpec) -> bool {
    spec.metrics.as_ref().is_none_or(|m| m.enabled)
}

/// The TLS settings of the `amqps` listener, when it is on (the CRD makes it need them).
pub fn amqps(spec: &AmqpConnectorSpec) -> Option<&crate::crd::ServerTls> {
    spec.tls.as_ref().filter(|_| spec.listeners.amqps.enabled)
}

/// The port of `/metrics`, `/livez` and `/readyz`.
fn http_port(spec: &AmqpConnectorSpec) -> i32 {
    spec.metrics.as_ref().map_or(9090, |m| m.port)
}

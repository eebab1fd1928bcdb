//! The `AmqpConnector` custom resource (`amqp.kubemq.io/v1alpha1`): what a user asks for
//! (`spec`) and what the operator reports (`status`). `crds/amqpconnector.yaml` is generated from
//! these types by the `crdgen` binary; a test fails when the committed file drifts.
//!
//! Connector tunables are optional and unset by default: the connector owns its defaults
//! (CFG-*), so a new connector release can retune them without a CRD change. Each field's
//! description names the connector default. Cross-field rules are CEL rules the API server
//! enforces; they are kept to cheap expressions over bounded lists.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, ResourceRequirements, Toleration,
    TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use ops::logs::LogFormat;
pub use ops::vocabulary::{Pattern, SignatureType};

/// Environment variable names the operator sets itself; `spec.env` may not override them.
pub const RESERVED_ENV: [&str; 2] = ["POD_NAME", "POD_NAMESPACE"];
/// Prefix of the connector's own settings variables (CFG-15): those come from the
/// rendered configuration, never from `spec.env`.
pub const RESERVED_ENV_PREFIX: &str = "CONNECTORS_AMQP10_";

/// Desired state of one AMQP 1.0 connector deployment in front of a KubeMQ broker.
// Several printer columns share a `type_`: clippy reads those as repeated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "amqp.kubemq.io",
    version = "v1alpha1",
    kind = "AmqpConnector",
    namespaced,
    status = "AmqpConnectorStatus",
    derive = "PartialEq",
    shortname = "amqpc",
    category = "kubemq",
    doc = "An AMQP 1.0 connector for a KubeMQ broker: AMQP clients connect to its Service and use KubeMQ queues, events and RPC.",
    // Children are named `<name>`, `<name>-config` and `<name>-metrics`: DNS-1035 labels of at
    // most 63 characters.
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]{0,53}[a-z0-9])?$')").message("metadata.name must be a DNS-1035 label (lower case letters, digits and '-', starting with a letter) of at most 55 characters, so that <name>-metrics fits 63"),
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether every replica is ready and the spec is applied"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(
        name = "Available",
        type_ = "integer",
        json_path = ".status.readyReplicas"
    ),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".status.endpoints.amqp"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Broker",
        type_ = "string",
        json_path = ".spec.broker.address",
        priority = 1
    ),
    printcolumn(
        name = "Image",
        type_ = "string",
        json_path = ".status.image",
        priority = 1
    )
)]
#[x_kube(
    validation = Rule::new("self.listeners.amqp.enabled || self.listeners.amqps.enabled").message("at least one listener (amqp or amqps) must be enabled"),
    validation = Rule::new("!self.listeners.amqps.enabled || has(self.tls)").message("the amqps listener needs spec.tls"),
    validation = Rule::new("!self.listeners.amqp.enabled || !self.listeners.amqps.enabled || self.listeners.amqp.port != self.listeners.amqps.port").message("the amqp and amqps listeners need different ports"),
    validation = Rule::new("!has(self.sasl) || !('EXTERNAL' in self.sasl.mechanisms) || (has(self.tls) && has(self.tls.clientAuth) && self.tls.clientAuth == 'Required')").message("SASL EXTERNAL needs spec.tls.clientAuth: Required"),
    validation = Rule::new("!has(self.tls) || ((has(self.tls.clientAuth) && self.tls.clientAuth != 'None') == has(self.tls.clientCa))").message("spec.tls.clientCa and spec.tls.clientAuth Required (or Optional) go together: client certificates are verified against that CA"),
    validation = Rule::new("!has(self.service) || !has(self.service.nodePorts) || (has(self.service.type) && self.service.type in ['NodePort', 'LoadBalancer'])").message("service.nodePorts needs service.type NodePort or LoadBalancer"),
    validation = Rule::new("!has(self.env) || self.env.all(e, !(e.name in ['POD_NAME', 'POD_NAMESPACE']) && !e.name.startsWith('CONNECTORS_AMQP10_'))").message("spec.env may not set POD_NAME, POD_NAMESPACE or CONNECTORS_AMQP10_* (the operator renders those)"),
    validation = Rule::new("!has(self.env) || !has(self.logging) || !has(self.logging.level) || !self.env.exists(e, e.name == 'RUST_LOG')").message("set the log level either with spec.logging.level or with RUST_LOG in spec.env, not both"),
    validation = Rule::new("!has(self.service) || !has(self.service.externalTrafficPolicy) || (has(self.service.type) && self.service.type in ['NodePort', 'LoadBalancer'])").message("service.externalTrafficPolicy needs service.type NodePort or LoadBalancer"),
    validation = Rule::new("!has(self.service) || (!has(self.service.loadBalancerClass) && !has(self.service.loadBalancerSourceRanges)) || (has(self.service.type) && self.service.type == 'LoadBalancer')").message("service.loadBalancerClass and service.loadBalancerSourceRanges need service.type LoadBalancer"),
    validation = Rule::new("(!self.listeners.amqp.enabled || self.listeners.amqp.port != (has(self.metrics) ? self.metrics.port : 9090)) && (!self.listeners.amqps.enabled || self.listeners.amqps.port != (has(self.metrics) ? self.metrics.port : 9090))").message("the metrics port (spec.metrics.port, default 9090, also the probes' port) must differ from the listeners' ports")
)]
#[serde(rename_all = "camelCase")]
pub struct AmqpConnectorSpec {
    /// The KubeMQ broker the connector talks to over gRPC.
    pub broker: Broker,
    /// Connector pods. Default 1; 0 stops them. A PodDisruptionBudget is kept from 2 up.
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,
    /// Connector image; default: the image matching the operator's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub image: Option<String>,
    /// Pull policy of the connector image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Secrets for pulling the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// AMQP listeners: plain `amqp` (default on, 5672) and TLS `amqps` (default off, 5671).
    #[serde(default)]
    pub listeners: Listeners,
    /// Server TLS for the `amqps` listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTls>,
    /// SASL mechanisms offered to clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl: Option<Sasl>,
    /// AMQP tunables (CFG-4 … CFG-14); each one unset keeps the connector's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amqp: Option<AmqpTunables>,
    /// Compute resources of each connector container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resources_schema")]
    pub resources: Option<ResourceRequirements>,
    /// The Service AMQP clients connect to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceOptions>,
    /// The PodDisruptionBudget kept while replicas ≥ 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_disruption_budget: Option<DisruptionBudget>,
    /// Prometheus metrics of the connector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    /// Log level and format of the connector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logging: Option<Logging>,
    /// Seconds a stopping pod has to drain (close connections with `amqp:connection:forced`,
    /// return unsettled deliveries). Default 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub termination_grace_period_seconds: Option<i64>,
    /// Seconds a rollout may go without progress before the AmqpConnector is Degraded
    /// (`ProgressDeadlineExceeded`, the Deployment's own reason). Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub progress_deadline_seconds: Option<i32>,
    /// Node labels the pods must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Tolerations of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub tolerations: Option<Vec<Toleration>>,
    /// Affinity of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Topology spread of the pods; empty means a hostname spread (maxSkew 1, ScheduleAnyway)
    /// added by the operator at every replica count, so scaling never changes the pod template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    /// Priority class of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub priority_class_name: Option<String>,
    /// Extra annotations on the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_annotations: Option<BTreeMap<String, String>>,
    /// Extra labels on the pods (the selector labels cannot be overridden).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_labels: Option<BTreeMap<String, String>>,
    /// Service account of the pods; default: none, and no API token is mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub service_account_name: Option<String>,
    /// Extra environment variables of the connector container (each name once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "env_schema")]
    pub env: Option<Vec<EnvVar>>,
    /// Stop reconciling this object (its children are left as they are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

fn one() -> i32 {
    1
}

/// The KubeMQ broker.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Broker {
    /// KubeMQ gRPC address, `host:port` (e.g. `kubemq-cluster-grpc.kubemq:50000`).
    #[x_kube(validation = Rule::new("self.matches('^([A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?|\\\\[[0-9A-Fa-f:.]+\\\\]):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$')").message("must be host:port, the port from 1 to 65535"))]
    #[schemars(length(min = 3, max = 261))]
    pub address: String,
    /// TLS to the broker's gRPC port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<BrokerTls>,
    /// Secret key holding the JWT the connector presents to KubeMQ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_token_secret_ref: Option<SecretKey>,
    /// Prefix of the ClientIDs the connector uses on the broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub client_id_prefix: Option<String>,
}

/// TLS from the connector to the broker.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BrokerTls {
    /// Secret whose `ca.crt` verifies the broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub ca_secret_name: Option<String>,
    /// `kubernetes.io/tls` Secret for mutual TLS to the broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub client_cert_secret_name: Option<String>,
    /// Server name to verify instead of the address's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub server_name: Option<String>,
}

/// One key of one Secret.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct SecretKey {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key in the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Image pull policy.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullPolicy {
    /// Always pull.
    Always,
    /// Pull when missing.
    IfNotPresent,
    /// Never pull.
    Never,
}

/// The two listeners.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Listeners {
    /// Plain AMQP.
    #[serde(default)]
    pub amqp: AmqpListener,
    /// AMQP over TLS; needs `spec.tls`.
    #[serde(default)]
    pub amqps: AmqpsListener,
}

/// The plain AMQP listener; each field has its default, so `amqp: {port: 5673}` is enough.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct AmqpListener {
    /// Whether it listens (default true).
    #[serde(default = "on")]
    pub enabled: bool,
    /// Container and Service port (default 5672).
    #[serde(default = "amqp_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

impl Default for AmqpListener {
    fn default() -> Self {
        AmqpListener {
            enabled: on(),
            port: amqp_port(),
        }
    }
}

/// The AMQP-over-TLS listener; each field has its default, so `amqps: {enabled: true}` is
/// enough.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct AmqpsListener {
    /// Whether it listens (default false).
    #[serde(default)]
    pub enabled: bool,
    /// Container and Service port (default 5671).
    #[serde(default = "amqps_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

impl Default for AmqpsListener {
    fn default() -> Self {
        AmqpsListener {
            enabled: false,
            port: amqps_port(),
        }
    }
}

fn on() -> bool {
    true
}

fn amqp_port() -> i32 {
    5672
}

fn amqps_port() -> i32 {
    5671
}

/// Server TLS.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ServerTls {
    /// `kubernetes.io/tls` Secret with the server certificate and key (cert-manager friendly).
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// Secret whose `ca.crt` verifies client certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<SecretName>,
    /// Client certificates: None (default), Optional or Required (Required allows SASL EXTERNAL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<ClientAuth>,
    /// Lowest TLS version, "1.2" (default) or "1.3".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_version: Option<TlsVersion>,
}

/// A Secret by name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SecretName {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
}

/// Client certificate mode.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificates.
    None,
    /// Verified when presented.
    Optional,
    /// Every client must present one.
    Required,
}

/// TLS version.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsVersion {
    /// TLS 1.2.
    #[serde(rename = "1.2")]
    V12,
    /// TLS 1.3.
    #[serde(rename = "1.3")]
    V13,
}

/// SASL: which mechanisms clients may use, and with authentication on, how their KubeMQ JWTs
/// are verified and what KubeMQ's access control list lets them do.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("'PLAIN' in self.mechanisms").message("spec.sasl.mechanisms must include PLAIN (the connector always offers it)"),
    validation = Rule::new("('ANONYMOUS' in self.mechanisms) != has(self.jwt)").message("spec.sasl.jwt is needed exactly when ANONYMOUS is not offered: without ANONYMOUS clients must authenticate with a KubeMQ JWT"),
    validation = Rule::new("!has(self.authorization) || has(self.jwt)").message("spec.sasl.authorization needs spec.sasl.jwt (authorization applies to authenticated clients)"),
    validation = Rule::new("!has(self.jwt) || has(self.authorization) != (has(self.authorizeEveryClient) && self.authorizeEveryClient)").message("with spec.sasl.jwt, give exactly one of spec.sasl.authorization or authorizeEveryClient: true (KubeMQ v2.4.0 enforces no authorization of its own)"),
    validation = Rule::new("has(self.jwt) || !has(self.authorizeEveryClient) || !self.authorizeEveryClient").message("spec.sasl.authorizeEveryClient needs spec.sasl.jwt (authorization applies to authenticated clients)")
)]
pub struct Sasl {
    /// Mechanisms offered: PLAIN always; ANONYMOUS means authentication is off; EXTERNAL
    /// (the client certificate's CN) needs `tls.clientAuth: Required`.
    #[schemars(length(min = 1, max = 3))]
    pub mechanisms: Vec<SaslMechanism>,
    /// How PLAIN passwords, KubeMQ JWTs, are verified: the key and signature type of KubeMQ's
    /// `authentication.jwtConfig`. Required unless ANONYMOUS is offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt: Option<JwtVerification>,
    /// KubeMQ's access control list, deciding Read and Write per ClientID and channel. With
    /// `jwt`, this or `authorizeEveryClient: true` is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization: Option<Authorization>,
    /// With `jwt` and no `authorization`: every authenticated client may read and write every
    /// channel (KubeMQ v2.4.0 enforces no authorization of its own).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub authorize_every_client: bool,
}

/// The JWT verification key, from a Secret the operator mounts and never reads.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JwtVerification {
    /// Secret holding the key: the HMAC secret (bytes as they are) or a PEM public key.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// The key's entry in the Secret (default `key`).
    #[serde(default = "jwt_key")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
    /// KubeMQ's `jwtConfig.signatureType`.
    pub signature_type: SignatureType,
}

fn jwt_key() -> String {
    "key".into()
}

/// Where KubeMQ's access control list (JSON, or its base64) is: a ConfigMap or a Secret.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.configMapName) != has(self.secretName)").message("spec.sasl.authorization names either configMapName or secretName")
)]
pub struct Authorization {
    /// ConfigMap holding the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub config_map_name: Option<String>,
    /// Secret holding the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: Option<String>,
    /// The list's entry (default `policy.json`).
    #[serde(default = "policy_key")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

fn policy_key() -> String {
    "policy.json".into()
}

/// A SASL mechanism.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaslMechanism {
    /// User name and password (the password is the KubeMQ JWT).
    #[serde(rename = "PLAIN")]
    Plain,
    /// No credentials (only when the broker has authentication off).
    #[serde(rename = "ANONYMOUS")]
    Anonymous,
    /// The client certificate's CN (needs `tls.clientAuth: Required`).
    #[serde(rename = "EXTERNAL")]
    External,
}

/// The connector's AMQP settings (CFG-4 … CFG-14). Unset keeps the default in the
/// description.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AmqpTunables {
    /// Largest frame size negotiated (default 131072; at least 512).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 512, max = 4294967295_i64))]
    pub max_frame_size: Option<i64>,
    /// Largest message in bytes (default 104857600 = 100 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_message_size: Option<i64>,
    /// Sessions per connection (default 256; 1…65535).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub session_max: Option<i32>,
    /// Links per session (default 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_links_per_session: Option<i32>,
    /// Connections per pod, 0 = unlimited (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_connections: Option<i32>,
    /// Idle timeout in seconds, 0 = none (default 120).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub idle_timeout_seconds: Option<i32>,
    /// Pattern of addresses without a prefix (default queues).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_pattern: Option<Pattern>,
    /// Largest Get batch from KubeMQ (default 32; 1…1024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub get_batch_size: Option<i32>,
    /// Unsettled deliveries per link and produce credit window (default 1024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_unsettled_per_link: Option<i32>,
    /// RPC timeout without a ttl, in seconds (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub default_rpc_timeout_seconds: Option<i32>,
    /// Pending RPCs per connection (default 512).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub rpc_max_pending: Option<i32>,
}

/// The clients' Service.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ServiceOptions {
    /// Service type (default ClusterIP).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<ServiceType>,
    /// Extra annotations (e.g. for a cloud load balancer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Extra labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Fixed node ports (NodePort or LoadBalancer only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ports: Option<NodePorts>,
    /// Load balancer class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub load_balancer_class: Option<String>,
    /// Client CIDRs a load balancer admits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub load_balancer_source_ranges: Option<Vec<String>>,
    /// External traffic policy (Cluster or Local).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_traffic_policy: Option<TrafficPolicy>,
    /// Session affinity (None or ClientIP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<SessionAffinity>,
}

/// Service type.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceType {
    /// In-cluster only.
    ClusterIP,
    /// A port on every node.
    NodePort,
    /// A cloud load balancer.
    LoadBalancer,
}

/// External traffic policy.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrafficPolicy {
    /// Any node.
    Cluster,
    /// Only nodes with a pod.
    Local,
}

/// Session affinity.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionAffinity {
    /// None.
    None,
    /// By client IP.
    ClientIP,
}

/// Fixed node ports.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct NodePorts {
    /// For the amqp port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30000, max = 32767))]
    pub amqp: Option<i32>,
    /// For the amqps port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30000, max = 32767))]
    pub amqps: Option<i32>,
}

/// The PodDisruptionBudget.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionBudget {
    /// Keep one while replicas ≥ 2 (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Pods that may be down at once (default 1).
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub max_unavailable: i32,
}

fn yes() -> bool {
    true
}

/// Metrics.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(
    validation = Rule::new("self.enabled || !has(self.serviceMonitor) || !self.serviceMonitor.enabled").message("spec.metrics.serviceMonitor needs spec.metrics.enabled")
)]
#[serde(rename_all = "camelCase")]
pub struct Metrics {
    /// Serve `/metrics` and a `<name>-metrics` Service (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Port of `/metrics`, `/livez` and `/readyz` (default 9090).
    #[serde(default = "metrics_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// A Prometheus-operator ServiceMonitor `<name>` that scrapes `/metrics` and
    /// `/metrics/operations` of every pod, as the job `amqp-connector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_monitor: Option<ServiceMonitor>,
}

fn metrics_port() -> i32 {
    9090
}

/// ServiceMonitor options.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ServiceMonitor {
    /// Create one (needs an operator installed with `connectorServiceMonitors.enabled` and the
    /// monitoring.coreos.com/v1 CRD; until then the AmqpConnector is Degraded and retried).
    #[serde(default)]
    pub enabled: bool,
    /// Scrape interval, e.g. `30s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(ms|s|m|h)$')").message("a duration such as 30s"))]
    #[schemars(length(max = 16))]
    pub interval: Option<String>,
    /// Extra labels (for a Prometheus selector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

/// Logging.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Logging {
    /// Level (default info), passed to the connector as `RUST_LOG`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<LogLevel>,
    /// Format (default text), passed to the connector as `LogFormat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<LogFormat>,
}

/// Log level.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Errors.
    Error,
    /// Warnings.
    Warn,
    /// Information.
    Info,
    /// Debugging.
    Debug,
    /// Everything.
    Trace,
}

/// Observed state, written by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AmqpConnectorStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, Available, Progressing and Degraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Option<Vec<Condition>>,
    /// Pods of the Deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Ready pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Pods on the current template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,
    /// The pods' label selector (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The image the pods run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// In-cluster URLs of the listeners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Endpoints>,
    /// The clients' Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// Hash of the rendered connector configuration (also on the pod template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
}

/// Listener URLs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Endpoints {
    /// `amqp://<service>.<namespace>.svc:<port>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amqp: Option<String>,
    /// `amqps://<service>.<namespace>.svc:<port>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amqps: Option<String>,
}

/// At most 64 variables as a list-map keyed by `name`: the API server refuses a name given
/// twice, and server-side apply merges them per name (a CEL rule comparing every pair would
/// exceed the API server's cost budget).
fn env_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = g.subschema_for::<Option<Vec<EnvVar>>>();
    s.insert("maxItems".into(), 64.into());
    s.insert("x-kubernetes-list-type".into(), "map".into());
    s.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["name"]),
    );
    s
}

/// A Kubernetes quantity written as a string (`500m`, `2`, `1.5Gi`, `1e3`): the API server's own
/// grammar, so that a value it cannot parse is refused with its field named here rather than
/// when the Deployment is applied.
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// Resource requirements whose limits and requests must be quantities.
fn resources_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = g.subschema_for::<Option<ResourceRequirements>>();
    for map in ["limits", "requests"] {
        if let Some(values) = s
            .pointer_mut(&format!("/properties/{map}/additionalProperties"))
            .and_then(|v| v.as_object_mut())
        {
            values.insert("pattern".into(), QUANTITY_PATTERN.into());
            values.insert(
                "description".into(),
                "A quantity: a number with an optional suffix, such as 500m, 2 or 256Mi.".into(),
            );
        }
    }
    s
}

/// Conditions as a list-map keyed by `type`, so server-side apply merges them per type.
fn conditions_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = g.subschema_for::<Vec<Condition>>();
    s.insert("x-kubernetes-list-type".into(), "map".into());
    s.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    s
}

//! The connector Deployment: new pods come up before old ones go (long-lived AMQP connections),
//! probes on `/livez` and `/readyz`, Pod Security "restricted", no API token, the configuration
//! mounted read-only and its hash on the template so a change rolls the pods.

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, Lifecycle, LifecycleHandler, ObjectFieldSelector, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretKeySelector,
    SecretVolumeSource, SecurityContext, SleepAction, TopologySpreadConstraint, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    http_port, selector_labels, ConnectorConfig, CLIENT_CA_DIR, CONFIG_DIR, CONFIG_FILE,
    DEFAULT_IMAGE, JWT_DIR, POLICY_DIR, TLS_DIR,
};
use crate::crd::{AmqpConnectorSpec, Authorization, LogLevel, PullPolicy};

/// Pod template annotation carrying the configuration hash.
pub const CONFIG_HASH_ANNOTATION: &str = "amqp.kubemq.io/config-hash";
/// The user the connector runs as (the distroless "nonroot" user).
const RUN_AS: i64 = 65532;
/// How long a stopping pod keeps serving before SIGTERM: time for its endpoints to be removed
/// from the Services, so that no new client is sent to a connector that is closing.
pub const PRE_STOP_SECONDS: i64 = 5;

/// The Deployment `name` for `spec`, with `meta` as its metadata.
pub fn deployment(
    name: &str,
    spec: &AmqpConnectorSpec,
    meta: ObjectMeta,
    cfg: &ConnectorConfig,
) -> Deployment {
    let mut pod_labels = spec.pod_labels.clone().unwrap_or_default();
    pod_labels.extend(meta.labels.clone().unwrap_or_default());
    let mut annotations = spec.pod_annotations.clone().unwrap_or_default();
    annotations.insert(CONFIG_HASH_ANNOTATION.into(), cfg.hash.clone());
    Deployment {
        metadata: meta,
        spec: Some(DeploymentSpec {
            replicas: Some(spec.replicas),
            progress_deadline_seconds: spec.progress_deadline_seconds,
            selector: LabelSelector {
                match_labels: Some(selector_labels(name)),
                ..LabelSelector::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod(name, spec)),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

fn pod(name: &str, spec: &AmqpConnectorSpec) -> PodSpec {
    let spread = match &spec.topology_spread_constraints {
        Some(c) if !c.is_empty() => Some(c.clone()),
        // Whatever the replica count: a template that changed with it would replace every pod
        // when an autoscaler or `kubectl scale` crosses the threshold.
        _ => Some(vec![TopologySpreadConstraint {
            max_skew: 1,
            topology_key: "kubernetes.io/hostname".into(),
            when_unsatisfiable: "ScheduleAnyway".into(),
            label_selector: Some(LabelSelector {
                match_labels: Some(selector_labels(name)),
                ..LabelSelector::default()
            }),
            ..TopologySpreadConstraint::default()
        }]),
    };
    PodSpec {
        containers: vec![container(spec)],
        automount_service_account_token: Some(false),
        service_account_name: spec.service_account_name.clone(),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS),
            run_as_group: Some(RUN_AS),
            // The TLS Secrets' files (mode 0440) belong to this group.
            fs_group: Some(RUN_AS),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        termination_grace_period_seconds: Some(spec.termination_grace_period_seconds.unwrap_or(60)),
        image_pull_secrets: spec.image_pull_secrets.clone(),
        node_selector: spec.node_selector.clone(),
        tolerations: spec.tolerations.clone(),
        affinity: spec.affinity.clone(),
        topology_spread_constraints: spread,
        priority_class_name: spec.priority_class_name.clone(),
        volumes: Some(volumes(name, spec)),
        ..PodSpec::default()
    }
}

/// The configuration, with the `amqps` listener the TLS Secrets, and with SASL the JWT key
/// Secret and the access control list (mounted, never read by the operator; a missing one
/// keeps the pods from starting, which the Deployment reports).
fn volumes(name: &str, spec: &AmqpConnectorSpec) -> Vec<Volume> {
    let secret = |volume: &str, secret: &str| Volume {
        name: volume.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    };
    let mut v = vec![Volume {
        name: "config".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: format!("{name}-config"),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }];
    if let Some(tls) = super::amqps(spec) {
        v.push(secret("tls", &tls.secret_name));
        if let Some(ca) = &tls.client_ca {
            v.push(secret("client-ca", &ca.secret_name));
        }
    }
    if let Some(sasl) = &spec.sasl {
        if let Some(jwt) = &sasl.jwt {
            v.push(secret("jwt", &jwt.secret_name));
        }
        match &sasl.authorization {
            Some(Authorization {
                secret_name: Some(s),
                ..
            }) => v.push(secret("policy", s)),
            Some(Authorization {
                config_map_name: Some(c),
                ..
            }) => v.push(Volume {
                name: "policy".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: c.clone(),
                    ..ConfigMapVolumeSource::default()
                }),
                ..Volume::default()
            }),
            _ => {}
        }
    }
    v
}

/// Where [`volumes`] are mounted, all read-only.
fn volume_mounts(spec: &AmqpConnectorSpec) -> Vec<VolumeMount> {
    let mount = |name: &str, path: &str| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    };
    let mut m = vec![mount("config", CONFIG_DIR)];
    if let Some(tls) = super::amqps(spec) {
        m.push(mount("tls", TLS_DIR));
        if tls.client_ca.is_some() {
            m.push(mount("client-ca", CLIENT_CA_DIR));
        }
    }
    if let Some(sasl) = &spec.sasl {
        if sasl.jwt.is_some() {
            m.push(mount("jwt", JWT_DIR));
        }
        if sasl.authorization.is_some() {
            m.push(mount("policy", POLICY_DIR));
        }
    }
    m
}

/// How long the kubelet waits for a probe's answer: the endpoint answers from memory in
/// milliseconds even with hostile sockets on its port, so 2 s only absorbs a stalled node, and a
/// restart needs `failureThreshold` misses in a row.
const PROBE_TIMEOUT_SECONDS: i32 = 2;

fn container(spec: &AmqpConnectorSpec) -> Container {
    let http = http_port(spec);
    let mut ports = Vec::new();
    if spec.listeners.amqp.enabled {
        ports.push(port("amqp", spec.listeners.amqp.port));
    }
    if super::amqps(spec).is_some() {
        ports.push(port("amqps", spec.listeners.amqps.port));
    }
    ports.push(port("http", http));
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(PROBE_TIMEOUT_SECONDS),
        success_threshold: Some(1),
        failure_threshold: Some(failures),
        ..Probe::default()
    };
    Container {
        name: "connector".into(),
        image: Some(spec.image.clone().unwrap_or_else(|| DEFAULT_IMAGE.into())),
        image_pull_policy: spec.image_pull_policy.map(|p| {
            match p {
                PullPolicy::Always => "Always",
                PullPolicy::IfNotPresent => "IfNotPresent",
                PullPolicy::Never => "Never",
            }
            .into()
        }),
        args: Some(vec![
            "--config".into(),
            format!("{CONFIG_DIR}/{CONFIG_FILE}"),
        ]),
        env: Some(env(spec)),
        ports: Some(ports),
        resources: Some(spec.resources.clone().unwrap_or_else(default_resources)),
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                sleep: Some(SleepAction {
                    seconds: PRE_STOP_SECONDS,
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        }),
        startup_probe: Some(probe("/livez", 1, 30)),
        liveness_probe: Some(probe("/livez", 10, 3)),
        readiness_probe: Some(probe("/readyz", 5, 2)),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(volume_mounts(spec)),
        ..Container::default()
    }
}

/// Requests when the spec sets no resources: enough for the scheduler to count the pod (about
/// what an idle connector with a few connections holds), no limits.
fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(
            [
                ("cpu".to_string(), Quantity("100m".into())),
                ("memory".to_string(), Quantity("64Mi".into())),
            ]
            .into_iter()
            .collect(),
        ),
        ..ResourceRequirements::default()
    }
}

fn port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: port,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }
}

/// The pod's own name and namespace, the broker token from its Secret, the log level, then the
/// user's variables (which the CRD keeps off these names).
fn env(spec: &AmqpConnectorSpec) -> Vec<EnvVar> {
    let field = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    let mut env = vec![
        field("POD_NAME", "metadata.name"),
        field("POD_NAMESPACE", "metadata.namespace"),
    ];
    if let Some(t) = &spec.broker.auth_token_secret_ref {
        env.push(EnvVar {
            name: "CONNECTORS_AMQP10_KUBEMQ_TOKEN".into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: t.name.clone(),
                    key: t.key.clone(),
                    optional: Some(false),
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        });
    }
    if let Some(level) = spec.logging.as_ref().and_then(|l| l.level) {
        let level = match level {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        };
        env.push(EnvVar {
            name: "RUST_LOG".into(),
            value: Some(level.into()),
            ..EnvVar::default()
        });
    }
    env.extend(spec.env.clone().unwrap_or_default());
    env
}

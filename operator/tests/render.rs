//! The objects an AmqpConnector renders, as pure functions: golden files per example
//! (`UPDATE_GOLDEN=1` rewrites them), each validated with `kubernetes-validate --strict` for
//! Kubernetes 1.30 and 1.37, and the properties every rendering must keep. The connector's own
//! parser reads the rendered configuration (and connector/tests/operator_config.rs feeds the
//! golden ConfigMaps to the connector binary).
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod cases;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use kubemq_amqp_operator::crd::AmqpConnector;
use kubemq_amqp_operator::monitoring::{Endpoint, Relabeling};
use kubemq_amqp_operator::render::{
    desired, selector_labels, Desired, RenderError, CONFIG_FILE, CONFIG_HASH_ANNOTATION,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// An example as the API server would hand it over: with a uid and a namespace.
fn fixture(example: &str) -> AmqpConnector {
    let mut cr: AmqpConnector =
        serde_json::from_value(cases::example(example)).expect("example parses");
    cr.metadata.uid = Some("6f1c2b7e-0000-4000-8000-000000000001".into());
    if cr.metadata.namespace.is_none() {
        cr.metadata.namespace = Some("default".into());
    }
    cr
}

fn documents(d: &Desired) -> String {
    let mut docs = vec![
        yaml_doc("v1", "ConfigMap", &d.config_map),
        yaml_doc("apps/v1", "Deployment", &d.deployment),
        yaml_doc("v1", "Service", &d.service),
    ];
    if let Some(s) = &d.metrics_service {
        docs.push(yaml_doc("v1", "Service", s));
    }
    if let Some(p) = &d.pdb {
        docs.push(yaml_doc("policy/v1", "PodDisruptionBudget", p));
    }
    docs.join("---\n")
}

/// k8s-openapi objects serialize without apiVersion/kind; server-side apply bodies carry them.
fn yaml_doc<T: serde::Serialize>(api_version: &str, kind: &str, obj: &T) -> String {
    let mut v = serde_json::to_value(obj).expect("to JSON");
    v["apiVersion"] = api_version.into();
    v["kind"] = kind.into();
    serde_yaml::to_string(&v).expect("to YAML")
}

fn golden(name: &str) -> PathBuf {
    root()
        .join("operator/tests/golden")
        .join(format!("{name}.yaml"))
}

/// The examples whose renderings are committed under `operator/tests/golden/`.
const GOLDEN: [(&str, &str); 2] = [
    ("amqpconnector.yaml", "orders"),
    ("minimal.yaml", "minimal"),
];

#[test]
fn golden_renderings_are_current() {
    for (example, name) in GOLDEN {
        let rendered = documents(&desired(&fixture(example)).expect("renders"));
        let path = golden(name);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
            std::fs::write(&path, &rendered).expect("write golden");
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == rendered,
            "{} is stale: run UPDATE_GOLDEN=1 cargo test -p kubemq-amqp-operator --test render",
            path.display()
        );
    }
}

#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs kubernetes-validate (Python): tests/run.sh"
)]
fn golden_renderings_pass_kubernetes_schemas() {
    for (_, name) in GOLDEN {
        let path = golden(name);
        for version in ["1.30.0", "1.37.0"] {
            let out = Command::new("kubernetes-validate")
                .args(["--strict", "-k", version])
                .arg(&path)
                .output()
                .expect("kubernetes-validate (tests/run.sh installs it)");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                out.status.success() && !text.contains("ERROR") && !text.contains("FAIL"),
                "{name} against {version}: {text}"
            );
        }
    }
}

#[test]
fn every_child_is_owned_and_labelled() {
    let cr = fixture("amqpconnector.yaml");
    let d = desired(&cr).expect("renders");
    let metas = [
        &d.config_map.metadata,
        &d.deployment.metadata,
        &d.service.metadata,
        &d.metrics_service.as_ref().expect("metrics on").metadata,
        &d.pdb.as_ref().expect("2 replicas").metadata,
    ];
    for m in metas {
        let owners = m.owner_references.as_ref().expect("owner");
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].uid, "6f1c2b7e-0000-4000-8000-000000000001");
        assert_eq!(owners[0].controller, Some(true));
        let labels = m.labels.as_ref().expect("labels");
        assert_eq!(
            labels
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("amqp-connector-operator")
        );
        for (k, v) in selector_labels("orders") {
            assert_eq!(labels.get(&k), Some(&v), "{k}");
        }
        assert_eq!(m.namespace.as_deref(), Some("apps"));
    }
}

#[test]
fn no_uid_no_children() {
    let mut cr = fixture("minimal.yaml");
    cr.metadata.uid = None;
    assert_eq!(desired(&cr), Err(RenderError::NoOwner));
}

/// The pod spec of the Deployment's template.
fn pod_spec(d: &Desired) -> &k8s_openapi::api::core::v1::PodSpec {
    d.deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec")
}

/// The pod's volume `name`.
fn volume<'a>(
    pod: &'a k8s_openapi::api::core::v1::PodSpec,
    name: &str,
) -> &'a k8s_openapi::api::core::v1::Volume {
    pod.volumes
        .as_ref()
        .and_then(|vs| vs.iter().find(|v| v.name == name))
        .unwrap_or_else(|| panic!("no volume {name}"))
}

/// Asserts that volume `name` is Secret `secret`, its files readable by owner and group only.
fn assert_secret_volume(pod: &k8s_openapi::api::core::v1::PodSpec, name: &str, secret: &str) {
    let s = volume(pod, name).secret.as_ref().expect("a Secret volume");
    assert_eq!(s.secret_name.as_deref(), Some(secret));
    assert_eq!(s.default_mode, Some(0o440));
}

/// Asserts that the connector container mounts each (volume, path) read-only.
fn assert_mounted_read_only(pod: &k8s_openapi::api::core::v1::PodSpec, expected: &[(&str, &str)]) {
    let mounts = pod.containers[0].volume_mounts.as_ref().expect("mounts");
    for (volume, path) in expected {
        let m = mounts.iter().find(|m| m.name == *volume).expect(volume);
        assert_eq!((m.mount_path.as_str(), m.read_only), (*path, Some(true)));
    }
}

fn pod_meta(d: &Desired) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    d.deployment
        .spec
        .as_ref()
        .expect("spec")
        .template
        .metadata
        .as_ref()
        .expect("pod template metadata")
}

#[test]
fn selector_never_changes_with_the_spec() {
    let a = desired(&fixture("amqpconnector.yaml")).expect("renders");
    let mut changed = fixture("amqpconnector.yaml");
    changed.spec.replicas = 5;
    changed.spec.image = Some("example.org/connector:other".into());
    changed.spec.pod_labels =
        Some([("app.kubernetes.io/name".to_string(), "x".to_string())].into());
    let b = desired(&changed).expect("renders");
    let sel = |d: &Desired| d.deployment.spec.as_ref().expect("spec").selector.clone();
    assert_eq!(sel(&a), sel(&b));
    let pod_labels = pod_meta(&b).labels.clone().expect("labels");
    assert_eq!(
        pod_labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("amqp-connector"),
        "the selector labels win over spec.podLabels"
    );
}

#[test]
fn config_hash_follows_the_configuration_only() {
    let base = desired(&fixture("amqpconnector.yaml")).expect("renders");
    let again = desired(&fixture("amqpconnector.yaml")).expect("renders");
    assert_eq!(base.config_hash, again.config_hash, "deterministic");
    let mut scaled = fixture("amqpconnector.yaml");
    scaled.spec.replicas = 3;
    assert_eq!(
        desired(&scaled).expect("renders").config_hash,
        base.config_hash
    );
    let mut tuned = fixture("amqpconnector.yaml");
    tuned.spec.amqp.get_or_insert_default().get_batch_size = Some(64);
    let tuned = desired(&tuned).expect("renders");
    assert_ne!(tuned.config_hash, base.config_hash);
    let annotation = |d: &Desired| {
        pod_meta(d).annotations.as_ref().expect("annotations")[CONFIG_HASH_ANNOTATION].clone()
    };
    assert_eq!(
        annotation(&tuned),
        tuned.config_hash,
        "a tunable change rolls the pods"
    );
    assert_ne!(annotation(&tuned), annotation(&base));
}

#[test]
fn pdb_only_from_two_replicas() {
    for (replicas, wanted) in [(0, false), (1, false), (2, true), (3, true)] {
        let mut cr = fixture("amqpconnector.yaml");
        cr.spec.replicas = replicas;
        assert_eq!(
            desired(&cr).expect("renders").pdb.is_some(),
            wanted,
            "{replicas}"
        );
    }
    let mut off = fixture("amqpconnector.yaml");
    off.spec
        .pod_disruption_budget
        .as_mut()
        .expect("set")
        .enabled = false;
    assert!(desired(&off).expect("renders").pdb.is_none());
}

#[test]
fn pods_are_restricted_and_tokenless() {
    let d = desired(&fixture("amqpconnector.yaml")).expect("renders");
    let pod = d.deployment.spec.expect("spec").template.spec.expect("pod");
    assert_eq!(pod.automount_service_account_token, Some(false));
    let psc = pod.security_context.expect("pod security context");
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.expect("seccomp").type_,
        "RuntimeDefault"
    );
    let c = &pod.containers[0];
    let sc = c
        .security_context
        .as_ref()
        .expect("container security context");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(
        sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_string()])
    );
    let token = c
        .env
        .as_ref()
        .expect("env")
        .iter()
        .find(|e| e.name == "CONNECTORS_AMQP10_KUBEMQ_TOKEN")
        .expect("token from its Secret");
    let key = token
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .expect("secretKeyRef");
    assert_eq!(
        (key.name.as_str(), key.key.as_str()),
        ("kubemq-token", "token")
    );
    assert!(token.value.is_none(), "the operator never reads the Secret");
}

/// The example with the amqps listener on, its certificate in Secret `orders-tls`, client
/// certificates as `client_auth` says (verified by Secret `clients-ca`) and TLS from
/// `min_version`.
fn with_amqps(
    client_auth: Option<kubemq_amqp_operator::crd::ClientAuth>,
    min_version: Option<kubemq_amqp_operator::crd::TlsVersion>,
) -> AmqpConnector {
    use kubemq_amqp_operator::crd::{SecretName, ServerTls};
    let mut cr = fixture("amqpconnector.yaml");
    cr.spec.listeners.amqps.enabled = true;
    cr.spec.tls = Some(ServerTls {
        secret_name: "orders-tls".into(),
        client_ca: client_auth.map(|_| SecretName {
            secret_name: "clients-ca".into(),
        }),
        client_auth,
        min_version,
    });
    cr
}

/// SASL-3, AUTHZ-1: `spec.sasl` with a JWT key and an access control list turns the connector's
/// authentication on: the key Secret and the list's ConfigMap (or Secret) are mounted read-only
/// and the rendered file points at them; with ANONYMOUS offered nothing of it is rendered.
#[test]
fn sasl_3_spec_sasl_mounts_the_key_and_the_policy() {
    let mut cr = with_amqps(Some(kubemq_amqp_operator::crd::ClientAuth::Required), None);
    cr.spec.sasl = Some(
        serde_json::from_value(serde_json::json!({
            "mechanisms": ["EXTERNAL", "PLAIN"],
            "jwt": {"secretName": "orders-jwt", "signatureType": "RS256"},
            "authorization": {"configMapName": "orders-acl"}
        }))
        .expect("sasl"),
    );
    let d = desired(&cr).expect("renders");
    let s = connector_settings(&d);
    assert!(s.authentication);
    assert_eq!(
        s.jwt_signature_type,
        Some(connector::auth::jwt::SignatureType::RS256)
    );
    assert_eq!(
        s.jwt_key_file.as_deref().and_then(|p| p.to_str()),
        Some("/etc/kubemq-amqp/jwt/key")
    );
    assert_eq!(
        s.authorization_policy_file
            .as_deref()
            .and_then(|p| p.to_str()),
        Some("/etc/kubemq-amqp/policy/policy.json")
    );
    let pod = pod_spec(&d);
    assert_secret_volume(pod, "jwt", "orders-jwt");
    assert_eq!(
        volume(pod, "policy")
            .config_map
            .as_ref()
            .map(|c| c.name.as_str()),
        Some("orders-acl")
    );
    assert_mounted_read_only(
        pod,
        &[
            ("jwt", "/etc/kubemq-amqp/jwt"),
            ("policy", "/etc/kubemq-amqp/policy"),
        ],
    );

    // The list from a Secret, under another key.
    cr.spec.sasl.as_mut().expect("sasl").authorization = Some(
        serde_json::from_value(serde_json::json!({"secretName": "orders-acl", "key": "acl.json"}))
            .expect("authorization"),
    );
    let d = desired(&cr).expect("renders");
    assert_eq!(
        connector_settings(&d)
            .authorization_policy_file
            .as_deref()
            .and_then(|p| p.to_str()),
        Some("/etc/kubemq-amqp/policy/acl.json")
    );
    assert_secret_volume(pod_spec(&d), "policy", "orders-acl");

    // AUTHZ-8: no list, every authenticated client everywhere, said explicitly.
    let sasl = cr.spec.sasl.as_mut().expect("sasl");
    sasl.authorization = None;
    sasl.authorize_every_client = true;
    let d = desired(&cr).expect("renders");
    let s = connector_settings(&d);
    assert!(s.authorize_every_client);
    assert_eq!(s.authorization_policy_file, None);
    assert!(!pod_spec(&d)
        .volumes
        .as_ref()
        .expect("volumes")
        .iter()
        .any(|v| v.name == "policy"));

    // ANONYMOUS offered: authentication stays off, nothing is mounted for it.
    cr.spec.sasl = Some(
        serde_json::from_value(serde_json::json!({"mechanisms": ["PLAIN", "ANONYMOUS"]}))
            .expect("sasl"),
    );
    let d = desired(&cr).expect("renders");
    assert!(!connector_settings(&d).authentication);
    let pod = pod_spec(&d);
    assert!(!pod
        .volumes
        .as_ref()
        .expect("volumes")
        .iter()
        .any(|v| v.name == "jwt" || v.name == "policy"));
}

/// The HTTP port the operator runs a connector on by default is the connector's own default, the
/// one its image declares.
#[test]
fn the_default_http_port_is_the_connectors() {
    let d = desired(&fixture("minimal.yaml")).expect("renders");
    let rendered = connector_settings(&d).http_address.expect("served");
    let default = connector::config::Settings::default()
        .http_address
        .expect("served by default");
    assert_eq!(rendered.port(), default.port());
}

/// The connector's settings from the rendered file, read by the connector's own parser.
fn connector_settings(d: &Desired) -> connector::config::Settings {
    use connector::config::{read_yaml, Settings};
    let text = &d.config_map.data.as_ref().expect("data")[CONFIG_FILE];
    Settings::resolve(&[read_yaml(text).expect("the connector reads it")]).expect("valid")
}

#[test]
fn unsupported_fields_are_refused_by_name() {
    use kubemq_amqp_operator::crd::{ClientAuth, TlsVersion};
    let cr = with_amqps(Some(ClientAuth::Optional), Some(TlsVersion::V13));
    match desired(&cr) {
        Err(RenderError::Unsupported(f)) => {
            assert_eq!(
                f,
                [
                    "spec.tls.clientAuth: Optional",
                    "spec.tls.minVersion: \"1.3\""
                ]
            )
        }
        other => panic!("{other:?}"),
    }
}

/// The ServiceMonitor: none unless asked for; when asked, one `<name>` owned like every child,
/// selecting this connector's Services, scraping `/metrics` and `/metrics/operations` on the
/// metrics port at the spec's interval, the job named by `app.kubernetes.io/name` (so
/// `amqp-connector`, the chart's alerts' default selector), with the spec's extra labels.
#[test]
fn the_service_monitor_scrapes_both_metrics_paths_as_one_job() {
    let plain = fixture("amqpconnector.yaml");
    assert!(desired(&plain).expect("renders").service_monitor.is_none());

    let mut monitored = plain.clone();
    monitored
        .spec
        .metrics
        .as_mut()
        .expect("metrics")
        .service_monitor = Some(kubemq_amqp_operator::crd::ServiceMonitor {
        enabled: true,
        interval: Some("15s".into()),
        labels: Some(BTreeMap::from([("release".into(), "kps".into())])),
    });
    let d = desired(&monitored).expect("renders");
    let sm = d.service_monitor.expect("a ServiceMonitor");
    let metrics = d.metrics_service.expect("the metrics Service");
    assert_eq!(sm.metadata.name.as_deref(), Some("orders"));
    assert_eq!(sm.metadata.namespace, metrics.metadata.namespace);
    assert_eq!(
        sm.metadata.owner_references,
        metrics.metadata.owner_references
    );
    let labels = sm.metadata.labels.expect("labels");
    assert_eq!(labels.get("release").map(String::as_str), Some("kps"));
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("amqp-connector-operator")
    );
    let service_labels = metrics.metadata.labels.expect("labels");
    let selected = sm.spec.selector.match_labels.expect("match labels");
    assert!(
        selected
            .iter()
            .all(|(k, v)| service_labels.get(k) == Some(v)),
        "{selected:?} selects {service_labels:?}"
    );
    assert_eq!(sm.spec.job_label, "app.kubernetes.io/name");
    assert_eq!(
        service_labels.get(&sm.spec.job_label).map(String::as_str),
        Some("amqp-connector")
    );
    let port = metrics
        .spec
        .and_then(|s| s.ports)
        .and_then(|p| p.into_iter().next())
        .and_then(|p| p.name)
        .expect("a named port");
    // Each page's targets get a label of their own, or their `up` would be one series.
    let endpoint = |path: &str, page: &str| Endpoint {
        port: port.clone(),
        path: path.into(),
        interval: Some("15s".into()),
        relabelings: vec![Relabeling {
            action: "replace".into(),
            target_label: "endpoint".into(),
            replacement: page.into(),
        }],
    };
    assert_eq!(
        sm.spec.endpoints,
        [
            endpoint("/metrics", "metrics"),
            endpoint("/metrics/operations", "operations")
        ]
    );

    // Off, or metrics off (the CRD refuses that pairing; rendering alone makes none either).
    let mut metrics_off = monitored.clone();
    metrics_off.spec.metrics.as_mut().expect("metrics").enabled = false;
    assert!(desired(&metrics_off)
        .expect("renders")
        .service_monitor
        .is_none());
    let mut off = monitored;
    if let Some(m) = off
        .spec
        .metrics
        .as_mut()
        .and_then(|m| m.service_monitor.as_mut())
    {
        m.enabled = false;
    }
    assert!(desired(&off).expect("renders").service_monitor.is_none());
}

/// TLS-1, TLS-3, TLS-4: the amqps listener mounts the TLS Secrets read-only (their files
/// readable by the pod's group only), opens the amqps port on the pod and the Service, and the
/// connector reads its TLS settings from the rendered file: mtls with the client CA when
/// `clientAuth: Required`, tls without.
#[test]
fn the_amqps_listener_mounts_the_secrets_and_configures_the_connector() {
    use connector::config::TlsMode;
    use kubemq_amqp_operator::crd::ClientAuth;
    let mut cr = with_amqps(Some(ClientAuth::Required), None);
    let d = desired(&cr).expect("renders");
    let s = connector_settings(&d);
    let files = s.tls_files().expect("TLS is on");
    assert_eq!(s.tls_port, 5671);
    assert_eq!(s.tls_mode, TlsMode::Mtls);
    assert_eq!(files.cert.to_str(), Some("/etc/kubemq-amqp/tls/tls.crt"));
    assert_eq!(files.key.to_str(), Some("/etc/kubemq-amqp/tls/tls.key"));
    assert_eq!(
        files.client_ca.as_deref().and_then(|p| p.to_str()),
        Some("/etc/kubemq-amqp/client-ca/ca.crt")
    );
    let pod = pod_spec(&d);
    assert_secret_volume(pod, "tls", "orders-tls");
    assert_secret_volume(pod, "client-ca", "clients-ca");
    assert_eq!(
        pod.security_context.as_ref().and_then(|c| c.fs_group),
        Some(65532)
    );
    assert_mounted_read_only(
        pod,
        &[
            ("tls", "/etc/kubemq-amqp/tls"),
            ("client-ca", "/etc/kubemq-amqp/client-ca"),
        ],
    );
    let c = &pod.containers[0];
    let ports = c.ports.as_ref().expect("ports");
    assert!(ports
        .iter()
        .any(|p| p.name.as_deref() == Some("amqps") && p.container_port == 5671));
    let service_ports = d
        .service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .expect("ports");
    let amqps = service_ports
        .iter()
        .find(|p| p.name.as_deref() == Some("amqps"))
        .expect("the Service's amqps port");
    assert_eq!(
        (amqps.port, amqps.app_protocol.as_deref()),
        (5671, Some("amqps"))
    );

    // Plain tls: no client CA anywhere.
    let tls = cr.spec.tls.as_mut().expect("tls");
    tls.client_auth = None;
    tls.client_ca = None;
    let d = desired(&cr).expect("renders");
    let s = connector_settings(&d);
    assert_eq!(s.tls_mode, TlsMode::Tls);
    assert_eq!(s.tls_files().expect("TLS is on").client_ca, None);
    let pod = pod_spec(&d);
    assert!(!pod
        .volumes
        .as_ref()
        .expect("volumes")
        .iter()
        .any(|v| v.name == "client-ca"));

    // The listener off: nothing of TLS is rendered, even with spec.tls.
    cr.spec.listeners.amqps.enabled = false;
    assert_eq!(
        connector_settings(&desired(&cr).expect("renders")).tls_files(),
        None
    );
}

/// The rendered file, read by the connector's own parser, gives exactly the spec's settings and
/// the connector's defaults for the rest.
#[test]
fn the_connector_reads_the_rendered_configuration() {
    use connector::config::{read_yaml, Settings};
    let d = desired(&fixture("amqpconnector.yaml")).expect("renders");
    let text = &d.config_map.data.as_ref().expect("data")[CONFIG_FILE];
    let s = Settings::resolve(&[read_yaml(text).expect("the connector reads it")]).expect("valid");
    let defaults = Settings::default();
    assert_eq!(
        s.kubemq_address.as_deref(),
        Some("kubemq-cluster-grpc.kubemq:50000")
    );
    assert_eq!((s.port, s.tls_port), (5672, 0));
    assert_eq!(s.max_unsettled_per_link, 2048);
    assert_eq!(s.idle_timeout_seconds, 60);
    assert_eq!(
        s.get_batch_size, defaults.get_batch_size,
        "unset keeps the default"
    );
    assert_eq!(s.http_address, Some("0.0.0.0:9090".parse().expect("addr")));
    assert_eq!(
        s.log_format, defaults.log_format,
        "no logging.format: the default"
    );
}

/// `spec.logging.format: json` reaches the connector as `LogFormat: json`.
#[test]
fn json_logging_is_rendered_for_the_connector() {
    use connector::config::{read_yaml, LogFormat, Settings};
    let mut cr = fixture("amqpconnector.yaml");
    cr.spec.logging = Some(kubemq_amqp_operator::crd::Logging {
        format: Some(kubemq_amqp_operator::crd::LogFormat::Json),
        ..Default::default()
    });
    let d = desired(&cr).expect("renders");
    let text = &d.config_map.data.as_ref().expect("data")[CONFIG_FILE];
    let s = Settings::resolve(&[read_yaml(text).expect("the connector reads it")]).expect("valid");
    assert_eq!(s.log_format, LogFormat::Json);
}

/// Every tunable of `spec.amqp` reaches the connector as the setting of the same name: set to
/// a value other than the default, each is read back by the connector's parser.
#[test]
fn every_tunable_reaches_the_connector() {
    use connector::config::{read_yaml, Settings, SETTINGS};
    use kubemq_amqp_operator::crd::{AmqpTunables, Pattern};
    let mut cr = fixture("amqpconnector.yaml");
    let tunables = AmqpTunables {
        max_frame_size: Some(4096),
        max_message_size: Some(1000),
        session_max: Some(8),
        max_links_per_session: Some(9),
        max_connections: Some(0),
        idle_timeout_seconds: Some(0),
        default_pattern: Some(Pattern::EventsStore),
        get_batch_size: Some(1024),
        max_unsettled_per_link: Some(7),
        default_rpc_timeout_seconds: Some(5),
        rpc_max_pending: Some(3),
    };
    cr.spec.amqp = Some(tunables.clone());
    let d = desired(&cr).expect("renders");
    let text = &d.config_map.data.as_ref().expect("data")[CONFIG_FILE];
    let raw = read_yaml(text).expect("the connector reads it");
    let keys: Vec<&str> = SETTINGS.iter().map(|s| s.key).collect();
    assert!(raw.keys().all(|k| keys.contains(&k.as_str())), "{raw:?}");
    let s = Settings::resolve(&[raw]).expect("valid");
    // What the connector now holds, by setting name, as --print-config shows it.
    let printed = serde_json::to_value(&s).expect("settings as JSON");
    let set = serde_json::to_value(&tunables).expect("tunables as JSON");
    let set = set.as_object().expect("an object");
    assert_eq!(set.len(), 11, "every tunable is set: {set:?}");
    for (field, value) in set {
        let mut key = field.clone();
        key[..1].make_ascii_uppercase();
        assert_eq!(&printed[&key], value, "{field} → {key}");
    }
    let defaults = serde_json::to_value(Settings::default()).expect("defaults as JSON");
    for field in set.keys() {
        let mut key = field.clone();
        key[..1].make_ascii_uppercase();
        assert_ne!(
            printed[&key], defaults[&key],
            "{key} is left at its default: not tested"
        );
    }
}

/// A stopping pod keeps serving for a few seconds before SIGTERM, so its endpoints leave the
/// Services first (within a grace period that also covers the connector's own shutdown); pods
/// request resources even when the spec sets none; a node drain is not blocked by unready pods;
/// the AmqpConnector's foreground deletion waits for its children.
#[test]
fn pods_stop_gracefully_request_resources_and_drains_pass_unready_pods() {
    use kubemq_amqp_operator::render::PRE_STOP_SECONDS;
    let d = desired(&fixture("minimal.yaml")).expect("renders");
    let pod = d.deployment.spec.expect("spec").template.spec.expect("pod");
    let c = &pod.containers[0];
    let sleep = c
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .and_then(|p| p.sleep.as_ref())
        .expect("a preStop sleep");
    assert_eq!(sleep.seconds, PRE_STOP_SECONDS);
    assert!(pod.termination_grace_period_seconds.expect("grace") >= PRE_STOP_SECONDS + 10);
    let requests = c
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .expect("default requests");
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"));
    let mut two = fixture("minimal.yaml");
    two.spec.replicas = 2;
    let d = desired(&two).expect("renders");
    let pdb = d.pdb.expect("a PDB from two replicas").spec.expect("spec");
    assert_eq!(
        pdb.unhealthy_pod_eviction_policy.as_deref(),
        Some("AlwaysAllow")
    );
    for owner in d.deployment.metadata.owner_references.expect("owned") {
        assert_eq!(owner.block_owner_deletion, Some(true));
    }
}

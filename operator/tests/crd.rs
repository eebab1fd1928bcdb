//! The AmqpConnector CRD: the committed file is what the types generate, it is small
//! enough for client-side apply, valid for Kubernetes 1.30 and the newest schema
//! `kubernetes-validate` ships, the examples pass its schema strictly and bad fixtures do not, and
//! every CEL rule has one passing and one failing case (evaluated client-side: no API server runs
//! on these machines, so the server's own CEL cost checks are not tested here).
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};
use std::process::Command;

use kube::core::cel::validate_cel;
use kubemq_amqp_operator::crd::AmqpConnector;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn committed_crd() -> String {
    std::fs::read_to_string(root().join("crds/amqpconnector.yaml"))
        .expect("crds/amqpconnector.yaml")
}

#[test]
fn committed_crd_is_what_the_types_generate() {
    let generated = kubemq_amqp_operator::crd_yaml().expect("CRD serializes");
    assert!(
        committed_crd() == generated,
        "crds/amqpconnector.yaml is stale: run `cargo run -p kubemq-amqp-operator --bin crdgen > crds/amqpconnector.yaml`"
    );
}

#[test]
fn chart_carries_the_same_crd() {
    let copy = std::fs::read_to_string(
        root().join("helm/amqp-connector-operator/crds/amqpconnector.yaml"),
    )
    .expect("the chart's crds/ copy");
    assert!(
        copy == committed_crd(),
        "helm/amqp-connector-operator/crds/amqpconnector.yaml differs from crds/amqpconnector.yaml: copy it"
    );
}

#[test]
fn crd_is_under_200_kb() {
    let size = committed_crd().len();
    assert!(size < 200 * 1024, "{size} bytes");
}

fn run(program: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(program)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (tests/run.sh installs it)"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn crd_passes_kubernetes_schemas_strictly() {
    for version in ["1.30.0", "1.37.0"] {
        let (ok, out) = run(
            "kubernetes-validate",
            &["--strict", "-k", version, "crds/amqpconnector.yaml"],
        );
        assert!(ok && out.contains("passed"), "{version}: {out}");
    }
}

fn validate_cr(files: &[&str]) -> (bool, String) {
    let mut args = vec!["tests/python/validate_cr.py", "crds/amqpconnector.yaml"];
    args.extend_from_slice(files);
    run("python3", &args)
}

#[test]
fn examples_pass_the_crd_schema() {
    let (ok, out) = validate_cr(&["examples/amqpconnector.yaml", "examples/minimal.yaml"]);
    assert!(ok && out.contains("VALID"), "{out}");
}

#[test]
fn bad_fixtures_fail_the_crd_schema() {
    let dir = tempfile_dir();
    for (name, spec, expect) in [
        (
            "no-broker",
            "replicas: 1",
            "'broker' is a required property",
        ),
        (
            "unknown-field",
            "broker: {address: 'k:1'}\n  amqp: {bogus: 1}",
            "'bogus' was unexpected",
        ),
        (
            "replicas-string",
            "broker: {address: 'k:1'}\n  replicas: two",
            "is not of type 'integer'",
        ),
        (
            "batch-too-big",
            "broker: {address: 'k:1'}\n  amqp: {getBatchSize: 2000}",
            "greater than the maximum of 1024",
        ),
        (
            "bad-pattern",
            "broker: {address: 'k:1'}\n  amqp: {defaultPattern: topics}",
            "is not one of",
        ),
        (
            "frame-too-small",
            "broker: {address: 'k:1'}\n  amqp: {maxFrameSize: 511}",
            "less than the minimum of 512",
        ),
    ] {
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: amqp.kubemq.io/v1alpha1\nkind: AmqpConnector\nmetadata: {{name: x}}\nspec:\n  {spec}\n"
            ),
        )
        .expect("write fixture");
        let (ok, out) = validate_cr(&[path.to_str().expect("utf-8 path")]);
        assert!(!ok && out.contains(expect), "{name}: {out}");
    }
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("amqpc-fixtures-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn example() -> AmqpConnector {
    let text =
        std::fs::read_to_string(root().join("examples/amqpconnector.yaml")).expect("example");
    serde_yaml::from_str(&text).expect("the example deserializes into the Rust type")
}

/// Checks that the example passes every rule, and that `change` makes exactly the rule whose
/// message contains `message` fail.
fn rule_case(change: impl Fn(&mut serde_json::Value), message: &str) {
    let ok = example();
    assert!(validate_cel(&ok).is_ok(), "{:?}", validate_cel(&ok));
    let mut bad = serde_json::to_value(&ok).expect("to JSON");
    change(&mut bad["spec"]);
    let bad: AmqpConnector = serde_json::from_value(bad).expect("still the type");
    let errors = validate_cel(&bad).expect_err("the rule fails");
    let text = format!("{errors:?}");
    assert!(text.contains(message), "{message}: {text}");
}

#[test]
fn cel_at_least_one_listener() {
    rule_case(
        |s| s["listeners"]["amqp"]["enabled"] = false.into(),
        "at least one listener",
    );
}

#[test]
fn cel_amqps_needs_tls() {
    rule_case(
        |s| s["listeners"]["amqps"]["enabled"] = true.into(),
        "the amqps listener needs spec.tls",
    );
    // With TLS it passes.
    let mut with_tls = serde_json::to_value(example()).expect("to JSON");
    with_tls["spec"]["listeners"]["amqps"]["enabled"] = true.into();
    with_tls["spec"]["tls"] = serde_json::json!({"secretName": "orders-tls"});
    let with_tls: AmqpConnector = serde_json::from_value(with_tls).expect("type");
    assert!(
        validate_cel(&with_tls).is_ok(),
        "{:?}",
        validate_cel(&with_tls)
    );
}

#[test]
fn cel_listener_ports_differ() {
    rule_case(
        |s| {
            s["tls"] = serde_json::json!({"secretName": "t"});
            s["listeners"]["amqps"] = serde_json::json!({"enabled": true, "port": 5672});
        },
        "different ports",
    );
}

#[test]
fn cel_external_needs_required_client_auth() {
    rule_case(
        |s| s["sasl"] = serde_json::json!({"mechanisms": ["PLAIN", "EXTERNAL"]}),
        "SASL EXTERNAL needs",
    );
    let mut ok = serde_json::to_value(example()).expect("to JSON");
    ok["spec"]["sasl"] = serde_json::json!({"mechanisms": ["EXTERNAL"]});
    ok["spec"]["tls"] = serde_json::json!({"secretName": "t", "clientAuth": "Required"});
    let ok: AmqpConnector = serde_json::from_value(ok).expect("type");
    assert!(validate_cel(&ok).is_ok(), "{:?}", validate_cel(&ok));
}

#[test]
fn cel_node_ports_need_a_node_port_service() {
    rule_case(
        |s| s["service"] = serde_json::json!({"type": "ClusterIP", "nodePorts": {"amqp": 30672}}),
        "nodePorts needs",
    );
    let mut ok = serde_json::to_value(example()).expect("to JSON");
    ok["spec"]["service"] = serde_json::json!({"type": "NodePort", "nodePorts": {"amqp": 30672}});
    let ok: AmqpConnector = serde_json::from_value(ok).expect("type");
    assert!(validate_cel(&ok).is_ok(), "{:?}", validate_cel(&ok));
}

#[test]
fn cel_env_may_not_override_operator_keys() {
    for name in ["POD_NAME", "CONNECTORS_AMQP10_PORT"] {
        rule_case(
            |s| s["env"] = serde_json::json!([{"name": name, "value": "x"}]),
            "spec.env may not set",
        );
    }
    let mut ok = serde_json::to_value(example()).expect("to JSON");
    ok["spec"]["env"] = serde_json::json!([{"name": "RUST_BACKTRACE", "value": "1"}]);
    let ok: AmqpConnector = serde_json::from_value(ok).expect("type");
    assert!(validate_cel(&ok).is_ok(), "{:?}", validate_cel(&ok));
}

#[test]
fn cel_broker_address_is_host_port() {
    for bad in ["kubemq", "http://kubemq:50000", "kubemq:port", ":50000"] {
        rule_case(|s| s["broker"]["address"] = bad.into(), "must be host:port");
    }
    for good in [
        "kubemq-cluster-grpc.kubemq:50000",
        "10.0.0.1:50000",
        "[::1]:50000",
    ] {
        let mut ok = serde_json::to_value(example()).expect("to JSON");
        ok["spec"]["broker"]["address"] = good.into();
        let ok: AmqpConnector = serde_json::from_value(ok).expect("type");
        assert!(validate_cel(&ok).is_ok(), "{good}: {:?}", validate_cel(&ok));
    }
}

#[test]
fn cel_service_monitor_interval_is_a_duration() {
    rule_case(
        |s| {
            s["metrics"]["serviceMonitor"] =
                serde_json::json!({"enabled": true, "interval": "soon"})
        },
        "a duration such as 30s",
    );
    let mut ok = serde_json::to_value(example()).expect("to JSON");
    ok["spec"]["metrics"]["serviceMonitor"] =
        serde_json::json!({"enabled": true, "interval": "30s"});
    let ok: AmqpConnector = serde_json::from_value(ok).expect("type");
    assert!(validate_cel(&ok).is_ok(), "{:?}", validate_cel(&ok));
}

#[test]
fn printer_columns_and_subresources() {
    let crd = committed_crd();
    for needle in [
        "shortNames:\n    - amqpc",
        "categories:\n    - kubemq",
        "name: Ready",
        "name: Endpoint",
        "labelSelectorPath: .status.selector",
        "specReplicasPath: .spec.replicas",
        "status: {}",
        "x-kubernetes-list-type: map",
    ] {
        assert!(crd.contains(needle), "{needle}");
    }
}

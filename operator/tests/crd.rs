//! The AmqpConnector CRD: the committed file is what the types generate, it is small
//! enough for client-side apply, valid for Kubernetes 1.30 and the newest schema
//! `kubernetes-validate` ships, the examples pass its schema strictly and bad fixtures do not, and
//! every CEL rule has one passing and one failing case, evaluated client-side (the real_cluster
//! tests put the same cases, from cases/mod.rs, to a real API server).
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod cases;

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
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs kubernetes-validate and jsonschema (Python): tests/run.sh"
)]
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
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs kubernetes-validate and jsonschema (Python): tests/run.sh"
)]
fn examples_pass_the_crd_schema() {
    let (ok, out) = validate_cr(&[
        "examples/amqpconnector.yaml",
        "examples/minimal.yaml",
        "examples/secured.yaml",
    ]);
    assert!(ok && out.contains("VALID"), "{out}");
}

#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs kubernetes-validate and jsonschema (Python): tests/run.sh"
)]
fn bad_fixtures_fail_the_crd_schema() {
    let dir = tempfile_dir();
    for case in cases::SCHEMA {
        let Some(expect) = case.jsonschema else {
            continue;
        };
        let path = dir.join(format!("{}.yaml", case.name));
        std::fs::write(&path, case.document("x")).expect("write fixture");
        let (ok, out) = validate_cr(&[path.to_str().expect("utf-8 path")]);
        assert!(!ok && out.contains(expect), "{}: {out}", case.name);
    }
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("amqpc-fixtures-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn example() -> AmqpConnector {
    serde_json::from_value(cases::example("amqpconnector.yaml"))
        .expect("the example deserializes into the Rust type")
}

/// Checks that the example passes every rule, and that the case's change makes the rule with
/// its message fail.
fn rule_case(case: &cases::RuleCase) {
    let ok = example();
    assert!(validate_cel(&ok).is_ok(), "{:?}", validate_cel(&ok));
    let mut bad = serde_json::to_value(&ok).expect("to JSON");
    (case.change)(&mut bad["spec"]);
    let bad: AmqpConnector = serde_json::from_value(bad).expect("still the type");
    let errors = validate_cel(&bad).expect_err("the rule fails");
    let text = format!("{errors:?}");
    assert!(text.contains(case.message), "{}: {text}", case.name);
}

/// Every rule case of the shared table fails client-side, as on the API server.
#[test]
fn every_rule_case_fails() {
    for case in cases::RULES {
        rule_case(case);
    }
}

#[test]
fn cel_at_least_one_listener() {
    rule_case(cases::rule("no-listener"));
}

#[test]
fn cel_amqps_needs_tls() {
    rule_case(cases::rule("amqps-without-tls"));
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
    rule_case(cases::rule("same-listener-ports"));
}

#[test]
fn cel_external_needs_required_client_auth() {
    rule_case(cases::rule("external-without-required-client-auth"));
    let mut ok = serde_json::to_value(example()).expect("to JSON");
    ok["spec"]["sasl"] = serde_json::json!({"mechanisms": ["EXTERNAL", "PLAIN"],
        "jwt": {"secretName": "k", "signatureType": "HS256"}, "authorizeEveryClient": true});
    ok["spec"]["tls"] = serde_json::json!({"secretName": "t", "clientAuth": "Required", "clientCa": {"secretName": "ca"}});
    let ok: AmqpConnector = serde_json::from_value(ok).expect("type");
    assert!(validate_cel(&ok).is_ok(), "{:?}", validate_cel(&ok));
}

/// SASL-3, AUTHZ-1, AUTHZ-8: PLAIN is always listed; a JWT key exactly when ANONYMOUS is not
/// offered; with it, either an access control list from one source or `authorizeEveryClient`.
#[test]
fn cel_sasl_authentication_needs_a_jwt_key() {
    for name in [
        "sasl-without-plain",
        "sasl-anonymous-with-jwt",
        "sasl-authentication-without-jwt",
        "sasl-authorization-without-jwt",
        "sasl-authorization-two-sources",
        "sasl-authentication-without-authorization",
        "sasl-authorization-and-every-client",
        "sasl-every-client-without-jwt",
    ] {
        rule_case(cases::rule(name));
    }
    for sasl in [
        serde_json::json!({"mechanisms": ["PLAIN", "ANONYMOUS"]}),
        serde_json::json!({"mechanisms": ["PLAIN"], "jwt": {"secretName": "k", "signatureType": "RS256"},
            "authorization": {"secretName": "acl", "key": "acl.json"}}),
        serde_json::json!({"mechanisms": ["PLAIN"], "jwt": {"secretName": "k", "signatureType": "RS256"},
            "authorizeEveryClient": true}),
        serde_json::json!({"mechanisms": ["PLAIN", "ANONYMOUS"], "authorizeEveryClient": false}),
    ] {
        let mut ok = serde_json::to_value(example()).expect("to JSON");
        ok["spec"]["sasl"] = sasl;
        let ok: AmqpConnector = serde_json::from_value(ok).expect("type");
        assert!(validate_cel(&ok).is_ok(), "{:?}", validate_cel(&ok));
    }
}

#[test]
fn cel_client_ca_goes_with_client_auth() {
    rule_case(cases::rule("client-auth-without-client-ca"));
    rule_case(cases::rule("client-ca-without-client-auth"));
    for tls in [
        serde_json::json!({"secretName": "t"}),
        serde_json::json!({"secretName": "t", "clientAuth": "None"}),
        serde_json::json!({"secretName": "t", "clientAuth": "Required", "clientCa": {"secretName": "ca"}}),
    ] {
        let mut ok = serde_json::to_value(example()).expect("to JSON");
        ok["spec"]["tls"] = tls;
        let ok: AmqpConnector = serde_json::from_value(ok).expect("type");
        assert!(validate_cel(&ok).is_ok(), "{:?}", validate_cel(&ok));
    }
}

#[test]
fn cel_node_ports_need_a_node_port_service() {
    rule_case(cases::rule("node-ports-on-cluster-ip"));
    let mut ok = serde_json::to_value(example()).expect("to JSON");
    ok["spec"]["service"] = serde_json::json!({"type": "NodePort", "nodePorts": {"amqp": 30672}});
    let ok: AmqpConnector = serde_json::from_value(ok).expect("type");
    assert!(validate_cel(&ok).is_ok(), "{:?}", validate_cel(&ok));
}

#[test]
fn cel_env_may_not_override_operator_keys() {
    rule_case(cases::rule("env-sets-pod-name"));
    rule_case(cases::rule("env-sets-a-connector-setting"));
    let mut ok = serde_json::to_value(example()).expect("to JSON");
    ok["spec"]["env"] = serde_json::json!([{"name": "RUST_BACKTRACE", "value": "1"}]);
    let ok: AmqpConnector = serde_json::from_value(ok).expect("type");
    assert!(validate_cel(&ok).is_ok(), "{:?}", validate_cel(&ok));
}

#[test]
fn cel_broker_address_is_host_port() {
    for name in [
        "broker-without-port",
        "broker-url",
        "broker-named-port",
        "broker-without-host",
    ] {
        rule_case(cases::rule(name));
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
    rule_case(cases::rule("service-monitor-interval"));
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

/// A name whose children could not be named is refused; 55 characters are accepted.
#[test]
fn cel_name_fits_the_children() {
    for name in cases::BAD_NAMES {
        let mut bad = example();
        bad.metadata.name = Some(name.to_string());
        let errors = validate_cel(&bad).expect_err(name);
        assert!(
            format!("{errors:?}").contains(cases::NAME_MESSAGE),
            "{name}: {errors:?}"
        );
    }
    let mut ok = example();
    ok.metadata.name = Some(cases::LONGEST_NAME.into());
    assert!(validate_cel(&ok).is_ok(), "{:?}", validate_cel(&ok));
}

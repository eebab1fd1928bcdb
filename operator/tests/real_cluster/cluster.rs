//! A real Kubernetes control plane on loopback (tests/k8s: etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler of v1.30.14, and kwok playing the kubelet of one
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
    /// Builds the binaries (cached after the first run) and starts the control plane.
    pub fn start(root: &Path) -> Cluster {
        let built = Command::new("bash")
            .arg(root.join("tests/k8s/build.sh"))
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

    /// Starts the operator binary with `args` and `env`, as the user of `kubeconfig`; it is
    /// stopped when the handle drops.
    pub fn operator(
        &self,
        kubeconfig: &Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Operator {
        let log = self
            .state
            .path()
            .join(format!("operator-{}.log", args.len()));
        let child = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-operator"))
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("operator log"))
            .spawn()
            .expect("the operator starts");
        Operator { child, log }
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
}

impl Operator {
    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
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

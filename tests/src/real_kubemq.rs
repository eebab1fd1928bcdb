//! The real KubeMQ server as a test backend, where its binary exists on this machine.
//!
//! Which binary the tier runs is `testkit::reference`'s to say. Each server gets its own scratch folder and
//! loopback ports, and is stopped by process group when the test is done or its process ends.
//!
//! KubeMQ binds every interface and reports usage to an outside host. `tests/run.sh` runs the
//! suite in a network namespace that has nothing but `lo` when it can (as root); wherever the
//! suite runs, the server's HTTPS proxy is a closed loopback port, so its report cannot leave.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use testkit::reference::{
    burnin_binary, enforcing_binary, for_this_test, kubemq_binary as binary, record_use,
};

/// A KubeMQ server started for a test, on loopback ports of its own.
pub struct RealKubemq {
    /// Its gRPC address (`host:port`).
    pub grpc: SocketAddr,
    /// Its REST address.
    pub rest: SocketAddr,
    binary: PathBuf,
    group: Child,
    dir: tempfile::TempDir,
    settings: Vec<(String, String)>,
}

/// A stopped (or killed) server's folder and gRPC port.
pub struct StoppedKubemq {
    binary: PathBuf,
    grpc: SocketAddr,
    dir: tempfile::TempDir,
    settings: Vec<(String, String)>,
}

impl StoppedKubemq {
    /// Starts the server again on the same folder and gRPC port, as a restarted broker.
    pub fn start_again(self) -> RealKubemq {
        RealKubemq::start_in(&self.binary, self.dir, Some(self.grpc), self.settings)
    }
}

impl RealKubemq {
    /// Starts the server from `binary` and waits until its gRPC port answers.
    pub fn start(binary: &std::path::Path) -> RealKubemq {
        Self::start_with(binary, &[])
    }

    /// Starts the server from `binary` with `settings` added to its environment (KubeMQ reads
    /// every setting from a variable, e.g. `AUTHORIZATION_ENABLE`).
    pub fn start_with(binary: &std::path::Path, settings: &[(&str, &str)]) -> RealKubemq {
        let dir = tempfile::tempdir().expect("scratch folder");
        let settings = settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::start_in(binary, dir, None, settings)
    }

    fn start_in(
        binary: &std::path::Path,
        dir: tempfile::TempDir,
        grpc: Option<SocketAddr>,
        settings: Vec<(String, String)>,
    ) -> RealKubemq {
        // Below the ephemeral range: KubeMQ takes ephemeral ports of its own while it starts,
        // and one of them could be a port chosen here that it has not bound yet.
        let [grpc_port, rest, api] = testkit::free_fixed_ports();
        let grpc = grpc.unwrap_or_else(|| loopback(grpc_port));
        let rest = loopback(rest);
        // A port nobody listens on: the usage report's HTTPS proxy, so the report fails at once.
        let closed = testkit::free_port();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("kubemq.log"))
            .expect("log file");
        // `setsid` makes the shell the leader of a new process group; the shell waits for its
        // standard input to close (the test dropping it, or the test process ending) and then
        // kills the whole group, so no server outlives the test binary.
        let group = Command::new("setsid")
            .arg("sh")
            .arg("-c")
            .arg(r#""$0" server & cat >/dev/null; kill -KILL 0"#)
            .arg(binary)
            .current_dir(dir.path())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("GRPC_PORT", grpc.port().to_string())
            .env("REST_PORT", rest.port().to_string())
            .env("API_PORT", api.to_string())
            .env("STORE_STORE_PATH", "./store")
            .env("HTTPS_PROXY", format!("http://127.0.0.1:{closed}"))
            .env("HTTP_PROXY", format!("http://127.0.0.1:{closed}"))
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .envs(settings.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("setsid and sh start KubeMQ");
        let server = RealKubemq {
            grpc,
            rest,
            binary: binary.to_path_buf(),
            group,
            dir,
            settings,
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&self.grpc, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "KubeMQ did not listen on {} within 30 s:\n{}",
                self.grpc,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the server has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kubemq.log")).unwrap_or_default()
    }

    /// Kills the server's process group, as a crash would, and waits for it; what it stored
    /// stays for [`StoppedKubemq::start_again`].
    pub fn kill(mut self) -> StoppedKubemq {
        self.stop_group();
        self.stopped()
    }

    /// Stops the server as an orderly shutdown does (SIGTERM, as Kubernetes stops a pod) and
    /// waits until it has exited (killed after 30 s); what it stored stays for
    /// [`StoppedKubemq::start_again`].
    pub fn stop(mut self) -> StoppedKubemq {
        let group = format!("-{}", self.group.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // The shell that leads the group exits at once; reaped, it no longer counts.
            let _ = self.group.try_wait();
            let alive = Command::new("kill")
                .args(["-0", "--", &group])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !alive || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop_group();
        self.stopped()
    }

    /// The folder and port of this server, whose processes are gone.
    fn stopped(&mut self) -> StoppedKubemq {
        let placeholder = tempfile::tempdir().expect("scratch folder");
        StoppedKubemq {
            binary: self.binary.clone(),
            grpc: self.grpc,
            dir: std::mem::replace(&mut self.dir, placeholder),
            settings: std::mem::take(&mut self.settings),
        }
    }

    fn stop_group(&mut self) {
        let pid = self.group.id().to_string();
        // (The group may be gone already: a stopped server's.)
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .stderr(Stdio::null())
            .status();
        drop(self.group.stdin.take());
        let _ = self.group.wait();
    }
}

impl Drop for RealKubemq {
    fn drop(&mut self) {
        self.stop_group();
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

//! The chart's connector pods on a real node (tests/k8s/real-node.sh): the v1.30 control plane,
//! a kubelet and kube-proxy built from their Go module, Debian's containerd and runc, the CNI
//! bridge and host-local plugins, CoreDNS, the project's images imported from their OCI layouts,
//! the chart installed with helm 3, examples/amqpconnector.yaml applied as written (two replicas,
//! KubeMQ addressed by its Service's name), and python-qpid-proton sending and receiving through
//! its Service's ClusterIP and NodePort, then scaled to 3 and back, taken out of the Service by
//! their readiness probe while KubeMQ is away and back when it returns, rolled under a producer
//! without losing an accepted message (a consumer on a replaced pod closed with
//! `amqp:connection:forced`, its unsettled delivery back), and one pod's connector killed with
//! SIGKILL and restarted without losing one. KubeMQ runs beside the node: once the embedded store's gRPC façade, once
//! the real KubeMQ where its binary is on this machine (the real KubeMQ tier). Each run has a
//! network and mount namespace of its own, so nothing of the node outlives it, and nothing
//! KubeMQ binds is reachable from outside it.

// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use testkit::built_by;
use testkit::reference;

/// One real node at a time: two control planes, kubelets and their pods at once would only
/// compete for the machine's two cores.
static ONE_NODE: Mutex<()> = Mutex::new(());

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root")
        .to_path_buf()
}

/// The two images' OCI layouts, built once for both runs into a folder of their own: the images
/// tests (tests/tests/images.rs) rebuild target/images, and `tests/run.sh` runs them alongside.
fn images() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        built_by(
            &root().join("images/build.sh"),
            &[root().join("target/real-node-images").as_os_str()],
        )
    })
}

/// Runs real-node.sh with KubeMQ played by `kubemq` (the façade when `None`) and checks every
/// step passed.
fn run_real_node(kubemq: Option<&Path>) {
    let _one = ONE_NODE.lock().unwrap_or_else(|e| e.into_inner());
    let control_plane = built_by(&root().join("tests/k8s/build.sh"), &[OsStr::new("1.30")]);
    let node = built_by(&root().join("tests/k8s/build-node.sh"), &[]);
    let images = images();
    let helm = std::env::var("HELM3").expect("HELM3 names helm 3 (tests/run.sh sets it)");
    let state = tempfile::tempdir().expect("a state folder");
    let mut cmd = Command::new("unshare");
    cmd.args(["--net", "--mount", "--propagation", "private", "bash"])
        .arg(root().join("tests/k8s/real-node.sh"))
        .arg(&control_plane)
        .arg(&node)
        .arg(images)
        .arg(root().join("target/release/kubemq-amqp-connector"))
        .arg(env!("CARGO_BIN_EXE_kubemq-amqp-operator"))
        .arg(helm)
        .arg(state.path().join("node"));
    if let Some(kubemq) = kubemq {
        cmd.arg(kubemq);
    }
    let out = cmd.output().expect("unshare runs real-node.sh");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tests/k8s/real-node.sh failed:\n{printed}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let backend = match kubemq {
        Some(_) => "the real KubeMQ",
        None => "the embedded store's gRPC façade",
    };
    for step in [
        "images imported from their OCI layouts",
        "a kubelet with containerd and runc is Ready",
        "CoreDNS answers for the cluster's Services",
        &format!("KubeMQ ({backend}) serves behind kubemq-cluster-grpc.kubemq"),
        "the chart installed with helm",
        "two connector pods run and are ready on the real node",
        "a client sends and receives through the Service's ClusterIP",
        "a client sends and receives through the NodePort",
        "kubectl scale to 3 and back to 2 keeps serving",
        "readiness follows KubeMQ: the pods leave the Service without it and serve again",
        "a rolling update loses none of the",
        "a consumer on a replaced pod is closed with amqp:connection:forced and its delivery is back",
        "a pod killed with SIGKILL comes back and nothing accepted is lost",
    ] {
        assert!(
            printed
                .lines()
                .any(|l| l.starts_with(&format!("PASS {step}"))),
            "not passed: {step}\n{printed}"
        );
    }
}

#[test]
fn the_charts_connector_pods_serve_clients_through_their_service_on_a_real_node() {
    run_real_node(None);
}

#[test]
fn the_same_through_the_real_kubemq_beside_the_node() {
    let Some(kubemq) = reference::for_this_test("real-kubemq", reference::kubemq_binary()) else {
        return;
    };
    run_real_node(Some(&kubemq));
}

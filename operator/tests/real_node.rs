//! The chart's connector pods on a real node (tests/k8s/real-node.sh): the v1.30 control plane,
//! a kubelet and kube-proxy built from their Go module, Debian's containerd and runc, the CNI
//! bridge and host-local plugins, the project's images imported from their OCI layouts, the
//! chart installed with helm 3, an AmqpConnector of two replicas on that node, and
//! python-qpid-proton sending and receiving through its Service's ClusterIP and NodePort, then
//! scaled to 3 and back, rolled under a producer without losing an accepted message, and one
//! pod's connector killed with SIGKILL and restarted without losing one. KubeMQ
//! is played by the embedded store's gRPC façade on the node's address (the real KubeMQ tier
//! does not reach into this namespace). All of it runs in a network and mount namespace of its
//! own, so nothing of the node outlives the test.

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

use testkit::built_by;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root")
        .to_path_buf()
}

#[test]
fn the_charts_connector_pods_serve_clients_through_their_service_on_a_real_node() {
    let control_plane = built_by(&root().join("tests/k8s/build.sh"), &[OsStr::new("1.30")]);
    let node = built_by(&root().join("tests/k8s/build-node.sh"), &[]);
    let images = built_by(
        &root().join("images/build.sh"),
        &[root().join("target/images").as_os_str()],
    );
    let helm = std::env::var("HELM3").expect("HELM3 names helm 3 (tests/run.sh sets it)");
    let state = tempfile::tempdir().expect("a state folder");
    let out = Command::new("unshare")
        .args(["--net", "--mount", "--propagation", "private", "bash"])
        .arg(root().join("tests/k8s/real-node.sh"))
        .arg(&control_plane)
        .arg(&node)
        .arg(&images)
        .arg(root().join("target/release/kubemq-amqp-connector"))
        .arg(env!("CARGO_BIN_EXE_kubemq-amqp-operator"))
        .arg(helm)
        .arg(state.path().join("node"))
        .output()
        .expect("unshare runs real-node.sh");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tests/k8s/real-node.sh failed:\n{printed}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for step in [
        "images imported from their OCI layouts",
        "a kubelet with containerd and runc is Ready",
        "the chart installed with helm",
        "two connector pods run and are ready on the real node",
        "a client sends and receives through the Service's ClusterIP",
        "a client sends and receives through the NodePort",
        "kubectl scale to 3 and back to 2 keeps serving",
        "a rolling update loses none of the",
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

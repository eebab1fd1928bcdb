//! KubeMQ's own Python SDK (PyPI `kubemq` 4.1.5) against the embedded store's gRPC façade, over a
//! real socket: send, receive, ack, nack (count and sequence), requeue, MaxReceiveCount →
//! dead-letter queue, and an in-band validation error (KMQ-4, KMQ-7, KMQ-11).
//! The SDK is installed by tests/run.sh; failures print the SDK's error.

use std::process::Command;

use interop_tests::TestFacade;

#[test]
fn python_sdk_against_facade() {
    let facade = TestFacade::start();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/kubemq_sdk.py");
    let out = Command::new("python3")
        .args([script, &facade.addr.to_string()])
        .output()
        .expect("python3 must be installed (tests/run.sh installs the kubemq SDK)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "kubemq SDK scenario failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("PASS kubemq_sdk"), "{stdout}");
}

/// proto/kubemq.proto matches KubeMQ's schema as shipped in the `kubemq` wheel: every message,
/// field, enum value and RPC the wheel has, identical in name, number, type and streaming
/// (KMQ-15).
#[test]
fn proto_matches_kubemq_wheel() {
    let dir = tempfile::tempdir().unwrap();
    let set = dir.path().join("kubemq.pb");
    let proto_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../proto");
    let status = Command::new(protoc_bin_vendored::protoc_bin_path().unwrap())
        .args([
            "--include_imports",
            &format!("--descriptor_set_out={}", set.display()),
            "-I",
            proto_dir,
            "kubemq.proto",
        ])
        .status()
        .unwrap();
    assert!(status.success(), "protoc failed");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/proto_compat.py");
    let out = Command::new("python3")
        .args([script, set.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "schema differs from KubeMQ's:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("PASS proto_compat"), "{stdout}");
}

/// KubeMQ's Python SDK on events and events-store through the façade: fan-out, stored
/// sequences from 1, StartFromFirst and StartAtSequence (KubeMQ 4.5, 4.6).
#[test]
fn python_sdk_events_against_facade() {
    let facade = TestFacade::start();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/kubemq_sdk_events.py");
    sdk(Command::new("python3").args([script, "facade", &facade.addr.to_string()]));
}

/// ENV-12, ENV-15 for events: a KubeMQ SDK publisher and an AMQP subscriber, and an AMQP
/// publisher and a KubeMQ SDK subscriber, on one store (the connector over the façade).
#[test]
fn python_sdk_and_amqp_events_both_ways() {
    let c = interop_tests::TestConnector::start_over_grpc(connector::config::Settings::default());
    let grpc = c.facade_addr().expect("a façade").to_string();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/kubemq_sdk_events.py");
    sdk(Command::new("python3").args([script, "interop", &grpc, &format!("amqp://{}", c.addr)]));
}

fn sdk(cmd: &mut Command) {
    let out = cmd.output().expect("python3 with the kubemq SDK");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("PASS kubemq_sdk_events"),
        "kubemq SDK events scenario failed:\n{stdout}\n{stderr}"
    );
}

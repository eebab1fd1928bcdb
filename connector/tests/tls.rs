//! The connector binary's TLS listener with real clients: python-qpid-proton, rhea and Python's
//! ssl module (OpenSSL) over TLS and mTLS (tests/python/tls.py, tests/js/tls.js), with a CA,
//! server and client certificates made here (rcgen).
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::pki::Pki;
use common::{free_port, run, start_connector, wait_listening};

const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/python/tls.py");
const JS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/js");

/// The connector with a plain port and a TLS port; `extra` adds flags.
struct Tls {
    child: Child,
    port: u16,
    _data: tempfile::TempDir,
}

impl Tls {
    fn start(cert: &Path, key: &Path, extra: &[&str]) -> Tls {
        let data = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut args = vec![
            "--tls-port".to_string(),
            port.to_string(),
            "--tls-cert-file".into(),
            cert.display().to_string(),
            "--tls-key-file".into(),
            key.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let child = start_connector(data.path(), free_port(), &args);
        wait_listening(port);
        Tls {
            child,
            port,
            _data: data,
        }
    }

    fn python(&self, scenario: &str, args: &[&Path]) {
        run(Command::new("python3")
            .arg(PYTHON)
            .arg(scenario)
            .arg(self.port.to_string())
            .args(args));
    }

    fn rhea(&self, args: &[&Path]) {
        run(Command::new("node")
            .current_dir(JS_DIR)
            .arg("tls.js")
            .arg(self.port.to_string())
            .args(args));
    }
}

/// A CA and the connector serving a certificate it issued (`server`, serial 10, for 127.0.0.1
/// and localhost), started with `extra` flags.
fn served(extra: &[&str]) -> (Pki, Tls) {
    let pki = Pki::new("test CA");
    pki.issue("server", "127.0.0.1", 10, false, false);
    let c = Tls::start(&pki.path("server.pem"), &pki.path("server.key"), extra);
    (pki, c)
}

impl Drop for Tls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// TLS-1: the TLS listener is bound only when a certificate and key are configured.
#[test]
fn tls_1_listener_only_when_configured() {
    let data = tempfile::tempdir().unwrap();
    let tls_port = free_port();
    let mut c = start_connector(
        data.path(),
        free_port(),
        &["--tls-port", &tls_port.to_string()],
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(TcpStream::connect(("127.0.0.1", tls_port)).is_err());
    let _ = c.kill();
    let _ = c.wait();
}

/// TLS-7: with TLS configured and the plain port open, the start-up log warns that PLAIN
/// passwords travel in cleartext there; with `Port` 0 it does not.
#[test]
fn tls_7_a_plain_port_beside_tls_is_warned_about() {
    let pki = Pki::new("test CA");
    pki.issue("server", "127.0.0.1", 10, false, false);
    for (port, warned) in [(free_port(), true), (0, false)] {
        let tls_port = free_port();
        let data = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-connector"))
            .args(["--port", &port.to_string(), "--http-address", "off"])
            .args(["--bind-address", "127.0.0.1"])
            .args(["--tls-port", &tls_port.to_string()])
            .arg("--tls-cert-file")
            .arg(pki.path("server.pem"))
            .arg("--tls-key-file")
            .arg(pki.path("server.key"))
            .arg("--data-dir")
            .arg(data.path())
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_listening(tls_port);
        // The start-up lines follow the bind.
        std::thread::sleep(Duration::from_millis(300));
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("TLS listener uses TLS 1.2 and 1.3"), "{text}");
        assert_eq!(
            text.contains("plain AMQP listener stays open beside TLS"),
            warned,
            "Port {port}: {text}"
        );
    }
}

/// TLS-3, TLS-5: in tls mode python-qpid-proton and rhea send and receive over TLS (server
/// certificate verified, with its host name), and the AMQP header is answered inside TLS.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton and rhea: tests/run.sh"
)]
fn tls_3_5_proton_and_rhea_over_tls() {
    let (pki, c) = served(&[]);
    let ca = pki.path("ca.pem");
    c.python("proton", &[&ca]);
    c.python("header", &[&ca]);
    c.rhea(&[&ca]);
}

/// A client that trusts another CA refuses the connector's certificate: the connector presents
/// the configured one.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton and rhea: tests/run.sh"
)]
fn tls_client_of_another_ca_refuses_the_server() {
    let (_pki, c) = served(&[]);
    let other = Pki::new("another CA");
    c.python("untrusted", &[&other.path("ca.pem")]);
}

/// TLS-2: TLS 1.2 is accepted, TLS 1.1 refused.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton and rhea: tests/run.sh"
)]
fn tls_2_minimum_version() {
    let (pki, c) = served(&[]);
    let ca = pki.path("ca.pem");
    c.python("tls12", &[&ca]);
    c.python("tls11", &[&ca]);
}

/// TLS-4: in mtls mode a client certificate from the configured CA is required: proton and
/// rhea with one get through; no certificate, one from another CA and an expired one are
/// refused.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton and rhea: tests/run.sh"
)]
fn tls_4_mtls_requires_a_verified_client_certificate() {
    let pki = Pki::new("test CA");
    pki.issue("server", "127.0.0.1", 10, false, false);
    pki.issue("client", "client-a", 11, true, false);
    pki.issue("expired", "client-b", 12, true, true);
    let other = Pki::new("another CA");
    other.issue("stranger", "client-c", 13, true, false);
    let ca = pki.path("ca.pem");
    let c = Tls::start(
        &pki.path("server.pem"),
        &pki.path("server.key"),
        &[
            "--tls-mode",
            "mtls",
            "--tls-client-ca-file",
            ca.to_str().unwrap(),
        ],
    );
    let (cert, key) = (pki.path("client.pem"), pki.path("client.key"));
    c.python("proton", &[&ca, &cert, &key]);
    c.python("header", &[&ca, &cert, &key]);
    c.rhea(&[&ca, &cert, &key]);
    c.python("refused", &[&ca]);
    c.python(
        "refused",
        &[
            &ca,
            &other.path("stranger.pem"),
            &other.path("stranger.key"),
        ],
    );
    c.python(
        "refused",
        &[&ca, &pki.path("expired.pem"), &pki.path("expired.key")],
    );
}

/// Replaces the certificate and key the way a mounted Kubernetes Secret changes: `tls.crt`
/// and `tls.key` are links through `..data`, which is swapped to a new folder at once.
fn secret_volume(dir: &Path, version: &str, pki: &Pki, name: &str) {
    let folder = dir.join(version);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(pki.path(&format!("{name}.pem")), folder.join("tls.crt")).unwrap();
    std::fs::copy(pki.path(&format!("{name}.key")), folder.join("tls.key")).unwrap();
    let next = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&next);
    std::os::unix::fs::symlink(version, &next).unwrap();
    std::fs::rename(&next, dir.join("..data")).unwrap();
    for file in ["tls.crt", "tls.key"] {
        let link = dir.join(file);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(file), &link).unwrap();
        }
    }
}

/// The server certificate's notAfter, as `/metrics/operations` should report it.
fn not_after(pem: &Path) -> String {
    let pem = std::fs::read(pem).unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    let cert = pem.parse_x509().unwrap();
    cert.validity().not_after.timestamp().to_string()
}

/// `/metrics/operations` exports the served certificate's notAfter, and the rotated one's once
/// the files change, before any connection asks for it.
#[test]
fn tls_certificate_expiry_is_exported_and_follows_a_rotation() {
    let pki = Pki::new("test CA");
    pki.issue("first", "127.0.0.1", 31, false, true);
    pki.issue("second", "127.0.0.1", 32, false, false);
    let volume = tempfile::tempdir().unwrap();
    secret_volume(volume.path(), "..v1", &pki, "first");
    let http: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let _c = Tls::start(
        &volume.path().join("tls.crt"),
        &volume.path().join("tls.key"),
        &["--http-address", &http.to_string()],
    );
    // The HTTP endpoint is bound after the TLS listener the start waited for.
    wait_listening(http.port());
    let gauge = || {
        let reply = testkit::http_get(http, "/metrics/operations").expect("answered");
        assert_eq!(reply.status, 200, "{reply:?}");
        reply
            .body
            .lines()
            .find_map(|l| {
                l.strip_prefix("kubemq_amqp_connector_tls_certificate_not_after_seconds ")
            })
            .map(str::to_string)
    };
    let first = not_after(&pki.path("first.pem"));
    assert_eq!(
        first, "1609459200",
        "the first certificate expired on 2021-01-01"
    );
    assert_eq!(gauge().as_deref(), Some(first.as_str()));
    secret_volume(volume.path(), "..v2", &pki, "second");
    assert_eq!(
        gauge().as_deref(),
        Some(not_after(&pki.path("second.pem")).as_str()),
        "the rotated certificate's notAfter"
    );
}

/// A certificate replaced while connections are open: new connections get the new one, the
/// open connection goes on with the old one, and nothing restarts.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton and rhea: tests/run.sh"
)]
fn tls_certificate_rotation_reaches_new_connections() {
    let pki = Pki::new("test CA");
    pki.issue("first", "127.0.0.1", 21, false, false);
    pki.issue("second", "127.0.0.1", 22, false, false);
    let volume = tempfile::tempdir().unwrap();
    secret_volume(volume.path(), "..v1", &pki, "first");
    let mut c = Tls::start(
        &volume.path().join("tls.crt"),
        &volume.path().join("tls.key"),
        &[],
    );
    let mut client = Command::new("python3")
        .arg(PYTHON)
        .args(["rotation", &c.port.to_string()])
        .arg(pki.path("ca.pem"))
        .args(["21", "22"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert_eq!(first, "ROTATE");
    secret_volume(volume.path(), "..v2", &pki, "second");
    writeln!(client.stdin.take().unwrap()).unwrap();
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = client.wait().unwrap();
    assert!(status.success(), "{rest:?}");
    assert!(rest.iter().any(|l| l == "PASS rotation"), "{rest:?}");
    assert!(
        c.child.try_wait().unwrap().is_none(),
        "the connector kept running through the rotation"
    );
}

/// Files that stop loading (a certificate caught half-written, then a certificate that does not
/// match the old key) leave the last good certificate in use; once the set loads again, new
/// connections get it.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton and rhea: tests/run.sh"
)]
fn tls_files_that_stop_loading_keep_the_last_good_certificate() {
    let pki = Pki::new("test CA");
    pki.issue("first", "127.0.0.1", 31, false, false);
    pki.issue("second", "127.0.0.1", 32, false, false);
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::copy(pki.path("first.pem"), &cert).unwrap();
    std::fs::copy(pki.path("first.key"), &key).unwrap();
    let c = Tls::start(&cert, &key, &[]);
    let ca = pki.path("ca.pem");
    let serial = |n: &str| c.python("serial", &[&ca, Path::new(n)]);
    serial("31");
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nMIIB").unwrap();
    serial("31");
    serial("31");
    std::fs::copy(pki.path("second.pem"), &cert).unwrap();
    serial("31");
    std::fs::copy(pki.path("second.key"), &key).unwrap();
    serial("32");
}

/// A TLS handshake that does not finish within the handshake timeout is closed: a socket that
/// says nothing, and one that stops in the middle of its ClientHello.
#[test]
fn tls_handshake_must_finish_within_the_handshake_timeout() {
    let (_pki, c) = served(&["--handshake-timeout-seconds", "1"]);
    // A TLS record header announcing a 512-byte handshake message, then silence.
    for opening in [&b""[..], &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01][..]] {
        let mut s = TcpStream::connect(("127.0.0.1", c.port)).unwrap();
        s.write_all(opening).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf);
        assert!(
            matches!(n, Ok(0))
                || n.as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "the connector closed the unfinished handshake (read: {n:?})"
        );
    }
}

/// Bad TLS files stop the connector at start with exit code 2, naming the file and never
/// printing a key.
#[test]
fn tls_files_that_do_not_load_stop_the_start() {
    let pki = Pki::new("test CA");
    pki.issue("server", "127.0.0.1", 10, false, false);
    pki.issue("other", "127.0.0.1", 11, false, false);
    let missing = pki.path("missing.pem");
    let key = std::fs::read_to_string(pki.path("server.key")).unwrap();
    for (cert, key_file, says) in [
        (missing.clone(), pki.path("server.key"), "missing.pem"),
        (
            pki.path("server.key"),
            pki.path("server.key"),
            "no PEM certificate",
        ),
        (
            pki.path("server.pem"),
            pki.path("server.pem"),
            "no PEM private key",
        ),
        (pki.path("server.pem"), pki.path("other.key"), "other.key"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-connector"))
            .args(["--port", "0", "--http-address", "off"])
            .args(["--tls-port", &free_port().to_string()])
            .arg("--tls-cert-file")
            .arg(&cert)
            .arg("--tls-key-file")
            .arg(&key_file)
            .env("RUST_LOG", "info")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(2), "{text}");
        assert!(text.contains(says), "{says} in {text}");
        let key_body = key.lines().nth(1).unwrap();
        assert!(!text.contains(key_body), "a key line in the log: {text}");
    }
}

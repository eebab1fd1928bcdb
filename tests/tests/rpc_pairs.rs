//! Request/reply between different AMQP clients through the real connector, on every backend:
//! python-qpid-proton (tests/python/rpc.py), rhea-promise (tests/js/rpc.js) and fe2o3-amqp
//! (here) as requester and responder, in every pairing of two of them. Each side follows the same
//! protocol: two commands ("reboot" executed, "fail" refused with an error) and two queries
//! ("q1", "q2" answered `result:<request>`), correlated by correlation-id.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use connector::config::Settings;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::messaging::{
    ApplicationProperties, Body, Message, MessageId, Outcome, Properties,
};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use interop_tests::TestConnector;

const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
const JS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/js");
const EXECUTED: &str = "x-opt-kubemq-executed";
const ERROR: &str = "x-opt-kubemq-error";

/// A client that can take either side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    Proton,
    Rhea,
    Fe2o3,
}

/// The command line of a script client's `side` (`respond` or `request`).
fn script(client: Client, side: &str, c: &TestConnector, channel: &str) -> Command {
    match client {
        Client::Proton => {
            let mut cmd = Command::new("python3");
            cmd.current_dir(PYTHON)
                .args(["rpc.py", side, &c.url(), channel]);
            cmd
        }
        Client::Rhea => {
            let mut cmd = Command::new("node");
            cmd.current_dir(JS)
                .args(["rpc.js", side, &c.addr.port().to_string(), channel]);
            cmd
        }
        Client::Fe2o3 => unreachable!("fe2o3 runs in the test's own process"),
    }
}

/// A script responder and what it prints; killed if left running when the test fails.
struct Reaped {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a script responder and returns once it is subscribed.
fn start_responder(client: Client, c: &TestConnector, channel: &str) -> Reaped {
    let mut child = script(client, "respond", c, channel)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the client runs (tests/run.sh installs it)");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("a line");
    assert_eq!(
        line.trim(),
        "READY",
        "the {client:?} responder said {line:?}"
    );
    Reaped { child, out }
}

/// Waits for a script responder to finish; it must say PASS.
fn wait_ok(mut r: Reaped) {
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut r.out, &mut rest).expect("its output");
    let status = r.child.wait().expect("wait");
    assert!(
        status.success() && rest.contains("PASS"),
        "the responder failed: {status}\n{rest}"
    );
}

fn run_script(client: Client, c: &TestConnector, channel: &str) {
    let out = script(client, "request", c, channel)
        .output()
        .expect("the client runs");
    assert!(
        out.status.success(),
        "the {client:?} requester failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One pairing on every backend.
fn pair(requester: Client, responder: Client) {
    TestConnector::each_backend(Settings::default(), |c| {
        let channel = format!("rpc.pair.{}", connector::kubemq::new_id());
        let rt = interop_tests::runtime();
        if responder == Client::Fe2o3 {
            let answered = spawn_fe2o3_responder(c, &channel);
            run_script(requester, c, &channel);
            answered.join().expect("the fe2o3 responder");
        } else {
            let child = start_responder(responder, c, &channel);
            if requester == Client::Fe2o3 {
                rt.block_on(fe2o3_request(&c.url(), &channel));
            } else {
                run_script(requester, c, &channel);
            }
            wait_ok(child);
        }
    });
}

/// Starts the fe2o3 responder on `c` in a thread of its own and returns once it is subscribed.
fn spawn_fe2o3_responder(c: &TestConnector, channel: &str) -> std::thread::JoinHandle<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (url, ch) = (c.url(), channel.to_string());
    let answered = std::thread::spawn(move || {
        interop_tests::runtime().block_on(fe2o3_respond(&url, &ch, ready_tx))
    });
    ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the fe2o3 responder is subscribed");
    answered
}

/// The responder side in fe2o3-amqp: a receiver per pattern, replies through a sender with a
/// target that has no address (the anonymous relay).
async fn fe2o3_respond(url: &str, channel: &str, ready: std::sync::mpsc::Sender<()>) {
    let mut conn = Connection::open("fe2o3-responder", url).await.unwrap();
    let mut session = Session::begin(&mut conn).await.unwrap();
    let mut replies = interop_tests::relay_sender(&mut session, "replies").await;
    let mut commands = Receiver::builder()
        .name("commands")
        .source(format!("commands/{channel}"))
        .credit_mode(CreditMode::Auto(10))
        .attach(&mut session)
        .await
        .unwrap();
    let mut queries = Receiver::builder()
        .name("queries")
        .source(format!("queries/{channel}"))
        .credit_mode(CreditMode::Auto(10))
        .attach(&mut session)
        .await
        .unwrap();
    ready.send(()).unwrap();
    for (receiver, is_command) in [(&mut commands, true), (&mut queries, false)] {
        for _ in 0..2 {
            let d = tokio::time::timeout(Duration::from_secs(20), receiver.recv::<Body<Value>>())
                .await
                .expect("a request in time")
                .unwrap();
            receiver.accept(&d).await.unwrap();
            let props = d.message().properties.clone().expect("RPC-12: properties");
            let to = props.reply_to.clone().expect("RPC-12: reply-to");
            assert!(to.starts_with("/responses/"), "{to}");
            let body = text(d.message().body.clone());
            let mut app = ApplicationProperties::builder();
            let reply_body = if is_command {
                let ok = body != "fail";
                app = app.insert(EXECUTED, ok);
                if !ok {
                    app = app.insert(ERROR, "command rejected by handler");
                }
                Body::Empty
            } else {
                Body::Value(fe2o3_amqp::types::messaging::AmqpValue(Value::String(
                    format!("result:{body}"),
                )))
            };
            let reply = Message::builder()
                .properties(
                    Properties::builder()
                        .to(to)
                        .correlation_id(props.correlation_id.clone().expect("RPC-12"))
                        .build(),
                )
                .application_properties(app.build())
                .body(reply_body)
                .build();
            let outcome = replies.send(reply).await.unwrap();
            assert!(
                matches!(outcome, Outcome::Accepted(_)),
                "RPC-13: {outcome:?}"
            );
        }
    }
    conn.close().await.unwrap();
}

/// The requester side in fe2o3-amqp: a dynamic reply node, one sender per pattern.
async fn fe2o3_request(url: &str, channel: &str) {
    let mut conn = Connection::open("fe2o3-requester", url).await.unwrap();
    let mut session = Session::begin(&mut conn).await.unwrap();
    let (mut replies, reply_to) = interop_tests::reply_node(&mut session, 10).await;
    let ask = |body: &str, corr: &str| {
        Message::builder()
            .properties(
                Properties::builder()
                    .reply_to(reply_to.clone())
                    .correlation_id(MessageId::String(corr.into()))
                    .build(),
            )
            .value(body.to_string())
            .build()
    };
    let mut commands = Sender::attach(&mut session, "commands", format!("commands/{channel}"))
        .await
        .unwrap();
    for (body, corr, executed) in [("reboot", "c1", true), ("fail", "c2", false)] {
        let outcome = commands.send(ask(body, corr)).await.unwrap();
        assert!(
            matches!(outcome, Outcome::Accepted(_)),
            "RPC-4: {outcome:?}"
        );
        let d = replies.recv::<Body<Value>>().await.unwrap();
        replies.accept(&d).await.unwrap();
        let m = d.message();
        let corr_got = m.properties.as_ref().and_then(|p| p.correlation_id.clone());
        assert_eq!(corr_got, Some(MessageId::String(corr.into())), "RPC-6");
        let app = m.application_properties.as_ref().expect("RPC-7");
        assert_eq!(
            app.get(EXECUTED),
            Some(&SimpleValue::Bool(executed)),
            "RPC-7"
        );
        if !executed {
            assert_eq!(
                app.get(ERROR),
                Some(&SimpleValue::String("command rejected by handler".into()))
            );
        }
    }
    let mut queries = Sender::attach(&mut session, "queries", format!("queries/{channel}"))
        .await
        .unwrap();
    for q in ["q1", "q2"] {
        let outcome = queries.send(ask(q, q)).await.unwrap();
        assert!(
            matches!(outcome, Outcome::Accepted(_)),
            "RPC-4: {outcome:?}"
        );
        let d = replies.recv::<Body<Value>>().await.unwrap();
        replies.accept(&d).await.unwrap();
        assert_eq!(
            text(d.message().body.clone()),
            format!("result:{q}"),
            "RPC-8"
        );
    }
    conn.close().await.unwrap();
}

/// An AmqpValue string body's text.
fn text(body: Body<Value>) -> String {
    match body {
        Body::Value(v) => match v.0 {
            Value::String(s) => s,
            other => panic!("a string body, got {other:?}"),
        },
        other => panic!("an AmqpValue body, got {other:?}"),
    }
}

/// RPC-1, RPC-7, RPC-8, RPC-12, RPC-13: proton asks, rhea answers.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton, rhea, go-amqp and Qpid JMS: tests/run.sh"
)]
fn rpc_proton_requester_rhea_responder() {
    pair(Client::Proton, Client::Rhea);
}

/// RPC-1, RPC-7, RPC-8, RPC-12, RPC-13, ADDR-18: rhea asks through one anonymous sender,
/// proton answers.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton, rhea, go-amqp and Qpid JMS: tests/run.sh"
)]
fn rpc_rhea_requester_proton_responder() {
    pair(Client::Rhea, Client::Proton);
}

/// RPC-1, RPC-7, RPC-8, RPC-12, RPC-13: proton asks, fe2o3 answers.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton, rhea, go-amqp and Qpid JMS: tests/run.sh"
)]
fn rpc_proton_requester_fe2o3_responder() {
    pair(Client::Proton, Client::Fe2o3);
}

/// RPC-1, RPC-7, RPC-8, RPC-12, RPC-13: fe2o3 asks, proton answers.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton, rhea, go-amqp and Qpid JMS: tests/run.sh"
)]
fn rpc_fe2o3_requester_proton_responder() {
    pair(Client::Fe2o3, Client::Proton);
}

/// RPC-1, RPC-7, RPC-8, RPC-12, RPC-13: rhea asks, fe2o3 answers.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton, rhea, go-amqp and Qpid JMS: tests/run.sh"
)]
fn rpc_rhea_requester_fe2o3_responder() {
    pair(Client::Rhea, Client::Fe2o3);
}

/// RPC-1, RPC-7, RPC-8, RPC-12, RPC-13: fe2o3 asks, rhea answers.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton, rhea, go-amqp and Qpid JMS: tests/run.sh"
)]
fn rpc_fe2o3_requester_rhea_responder() {
    pair(Client::Fe2o3, Client::Rhea);
}

/// The Qpid JMS requester (tests/java RpcRequester: TemporaryQueue, anonymous producer) against
/// a go-amqp responder (tests/go scenarios `respond`), on every backend. RPC-1, RPC-6, RPC-7,
/// RPC-8, ADDR-16 (Qpid JMS opens its anonymous producer only with ANONYMOUS-RELAY offered),
/// OP-ADDR-7 (the temporary queue is a node minted by a dynamic target).
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton, rhea, go-amqp and Qpid JMS: tests/run.sh"
)]
fn rpc_qpid_jms_requester_go_amqp_responder() {
    const GO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/go/bin");
    const JAVA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/java");
    let classpath = format!(
        "{JAVA}/target/classes:{}",
        std::fs::read_to_string(format!("{JAVA}/target/classpath.txt"))
            .expect("tests/run.sh builds tests/java and writes target/classpath.txt")
            .trim()
    );
    TestConnector::each_backend(Settings::default(), |c| {
        let channel = format!("rpc.jms.{}", connector::kubemq::new_id());
        let mut child = Command::new(format!("{GO}/scenarios"))
            .args(["respond", &c.url(), &channel])
            .stdout(Stdio::piped())
            .spawn()
            .expect("tests/run.sh builds the go scenarios");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("a line");
        assert_eq!(line.trim(), "READY", "the go-amqp responder said {line:?}");
        let responder = Reaped { child, out };
        let jms = Command::new("java")
            .args(["-cp", &classpath, "RpcRequester", &c.url(), &channel])
            .output()
            .expect("java is installed");
        assert!(
            jms.status.success() && String::from_utf8_lossy(&jms.stdout).contains("PASS"),
            "the Qpid JMS requester on the {} backend:\n{}\n{}",
            c.backend(),
            String::from_utf8_lossy(&jms.stdout),
            String::from_utf8_lossy(&jms.stderr)
        );
        wait_ok(responder);
    });
}

/// RPC-15, ADDR-12: replies travel through the broker's reply path, so a requester and a
/// responder on different connectors in front of one broker reach each other — two connectors
/// over gRPC to one store's façade (replicas in front of one KubeMQ), and a connector on the
/// embedded store serving its façade with a second connector over gRPC to it — each way round;
/// only a message sent straight to a dynamic node minted on the other connector is refused.
#[test]
fn rpc_15_requester_and_responder_on_different_connectors() {
    let broker = interop_tests::TestFacade::start();
    let a = TestConnector::start_over_facade(Settings::default(), &broker);
    let b = TestConnector::start_over_facade(Settings::default(), &broker);
    across(&a, &b);
    across(&b, &a);
    interop_tests::runtime().block_on(foreign_dynamic_node(&a.url(), &b.url()));

    let home = TestConnector::start(Settings::default());
    let served = interop_tests::TestFacade::serve_store(home.store().clone());
    let remote = TestConnector::start_over_facade(Settings::default(), &served);
    across(&home, &remote);
    across(&remote, &home);
    interop_tests::runtime().block_on(foreign_dynamic_node(&home.url(), &remote.url()));
}

/// The fe2o3 requester on `asks` against the fe2o3 responder on `answers`; afterwards neither
/// connector holds a request and the broker has none waiting.
fn across(asks: &TestConnector, answers: &TestConnector) {
    let channel = format!("rpc.nodes.{}", connector::kubemq::new_id());
    let answered = spawn_fe2o3_responder(answers, &channel);
    interop_tests::runtime().block_on(fe2o3_request(&asks.url(), &channel));
    answered.join().expect("the fe2o3 responder");
    asks.no_rpc_left();
    answers.no_rpc_left();
}

/// A sender on `other` addressing a dynamic node minted on `home` by `to` is rejected with
/// `amqp:precondition-failed` (ADDR-12), and the link stays usable (ADDR-18).
async fn foreign_dynamic_node(home: &str, other: &str) {
    use fe2o3_amqp::types::definitions::{AmqpError, ErrorCondition};
    let mut owner = Connection::open("owner", home).await.unwrap();
    let mut owner_session = Session::begin(&mut owner).await.unwrap();
    let (_node, address) = interop_tests::reply_node(&mut owner_session, 10).await;
    let mut stranger = Connection::open("stranger", other).await.unwrap();
    let mut session = Session::begin(&mut stranger).await.unwrap();
    let mut relay = interop_tests::relay_sender(&mut session, "relay").await;
    for _ in 0..2 {
        let message = Message::builder()
            .properties(Properties::builder().to(address.clone()).build())
            .value("straight to another connector's node")
            .build();
        match relay.send(message).await.unwrap() {
            Outcome::Rejected(r) => assert_eq!(
                r.error.map(|e| e.condition),
                Some(ErrorCondition::AmqpError(AmqpError::PreconditionFailed)),
                "ADDR-12"
            ),
            other => panic!("ADDR-12: rejected, got {other:?}"),
        }
    }
    stranger.close().await.unwrap();
    owner.close().await.unwrap();
}

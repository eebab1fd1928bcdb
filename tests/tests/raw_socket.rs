//! Raw-socket tests over a real connection to the connector (on its embedded store): one per
//! error condition the engine can trigger, plus idle timeout against a silent peer and shutdown.
//! Each cites its rule.

use std::time::Duration;

use connector::config::Settings;
use connector::engine::codec::Performative;
use connector::engine::peer::{self, begin, open};
use connector::engine::{HEADER_AMQP, HEADER_SASL};
use fe2o3_amqp_types::definitions::ReceiverSettleMode;
use fe2o3_amqp_types::performatives::{Attach, Transfer};
use interop_tests::TestConnector;
use serde_bytes::ByteBuf;
use testkit::raw::{condition, description, RawPeer, Received};

const WAIT: Duration = Duration::from_secs(3);

fn attach_sender(name: &str, handle: u32) -> Attach {
    peer::attach_sender(name, handle, "queues/raw")
}

fn transfer(handle: u32, id: u32, tag: &[u8], more: bool) -> Transfer {
    peer::transfer(handle, Some(id), Some(tag), false, more)
}

/// Header + OPEN (+ BEGIN) on a fresh socket, with the replies consumed.
fn session(server: &TestConnector) -> RawPeer {
    let mut p = RawPeer::connect(server.addr);
    p.write(&HEADER_AMQP);
    p.frame(0, &open("raw"), &[]);
    p.frame(0, &begin(), &[]);
    let got = p.read_until(WAIT, |r| {
        matches!(r, Received::Frame(_, Performative::Begin(_)))
    });
    assert!(
        got.iter()
            .any(|r| matches!(r, Received::Frame(_, Performative::Begin(_)))),
        "{got:?}"
    );
    p
}

fn conditions(got: &[Received]) -> Vec<String> {
    got.iter().filter_map(condition).collect()
}

fn expect(p: &mut RawPeer, cond: &str) -> Vec<Received> {
    let got = p.read_until(WAIT, |r| condition(r).is_some());
    assert_eq!(conditions(&got), [cond], "{got:?}");
    got
}

/// CONN-2: an unsupported header gets our SASL header back and the socket closes.
#[test]
fn conn_2_unsupported_header() {
    let server = TestConnector::start(Settings::default());
    let mut p = RawPeer::connect(server.addr);
    p.write(b"AMQP\x00\x00\x09\x01");
    let (got, closed) = p.read_all(WAIT);
    assert!(
        matches!(got[..], [Received::Header(h)] if h == HEADER_SASL),
        "{got:?}"
    );
    assert!(closed);
}

/// CONN-5: empty container-id → CLOSE `amqp:invalid-field`.
#[test]
fn conn_5_invalid_field() {
    let server = TestConnector::start(Settings::default());
    let mut p = RawPeer::connect(server.addr);
    p.write(&HEADER_AMQP);
    p.frame(0, &open(""), &[]);
    let got = expect(&mut p, "amqp:invalid-field");
    assert_eq!(
        got.iter().find_map(description).as_deref(),
        Some("open.container-id is required")
    );
}

/// CONN-13: a second OPEN → CLOSE `amqp:not-allowed`.
#[test]
fn conn_13_not_allowed() {
    let server = TestConnector::start(Settings::default());
    let mut p = session(&server);
    p.frame(0, &open("again"), &[]);
    expect(&mut p, "amqp:not-allowed");
}

/// CONN-18: a corrupt frame → CLOSE `amqp:decode-error`, then the socket closes.
#[test]
fn conn_18_decode_error() {
    let server = TestConnector::start(Settings::default());
    let mut p = session(&server);
    p.write(&[
        0, 0, 0, 23, 2, 0, 0, 0, 0x00, 0x53, 0x15, 0xc0, 0x0a, 0x02, 0x41, 0x43, 0xb0, 0xff, 0xff,
        0xff, 0xff, 0, 0,
    ]);
    expect(&mut p, "amqp:decode-error");
    let (_, closed) = p.read_all(Duration::from_secs(5));
    assert!(closed, "socket closed after the close wait");
}

/// CONN-11: a silent raw peer is closed with `amqp:resource-limit-exceeded` after
/// IdleTimeoutSeconds; the advertised idle-time-out is half of it (CONN-10).
#[test]
fn conn_11_idle_timeout_silent_peer() {
    let settings = Settings {
        idle_timeout_seconds: 1,
        ..Settings::default()
    };
    let server = TestConnector::start(settings);
    let mut p = RawPeer::connect(server.addr);
    p.write(&HEADER_AMQP);
    p.frame(0, &open("silent"), &[]);
    let got = p.read_until(WAIT, |r| condition(r).is_some());
    let idle = got.iter().find_map(|r| match r {
        Received::Frame(_, Performative::Open(o)) => o.idle_time_out,
        _ => None,
    });
    assert_eq!(idle, Some(500));
    assert_eq!(conditions(&got), ["amqp:resource-limit-exceeded"]);
    assert_eq!(
        got.iter().find_map(description).as_deref(),
        Some("idle timeout expired")
    );
}

/// CONN-15: over MaxConnections → OPEN then CLOSE `amqp:resource-limit-exceeded`.
#[test]
fn conn_15_max_connections() {
    let settings = Settings {
        max_connections: 1,
        ..Settings::default()
    };
    let server = TestConnector::start(settings);
    let _first = session(&server);
    let mut p = RawPeer::connect(server.addr);
    p.write(&HEADER_AMQP);
    p.frame(0, &open("second"), &[]);
    let got = expect(&mut p, "amqp:resource-limit-exceeded");
    assert!(got.iter().any(
        |r| matches!(r, Received::Frame(0, Performative::Open(o)) if o.container_id == "KubeMQ")
    ));
}

/// CONN-15 / CONN-16: while the broker does not answer, a connection gets OPEN then CLOSE
/// `amqp:not-allowed` `broker not ready`, a second after its OPEN; once it answers, connections are admitted; when it is
/// lost, the open ones are closed with `amqp:connection:forced` and new ones are refused again.
/// The connector here is the production set-up over gRPC (backend::readiness feeding the
/// listener), with KubeMQ played by the store's façade, started late on the address the
/// connector was given and stopped again.
#[test]
fn conn_15_16_broker_readiness() {
    use std::sync::Arc;
    use std::time::Instant;

    use connector::backend::grpc::KubemqGrpc;
    use connector::backend::readiness;
    use connector::bridge::Bridge;
    use connector::driver::{serve, ServeOptions};
    use connector::metrics::Metrics;
    use interop_tests::{ServerThread, TestFacade};

    // An address nobody listens on yet: KubeMQ is down.
    let kubemq = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let server = ServerThread::spawn(
        ([127, 0, 0, 1], 0).into(),
        move |listener, stop| async move {
            let settings = Settings::default();
            let backend =
                KubemqGrpc::connect(&kubemq.to_string(), Default::default()).expect("client");
            let ready = readiness::watch(Arc::new(backend.clone())).await;
            let opts = ServeOptions {
                max_connections: settings.max_connections,
                shutdown_grace: Duration::from_secs(5),
                broker_ready: Some(ready),
            };
            let bridge = Bridge::new(
                backend,
                &settings,
                Arc::new(Metrics::new()),
                connector::auth::Access::open(),
            );
            let cfg = Arc::new(settings.engine_config_no_auth());
            // CONN-15's pause is the observed handler's.
            let observed = connector::observed::Observing::new(bridge, Default::default());
            serve(listener, cfg, opts, Arc::new(observed), async {
                let _ = stop.await;
            })
            .await;
        },
    );
    let mut p = RawPeer::connect(server.addr);
    p.write(&HEADER_AMQP);
    let asked = Instant::now();
    p.frame(0, &open("early"), &[]);
    let got = expect(&mut p, "amqp:not-allowed");
    // The refusal waits a second, so a client that reconnects at once does not spin.
    assert!(
        asked.elapsed() >= Duration::from_millis(900),
        "refused after {:?}",
        asked.elapsed()
    );
    assert!(
        got.iter().any(
            |r| matches!(r, Received::Frame(0, Performative::Open(o)) if o.container_id == "KubeMQ")
        ),
        "OPEN first: {got:?}"
    );
    assert!(
        got.iter()
            .any(|r| description(r).as_deref() == Some("broker not ready")),
        "{got:?}"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let kubemq_up = TestFacade::start_at(dir.path(), Some(kubemq));
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut admitted = loop {
        let mut p = RawPeer::connect(server.addr);
        p.write(&HEADER_AMQP);
        p.frame(0, &open("later"), &[]);
        p.frame(0, &begin(), &[]);
        let got = p.read_until(WAIT, |r| {
            matches!(r, Received::Frame(_, Performative::Begin(_))) || condition(r).is_some()
        });
        if got
            .iter()
            .any(|r| matches!(r, Received::Frame(_, Performative::Begin(_))))
        {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "still refused with KubeMQ up: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };

    // KubeMQ goes away: the open connection is closed, new ones are refused.
    drop(kubemq_up);
    let got = admitted.read_until(Duration::from_secs(15), |r| condition(r).is_some());
    assert_eq!(
        got.iter().filter_map(condition).collect::<Vec<_>>(),
        ["amqp:connection:forced"],
        "{got:?}"
    );
    let mut p = RawPeer::connect(server.addr);
    p.write(&HEADER_AMQP);
    p.frame(0, &open("after"), &[]);
    expect(&mut p, "amqp:not-allowed");
}

/// CONN-16: shutdown closes every connection with `amqp:connection:forced`.
#[test]
fn conn_16_shutdown_forced() {
    let server = TestConnector::start(Settings::default());
    let mut p = session(&server);
    let stopper = std::thread::spawn(move || server.shutdown());
    expect(&mut p, "amqp:connection:forced");
    p.frame(
        0,
        &fe2o3_amqp_types::performatives::Close { error: None },
        &[],
    );
    stopper.join().unwrap();
}

/// SESS-2: a BEGIN beyond SessionMax → END `amqp:resource-limit-exceeded`.
#[test]
fn sess_2_session_limit() {
    let settings = Settings {
        session_max: 1,
        ..Settings::default()
    };
    let server = TestConnector::start(settings);
    let mut p = session(&server);
    p.frame(1, &begin(), &[]);
    expect(&mut p, "amqp:resource-limit-exceeded");
}

/// SESS-5: a TRANSFER on an unattached handle → END `amqp:session:errant-link`.
#[test]
fn sess_5_errant_link() {
    let server = TestConnector::start(Settings::default());
    let mut p = session(&server);
    p.frame(0, &transfer(7, 0, b"t", false), b"\x00\x53\x77\x40");
    expect(&mut p, "amqp:session:errant-link");
}

/// SESS-4: transfers pipelined past the session window → END `amqp:session:window-violation`.
#[test]
fn sess_4_window_violation() {
    // Link credit above the burst, so only the session window can be exceeded.
    let settings = Settings {
        max_unsettled_per_link: 5000,
        ..Settings::default()
    };
    let server = TestConnector::start(settings);
    let mut p = session(&server);
    p.frame(0, &attach_sender("w", 0), &[]);
    p.read_until(WAIT, |r| {
        matches!(r, Received::Frame(_, Performative::Flow(_)))
    });
    // The whole burst goes out in one write, so it reaches the server before any FLOW of ours
    // could have reached us: frame 2049 is a real violation, not a race we lost.
    let mut burst = Vec::new();
    for i in 0..2100u32 {
        let mut t = transfer(0, i, &[(i % 251) as u8], false);
        t.settled = Some(true);
        t.message_format = None;
        burst.extend(testkit::raw::frame_bytes(0, &t, b"\x00\x53\x77\x40"));
    }
    assert!(
        burst.len() < 64 * 1024,
        "burst of {} bytes fits one read",
        burst.len()
    );
    p.write(&burst);
    expect(&mut p, "amqp:session:window-violation");
}

/// LINK-2: `rcv-settle-mode = second` → DETACH `amqp:not-implemented`.
#[test]
fn link_2_second_not_implemented() {
    let server = TestConnector::start(Settings::default());
    let mut p = session(&server);
    let mut a = attach_sender("s", 0);
    a.rcv_settle_mode = ReceiverSettleMode::Second;
    p.frame(0, &a, &[]);
    expect(&mut p, "amqp:not-implemented");
}

/// LINK-2: a duplicate live link name → DETACH `amqp:not-allowed`, `duplicate link name`.
#[test]
fn link_2_duplicate_name() {
    let server = TestConnector::start(Settings::default());
    let mut p = session(&server);
    p.frame(0, &attach_sender("dup", 0), &[]);
    p.frame(0, &attach_sender("dup", 1), &[]);
    let got = expect(&mut p, "amqp:not-allowed");
    assert_eq!(
        got.iter().find_map(description).as_deref(),
        Some("duplicate link name")
    );
}

/// LINK-2 step 3: over MaxLinksPerSession → DETACH `amqp:resource-limit-exceeded`.
#[test]
fn link_2_link_limit() {
    let settings = Settings {
        max_links_per_session: 1,
        ..Settings::default()
    };
    let server = TestConnector::start(settings);
    let mut p = session(&server);
    p.frame(0, &attach_sender("a", 0), &[]);
    p.frame(0, &attach_sender("b", 1), &[]);
    expect(&mut p, "amqp:resource-limit-exceeded");
}

/// XFER-2: one byte over MaxMessageSize → rejected, then DETACH
/// `amqp:link:message-size-exceeded`.
#[test]
fn xfer_2_message_size_exceeded() {
    let settings = Settings {
        max_message_size: 100,
        ..Settings::default()
    };
    let server = TestConnector::start(settings);
    let mut p = session(&server);
    p.frame(0, &attach_sender("big", 0), &[]);
    p.read_until(WAIT, |r| {
        matches!(r, Received::Frame(_, Performative::Flow(_)))
    });
    p.frame(0, &transfer(0, 0, b"a", true), &[0x40; 60]);
    p.frame(0, &transfer(0, 0, b"a", false), &[0x40; 41]);
    let got = expect(&mut p, "amqp:link:message-size-exceeded");
    assert!(got
        .iter()
        .any(|r| matches!(r, Received::Frame(_, Performative::Disposition(d)) if d.settled)));
}

/// OP-LINK-6: a transfer beyond link credit → DETACH `amqp:not-allowed`.
#[test]
fn transfer_beyond_credit_not_allowed() {
    let settings = Settings {
        max_unsettled_per_link: 1,
        ..Settings::default()
    };
    let server = TestConnector::start(settings);
    let mut p = session(&server);
    p.frame(0, &attach_sender("c", 0), &[]);
    p.read_until(WAIT, |r| {
        matches!(r, Received::Frame(_, Performative::Flow(_)))
    });
    // Both in one write: the second arrives before any refill could have been seen.
    let mut two = testkit::raw::frame_bytes(0, &transfer(0, 0, b"a", false), b"\x00\x53\x77\x40");
    two.extend(testkit::raw::frame_bytes(
        0,
        &transfer(0, 1, b"b", false),
        b"\x00\x53\x77\x40",
    ));
    p.write(&two);
    let got = expect(&mut p, "amqp:not-allowed");
    assert_eq!(
        got.iter().find_map(description).as_deref(),
        Some("transfer exceeds link credit")
    );
}

/// LINK-7: an ATTACH offering unsettled state → DETACH `amqp:not-allowed`,
/// `link re-attach not supported`.
#[test]
fn reattach_not_allowed() {
    let server = TestConnector::start(Settings::default());
    let mut p = session(&server);
    let mut a = attach_sender("resume", 0);
    let mut unsettled = fe2o3_amqp_types::primitives::OrderedMap::new();
    unsettled.insert(ByteBuf::from(vec![1u8]), None);
    a.unsettled = Some(unsettled);
    p.frame(0, &a, &[]);
    let got = expect(&mut p, "amqp:not-allowed");
    assert_eq!(
        got.iter().find_map(description).as_deref(),
        Some("link re-attach not supported")
    );
}

/// A delivery tag over 32 bytes → DETACH `amqp:invalid-field`.
#[test]
fn long_delivery_tag_invalid_field() {
    let server = TestConnector::start(Settings::default());
    let mut p = session(&server);
    p.frame(0, &attach_sender("tag", 0), &[]);
    p.read_until(WAIT, |r| {
        matches!(r, Received::Frame(_, Performative::Flow(_)))
    });
    p.frame(0, &transfer(0, 0, &[1; 40], false), b"\x00\x53\x77\x40");
    expect(&mut p, "amqp:invalid-field");
}

/// The queues bridge's attach-time refusals over a real socket, each prompt (LINK-5): unknown
/// prefix → not-found (ADDR-7), invalid channel → not-found (ADDR-6, with KubeMQ's further
/// rules: no leading `.`, no `..`), `copy` → invalid-field (Q-35; Q-37: no browse), a
/// selector → not-implemented with the documented text, a receiver on `responses/` →
/// not-allowed (ADDR-10).
#[test]
fn queues_bridge_attach_refusals() {
    use fe2o3_amqp_types::messaging::DistributionMode;
    use fe2o3_amqp_types::primitives::{OrderedMap, Symbol};
    interop_tests::TestConnector::each_backend(Settings::default(), |c| {
        let mut p = RawPeer::connect(c.addr);
        p.write(&HEADER_AMQP);
        p.frame(0, &open("refusals"), &[]);
        p.frame(0, &begin(), &[]);
        let mut copy = peer::attach_receiver("copy", 4, "queues/a");
        if let Some(s) = copy.source.as_mut() {
            s.distribution_mode = Some(DistributionMode::Copy);
        }
        let mut selector = peer::attach_receiver("sel", 5, "queues/a");
        if let Some(s) = selector.source.as_mut() {
            let mut f = OrderedMap::new();
            let described = serde_amqp::described::Described {
                descriptor: serde_amqp::descriptor::Descriptor::Name(Symbol::from(
                    "apache.org:selector-filter:string",
                )),
                value: serde_amqp::Value::String("a = 1".into()),
            };
            f.insert(
                Symbol::from("jms-selector"),
                serde_amqp::Value::Described(Box::new(described)),
            );
            s.filter = Some(f);
        }
        let cases = vec![
            (
                peer::attach_sender("unknown", 0, "bogus/prefix/x"),
                "amqp:not-found",
                Some("unknown address prefix"),
            ),
            (
                peer::attach_sender("bad", 1, "queues/a b"),
                "amqp:not-found",
                Some("channel contains whitespace"),
            ),
            // KubeMQ refuses these names on send and cannot Get from them: a receiver is refused
            // at attach, not left with a Get loop that fails forever.
            (
                peer::attach_receiver("leading-dot", 6, "queues/.orders"),
                "amqp:not-found",
                Some("channel has leading '.'"),
            ),
            (
                peer::attach_receiver("empty-segment", 7, "queues/a..b"),
                "amqp:not-found",
                Some("channel has an empty segment '..'"),
            ),
            (
                peer::attach_receiver("tab", 8, "queues/a\tb"),
                "amqp:not-found",
                Some("channel contains whitespace"),
            ),
            (
                peer::attach_receiver("responses", 3, "responses/abc"),
                "amqp:not-allowed",
                None,
            ),
            (copy, "amqp:invalid-field", None),
            (
                selector,
                "amqp:not-implemented",
                Some("selector filter not supported on this address"),
            ),
        ];
        for (attach, cond, text) in cases {
            let name = attach.name.clone();
            p.frame(0, &attach, &[]);
            let got = p.read_until(WAIT, |r| condition(r).is_some());
            assert_eq!(conditions(&got), [cond], "{name}: {got:?}");
            if let Some(t) = text {
                assert_eq!(
                    got.iter().find_map(description).as_deref(),
                    Some(t),
                    "{name}"
                );
            }
        }
    });
}

//! Engine tests: scripted frames in, frames and events out, each citing the rule it pins.

mod harness;
mod proptests;

use std::time::Duration;

use fe2o3_amqp_types::definitions::{ReceiverSettleMode, Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{Accepted, DeliveryState, Released};
use fe2o3_amqp_types::performatives::{Close, Flow};
use fe2o3_amqp_types::primitives::OrderedMap;
use fe2o3_amqp_types::sasl::{SaslCode, SaslInit};
use serde_bytes::ByteBuf;

use super::codec::Performative;
use super::{
    AmqpError, AuthPolicy, Condition, DeliveryOutcome, EngineConfig, Event, LinkAccept, SaslResult,
    Transport, HEADER_AMQP, HEADER_SASL, HEADER_TLS,
};
use harness::*;

fn conditions(out: &[Out]) -> Vec<String> {
    out.iter().filter_map(condition_of).collect()
}

fn accept(c: &mut Client, link: u64, window: u32) -> Vec<Out> {
    c.conn
        .accept_link(
            link,
            LinkAccept {
                credit_window: window,
            },
        )
        .unwrap();
    c.collect()
}

/// Attaches and accepts a client sender; returns its link id.
fn producer(c: &mut Client, name: &str, handle: u32, window: u32) -> u64 {
    let id = c.request_link(0, &attach_sender(name, handle, "queues/a"));
    accept(c, id, window);
    id
}

/// Attaches and accepts a client receiver; returns its link id.
fn consumer(c: &mut Client, name: &str, handle: u32) -> u64 {
    let id = c.request_link(0, &attach_receiver(name, handle, "queues/a"));
    accept(c, id, 0);
    id
}

// ---------------------------------------------------------------- protocol header (CONN-1..3)

/// CONN-1: the bare AMQP header is echoed before any frame.
#[test]
fn conn_1_amqp_header_echoed() {
    let mut c = Client::new(config());
    let out = c.raw(&HEADER_AMQP);
    assert!(matches!(out[..], [Out::Header(h)] if h == HEADER_AMQP));
}

/// CONN-1 / SASL-1: the SASL header is echoed, then SASL-MECHANISMS lists PLAIN and ANONYMOUS.
#[test]
fn conn_1_sasl_header_and_mechanisms() {
    let mut c = Client::new(config());
    let out = c.raw(&HEADER_SASL);
    assert!(matches!(out[0], Out::Header(h) if h == HEADER_SASL));
    let Out::Mechanisms(m) = &out[1] else {
        panic!("{out:?}")
    };
    let names: Vec<&str> = m
        .sasl_server_mechanisms
        .0
        .iter()
        .map(|s| s.as_str())
        .collect();
    assert_eq!(names, ["PLAIN", "ANONYMOUS"]);
}

/// CONN-3: SASL ANONYMOUS, outcome ok, a fresh AMQP header echoed, then OPEN; the header bytes may
/// arrive split across reads.
#[test]
fn conn_3_sasl_then_amqp() {
    let mut c = Client::new(config());
    c.raw(&HEADER_SASL);
    let init = SaslInit {
        mechanism: "ANONYMOUS".into(),
        initial_response: None,
        hostname: None,
    };
    let out = c.raw(&sasl_frame(&init));
    assert!(
        matches!(&out[..], [Out::Outcome(o)] if o.code == SaslCode::Ok),
        "{out:?}"
    );
    assert!(c.raw(&HEADER_AMQP[..3]).is_empty());
    let out = c.raw(&HEADER_AMQP[3..]);
    assert!(matches!(out[..], [Out::Header(h)] if h == HEADER_AMQP));
    let out = c.frame(0, &open("c"));
    assert!(matches!(out[0], Out::Frame(0, Performative::Open(_))));
}

/// CONN-1: `AMQP 2 1 0 0` is accepted on the TLS listener and echoed.
#[test]
fn conn_1_tls_header_on_tls_listener() {
    let mut c = Client::with(
        config(),
        Transport::Tls {
            client_certificate: None,
        },
        None,
    );
    let out = c.raw(&HEADER_TLS);
    assert!(matches!(out[..], [Out::Header(h)] if h == HEADER_TLS));
    let out = c.raw(&HEADER_AMQP);
    assert!(matches!(out[..], [Out::Header(h)] if h == HEADER_AMQP));
}

/// CONN-2: `AMQP 2 1 0 0` on the plain listener, the 0-9-1 header and junk are answered with our
/// preferred (SASL) header and the connection closes.
#[test]
fn conn_2_unsupported_headers() {
    for bad in [
        &HEADER_TLS[..],
        b"AMQP\x00\x00\x09\x01",
        b"GET / HTTP/1.1\r\n",
    ] {
        let mut c = Client::new(config());
        let out = c.raw(bad);
        assert!(
            matches!(out[..], [Out::Header(h)] if h == HEADER_SASL),
            "{out:?}"
        );
        assert!(c.conn.is_closed());
    }
}

/// CONN-2: a peer that never completes its header gets nothing written and is dropped.
#[test]
fn conn_2_incomplete_header_then_loss() {
    let mut c = Client::new(config());
    assert!(c.raw(b"AMQ").is_empty());
    c.conn.transport_lost();
    assert!(c.collect().is_empty());
    assert!(c.conn.is_closed());
}

/// The handshake deadline drops a peer that never sends OPEN.
#[test]
fn handshake_timeout_drops_silent_peer() {
    let mut c = Client::new(config());
    c.raw(&HEADER_AMQP);
    c.advance(Duration::from_secs(31));
    assert!(c.conn.is_closed());
}

// ---------------------------------------------------------------- SASL

/// SASL-5 / ERR-4: a mechanism not offered fails with the `auth` code and nothing else.
#[test]
fn sasl_unknown_mechanism_fails_with_code_only() {
    let mut c = Client::new(config());
    c.raw(&HEADER_SASL);
    let init = SaslInit {
        mechanism: "SCRAM-SHA-256".into(),
        initial_response: Some(ByteBuf::from(vec![1, 2])),
        hostname: None,
    };
    let out = c.raw(&sasl_frame(&init));
    assert!(
        matches!(&out[..], [Out::Outcome(o)] if o.code == SaslCode::Auth && o.additional_data.is_none())
    );
    assert!(c.conn.is_closed());
}

/// SASL-8: an initial response over 16 KiB fails authentication.
#[test]
fn sasl_8_initial_response_cap() {
    for (len, ok) in [(16 * 1024, true), (16 * 1024 + 1, false)] {
        let mut c = Client::new(config());
        c.raw(&HEADER_SASL);
        let mut resp = b"\0user\0".to_vec();
        resp.resize(len, b'x');
        let init = SaslInit {
            mechanism: "PLAIN".into(),
            initial_response: Some(ByteBuf::from(resp)),
            hostname: None,
        };
        let out = c.raw(&sasl_frame(&init));
        let Out::Outcome(o) = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(o.code == SaslCode::Ok, ok, "len {len}");
    }
}

/// SASL-6: PLAIN's sanitized username becomes the ClientID.
#[test]
fn sasl_6_plain_username_is_client_id() {
    let mut c = Client::new(config());
    c.raw(&HEADER_SASL);
    let init = SaslInit {
        mechanism: "PLAIN".into(),
        initial_response: Some(ByteBuf::from(b"\0svc.orders\0secret".to_vec())),
        hostname: None,
    };
    c.raw(&sasl_frame(&init));
    c.raw(&HEADER_AMQP);
    c.frame(0, &open("container-9"));
    let evs = c.take_events();
    assert!(
        matches!(&evs[0], Event::Authenticated(r) if r.mechanism == "plain"
            && r.username.as_deref() == Some("svc.orders")
            && r.outcome == SaslResult::Success { client_id: "svc_orders".into() }),
        "{evs:?}"
    );
    assert!(matches!(&evs[1], Event::Opened { client_id, .. } if client_id == "svc_orders"));
}

/// A verifier that takes the token `good` as ClientID `svc-a`.
struct OneToken;
impl crate::TokenVerifier for OneToken {
    fn verify(&self, token: &str) -> Result<crate::VerifiedToken, crate::AuthFailure> {
        match token {
            "good" => Ok("svc-a".into()),
            "short" => Ok(crate::VerifiedToken {
                client_id: "svc-a".into(),
                valid_for: Some(Duration::from_secs(4)),
            }),
            _ => Err(crate::AuthFailure("signature is invalid".into())),
        }
    }
}

fn jwt_config() -> EngineConfig {
    EngineConfig {
        auth: AuthPolicy::Jwt(std::sync::Arc::new(OneToken)),
        ..config()
    }
}

fn mechanisms_of(out: &[Out]) -> Vec<String> {
    let Some(Out::Mechanisms(m)) = out.get(1) else {
        panic!("{out:?}")
    };
    m.sasl_server_mechanisms
        .0
        .iter()
        .map(|s| s.as_str().to_string())
        .collect()
}

/// SASL-13: a connection whose token expires 4 s after it authenticated is closed then with
/// `amqp:unauthorized-access`, and not before; the engine asks to be woken for it.
#[test]
fn sasl_13_connection_closed_when_its_token_expires() {
    let mut c = Client::new(jwt_config());
    c.raw(&HEADER_SASL);
    let init = SaslInit {
        mechanism: "PLAIN".into(),
        initial_response: Some(ByteBuf::from(b"\0bob\0short".to_vec())),
        hostname: None,
    };
    let authenticated_at = c.now;
    c.raw(&sasl_frame(&init));
    c.raw(&HEADER_AMQP);
    c.frame(0, &open("container-13"));
    c.frame(0, &begin());
    let is_close = |o: &&Out| matches!(o, Out::Frame(_, Performative::Close(_)));
    let out = c.advance(Duration::from_secs(3));
    assert!(!out.iter().any(|o| is_close(&o)), "closed early: {out:?}");
    assert_eq!(
        c.conn.poll_timeout(),
        Some(authenticated_at + Duration::from_secs(4)),
        "the expiry is the next timer"
    );
    let out = c.advance(Duration::from_secs(1));
    let close = out.iter().find(is_close);
    assert_eq!(
        close.and_then(condition_of).as_deref(),
        Some("amqp:unauthorized-access"),
        "{out:?}"
    );
    assert_eq!(
        close.and_then(description_of).as_deref(),
        Some("token expired")
    );
}

/// SASL-1, SASL-3, SASL-5: with authentication on only PLAIN is offered; a good token opens
/// the connection as its ClientID and carries the token to the application; ANONYMOUS fails.
#[test]
fn sasl_3_jwt_plain() {
    let mut c = Client::new(jwt_config());
    let out = c.raw(&HEADER_SASL);
    assert_eq!(mechanisms_of(&out), ["PLAIN"]);
    let init = SaslInit {
        mechanism: "PLAIN".into(),
        initial_response: Some(ByteBuf::from(b"\0bob\0good".to_vec())),
        hostname: None,
    };
    let out = c.raw(&sasl_frame(&init));
    assert!(matches!(&out[..], [Out::Outcome(o)] if o.code == SaslCode::Ok));
    c.raw(&HEADER_AMQP);
    c.frame(0, &open("container-9"));
    let evs = c.take_events();
    assert!(
        matches!(&evs[0], Event::Authenticated(r) if r.username.as_deref() == Some("bob")
            && r.outcome == SaslResult::Success { client_id: "svc-a".into() })
    );
    let Event::Opened {
        client_id,
        credential,
        ..
    } = &evs[1]
    else {
        panic!("{evs:?}")
    };
    assert_eq!(client_id, "svc-a");
    assert_eq!(credential.as_ref().map(|c| c.expose()), Some("good"));

    for (mechanism, response) in [("PLAIN", &b"\0bob\0forged"[..]), ("ANONYMOUS", b"")] {
        let mut c = Client::new(jwt_config());
        c.raw(&HEADER_SASL);
        let init = SaslInit {
            mechanism: mechanism.into(),
            initial_response: Some(ByteBuf::from(response.to_vec())),
            hostname: None,
        };
        let out = c.raw(&sasl_frame(&init));
        // ERR-4: the outcome has the code only.
        assert!(
            matches!(&out[..], [Out::Outcome(o)] if o.code == SaslCode::Auth && o.additional_data.is_none()),
            "{out:?}"
        );
        let evs = c.take_events();
        assert!(
            matches!(&evs[0], Event::Authenticated(r) if matches!(r.outcome, SaslResult::Failure { .. })
                && r.mechanism == mechanism.to_ascii_lowercase()),
            "{evs:?}"
        );
        assert!(!c.conn.is_open());
    }
}

/// SASL-9: the bare AMQP header is refused with authentication on (the SASL header is offered
/// back); it is accepted with authentication off.
#[test]
fn sasl_9_bare_header_needs_auth_off() {
    let mut c = Client::new(jwt_config());
    let out = c.raw(&HEADER_AMQP);
    assert!(
        matches!(out[..], [Out::Header(h)] if h == HEADER_SASL),
        "{out:?}"
    );
    assert!(c.conn.is_closed());
    let mut c = Client::new(config());
    let out = c.raw(&HEADER_AMQP);
    assert!(matches!(out[..], [Out::Header(h)] if h == HEADER_AMQP));
}

/// SASL-7, SASL-6 (3): on an mTLS connection EXTERNAL is offered first and the identity is the
/// certificate's sanitized CN; AUD-1 reports it as `external`.
#[test]
fn sasl_7_external_offered_first_on_mtls() {
    let transport = Transport::Tls {
        client_certificate: Some(crate::ClientCertificate {
            common_name: "billing.prod".into(),
        }),
    };
    let mut c = Client::with(jwt_config(), transport, None);
    let out = c.raw(&HEADER_SASL);
    assert_eq!(mechanisms_of(&out), ["EXTERNAL", "PLAIN"]);
    let init = SaslInit {
        mechanism: "EXTERNAL".into(),
        initial_response: None,
        hostname: None,
    };
    let out = c.raw(&sasl_frame(&init));
    assert!(matches!(&out[..], [Out::Outcome(o)] if o.code == SaslCode::Ok));
    c.raw(&HEADER_AMQP);
    c.frame(0, &open("c"));
    let evs = c.take_events();
    assert!(
        matches!(&evs[0], Event::Authenticated(r) if r.mechanism == "external"
            && r.outcome == SaslResult::Success { client_id: "billing_prod".into() })
    );
    assert!(
        matches!(&evs[1], Event::Opened { client_id, credential: None, .. } if client_id == "billing_prod")
    );
    // TLS-3: plain TLS never offers EXTERNAL.
    let mut c = Client::with(
        config(),
        Transport::Tls {
            client_certificate: None,
        },
        None,
    );
    let out = c.raw(&HEADER_SASL);
    assert_eq!(mechanisms_of(&out), ["PLAIN", "ANONYMOUS"]);
}

/// AUD-1, SASL-6 (4): an ANONYMOUS success is reported once OPEN names the ClientID (the
/// sanitized container-id), before the Opened event; one that never opens is reported at the end
/// with an empty ClientID.
#[test]
fn aud_1_anonymous_reported_at_open() {
    let anonymous = SaslInit {
        mechanism: "ANONYMOUS".into(),
        initial_response: None,
        hostname: None,
    };
    let mut c = Client::new(config());
    c.raw(&HEADER_SASL);
    c.raw(&sasl_frame(&anonymous));
    assert!(c.take_events().is_empty());
    c.raw(&HEADER_AMQP);
    c.frame(0, &open("app 7"));
    let evs = c.take_events();
    assert!(
        matches!(&evs[0], Event::Authenticated(r) if r.mechanism == "anonymous"
            && r.outcome == SaslResult::Success { client_id: "app_7".into() }),
        "{evs:?}"
    );
    assert!(matches!(&evs[1], Event::Opened { .. }));

    let mut c = Client::new(config());
    c.raw(&HEADER_SASL);
    c.raw(&sasl_frame(&anonymous));
    c.conn.transport_lost();
    let evs = c.take_events();
    assert!(
        matches!(&evs[0], Event::Authenticated(r) if r.outcome == SaslResult::Success { client_id: String::new() }),
        "{evs:?}"
    );
    assert!(matches!(&evs[1], Event::Closed { .. }));
}

/// A garbage SASL frame fails authentication instead of crashing.
#[test]
fn sasl_garbage_frame() {
    let mut c = Client::new(config());
    c.raw(&HEADER_SASL);
    let out = c.raw(&[0, 0, 0, 12, 2, 1, 0, 0, 0x00, 0xb3, 0x7f, 0xff]);
    assert!(
        matches!(&out[..], [Out::Outcome(o)] if o.code == SaslCode::Auth),
        "{out:?}"
    );
}

// ---------------------------------------------------------------- OPEN (CONN-5..15)

/// CONN-5: empty container-id → OPEN then CLOSE `amqp:invalid-field` with the documented text.
#[test]
fn conn_5_empty_container_id() {
    let mut c = Client::new(config());
    c.raw(&HEADER_AMQP);
    let out = c.frame(0, &open(""));
    assert!(matches!(out[0], Out::Frame(0, Performative::Open(_))));
    assert_eq!(condition_of(&out[1]).as_deref(), Some("amqp:invalid-field"));
    assert_eq!(
        description_of(&out[1]).as_deref(),
        Some("open.container-id is required")
    );
    assert!(!c.conn.is_open());
}

/// CONN-6: the container-id is sanitized into the ClientID.
#[test]
fn conn_6_container_id_sanitized() {
    let mut c = Client::new(config());
    c.raw(&HEADER_AMQP);
    c.frame(0, &open("my app/1"));
    let evs = c.take_events();
    assert!(
        matches!(&evs[0], Event::Opened { client_id, container_id, .. } if client_id == "my_app_1" && container_id == "my app/1")
    );
}

/// CONN-7..10: the server OPEN has container-id, max-frame-size, channel-max, idle-time-out;
/// ADDR-16: and offers ANONYMOUS-RELAY.
#[test]
fn conn_7_server_open_fields() {
    let mut c = Client::new(config());
    let o = c.open();
    assert_eq!(o.container_id, "KubeMQ");
    assert_eq!(
        o.max_frame_size.0, 131_072,
        "CONN-8: min(client, MaxFrameSize)"
    );
    assert_eq!(o.channel_max.0, 255, "CONN-9: min(client, SessionMax - 1)");
    assert_eq!(
        o.idle_time_out,
        Some(60_000),
        "CONN-10: IdleTimeoutSeconds * 1000 / 2"
    );
    assert!(o.hostname.is_none() && o.properties.is_none());
    let offered: Vec<&str> = o
        .offered_capabilities
        .as_ref()
        .map(|a| a.0.iter().map(|s| s.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(offered, ["ANONYMOUS-RELAY"], "ADDR-16");
    assert!(o.desired_capabilities.is_none());
}

/// ADDR-20 / GEN-6: there is no vhost. The OPEN hostname is reported and otherwise ignored: the
/// server answers a client that names one exactly as one that does not.
#[test]
fn addr_20_open_hostname_is_ignored() {
    let answer = |hostname: Option<&str>| {
        let mut c = Client::new(config());
        c.raw(&HEADER_AMQP);
        let mut o = open("client-20");
        o.hostname = hostname.map(Into::into);
        let opened = c.frame(0, &o);
        let evs = c.take_events();
        assert!(
            matches!(&evs[..], [Event::Opened { hostname: h, .. }] if h.as_deref() == hostname),
            "{evs:?}"
        );
        let begun = c.frame(0, &begin());
        (format!("{opened:?} {begun:?}"), c.conn.is_closed())
    };
    let (plain, plain_closed) = answer(None);
    let (named, named_closed) = answer(Some("vhost-a"));
    assert!(!plain_closed && !named_closed);
    assert_eq!(plain, named, "the same OPEN and BEGIN either way");
}

/// CONN-8 / CONN-9: smaller client values win; the frame size never drops below 512.
#[test]
fn conn_8_9_negotiation_takes_minimum() {
    let mut c = Client::new(config());
    c.raw(&HEADER_AMQP);
    let mut o = open("c");
    o.max_frame_size = 100.into();
    o.channel_max = 3.into();
    let out = c.frame(0, &o);
    let Out::Frame(0, Performative::Open(s)) = &out[0] else {
        panic!()
    };
    assert_eq!((s.max_frame_size.0, s.channel_max.0), (512, 3));
    assert_eq!(c.conn.max_frame_size(), 512);
}

/// CONN-10 / OP-LINK-4: with IdleTimeoutSeconds = 0 the idle-time-out field is omitted.
#[test]
fn conn_10_idle_disabled_omits_field() {
    let mut cfg = config();
    cfg.idle_timeout = None;
    let mut c = Client::new(cfg);
    assert_eq!(c.open().idle_time_out, None);
    assert!(c.conn.poll_timeout().is_none());
}

/// CONN-11: silence for IdleTimeoutSeconds → CLOSE `amqp:resource-limit-exceeded`,
/// `idle timeout expired`; any inbound bytes reset the clock.
#[test]
fn conn_11_idle_timeout_closes() {
    let mut c = Client::new(config());
    c.open();
    c.advance(Duration::from_secs(100));
    c.raw(&[0, 0, 0, 8, 2, 0, 0, 0]); // heartbeat
    let out = c.advance(Duration::from_secs(100));
    assert!(conditions(&out).is_empty(), "{out:?}");
    let out = c.advance(Duration::from_secs(21));
    assert_eq!(conditions(&out), ["amqp:resource-limit-exceeded"]);
    assert_eq!(
        description_of(&out[0]).as_deref(),
        Some("idle timeout expired")
    );
    assert!(c
        .take_events()
        .iter()
        .any(|e| matches!(e, Event::Closed { .. })));
}

/// CONN-12: empty frames at half the client's idle-time-out.
#[test]
fn conn_12_heartbeats_at_half_client_interval() {
    let mut c = Client::new(config());
    c.raw(&HEADER_AMQP);
    let mut o = open("c");
    o.idle_time_out = Some(1000);
    c.frame(0, &o);
    assert!(c.advance(Duration::from_millis(400)).is_empty());
    let out = c.advance(Duration::from_millis(100));
    assert!(matches!(out[..], [Out::Heartbeat]), "{out:?}");
    assert!(c.advance(Duration::from_millis(499)).is_empty());
    assert!(matches!(
        c.advance(Duration::from_millis(1))[..],
        [Out::Heartbeat]
    ));
}

/// CONN-13: a second OPEN → CLOSE `amqp:not-allowed`, `unexpected second open`.
#[test]
fn conn_13_second_open() {
    let mut c = Client::new(config());
    c.open();
    let out = c.frame(0, &open("again"));
    assert_eq!(conditions(&out), ["amqp:not-allowed"]);
    assert_eq!(
        description_of(&out[0]).as_deref(),
        Some("unexpected second open")
    );
}

/// CONN-15: a refused admission is written as OPEN then CLOSE with the error, and reported as
/// `OpenRefused` before `Closed`.
#[test]
fn conn_15_admission_refused() {
    let err = AmqpError::new(Condition::ResourceLimitExceeded, "connection limit reached");
    let mut c = Client::with(config(), Transport::Plain, Some(err));
    c.raw(&HEADER_AMQP);
    let out = c.frame(0, &open("c"));
    let Out::Frame(0, Performative::Open(o)) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(o.container_id, "KubeMQ");
    assert_eq!(
        condition_of(&out[1]).as_deref(),
        Some("amqp:resource-limit-exceeded")
    );
    // The driver learns of the refusal, to pace it, before the connection's end.
    let evs = c.take_events();
    let refused = evs
        .iter()
        .position(|e| matches!(e, Event::OpenRefused { error } if error.description.as_deref() == Some("connection limit reached")));
    let closed = evs.iter().position(|e| matches!(e, Event::Closed { .. }));
    assert!(
        matches!((refused, closed), (Some(r), Some(c)) if r < c),
        "{evs:?}"
    );
}

/// Each live link reserves `link_state_bytes` in the process budget: past it an ATTACH is
/// refused with `amqp:resource-limit-exceeded`, and a detached link gives its place back.
#[test]
fn link_state_is_reserved_in_the_process_budget() {
    let mut cfg = config();
    cfg.process_memory = super::ProcessBudget::new(256 * 1024);
    cfg.link_state_bytes = 100 * 1024;
    let process = cfg.process_memory.clone();
    let mut c = Client::new(cfg);
    c.open_session();
    consumer(&mut c, "a", 0);
    consumer(&mut c, "b", 1);
    assert_eq!(process.used(), 200 * 1024);
    let out = c.frame(0, &attach_receiver("c", 2, "queues/a"));
    assert_eq!(conditions(&out), ["amqp:resource-limit-exceeded"]);
    assert_eq!(
        description_of(out.last().expect("a DETACH")).as_deref(),
        Some("connector memory budget of 262144 bytes exceeded")
    );
    assert!(
        c.take_events().is_empty(),
        "the application never hears of it"
    );
    c.frame(0, &detach(2));
    c.frame(0, &detach(0));
    c.take_events();
    assert_eq!(
        process.used(),
        100 * 1024,
        "the detached link gave its place back"
    );
    consumer(&mut c, "c", 0);
    assert_eq!(process.used(), 200 * 1024);
}

/// Each live session reserves `session_state_bytes` in the process budget: past it a BEGIN is
/// answered with BEGIN + END `amqp:resource-limit-exceeded`, and an ended session gives its
/// place back.
#[test]
fn session_state_is_reserved_in_the_process_budget() {
    let mut cfg = config();
    cfg.process_memory = super::ProcessBudget::new(256 * 1024);
    cfg.session_state_bytes = 100 * 1024;
    let process = cfg.process_memory.clone();
    let mut c = Client::new(cfg);
    c.open_session();
    c.frame(1, &begin());
    assert_eq!(process.used(), 200 * 1024);
    let out = c.frame(2, &begin());
    assert_eq!(conditions(&out), ["amqp:resource-limit-exceeded"]);
    assert_eq!(
        description_of(out.last().expect("an END")).as_deref(),
        Some("connector memory budget of 262144 bytes exceeded")
    );
    c.frame(2, &fe2o3_amqp_types::performatives::End { error: None });
    c.frame(1, &fe2o3_amqp_types::performatives::End { error: None });
    assert_eq!(
        process.used(),
        100 * 1024,
        "the ended session gave its place back"
    );
    let out = c.frame(2, &begin());
    assert!(conditions(&out).is_empty(), "{out:?}");
    assert_eq!(process.used(), 200 * 1024);
}

/// CONN-16 / Q-32: shutdown sends CLOSE `amqp:connection:forced` and reports every unsettled
/// delivery of every link exactly once.
#[test]
fn conn_16_shutdown_forced_with_teardown() {
    let mut c = Client::new(config());
    c.open_session();
    let rx = consumer(&mut c, "rx", 0);
    c.frame(0, &link_flow(0, 0, 10, false));
    c.take_events();
    c.conn.send(rx, b"t1", b"m1", false, 11).unwrap();
    c.conn.send(rx, b"t2", b"m2", false, 12).unwrap();
    c.collect();
    c.conn.shutdown(c.now);
    let out = c.collect();
    assert_eq!(conditions(&out), ["amqp:connection:forced"]);
    let evs = c.take_events();
    let closed: Vec<_> = evs
        .iter()
        .filter_map(|e| match e {
            Event::LinkClosed { unsettled, .. } => Some(unsettled.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(closed, vec![vec![11, 12]]);
    assert!(matches!(evs.last(), Some(Event::Closed { .. })));
    // The client's CLOSE completes it; nothing is reported twice.
    c.frame(0, &Close { error: None });
    assert!(c.conn.is_closed());
    assert!(c.take_events().is_empty());
}

/// CONN-16: a client that never answers our CLOSE is dropped after the close timeout.
#[test]
fn conn_16_close_wait_is_bounded() {
    let mut c = Client::new(config());
    c.open();
    c.conn.shutdown(c.now);
    c.collect();
    assert!(!c.conn.is_closed());
    c.advance(Duration::from_secs(3));
    assert!(c.conn.is_closed());
}

/// CONN-17: a client CLOSE ends links (teardown) and is answered with CLOSE.
#[test]
fn conn_17_client_close() {
    let mut c = Client::new(config());
    c.open_session();
    let rx = consumer(&mut c, "rx", 0);
    c.frame(0, &link_flow(0, 0, 1, false));
    c.conn.send(rx, b"t", b"m", false, 7).unwrap();
    c.take_events();
    let out = c.frame(0, &Close { error: None });
    assert!(
        matches!(out.last(), Some(Out::Frame(0, Performative::Close(cl))) if cl.error.is_none())
    );
    let evs = c.take_events();
    assert!(matches!(&evs[0], Event::LinkClosed { unsettled, .. } if unsettled == &vec![7]));
    assert!(c.conn.is_closed());
}

/// CONN-18 / OP-LINK-8: undecodable frames close the connection with `amqp:decode-error`.
#[test]
fn conn_18_decode_error_closes() {
    let cases: Vec<Vec<u8>> = vec![
        // vbin32 claiming 4 GiB inside a DISPOSITION
        vec![
            0, 0, 0, 23, 2, 0, 0, 0, 0x00, 0x53, 0x15, 0xc0, 0x0a, 0x02, 0x41, 0x43, 0xb0, 0xff,
            0xff, 0xff, 0xff, 0x00, 0x00,
        ],
        // not a described performative
        vec![0, 0, 0, 9, 2, 0, 0, 0, 0x40],
        // unknown descriptor
        vec![0, 0, 0, 11, 2, 0, 0, 0, 0x00, 0x53, 0x99],
        // frame size below the header
        vec![0, 0, 0, 4, 2, 0, 0, 0],
        // a header claiming 4 GiB
        vec![0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0],
        // an ATTACH whose fields are the wrong types
        vec![
            0, 0, 0, 15, 2, 0, 0, 0, 0x00, 0x53, 0x12, 0xc0, 0x03, 0x02, 0x43, 0x43,
        ],
    ];
    for bytes in cases {
        let mut c = Client::new(config());
        c.open_session();
        let out = c.raw(&bytes);
        assert_eq!(conditions(&out), ["amqp:decode-error"], "{bytes:?}");
    }
}

/// CONN-8: a frame beyond the negotiated max-frame-size is refused.
#[test]
fn conn_8_oversize_frame_refused() {
    let mut c = Client::new(config());
    c.raw(&HEADER_AMQP);
    let mut o = open("c");
    o.max_frame_size = 512.into();
    c.frame(0, &o);
    let mut big = vec![0u8; 600];
    big[..8].copy_from_slice(&[0, 0, 2, 0x58, 2, 0, 0, 0]);
    let out = c.raw(&big);
    assert_eq!(conditions(&out), ["amqp:decode-error"]);
}

// ---------------------------------------------------------------- sessions (SESS)

/// SESS-1: BEGIN reply fields.
#[test]
fn sess_1_begin_reply() {
    let mut c = Client::new(config());
    let b = c.open_session();
    assert_eq!(b.remote_channel, Some(0));
    assert_eq!((b.incoming_window, b.outgoing_window), (2048, 2048));
    assert_eq!(b.handle_max.0, 255);
}

/// SESS-2: a BEGIN beyond SessionMax is answered with BEGIN then END `resource-limit-exceeded`.
#[test]
fn sess_2_session_cap() {
    let mut cfg = config();
    cfg.session_max = 2;
    let mut c = Client::new(cfg);
    c.open();
    for ch in 0..2 {
        let out = c.frame(ch, &begin());
        assert!(conditions(&out).is_empty());
    }
    let out = c.frame(2, &begin());
    assert!(matches!(out[0], Out::Frame(2, Performative::Begin(_))));
    assert_eq!(conditions(&out), ["amqp:resource-limit-exceeded"]);
    // The client's END for the refused session is absorbed without error.
    assert!(c.frame(2, &end()).is_empty());
    assert!(c.conn.is_open());
}

/// SESS-2 under abuse: thousands of BEGINs on channels above channel-max are each refused with
/// BEGIN + END and leave no session behind (the engine keeps one bit per refused channel until
/// its END); frames on a refused channel before its END are ignored, and the connection stays
/// usable.
#[test]
fn sess_2_refused_sessions_leave_no_state() {
    let mut c = Client::new(config());
    c.open_session();
    let live = c.conn.sessions.len();
    for ch in 256..5256u16 {
        let out = c.frame(ch, &begin());
        assert_eq!(
            conditions(&out),
            ["amqp:resource-limit-exceeded"],
            "channel {ch}"
        );
    }
    assert_eq!(
        c.conn.sessions.len(),
        live,
        "refused BEGINs keep no session"
    );
    assert!(
        c.frame(300, &begin()).is_empty(),
        "a repeat BEGIN before END is ignored"
    );
    assert!(c.frame(300, &end()).is_empty(), "its END is absorbed");
    let out = c.frame(300, &end());
    assert_eq!(
        conditions(&out),
        ["amqp:not-allowed"],
        "a second END on that channel has no session to end"
    );
}

/// SESS-3: BEGIN on a channel with a live session → END `amqp:session:errant-link`.
#[test]
fn sess_3_duplicate_channel() {
    let mut c = Client::new(config());
    c.open_session();
    let out = c.frame(0, &begin());
    assert_eq!(conditions(&out), ["amqp:session:errant-link"]);
}

/// SESS-4: transfers pipelined past the incoming window → END `amqp:session:window-violation`;
/// a client that waits for our FLOW never hits it.
#[test]
fn sess_4_window_violation() {
    let mut c = Client::new(config());
    c.open_session();
    producer(&mut c, "tx", 0, 5000);
    let mut burst = Vec::new();
    for i in 0..2049u32 {
        burst.extend(amqp_frame(
            0,
            &transfer(0, Some(i), Some(&i.to_be_bytes()), true, false),
            b"x",
        ));
    }
    let out = c.raw(&burst);
    assert_eq!(conditions(&out), ["amqp:session:window-violation"]);
}

/// SESS-4: the window is replenished with a session FLOW once half is used.
#[test]
fn sess_4_window_replenished() {
    let mut c = Client::new(config());
    c.open_session();
    let tx = producer(&mut c, "tx", 0, 5000);
    let mut burst = Vec::new();
    for i in 0..1100u32 {
        burst.extend(amqp_frame(
            0,
            &transfer(0, Some(i), Some(&i.to_be_bytes()), true, false),
            b"x",
        ));
    }
    let out = c.raw(&burst);
    let flows: Vec<&Flow> = out
        .iter()
        .filter_map(|o| match o {
            Out::Frame(_, Performative::Flow(f)) if f.handle.is_none() => Some(f),
            _ => None,
        })
        .collect();
    assert_eq!(flows.len(), 1);
    assert_eq!(flows[0].incoming_window, 2048);
    assert_eq!(flows[0].next_incoming_id, Some(1 + 1100), "SESS-7");
    let n = c
        .take_events()
        .iter()
        .filter(|e| matches!(e, Event::Delivery(d) if d.link == tx))
        .count();
    assert_eq!(n, 1100);
}

/// SESS-5: frames on unattached handles, and an ATTACH reusing a live handle, end the session
/// with `amqp:session:errant-link`.
#[test]
fn sess_5_errant_link() {
    let mut c = Client::new(config());
    c.open_session();
    let out = c.transfer(0, &transfer(9, Some(0), Some(b"t"), false, false), b"m");
    assert_eq!(conditions(&out), ["amqp:session:errant-link"]);

    let mut c = Client::new(config());
    c.open_session();
    let out = c.frame(0, &link_flow(9, 0, 1, false));
    assert_eq!(conditions(&out), ["amqp:session:errant-link"]);

    let mut c = Client::new(config());
    c.open_session();
    let out = c.frame(0, &detach(4));
    assert_eq!(conditions(&out), ["amqp:session:errant-link"]);

    let mut c = Client::new(config());
    c.open_session();
    producer(&mut c, "a", 0, 10);
    let out = c.frame(0, &attach_sender("b", 0, "queues/b"));
    assert_eq!(conditions(&out), ["amqp:session:errant-link"]);
    let evs = c.take_events();
    assert!(
        matches!(&evs[0], Event::LinkClosed { .. }),
        "the session's links end with it"
    );
}

/// SESS-6: a client END detaches every link, is answered without error, and frees the channel.
#[test]
fn sess_6_client_end() {
    let mut c = Client::new(config());
    c.open_session();
    producer(&mut c, "a", 0, 10);
    consumer(&mut c, "b", 1);
    let out = c.frame(0, &end());
    assert!(matches!(&out[..], [Out::Frame(0, Performative::End(e))] if e.error.is_none()));
    let closed = c
        .take_events()
        .iter()
        .filter(|e| matches!(e, Event::LinkClosed { .. }))
        .count();
    assert_eq!(closed, 2);
    let out = c.frame(0, &begin());
    assert!(
        matches!(out[0], Out::Frame(0, Performative::Begin(_))),
        "channel reusable"
    );
}

/// SESS-7: every FLOW the server sends carries next-incoming-id.
#[test]
fn sess_7_flows_carry_next_incoming_id() {
    let mut c = Client::new(config());
    c.open_session();
    let id = c.request_link(0, &attach_sender("a", 0, "queues/a"));
    let out = accept(&mut c, id, 100);
    let Out::Frame(_, Performative::Flow(f)) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(f.next_incoming_id, Some(1));
}

// ---------------------------------------------------------------- links (LINK)

/// LINK-1 / LINK-4: role inversion and the reply ATTACH's fields.
#[test]
fn link_1_4_reply_attach() {
    let mut c = Client::new(config());
    c.open_session();
    let mut a = attach_sender("p", 3, "queues/a");
    a.snd_settle_mode = SenderSettleMode::Settled;
    let id = c.request_link(0, &a);
    let out = accept(&mut c, id, 1024);
    let Out::Frame(0, Performative::Attach(super::codec::AttachFrame::Full(r))) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(r.name, "p");
    assert_eq!(r.handle.0, 3);
    assert_eq!(r.role, Role::Receiver);
    assert_eq!(r.snd_settle_mode, SenderSettleMode::Settled);
    assert_eq!(r.rcv_settle_mode, ReceiverSettleMode::First);
    assert_eq!(r.source, a.source);
    assert_eq!(r.target, a.target);
    assert_eq!(r.max_message_size, Some(104_857_600), "XFER-4");
    assert!(
        r.offered_capabilities.is_none() && r.desired_capabilities.is_none(),
        "GEN-5"
    );
    assert_eq!(r.initial_delivery_count, None);

    let id = c.request_link(0, &attach_receiver("c", 4, "queues/a"));
    let out = accept(&mut c, id, 0);
    let Out::Frame(0, Performative::Attach(super::codec::AttachFrame::Full(r))) = &out[0] else {
        panic!()
    };
    assert_eq!(r.role, Role::Sender);
    assert_eq!(
        r.snd_settle_mode,
        SenderSettleMode::Unsettled,
        "mixed/unsettled requested → unsettled"
    );
    assert_eq!(r.initial_delivery_count, Some(0));
    assert_eq!(
        out.len(),
        1,
        "FLOW-3: no credit and no transfer before the client grants credit"
    );
}

/// A live link's name is held once (shared by the link and the session's live names), and the
/// client's ATTACH is not kept once the reply echoed it.
#[test]
fn a_live_link_keeps_one_copy_of_its_name() {
    let mut c = Client::new(config());
    c.open_session();
    let long = "n".repeat(10_000);
    let id = c.request_link(0, &attach_sender(&long, 0, "queues/a"));
    accept(&mut c, id, 10);
    let link = &c.conn.links[&id];
    assert_eq!(link.name_len(), 10_000);
    assert_eq!(
        link.name_holders(),
        2,
        "the link and the session share one copy"
    );
    assert!(
        !link.holds_request(),
        "the ATTACH is dropped after the reply"
    );
}

/// ADDR-11: a dynamic source is answered with the address the application minted.
#[test]
fn addr_11_dynamic_address_in_reply() {
    let mut c = Client::new(config());
    c.open_session();
    let mut a = attach_receiver("dyn", 0, "ignored");
    if let Some(s) = a.source.as_mut() {
        s.address = None;
        s.dynamic = true;
    }
    let id = c.request_link(0, &a);
    c.conn
        .accept_dynamic(
            id,
            LinkAccept { credit_window: 0 },
            "_amqp10.tmp.1.x".into(),
        )
        .unwrap();
    let out = c.collect();
    let Out::Frame(0, Performative::Attach(super::codec::AttachFrame::Full(r))) = &out[0] else {
        panic!("{out:?}")
    };
    let source = r.source.as_ref().unwrap();
    assert_eq!(source.address.as_deref(), Some("_amqp10.tmp.1.x"));
    assert!(source.dynamic);
}

/// LINK-2: `second` is refused first (before the duplicate-name check), with not-implemented.
#[test]
fn link_2_order_second_before_duplicate() {
    let mut c = Client::new(config());
    c.open_session();
    producer(&mut c, "dup", 0, 10);
    let mut a = attach_sender("dup", 1, "queues/a");
    a.rcv_settle_mode = ReceiverSettleMode::Second;
    let out = c.frame(0, &a);
    assert!(
        matches!(out[0], Out::Frame(0, Performative::Attach(_))),
        "reply ATTACH precedes DETACH"
    );
    assert_eq!(conditions(&out), ["amqp:not-implemented"]);
}

/// LINK-2: duplicate live name with the same role → not-allowed `duplicate link name`, checked
/// before the link cap; LINK-8: the other role, another session or a detached name are fine.
#[test]
fn link_2_8_duplicate_names() {
    let mut cfg = config();
    cfg.max_links_per_session = 2;
    let mut c = Client::new(cfg);
    c.open_session();
    producer(&mut c, "n", 0, 10);
    let id = c.request_link(0, &attach_receiver("n", 1, "queues/a"));
    accept(&mut c, id, 0);
    // Session full (2 links) and duplicate: the duplicate check comes first.
    let out = c.frame(0, &attach_sender("n", 2, "queues/a"));
    assert_eq!(conditions(&out), ["amqp:not-allowed"]);
    assert_eq!(
        description_of(&out[1]).as_deref(),
        Some("duplicate link name")
    );
    c.frame(0, &detach(2));
    // Another session may use the name.
    c.frame(1, &begin());
    c.take_events();
    let id = c.request_link(1, &attach_sender("n", 0, "queues/a"));
    accept(&mut c, id, 10);
    // After detaching, the name is free again.
    c.frame(0, &detach(0));
    c.take_events();
    c.request_link(0, &attach_sender("n", 0, "queues/a"));
}

/// LINK-2 step 3: an ATTACH when the session already has MaxLinksPerSession live links is refused
/// with resource-limit-exceeded (the client had to go past handle-max to try); SESS-5: a handle
/// beyond handle-max while below the cap is an errant link.
#[test]
fn link_2_link_cap() {
    let mut cfg = config();
    cfg.max_links_per_session = 2;
    let mut c = Client::new(cfg.clone());
    c.open_session();
    producer(&mut c, "a", 0, 10);
    producer(&mut c, "b", 1, 10);
    let out = c.frame(0, &attach_sender("c", 2, "queues/a"));
    assert!(matches!(out[0], Out::Frame(0, Performative::Attach(_))));
    assert_eq!(conditions(&out), ["amqp:resource-limit-exceeded"]);
    assert!(c.conn.is_open());

    let mut c = Client::new(cfg);
    c.open_session();
    producer(&mut c, "a", 0, 10);
    let out = c.frame(0, &attach_sender("c", 5, "queues/a"));
    assert_eq!(conditions(&out), ["amqp:session:errant-link"]);
}

/// LINK-2 step 3 under abuse: at the link cap, ATTACHes with long names and fresh handles are
/// refused at link level while as many are awaiting their DETACH as there are live links; past
/// that the session ends (errant-link). A refused link keeps neither its name nor a place in the
/// session's names, so a duplicate-name refusal does not free the live link's name either.
#[test]
fn link_2_refused_links_are_bounded() {
    let mut cfg = config();
    cfg.max_links_per_session = 2;
    let mut c = Client::new(cfg);
    c.open_session();
    producer(&mut c, "a", 0, 10);
    producer(&mut c, "b", 1, 10);
    let long = "n".repeat(10_000);
    for handle in 2..4 {
        let out = c.frame(
            0,
            &attach_sender(&format!("{long}{handle}"), handle, "queues/a"),
        );
        assert_eq!(
            conditions(&out),
            ["amqp:resource-limit-exceeded"],
            "handle {handle}"
        );
    }
    assert!(
        c.conn.links.values().all(|l| l.name_len() < 100),
        "refused links keep no name"
    );
    let out = c.frame(0, &attach_sender("x", 4, "queues/a"));
    assert_eq!(
        conditions(&out),
        ["amqp:session:errant-link"],
        "a third refused link awaiting DETACH ends the session"
    );
    assert!(c.conn.is_open());

    // A duplicate name is refused, and the live link keeps its name.
    let mut c = Client::new(config());
    c.open_session();
    producer(&mut c, "a", 0, 10);
    for handle in 1..3 {
        let out = c.frame(0, &attach_sender("a", handle, "queues/a"));
        assert_eq!(conditions(&out), ["amqp:not-allowed"], "duplicate {handle}");
    }
}

/// LINK-5 / OP-LINK-1: an application refusal is ATTACH (null terminus on our side) then
/// DETACH(closed) with the error.
#[test]
fn link_5_refusal_shape() {
    let mut c = Client::new(config());
    c.open_session();
    let id = c.request_link(0, &attach_receiver("r", 0, "nope/x"));
    c.conn
        .refuse_link(
            id,
            AmqpError::new(Condition::NotFound, "unknown address prefix"),
        )
        .unwrap();
    let out = c.collect();
    let Out::Frame(0, Performative::Attach(super::codec::AttachFrame::Full(a))) = &out[0] else {
        panic!("{out:?}")
    };
    assert!(a.source.is_none() && a.target.is_some());
    let Out::Frame(0, Performative::Detach(d)) = &out[1] else {
        panic!()
    };
    assert!(d.closed);
    assert_eq!(condition_of(&out[1]).as_deref(), Some("amqp:not-found"));
    assert!(
        c.take_events().is_empty(),
        "a refused link gets no LinkClosed"
    );
}

/// NG-1 and engine-notes §1.6: a coordinator target is refused with not-implemented, an unknown
/// distribution mode with invalid-field, both promptly.
#[test]
fn link_5_lenient_attach_refusals() {
    // attach(name "t", handle 0, role sender, snd 2? no: default, rcv 0, source null, target coordinator)
    let coordinator: Vec<u8> = {
        let fields = [
            &[0xa1, 0x01, b't'][..],   // name
            &[0x43],                   // handle 0
            &[0x42],                   // role sender
            &[0x40, 0x40, 0x40],       // snd, rcv, source
            &[0x00, 0x53, 0x30, 0x45], // target: coordinator list0
        ]
        .concat();
        let mut body = vec![0x00, 0x53, 0x12, 0xc0, (fields.len() + 1) as u8, 7];
        body.extend(fields);
        let mut f = vec![0, 0, 0, 0, 2, 0, 0, 0];
        f.extend(body);
        let n = f.len() as u32;
        f[..4].copy_from_slice(&n.to_be_bytes());
        f
    };
    let mut c = Client::new(config());
    c.open_session();
    let out = c.raw(&coordinator);
    assert_eq!(conditions(&out), ["amqp:not-implemented"]);

    let mut a = attach_receiver("d", 0, "queues/a");
    let bytes = amqp_frame(0, &a, &[]);
    // Replace the distribution-mode symbol: build with "move" then patch it to "xxxx".
    if let Some(src) = a.source.as_mut() {
        src.distribution_mode = Some(fe2o3_amqp_types::messaging::DistributionMode::Move);
    }
    let mut patched = amqp_frame(0, &a, &[]);
    let pos = patched
        .windows(4)
        .position(|w| w == b"move")
        .expect("symbol present");
    patched[pos..pos + 4].copy_from_slice(b"xxxx");
    assert_ne!(bytes, patched);
    let mut c = Client::new(config());
    c.open_session();
    let out = c.raw(&patched);
    assert_eq!(conditions(&out), ["amqp:invalid-field"], "{out:?}");
}

/// LINK-6: a client DETACH is answered with DETACH(closed) and reports unsettled deliveries once.
#[test]
fn link_6_client_detach() {
    let mut c = Client::new(config());
    c.open_session();
    let rx = consumer(&mut c, "r", 0);
    c.frame(0, &link_flow(0, 0, 5, false));
    for t in 0..3u64 {
        c.conn.send(rx, &t.to_be_bytes(), b"m", false, t).unwrap();
    }
    c.collect();
    c.frame(
        0,
        &disposition(1, None, true, Some(DeliveryState::Accepted(Accepted {}))),
    );
    c.take_events();
    let out = c.frame(0, &detach(0));
    assert!(
        matches!(&out[..], [Out::Frame(0, Performative::Detach(d))] if d.closed && d.error.is_none())
    );
    let evs = c.take_events();
    assert!(matches!(&evs[..], [Event::LinkClosed { unsettled, .. }] if unsettled == &vec![0, 2]));
    assert_eq!(
        c.conn.send(rx, b"x", b"m", false, 9),
        Err(super::CommandError::NoLink)
    );
}

/// LINK-7 / OP-LINK-3: an ATTACH offering unsettled state is refused as a re-attach.
#[test]
fn link_7_reattach_refused() {
    let mut c = Client::new(config());
    c.open_session();
    let mut a = attach_receiver("r", 0, "queues/a");
    let mut m = OrderedMap::new();
    m.insert(ByteBuf::from(vec![1u8]), None);
    a.unsettled = Some(m);
    let out = c.frame(0, &a);
    assert_eq!(conditions(&out), ["amqp:not-allowed"]);
    assert_eq!(
        description_of(&out[1]).as_deref(),
        Some("link re-attach not supported")
    );
}

/// The application's own detach carries its error and reports the link closed once.
#[test]
fn app_detach_with_error() {
    let mut c = Client::new(config());
    c.open_session();
    let tx = producer(&mut c, "p", 0, 10);
    c.conn
        .detach(
            tx,
            Some(AmqpError::new(Condition::InternalError, "backend lost")),
        )
        .unwrap();
    let out = c.collect();
    assert_eq!(conditions(&out), ["amqp:internal-error"]);
    assert_eq!(c.take_events().len(), 1);
    c.frame(0, &detach(0));
    assert!(c.take_events().is_empty());
    // The handle is free again.
    c.request_link(0, &attach_sender("p", 0, "queues/a"));
}

// ---------------------------------------------------------------- credit (FLOW)

/// FLOW-1: a produce link gets the window right after the reply ATTACH, and is topped up to it
/// once below half while fewer than a window of deliveries await settlement.
#[test]
fn flow_1_produce_credit_window() {
    let mut c = Client::new(config());
    c.open_session();
    let id = c.request_link(0, &attach_sender("p", 0, "queues/a"));
    let out = accept(&mut c, id, 4);
    let Out::Frame(0, Performative::Flow(f)) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(
        (
            f.link_credit,
            f.delivery_count,
            f.handle.as_ref().map(|h| h.0)
        ),
        (Some(4), Some(0), Some(0))
    );
    let mut all = Vec::new();
    for i in 0..3u32 {
        all.extend(c.transfer(
            0,
            &transfer(0, Some(i), Some(&[i as u8]), false, false),
            b"m",
        ));
    }
    let flows: Vec<_> = all
        .iter()
        .filter_map(|o| match o {
            Out::Frame(_, Performative::Flow(f)) if f.handle.is_some() => Some(f.link_credit),
            _ => None,
        })
        .collect();
    assert_eq!(
        flows,
        vec![Some(4)],
        "refilled once credit fell to 1 (< 4/2)"
    );
    // With a window's worth unsettled by the application, no refill (backpressure).
    let mut c = Client::new(config());
    c.open_session();
    let id = c.request_link(0, &attach_sender("p", 0, "queues/a"));
    accept(&mut c, id, 2);
    let mut out = c.transfer(0, &transfer(0, Some(0), Some(b"a"), false, false), b"m");
    out.extend(c.transfer(0, &transfer(0, Some(1), Some(b"b"), false, false), b"m"));
    assert!(
        out.iter()
            .all(|o| !matches!(o, Out::Frame(_, Performative::Flow(_)))),
        "{out:?}"
    );
    c.conn
        .settle(id, 0, DeliveryState::Accepted(Accepted {}))
        .unwrap();
    let out = c.collect();
    assert!(
        out.iter()
            .any(|o| matches!(o, Out::Frame(_, Performative::Flow(f)) if f.link_credit == Some(2))),
        "{out:?}"
    );
}

/// FLOW-1: a produce link's delivery-count starts at the client's initial-delivery-count, so the
/// granted credit means what it says to a client that does not start at 0.
#[test]
fn flow_1_initial_delivery_count_honoured() {
    let mut c = Client::new(config());
    c.open_session();
    let mut a = attach_sender("p", 0, "queues/a");
    a.initial_delivery_count = Some(u32::MAX - 1);
    let id = c.request_link(0, &a);
    let out = accept(&mut c, id, 4);
    let Out::Frame(0, Performative::Flow(f)) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(
        (f.delivery_count, f.link_credit),
        (Some(u32::MAX - 1), Some(4))
    );
    let mut out = Vec::new();
    for i in 0..3u32 {
        out.extend(c.transfer(
            0,
            &transfer(0, Some(i), Some(&[i as u8]), true, false),
            b"m",
        ));
    }
    let flows: Vec<(Option<u32>, Option<u32>)> = out
        .iter()
        .filter_map(|o| match o {
            Out::Frame(_, Performative::Flow(f)) if f.handle.is_some() => {
                Some((f.delivery_count, f.link_credit))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        flows,
        vec![(Some(1), Some(4))],
        "refill after three deliveries, delivery-count wrapped to 1"
    );
    assert_eq!(
        c.take_events()
            .iter()
            .filter(|e| matches!(e, Event::Delivery(_)))
            .count(),
        3
    );
}

/// FLOW-2 / OP-LINK-6: a transfer beyond link credit detaches the link with not-allowed.
#[test]
fn flow_2_transfer_beyond_credit() {
    let mut c = Client::new(config());
    c.open_session();
    let id = c.request_link(0, &attach_sender("p", 0, "queues/a"));
    accept(&mut c, id, 1);
    c.transfer(0, &transfer(0, Some(0), Some(b"a"), false, false), b"m");
    let out = c.transfer(0, &transfer(0, Some(1), Some(b"b"), false, false), b"m");
    assert_eq!(conditions(&out), ["amqp:not-allowed"]);
    assert_eq!(
        description_of(&out[0]).as_deref(),
        Some("transfer exceeds link credit")
    );
}

/// FLOW-3: nothing is sent before credit; credit = delivery-count + link-credit − ours.
#[test]
fn flow_3_consume_credit() {
    let mut c = Client::new(config());
    c.open_session();
    let rx = consumer(&mut c, "r", 0);
    assert_eq!(
        c.conn.send(rx, b"t", b"m", false, 0),
        Err(super::CommandError::NoCredit)
    );
    c.frame(0, &link_flow(0, 0, 2, false));
    let evs = c.take_events();
    assert!(matches!(
        evs[..],
        [Event::Credit {
            credit: 2,
            drain: false,
            ..
        }]
    ));
    c.conn.send(rx, b"a", b"m", true, 0).unwrap();
    // The client, having seen one delivery, re-grants 2 from its delivery-count 1: 2 available.
    c.frame(0, &link_flow(0, 1, 2, false));
    assert_eq!(c.conn.credit(rx), 2);
    // A stale FLOW (delivery-count 0, credit 1) leaves no credit: 0 + 1 − 1.
    c.frame(0, &link_flow(0, 0, 1, false));
    assert_eq!(c.conn.credit(rx), 0);
    // OP-LINK-7: a FLOW without delivery-count counts from 0.
    let mut f = link_flow(0, 0, 5, false);
    f.delivery_count = None;
    c.frame(0, &f);
    assert_eq!(c.conn.credit(rx), 4);
}

/// FLOW-3: a FLOW pipelined right behind the ATTACH, before the application accepted the link,
/// is not lost: its credit is reported on acceptance.
#[test]
fn flow_3_credit_before_acceptance() {
    let mut c = Client::new(config());
    c.open_session();
    let mut bytes = amqp_frame(0, &attach_receiver("r", 0, "queues/a"), &[]);
    bytes.extend(amqp_frame(0, &link_flow(0, 0, 7, false), &[]));
    c.raw(&bytes);
    let evs = c.take_events();
    let Some(Event::AttachRequested { link, .. }) = evs.into_iter().next() else {
        panic!()
    };
    accept(&mut c, link, 0);
    assert!(matches!(
        c.take_events()[..],
        [Event::Credit {
            credit: 7,
            drain: false,
            ..
        }]
    ));
    assert_eq!(c.conn.credit(link), 7);
}

/// FLOW-5 / FLOW-6: drain sends what is available, then advances delivery-count by the unused
/// credit and reports credit 0 with drain = true; nothing can be sent afterwards.
#[test]
fn flow_5_drain() {
    let mut c = Client::new(config());
    c.open_session();
    let rx = consumer(&mut c, "r", 0);
    c.frame(0, &link_flow(0, 0, 5, true));
    assert!(matches!(
        c.take_events()[..],
        [Event::Credit {
            credit: 5,
            drain: true,
            ..
        }]
    ));
    c.conn.send(rx, b"a", b"m1", true, 0).unwrap();
    c.conn.send(rx, b"b", b"m2", true, 0).unwrap();
    c.conn.drain_done(rx).unwrap();
    let out = c.collect();
    assert_eq!(out.iter().filter(|o| payload(o).is_some()).count(), 2);
    let Some(Out::Frame(0, Performative::Flow(f))) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(
        (f.delivery_count, f.link_credit, f.drain),
        (Some(5), Some(0), true)
    );
    assert_eq!(
        c.conn.send(rx, b"c", b"m3", true, 0),
        Err(super::CommandError::NoCredit)
    );
    // Fresh credit resumes delivery.
    c.frame(0, &link_flow(0, 5, 1, false));
    assert!(c.conn.send(rx, b"c", b"m3", true, 0).is_ok());
}

/// OP-LINK-6: echo = true is answered with the link's FLOW state.
#[test]
fn flow_echo() {
    let mut c = Client::new(config());
    c.open_session();
    consumer(&mut c, "r", 0);
    let mut f = link_flow(0, 0, 3, false);
    f.echo = true;
    let out = c.frame(0, &f);
    assert!(
        matches!(&out[..], [Out::Frame(0, Performative::Flow(r))] if r.link_credit == Some(3) && r.delivery_count == Some(0))
    );
    let mut s = link_flow(0, 0, 3, false);
    s.handle = None;
    s.delivery_count = None;
    s.link_credit = None;
    s.echo = true;
    let out = c.frame(0, &s);
    assert!(matches!(&out[..], [Out::Frame(0, Performative::Flow(r))] if r.handle.is_none()));
}

/// FLOW-7-adjacent: the session outgoing path honours the client's incoming window: frames wait
/// until the client's FLOW opens it (OP-LINK-5).
#[test]
fn remote_incoming_window_respected() {
    let mut c = Client::new(config());
    c.open();
    let mut b = begin();
    b.incoming_window = 1;
    c.frame(0, &b);
    let rx = consumer(&mut c, "r", 0);
    let mut lf = link_flow(0, 0, 10, false);
    lf.incoming_window = 1;
    c.frame(0, &lf);
    c.conn.send(rx, b"a", b"m1", true, 0).unwrap();
    c.conn.send(rx, b"b", b"m2", true, 0).unwrap();
    let out = c.collect();
    assert_eq!(out.iter().filter(|o| payload(o).is_some()).count(), 1);
    let mut f = link_flow(0, 0, 10, false);
    f.handle = None;
    f.delivery_count = None;
    f.link_credit = None;
    f.next_incoming_id = Some(1);
    f.incoming_window = 5;
    let out = c.frame(0, &f);
    assert_eq!(out.iter().filter(|o| payload(o).is_some()).count(), 1);
}

// ---------------------------------------------------------------- transfers (XFER)

/// XFER-1: a multi-frame message is reassembled bit-exactly, delivered once, after the last frame.
#[test]
fn xfer_1_multi_frame_reassembly() {
    let mut c = Client::new(config());
    c.open_session();
    let tx = producer(&mut c, "p", 0, 10);
    let body: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    c.transfer(
        0,
        &transfer(0, Some(0), Some(b"t"), false, true),
        &body[..1000],
    );
    c.transfer(0, &transfer(0, None, None, false, true), &body[1000..2000]);
    assert!(c.take_events().is_empty());
    c.transfer(0, &transfer(0, Some(0), None, false, false), &body[2000..]);
    let evs = c.take_events();
    let [Event::Delivery(d)] = &evs[..] else {
        panic!("{evs:?}")
    };
    assert_eq!(&d.payload[..], &body[..]);
    assert!(!d.settled);
    c.conn
        .settle(tx, d.delivery_id, DeliveryState::Accepted(Accepted {}))
        .unwrap();
    let out = c.collect();
    assert!(
        matches!(&out[..], [Out::Frame(0, Performative::Disposition(x))] if x.first == 0 && x.settled && x.state == Some(DeliveryOutcome::Accepted))
    );
    assert_eq!(
        c.conn.settle(tx, 0, DeliveryState::Accepted(Accepted {})),
        Err(super::CommandError::NoDelivery),
        "settled once"
    );
}

/// XFER-1: aborted multi-frame deliveries are discarded.
#[test]
fn xfer_aborted_discarded() {
    let mut c = Client::new(config());
    c.open_session();
    producer(&mut c, "p", 0, 10);
    c.transfer(0, &transfer(0, Some(0), Some(b"t"), false, true), b"part");
    let mut t = transfer(0, None, None, false, false);
    t.aborted = true;
    c.transfer(0, &t, b"");
    assert!(c.take_events().is_empty());
    c.transfer(0, &transfer(0, Some(1), Some(b"u"), false, false), b"whole");
    assert!(matches!(&c.take_events()[..], [Event::Delivery(d)] if &d.payload[..] == b"whole"));
}

/// XFER-2: exactly MaxMessageSize is accepted; one byte over is rejected and the link detached
/// with `amqp:link:message-size-exceeded`.
#[test]
fn xfer_2_message_size_cap() {
    let mut cfg = config();
    cfg.max_message_size = 1000;
    let mut c = Client::new(cfg);
    c.open_session();
    producer(&mut c, "p", 0, 10);
    c.transfer(0, &transfer(0, Some(0), Some(b"a"), false, true), &[1; 600]);
    c.transfer(0, &transfer(0, None, None, false, false), &[1; 400]);
    assert!(matches!(&c.take_events()[..], [Event::Delivery(d)] if d.payload.len() == 1000));
    c.transfer(0, &transfer(0, Some(1), Some(b"b"), false, true), &[1; 600]);
    let out = c.transfer(0, &transfer(0, None, None, false, false), &[1; 401]);
    let Out::Frame(0, Performative::Disposition(d)) = &out[0] else {
        panic!("{out:?}")
    };
    assert!(d.settled && matches!(&d.state, Some(DeliveryOutcome::Rejected(Some(_)))));
    assert_eq!(conditions(&out), ["amqp:link:message-size-exceeded"]);
    assert!(
        matches!(&c.take_events()[..], [Event::LinkClosed { error: Some(e), .. }] if e.condition == Condition::MessageSizeExceeded)
    );
}

/// A message that never ends is cut at the connection's memory budget, well below
/// MaxMessageSize: rejected and detached with `amqp:resource-limit-exceeded`, and every byte it
/// held is given back.
#[test]
fn a_message_that_never_ends_is_cut_at_the_connection_budget() {
    let mut cfg = config();
    cfg.connection_memory = 1 << 20;
    let mut c = Client::new(cfg);
    c.open_session();
    producer(&mut c, "p", 0, 10);
    let chunk = [7u8; 16 * 1024];
    let mut out = c.transfer(0, &transfer(0, Some(0), Some(b"a"), false, true), &chunk);
    let mut frames = 1;
    while conditions(&out).is_empty() {
        assert!(frames < 200, "never cut");
        out = c.transfer(0, &transfer(0, None, None, false, true), &chunk);
        frames += 1;
    }
    assert!(
        ((frames - 1) * chunk.len()) as u64 <= 1 << 20,
        "cut only after {frames} frames"
    );
    assert!(
        out.iter()
            .any(|o| matches!(o, Out::Frame(0, Performative::Disposition(d))
            if d.settled && matches!(&d.state, Some(DeliveryOutcome::Rejected(Some(_)))))),
        "{out:?}"
    );
    assert_eq!(conditions(&out), ["amqp:resource-limit-exceeded"]);
    assert!(
        matches!(&c.take_events()[..], [Event::LinkClosed { error: Some(e), .. }]
            if e.description.as_deref() == Some("connection memory budget of 1048576 bytes exceeded")),
    );
    assert_eq!(
        c.conn.budget().used(),
        0,
        "the partial message is given back"
    );
}

/// The process budget is shared: past it a connection's delivery is refused, while another
/// connection's small message still fits its guaranteed share.
#[test]
fn connections_share_the_process_budget_beyond_a_guaranteed_share() {
    let mut cfg = config();
    cfg.process_memory = super::ProcessBudget::new(256 * 1024);
    let process = cfg.process_memory.clone();
    let mut abuser = Client::new(cfg.clone());
    let mut polite = Client::new(cfg);
    abuser.open_session();
    polite.open_session();
    producer(&mut abuser, "p", 0, 10);
    let tx = producer(&mut polite, "p", 0, 10);
    let chunk = [7u8; 64 * 1024];
    let mut out = abuser.transfer(0, &transfer(0, Some(0), Some(b"a"), false, true), &chunk);
    while conditions(&out).is_empty() {
        out = abuser.transfer(0, &transfer(0, None, None, false, true), &chunk);
    }
    assert_eq!(conditions(&out), ["amqp:resource-limit-exceeded"]);
    assert!(
        matches!(&abuser.take_events()[..], [Event::LinkClosed { error: Some(e), .. }]
            if e.description.as_deref() == Some("connector memory budget of 262144 bytes exceeded")),
    );
    // A second abuser link holds the process budget full (8 whole messages of 64 KiB that the
    // application has not settled, half of them in the guaranteed share); then the polite
    // client sends.
    producer(&mut abuser, "q", 1, 10);
    for id in 1..9u32 {
        let out = abuser.transfer(
            0,
            &transfer(1, Some(id), Some(&id.to_be_bytes()), false, false),
            &chunk,
        );
        assert!(conditions(&out).is_empty(), "{out:?}");
    }
    assert_eq!(process.used(), 256 * 1024, "the process budget is full");
    polite.transfer(
        0,
        &transfer(0, Some(0), Some(b"x"), false, false),
        &[1; 1000],
    );
    let evs = polite.take_events();
    let [Event::Delivery(d)] = &evs[..] else {
        panic!("{evs:?}")
    };
    polite
        .conn
        .settle(tx, d.delivery_id, DeliveryState::Accepted(Accepted {}))
        .unwrap();
    drop(abuser);
    assert_eq!(
        process.used(),
        0,
        "a connection gives everything back when dropped"
    );
}

/// Deliveries waiting for the application count against the budget: past half of it no credit
/// is granted, and settling brings the credit back.
#[test]
fn credit_waits_while_the_budget_is_half_used() {
    let mut cfg = config();
    cfg.connection_memory = 4096;
    let mut c = Client::new(cfg);
    c.open_session();
    let tx = producer(&mut c, "p", 0, 4);
    let mut out = Vec::new();
    for i in 0..3u32 {
        out.extend(c.transfer(
            0,
            &transfer(0, Some(i), Some(&[i as u8]), false, false),
            &[0; 1000],
        ));
    }
    assert!(
        !out.iter()
            .any(|o| matches!(o, Out::Frame(_, Performative::Flow(_)))),
        "3000 of 4096 bytes wait: no credit ({out:?})"
    );
    assert_eq!(c.conn.budget().used(), 3000);
    let ids: Vec<u32> = c
        .take_events()
        .iter()
        .filter_map(|e| match e {
            Event::Delivery(d) => Some(d.delivery_id),
            _ => None,
        })
        .collect();
    for id in ids {
        c.conn
            .settle(tx, id, DeliveryState::Accepted(Accepted {}))
            .unwrap();
    }
    let out = c.collect();
    assert!(
        out.iter()
            .any(|o| matches!(o, Out::Frame(_, Performative::Flow(f)) if f.link_credit == Some(4))),
        "{out:?}"
    );
    assert_eq!(c.conn.budget().used(), 0);
}

/// Frames waiting for the client's session window are counted, the link's room says how many
/// more the window takes, and a FLOW that opens a used-up window says so.
#[test]
fn a_shut_session_window_is_reported_and_counted() {
    let mut c = Client::new(config());
    c.open();
    let mut b = begin();
    b.incoming_window = 0;
    c.frame(0, &b);
    let rx = consumer(&mut c, "r", 0);
    let mut lf = link_flow(0, 0, 10, false);
    lf.incoming_window = 0;
    c.frame(0, &lf);
    assert_eq!(c.conn.session_room(rx), super::SessionRoom::default());
    c.conn.send(rx, b"a", &[5; 100], true, 0).unwrap();
    assert_eq!(
        c.conn.session_room(rx),
        super::SessionRoom {
            window: 0,
            waiting: 1
        }
    );
    assert!(
        c.conn.budget().used() >= 100,
        "the blocked frame is counted"
    );
    c.take_events();
    let mut f = link_flow(0, 0, 10, false);
    f.handle = None;
    f.delivery_count = None;
    f.link_credit = None;
    f.next_incoming_id = Some(0);
    f.incoming_window = 8;
    let out = c.frame(0, &f);
    assert_eq!(out.iter().filter(|o| payload(o).is_some()).count(), 1);
    assert!(c
        .take_events()
        .iter()
        .any(|e| matches!(e, Event::WindowOpened)));
    assert_eq!(
        c.conn.session_room(rx),
        super::SessionRoom {
            window: 7,
            waiting: 0
        }
    );
    assert_eq!(c.conn.budget().used(), 0);
    // Growing a window that is still open says nothing: demand is recomputed as frames go out.
    let mut more = f.clone();
    more.incoming_window = 100;
    c.frame(0, &more);
    assert!(!c
        .take_events()
        .iter()
        .any(|e| matches!(e, Event::WindowOpened)));
}

/// A transport that does not take what it was given shuts every window: past
/// `MAX_UNWRITTEN` unwritten bytes transfers wait in their session, counted in the budget, and
/// the link's room says none more; once the transport has taken half, they go and senders hear
/// so.
#[test]
fn an_unwritten_transport_shuts_the_windows() {
    let mut c = Client::new(config());
    c.open_session();
    let rx = consumer(&mut c, "r", 0);
    c.frame(0, &link_flow(0, 0, 1000, false));
    c.collect();
    c.take_events();
    let body = [9u8; 64 * 1024];
    let mut unwritten = bytes::BytesMut::new();
    let mut sent = 0;
    while c.conn.session_room(rx).window > 0 {
        c.conn.send(rx, &[sent as u8], &body, true, 0).unwrap();
        c.conn.poll_transmit(&mut unwritten);
        sent += 1;
        assert!(sent < 200, "the window never shut");
    }
    assert!(unwritten.len() >= super::MAX_UNWRITTEN);
    assert!(unwritten.len() < super::MAX_UNWRITTEN + 2 * body.len());
    // One more goes to its session, not to the transport.
    c.conn.send(rx, b"x", &body, true, 0).unwrap();
    let before = unwritten.len();
    c.conn.poll_transmit(&mut unwritten);
    assert_eq!(unwritten.len(), before, "nothing more for the transport");
    assert!(c.conn.session_room(rx).waiting > 0);
    assert!(
        c.conn.budget().used() >= body.len() as u64,
        "the waiting frames are counted"
    );
    // The transport takes a little: still more than half waits, nothing changes.
    c.conn.set_unwritten(super::MAX_UNWRITTEN * 3 / 4);
    assert!(c.conn.poll_event().is_none());
    assert_eq!(c.conn.session_room(rx).window, 0);
    // It takes everything: the waiting transfer goes, and senders hear the windows opened.
    c.conn.set_unwritten(0);
    assert!(matches!(c.conn.poll_event(), Some(Event::WindowOpened)));
    assert!(c.conn.session_room(rx).window > 0);
    assert_eq!(c.conn.session_room(rx).waiting, 0);
    assert_eq!(c.conn.budget().used(), 0);
    let mut rest = bytes::BytesMut::new();
    c.conn.poll_transmit(&mut rest);
    assert!(rest.len() > body.len(), "the waiting transfer was written");
}

/// XFER-3: outbound messages are fragmented to the negotiated frame size and reassemble exactly.
#[test]
fn xfer_3_outbound_fragmentation() {
    let mut c = Client::new(config());
    c.raw(&HEADER_AMQP);
    let mut o = open("c");
    o.max_frame_size = 512.into();
    c.frame(0, &o);
    c.frame(0, &begin());
    let rx = consumer(&mut c, "r", 0);
    c.frame(0, &link_flow(0, 0, 2, false));
    let body: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    let id = c.conn.send(rx, b"tag", &body, false, 1).unwrap();
    let id2 = c.conn.send(rx, b"tag2", b"small", false, 2).unwrap();
    assert_eq!(
        id2,
        id + 1,
        "delivery ids advance per delivery, not per frame"
    );
    let mut bytes = bytes::BytesMut::new();
    c.conn.poll_transmit(&mut bytes);
    let mut joined = Vec::new();
    let mut frames = 0;
    while let Some(f) = super::frame::split_frame(&mut bytes, u32::MAX).unwrap() {
        assert!(f.body.len() + 8 <= 512);
        let Ok(Performative::Transfer(t, p)) = super::codec::decode_performative(&f.body) else {
            continue;
        };
        if t.delivery_id == Some(id2) {
            break;
        }
        frames += 1;
        assert_eq!(
            t.delivery_id.is_some(),
            frames == 1,
            "only the first frame carries the id"
        );
        joined.extend_from_slice(&p);
    }
    assert!(frames >= 10);
    assert_eq!(joined, body);
}

/// Delivery tags longer than 32 bytes are refused with invalid-field.
#[test]
fn xfer_long_tag_refused() {
    let mut c = Client::new(config());
    c.open_session();
    producer(&mut c, "p", 0, 10);
    let out = c.transfer(0, &transfer(0, Some(0), Some(&[7; 33]), false, false), b"m");
    assert_eq!(conditions(&out), ["amqp:invalid-field"]);
}

/// A continuation that changes the delivery-id is refused with not-allowed.
#[test]
fn xfer_inconsistent_continuation() {
    let mut c = Client::new(config());
    c.open_session();
    producer(&mut c, "p", 0, 10);
    c.transfer(0, &transfer(0, Some(0), Some(b"a"), false, true), b"x");
    let out = c.transfer(0, &transfer(0, Some(5), None, false, false), b"y");
    assert_eq!(conditions(&out), ["amqp:not-allowed"]);
}

/// Pre-settled inbound deliveries get no DISPOSITION.
#[test]
fn presettled_inbound_no_disposition() {
    let mut c = Client::new(config());
    c.open_session();
    let tx = producer(&mut c, "p", 0, 10);
    c.transfer(0, &transfer(0, Some(0), Some(b"a"), true, false), b"x");
    let evs = c.take_events();
    assert!(matches!(&evs[..], [Event::Delivery(d)] if d.settled));
    c.conn
        .settle(tx, 0, DeliveryState::Accepted(Accepted {}))
        .unwrap();
    assert!(c.collect().is_empty());
}

// ---------------------------------------------------------------- dispositions

/// Dispositions on ranges settle every unsettled delivery in the range; unknown states are
/// reported as Unknown; a terminal state without `settled` is settled by us.
#[test]
fn disposition_ranges_and_states() {
    let mut c = Client::new(config());
    c.open_session();
    let rx = consumer(&mut c, "r", 0);
    c.frame(0, &link_flow(0, 0, 10, false));
    for t in 0..6u64 {
        c.conn
            .send(rx, &t.to_be_bytes(), b"m", false, 100 + t)
            .unwrap();
    }
    c.take_events();
    c.frame(
        0,
        &disposition(0, Some(2), true, Some(DeliveryState::Released(Released {}))),
    );
    let evs = c.take_events();
    let tokens: Vec<u64> = evs
        .iter()
        .filter_map(|e| match e {
            Event::Settled {
                token,
                state: Some(DeliveryOutcome::Released),
                ..
            } => Some(*token),
            _ => None,
        })
        .collect();
    assert_eq!(tokens, vec![100, 101, 102]);
    // Unsettled terminal state: we settle on the client's behalf, echoing the state.
    let out = c.frame(
        0,
        &disposition(
            3,
            Some(4),
            false,
            Some(DeliveryState::Accepted(Accepted {})),
        ),
    );
    assert!(
        matches!(&out[..], [Out::Frame(0, Performative::Disposition(d))] if d.first == 3 && d.last == 4 && d.settled && d.role == Role::Sender)
    );
    assert_eq!(c.take_events().len(), 2);
    // A repeated range finds nothing left to settle.
    c.frame(0, &disposition(0, Some(4), true, None));
    assert!(c.take_events().is_empty());
    assert_eq!(c.conn.unsettled_count(rx), 1);
}

/// Q-28: one DISPOSITION is scanned for at most 65536 ids; deliveries beyond stay unsettled.
#[test]
fn q_28_disposition_scan_ceiling() {
    let mut c = Client::new(config());
    c.open_session();
    let rx = consumer(&mut c, "r", 0);
    c.frame(0, &link_flow(0, 0, 70_000, false));
    for t in 0..65_538u64 {
        c.conn.send(rx, &t.to_be_bytes(), b"m", false, t).unwrap();
    }
    c.take_events();
    let _ = c.collect();
    c.frame(
        0,
        &disposition(
            0,
            Some(65_537),
            true,
            Some(DeliveryState::Accepted(Accepted {})),
        ),
    );
    let settled = c
        .take_events()
        .iter()
        .filter(|e| matches!(e, Event::Settled { .. }))
        .count();
    assert_eq!(settled, 65_536);
    assert_eq!(c.conn.unsettled_count(rx), 2);
}

/// Outgoing dispositions for contiguous deliveries with the same state are batched into one range.
#[test]
fn disposition_batched_ranges() {
    let mut c = Client::new(config());
    c.open_session();
    let tx = producer(&mut c, "p", 0, 100);
    for i in 0..5u32 {
        c.transfer(
            0,
            &transfer(0, Some(i), Some(&[i as u8]), false, false),
            b"m",
        );
    }
    c.take_events();
    for i in 0..4u32 {
        c.conn
            .settle(tx, i, DeliveryState::Accepted(Accepted {}))
            .unwrap();
    }
    c.conn
        .settle(tx, 4, DeliveryState::Released(Released {}))
        .unwrap();
    let out = c.collect();
    let ranges: Vec<(u32, u32)> = out
        .iter()
        .filter_map(|o| match o {
            Out::Frame(_, Performative::Disposition(d)) => Some((d.first, d.last)),
            _ => None,
        })
        .collect();
    assert_eq!(ranges, vec![(0, 3), (4, 4)]);
}

/// Q-32 groundwork: transport loss reports every link's unsettled deliveries exactly once.
#[test]
fn transport_loss_teardown_once() {
    let mut c = Client::new(config());
    c.open_session();
    let rx = consumer(&mut c, "r", 0);
    c.frame(0, &link_flow(0, 0, 3, false));
    c.conn.send(rx, b"a", b"m", false, 1).unwrap();
    c.take_events();
    c.conn.transport_lost();
    c.conn.transport_lost();
    let evs = c.take_events();
    assert_eq!(
        evs.iter()
            .filter(|e| matches!(e, Event::LinkClosed { unsettled, .. } if unsettled == &vec![1]))
            .count(),
        1
    );
    assert_eq!(
        evs.iter()
            .filter(|e| matches!(e, Event::Closed { .. }))
            .count(),
        1
    );
    assert_eq!(evs.len(), 2);
}

/// ERR-6: every emitted condition is counted by the performative that carried it.
#[test]
fn err_6_error_counts_by_scope() {
    let mut c = Client::new(config());
    c.open_session();
    c.frame(0, &attach_receiver("a", 0, "queues/a"));
    let mut cfg2 = attach_receiver("a", 1, "queues/a");
    cfg2.rcv_settle_mode = ReceiverSettleMode::Second;
    c.frame(0, &cfg2); // DETACH not-implemented
    c.frame(0, &link_flow(9, 0, 1, false)); // END errant-link
    c.frame(1, &begin());
    c.frame(1, &open("again")); // CLOSE not-allowed
    let one = super::ErrorCounts {
        conn: 1,
        session: 1,
        link: 1,
    };
    assert_eq!(c.conn.take_error_counts(), one);
    assert_eq!(
        c.conn.take_error_counts(),
        super::ErrorCounts::default(),
        "taken once"
    );
}

/// GEN-7: every condition the engine emits is one of the 13.
#[test]
fn gen_7_only_known_conditions() {
    for c in super::ALL_CONDITIONS {
        assert!(c.symbol().starts_with("amqp:"));
    }
}

// ---------------------------------------------------------------- detail endpoints (OBS)

/// OBS-3: the attached links in attach order, each with the server's role, the credit as the
/// server sees it, its unsettled deliveries and the dynamic flag, by the id the application knows
/// it by; a refused link and an ended one are not there.
#[test]
fn obs_3_link_views_follow_the_links() {
    let mut c = Client::new(config());
    c.open_session();
    let p = producer(&mut c, "p", 0, 10);
    let r = consumer(&mut c, "r", 1);
    let mut dynamic = attach_receiver("d", 2, "");
    if let Some(s) = dynamic.source.as_mut() {
        s.address = None;
        s.dynamic = true;
    }
    let d = c.request_link(0, &dynamic);
    c.conn
        .accept_dynamic(d, LinkAccept { credit_window: 0 }, "_tmp.1".into())
        .unwrap();
    c.collect();
    let refused = c.request_link(0, &attach_receiver("x", 3, "queues/x"));
    c.conn
        .refuse_link(refused, AmqpError::bare(Condition::NotFound))
        .unwrap();
    c.collect();
    c.frame(0, &link_flow(1, 0, 3, false));
    c.conn.send(r, b"t", b"m", false, 1).unwrap();
    let views = c.conn.link_views();
    let names: Vec<&str> = views.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["p", "r", "d"]);
    assert_eq!(views[0].role, crate::ServerRole::Receiver);
    assert_eq!((views[0].credit, views[0].unsettled), (10, 0));
    assert_eq!([views[0].id, views[1].id, views[2].id], [p, r, d]);
    assert_eq!(views[1].role, crate::ServerRole::Sender);
    assert_eq!((views[1].credit, views[1].unsettled), (2, 1));
    assert!(views[2].dynamic && !views[0].dynamic && !views[1].dynamic);
    c.frame(0, &detach(1));
    let names: Vec<String> = c.conn.link_views().into_iter().map(|v| v.name).collect();
    assert_eq!(names, ["p", "d"]);
}

/// CONN-14: the OPEN properties `product` and `version` are reported when they are strings,
/// without control characters and cut to a bounded length; anything else is ignored.
#[test]
fn conn_14_open_product_and_version_recorded() {
    let opened = |props: Vec<(&str, serde_amqp::Value)>| {
        let mut c = Client::new(config());
        c.raw(&HEADER_AMQP);
        let mut o = open("client-14");
        let mut fields = OrderedMap::new();
        for (k, v) in props {
            fields.insert(fe2o3_amqp_types::primitives::Symbol::from(k), v);
        }
        o.properties = Some(fields);
        c.frame(0, &o);
        match c.take_events().into_iter().next() {
            Some(Event::Opened {
                product, version, ..
            }) => (product, version),
            other => panic!("{other:?}"),
        }
    };
    let (product, version) = opened(vec![
        ("product", serde_amqp::Value::String("QpidJMS".into())),
        ("version", serde_amqp::Value::String("2.7.0\n".into())),
        ("platform", serde_amqp::Value::String("JVM".into())),
    ]);
    assert_eq!(product.as_deref(), Some("QpidJMS"));
    assert_eq!(version.as_deref(), Some("2.7.0"));
    let (product, version) = opened(vec![
        ("product", serde_amqp::Value::String("p".repeat(10_000))),
        ("version", serde_amqp::Value::Uint(3)),
    ]);
    assert_eq!(product.map(|p| p.len()), Some(128));
    assert_eq!(version, None);
}

//! Robustness: arbitrary and mutated byte streams into the frame splitter, the validator, the
//! performative decoder and the whole connection state machine. Nothing may panic, and no input
//! may make the engine hold more than its frame limit (a header claiming 4 GiB allocates nothing).

use bytes::BytesMut;
use proptest::prelude::*;

use super::harness::*;
use crate::codec::decode_performative;
use crate::frame::split_frame;
use crate::validate::value_len;
use crate::HEADER_AMQP;

/// A valid conversation: header, OPEN, BEGIN, a sender and a receiver attach, flows, transfers
/// (one multi-frame), a disposition, detach, end and close.
fn valid_stream() -> Vec<u8> {
    let mut v = HEADER_AMQP.to_vec();
    v.extend(amqp_frame(0, &open("fuzz"), &[]));
    v.extend(amqp_frame(0, &begin(), &[]));
    v.extend(amqp_frame(0, &attach_sender("s", 0, "queues/a"), &[]));
    v.extend(amqp_frame(0, &attach_receiver("r", 1, "queues/a"), &[]));
    v.extend(amqp_frame(0, &link_flow(1, 0, 10, true), &[]));
    v.extend(amqp_frame(
        0,
        &transfer(0, Some(0), Some(b"t"), false, true),
        b"\x00\x53\x75\xa0\x03abc",
    ));
    v.extend(amqp_frame(
        0,
        &transfer(0, None, None, false, false),
        b"def",
    ));
    v.extend(amqp_frame(0, &disposition(0, Some(3), true, None), &[]));
    v.extend(amqp_frame(0, &detach(0), &[]));
    v.extend(amqp_frame(0, &end(), &[]));
    v.extend(amqp_frame(
        0,
        &fe2o3_amqp_types::performatives::Close { error: None },
        &[],
    ));
    v
}

/// Drives a connection with `bytes` split at `cuts`, with an application that accepts every
/// link and settles every delivery; returns the bytes the engine wrote.
fn drive(bytes: &[u8], cuts: &[usize]) -> usize {
    drive_on(Client::new(config()), bytes, cuts)
}

/// Takes `good` as a JWT naming `fuzz`, and refuses anything else.
struct FuzzTokens;
impl crate::TokenVerifier for FuzzTokens {
    fn verify(&self, token: &str) -> Result<crate::VerifiedToken, crate::AuthFailure> {
        if token == "good" {
            Ok("fuzz".into())
        } else {
            Err(crate::AuthFailure("refused".into()))
        }
    }
}

/// A connection on the TLS listener with a verified client certificate and authentication on:
/// every mechanism's path is reachable (EXTERNAL, PLAIN with a token, ANONYMOUS refused).
fn mtls_with_auth() -> Client {
    let cfg = crate::EngineConfig {
        auth: crate::AuthPolicy::Jwt(std::sync::Arc::new(FuzzTokens)),
        ..config()
    };
    let transport = crate::Transport::Tls {
        client_certificate: Some(crate::ClientCertificate {
            common_name: "fuzz client".into(),
        }),
    };
    Client::with(cfg, transport, None)
}

/// Drives `c` with `bytes` split at `cuts`; see [`drive`].
fn drive_on(mut c: Client, bytes: &[u8], cuts: &[usize]) -> usize {
    let mut start = 0;
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.sort_unstable();
    points.push(bytes.len());
    let mut written = 0;
    for p in points {
        if p < start {
            continue;
        }
        let mut buf = BytesMut::from(&bytes[start..p]);
        c.conn.handle_input(c.now, &mut buf);
        start = p;
        while let Some(ev) = c.conn.poll_event() {
            match ev {
                crate::Event::AttachRequested { link, .. } => {
                    let _ = c
                        .conn
                        .accept_link(link, crate::LinkAccept { credit_window: 4 });
                }
                crate::Event::Delivery(d) => {
                    let _ = c.conn.settle(
                        d.link,
                        d.delivery_id,
                        fe2o3_amqp_types::messaging::DeliveryState::Accepted(
                            fe2o3_amqp_types::messaging::Accepted {},
                        ),
                    );
                }
                crate::Event::Credit { link, .. } => {
                    let _ = c.conn.send(link, b"x", b"\x00\x53\x75\xa0\x01z", false, 0);
                    let _ = c.conn.drain_done(link);
                }
                _ => {}
            }
        }
        let mut out = BytesMut::new();
        c.conn.poll_transmit(&mut out);
        written += out.len();
        // The engine's own output must always be well-formed frames.
        let mut check = out.clone();
        while check.len() >= 8 && &check[..4] == b"AMQP" {
            let _ = check.split_to(8);
        }
        while let Ok(Some(f)) = split_frame(&mut check, u32::MAX) {
            if !f.body.is_empty() && f.frame_type == 0 {
                assert!(
                    decode_performative(&f.body).is_ok(),
                    "engine wrote an undecodable frame"
                );
            }
        }
    }
    c.advance(std::time::Duration::from_secs(200));
    c.conn.transport_lost();
    written
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn validator_and_decoder_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = value_len(&bytes);
        let _ = decode_performative(&bytes::Bytes::from(bytes.clone()));
        let mut buf = BytesMut::from(&bytes[..]);
        let _ = split_frame(&mut buf, 512);
    }

    #[test]
    fn arbitrary_bytes_after_open(bytes in proptest::collection::vec(any::<u8>(), 0..2048), cuts in proptest::collection::vec(any::<usize>(), 0..6)) {
        let mut stream = HEADER_AMQP.to_vec();
        stream.extend(amqp_frame(0, &open("fuzz"), &[]));
        stream.extend(amqp_frame(0, &begin(), &[]));
        stream.extend(bytes);
        drive(&stream, &cuts);
    }

    #[test]
    fn mutated_valid_stream(edits in proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..4), 1..8), cuts in proptest::collection::vec(any::<usize>(), 0..6)) {
        let mut stream = valid_stream();
        for (pos, byte, kind) in edits {
            let len = stream.len();
            let at = pos % len;
            match kind {
                0 => stream[at] = byte,
                1 => stream[at] ^= 1 << (byte % 8),
                2 => { stream.insert(at, byte); }
                _ => { stream.remove(at); }
            }
        }
        drive(&stream, &cuts);
    }

    #[test]
    fn mutated_sasl_stream(edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
        let mut stream = crate::HEADER_SASL.to_vec();
        let init = fe2o3_amqp_types::sasl::SaslInit { mechanism: "PLAIN".into(), initial_response: Some(serde_bytes::ByteBuf::from(b"\0u\0p".to_vec())), hostname: None };
        stream.extend(sasl_frame(&init));
        stream.extend(HEADER_AMQP);
        stream.extend(amqp_frame(0, &open("fuzz"), &[]));
        for (pos, byte) in edits {
            let at = pos % stream.len();
            stream[at] = byte;
        }
        drive(&stream, &[]);
    }

    /// The SASL exchange under TLS (the `AMQP 2 1 0 0` header, then SASL) with a verified client
    /// certificate and authentication on, for each mechanism, mutated and cut anywhere.
    #[test]
    fn mutated_sasl_stream_under_tls(
        mechanism in prop::sample::select(vec!["EXTERNAL", "PLAIN", "ANONYMOUS", "SCRAM-SHA-256"]),
        response in proptest::collection::vec(any::<u8>(), 0..64),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let mut stream = crate::HEADER_TLS.to_vec();
        stream.extend(crate::HEADER_SASL);
        let response = if mechanism == "PLAIN" && response.first() == Some(&0) {
            b"\0user\0good".to_vec()
        } else {
            response
        };
        let init = fe2o3_amqp_types::sasl::SaslInit { mechanism: mechanism.into(), initial_response: Some(serde_bytes::ByteBuf::from(response)), hostname: None };
        stream.extend(sasl_frame(&init));
        stream.extend(HEADER_AMQP);
        stream.extend(amqp_frame(0, &open("fuzz"), &[]));
        stream.extend(amqp_frame(0, &begin(), &[]));
        stream.extend(amqp_frame(0, &attach_sender("s", 0, "queues/a"), &[]));
        for (pos, byte) in edits {
            let at = pos % stream.len();
            stream[at] = byte;
        }
        drive_on(mtls_with_auth(), &stream, &cuts);
    }
}

/// The valid conversation itself runs to a clean close.
#[test]
fn valid_stream_closes_cleanly() {
    assert!(drive(&valid_stream(), &[3, 50, 200]) > 0);
}

/// A 4 GiB frame header is refused before any allocation of that size: the connection closes
/// with decode-error after reading 8 bytes.
#[test]
fn four_gib_header_allocates_nothing() {
    let mut c = Client::new(config());
    c.open_session();
    let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xf0, 2, 0, 0, 0][..]);
    c.conn.handle_input(c.now, &mut buf);
    assert!(buf.capacity() < 1 << 20);
    let out = c.collect();
    assert_eq!(
        out.iter().filter_map(condition_of).collect::<Vec<_>>(),
        ["amqp:decode-error"]
    );
}

//! The whole connection state machine on arbitrary input after each possible opening: bare
//! header, SASL header, bare header + OPEN + BEGIN, or — as on the TLS listener with a verified
//! client certificate and authentication on (the connector's JWT verifier) — the TLS header and
//! the SASL header. An application that accepts every link, settles every delivery and answers
//! credit is attached, so the deeper states are reached.
#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use connector::auth::jwt::{JwtVerifier, KeySource, SignatureType};
use connector::config::Settings;
use connector::engine::{
    AdmitAll, AuthPolicy, ClientCertificate, Connection, Event, LinkAccept, Transport,
};
use fe2o3_amqp_types::messaging::{Accepted, DeliveryState};
use libfuzzer_sys::fuzz_target;

const OPENING: &[u8] = &[
    b'A', b'M', b'Q', b'P', 0, 1, 0, 0, // header
    0, 0, 0, 0x17, 2, 0, 0, 0, 0x00, 0x53, 0x10, 0xc0, 0x0a, 0x03, 0xa1, 0x01, b'f', 0x40, 0x70, 0,
    0, 0x10, 0, // OPEN
    0, 0, 0, 0x14, 2, 0, 0, 0, 0x00, 0x53, 0x11, 0xc0, 0x07, 0x04, 0x40, 0x43, 0x52, 0x64, 0x52,
    0x64, // BEGIN
];

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let prefix: &[u8] = match mode % 4 {
        0 => b"AMQP\x00\x01\x00\x00",
        1 => b"AMQP\x03\x01\x00\x00",
        2 => OPENING,
        _ => b"AMQP\x02\x01\x00\x00AMQP\x03\x01\x00\x00",
    };
    let (auth, transport) = if mode % 4 == 3 {
        let Ok(verifier) = JwtVerifier::new(SignatureType::HS256, KeySource::Inline("fuzz-key"))
        else {
            return;
        };
        let transport = Transport::Tls {
            client_certificate: Some(ClientCertificate {
                common_name: "fuzz client".into(),
            }),
        };
        (AuthPolicy::Jwt(Arc::new(verifier)), transport)
    } else {
        (AuthPolicy::Disabled, Transport::Plain)
    };
    let cfg = Arc::new(Settings::default().engine_config(auth));
    let now = Instant::now();
    let mut c = Connection::new(cfg, transport, AdmitAll, now);
    let mut input = BytesMut::from(prefix);
    // Feed in a few chunks so split frames are exercised.
    for chunk in rest.chunks(rest.len() / 3 + 1) {
        input.extend_from_slice(chunk);
        c.handle_input(now, &mut input);
        while let Some(ev) = c.poll_event() {
            match ev {
                Event::AttachRequested { link, .. } => {
                    let _ = c.accept_link(link, LinkAccept { credit_window: 8 });
                }
                Event::Delivery(d) => {
                    let _ = c.settle(d.link, d.delivery_id, DeliveryState::Accepted(Accepted {}));
                }
                Event::Credit { link, .. } => {
                    let _ = c.send(link, b"t", b"\x00\x53\x77\x40", false, 1);
                    let _ = c.drain_done(link);
                }
                _ => {}
            }
        }
        let mut out = BytesMut::new();
        c.poll_transmit(&mut out);
    }
    c.handle_timeout(now + Duration::from_secs(300));
    c.transport_lost();
});

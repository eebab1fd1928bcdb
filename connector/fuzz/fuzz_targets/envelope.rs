//! The message envelope both ways on arbitrary bytes: a received message is validated section by
//! section (UTF-8 strings, ASCII symbols, order, body kinds) and turned into what is stored; what
//! is stored (a Metadata text and a body, which another KubeMQ client may have written) is turned
//! into the message delivered; the same Metadata restamped as a delivered request or a reply, and
//! read for a command's outcome. None may panic, and every delivered message must be valid.
#![no_main]

use std::collections::HashMap;

use bytes::Bytes;
use connector::bridge::envelope::{
    application_properties, egress, ingress, stamped_egress, DeliveryInfo, Stamps,
};
use connector::engine::message::walk;
use libfuzzer_sys::fuzz_target;
use serde_amqp::Value;

fuzz_target!(|data: &[u8]| {
    let info = DeliveryInfo { receive_count: 1 };
    let received = Bytes::copy_from_slice(data);
    if let Ok(stored) = ingress(&received) {
        let out = egress(&stored.metadata, &stored.body, &HashMap::new(), info);
        assert!(walk(&out).is_ok(), "a stored message delivered as an invalid one");
    }
    // Arbitrary stored Metadata (its length in the first byte) and body.
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let (metadata, body) = rest.split_at((n as usize).min(rest.len()));
    let metadata = String::from_utf8_lossy(metadata);
    let out = egress(&metadata, body, &HashMap::new(), info);
    assert!(walk(&out).is_ok(), "stored Metadata delivered as an invalid message");
    // A request delivered to a responder (RPC-12), a command's outcome read from a reply.
    let mut props = [
        ("reply_to", Value::String("/responses/r-1".into())),
        ("correlation_id", Value::String("r-1".into())),
    ];
    let mut app = [("x-opt-kubemq-executed", Value::Bool(true))];
    let stamps = Stamps {
        props: &mut props,
        app: &mut app,
    };
    let out = stamped_egress(&metadata, stamps, body, &HashMap::new(), info);
    assert!(walk(&out).is_ok(), "a restamped Metadata delivered as an invalid message");
    let _ = application_properties(&metadata, ["x-opt-kubemq-executed", "x-opt-kubemq-error"]);
});

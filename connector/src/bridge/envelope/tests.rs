//! Envelope round trips: every section and every marked type survives AMQP → KubeMQ → AMQP
//! (ENV-1 … ENV-14), and the shapes the specification shows are produced.

use std::collections::HashMap;

use fe2o3_amqp_types::messaging::message::__private::Serializable;
use fe2o3_amqp_types::messaging::{
    AmqpSequence, AmqpValue, ApplicationProperties, Body, Data, Header, Message,
    MessageAnnotations, Properties,
};
use fe2o3_amqp_types::primitives::{OrderedMap, SimpleValue, Symbol, Timestamp};
use serde_amqp::Value;
use serde_bytes::ByteBuf;

use super::*;

fn encode<B: fe2o3_amqp_types::messaging::SerializableBody>(m: Message<B>) -> bytes::Bytes {
    serde_amqp::to_vec(&Serializable(m)).unwrap().into()
}

fn sections(msg: &[u8]) -> Vec<(u64, Value)> {
    let layout = walk(msg).unwrap();
    let mut ranges: Vec<std::ops::Range<usize>> = [
        layout.header,
        layout.delivery_annotations,
        layout.message_annotations,
        layout.properties,
        layout.application_properties,
        layout.footer,
    ]
    .into_iter()
    .flatten()
    .collect();
    if !layout.body.is_empty() {
        ranges.push(layout.body.clone());
    }
    ranges
        .into_iter()
        .map(
            |r| match serde_amqp::from_slice::<Value>(&msg[r]).unwrap() {
                Value::Described(d) => (
                    match d.descriptor {
                        Descriptor::Code(c) => c,
                        Descriptor::Name(_) => 0,
                    },
                    d.value,
                ),
                other => panic!("not a section: {other:?}"),
            },
        )
        .collect()
}

/// The value of the section with descriptor `code` in an encoded message.
fn section_of(msg: &[u8], code: u64) -> Value {
    sections(msg)
        .into_iter()
        .find_map(|(c, v)| (c == code).then_some(v))
        .unwrap()
}

/// A section as serde_amqp's generic encoder writes it.
fn generic_section(code: u64, value: Value) -> Vec<u8> {
    serde_amqp::to_vec(&Described {
        descriptor: Descriptor::Code(code),
        value,
    })
    .unwrap()
}

fn first_delivery() -> DeliveryInfo {
    DeliveryInfo { receive_count: 1 }
}

/// The hand-encoded header and Data sections equal what the generic encoder writes, for every
/// encoding width they can take (uint 0 / small / large, vbin8 / vbin32, empty).
#[test]
fn hand_encoded_sections_match_the_encoder() {
    for (ttl, priority, first, count) in [
        (None, None, true, 0u32),
        (Some(0), Some(0), false, 1),
        (Some(255), Some(9), false, 255),
        (Some(256), None, false, 256),
        (Some(u32::MAX), Some(255), false, u32::MAX),
    ] {
        let mut fast = Vec::new();
        push_header(&mut fast, ttl, priority, first, count);
        let generic = generic_section(
            0x70,
            Value::List(vec![
                Value::Bool(true),
                priority.map_or(Value::Null, Value::Ubyte),
                ttl.map_or(Value::Null, Value::Uint),
                Value::Bool(first),
                Value::Uint(count),
            ]),
        );
        assert_eq!(sections(&fast), sections(&generic), "{ttl:?} {count}");
        let header: Header = serde_amqp::from_slice(&fast).unwrap();
        assert_eq!(
            (
                header.durable,
                header.ttl,
                header.first_acquirer,
                header.delivery_count
            ),
            (true, ttl, first, count)
        );
    }
    for len in [0usize, 1, 255, 256, 70_000] {
        let body = vec![0x5a; len];
        let mut fast = Vec::new();
        push_data(&mut fast, &body);
        let generic = generic_section(0x75, Value::Binary(ByteBuf::from(body.clone())));
        // serde_amqp switches to vbin32 one byte early; both are valid, the values must match.
        assert_eq!(sections(&fast), sections(&generic), "{len}");
    }
}

/// ENV-1 … ENV-5, ENV-8, ENV-10 … ENV-13: properties (with a ulong message-id and a uuid
/// correlation-id), application properties of many types, annotations and several Data sections.
#[test]
fn env_full_round_trip() {
    let uuid = uuid::Uuid::parse_str("0f8fad5b-d9cb-469f-a165-70867728950e").unwrap();
    let app = ApplicationProperties::builder()
        .insert("color", "red")
        .insert("small", 42i64)
        .insert("big", 1i64 << 60)
        .insert("u8", SimpleValue::Ubyte(7))
        .insert("i32", 7i32)
        .insert("u64", SimpleValue::Ulong(u64::MAX))
        .insert("f64", 1.5f64)
        .insert("flag", true)
        .insert("bin", SimpleValue::Binary(ByteBuf::from(vec![0, 255, 3])))
        .insert("id", SimpleValue::Uuid((*uuid.as_bytes()).into()))
        .insert(
            "when",
            SimpleValue::Timestamp(Timestamp::from_milliseconds(1_700_000_000_123)),
        )
        .insert("sym", SimpleValue::Symbol(Symbol::from("s")))
        .build();
    let mut ann = OrderedMap::new();
    ann.insert(
        Symbol::from("x-opt-kubemq-group").into(),
        Value::String("g1".into()),
    );
    ann.insert(
        Symbol::from("x-opt-list").into(),
        Value::List(vec![Value::Int(1), Value::String("two".into())]),
    );
    let msg = Message::builder()
        .header(Header {
            ttl: Some(5000),
            ..Default::default()
        })
        .message_annotations(MessageAnnotations(ann))
        .properties(
            Properties::builder()
                .message_id(42u64)
                .correlation_id(fe2o3_amqp_types::messaging::MessageId::Uuid(
                    (*uuid.as_bytes()).into(),
                ))
                .to("queues/orders")
                .subject("s")
                .content_type("application/json")
                .creation_time(Timestamp::from_milliseconds(1_700_000_000_999))
                .group_sequence(9)
                .build(),
        )
        .application_properties(app)
        .body(Body::<Value>::Data(
            vec![
                Data(ByteBuf::from(b"hello ".to_vec())),
                Data(ByteBuf::from(b"world".to_vec())),
            ]
            .into(),
        ))
        .build();
    let bytes = encode(msg);
    let stored = ingress(&bytes).unwrap();
    assert_eq!(
        &stored.body[..],
        b"hello world",
        "ENV-8: Data sections concatenated"
    );
    let j: Json = serde_json::from_str(&stored.metadata).unwrap();
    let env = &j["amqp10"];
    assert_eq!(env["body_section"], "data");
    assert_eq!(
        env["props"]["content_type"], "application/json",
        "the documented plain form"
    );
    assert_eq!(env["props"]["message_id"], json!({"$u64": "42"}));
    assert_eq!(env["props"]["ttl"], 5000);
    assert_eq!(env["app"]["color"], "red");
    assert_eq!(
        env["app"]["small"], 42,
        "ENV-11: a long within 2^53 is a plain number"
    );
    assert_eq!(
        env["app"]["big"],
        json!({"$int64": (1i64 << 60).to_string()})
    );
    assert_eq!(env["annotations"]["x-opt-kubemq-group"], "g1");

    let out = egress(
        &stored.metadata,
        &stored.body,
        &HashMap::new(),
        first_delivery(),
    );
    let before = sections(&bytes);
    let after = sections(&out);
    let pick =
        |v: &[(u64, Value)], code| v.iter().find(|(c, _)| *c == code).map(|(_, v)| v.clone());
    for code in [0x72, 0x73, 0x74] {
        assert_eq!(
            pick(&after, code),
            pick(&before, code),
            "section 0x{code:x} restored exactly (ENV-13)"
        );
    }
    // One Data section with the concatenated bytes (ENV-12).
    assert_eq!(
        pick(&after, 0x75),
        Some(Value::Binary(ByteBuf::from(b"hello world".to_vec())))
    );
    // The header is the connector's: ttl kept, first delivery.
    let Some(Value::List(h)) = pick(&after, 0x70) else {
        panic!()
    };
    assert_eq!(h[2], Value::Uint(5000));
    assert_eq!(
        (h[3].clone(), h[4].clone()),
        (Value::Bool(true), Value::Uint(0))
    );
}

/// Q-17 / ENV-14: delivery-count = ReceiveCount − 1, first-acquirer = (ReceiveCount == 1).
#[test]
fn q_17_redelivery_header() {
    let stored = ingress(&encode(
        Message::builder()
            .data(ByteBuf::from(b"x".to_vec()))
            .build(),
    ))
    .unwrap();
    let out = egress(
        &stored.metadata,
        &stored.body,
        &HashMap::new(),
        DeliveryInfo { receive_count: 3 },
    );
    let Value::List(h) = sections(&out)[0].1.clone() else {
        panic!()
    };
    assert_eq!(
        (h[3].clone(), h[4].clone()),
        (Value::Bool(false), Value::Uint(2))
    );
}

/// ENV-8 / OP-ENV-5: an AmqpValue body is stored as its AMQP encoding and restored exactly.
#[test]
fn env_value_body_round_trip() {
    for v in [
        Value::String("héllo".into()),
        Value::Long(-5),
        Value::List(vec![Value::Bool(true)]),
    ] {
        let bytes = encode(
            Message::builder()
                .body(Body::Value(AmqpValue(v.clone())))
                .build(),
        );
        let stored = ingress(&bytes).unwrap();
        assert!(stored.metadata.contains(r#""body_section":"value""#));
        let out = egress(
            &stored.metadata,
            &stored.body,
            &HashMap::new(),
            first_delivery(),
        );
        let body = sections(&out)
            .into_iter()
            .find(|(c, _)| *c == 0x77)
            .map(|(_, v)| v);
        assert_eq!(body, Some(v));
    }
}

/// A connection's Egress, which reuses the reading of the last Metadata, encodes every delivery
/// exactly as egress alone: across repeated and changing Metadata, tags, bodies of both kinds
/// and redeliveries.
#[test]
fn egress_reusing_the_last_metadata_encodes_the_same() {
    let with_props = ingress(&encode(
        Message::builder()
            .properties(Properties::builder().message_id(7u64).build())
            .data(ByteBuf::from(b"p".to_vec()))
            .build(),
    ))
    .unwrap()
    .metadata;
    let value = ingress(&encode(Message::builder().value(Value::Uint(7)).build())).unwrap();
    let mut tags = HashMap::new();
    tags.insert("k".to_string(), "v".to_string());
    let none = HashMap::new();
    let data = r#"{"amqp10":{"body_section":"data"}}"#.to_string();
    type Case<'a> = (String, Vec<u8>, &'a HashMap<String, String>, i32);
    let cases: Vec<Case> = vec![
        (data.clone(), b"one".to_vec(), &none, 1),
        (data.clone(), b"two".to_vec(), &none, 3),
        (with_props.clone(), b"three".to_vec(), &none, 1),
        (with_props.clone(), b"four".to_vec(), &tags, 2),
        (with_props, b"five".to_vec(), &none, 1),
        (value.metadata.clone(), value.body.to_vec(), &none, 1),
        (value.metadata, b"not a value".to_vec(), &none, 1),
        ("plain".into(), b"raw".to_vec(), &tags, 1),
        ("plain".into(), b"raw".to_vec(), &none, 4),
        (data, b"six".to_vec(), &none, 1),
    ];
    let mut e = Egress::default();
    for (metadata, body, tags, receive_count) in cases {
        let info = DeliveryInfo { receive_count };
        assert_eq!(
            e.message(&metadata, &body, tags, info),
            egress(&metadata, &body, tags, info),
            "{metadata} {body:?}"
        );
    }
}

/// The envelopes ingress writes without printing (a message with nothing but its body) are
/// exactly what printing would give, and the body is the received bytes themselves.
#[test]
fn body_only_envelopes_match_the_printed_form() {
    for (msg, printed) in [
        (
            encode(
                Message::builder()
                    .data(ByteBuf::from(b"abc".to_vec()))
                    .build(),
            ),
            serde_json::to_string(&json!({"amqp10": {"body_section": "data"}})).unwrap(),
        ),
        (
            encode(Message::builder().value(Value::Uint(7)).build()),
            serde_json::to_string(&json!({"amqp10": {"body_section": "value"}})).unwrap(),
        ),
        (
            serde_amqp::to_vec(&Header::default()).unwrap().into(),
            serde_json::to_string(&json!({"amqp10": {}})).unwrap(),
        ),
    ] {
        let stored = ingress(&msg).unwrap();
        assert_eq!(stored.metadata, printed);
        if !stored.body.is_empty() {
            let within = msg.as_ptr_range();
            assert!(
                within.contains(&stored.body.as_ptr()),
                "a single body section is shared, not copied"
            );
        }
    }
}

/// ENV-2: an empty message still gets the minimal envelope; it comes back as an empty Data body.
#[test]
fn env_2_minimal_envelope() {
    // A header and nothing else: no properties, no annotations, no body section.
    let bytes = serde_amqp::to_vec(&Header::default()).unwrap().into();
    let stored = ingress(&bytes).unwrap();
    assert_eq!(stored.metadata, r#"{"amqp10":{}}"#);
    assert!(stored.body.is_empty());
}

/// ENV-9 / Q-9: AmqpSequence bodies are refused; a mixed body is malformed.
#[test]
fn env_9_sequence_and_mixed_bodies() {
    let seq = encode(
        Message::builder()
            .body(Body::Sequence(
                vec![AmqpSequence(vec![Value::Int(1)])].into(),
            ))
            .build(),
    );
    assert_eq!(ingress(&seq), Err(IngressError::SequenceBody));
    let mut mixed = serde_amqp::to_vec(&Data(ByteBuf::from(b"x".to_vec()))).unwrap();
    mixed.extend(serde_amqp::to_vec(&AmqpValue("v".to_string())).unwrap());
    assert!(matches!(
        ingress(&mixed.into()),
        Err(IngressError::Malformed(_))
    ));
}

/// OP-ENV-6: a message from a plain gRPC producer (no envelope) is delivered with a Data body, its
/// Metadata as the `x-opt-kubemq-metadata` annotation and its Tags as application properties.
#[test]
fn op_env_6_plain_grpc_message() {
    let tags = HashMap::from([("k".to_string(), "v".to_string())]);
    let out = egress("plain text", b"raw", &tags, first_delivery());
    let s = sections(&out);
    let ann = s
        .iter()
        .find(|(c, _)| *c == 0x72)
        .map(|(_, v)| v.clone())
        .unwrap();
    let Value::Map(m) = ann else { panic!() };
    assert_eq!(
        m.get(&Value::Symbol(Symbol::from("x-opt-kubemq-metadata"))),
        Some(&Value::String("plain text".into()))
    );
    assert!(s
        .iter()
        .any(|(c, v)| *c == 0x74 && matches!(v, Value::Map(m) if m.len() == 1)));
    assert!(s
        .iter()
        .any(|(c, v)| *c == 0x75 && *v == Value::Binary(ByteBuf::from(b"raw".to_vec()))));
}

/// An envelope with keys we do not write (a newer writer) or a section that is not an object is
/// still an envelope: the parts that make sense are used, nothing becomes an annotation. JSON
/// that has no `amqp10` object is not an envelope (OP-ENV-6).
#[test]
fn envelope_read_leniently() {
    let tags = HashMap::new();
    let odd = r#"{"amqp10":{"props":5,"future":[1],"app":{"k":"v"},"body_section":"data"},"x":0}"#;
    let s = sections(&egress(odd, b"b", &tags, first_delivery()));
    assert!(
        !s.iter().any(|(c, _)| *c == 0x72),
        "no metadata annotation: {s:?}"
    );
    assert!(
        !s.iter().any(|(c, _)| *c == 0x73),
        "props that are not an object are dropped"
    );
    assert!(s
        .iter()
        .any(|(c, v)| *c == 0x74 && matches!(v, Value::Map(m) if m.len() == 1)));
    for not_envelope in [
        r#"{"amqp10":null}"#,
        r#"{"amqp10":[1]}"#,
        r#"[{"amqp10":{}}]"#,
        "{}",
    ] {
        let s = sections(&egress(not_envelope, b"b", &tags, first_delivery()));
        assert!(
            s.iter().any(|(c, _)| *c == 0x72),
            "{not_envelope} is delivered as the metadata annotation"
        );
    }
}

/// ENV-10 / OP-ENV-3: every marker round-trips through JSON.
#[test]
fn markers_round_trip() {
    let uuid = uuid::Uuid::new_v4();
    let values = vec![
        Value::Null,
        Value::Bool(false),
        Value::Ubyte(255),
        Value::Byte(-128),
        Value::Short(-3),
        Value::Ushort(65535),
        Value::Int(i32::MIN),
        Value::Uint(u32::MAX),
        Value::Long(i64::MAX),
        Value::Long(-(1 << 53)),
        Value::Ulong(u64::MAX),
        Value::Float(1.25f32.into()),
        Value::Double(f64::MIN_POSITIVE.into()),
        Value::Timestamp(Timestamp::from_milliseconds(-1)),
        Value::Binary(ByteBuf::from(vec![1, 2, 3])),
        Value::Uuid((*uuid.as_bytes()).into()),
        Value::String("s".into()),
        Value::Symbol(Symbol::from("sym")),
        Value::Char('é'),
        Value::List(vec![Value::Int(1), Value::Null]),
        Value::Map(
            [(Value::Int(1), Value::String("a".into()))]
                .into_iter()
                .collect(),
        ),
        Value::Array(Array(vec![Value::Uint(1), Value::Uint(2)])),
        Value::Described(Box::new(Described {
            descriptor: Descriptor::Code(0x1234),
            value: Value::String("d".into()),
        })),
    ];
    for v in values {
        let j = value_to_json(v.clone());
        let text = j.to_string();
        let back = value_from_json(&serde_json::from_str(&text).unwrap());
        assert_eq!(back, v, "{text}");
    }
}

/// OP-ENV-4: `$ts` is Unix seconds with the milliseconds as the fraction, and reads back to the
/// same millisecond.
#[test]
fn op_env_4_timestamp_is_seconds_with_a_fraction() {
    let t = Value::Timestamp(Timestamp::from_milliseconds(1_700_000_000_123));
    let j = value_to_json(t.clone());
    assert_eq!(j, serde_json::json!({"$ts": 1_700_000_000.123}));
    assert_eq!(value_from_json(&j), t);
}

/// Values serde_amqp's encoder panics on or mistypes (a timestamp as a map key, followed by
/// binary or text), which any KubeMQ client may write into an envelope, are delivered as a valid
/// message holding them.
#[test]
fn timestamp_map_keys_are_delivered() {
    let tags = HashMap::new();
    for metadata in [
        r#"{"amqp10":{"props":{"subject":{"$map":[[{"$ts":0},{"$bin":""}]]}}}}"#,
        r#"{"amqp10":{"app":{"a":{"$map":[[{"$ts":0},"x"]]}}}}"#,
    ] {
        let out = egress(metadata, b"b", &tags, first_delivery());
        let map = sections(&out)
            .into_iter()
            .find_map(|(c, v)| match (c, v) {
                (0x73, Value::List(f)) => f.get(3).cloned(),
                (0x74, Value::Map(m)) => m.get(&Value::String("a".into())).cloned(),
                _ => None,
            })
            .unwrap();
        let Value::Map(m) = map else {
            panic!("{map:?}")
        };
        let (k, v) = m.iter().next().unwrap();
        assert_eq!(*k, Value::Timestamp(Timestamp::from_milliseconds(0)));
        assert!(matches!(v, Value::Binary(_) | Value::String(_)), "{v:?}");
    }
}

/// A content-type sent as a string that is not ASCII cannot be a symbol: it comes back as the
/// string it was, and the delivered message stays valid.
#[test]
fn non_ascii_content_type_stays_a_string() {
    let mut props = vec![Value::Null; 6];
    props.push(Value::String("¡".into()));
    let mut msg = Vec::new();
    encode::section(&mut msg, 0x73, &Value::List(props));
    let stored = ingress(&msg.into()).unwrap();
    let out = egress(&stored.metadata, b"", &HashMap::new(), first_delivery());
    let Value::List(fields) = section_of(&out, 0x73) else {
        panic!("properties are a list")
    };
    assert_eq!(fields[6], Value::String("¡".into()));
}

/// OP-ENV-3: an `$array` is delivered as an AMQP array when its items share one primitive type;
/// an empty one as an array of nulls (with its element constructor, which AMQP requires even for
/// no elements); items of mixed or compound types (which only a native client's Metadata can
/// hold: AMQP has no array of them) as a list of the same values.
#[test]
fn op_env_3_arrays_without_one_amqp_type() {
    let metadata = r#"{"amqp10":{"app":{"same":{"$array":[{"$u32":1},{"$u32":300}]},"mixed":{"$array":[1,"x"]}}}}"#;
    let out = egress(metadata, b"", &HashMap::new(), first_delivery());
    let Value::Map(app) = section_of(&out, 0x74) else {
        panic!("application-properties are a map")
    };
    let get = |k: &str| app.get(&Value::String(k.into())).cloned().unwrap();
    assert_eq!(
        get("same"),
        Value::Array(Array(vec![Value::Uint(1), Value::Uint(300)]))
    );
    assert_eq!(
        get("mixed"),
        Value::List(vec![Value::Long(1), Value::String("x".into())])
    );
    // serde_amqp reads an empty array without its constructor, so the bytes are checked here.
    let mut empty = Vec::new();
    encode::value(&mut empty, &value_from_json(&json!({"$array": []})));
    assert_eq!(empty, [0xe0, 0x02, 0x00, 0x40]);
    assert_eq!(crate::engine::validate::value_len(&empty), Ok(4));
}

/// Lists and maps whose items take 255 bytes or more get the wide header, as serde_amqp writes it.
#[test]
fn wide_compounds_match_serde_amqp() {
    for len in [252, 253, 254, 255, 300] {
        let text = Value::String("x".repeat(len));
        for v in [
            Value::List(vec![text.clone()]),
            Value::Map([(Value::Null, text.clone())].into_iter().collect()),
            Value::List(vec![Value::List(vec![text.clone(), Value::Uint(7)])]),
        ] {
            let mut mine = Vec::new();
            encode::value(&mut mine, &v);
            assert_eq!(mine, serde_amqp::to_vec(&v).unwrap(), "{len}");
        }
    }
}

mod generated {
    use proptest::prelude::*;

    use super::*;

    fn scalar() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u8>().prop_map(Value::Ubyte),
            any::<i8>().prop_map(Value::Byte),
            any::<i16>().prop_map(Value::Short),
            any::<u16>().prop_map(Value::Ushort),
            any::<i32>().prop_map(Value::Int),
            any::<u32>().prop_map(Value::Uint),
            any::<i64>().prop_map(Value::Long),
            any::<u64>().prop_map(Value::Ulong),
            any::<f32>().prop_map(|f| Value::Float(f.into())),
            any::<f64>().prop_map(|f| Value::Double(f.into())),
            any::<i64>().prop_map(|t| Value::Timestamp(Timestamp::from_milliseconds(t / 4))),
            proptest::collection::vec(any::<u8>(), 0..8)
                .prop_map(|b| Value::Binary(ByteBuf::from(b))),
            any::<[u8; 16]>().prop_map(|u| Value::Uuid(u.into())),
            ".{0,6}".prop_map(Value::String),
            "[a-z\\-]{0,6}".prop_map(|s| Value::Symbol(Symbol::from(s))),
            any::<char>().prop_map(Value::Char),
            any::<[u8; 4]>().prop_map(|d| Value::Decimal32(d.into())),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        scalar().prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::List),
                proptest::collection::vec((inner.clone(), inner.clone()), 0..3)
                    .prop_map(|kv| Value::Map(kv.into_iter().collect())),
                (any::<u64>(), inner.clone()).prop_map(|(c, v)| Value::Described(Box::new(
                    serde_amqp::described::Described {
                        descriptor: serde_amqp::descriptor::Descriptor::Code(c),
                        value: v
                    }
                ))),
            ]
        })
    }

    /// JSON of any shape, with keys that are markers, almost markers and plain names.
    fn json() -> impl Strategy<Value = Json> {
        let key = prop_oneof![
            Just("$u64"),
            Just("$u8"),
            Just("$i32"),
            Just("$f64"),
            Just("$ts"),
            Just("$bin"),
            Just("$uuid"),
            Just("$sym"),
            Just("$char"),
            Just("$map"),
            Just("$array"),
            Just("$described"),
            Just("$dec32"),
            Just("$int64"),
            Just("$nope"),
            Just("k"),
            Just("u64"),
        ];
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            any::<i64>().prop_map(Json::from),
            any::<u64>().prop_map(Json::from),
            (-1e6f64..1e6).prop_map(Json::from),
            prop_oneof![
                Just("7".to_string()),
                Just("-1".to_string()),
                Just("AQID".to_string()),
                Just("0d6f1f9e-8c4b-4a6e-9d7e-3b1f2a4c5d6e".to_string()),
                Just("é".to_string()),
                ".{0,6}",
            ]
            .prop_map(Json::String),
        ];
        leaf.prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Json::Array),
                proptest::collection::vec((key.clone(), inner), 0..3).prop_map(|entries| {
                    Json::Object(
                        entries
                            .into_iter()
                            .map(|(k, v)| (k.to_string(), v))
                            .collect(),
                    )
                }),
            ]
        })
    }

    /// Whether serde_amqp, the reference encoder, gets `v` wrong: it mistypes (or panics on)
    /// what follows a timestamp inside a map key.
    fn upsets_serde_amqp(v: &Value) -> bool {
        format!("{v:?}").contains("Timestamp")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// ENV-10, ENV-11: the JSON ingress writes straight from an AMQP value is exactly what
        /// value_to_json prints, and what egress reads straight from it is exactly what
        /// value_from_json makes of the parsed JSON.
        #[test]
        fn env_10_json_written_and_read_without_a_tree(v in value()) {
            let mut out = Vec::new();
            write::value(&mut out, &v);
            let text = String::from_utf8(out).unwrap();
            prop_assert_eq!(&text, &value_to_json(v.clone()).to_string());
            let read: read::FromJson = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(read.0, value_from_json(&serde_json::from_str(&text).unwrap()));
        }

        /// Any JSON (marker keys holding what no writer puts there, repeated keys, markers beside
        /// other keys) is read straight into what value_from_json makes of the parsed JSON.
        #[test]
        fn any_json_read_without_a_tree(j in json()) {
            let text = j.to_string();
            let read: read::FromJson = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(read.0, value_from_json(&j), "{}", text);
        }

        /// RPC-6, RPC-12: a stamped delivery is the envelope read whole with the stamps set over
        /// it, although the stamped fields are skipped unread (any value, given once or twice).
        #[test]
        fn stamped_fields_are_skipped_unread(
            fields in proptest::collection::vec(
                (prop::sample::select(&PROPS[..]), prop_oneof![value(), json().prop_map(|j| value_from_json(&j))]),
                0..8,
            ),
            stamps in proptest::collection::vec((prop::sample::select(&PROPS[..]), value()), 0..3),
        ) {
            let mut text = String::from(r#"{"amqp10":{"props":{"#);
            for (i, (name, v)) in fields.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                text.push_str(&format!("{}:{}", Json::from(*name), value_to_json(v.clone())));
            }
            text.push_str(r#"},"body_section":"data"}}"#);
            let mut given = stamps.clone();
            let fast = stamped_egress(
                &text,
                Stamps { props: &mut given, app: &mut [] },
                b"body",
                &HashMap::new(),
                first_delivery(),
            );
            // The reference: the parsed JSON converted whole, then the stamps set over it.
            let parsed: Json = serde_json::from_str(&text).unwrap();
            let mut env = read::Sections::default();
            for (name, j) in parsed["amqp10"]["props"].as_object().unwrap() {
                env.props.set(name, j);
            }
            for (name, v) in stamps {
                env.props.set_value(name, v);
            }
            let mut whole = Vec::new();
            push_header(&mut whole, env.props.ttl, env.props.priority, true, 0);
            write_sections(&mut whole, env, &HashMap::new()).finish(&mut whole, b"body");
            prop_assert_eq!(fast, whole, "{}", text);
        }

        /// Header and properties fields read by hand are what serde_amqp reads (and lists the hand
        /// reader does not know go to serde_amqp).
        #[test]
        fn hand_read_fields_match_serde_amqp(fields in proptest::collection::vec(value(), 0..14)) {
            let mut section = Vec::new();
            encode::section(&mut section, 0x73, &Value::List(fields.clone()));
            if let Some(mine) = section_fields(&section) {
                prop_assert_eq!(Value::List(mine), section_value(&section, &(0..section.len()), "t").unwrap());
            } else {
                prop_assert!(fields.iter().any(|v| matches!(v, Value::List(_) | Value::Map(_) | Value::Array(_) | Value::Described(_) | Value::Float(_) | Value::Double(_) | Value::Char(_) | Value::Decimal32(_) | Value::Decimal64(_) | Value::Decimal128(_))));
            }
        }

        /// The hand encoder writes valid AMQP, byte for byte what serde_amqp writes wherever
        /// serde_amqp gets it right.
        #[test]
        fn hand_encoding_matches_serde_amqp(v in value()) {
            let mut mine = Vec::new();
            encode::value(&mut mine, &v);
            prop_assert_eq!(crate::engine::validate::value_len(&mine), Ok(mine.len()));
            if !upsets_serde_amqp(&v) {
                prop_assert_eq!(mine, serde_amqp::to_vec(&v).unwrap());
            }
        }
    }
}

proptest::proptest! {
    /// Any bytes into ingress, any text into egress: no panic (every decoder is fuzzed).
    #[test]
    fn arbitrary_input_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512), text in ".{0,200}") {
        let _ = ingress(&bytes.clone().into());
        let _ = egress(&text, &bytes, &HashMap::new(), first_delivery());
        let _ = serde_json::from_str::<Json>(&text).map(|j| value_from_json(&j));
    }
}

/// The trace context among the application properties (`traceparent`, `tracestate`,
/// `Diagnostic-Id`, string values only) is taken for the KubeMQ message's tags; the application
/// properties themselves, the others included, are delivered unchanged, the envelope's winning
/// over the tags.
#[test]
fn trace_context_becomes_tags_and_is_delivered_unchanged() {
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let app = ApplicationProperties::builder()
        .insert("traceparent", traceparent)
        .insert("tracestate", "congo=t61rcWkgMzE")
        .insert(
            "Diagnostic-Id",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .insert("TraceParent", "not the key: names are case-sensitive")
        .insert("color", "red")
        .build();
    let msg = Message::builder()
        .application_properties(app)
        .body(Body::<Value>::Data(
            vec![Data(ByteBuf::from(b"x".to_vec()))].into(),
        ))
        .build();
    let stored = ingress(&encode(msg)).unwrap();
    assert_eq!(
        stored.trace_tags,
        HashMap::from([
            ("traceparent".to_string(), traceparent.to_string()),
            ("tracestate".to_string(), "congo=t61rcWkgMzE".to_string()),
            (
                "Diagnostic-Id".to_string(),
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_string()
            ),
        ])
    );
    let out = egress(
        &stored.metadata,
        &stored.body,
        &stored.trace_tags,
        first_delivery(),
    );
    let Value::Map(delivered) = section_of(&out, 0x74) else {
        panic!("application properties")
    };
    assert_eq!(delivered.len(), 5, "{delivered:?}");
    assert_eq!(
        delivered.get(&Value::String("traceparent".into())),
        Some(&Value::String(traceparent.into()))
    );
    assert_eq!(
        delivered.get(&Value::String("color".into())),
        Some(&Value::String("red".into()))
    );

    // A trace key with a value that is not a string is not a trace context.
    let msg = Message::builder()
        .application_properties(
            ApplicationProperties::builder()
                .insert("tracestate", 7i64)
                .build(),
        )
        .body(Body::<Value>::Data(
            vec![Data(ByteBuf::from(b"x".to_vec()))].into(),
        ))
        .build();
    assert!(ingress(&encode(msg)).unwrap().trace_tags.is_empty());
}

//! Queue requirements no client library expresses directly, with raw frames over a real socket
//! against the real connector, each on both backends (the embedded store in-process, and the
//! KubeMQ gRPC client talking to the store's façade); each test cites its requirement
//! (docs/requirements.md). Waits are "until it arrived", never fixed sleeps sized for one backend: over gRPC a
//! Get that asks for more than is ready waits up to its full second (KMQ-6).

use std::time::Duration;

use connector::config::Settings;
use connector::engine::codec::Performative;
use connector::engine::peer::{self, begin, link_flow, open};
use connector::engine::DeliveryOutcome;
use connector::engine::HEADER_AMQP;
use fe2o3_amqp_types::definitions::{Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{
    Accepted, AmqpSequence, AmqpValue, Data, DeliveryState, Modified, Released,
};
use fe2o3_amqp_types::performatives::Disposition;
use interop_tests::TestConnector;
use serde_amqp::Value;
use serde_bytes::ByteBuf;
use testkit::raw::{condition, RawPeer, Received};

const WAIT: Duration = Duration::from_secs(3);

fn data(body: &[u8]) -> Vec<u8> {
    serde_amqp::to_vec(&Data(ByteBuf::from(body.to_vec()))).unwrap()
}

fn session(c: &TestConnector) -> RawPeer {
    let mut p = RawPeer::connect(c.addr);
    p.write(&HEADER_AMQP);
    p.frame(0, &open("raw-queues"), &[]);
    p.frame(0, &begin(), &[]);
    p.read_until(WAIT, |r| {
        matches!(r, Received::Frame(_, Performative::Begin(_)))
    });
    p
}

/// Attaches a producer on `handle` and waits for its credit.
fn producer(p: &mut RawPeer, name: &str, handle: u32, channel: &str, mode: SenderSettleMode) {
    let mut a = peer::attach_sender(name, handle, &format!("queues/{channel}"));
    a.snd_settle_mode = mode;
    p.frame(0, &a, &[]);
    let got = p.read_until(WAIT, |r| matches!(r, Received::Frame(_, Performative::Flow(f)) if f.handle.as_ref().map(|h| h.0) == Some(handle)));
    assert!(
        got.iter()
            .any(|r| matches!(r, Received::Frame(_, Performative::Flow(_)))),
        "no credit for {name}: {got:?}"
    );
}

fn disposition_of(got: &[Received], id: u32) -> Option<Option<DeliveryOutcome>> {
    got.iter().find_map(|r| match r {
        Received::Frame(_, Performative::Disposition(d)) if d.first <= id && id <= d.last => {
            Some(d.state.clone())
        }
        _ => None,
    })
}

/// Sends one unsettled message and returns the outcome the connector answered with.
fn produce(p: &mut RawPeer, handle: u32, id: u32, payload: &[u8]) -> Option<DeliveryOutcome> {
    p.frame(
        0,
        &peer::transfer(handle, Some(id), Some(&id.to_be_bytes()), false, false),
        payload,
    );
    let got = p.read_until(WAIT, |r| matches!(r, Received::Frame(_, Performative::Disposition(d)) if d.first <= id && id <= d.last));
    disposition_of(&got, id).flatten()
}

/// Attaches a consumer and grants `credit`; returns the transfers (delivery-id, settled, payload)
/// once `expect` arrived (or WAIT passed), plus whatever else comes within a short grace period,
/// so a delivery beyond what was expected is seen. With `expect` 0 it watches for NOTHING_WINDOW.
fn consume(
    p: &mut RawPeer,
    name: &str,
    handle: u32,
    channel: &str,
    credit: u32,
    mode: SenderSettleMode,
    expect: usize,
) -> Vec<(u32, bool, bytes::Bytes)> {
    let mut a = peer::attach_receiver(name, handle, &format!("queues/{channel}"));
    a.snd_settle_mode = mode;
    p.frame(0, &a, &[]);
    p.frame(0, &link_flow(handle, 0, credit, false), &[]);
    await_transfers(p, expect)
}

/// How long a test watches for something that must not happen.
const NOTHING_WINDOW: Duration = Duration::from_millis(600);

/// Reads until `expect` transfers arrived (or WAIT passed), then a grace period for extras.
fn await_transfers(p: &mut RawPeer, expect: usize) -> Vec<(u32, bool, bytes::Bytes)> {
    if expect == 0 {
        return transfers(&p.read_all(NOTHING_WINDOW).0);
    }
    // read_until re-tests everything read so far on each turn, so its predicate must not count:
    // read on until the transfers gathered are enough.
    let deadline = std::time::Instant::now() + WAIT;
    let mut got = Vec::new();
    while transfers(&got).len() < expect {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        got.extend(p.read_until(left, |r| {
            matches!(r, Received::Frame(_, Performative::Transfer(..)))
        }));
    }
    got.extend(p.read_all(Duration::from_millis(150)).0);
    transfers(&got)
}

fn transfers(got: &[Received]) -> Vec<(u32, bool, bytes::Bytes)> {
    got.iter()
        .filter_map(|r| match r {
            Received::Frame(_, Performative::Transfer(t, payload)) => Some((
                t.delivery_id.unwrap_or(0),
                t.settled.unwrap_or(false),
                payload.clone(),
            )),
            _ => None,
        })
        .collect()
}

fn settle(p: &mut RawPeer, first: u32, last: u32, state: Option<DeliveryState>) {
    let d = Disposition {
        role: Role::Receiver,
        first,
        last: Some(last),
        settled: true,
        state,
        batchable: false,
    };
    p.frame(0, &d, &[]);
}

/// Waits (up to WAIT) until `done` holds: for effects that happen after the frames that caused
/// them (a settlement reaching the store, a gauge dropping when a socket closes).
fn eventually(what: &str, done: impl Fn() -> bool) {
    testkit::eventually(what, WAIT, done);
}

/// The delivery-count in a delivered message's header.
fn delivery_count(payload: &[u8]) -> u32 {
    match serde_amqp::from_slice::<Value>(payload) {
        Ok(Value::Described(d)) => match d.value {
            Value::List(f) => match f.get(4) {
                Some(Value::Uint(n)) => *n,
                _ => 0,
            },
            _ => 0,
        },
        _ => 0,
    }
}

/// Q-6: `accepted` only once the message is stored; Q-9: multiple Data sections, an AmqpValue
/// and an empty body are all accepted.
#[test]
fn q_6_q_9_accepted_bodies() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        let mut p = session(c);
        producer(&mut p, "tx", 0, "bodies", SenderSettleMode::Unsettled);
        let two_data = [data(b"ab"), data(b"cd")].concat();
        assert_eq!(
            produce(&mut p, 0, 0, &two_data),
            Some(DeliveryOutcome::Accepted)
        );
        assert_eq!(c.store().ready_count("bodies"), 1, "stored before accepted");
        let value = serde_amqp::to_vec(&AmqpValue("text".to_string())).unwrap();
        assert_eq!(
            produce(&mut p, 0, 1, &value),
            Some(DeliveryOutcome::Accepted)
        );
        let header_only =
            serde_amqp::to_vec(&fe2o3_amqp_types::messaging::Header::default()).unwrap();
        assert_eq!(
            produce(&mut p, 0, 2, &header_only),
            Some(DeliveryOutcome::Accepted)
        );
        assert_eq!(c.store().ready_count("bodies"), 3);
    });
}

/// Q-9 / ENV-9: an AmqpSequence body is rejected and the link detached, both not-implemented,
/// on a queue's link and on a requester's (`commands/`) alike.
#[test]
fn q_9_sequence_body_rejected_and_detached() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        for address in ["queues/seq", "commands/seq"] {
            let mut p = session(c);
            p.frame(0, &peer::attach_sender("tx", 0, address), &[]);
            p.read_until(WAIT, |r| {
                matches!(r, Received::Frame(_, Performative::Flow(_)))
            });
            let seq = serde_amqp::to_vec(&AmqpSequence(vec![1i32])).unwrap();
            p.frame(
                0,
                &peer::transfer(0, Some(0), Some(b"s"), false, false),
                &seq,
            );
            let got = p.read_until(WAIT, |r| condition(r).is_some());
            assert!(
                matches!(
                    disposition_of(&got, 0),
                    Some(Some(DeliveryOutcome::Rejected(Some(_))))
                ),
                "{address}: {got:?}"
            );
            assert_eq!(
                got.iter().filter_map(condition).collect::<Vec<_>>(),
                ["amqp:not-implemented"],
                "{address}"
            );
        }
        assert_eq!(c.store().ready_count("seq"), 0);
    });
}

/// ERR-9: a message whose sections do not decode, or whose strings are not UTF-8, is rejected
/// with decode-error; the link stays.
#[test]
fn err_9_undecodable_message_rejected() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        let mut p = session(c);
        producer(&mut p, "tx", 0, "bad", SenderSettleMode::Unsettled);
        let mixed = [data(b"x"), serde_amqp::to_vec(&AmqpValue(1i32)).unwrap()].concat();
        match produce(&mut p, 0, 0, &mixed) {
            Some(DeliveryOutcome::Rejected(Some(e))) => {
                assert_eq!(peer::error_symbol(&e), "amqp:decode-error")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            produce(&mut p, 0, 1, &data(b"fine")),
            Some(DeliveryOutcome::Accepted),
            "the link stays attached"
        );
        // A poison body: an amqp-value string that is not UTF-8 would be stored and crash every
        // consumer's decoder (python-qpid-proton's does); it is refused on the way in.
        let poison = [0x00, 0x53, 0x77, 0xa1, 0x02, 0xc3, 0x28];
        match produce(&mut p, 0, 2, &poison) {
            Some(DeliveryOutcome::Rejected(Some(e))) => {
                assert_eq!(peer::error_symbol(&e), "amqp:decode-error")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            c.store().ready_count("bad"),
            1,
            "only the good message is stored"
        );
    });
}

/// Q-7 / Q-10: pre-settled transfers get no disposition and are stored; `mixed` is accepted on a
/// produce link and each transfer's own flag decides.
#[test]
fn q_7_q_10_presettled_and_mixed() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        let mut p = session(c);
        producer(&mut p, "mixed", 0, "ps", SenderSettleMode::Mixed);
        p.frame(
            0,
            &peer::transfer(0, Some(0), Some(b"a"), true, false),
            &data(b"pre"),
        );
        let (got, _) = p.read_all(NOTHING_WINDOW);
        assert!(
            disposition_of(&got, 0).is_none(),
            "no disposition for a pre-settled transfer"
        );
        assert_eq!(
            produce(&mut p, 0, 1, &data(b"unsettled")),
            Some(DeliveryOutcome::Accepted)
        );
        assert_eq!(c.store().ready_count("ps"), 2);
    });
}

/// Q-7: pre-settled messages the connector received are stored even when the client closes its
/// connection straight after sending them (no disposition to wait for): the link's sends still
/// waiting or in flight when the connection ends are finished without it.
#[test]
fn q_7_presettled_messages_outlive_their_connection() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        let mut p = session(c);
        producer(&mut p, "gone", 0, "outlive", SenderSettleMode::Settled);
        let total = 300u32;
        for i in 0..total {
            p.frame(
                0,
                &peer::transfer(0, Some(i), Some(&i.to_be_bytes()), true, false),
                &data(&[7; 1024]),
            );
        }
        drop(p);
        eventually("every received pre-settled message stored", || {
            c.store().ready_count("outlive") == total as usize
        });
    });
}

/// Q-11 / Q-15: with credit 0 nothing is fetched or delivered; messages wait in the queue.
#[test]
fn q_11_no_credit_no_delivery() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        let mut p = session(c);
        producer(&mut p, "tx", 0, "zero", SenderSettleMode::Unsettled);
        produce(&mut p, 0, 0, &data(b"waiting"));
        let got = consume(&mut p, "rx", 1, "zero", 0, SenderSettleMode::Unsettled, 0);
        assert!(got.is_empty());
        assert_eq!(
            (
                c.store().ready_count("zero"),
                c.store().locked_count("zero")
            ),
            (1, 0)
        );
    });
}

/// FLOW-5 / Q-16: a drain on an empty queue that the Get loop waits on (with a Get in process,
/// watching it through gRPC after its first Get) completes at once (credit 0); a message sent later is not
/// delivered without new credit, and is not lost: fresh credit delivers it. KMQ-21: through gRPC
/// the drain ends on the broker's recent count of the watched queue, with no Get on the wire.
#[test]
fn q_16_drain_while_waiting() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        let mut p = session(c);
        producer(&mut p, "tx", 0, "drain", SenderSettleMode::Unsettled);
        p.frame(0, &peer::attach_receiver("rx", 1, "queues/drain"), &[]);
        p.frame(0, &link_flow(1, 0, 5, false), &[]);
        if c.backend() == "embedded" {
            eventually("a Get waits on the empty queue", || {
                c.store().waiting_gets() > 0
            });
        } else {
            // KMQ-21: through gRPC the Get loop watches an idle queue instead of waiting on it
            // with a Get, once its first Get (AUTHZ-9) is answered; the drain then comes while
            // it watches.
            eventually("the first Get waits", || c.store().waiting_gets() > 0);
            eventually("the first Get is answered", || {
                c.store().waiting_gets() == 0
            });
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(c.store().waiting_gets(), 0, "the idle queue is watched");
        }
        p.frame(0, &link_flow(1, 0, 5, true), &[]);
        let got = p.read_until(
            Duration::from_secs(1),
            |r| matches!(r, Received::Frame(_, Performative::Flow(f)) if f.drain && f.handle.is_some()),
        );
        let flow = got.iter().find_map(|r| match r {
            Received::Frame(_, Performative::Flow(f)) if f.drain => Some(f.clone()),
            _ => None,
        });
        let flow = flow.expect("drain completed promptly");
        assert_eq!((flow.link_credit, flow.delivery_count), (Some(0), Some(5)));
        if c.backend() != "embedded" {
            assert_eq!(
                c.store().waiting_gets(),
                0,
                "the drain put a Get on the wire ({})",
                c.backend()
            );
        }
        produce(&mut p, 0, 0, &data(b"after drain"));
        let (got, _) = p.read_all(NOTHING_WINDOW);
        assert!(
            transfers(&got).is_empty(),
            "FLOW-6: nothing after a drain without new credit"
        );
        p.frame(0, &link_flow(1, 5, 1, false), &[]);
        let got = p.read_until(WAIT, |r| {
            matches!(r, Received::Frame(_, Performative::Transfer(..)))
        });
        assert_eq!(
            transfers(&got).len(),
            1,
            "fresh credit delivers the held message"
        );
    });
}

/// Q-20 … Q-25, Q-27: accepted, rejected and nil remove; released, modified and an unknown state
/// requeue with delivery-count + 1; one DISPOSITION range settles several deliveries. Q-4: only
/// the removing outcomes discard a message. Q-29: settlement is one step — the connector answers
/// none of the settled DISPOSITIONs with one of its own.
#[test]
fn q_20_to_27_outcomes() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        let mut p = session(c);
        producer(&mut p, "tx", 0, "out", SenderSettleMode::Unsettled);
        for i in 0..6u32 {
            produce(&mut p, 0, i, &data(format!("m{i}").as_bytes()));
        }
        let got = consume(&mut p, "rx", 1, "out", 6, SenderSettleMode::Unsettled, 6);
        assert_eq!(got.len(), 6);
        let ids: Vec<u32> = got.iter().map(|g| g.0).collect();
        // Q-27: one range accepts the first two.
        settle(
            &mut p,
            ids[0],
            ids[1],
            Some(DeliveryState::Accepted(Accepted {})),
        );
        settle(&mut p, ids[2], ids[2], None); // Q-24: nil
        settle(
            &mut p,
            ids[3],
            ids[3],
            Some(DeliveryState::Released(Released {})),
        ); // Q-22
        settle(
            &mut p,
            ids[4],
            ids[4],
            Some(DeliveryState::Modified(Modified {
                delivery_failed: Some(true),
                undeliverable_here: Some(true),
                message_annotations: None,
            })),
        ); // Q-23
           // Q-25: an unknown terminal state (descriptor 0x1234:0x77), written by hand.
        let unknown = Value::Described(Box::new(serde_amqp::described::Described {
            descriptor: serde_amqp::descriptor::Descriptor::Code(0x0000_1234_0000_0077),
            value: Value::List(vec![]),
        }));
        let disp = Value::Described(Box::new(serde_amqp::described::Described {
            descriptor: serde_amqp::descriptor::Descriptor::Code(0x15),
            value: Value::List(vec![
                Value::Bool(true),
                Value::Uint(ids[5]),
                Value::Null,
                Value::Bool(true),
                unknown,
            ]),
        }));
        p.frame(0, &disp, &[]);
        p.frame(0, &link_flow(1, 6, 3, false), &[]);
        let frames = p.read_until(WAIT, |_| false);
        assert!(
            !frames
                .iter()
                .any(|r| matches!(r, Received::Frame(_, Performative::Disposition(_)))),
            "Q-29: no second stage"
        );
        let got = transfers(&frames);
        let counts: Vec<u32> = got.iter().map(|g| delivery_count(&g.2)).collect();
        assert_eq!(
            counts,
            vec![1, 1, 1],
            "released, modified and unknown come back once each with delivery-count 1"
        );
        assert_eq!(
            c.store().ready_count("out") + c.store().locked_count("out"),
            3
        );
    });
}

/// Q-30: a consumer asking for settled deliveries gets them pre-settled, and they are gone from
/// the queue at send time.
#[test]
fn q_30_presettled_consume() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        let mut p = session(c);
        producer(&mut p, "tx", 0, "atmost", SenderSettleMode::Unsettled);
        produce(&mut p, 0, 0, &data(b"once"));
        let got = consume(&mut p, "rx", 1, "atmost", 1, SenderSettleMode::Settled, 1);
        assert_eq!(got.len(), 1);
        assert!(got[0].1, "sent settled");
        eventually("the pre-settled delivery is acked", || {
            c.store().ready_count("atmost") + c.store().locked_count("atmost") == 0
        });
        assert_eq!(
            c.store().ready_count("atmost") + c.store().locked_count("atmost"),
            0
        );
    });
}

/// Q-32 / Q-33: a DETACH with unsettled deliveries NAcks each once: they come back with
/// delivery-count 1 to the next consumer, and a late DISPOSITION for them is ignored.
#[test]
fn q_32_detach_nacks_once() {
    TestConnector::each_backend(Settings::default(), |c| {
        let mut p = session(c);
        producer(&mut p, "tx", 0, "td", SenderSettleMode::Unsettled);
        for i in 0..2u32 {
            produce(&mut p, 0, i, &data(b"x"));
        }
        let got = consume(&mut p, "rx", 1, "td", 2, SenderSettleMode::Unsettled, 2);
        assert_eq!(got.len(), 2);
        p.frame(0, &peer::detach(1), &[]);
        p.read_until(WAIT, |r| {
            matches!(r, Received::Frame(_, Performative::Detach(_)))
        });
        settle(
            &mut p,
            got[0].0,
            got[1].0,
            Some(DeliveryState::Accepted(Accepted {})),
        ); // too late: ignored
        let again = consume(&mut p, "rx2", 2, "td", 5, SenderSettleMode::Unsettled, 2);
        let counts: Vec<u32> = again.iter().map(|g| delivery_count(&g.2)).collect();
        assert_eq!(counts, vec![1, 1], "each returned once, as a redelivery");
    });
}

/// Q-34: a consumer whose TCP connection is reset (no DETACH, no CLOSE) with unsettled
/// deliveries loses nothing: each is NAcked once and comes back with delivery-count 1.
#[test]
fn q_34_tcp_reset_returns_unsettled() {
    TestConnector::each_backend(Settings::default(), |c| {
        let mut p = session(c);
        producer(&mut p, "tx", 0, "reset", SenderSettleMode::Unsettled);
        for i in 0..3u32 {
            produce(&mut p, 0, i, &data(b"r"));
        }
        let mut worker = session(c);
        let got = consume(
            &mut worker,
            "rx",
            1,
            "reset",
            3,
            SenderSettleMode::Unsettled,
            3,
        );
        assert_eq!(got.len(), 3);
        worker.reset();
        let again = consume(&mut p, "rx2", 1, "reset", 5, SenderSettleMode::Unsettled, 3);
        let counts: Vec<u32> = again.iter().map(|g| delivery_count(&g.2)).collect();
        assert_eq!(counts, vec![1, 1, 1], "each returned once, as a redelivery");
    });
}

/// Q-8 / FLOW-1: a produce link gets MaxUnsettledPerLink credit on attach, and a FLOW restoring
/// the full window once its credit drops below half.
#[test]
fn q_8_produce_credit_window() {
    let settings = Settings {
        max_unsettled_per_link: 4,
        ..Settings::default()
    };
    TestConnector::each_store_backend(settings, |c| {
        let mut p = session(c);
        p.frame(0, &peer::attach_sender("tx", 0, "queues/credit"), &[]);
        let credit_of = |got: &[Received]| {
            got.iter().rev().find_map(|r| match r {
                Received::Frame(_, Performative::Flow(f)) if f.handle.is_some() => {
                    Some((f.delivery_count, f.link_credit))
                }
                _ => None,
            })
        };
        let got = p.read_until(
            WAIT,
            |r| matches!(r, Received::Frame(_, Performative::Flow(f)) if f.handle.is_some()),
        );
        assert_eq!(credit_of(&got), Some((Some(0), Some(4))), "the full window");
        for i in 0..3u32 {
            p.frame(
                0,
                &peer::transfer(0, Some(i), Some(&i.to_be_bytes()), true, false),
                &data(b"c"),
            );
        }
        let got = p.read_until(
            WAIT,
            |r| matches!(r, Received::Frame(_, Performative::Flow(f)) if f.handle.is_some()),
        );
        assert_eq!(
            credit_of(&got),
            Some((Some(3), Some(4))),
            "credit 1 < half of 4: restored to the full window"
        );
        eventually("all three stored", || c.store().ready_count("credit") == 3);
    });
}

/// Q-13: a Get on an empty queue that ends without a message is re-issued while credit remains,
/// so a consumer with standing credit gets a message sent long after it granted the credit.
#[test]
fn q_13_get_reissued_while_credit_remains() {
    TestConnector::each_backend(Settings::default(), |c| {
        let mut p = session(c);
        producer(&mut p, "tx", 0, "late", SenderSettleMode::Unsettled);
        let early = consume(&mut p, "rx", 1, "late", 5, SenderSettleMode::Unsettled, 0);
        assert!(early.is_empty());
        // Longer than a Get's 1 s wait: at least one Get ended empty over gRPC.
        p.read_all(Duration::from_millis(1200));
        // The delivery may overtake the `accepted`: read until both arrived.
        p.frame(
            0,
            &peer::transfer(0, Some(0), Some(b"l"), false, false),
            &data(b"late"),
        );
        let seen = std::cell::Cell::new((false, false));
        let got = p.read_until(WAIT, |r| {
            let (mut disposed, mut delivered) = seen.get();
            disposed |= matches!(r, Received::Frame(_, Performative::Disposition(_)));
            delivered |= matches!(r, Received::Frame(_, Performative::Transfer(..)));
            seen.set((disposed, delivered));
            disposed && delivered
        });
        assert_eq!(
            disposition_of(&got, 0),
            Some(Some(DeliveryOutcome::Accepted))
        );
        assert_eq!(
            transfers(&got).len(),
            1,
            "the standing credit still fetches"
        );
    });
}

/// Q-19 / ENV-12 … ENV-14 / ENV-7: a delivered message carries the sections it was sent with —
/// properties, application-properties, message-annotations, Data body, footer (carried through
/// uninterpreted) — after the header the connector adds (Q-17).
#[test]
fn q_19_sections_rebuilt() {
    use fe2o3_amqp_types::messaging::{
        ApplicationProperties, Footer, MessageAnnotations, MessageId, Properties,
    };
    use fe2o3_amqp_types::primitives::{OrderedMap, Symbol};
    TestConnector::each_backend(Settings::default(), |c| {
        let props = Properties {
            message_id: Some(MessageId::String("id-19".into())),
            subject: Some("subject".into()),
            content_type: Some(Symbol::from("text/plain")),
            ..Default::default()
        };
        let mut app = OrderedMap::new();
        app.insert(
            "k".to_string(),
            fe2o3_amqp_types::primitives::SimpleValue::Int(19),
        );
        let mut ann = OrderedMap::new();
        ann.insert(
            fe2o3_amqp_types::messaging::annotations::OwnedKey::Symbol(Symbol::from("x-opt-a")),
            Value::String("a".into()),
        );
        let mut foot = OrderedMap::new();
        foot.insert(
            fe2o3_amqp_types::messaging::annotations::OwnedKey::Symbol(Symbol::from("x-f")),
            Value::Long(7),
        );
        let sent = [
            serde_amqp::to_vec(&MessageAnnotations(ann)).unwrap(),
            serde_amqp::to_vec(&props).unwrap(),
            serde_amqp::to_vec(&ApplicationProperties(app)).unwrap(),
            data(b"body-19"),
            serde_amqp::to_vec(&Footer(foot)).unwrap(),
        ]
        .concat();
        let mut p = session(c);
        producer(&mut p, "tx", 0, "sections", SenderSettleMode::Unsettled);
        assert_eq!(
            produce(&mut p, 0, 0, &sent),
            Some(DeliveryOutcome::Accepted)
        );
        let got = consume(
            &mut p,
            "rx",
            1,
            "sections",
            1,
            SenderSettleMode::Unsettled,
            1,
        );
        assert_eq!(got.len(), 1);
        let payload = &got[0].2;
        let header = serde_amqp::to_vec(&fe2o3_amqp_types::messaging::Header::default()).unwrap();
        let header_len = payload.len() - sent.len();
        assert!(
            payload[..header_len].starts_with(&header[..3]),
            "a header first"
        );
        assert_eq!(
            &payload[header_len..],
            &sent[..],
            "then the sections as sent"
        );
    });
}

fn with_to(to: Option<&str>, body: &[u8]) -> Vec<u8> {
    let props = fe2o3_amqp_types::messaging::Properties {
        to: to.map(String::from),
        ..Default::default()
    };
    [serde_amqp::to_vec(&props).unwrap(), data(body)].concat()
}

/// ADDR-13 … ADDR-17: a sender with a null target routes each message by its `to`; a missing or
/// unresolvable `to` is rejected with precondition-failed and the link stays attached; a
/// pre-settled unroutable message is dropped without a disposition.
#[test]
fn addr_13_anonymous_terminus() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        let mut p = session(c);
        let mut a = peer::attach_sender("anon", 0, "unused");
        a.target = None;
        p.frame(0, &a, &[]);
        p.read_until(WAIT, |r| {
            matches!(r, Received::Frame(_, Performative::Flow(_)))
        });
        assert_eq!(
            produce(&mut p, 0, 0, &with_to(Some("queues/anon-a"), b"a")),
            Some(DeliveryOutcome::Accepted)
        );
        assert_eq!(
            produce(&mut p, 0, 1, &with_to(Some("/queues/anon-b"), b"b")),
            Some(DeliveryOutcome::Accepted),
            "ADDR-18: several nodes on one link"
        );
        for (id, to) in [
            (2u32, None),
            (3, Some("bogus/prefix/x")),
            (4, Some("queues/a b")),
        ] {
            match produce(&mut p, 0, id, &with_to(to, b"x")) {
                Some(DeliveryOutcome::Rejected(Some(e))) => {
                    assert_eq!(peer::error_symbol(&e), "amqp:precondition-failed", "{to:?}")
                }
                other => panic!("{to:?}: {other:?}"),
            }
        }
        p.frame(
            0,
            &peer::transfer(0, Some(5), Some(b"p"), true, false),
            &with_to(None, b"dropped"),
        );
        let (got, _) = p.read_all(NOTHING_WINDOW);
        assert!(
            disposition_of(&got, 5).is_none(),
            "ADDR-17: no disposition for a pre-settled message"
        );
        assert_eq!(
            produce(&mut p, 0, 6, &with_to(Some("queues/anon-a"), b"c")),
            Some(DeliveryOutcome::Accepted),
            "the link stays"
        );
        assert_eq!(
            (
                c.store().ready_count("anon-a"),
                c.store().ready_count("anon-b")
            ),
            (2, 1)
        );
    });
}

/// Q-1 / ADDR-3 / ADDR-8: `queues/<ch>`, `/queues/<ch>` and a bare address with the default
/// pattern all bind to the same KubeMQ queue `<ch>`.
#[test]
fn q_1_address_forms_bind_one_queue() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        let mut p = session(c);
        for (h, addr) in [(0u32, "queues/same"), (1, "/queues/same"), (2, "same")] {
            let a = peer::attach_sender(&format!("tx{h}"), h, addr);
            p.frame(0, &a, &[]);
            p.read_until(WAIT, |r| matches!(r, Received::Frame(_, Performative::Flow(f)) if f.handle.as_ref().map(|x| x.0) == Some(h)));
            assert_eq!(
                produce(&mut p, h, h, &data(addr.as_bytes())),
                Some(DeliveryOutcome::Accepted),
                "{addr}"
            );
        }
        assert_eq!(c.store().ready_count("same"), 3);
    });
}

/// Q-18 / FLOW-7: a consume link never holds more than MaxUnsettledPerLink unsettled deliveries,
/// whatever credit the client grants; settling frees room for more.
#[test]
fn q_18_unsettled_cap() {
    let settings = Settings {
        max_unsettled_per_link: 3,
        ..Settings::default()
    };
    TestConnector::each_backend(settings, |c| {
        let mut p = session(c);
        producer(&mut p, "tx", 0, "cap", SenderSettleMode::Unsettled);
        for i in 0..6u32 {
            produce(&mut p, 0, i, &data(b"x"));
        }
        let got = consume(&mut p, "rx", 1, "cap", 10, SenderSettleMode::Unsettled, 3);
        assert_eq!(got.len(), 3, "only MaxUnsettledPerLink in flight");
        settle(
            &mut p,
            got[0].0,
            got[2].0,
            Some(DeliveryState::Accepted(Accepted {})),
        );
        let more = transfers(&p.read_until(WAIT, |_| false));
        assert_eq!(more.len(), 3, "room freed by settlement is used");
    });
}

/// FLOW-5 / Q-16: a drain gets what the queue holds right now (up to its credit), then credit 0:
/// a client that only ever drains (JMS receive with a timeout) still receives waiting messages.
#[test]
fn flow_5_drain_gets_ready_messages() {
    TestConnector::each_backend(Settings::default(), |c| {
        let mut p = session(c);
        producer(&mut p, "tx", 0, "ready", SenderSettleMode::Unsettled);
        for i in 0..2u32 {
            produce(&mut p, 0, i, &data(b"waiting"));
        }
        p.frame(0, &peer::attach_receiver("rx", 1, "queues/ready"), &[]);
        p.frame(0, &link_flow(1, 0, 5, true), &[]);
        let got = p.read_until(
            WAIT,
            |r| matches!(r, Received::Frame(_, Performative::Flow(f)) if f.drain && f.handle.is_some()),
        );
        assert_eq!(transfers(&got).len(), 2, "{got:?}");
        let flow = got.iter().rev().find_map(|r| match r {
            Received::Frame(_, Performative::Flow(f)) if f.drain => Some(f.clone()),
            _ => None,
        });
        let flow = flow.expect("drain completed");
        assert_eq!((flow.link_credit, flow.delivery_count), (Some(0), Some(5)));
        let last_transfer = got
            .iter()
            .rposition(|r| matches!(r, Received::Frame(_, Performative::Transfer(..))));
        let drain_flow = got
            .iter()
            .rposition(|r| matches!(r, Received::Frame(_, Performative::Flow(f)) if f.drain));
        assert!(
            last_transfer < drain_flow,
            "the drain FLOW follows the transfers"
        );
    });
}

/// Q-26: every release raises ReceiveCount, and a message released often enough is removed by the
/// broker's MaxReceiveCount / MaxReceiveQueue policy (here set by a gRPC-side producer), though
/// no consumer ever rejected it.
#[test]
fn q_26_release_limit_dead_letters() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        let msg = connector::kubemq::QueueMessage {
            client_id: "grpc-producer".into(),
            channel: "poison".into(),
            body: b"again and again".to_vec().into(),
            policy: Some(connector::kubemq::QueueMessagePolicy {
                max_receive_count: 2,
                max_receive_queue: "poison-dlq".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = interop_tests::runtime().block_on(c.store().send(vec![msg]));
        assert!(!r[0].is_error);
        let mut p = session(c);
        p.frame(0, &peer::attach_receiver("rx", 1, "queues/poison"), &[]);
        for round in 0..2u32 {
            p.frame(0, &link_flow(1, round, 1, false), &[]);
            let got = transfers(&p.read_until(WAIT, |r| {
                matches!(r, Received::Frame(_, Performative::Transfer(..)))
            }));
            assert_eq!(got.len(), 1, "round {round}");
            assert_eq!(
                delivery_count(&got[0].2),
                round,
                "ReceiveCount rises with each release"
            );
            settle(
                &mut p,
                got[0].0,
                got[0].0,
                Some(DeliveryState::Released(Released {})),
            );
        }
        eventually("the second release dead-letters it", || {
            c.store().ready_count("poison-dlq") == 1
        });
        assert_eq!(
            c.store().ready_count("poison") + c.store().locked_count("poison"),
            0
        );
        assert_eq!(
            c.store().ready_count("poison-dlq"),
            1,
            "moved to the dead-letter queue by the broker's policy"
        );
    });
}

/// Attaches a receiver with a dynamic source on handle 1 and returns the address the connector
/// minted for it.
fn attach_dynamic_receiver(p: &mut RawPeer) -> String {
    let mut a = peer::attach_receiver("dyn", 1, "unused");
    if let Some(s) = a.source.as_mut() {
        s.address = None;
        s.dynamic = true;
    }
    p.frame(0, &a, &[]);
    let got = p.read_until(WAIT, |r| {
        matches!(r, Received::Frame(_, Performative::Attach(_)))
    });
    got.iter()
        .find_map(|r| match r {
            Received::Frame(
                _,
                Performative::Attach(connector::engine::codec::AttachFrame::Full(a)),
            ) => a.source.as_ref().and_then(|s| s.address.clone()),
            _ => None,
        })
        .expect("minted address")
}

/// Attaches an anonymous sender (null target) on handle 0 and waits for its credit.
fn attach_anonymous_sender(p: &mut RawPeer) {
    let mut anon = peer::attach_sender("anon", 0, "unused");
    anon.target = None;
    p.frame(0, &anon, &[]);
    p.read_until(WAIT, |r| matches!(r, Received::Frame(_, Performative::Flow(f)) if f.handle.as_ref().map(|h| h.0) == Some(0)));
}

/// ADDR-11 / ADDR-12: a dynamic source gets a minted `_amqp10.tmp.` address; the owning
/// connection reaches it through `to` on an anonymous link and the message arrives bit-exact;
/// another connection is refused with precondition-failed; a fixed link to it is not-found; the
/// node goes away with its link.
#[test]
fn addr_11_12_dynamic_nodes() {
    TestConnector::each_backend(Settings::default(), |c| {
        let mut p = session(c);
        let minted = attach_dynamic_receiver(&mut p);
        assert!(minted.starts_with("_amqp10.tmp."), "{minted}");
        p.frame(0, &link_flow(1, 0, 5, false), &[]);
        attach_anonymous_sender(&mut p);
        let message = with_to(Some(&minted), b"private");
        p.frame(
            0,
            &peer::transfer(0, Some(0), Some(b"t"), false, false),
            &message,
        );
        let got = p.read_until(WAIT, |r| {
            matches!(r, Received::Frame(_, Performative::Transfer(..)))
        });
        assert!(
            matches!(
                disposition_of(&got, 0),
                Some(Some(DeliveryOutcome::Accepted))
            ),
            "{got:?}"
        );
        let delivered = transfers(&got);
        assert_eq!(delivered.len(), 1);
        assert_eq!(&delivered[0].2[..], &message[..], "bit-exact");

        // Another connection cannot reach it.
        let mut q = session(c);
        let mut anon2 = peer::attach_sender("anon2", 0, "unused");
        anon2.target = None;
        q.frame(0, &anon2, &[]);
        q.read_until(WAIT, |r| {
            matches!(r, Received::Frame(_, Performative::Flow(_)))
        });
        match produce(&mut q, 0, 0, &with_to(Some(&minted), b"intruder")) {
            Some(DeliveryOutcome::Rejected(Some(e))) => {
                assert_eq!(peer::error_symbol(&e), "amqp:precondition-failed")
            }
            other => panic!("{other:?}"),
        }
        // A fixed link to it is refused.
        q.frame(0, &peer::attach_sender("fixed", 1, &minted), &[]);
        let got = q.read_until(WAIT, |r| condition(r).is_some());
        assert_eq!(
            got.iter().filter_map(condition).collect::<Vec<_>>(),
            ["amqp:not-found"]
        );
        // Freed with its link.
        p.frame(0, &peer::detach(1), &[]);
        p.read_until(WAIT, |r| {
            matches!(r, Received::Frame(_, Performative::Detach(_)))
        });
        match produce(&mut p, 0, 1, &with_to(Some(&minted), b"late")) {
            Some(DeliveryOutcome::Rejected(Some(e))) => {
                assert_eq!(peer::error_symbol(&e), "amqp:precondition-failed")
            }
            other => panic!("{other:?}"),
        }
    });
}

/// OP-ADDR-7, ADDR-12: a sender with a dynamic target (how Qpid JMS makes a temporary queue)
/// gets a minted address; one receiver of the same connection consumes that node by its
/// address and gets what the sender sends; a second receiver, and a receiver on another
/// connection, are refused not-found; the node ends with the sender that minted it.
#[test]
fn op_addr_7_dynamic_target_is_a_temporary_queue() {
    use fe2o3_amqp_types::messaging::TargetArchetype;
    TestConnector::each_backend(Settings::default(), |c| {
        let mut p = session(c);
        let mut a = peer::attach_sender("temp", 0, "unused");
        if let Some(TargetArchetype::Target(t)) = a.target.as_deref_mut() {
            t.address = None;
            t.dynamic = true;
        }
        p.frame(0, &a, &[]);
        let got = p.read_until(WAIT, |r| {
            matches!(r, Received::Frame(_, Performative::Flow(_)))
        });
        let minted = got
            .iter()
            .find_map(|r| match r {
                Received::Frame(
                    _,
                    Performative::Attach(connector::engine::codec::AttachFrame::Full(a)),
                ) => match a.target.as_deref() {
                    Some(TargetArchetype::Target(t)) => t.address.clone(),
                    _ => None,
                },
                _ => None,
            })
            .expect("minted address");
        assert!(minted.starts_with("_amqp10.tmp."), "{minted}");
        p.frame(0, &peer::attach_receiver("consumer", 1, &minted), &[]);
        p.read_until(WAIT, |r| {
            matches!(r, Received::Frame(_, Performative::Attach(_)))
        });
        p.frame(0, &link_flow(1, 0, 5, false), &[]);
        let message = with_to(None, b"to the temporary queue");
        p.frame(
            0,
            &peer::transfer(0, Some(0), Some(b"t"), false, false),
            &message,
        );
        let got = p.read_until(WAIT, |r| {
            matches!(r, Received::Frame(_, Performative::Transfer(..)))
        });
        assert_eq!(&transfers(&got)[0].2[..], &message[..], "bit-exact");
        // A second consumer of the same connection is refused.
        p.frame(0, &peer::attach_receiver("second", 2, &minted), &[]);
        let got = p.read_until(WAIT, |r| condition(r).is_some());
        assert_eq!(
            got.iter().filter_map(condition).collect::<Vec<_>>(),
            ["amqp:not-found"]
        );
        // Another connection cannot consume it.
        let mut q = session(c);
        q.frame(0, &peer::attach_receiver("intruder", 0, &minted), &[]);
        let got = q.read_until(WAIT, |r| condition(r).is_some());
        assert_eq!(
            got.iter().filter_map(condition).collect::<Vec<_>>(),
            ["amqp:not-found"]
        );
        // The node ends with the sender that minted it: its address reaches nothing after.
        p.frame(0, &peer::detach(0), &[]);
        p.read_until(
            WAIT,
            |r| matches!(r, Received::Frame(_, Performative::Detach(d)) if d.handle.0 == 0),
        );
        attach_anonymous_sender_on(&mut p, 3);
        match produce(&mut p, 3, 1, &with_to(Some(&minted), b"late")) {
            Some(DeliveryOutcome::Rejected(Some(e))) => {
                assert_eq!(peer::error_symbol(&e), "amqp:precondition-failed")
            }
            other => panic!("{other:?}"),
        }
        // MET-3 by role: the consumer is still attached (the server sends on it), and the
        // anonymous sender (the server receives); the minting sender left its role's count.
        use connector::metrics::Role;
        assert_eq!(
            (
                c.metrics.link(Role::sender).get(),
                c.metrics.link(Role::receiver).get()
            ),
            (1, 1)
        );
    });
}

/// Attaches an anonymous sender (null target) on `handle` and waits for its credit.
fn attach_anonymous_sender_on(p: &mut RawPeer, handle: u32) {
    let mut anon = peer::attach_sender("anon-n", handle, "unused");
    anon.target = None;
    p.frame(0, &anon, &[]);
    p.read_until(WAIT, |r| matches!(r, Received::Frame(_, Performative::Flow(f)) if f.handle.as_ref().map(|h| h.0) == Some(handle)));
}

/// A dynamic node whose receiver grants no credit holds at most MaxUnsettledPerLink messages
/// (and 16 MiB beyond a first message): past that a message to it is rejected with
/// resource-limit-exceeded instead of being held in memory; once the receiver takes what waits,
/// the node accepts again.
#[test]
fn dynamic_nodes_are_bounded() {
    let c = TestConnector::start(Settings {
        max_unsettled_per_link: 10,
        ..Settings::default()
    });
    let mut p = session(&c);
    let minted = attach_dynamic_receiver(&mut p);
    attach_anonymous_sender(&mut p);
    for id in 0..10 {
        assert_eq!(
            produce(&mut p, 0, id, &with_to(Some(&minted), b"waiting")),
            Some(DeliveryOutcome::Accepted),
            "message {id}"
        );
    }
    match produce(&mut p, 0, 10, &with_to(Some(&minted), b"one too many")) {
        Some(DeliveryOutcome::Rejected(Some(e))) => {
            assert_eq!(peer::error_symbol(&e), "amqp:resource-limit-exceeded")
        }
        other => panic!("{other:?}"),
    }
    // The receiver takes the ten; the node has room again.
    p.frame(0, &link_flow(1, 0, 20, false), &[]);
    let mut delivered = 0;
    let deadline = std::time::Instant::now() + WAIT;
    while delivered < 10 && std::time::Instant::now() < deadline {
        let got = p.read_until(WAIT, |r| {
            matches!(r, Received::Frame(_, Performative::Transfer(..)))
        });
        delivered += transfers(&got).len();
    }
    assert_eq!(delivered, 10);
    assert_eq!(
        produce(&mut p, 0, 11, &with_to(Some(&minted), b"room again")),
        Some(DeliveryOutcome::Accepted)
    );
}

fn metric(c: &TestConnector, line_prefix: &str) -> f64 {
    let text = c.metrics.encode();
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{line_prefix} not in\n{text}"))
}

/// Q-39 / MET-1 … MET-5, MET-7: queue transfers, outcomes, gauges and emitted errors are counted.
#[test]
fn q_39_metrics() {
    TestConnector::each_backend(Settings::default(), |c| {
        let mut p = session(c);
        eventually("the session is counted", || {
            metric(c, "kubemq_amqp10_sessions ") == 1.0
        });
        assert_eq!(metric(c, "kubemq_amqp10_connections "), 1.0);
        assert_eq!(metric(c, "kubemq_amqp10_sessions "), 1.0);
        producer(&mut p, "tx", 0, "met", SenderSettleMode::Unsettled);
        for i in 0..3u32 {
            produce(&mut p, 0, i, &data(b"m"));
        }
        let got = consume(&mut p, "rx", 1, "met", 3, SenderSettleMode::Unsettled, 3);
        assert_eq!(metric(c, r#"kubemq_amqp10_links{role="receiver"}"#), 1.0);
        assert_eq!(metric(c, r#"kubemq_amqp10_links{role="sender"}"#), 1.0);
        settle(
            &mut p,
            got[0].0,
            got[1].0,
            Some(DeliveryState::Accepted(Accepted {})),
        );
        settle(
            &mut p,
            got[2].0,
            got[2].0,
            Some(DeliveryState::Released(Released {})),
        );
        p.frame(0, &peer::attach_sender("bad", 2, "bogus/x/y"), &[]);
        p.read_until(WAIT, |r| condition(r).is_some());
        eventually("both settlements are counted", || {
            metric(c, r#"kubemq_amqp10_dispositions_total{outcome="released"}"#) == 1.0
        });
        assert_eq!(
            metric(
                c,
                r#"kubemq_amqp10_transfers_total{direction="in",pattern="queues"}"#
            ),
            3.0
        );
        assert!(
            metric(
                c,
                r#"kubemq_amqp10_transfers_total{direction="out",pattern="queues"}"#
            ) >= 3.0
        );
        assert_eq!(
            metric(c, r#"kubemq_amqp10_dispositions_total{outcome="accepted"}"#),
            2.0
        );
        assert_eq!(
            metric(c, r#"kubemq_amqp10_dispositions_total{outcome="released"}"#),
            1.0
        );
        assert_eq!(
            metric(c, r#"kubemq_amqp10_errors_total{scope="link"}"#),
            1.0
        );
        drop(p);
        eventually("the closed connection is no longer counted", || {
            metric(c, "kubemq_amqp10_connections ") == 0.0
        });
        assert_eq!(metric(c, "kubemq_amqp10_sessions "), 0.0);
        assert_eq!(metric(c, r#"kubemq_amqp10_links{role="sender"}"#), 0.0);
    });
}

/// Q-14 / Q-12: each fetched message is one delivery that uses one unit of credit and advances the
/// link's delivery-count by one; nothing is fetched for, or sent beyond, the credit granted.
#[test]
fn q_14_one_delivery_per_message() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        let mut p = session(c);
        producer(&mut p, "tx", 0, "one", SenderSettleMode::Unsettled);
        for i in 0..5u32 {
            produce(&mut p, 0, i, &data(format!("m{i}").as_bytes()));
        }
        let got = consume(&mut p, "rx", 1, "one", 3, SenderSettleMode::Unsettled, 3);
        assert_eq!(got.len(), 3, "credit 3: three deliveries");
        assert_eq!(
            c.store().locked_count("one"),
            3,
            "nothing fetched beyond credit"
        );
        assert_eq!(c.store().ready_count("one"), 2);
        let mut echo = link_flow(1, 0, 3, false);
        echo.echo = true;
        p.frame(0, &echo, &[]);
        let got = p.read_until(WAIT, |r| matches!(r, Received::Frame(_, Performative::Flow(f)) if f.handle.as_ref().map(|h| h.0) == Some(1)));
        let state = got.iter().find_map(|r| match r {
            Received::Frame(_, Performative::Flow(f)) if f.handle.is_some() => {
                Some((f.delivery_count, f.link_credit))
            }
            _ => None,
        });
        assert_eq!(
            state,
            Some((Some(3), Some(0))),
            "delivery-count advanced by one per delivery"
        );
    });
}

//! The fe2o3-amqp client (crates.io) against the real connector on every backend: events
//! fan-out with a group, a selector in fe2o3's symbol-descriptor form, and events-store start
//! positions.

use std::time::Duration;

use connector::config::Settings;
use fe2o3_amqp::types::definitions::SenderSettleMode;
use fe2o3_amqp::types::messaging::{ApplicationProperties, Message, Outcome, Source};
use fe2o3_amqp::types::primitives::{Symbol, Value};
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use interop_tests::TestConnector;
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;

fn rt() -> tokio::runtime::Runtime {
    interop_tests::runtime()
}

/// A receiver on `source` granting 100 at a time, with `props` in its ATTACH.
async fn receiver(
    session: &mut fe2o3_amqp::session::SessionHandle<()>,
    name: &str,
    source: Source,
    props: &[(&str, &str)],
) -> Receiver {
    interop_tests::receiver(session, name, source, 100, props).await
}

/// Everything that arrives until 500 ms pass without a message.
async fn bodies(r: &mut Receiver) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(Ok(d)) = tokio::time::timeout(Duration::from_millis(500), r.recv::<String>()).await
    {
        out.push(d.body().clone());
    }
    out
}

/// EV-9, GRP-2, SEL-1 (symbol descriptor), SEL-9.
#[test]
fn ev_9_fe2o3_fan_out_groups_and_selector() {
    TestConnector::each_backend(Settings::default(), |c| {
        let url = c.url();
        rt().block_on(async {
            let mut conn = Connection::open("fe2o3-ev", url.as_str()).await.unwrap();
            let mut session = Session::begin(&mut conn).await.unwrap();
            let address = "events/fe.ev";
            let plain = |a: &str| Source::builder().address(a.to_string()).build();
            let mut all = receiver(&mut session, "all", plain(address), &[]).await;
            let mut g1 = receiver(
                &mut session,
                "g1",
                plain(address),
                &[("x-opt-kubemq-group", "g")],
            )
            .await;
            let mut g2 = receiver(
                &mut session,
                "g2",
                plain(address),
                &[("x-opt-kubemq-group", "g")],
            )
            .await;
            let mut filter = fe2o3_amqp::types::messaging::FilterSet::new();
            filter.insert(
                Symbol::from("apache.org:selector-filter:string"),
                Value::Described(Box::new(Described {
                    descriptor: Descriptor::Name(Symbol::from("apache.org:selector-filter:string")),
                    value: Value::String("color = 'red' AND size > 2".into()),
                })),
            );
            let selected = Source::builder()
                .address(address.to_string())
                .filter(filter)
                .build();
            let mut red = receiver(&mut session, "red", selected, &[]).await;
            let mut sender = Sender::builder()
                .name("tx")
                .target(address)
                .sender_settle_mode(SenderSettleMode::Settled)
                .attach(&mut session)
                .await
                .unwrap();
            // Ten rounds: KubeMQ hands a group's events to its members at random, so with a
            // few events one member could get them all.
            let cases = [("red", 5i64), ("red", 3), ("blue", 9), ("red", 1)];
            for i in 0..40 {
                let (color, size) = cases[i % 4];
                let props = ApplicationProperties::builder()
                    .insert("color", color)
                    .insert("size", size)
                    .build();
                let m = Message::builder()
                    .application_properties(props)
                    .value(format!("m{i}"))
                    .build();
                sender.send(m).await.unwrap();
            }
            let want: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
            assert_eq!(bodies(&mut all).await, want);
            let mut shared = bodies(&mut g1).await;
            let other = bodies(&mut g2).await;
            assert!(
                !shared.is_empty() && !other.is_empty(),
                "each member gets a share"
            );
            shared.extend(other);
            shared.sort();
            let mut sorted = want.clone();
            sorted.sort();
            assert_eq!(shared, sorted, "the group gets each event once");
            let reds: Vec<String> = (0..40)
                .filter(|i| i % 4 < 2)
                .map(|i| format!("m{i}"))
                .collect();
            assert_eq!(bodies(&mut red).await, reds);
            conn.close().await.unwrap();
        });
    });
}

/// SP-9, ES-2: events-store from `first` and `sequence:2`, publishes accepted once stored.
#[test]
fn sp_9_fe2o3_start_positions() {
    TestConnector::each_backend(Settings::default(), |c| {
        let url = c.url();
        rt().block_on(async {
            let mut conn = Connection::open("fe2o3-es", url.as_str()).await.unwrap();
            let mut session = Session::begin(&mut conn).await.unwrap();
            let address = "events-store/fe.es";
            let mut sender = Sender::attach(&mut session, "tx", address).await.unwrap();
            for i in 0..3 {
                let o = sender.send(format!("s{i}")).await.unwrap();
                assert!(matches!(o, Outcome::Accepted(_)), "{o:?}");
            }
            let source = || Source::builder().address(address.to_string()).build();
            let mut first = receiver(
                &mut session,
                "first",
                source(),
                &[("x-opt-kubemq-start", "first")],
            )
            .await;
            assert_eq!(bodies(&mut first).await, ["s0", "s1", "s2"]);
            let mut from2 = receiver(
                &mut session,
                "from2",
                source(),
                &[("x-opt-kubemq-start", "sequence:2")],
            )
            .await;
            assert_eq!(bodies(&mut from2).await, ["s1", "s2"]);
            conn.close().await.unwrap();
        });
    });
}

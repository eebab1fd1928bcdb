//! Many requests at once, with fe2o3-amqp over real sockets, on every backend: 1,000 queries
//! from 10 requester connections in flight together, answered by one responder; every reply
//! reaches the requester that asked, matched by its correlation-id, and afterwards no table of
//! the connector or the store holds an entry.

use std::collections::HashSet;
use std::time::Duration;

use connector::config::Settings;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::messaging::{AmqpValue, Body, Message, MessageId, Outcome, Properties};
use fe2o3_amqp::types::primitives::Value;
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use interop_tests::TestConnector;

const REQUESTERS: usize = 10;
const EACH: usize = 100;

/// A connection over a socket with Nagle's algorithm off, as proton and rhea open theirs
/// (fe2o3's own connect leaves it on).
async fn connect(container: &str, url: &str) -> fe2o3_amqp::connection::ConnectionHandle<()> {
    let addr = url.trim_start_matches("amqp://");
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    Connection::builder()
        .container_id(container)
        .open_with_stream(stream)
        .await
        .unwrap()
}

/// Answers `n` queries on `queries/<channel>` with `result:<correlation-id>`.
async fn responder(
    url: String,
    channel: String,
    n: usize,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let mut conn = Connection::open("load-responder", url.as_str())
        .await
        .unwrap();
    let mut session = Session::begin(&mut conn).await.unwrap();
    let mut replies = interop_tests::relay_sender(&mut session, "replies").await;
    let mut requests = Receiver::builder()
        .name("requests")
        .source(format!("queries/{channel}"))
        .credit_mode(CreditMode::Auto(200))
        .attach(&mut session)
        .await
        .unwrap();
    ready.send(()).unwrap();
    // Replies go out without waiting for each outcome; every outcome is checked at the end.
    let mut outcomes = Vec::with_capacity(n);
    for _ in 0..n {
        let d = requests.recv::<Body<Value>>().await.unwrap();
        requests.accept(&d).await.unwrap();
        let props = d.message().properties.clone().expect("RPC-12");
        let MessageId::String(id) = props.correlation_id.clone().expect("RPC-12") else {
            panic!("RPC-12: the RequestID as a string");
        };
        let Body::Value(AmqpValue(Value::String(asked))) = d.message().body.clone() else {
            panic!("a string body");
        };
        let reply = Message::builder()
            .properties(
                Properties::builder()
                    .to(props.reply_to.expect("RPC-12"))
                    .correlation_id(MessageId::String(id))
                    .build(),
            )
            .value(format!("result:{asked}"))
            .build();
        outcomes.push(replies.send_batchable(reply).await.unwrap());
    }
    for outcome in outcomes {
        let outcome = outcome.await.unwrap();
        assert!(
            matches!(outcome, Outcome::Accepted(_)),
            "RPC-13: {outcome:?}"
        );
    }
    conn.close().await.unwrap();
}

/// Sends `EACH` queries at once and collects their replies.
async fn requester(url: String, channel: String, me: usize) {
    let mut conn = connect(&format!("load-requester-{me}"), &url).await;
    let mut session = Session::begin(&mut conn).await.unwrap();
    let (mut replies, reply_to) = interop_tests::reply_node(&mut session, 200).await;
    let mut sender = Sender::attach(&mut session, "requests", format!("queries/{channel}"))
        .await
        .unwrap();
    let mut asked = HashSet::new();
    for i in 0..EACH {
        let id = format!("{me}-{i}");
        let m = Message::builder()
            .properties(
                Properties::builder()
                    .reply_to(reply_to.clone())
                    .correlation_id(MessageId::String(id.clone()))
                    .build(),
            )
            .value(id.clone())
            .build();
        // Settled `accepted` once routed (RPC-4): the request is in flight, not answered.
        let outcome = sender.send(m).await.unwrap();
        assert!(matches!(outcome, Outcome::Accepted(_)), "{outcome:?}");
        asked.insert(id);
    }
    for _ in 0..EACH {
        let d = tokio::time::timeout(Duration::from_secs(30), replies.recv::<Body<Value>>())
            .await
            .unwrap_or_else(|_| panic!("{me}: {} of {EACH} replies in time", EACH - asked.len()))
            .unwrap();
        replies.accept(&d).await.unwrap();
        let Some(MessageId::String(id)) = d
            .message()
            .properties
            .as_ref()
            .and_then(|p| p.correlation_id.clone())
        else {
            panic!("RPC-6: a correlation-id");
        };
        assert!(
            asked.remove(&id),
            "RPC-6: a reply to {id} this connection asked once"
        );
        let Body::Value(AmqpValue(Value::String(body))) = d.message().body.clone() else {
            panic!("a string body");
        };
        assert_eq!(
            body,
            format!("result:{id}"),
            "RPC-8: the answer to this request"
        );
    }
    assert!(asked.is_empty());
    conn.close().await.unwrap();
}

/// RPC-5 (well below the cap), RPC-6, RPC-9, RPC-11, RPC-14: 1,000 concurrent queries from 10
/// connections, each reply matched to its request; no entry left anywhere afterwards.
#[test]
fn rpc_thousand_concurrent_requests_from_ten_connections() {
    TestConnector::each_backend(Settings::default(), |c| {
        let channel = format!("rpc.load.{}", connector::kubemq::new_id());
        interop_tests::runtime().block_on(async {
            let (ready_tx, ready) = tokio::sync::oneshot::channel();
            let answering = tokio::spawn(responder(
                c.url(),
                channel.clone(),
                REQUESTERS * EACH,
                ready_tx,
            ));
            ready.await.unwrap();
            let asking: Vec<_> = (0..REQUESTERS)
                .map(|me| tokio::spawn(requester(c.url(), channel.clone(), me)))
                .collect();
            for a in asking {
                a.await.unwrap();
            }
            answering.await.unwrap();
        });
        assert_eq!(
            c.rpc_requests("queries"),
            (REQUESTERS * EACH) as u64,
            "MET-6"
        );
        c.no_rpc_left();
    });
}

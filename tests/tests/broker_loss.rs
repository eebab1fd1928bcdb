//! Request/reply and events while the broker goes away and comes back: the connector over gRPC
//! to a store's façade, and to a real KubeMQ where its binary exists, which is stopped as a dying
//! server stops (every connection cut at once; KubeMQ killed) with a command and a query waiting
//! at a silent responder, then started again on the same port with the same data. fe2o3-amqp on both sides. The test connector runs without the readiness watch
//! that closes every connection after 3 s without the broker (CONN-16): this pins what the links
//! see in those seconds, and a connector whose broker comes back sooner.

use std::time::Duration;

use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::link::{LinkStateError, RecvError};
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::definitions::{AmqpError, ErrorCondition};
use fe2o3_amqp::types::messaging::{
    ApplicationProperties, Body, Header, Message, MessageId, Outcome, Properties,
};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use interop_tests::real_kubemq::RealKubemq;
use interop_tests::restartable::{Broker, Stop};

const EXECUTED: &str = "x-opt-kubemq-executed";
const ERROR: &str = "x-opt-kubemq-error";
/// Far longer than the test waits for anything: a reply that comes must come from the loss,
/// not from the request's timeout.
const TTL_MS: u32 = 120_000;

/// A requester: its connection, a dynamic reply node, and a sender per pattern.
struct Requester {
    conn: ConnectionHandle<()>,
    _session: SessionHandle<()>,
    replies: Receiver,
    reply_to: String,
    commands: Sender,
    queries: Sender,
}

impl Requester {
    async fn open(url: &str, channel: &str) -> Requester {
        let mut conn = Connection::open("loss-requester", url).await.unwrap();
        let mut session = Session::begin(&mut conn).await.unwrap();
        let (replies, reply_to) = interop_tests::reply_node(&mut session, 10).await;
        let commands = Sender::attach(&mut session, "commands", format!("commands/{channel}"))
            .await
            .unwrap();
        let queries = Sender::attach(&mut session, "queries", format!("queries/{channel}"))
            .await
            .unwrap();
        Requester {
            conn,
            _session: session,
            replies,
            reply_to,
            commands,
            queries,
        }
    }

    /// Sends one request on `command`s or queries; it is accepted once routed (RPC-4).
    async fn ask(&mut self, command: bool, body: &str) {
        let message = Message::builder()
            .header(Header::builder().ttl(TTL_MS).build())
            .properties(
                Properties::builder()
                    .reply_to(self.reply_to.clone())
                    .correlation_id(MessageId::String(body.into()))
                    .build(),
            )
            .value(body.to_string())
            .build();
        let sender = if command {
            &mut self.commands
        } else {
            &mut self.queries
        };
        let outcome = sender.send(message).await.unwrap();
        assert!(
            matches!(outcome, Outcome::Accepted(_)),
            "RPC-4: {outcome:?}"
        );
    }

    /// The next reply, if one comes within `wait`.
    async fn reply(&mut self, wait: Duration) -> Option<Message<Body<Value>>> {
        let d = tokio::time::timeout(wait, self.replies.recv::<Body<Value>>())
            .await
            .ok()?
            .unwrap();
        self.replies.accept(&d).await.unwrap();
        Some(d.into_message())
    }
}

/// A responder's connection with a receiver on each pattern of `channel` and a relay sender,
/// and an events receiver on the same channel beside them.
struct Responder {
    conn: ConnectionHandle<()>,
    session: SessionHandle<()>,
    commands: Receiver,
    queries: Receiver,
    events: Receiver,
    relay: Sender,
}

impl Responder {
    async fn open(url: &str, channel: &str) -> Responder {
        let mut conn = Connection::open("loss-responder", url).await.unwrap();
        let mut session = Session::begin(&mut conn).await.unwrap();
        let relay = interop_tests::relay_sender(&mut session, "relay").await;
        let commands = receiver(&mut session, "commands-1", &format!("commands/{channel}")).await;
        let queries = receiver(&mut session, "queries-1", &format!("queries/{channel}")).await;
        let events = receiver(&mut session, "events-1", &format!("events/{channel}")).await;
        Responder {
            conn,
            session,
            commands,
            queries,
            events,
            relay,
        }
    }
}

/// A receiver on `source` granting 10 at a time.
async fn receiver(session: &mut SessionHandle<()>, name: &str, source: &str) -> Receiver {
    interop_tests::receiver(session, name, source, 10, &[]).await
}

/// Takes the next request from `r` (settled `accepted`) and returns its `reply-to`.
async fn take_request(r: &mut Receiver) -> String {
    let d = tokio::time::timeout(Duration::from_secs(20), r.recv::<Body<Value>>())
        .await
        .expect("a request in time")
        .unwrap();
    r.accept(&d).await.unwrap();
    d.message()
        .properties
        .as_ref()
        .and_then(|p| p.reply_to.clone())
        .expect("RPC-12: reply-to")
}

/// The receiver is detached by the connector with `amqp:internal-error`, saying its broker
/// subscription ended because the broker became unavailable.
async fn detached_by_loss(r: &mut Receiver) {
    let got = tokio::time::timeout(Duration::from_secs(20), r.recv::<Body<Value>>())
        .await
        .expect("the receiver hears of the loss in time");
    match got {
        Err(RecvError::LinkStateError(
            LinkStateError::RemoteDetachedWithError(e) | LinkStateError::RemoteClosedWithError(e),
        )) => {
            assert_eq!(
                e.condition,
                ErrorCondition::AmqpError(AmqpError::InternalError)
            );
            let text = e.description.unwrap_or_default();
            assert!(
                text.starts_with("subscription ended: backend unavailable"),
                "{text}"
            );
        }
        other => panic!("a detach with an error, got {other:?}"),
    }
}

fn flag(m: &Message<Body<Value>>, key: &str) -> Option<SimpleValue> {
    m.application_properties
        .as_ref()
        .and_then(|a: &ApplicationProperties| a.get(key).cloned())
}

/// RPC-7, RPC-8, RPC-11, RPC-14: the broker dies with a command and a query waiting at a
/// responder. The command's requester gets its reply at once — executed false, with the
/// broker's error — not after the request's two-minute timeout; the query's gets nothing
/// (RPC-8); the responder's receivers, and an events receiver beside them, are detached with
/// `amqp:internal-error` ("subscription ended: backend unavailable: …"), and its two tokens stay
/// answerable (RPC-14). Once the broker is back on the same port the same connections carry
/// request and reply again (the gRPC client reconnects by itself; the responder attaches anew),
/// the answers to the lost requests are accepted, and nothing is held afterwards.
#[test]
fn rpc_broker_loss_ends_pending_requests_and_recovers() {
    broker_loss(Broker::facade());
    if let Some(binary) = interop_tests::real_kubemq::binary() {
        broker_loss(Broker::Real(RealKubemq::start(&binary)));
    }
}

/// Requests waiting at the broker for a response, where the broker can say.
fn requests_waiting(broker: &Broker) -> Option<usize> {
    match broker {
        Broker::Facade(f, _) => Some(f.store.requests().waiting()),
        Broker::Real(_) => None,
    }
}

fn broker_loss(broker: Broker) {
    let c = broker.connector();
    let channel = format!("rpc.loss.{}", connector::kubemq::new_id());
    let rt = interop_tests::runtime();
    let (mut requester, mut responder, tokens) = rt.block_on(async {
        let mut responder = Responder::open(&c.url(), &channel).await;
        let mut requester = Requester::open(&c.url(), &channel).await;
        requester.ask(true, "held-command").await;
        requester.ask(false, "held-query").await;
        let tokens = [
            take_request(&mut responder.commands).await,
            take_request(&mut responder.queries).await,
        ];
        (requester, responder, tokens)
    });
    // Both requests wait at the broker (where it can say so) and the connector holds the
    // requester's two calls and the responder's two tokens.
    testkit::eventually(
        "both requests wait at the broker",
        Duration::from_secs(10),
        || requests_waiting(&broker).unwrap_or(2) == 2 && c.rpc_held() == 4,
    );

    let stopped = broker.stop(Stop::Crash);
    rt.block_on(async {
        let reply = requester
            .reply(Duration::from_secs(20))
            .await
            .expect("RPC-7: the command's reply comes when the broker is lost");
        assert_eq!(
            reply
                .properties
                .as_ref()
                .and_then(|p| p.correlation_id.clone()),
            Some(MessageId::String("held-command".into())),
            "RPC-6"
        );
        assert_eq!(
            flag(&reply, EXECUTED),
            Some(SimpleValue::Bool(false)),
            "RPC-7"
        );
        match flag(&reply, ERROR) {
            Some(SimpleValue::String(text)) => assert!(!text.is_empty(), "RPC-7"),
            other => panic!("RPC-7: an error text, got {other:?}"),
        }
        detached_by_loss(&mut responder.commands).await;
        detached_by_loss(&mut responder.queries).await;
        detached_by_loss(&mut responder.events).await;
        assert!(
            requester.reply(Duration::from_secs(2)).await.is_none(),
            "RPC-8: a failed query delivers nothing"
        );
    });
    // The requester's calls are over; the responder's two tokens stay answerable until they
    // expire (RPC-14): the connector cannot tell a broker that lost them from one stream ended.
    testkit::eventually(
        "only the responder's two tokens held",
        Duration::from_secs(20),
        || c.rpc_held() == 2,
    );

    let broker = stopped.start_again();
    rt.block_on(async {
        let mut commands = receiver(
            &mut responder.session,
            "commands-2",
            &format!("commands/{channel}"),
        )
        .await;
        requester.ask(true, "after").await;
        let to = take_request(&mut commands).await;
        // The answers to the requests the broker lost are taken too: KubeMQ discards a response
        // nobody waits for and answers it like any other.
        for to in tokens.into_iter().chain([to]) {
            let answer = Message::builder()
                .properties(Properties::builder().to(to).build())
                .application_properties(
                    ApplicationProperties::builder()
                        .insert(EXECUTED, true)
                        .build(),
                )
                .body(Body::<Value>::Empty)
                .build();
            let outcome = responder.relay.send(answer).await.unwrap();
            assert!(
                matches!(outcome, Outcome::Accepted(_)),
                "RPC-13: {outcome:?}"
            );
        }
        let reply = requester
            .reply(Duration::from_secs(20))
            .await
            .expect("a reply once the broker is back");
        assert_eq!(flag(&reply, EXECUTED), Some(SimpleValue::Bool(true)));
        requester.conn.close().await.unwrap();
        responder.conn.close().await.unwrap();
    });
    match &broker {
        Broker::Facade(f, _) => c.no_rpc_left_with(&f.store),
        Broker::Real(_) => c.no_rpc_left(),
    }
}

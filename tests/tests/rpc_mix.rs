//! Every responder behaviour at once, fe2o3-amqp over real sockets on every backend: requesters
//! on four connections send commands and queries together, two responders in one group answer
//! each request as its body says — at once, twice, never, or after the request timed out (inside
//! the 5 s the token outlives its timeout) — and each side checks what it got against what the
//! mix says it must: one reply per command, executed or timed out; one reply per answered query
//! and none for the others; the first answer accepted, a second refused, a late one taken without
//! a second reply reaching the requester. Afterwards no table holds an entry. Beside it, a
//! responder that leaves holding requests.

use std::collections::HashMap;
use std::time::Duration;

use connector::config::Settings;
use fe2o3_amqp::link::delivery::DeliveryFut;
use fe2o3_amqp::link::SendError;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::definitions::{AmqpError, ErrorCondition};
use fe2o3_amqp::types::messaging::{
    AmqpValue, ApplicationProperties, Body, Header, Message, MessageId, Outcome, Properties,
};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use interop_tests::TestConnector;
use tokio::time::Instant;

const EXECUTED: &str = "x-opt-kubemq-executed";
const ERROR: &str = "x-opt-kubemq-error";
/// Every request's timeout: the shortest the connector allows (RPC-3).
const TTL_MS: u32 = 1_000;
/// How long a slow responder waits before answering: past the request's timeout, well inside
/// the 5 s its token outlives it (RPC-14).
const SLOW: Duration = Duration::from_millis(2_000);
const REQUESTERS: usize = 4;
/// Requests per requester: each act on each pattern, this many times.
const ROUNDS: usize = 5;

/// What a responder does with a request; the request's body names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Answer,
    Twice,
    Silent,
    Slow,
}

const ACTS: [Act; 4] = [Act::Answer, Act::Twice, Act::Silent, Act::Slow];

impl Act {
    fn name(self) -> &'static str {
        match self {
            Act::Answer => "answer",
            Act::Twice => "twice",
            Act::Silent => "silent",
            Act::Slow => "slow",
        }
    }

    fn of(body: &str) -> Act {
        let name = body.split(':').next().unwrap_or_default();
        ACTS.into_iter()
            .find(|a| a.name() == name)
            .unwrap_or_else(|| panic!("a request body naming an act: {body}"))
    }

    /// Whether the requester hears an answer from the responder (not the timeout).
    fn answered(self) -> bool {
        matches!(self, Act::Answer | Act::Twice)
    }
}

/// One request of the mix.
#[derive(Debug, Clone)]
struct Ask {
    command: bool,
    act: Act,
    /// The correlation-id, unique in the test; also the request's body after the act.
    id: String,
}

impl Ask {
    /// Requester `me`'s requests: every act on both patterns `ROUNDS` times, interleaved.
    fn mix(me: usize) -> Vec<Ask> {
        (0..ROUNDS * ACTS.len() * 2)
            .map(|i| Ask {
                command: i % 2 == 0,
                act: ACTS[(i / 2 + me) % ACTS.len()],
                id: format!("{me}-{i}"),
            })
            .collect()
    }

    fn body(&self) -> String {
        format!("{}:{}", self.act.name(), self.id)
    }
}

fn flag(m: &Message<Body<Value>>, key: &str) -> Option<SimpleValue> {
    m.application_properties
        .as_ref()
        .and_then(|a: &ApplicationProperties| a.get(key).cloned())
}

fn text(body: &Body<Value>) -> String {
    match body {
        Body::Value(v) => match &v.0 {
            Value::String(s) => s.clone(),
            other => panic!("a string body, got {other:?}"),
        },
        other => panic!("an AmqpValue body, got {other:?}"),
    }
}

/// Sends requester `me`'s mix at once, then checks each reply against its request and that no
/// reply comes that the mix does not call for.
async fn requester(url: String, channel: String, me: usize) {
    let mut conn = Connection::open(format!("mix-requester-{me}"), url.as_str())
        .await
        .unwrap();
    let mut session = Session::begin(&mut conn).await.unwrap();
    let (mut replies, reply_to) = interop_tests::reply_node(&mut session, 50).await;
    let mut commands = Sender::attach(&mut session, "commands", format!("commands/{channel}"))
        .await
        .unwrap();
    let mut queries = Sender::attach(&mut session, "queries", format!("queries/{channel}"))
        .await
        .unwrap();
    let asks = Ask::mix(me);
    for ask in &asks {
        let m = Message::builder()
            .header(Header::builder().ttl(TTL_MS).build())
            .properties(
                Properties::builder()
                    .reply_to(reply_to.clone())
                    .correlation_id(MessageId::String(ask.id.clone()))
                    .build(),
            )
            .value(ask.body())
            .build();
        let sender = if ask.command {
            &mut commands
        } else {
            &mut queries
        };
        let outcome = sender.send(m).await.unwrap();
        assert!(
            matches!(outcome, Outcome::Accepted(_)),
            "RPC-4: {outcome:?}"
        );
    }
    let mut waiting: HashMap<String, Ask> = asks
        .into_iter()
        .filter(|a| a.command || a.act.answered())
        .map(|a| (a.id.clone(), a))
        .collect();
    // Every reply the mix calls for, then a quiet spell past the slow answers: anything more is
    // a reply too many.
    let quiet_until = Instant::now() + SLOW + Duration::from_secs(2);
    loop {
        let wait = if waiting.is_empty() {
            quiet_until.saturating_duration_since(Instant::now())
        } else {
            Duration::from_secs(20)
        };
        let Ok(d) = tokio::time::timeout(wait, replies.recv::<Body<Value>>()).await else {
            assert!(
                waiting.is_empty(),
                "{me}: no reply in time for {:?}",
                waiting.values().collect::<Vec<_>>()
            );
            break;
        };
        let d = d.unwrap();
        replies.accept(&d).await.unwrap();
        let m = d.into_message();
        let Some(MessageId::String(id)) =
            m.properties.as_ref().and_then(|p| p.correlation_id.clone())
        else {
            panic!("RPC-6: a string correlation-id");
        };
        let Some(ask) = waiting.remove(&id) else {
            panic!("{me}: a reply to {id} that the mix does not call for, or a second one: {m:?}");
        };
        if ask.command {
            let executed = flag(&m, EXECUTED);
            if ask.act.answered() {
                assert_eq!(executed, Some(SimpleValue::Bool(true)), "RPC-7: {ask:?}");
            } else {
                assert_eq!(executed, Some(SimpleValue::Bool(false)), "RPC-7: {ask:?}");
                let Some(SimpleValue::String(error)) = flag(&m, ERROR) else {
                    panic!("RPC-7: the timeout's error text for {ask:?}");
                };
                assert!(error.contains("timeout"), "OP-RPC-4: {error}");
            }
        } else {
            assert_eq!(text(&m.body), format!("result:{}", ask.body()), "RPC-8");
            assert_eq!(flag(&m, EXECUTED), None, "RPC-8");
        }
    }
    conn.close().await.unwrap();
}

/// A reply the responder has sent, and the outcome it must get.
struct Sent {
    outcome: DeliveryFut<Result<Outcome, SendError>>,
    /// `None`: accepted; `Some`: rejected with this condition.
    refused: Option<ErrorCondition>,
    what: String,
}

/// A receiver on `source` in the group `mix`, granting 50 at a time.
async fn requests_receiver(
    session: &mut SessionHandle<()>,
    name: &str,
    source: String,
) -> Receiver {
    interop_tests::receiver(session, name, source, 50, &[("x-opt-kubemq-group", "mix")]).await
}

/// Answers requests on both patterns of `channel` in the group `mix` as their bodies say, until
/// `stop` says so; then checks every outcome and returns how many requests it took.
async fn responder(
    url: String,
    channel: String,
    me: usize,
    ready: tokio::sync::oneshot::Sender<()>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> usize {
    let mut conn = Connection::open(format!("mix-responder-{me}"), url.as_str())
        .await
        .unwrap();
    let mut session = Session::begin(&mut conn).await.unwrap();
    let mut relay = interop_tests::relay_sender(&mut session, "replies").await;
    let mut commands =
        requests_receiver(&mut session, "commands", format!("commands/{channel}")).await;
    let mut queries =
        requests_receiver(&mut session, "queries", format!("queries/{channel}")).await;
    ready.send(()).unwrap();
    let mut sent: Vec<Sent> = Vec::new();
    // Slow answers, due in the order they were taken.
    let mut slow: std::collections::VecDeque<(Instant, Message<AmqpValue<Value>>)> =
        Default::default();
    let mut taken = 0;
    loop {
        let due = slow
            .front()
            .map_or(Instant::now() + Duration::from_secs(3600), |(at, _)| *at);
        let (d, command) = tokio::select! {
            d = commands.recv::<Body<Value>>() => (d.unwrap(), true),
            d = queries.recv::<Body<Value>>() => (d.unwrap(), false),
            _ = tokio::time::sleep_until(due) => {
                let (_, reply) = slow.pop_front().expect("a slow answer is due");
                let what = format!("the slow answer {reply:?}");
                let outcome = relay.send_batchable(reply).await.unwrap();
                sent.push(Sent { outcome, refused: None, what });
                continue;
            }
            _ = stop.changed(), if slow.is_empty() => break,
        };
        taken += 1;
        if command {
            commands.accept(&d).await.unwrap();
        } else {
            queries.accept(&d).await.unwrap();
        }
        let props = d.message().properties.clone().expect("RPC-12");
        let to = props.reply_to.clone().expect("RPC-12: reply-to");
        let body = text(&d.message().body);
        let reply = || {
            let m = Message::builder().properties(
                Properties::builder()
                    .to(to.clone())
                    .correlation_id(props.correlation_id.clone().expect("RPC-12"))
                    .build(),
            );
            if command {
                m.application_properties(
                    ApplicationProperties::builder()
                        .insert(EXECUTED, true)
                        .build(),
                )
                .value(Value::Null)
                .build()
            } else {
                m.value(Value::String(format!("result:{body}"))).build()
            }
        };
        match Act::of(&body) {
            Act::Silent => {}
            Act::Slow => slow.push_back((Instant::now() + SLOW, reply())),
            act @ (Act::Answer | Act::Twice) => {
                let outcome = relay.send_batchable(reply()).await.unwrap();
                sent.push(Sent {
                    outcome,
                    refused: None,
                    what: format!("the answer to {body}"),
                });
                if act == Act::Twice {
                    let outcome = relay.send_batchable(reply()).await.unwrap();
                    sent.push(Sent {
                        outcome,
                        refused: Some(ErrorCondition::AmqpError(AmqpError::NotFound)),
                        what: format!("the second answer to {body}"),
                    });
                }
            }
        }
    }
    for s in sent {
        match (s.outcome.await.unwrap(), s.refused) {
            (Outcome::Accepted(_), None) => {}
            (Outcome::Rejected(r), Some(condition)) => {
                let e = r.error.expect("a rejection says why");
                assert_eq!(e.condition, condition, "{}", s.what);
                assert_eq!(
                    e.description.as_deref(),
                    Some("no pending request for this reply token"),
                    "OP-RPC-5: {}",
                    s.what
                );
            }
            (outcome, expected) => {
                panic!("{}: {outcome:?}, expected refused {expected:?}", s.what)
            }
        }
    }
    conn.close().await.unwrap();
    taken
}

/// RPC-3, RPC-7, RPC-8, RPC-11, RPC-13, RPC-14, OP-RPC-4, OP-RPC-5: commands and queries from
/// four connections answered at once, twice, never or after their timeout by two grouped
/// responders, all in flight together. Each command gets exactly one reply — executed when
/// answered, `executed = false` with the timeout otherwise, also when its answer comes after
/// the timeout; each answered query gets its answer and no other query gets anything; a first
/// answer is accepted, a second refused `amqp:not-found`, a late one (token still live)
/// accepted. Both responders take requests, every request is counted, and afterwards no table
/// of the connector or the store holds an entry.
#[test]
fn rpc_every_responder_behaviour_at_once() {
    TestConnector::each_backend(Settings::default(), |c| {
        let channel = format!("rpc.mix.{}", connector::kubemq::new_id());
        let taken = interop_tests::runtime().block_on(async {
            let (stop_tx, stop) = tokio::sync::watch::channel(false);
            let mut answering = Vec::new();
            for me in 0..2 {
                let (ready_tx, ready) = tokio::sync::oneshot::channel();
                answering.push(tokio::spawn(responder(
                    c.url(),
                    channel.clone(),
                    me,
                    ready_tx,
                    stop.clone(),
                )));
                ready.await.unwrap();
            }
            let asking: Vec<_> = (0..REQUESTERS)
                .map(|me| tokio::spawn(requester(c.url(), channel.clone(), me)))
                .collect();
            for a in asking {
                a.await.unwrap();
            }
            stop_tx.send(true).unwrap();
            let mut taken = Vec::new();
            for a in answering {
                taken.push(a.await.unwrap());
            }
            taken
        });
        let each = ROUNDS * ACTS.len() * 2;
        assert_eq!(taken.iter().sum::<usize>(), REQUESTERS * each, "{taken:?}");
        assert!(taken.iter().all(|&t| t > 0), "RPC-11: {taken:?}");
        for pattern in ["commands", "queries"] {
            let counted = c.rpc_requests(pattern);
            assert_eq!(counted, (REQUESTERS * each / 2) as u64, "MET-6 {pattern}");
        }
        c.no_rpc_left();
    });
}

/// Waits until `c` holds `n` request/reply entries, at most `within`.
async fn held_becomes(c: &TestConnector, n: i64, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while c.rpc_held() != n {
        assert!(
            Instant::now() < deadline,
            "{what}: {} held, expected {n}",
            c.rpc_held()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The next message on the reply node, accepted; `what` names it if none comes in 20 s.
async fn next_reply(replies: &mut Receiver, what: &str) -> Message<Body<Value>> {
    let d = tokio::time::timeout(Duration::from_secs(20), replies.recv::<Body<Value>>())
        .await
        .unwrap_or_else(|_| panic!("no reply in time: {what}"))
        .unwrap();
    replies.accept(&d).await.unwrap();
    d.into_message()
}

/// RPC-7, RPC-8, RPC-11, RPC-14: a responder's connection closes while it holds a command and a
/// query it never answered. Its reply tokens go with it at once, not when they would have expired
/// (5 s after the requests' timeout); the requests themselves wait for their timeout — the
/// command's requester then gets `executed = false`, the query's nothing — and a responder that
/// attaches afterwards gets the next request and its answer reaches the requester.
#[test]
fn rpc_a_responder_that_leaves_holding_requests() {
    const HELD_TTL: Duration = Duration::from_secs(6);
    TestConnector::each_backend(Settings::default(), |c| {
        let channel = format!("rpc.leave.{}", connector::kubemq::new_id());
        interop_tests::runtime().block_on(async {
            let url = c.url();
            let mut leaving = Connection::open("leaving-responder", url.as_str())
                .await
                .unwrap();
            let mut session = Session::begin(&mut leaving).await.unwrap();
            let mut commands =
                requests_receiver(&mut session, "commands", format!("commands/{channel}")).await;
            let mut queries =
                requests_receiver(&mut session, "queries", format!("queries/{channel}")).await;

            let mut conn = Connection::open("staying-requester", url.as_str())
                .await
                .unwrap();
            let mut asking = Session::begin(&mut conn).await.unwrap();
            let (mut replies, reply_to) = interop_tests::reply_node(&mut asking, 10).await;
            let mut relay = interop_tests::relay_sender(&mut asking, "requests").await;
            let request = |pattern: &str, id: &str, act: Act| {
                Message::builder()
                    .header(Header::builder().ttl(HELD_TTL.as_millis() as u32).build())
                    .properties(
                        Properties::builder()
                            .to(format!("{pattern}/{channel}"))
                            .reply_to(reply_to.clone())
                            .correlation_id(MessageId::String(id.into()))
                            .build(),
                    )
                    .value(format!("{}:{id}", act.name()))
                    .build()
            };
            for (pattern, id) in [("commands", "held-command"), ("queries", "held-query")] {
                let outcome = relay.send(request(pattern, id, Act::Silent)).await.unwrap();
                assert!(
                    matches!(outcome, Outcome::Accepted(_)),
                    "RPC-4: {outcome:?}"
                );
            }
            let sent = Instant::now();
            for r in [&mut commands, &mut queries] {
                let d = r.recv::<Body<Value>>().await.unwrap();
                r.accept(&d).await.unwrap();
            }
            // Two requests waiting for a response, two tokens at the responder.
            held_becomes(c, 4, Duration::from_secs(10), "both requests delivered").await;
            leaving.close().await.unwrap();
            let gone = "RPC-14: the leaving responder's tokens go with it";
            held_becomes(c, 2, Duration::from_secs(3), gone).await;
            // Before the requests' timeout: the two still held are the requester's.
            assert!(
                sent.elapsed() < HELD_TTL,
                "{gone}, before the requests time out"
            );

            let m = next_reply(&mut replies, "RPC-7: the command's reply after its timeout").await;
            assert!(
                sent.elapsed() >= HELD_TTL - Duration::from_millis(100),
                "RPC-3"
            );
            assert_eq!(
                m.properties.as_ref().and_then(|p| p.correlation_id.clone()),
                Some(MessageId::String("held-command".into())),
                "RPC-8: the query gets nothing"
            );
            assert_eq!(flag(&m, EXECUTED), Some(SimpleValue::Bool(false)), "RPC-7");
            held_becomes(c, 0, Duration::from_secs(10), "both requests over").await;

            // The channel is served again by whoever attaches next.
            let (ready_tx, ready) = tokio::sync::oneshot::channel();
            let (stop_tx, stop) = tokio::sync::watch::channel(false);
            let next = tokio::spawn(responder(url.clone(), channel.clone(), 9, ready_tx, stop));
            ready.await.unwrap();
            let outcome = relay
                .send(request("queries", "after", Act::Answer))
                .await
                .unwrap();
            assert!(
                matches!(outcome, Outcome::Accepted(_)),
                "RPC-4: {outcome:?}"
            );
            let m = next_reply(&mut replies, "the new responder's answer").await;
            assert_eq!(text(&m.body), "result:answer:after", "RPC-8");
            stop_tx.send(true).unwrap();
            assert_eq!(next.await.unwrap(), 1, "RPC-11: the new responder took it");
            conn.close().await.unwrap();
        });
        c.no_rpc_left();
    });
}

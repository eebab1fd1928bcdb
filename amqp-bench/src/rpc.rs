//! Request/reply load (`--rpc`): requesters send commands or queries on the node address with a
//! dynamic reply node, up to `--pipeline` each in flight (paced by `--rate`), and time each
//! round trip from the request to its reply (matched by correlation-id, the request's number);
//! responders answer through an anonymous sender (a query's reply echoes the request's body).
//! With `--grpc` the same load runs straight on KubeMQ's gRPC API (SendRequest,
//! SubscribeToRequests, SendResponse), for the connector's added cost.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::messaging::{
    ApplicationProperties, Body, Data, Message, MessageId, Outcome, Properties, Source, Target,
};
use fe2o3_amqp::types::primitives::{Binary, Value};
use fe2o3_amqp::{Receiver, Sender, Session};
use futures_util::stream::{FuturesUnordered, StreamExt};

use connector::backend::grpc::{GrpcOptions, KubemqGrpc};
use connector::backend::Backend;
use connector::kubemq::request::RequestType;
use connector::kubemq::subscribe::SubscribeType;

use super::{body, connect, Args, Seen, Stop, Tally};

/// Whether the address names commands (replies carry no data) or queries.
fn commands(args: &Args) -> bool {
    args.address.starts_with("commands/")
}

/// The KubeMQ channel behind the address.
fn channel(args: &Args) -> String {
    let a = &args.address;
    a.strip_prefix("commands/")
        .or_else(|| a.strip_prefix("queries/"))
        .unwrap_or(a)
        .to_string()
}

/// Sends `count` requests numbered from `first` and waits for every reply.
pub async fn request(
    args: &Args,
    who: usize,
    first: u64,
    count: u64,
    started: Instant,
    tally: &Tally,
    seen: &Mutex<Seen>,
) -> Result<(), String> {
    if let Some(addr) = args.grpc.clone() {
        return request_grpc(&addr, args, first, count, started, tally, seen).await;
    }
    let mut conn = connect(&args.url, format!("amqp-bench-requester-{who}")).await?;
    let mut session = Session::begin(&mut conn).await.map_err(|e| e.to_string())?;
    let mut replies = Receiver::builder()
        .name(format!("replies-{who}"))
        .source(Source::builder().dynamic(true).build())
        .credit_mode(CreditMode::Auto(args.credit))
        .attach(&mut session)
        .await
        .map_err(|e| e.to_string())?;
    let reply_to = replies
        .source()
        .as_ref()
        .and_then(|s| s.address.clone())
        .ok_or("no dynamic node address in the reply ATTACH")?;
    let mut sender = Sender::builder()
        .name(format!("requests-{who}"))
        .target(args.address.clone())
        .attach(&mut session)
        .await
        .map_err(|e| e.to_string())?;
    let rate = args.per_producer_rate();
    let paced = Instant::now();
    let mut sent_at: HashMap<u64, Instant> = HashMap::new();
    let mut outcomes = FuturesUnordered::new();
    let (mut next, mut answered) = (0u64, 0u64);
    while answered < count {
        let due = (rate > 0.0).then(|| paced + Duration::from_secs_f64(next as f64 / rate));
        let may_send = next < count && (sent_at.len() < args.pipeline.max(1));
        if may_send && due.is_none_or(|d| d <= Instant::now()) {
            let n = first + next;
            let m = Message::builder()
                .properties(
                    Properties::builder()
                        .reply_to(reply_to.clone())
                        .correlation_id(MessageId::Ulong(n))
                        .build(),
                )
                .data(Binary::from(body(n, started, args.size)))
                .build();
            sent_at.insert(n, Instant::now());
            outcomes.push(sender.send_batchable(m).await.map_err(|e| e.to_string())?);
            tally.sent.fetch_add(1, Ordering::Relaxed);
            next += 1;
            continue;
        }
        let wake = due
            .filter(|_| may_send)
            .unwrap_or(Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            d = replies.recv::<Body<Value>>() => {
                let d = d.map_err(|e| e.to_string())?;
                replies.accept(&d).await.map_err(|e| e.to_string())?;
                let Some(MessageId::Ulong(n)) =
                    d.message().properties.as_ref().and_then(|p| p.correlation_id.clone())
                else {
                    return Err("a reply without its request's correlation-id".into());
                };
                if let Some(at) = sent_at.remove(&n) {
                    seen.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .record(n, at.elapsed().as_nanos() as u64);
                    tally.received.fetch_add(1, Ordering::Relaxed);
                    answered += 1;
                }
            }
            Some(o) = outcomes.next(), if !outcomes.is_empty() => match o {
                Ok(Outcome::Accepted(_)) => { tally.accepted.fetch_add(1, Ordering::Relaxed); }
                _ => { tally.failed.fetch_add(1, Ordering::Relaxed); }
            },
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
    }
    let _ = conn.close().await;
    Ok(())
}

/// Answers requests until told to stop.
pub async fn respond(args: &Args, who: usize, mut stop: Stop) -> Result<(), String> {
    if let Some(addr) = args.grpc.clone() {
        return respond_grpc(&addr, args, who, stop).await;
    }
    let mut conn = connect(&args.url, format!("amqp-bench-responder-{who}")).await?;
    let mut session = Session::begin(&mut conn).await.map_err(|e| e.to_string())?;
    let mut replies = Sender::builder()
        .name(format!("replies-{who}"))
        .target(Target::builder().build())
        .attach(&mut session)
        .await
        .map_err(|e| e.to_string())?;
    let mut requests = Receiver::builder()
        .name(format!("responder-{who}"))
        .source(args.address.clone())
        .properties(args.link_properties())
        .credit_mode(CreditMode::Auto(args.credit))
        .attach(&mut session)
        .await
        .map_err(|e| e.to_string())?;
    let is_command = commands(args);
    let mut outcomes = FuturesUnordered::new();
    loop {
        let d = tokio::select! {
            d = requests.recv::<Data>() => d.map_err(|e| e.to_string())?,
            Some(_) = outcomes.next(), if !outcomes.is_empty() => continue,
            _ = stop.changed() => break,
        };
        requests.accept(&d).await.map_err(|e| e.to_string())?;
        let props = d.message().properties.clone().unwrap_or_default();
        let reply = Message::builder().properties(
            Properties::builder()
                .to(props.reply_to.unwrap_or_default())
                .correlation_id(props.correlation_id.unwrap_or(MessageId::Ulong(0)))
                .build(),
        );
        let reply = if is_command {
            reply
                .application_properties(
                    ApplicationProperties::builder()
                        .insert("x-opt-kubemq-executed", true)
                        .build(),
                )
                .data(Binary::from(Vec::new()))
                .build()
        } else {
            reply.data(d.body().0.clone()).build()
        };
        outcomes.push(
            replies
                .send_batchable(reply)
                .await
                .map_err(|e| e.to_string())?,
        );
        while outcomes.len() > args.pipeline.max(1) {
            outcomes.next().await;
        }
    }
    let _ = conn.close().await;
    Ok(())
}

fn client(addr: &str) -> Result<KubemqGrpc, String> {
    KubemqGrpc::connect(addr, GrpcOptions::default()).map_err(|e| e.to_string())
}

/// The requester's load on KubeMQ's gRPC API: SendRequest calls, `--pipeline` in flight.
async fn request_grpc(
    addr: &str,
    args: &Args,
    first: u64,
    count: u64,
    started: Instant,
    tally: &Tally,
    seen: &Mutex<Seen>,
) -> Result<(), String> {
    let c = client(addr)?;
    let kind = if commands(args) {
        RequestType::Command
    } else {
        RequestType::Query
    };
    let rate = args.per_producer_rate();
    let paced = Instant::now();
    let mut calls = FuturesUnordered::new();
    for i in 0..count {
        if rate > 0.0 {
            // The calls in flight go on while the next one waits for its time.
            let due =
                tokio::time::Instant::from_std(paced + Duration::from_secs_f64(i as f64 / rate));
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(due) => break,
                    Some(done) = calls.next(), if !calls.is_empty() => answered(Some(done), tally, seen),
                }
            }
        }
        let n = first + i;
        let request = connector::kubemq::Request {
            request_type_data: kind as i32,
            client_id: "amqp-bench".into(),
            channel: channel(args),
            body: body(n, started, args.size),
            timeout: 30_000,
            ..Default::default()
        };
        let c = c.clone();
        let at = Instant::now();
        calls.push(async move { (n, at, c.send_request(request).await) });
        tally.sent.fetch_add(1, Ordering::Relaxed);
        while calls.len() >= args.pipeline.max(1) {
            answered(calls.next().await, tally, seen);
        }
    }
    while let Some(done) = calls.next().await {
        answered(Some(done), tally, seen);
    }
    Ok(())
}

type Done = (
    u64,
    Instant,
    Result<connector::kubemq::Response, connector::backend::BackendError>,
);

fn answered(done: Option<Done>, tally: &Tally, seen: &Mutex<Seen>) {
    let Some((n, at, result)) = done else {
        return;
    };
    match result {
        Ok(_) => {
            tally.accepted.fetch_add(1, Ordering::Relaxed);
            tally.received.fetch_add(1, Ordering::Relaxed);
            seen.lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(n, at.elapsed().as_nanos() as u64);
        }
        Err(_) => {
            tally.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The responder's load on KubeMQ's gRPC API: a request subscription answered with
/// SendResponse calls, `--pipeline` in flight.
async fn respond_grpc(addr: &str, args: &Args, who: usize, mut stop: Stop) -> Result<(), String> {
    let c = client(addr)?;
    let subscribe_type = if commands(args) {
        SubscribeType::Commands
    } else {
        SubscribeType::Queries
    };
    let mut requests = c
        .subscribe_requests(connector::kubemq::Subscribe {
            subscribe_type_data: subscribe_type as i32,
            client_id: format!("amqp-bench-responder-{who}"),
            channel: channel(args),
            group: args.group.clone().unwrap_or_default(),
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let is_command = commands(args);
    let mut calls = FuturesUnordered::new();
    loop {
        let r = tokio::select! {
            r = requests.next() => match r {
                Some(r) => r.map_err(|e| e.to_string())?,
                None => break,
            },
            Some(_) = calls.next(), if !calls.is_empty() => continue,
            _ = stop.changed() => break,
        };
        let response = connector::kubemq::Response {
            client_id: format!("amqp-bench-responder-{who}"),
            request_id: r.request_id,
            reply_channel: r.reply_channel,
            executed: true,
            body: if is_command { Vec::new() } else { r.body },
            ..Default::default()
        };
        let c = c.clone();
        calls.push(async move { c.send_response(response).await });
        while calls.len() > args.pipeline.max(1) {
            calls.next().await;
        }
    }
    Ok(())
}

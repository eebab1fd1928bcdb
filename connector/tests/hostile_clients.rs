//! The connector process against clients that try to make it hold memory: its resident memory
//! is sampled from `/proc` while the abuse runs and must stay within the documented budgets, the
//! abuser gets the documented condition, and a well-behaved client on the same connector loses
//! nothing. Its own test binary: it watches a child process of its own.
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{free_port, memory_of, start_connector};
use connector::engine::codec::Performative;
use connector::engine::peer;
use connector::engine::DeliveryOutcome;
use fe2o3_amqp_types::definitions::{Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{Accepted, Data, DeliveryState};
use fe2o3_amqp_types::performatives::{Disposition, Flow};
use serde_bytes::ByteBuf;
use testkit::raw::RawPeer;

const MIB: u64 = 1024 * 1024;

/// The tests here run one at a time: each drives a connector hard and some judge time (a
/// legitimate client's handshake among hostile sockets), which two cores shared with the others
/// would blur.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Samples the child's resident memory every few milliseconds until dropped; `peak` is the
/// highest seen.
struct RssWatch {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssWatch {
    fn start(pid: u32) -> RssWatch {
        let peak = Arc::new(AtomicU64::new(memory_of(pid, "VmRSS")));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(memory_of(pid, "VmRSS"), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        RssWatch {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for RssWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The child's resident memory once it stopped changing (the store finished writing what it was
/// sent): no two samples 200 ms apart differ by more than 1 MiB.
fn settled_rss(pid: u32) -> u64 {
    let mut last = memory_of(pid, "VmRSS");
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(200));
        let now = memory_of(pid, "VmRSS");
        if now.abs_diff(last) <= MIB {
            return now;
        }
        last = now;
    }
    last
}

fn data(body: &[u8]) -> Vec<u8> {
    serde_amqp::to_vec(&Data(ByteBuf::from(body.to_vec()))).expect("encode")
}

/// Reads until `done` says so or `wait` passes; returns everything read.
fn read_until(
    c: &mut RawPeer,
    wait: Duration,
    mut done: impl FnMut(&[Performative]) -> bool,
) -> Vec<Performative> {
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    while Instant::now() < deadline && !done(&got) {
        match c.performatives(Duration::from_millis(20)) {
            Some(more) => got.extend(more),
            None => break,
        }
    }
    got
}

fn detach_condition(got: &[Performative]) -> Option<String> {
    got.iter().find_map(|p| match p {
        Performative::Detach(d) => d.error.as_ref().map(peer::error_symbol),
        _ => None,
    })
}

/// Attaches a sender on `handle` to `address` and waits for its credit.
fn attach_sender(c: &mut RawPeer, name: &str, handle: u32, address: &str) {
    c.write(&peer::frame(
        0,
        &peer::attach_sender(name, handle, address),
        &[],
    ));
    let got = read_until(c, Duration::from_secs(5), |g| {
        g.iter().any(|p| matches!(p, Performative::Flow(f) if f.handle.as_ref().map(|h| h.0) == Some(handle)))
    });
    assert!(
        got.iter().any(|p| matches!(p, Performative::Flow(_))),
        "no credit for {name}: {got:?}"
    );
}

/// Sends `n` small messages unsettled, one at a time; returns how many were accepted.
fn produce_small(c: &mut RawPeer, handle: u32, first_id: u32, n: u32, tag: &str) -> u32 {
    let mut accepted = 0;
    for id in first_id..first_id + n {
        let body = data(format!("{tag}-{id}").as_bytes());
        c.write(&peer::frame(
            0,
            &peer::transfer(handle, Some(id), Some(&id.to_be_bytes()), false, false),
            &body,
        ));
        let got = read_until(c, Duration::from_secs(5), |g| {
            g.iter()
                .any(|p| matches!(p, Performative::Disposition(d) if d.first <= id && id <= d.last))
        });
        if got.iter().any(|p| {
            matches!(p, Performative::Disposition(d) if d.state == Some(DeliveryOutcome::Accepted))
        }) {
            accepted += 1;
        }
    }
    accepted
}

/// Consumes `queues/<queue>` with acknowledgement until it is quiet; returns the payloads.
fn consume_all(port: u16, queue: &str) -> Vec<bytes::Bytes> {
    let mut c = common::connect(port);
    c.write(&peer::frame(
        0,
        &peer::attach_receiver("drain", 0, &format!("queues/{queue}")),
        &[],
    ));
    c.write(&peer::frame(0, &peer::link_flow(0, 0, 100_000, false), &[]));
    let mut got = Vec::new();
    let mut quiet = 0;
    while quiet < 15 {
        let mut any = false;
        for p in c
            .performatives(Duration::from_millis(100))
            .expect("connected")
        {
            if let Performative::Transfer(t, payload) = p {
                any = true;
                if t.more {
                    continue; // the tests here read whole messages of one frame
                }
                got.push(payload);
                let d = Disposition {
                    role: Role::Receiver,
                    first: t.delivery_id.unwrap_or(0),
                    last: None,
                    settled: true,
                    state: Some(DeliveryState::Accepted(Accepted {})),
                    batchable: false,
                };
                c.write(&peer::frame(0, &d, &[]));
            }
        }
        quiet = if any { 0 } else { quiet + 1 };
    }
    got
}

/// Messages that never end, one at a time on each of twenty connections, sent again on a new
/// link after every refusal: they are cut at the connection or the process budget with
/// `amqp:resource-limit-exceeded` (before MaxMessageSize), the process's resident memory stays
/// within 1.25 × the process budget + 64 MiB with the allocator as it runs in production (the
/// buffers it frees and keeps for a while included), and a well-behaved producer on the same
/// connector has every message accepted and stored throughout.
#[test]
fn endless_messages_stay_within_the_memory_budgets() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let mut server = start_connector(
        dir.path(),
        port,
        &[
            "--max-message-size",
            &(64 * MIB).to_string(),
            "--max-connection-memory",
            &(64 * MIB).to_string(),
            "--max-process-memory",
            &(256 * MIB).to_string(),
        ],
    );
    let pid = server.id();
    // Warm up: one ordinary exchange, so the baseline includes the store and the runtime.
    let mut polite = common::connect(port);
    attach_sender(&mut polite, "polite", 0, "queues/polite");
    assert_eq!(produce_small(&mut polite, 0, 0, 1, "warm"), 1);
    let baseline = settled_rss(pid);
    let watch = RssWatch::start(pid);

    let abusers: Vec<_> = (0..20)
        .map(|n| {
            std::thread::spawn(move || {
                let mut c = common::connect(port);
                let chunk = vec![n as u8; 64 * 1024];
                let mut conditions = Vec::new();
                for h in 0..3u32 {
                    attach_sender(&mut c, &format!("abuse-{h}"), h, "queues/abuse");
                    c.write(&peer::frame(
                        0,
                        &peer::transfer(h, Some(h), Some(b"t"), false, true),
                        &chunk,
                    ));
                    let mut sent = 64 * 1024;
                    let mut condition = None;
                    while condition.is_none() && sent < 100 * MIB {
                        if !c.try_write(&peer::frame(
                            0,
                            &peer::transfer(h, None, None, false, true),
                            &chunk,
                        )) {
                            break;
                        }
                        sent += 64 * 1024;
                        if sent % MIB == 0 {
                            condition = c
                                .performatives(Duration::from_millis(1))
                                .and_then(|g| detach_condition(&g));
                        }
                    }
                    if condition.is_none() {
                        let got = read_until(&mut c, Duration::from_secs(10), |g| {
                            detach_condition(g).is_some()
                        });
                        condition = detach_condition(&got);
                    }
                    conditions.push((condition, sent));
                    // Answer the server's DETACH, freeing the handle.
                    c.write(&peer::frame(0, &peer::detach(h), &[]));
                    read_until(&mut c, Duration::from_millis(100), |_| false);
                }
                conditions
            })
        })
        .collect();
    let accepted = produce_small(&mut polite, 0, 1, 200, "polite");
    for a in abusers {
        for (condition, sent) in a.join().expect("abuser") {
            assert_eq!(
                condition.as_deref(),
                Some("amqp:resource-limit-exceeded"),
                "an abuser that sent {sent} bytes"
            );
        }
    }
    let growth = watch.peak().saturating_sub(baseline);
    drop(watch);
    eprintln!("resident memory grew by {} MiB under abuse", growth / MIB);
    assert_eq!(accepted, 200, "the polite producer was refused");
    assert!(
        growth <= 256 * MIB * 5 / 4 + 64 * MIB,
        "resident memory grew by {} MiB",
        growth / MIB
    );
    let stored = consume_all(port, "polite");
    assert_eq!(stored.len(), 201, "every accepted message is on the queue");
    let _ = server.kill();
    let _ = server.wait();
}

/// A consumer asking for pre-settled deliveries with plenty of credit and a session window of 0
/// gets nothing taken off the queue for it: the process's memory does not grow with the queue, a
/// connection that ends with the window shut loses nothing, and a consumer whose window opens
/// later receives every message, once.
#[test]
fn a_presettled_consumer_with_a_shut_window_takes_only_what_it_can_carry() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let mut server = start_connector(dir.path(), port, &["--max-frame-size", "1048576"]);
    let pid = server.id();
    let mut tx = common::connect(port);
    attach_sender(&mut tx, "tx", 0, "queues/atmost");
    let big = vec![9u8; 512 * 1024];
    let mut accepted = 0;
    for id in 0..QUEUED {
        let mut body = big.clone();
        body[..4].copy_from_slice(&id.to_be_bytes());
        c_send(&mut tx, id, &data(&body));
        accepted += 1;
    }
    let got = read_until(&mut tx, Duration::from_secs(30), |g| {
        g.iter()
            .filter_map(|p| match p {
                Performative::Disposition(d) => Some(d.last + 1),
                _ => None,
            })
            .max()
            == Some(accepted)
    });
    assert!(
        got.iter()
            .any(|p| matches!(p, Performative::Disposition(d) if d.last + 1 == accepted)),
        "not all stored: {got:?}"
    );
    drop(tx);
    let baseline = settled_rss(pid);
    let watch = RssWatch::start(pid);

    let mut rx = shut_window_consumer(port);
    let early = read_until(&mut rx, Duration::from_secs(3), |_| false);
    assert!(
        !early
            .iter()
            .any(|p| matches!(p, Performative::Transfer(..))),
        "a transfer beyond the session window"
    );
    let growth = watch.peak().saturating_sub(baseline);
    drop(watch);
    eprintln!(
        "resident memory grew by {} MiB with the window shut",
        growth / MIB
    );
    // The connection ends with the window still shut: it took nothing off the queue, so
    // nothing is lost.
    drop(rx);
    let mut rx = shut_window_consumer(port);
    read_until(&mut rx, Duration::from_millis(500), |_| false);
    let open = Flow {
        next_incoming_id: Some(0),
        incoming_window: 1_000_000,
        ..peer::link_flow(0, 0, 1000, false)
    };
    rx.write(&peer::frame(0, &open, &[]));
    let mut ids = std::collections::BTreeSet::new();
    let mut dup = 0;
    let mut quiet = 0;
    while quiet < 20 {
        let got = rx
            .performatives(Duration::from_millis(100))
            .expect("connected");
        quiet = if got.is_empty() { quiet + 1 } else { 0 };
        for p in got {
            if let Performative::Transfer(_, payload) = p {
                if !ids.insert(message_id(&payload)) {
                    dup += 1;
                }
            }
        }
    }
    assert_eq!(dup, 0, "a message delivered twice");
    assert_eq!(
        ids.len(),
        QUEUED as usize,
        "messages left after a consumer that could carry none"
    );
    assert!(
        growth < 30 * MIB,
        "resident memory grew by {} MiB for a consumer that can take nothing",
        growth / MIB
    );
    let _ = server.kill();
    let _ = server.wait();
}

/// A consumer of pre-settled deliveries on `queues/atmost` with credit 1000 and a session
/// incoming window of 0.
fn shut_window_consumer(port: u16) -> RawPeer {
    let mut rx = common::connect_bare(port);
    rx.write(&connector::engine::HEADER_AMQP);
    rx.write(&peer::frame(0, &peer::open("atmost"), &[]));
    let mut b = peer::begin();
    b.incoming_window = 0;
    rx.write(&peer::frame(0, &b, &[]));
    let mut a = peer::attach_receiver("rx", 0, "queues/atmost");
    a.snd_settle_mode = SenderSettleMode::Settled;
    rx.write(&peer::frame(0, &a, &[]));
    let mut f = peer::link_flow(0, 0, 1000, false);
    f.incoming_window = 0;
    rx.write(&peer::frame(0, &f, &[]));
    rx
}

/// Messages of 512 KiB queued for the pre-settled consumer: 60 MiB, twice what its memory may
/// grow by.
const QUEUED: u32 = 120;

/// Sends one unsettled message on handle 0 without waiting for its outcome.
fn c_send(c: &mut RawPeer, id: u32, payload: &[u8]) {
    c.write(&peer::frame(
        0,
        &peer::transfer(0, Some(id), Some(&id.to_be_bytes()), false, false),
        payload,
    ));
}

/// The first four bytes of a delivered message's Data section.
fn message_id(msg: &[u8]) -> u32 {
    let layout = connector::engine::message::walk(msg).expect("a valid message");
    let body = &msg[layout.body];
    let data: Data = serde_amqp::from_slice(body).expect("a Data section");
    u32::from_be_bytes(data.0[..4].try_into().expect("4 bytes"))
}

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd folder")
        .count()
}

/// What a new client gets for its OPEN: the server's OPEN, or the CLOSE that follows it when the
/// connection is refused (CONN-15).
fn open_answer(port: u16) -> Option<Performative> {
    let mut c = common::connect_bare(port);
    c.write(&connector::engine::HEADER_AMQP);
    c.write(&peer::frame(0, &peer::open("late"), &[]));
    let mut got = read_until(&mut c, Duration::from_secs(5), |g| {
        g.iter().any(|p| matches!(p, Performative::Open(_)))
    });
    // A refusal's CLOSE is written right behind the OPEN.
    got.extend(read_until(&mut c, Duration::from_millis(300), |_| false));
    let mut answers = got
        .into_iter()
        .filter(|p| matches!(p, Performative::Open(_) | Performative::Close(_)));
    let open = answers.next();
    answers.next().or(open)
}

/// Sockets that connect and say nothing hold no connection slot: a client that opens is served
/// among them, the handshake pool keeps at most 256 of them (the oldest are dropped to make room),
/// so the process's descriptors stay bounded, and each is closed by the handshake timeout.
#[test]
fn silent_sockets_hold_no_slot_and_the_oldest_are_dropped() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let mut server = start_connector(
        dir.path(),
        port,
        &["--max-connections", "4", "--handshake-timeout-seconds", "2"],
    );
    let pid = server.id();
    let before = open_descriptors(pid);
    let connect = || std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut silent: Vec<std::net::TcpStream> = (0..300).map(|_| connect()).collect();
    let answer = open_answer(port);
    assert!(
        matches!(answer, Some(Performative::Open(_))),
        "a client is refused among silent sockets: {answer:?}"
    );
    std::thread::sleep(Duration::from_millis(300));
    let held = open_descriptors(pid).saturating_sub(before);
    assert!(
        held <= 256 + 4,
        "{held} descriptors held for 300 silent sockets"
    );
    // All are closed by the server: the oldest to make room, the rest at the timeout.
    let started = Instant::now();
    let mut closed = 0;
    for s in &mut silent {
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut b = [0u8; 1];
        if matches!(std::io::Read::read(s, &mut b), Ok(0) | Err(_)) {
            closed += 1;
        }
    }
    assert_eq!(closed, 300, "every silent socket is closed by the server");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed only after {:?}",
        started.elapsed()
    );
    let _ = server.kill();
    let _ = server.wait();
}

/// The HS256 key of the authenticated connectors here.
const JWT_KEY: &str = "hostile-clients-hs256-key-for-tests";

/// A KubeMQ token for `client_id`, valid for `seconds` from now.
fn token(client_id: &str, seconds: u64) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + seconds;
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &serde_json::json!({"ClientID": client_id, "exp": exp}),
        &jsonwebtoken::EncodingKey::from_secret(JWT_KEY.as_bytes()),
    )
    .expect("token");
    testkit::logs::used_secret(&token);
    token
}

/// A connector on `port` that authenticates with [`JWT_KEY`], its extra `args` after.
fn start_authenticated(dir: &std::path::Path, port: u16, args: &[&str]) -> std::process::Child {
    testkit::logs::used_secret(JWT_KEY);
    let key = dir.join("jwt.key");
    std::fs::write(&key, JWT_KEY).expect("key file");
    let key = key.display().to_string();
    let mut all = vec![
        "--authentication",
        "true",
        "--jwt-signature-type",
        "HS256",
        "--jwt-key-file",
        &key,
        "--authorize-every-client",
        "true",
    ];
    all.extend_from_slice(args);
    start_connector(dir, port, &all)
}

/// A connection to the connector on `port` from another loopback address (127.0.0.2): a client
/// on another host, as far as the connector can tell.
fn elsewhere(port: u16) -> RawPeer {
    RawPeer::connect_from(
        std::net::Ipv4Addr::new(127, 0, 0, 2).into(),
        (std::net::Ipv4Addr::LOCALHOST, port).into(),
    )
}

/// A client that authenticates with SASL PLAIN and `token` and sends its OPEN, all at once;
/// the connection and the answer to its OPEN (the server's OPEN, or the CLOSE that refuses it).
fn authenticated_open(port: u16, token: &str) -> (RawPeer, Option<Performative>) {
    authenticated_open_from(common::connect_bare(port), token)
}

/// [`authenticated_open`] on the connection `c`.
fn authenticated_open_from(mut c: RawPeer, token: &str) -> (RawPeer, Option<Performative>) {
    c.write(&connector::engine::HEADER_SASL);
    let mut response = b"\0user\0".to_vec();
    response.extend_from_slice(token.as_bytes());
    c.write(&peer::sasl_frame(&fe2o3_amqp_types::sasl::SaslInit {
        mechanism: "PLAIN".into(),
        initial_response: Some(ByteBuf::from(response)),
        hostname: None,
    }));
    c.write(&connector::engine::HEADER_AMQP);
    c.write(&peer::frame(0, &peer::open("authenticated"), &[]));
    let mut got = read_until(&mut c, Duration::from_secs(5), |g| {
        g.iter().any(|p| matches!(p, Performative::Open(_)))
    });
    got.extend(read_until(&mut c, Duration::from_millis(300), |_| false));
    let mut answers = got
        .into_iter()
        .filter(|p| matches!(p, Performative::Open(_) | Performative::Close(_)));
    let open = answers.next();
    let answer = answers.next().or(open);
    (c, answer)
}

/// 1,100 sockets from one address that send only the SASL protocol header and are opened again
/// whenever they are dropped never take the slot of a client that authenticates from another
/// address, nor its place among the handshakes: with MaxConnections 4, four authenticated
/// clients are admitted among them, and a fifth is refused for the limit, not for the sockets.
#[test]
fn header_only_sockets_never_take_an_authenticated_clients_slot() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let mut server = start_authenticated(dir.path(), port, &["--max-connections", "4"]);
    let stop = Arc::new(AtomicBool::new(false));
    let reconnects = Arc::new(AtomicU64::new(0));
    let hostile = {
        let (stop, reconnects) = (stop.clone(), reconnects.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let mut tasks = Vec::new();
                for _ in 0..1100 {
                    let (stop, reconnects) = (stop.clone(), reconnects.clone());
                    tasks.push(tokio::spawn(async move {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        while !stop.load(Ordering::Relaxed) {
                            let Ok(mut s) =
                                tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                            else {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                continue;
                            };
                            let _ = s.write_all(&connector::engine::HEADER_SASL).await;
                            // Whatever the server says, until it drops the socket.
                            let mut sink = [0u8; 256];
                            while !stop.load(Ordering::Relaxed) {
                                let read = tokio::time::timeout(
                                    Duration::from_millis(500),
                                    s.read(&mut sink),
                                );
                                if let Ok(Ok(0) | Err(_)) = read.await {
                                    break;
                                }
                            }
                            reconnects.fetch_add(1, Ordering::Relaxed);
                        }
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
            });
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    let mut admitted = Vec::new();
    for i in 0..4 {
        let (c, answer) =
            authenticated_open_from(elsewhere(port), &token(&format!("client-{i}"), 60));
        assert!(
            matches!(answer, Some(Performative::Open(_))),
            "authenticated client {i} among header-only sockets: {answer:?}"
        );
        admitted.push(c);
    }
    let (_, answer) = authenticated_open_from(elsewhere(port), &token("client-5", 60));
    match answer {
        Some(Performative::Close(c)) => assert_eq!(
            c.error.as_ref().map(peer::error_symbol).as_deref(),
            Some("amqp:resource-limit-exceeded")
        ),
        other => panic!("a fifth client past MaxConnections 4: {other:?}"),
    }
    stop.store(true, Ordering::Relaxed);
    let _ = hostile.join();
    assert!(
        reconnects.load(Ordering::Relaxed) > 0,
        "the header-only sockets were dropped and came back"
    );
    drop(admitted);
    let _ = server.kill();
    let _ = server.wait();
}

/// SASL-13: a connection authenticated with a token that expires 3 s later is closed then with
/// `amqp:unauthorized-access`, whatever it is doing; one whose token lasts stays open.
#[test]
fn sasl_13_an_expiring_token_closes_the_connection() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let mut server = start_authenticated(dir.path(), port, &[]);
    let (mut short, answer) = authenticated_open(port, &token("short-lived", 3));
    assert!(matches!(answer, Some(Performative::Open(_))), "{answer:?}");
    let (mut long, answer) = authenticated_open(port, &token("long-lived", 600));
    assert!(matches!(answer, Some(Performative::Open(_))), "{answer:?}");
    short.write(&peer::frame(0, &peer::begin(), &[]));
    let started = Instant::now();
    let got = read_until(&mut short, Duration::from_secs(8), |g| {
        g.iter().any(|p| matches!(p, Performative::Close(_)))
    });
    let close = got.iter().find_map(|p| match p {
        Performative::Close(c) => Some(c),
        _ => None,
    });
    let close = close.unwrap_or_else(|| panic!("not closed after the token expired: {got:?}"));
    assert_eq!(
        close.error.as_ref().map(peer::error_symbol).as_deref(),
        Some("amqp:unauthorized-access")
    );
    assert!(
        started.elapsed() > Duration::from_secs(1),
        "closed before the token expired"
    );
    long.write(&peer::frame(0, &peer::begin(), &[]));
    let got = read_until(&mut long, Duration::from_secs(1), |g| {
        g.iter().any(|p| matches!(p, Performative::Begin(_)))
    });
    assert!(
        got.iter().any(|p| matches!(p, Performative::Begin(_))),
        "the other connection stays open: {got:?}"
    );
    let _ = server.kill();
    let _ = server.wait();
}

/// DETACHes and ENDs with `amqp:resource-limit-exceeded` among `got`.
fn count_refusals(got: &[Performative]) -> usize {
    got.iter()
        .filter(|p| {
            let error = match p {
                Performative::Detach(d) => d.error.as_ref(),
                Performative::End(e) => e.error.as_ref(),
                _ => None,
            };
            error.map(peer::error_symbol).as_deref() == Some("amqp:resource-limit-exceeded")
        })
        .count()
}

/// Refused sessions and links hold nothing: BEGINs past SessionMax and ATTACHes with 100 KB
/// names past MaxLinksPerSession, hundreds of each, leave the process's memory where it was, and
/// each gets its refusal.
#[test]
fn refused_sessions_and_links_hold_no_memory() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let mut server = start_connector(
        dir.path(),
        port,
        &["--session-max", "2", "--max-links-per-session", "2"],
    );
    let pid = server.id();
    let mut c = common::connect(port);
    attach_sender(&mut c, "live-0", 0, "queues/refused");
    attach_sender(&mut c, "live-1", 1, "queues/refused");
    let baseline = settled_rss(pid);
    let watch = RssWatch::start(pid);
    let name = "n".repeat(100_000);
    // Each ATTACH is refused at once and its handle freed by the DETACH behind it, 50 pairs to
    // a write.
    let mut refusals = 0;
    for batch in 0..10u32 {
        let mut bytes = Vec::new();
        for n in batch * 50..batch * 50 + 50 {
            let handle = 2 + n % 2;
            let attach = peer::attach_sender(&format!("{name}{n}"), handle, "queues/refused");
            bytes.extend(peer::frame(0, &attach, &[]));
            bytes.extend(peer::frame(0, &peer::detach(handle), &[]));
        }
        c.write(&bytes);
        let want = (batch as usize + 1) * 50;
        let got = read_until(&mut c, Duration::from_secs(10), |g| {
            refusals + count_refusals(g) >= want
        });
        refusals += count_refusals(&got);
    }
    assert_eq!(refusals, 500, "every ATTACH past the cap is refused");
    // BEGINs on channels above channel-max (1): each answered BEGIN + END, nothing kept.
    let mut bytes = Vec::new();
    for ch in 2..502u16 {
        bytes.extend(peer::frame(ch, &peer::begin(), &[]));
    }
    c.write(&bytes);
    let got = read_until(&mut c, Duration::from_secs(10), |g| {
        count_refusals(g) >= 500
    });
    assert_eq!(
        count_refusals(&got),
        500,
        "every BEGIN past SessionMax is refused"
    );
    let growth = watch.peak().saturating_sub(baseline);
    drop(watch);
    eprintln!(
        "resident memory grew by {} MiB for refused links and sessions",
        growth / MIB
    );
    assert!(
        growth < 16 * MIB,
        "resident memory grew by {} MiB for 50 MB of refused names",
        growth / MIB
    );
    // The live links still work.
    assert_eq!(produce_small(&mut c, 0, 0, 3, "after"), 3);
    let _ = server.kill();
    let _ = server.wait();
}

/// Consumer links on ever new queue names, as many as a client may open, in rounds on new
/// connections: each live link reserves its state in the process budget, so past it the
/// ATTACHes are refused with `amqp:resource-limit-exceeded` (`connector memory budget`), the
/// process's memory stays within 1.25 × the budget + 64 MiB, and links closed with their
/// connection give their places to the next round.
#[test]
fn links_on_new_queue_names_stay_within_the_process_budget() {
    let _serial = one_at_a_time();
    const BUDGET: u64 = 32 * MIB;
    const SESSIONS: u16 = 16;
    const LINKS: u32 = 256;
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let mut server = start_connector(
        dir.path(),
        port,
        &["--max-process-memory", &BUDGET.to_string()],
    );
    let pid = server.id();
    let baseline = settled_rss(pid);
    let watch = RssWatch::start(pid);
    for round in 0..3 {
        let mut c = common::connect(port);
        let mut begins = Vec::new();
        for ch in 1..SESSIONS {
            begins.extend(peer::frame(ch, &peer::begin(), &[]));
        }
        c.write(&begins);
        let got = read_until(&mut c, Duration::from_secs(10), |g| {
            g.iter()
                .filter(|p| matches!(p, Performative::Begin(_)))
                .count()
                >= usize::from(SESSIONS)
        });
        assert!(
            got.iter()
                .all(|p| matches!(p, Performative::Begin(_) | Performative::Open(_))),
            "{got:?}"
        );
        let (mut accepted, mut refused) = (0, 0);
        for ch in 0..SESSIONS {
            let mut bytes = Vec::new();
            for handle in 0..LINKS {
                let address = format!("queues/names-{round}-{ch}-{handle}");
                let name = format!("rx-{ch}-{handle}");
                bytes.extend(peer::frame(
                    ch,
                    &peer::attach_receiver(&name, handle, &address),
                    &[],
                ));
                bytes.extend(peer::frame(ch, &peer::link_flow(handle, 0, 1, false), &[]));
            }
            c.write(&bytes);
            let got = read_until(&mut c, Duration::from_secs(20), |g| {
                g.iter()
                    .filter(|p| matches!(p, Performative::Attach(_)))
                    .count()
                    >= LINKS as usize
            });
            for p in &got {
                match p {
                    Performative::Attach(_) => accepted += 1,
                    Performative::Detach(d) => {
                        let e = d.error.as_ref().expect("a refusal says why");
                        assert_eq!(peer::error_symbol(e), "amqp:resource-limit-exceeded");
                        assert_eq!(
                            e.description.as_deref(),
                            Some(
                                format!("connector memory budget of {BUDGET} bytes exceeded")
                                    .as_str()
                            )
                        );
                        refused += 1;
                    }
                    _ => {}
                }
            }
        }
        // Every ATTACH is answered; those refused are answered ATTACH then DETACH.
        accepted -= refused;
        let places = BUDGET / connector::config::LINK_STATE_BYTES;
        eprintln!("round {round}: {accepted} links live, {refused} refused");
        assert!(
            refused > 0 && accepted as u64 <= places && accepted as u64 >= places / 2,
            "round {round}: {accepted} live, {refused} refused, {places} places"
        );
        drop(c);
        std::thread::sleep(Duration::from_secs(1));
    }
    let peak = watch.peak();
    drop(watch);
    let growth = peak.saturating_sub(baseline);
    eprintln!(
        "resident memory: baseline {} MiB, peak {} MiB",
        baseline / MIB,
        peak / MIB
    );
    assert!(
        peak <= BUDGET + BUDGET / 4 + 64 * MIB,
        "resident memory peaked at {} MiB (grew by {} MiB) with a {} MiB budget",
        peak / MIB,
        growth / MIB,
        BUDGET / MIB
    );
    let _ = server.kill();
    let _ = server.wait();
}

/// A request message: `body` to the requester's node `reply_to`, answerable for 20 s.
fn request_message(reply_to: &str, body: &[u8]) -> Vec<u8> {
    use fe2o3_amqp_types::messaging::{Header, Properties};
    let header = Header {
        ttl: Some(20_000),
        ..Default::default()
    };
    let properties = Properties {
        reply_to: Some(reply_to.into()),
        ..Default::default()
    };
    let mut m = serde_amqp::to_vec(&header).expect("encode");
    m.extend(serde_amqp::to_vec(&properties).expect("encode"));
    m.extend(data(body));
    m
}

/// Six requesters try to send 1 MiB queries, 64 each, to a responder that has given credit for
/// all of them and never reads: each request counts against its requester's budget until it is
/// answered or times out, so past the process budget the requesters get no more credit (or a
/// request is rejected with `amqp:resource-limit-exceeded`); the responder is sent only what its
/// transport takes; the process's resident memory stays within 1.25 × the process budget +
/// 64 MiB; and a well-behaved producer on the same connector has every message accepted
/// throughout.
#[test]
fn queries_to_a_responder_that_never_reads_stay_within_the_budgets() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let budget = 128 * MIB;
    let mut server = start_connector(
        dir.path(),
        port,
        &[
            "--max-message-size",
            &(4 * MIB).to_string(),
            "--max-connection-memory",
            &(64 * MIB).to_string(),
            "--max-process-memory",
            &budget.to_string(),
        ],
    );
    let pid = server.id();
    let mut polite = common::connect(port);
    attach_sender(&mut polite, "polite", 0, "queues/polite");
    assert_eq!(produce_small(&mut polite, 0, 0, 1, "warm"), 1);
    let baseline = settled_rss(pid);
    let watch = RssWatch::start(pid);

    // The responder: credit for every request, then silence.
    let mut responder = common::connect(port);
    responder.write(&peer::frame(
        0,
        &peer::attach_receiver("responder", 0, "queries/siege"),
        &[],
    ));
    let got = read_until(&mut responder, Duration::from_secs(5), |g| {
        g.iter().any(|p| matches!(p, Performative::Attach(_)))
    });
    assert!(
        got.iter().any(|p| matches!(p, Performative::Attach(_))),
        "{got:?}"
    );
    responder.write(&peer::frame(0, &peer::link_flow(0, 0, 1000, false), &[]));

    let requesters: Vec<_> = (0..6)
        .map(|n| {
            std::thread::spawn(move || {
                let mut c = common::connect(port);
                let mut node = peer::attach_receiver("replies", 0, "");
                if let Some(s) = node.source.as_mut() {
                    s.address = None;
                    s.dynamic = true;
                }
                c.write(&peer::frame(0, &node, &[]));
                let got = read_until(&mut c, Duration::from_secs(5), |g| {
                    g.iter().any(|p| matches!(p, Performative::Attach(_)))
                });
                let reply_to = got
                    .iter()
                    .find_map(|p| match p {
                        Performative::Attach(connector::engine::codec::AttachFrame::Full(a)) => a
                            .source
                            .as_ref()
                            .and_then(|s| s.address.clone()),
                        _ => None,
                    })
                    .expect("a dynamic node's address");
                c.write(&peer::frame(
                    0,
                    &peer::attach_sender("requests", 1, "queries/siege"),
                    &[],
                ));
                // What the server's FLOWs allow: deliveries up to (not including) this count.
                let mut limit = 0u32;
                let note = |got: &[Performative], limit: &mut u32| {
                    for p in got {
                        if let Performative::Flow(f) = p {
                            if f.handle.as_ref().map(|h| h.0) == Some(1) {
                                *limit = f.delivery_count.unwrap_or(0)
                                    + f.link_credit.unwrap_or(0);
                            }
                        }
                    }
                };
                let body = vec![n as u8; MIB as usize];
                let (mut accepted, mut refused) = (0u32, 0u32);
                for id in 0..64u32 {
                    // Sent only within credit; credit that does not come within 3 s means the
                    // connector holds this requester back.
                    let got = read_until(&mut c, Duration::from_secs(3), |g| {
                        let mut l = limit;
                        note(g, &mut l);
                        l > id
                    });
                    note(&got, &mut limit);
                    if limit <= id {
                        break;
                    }
                    let message = request_message(&reply_to, &body);
                    let chunks: Vec<&[u8]> = message.chunks(64 * 1024).collect();
                    for (i, chunk) in chunks.iter().enumerate() {
                        let more = i + 1 < chunks.len();
                        let t = if i == 0 {
                            peer::transfer(1, Some(id), Some(&id.to_be_bytes()), false, more)
                        } else {
                            peer::transfer(1, None, None, false, more)
                        };
                        c.write(&peer::frame(0, &t, chunk));
                    }
                    let got = read_until(&mut c, Duration::from_secs(10), |g| {
                        g.iter().any(|p| {
                            matches!(p, Performative::Disposition(d) if d.first <= id && id <= d.last)
                        })
                    });
                    note(&got, &mut limit);
                    let outcome = got.iter().find_map(|p| match p {
                        Performative::Disposition(d) => d.state.clone(),
                        _ => None,
                    });
                    match outcome {
                        Some(DeliveryOutcome::Accepted) => accepted += 1,
                        Some(DeliveryOutcome::Rejected(Some(e))) => {
                            // The link is detached with it: this requester is done.
                            assert_eq!(peer::error_symbol(&e), "amqp:resource-limit-exceeded");
                            refused += 1;
                            break;
                        }
                        other => panic!("request {id}: {other:?}"),
                    }
                }
                (accepted, refused, c)
            })
        })
        .collect();
    let polite_accepted = produce_small(&mut polite, 0, 1, 50, "polite");
    let mut totals = (0, 0);
    let mut requester_connections = Vec::new();
    for r in requesters {
        let (accepted, refused, c) = r.join().expect("requester");
        totals = (totals.0 + accepted, totals.1 + refused);
        requester_connections.push(c);
    }
    let growth = watch.peak().saturating_sub(baseline);
    drop(watch);
    eprintln!(
        "requests accepted {}, refused {}; resident memory grew by {} MiB",
        totals.0,
        totals.1,
        growth / MIB
    );
    assert_eq!(polite_accepted, 50, "the polite producer was refused");
    assert!(
        u64::from(totals.0) * MIB <= budget + 6 * MIB,
        "more requests were taken than the budget holds: {totals:?}"
    );
    assert!(
        u64::from(totals.0) * MIB >= budget / 2,
        "requesters were held back long before the budget: {totals:?}"
    );
    assert!(
        growth <= budget * 5 / 4 + 64 * MIB,
        "resident memory grew by {} MiB",
        growth / MIB
    );
    drop(responder);
    let _ = server.kill();
    let _ = server.wait();
}

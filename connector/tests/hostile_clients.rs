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
use connector::engine::codec::{DeliveryOutcome, Performative};
use connector::engine::peer;
use fe2o3_amqp_types::definitions::{Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{Accepted, Data, DeliveryState};
use fe2o3_amqp_types::performatives::{Disposition, Flow};
use serde_bytes::ByteBuf;
use testkit::raw::RawPeer;

const MIB: u64 = 1024 * 1024;

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

/// Messages that never end, four links at a time on each of six connections, sent again on new
/// links after every refusal: they are cut at the connection or the process budget with
/// `amqp:resource-limit-exceeded` (long before MaxMessageSize or a whole 100 MiB), the
/// process's memory stays within the process budget (plus its baseline and the allocator's
/// transient copies), and a well-behaved producer on the same connector has every message
/// accepted and stored throughout.
#[test]
fn endless_messages_stay_within_the_memory_budgets() {
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let mut server = start_connector(
        dir.path(),
        port,
        &[
            "--max-message-size",
            &(8 * MIB).to_string(),
            "--max-connection-memory",
            &(16 * MIB).to_string(),
            "--max-process-memory",
            &(32 * MIB).to_string(),
        ],
    );
    let pid = server.id();
    // Warm up: one ordinary exchange, so the baseline includes the store and the runtime.
    let mut polite = common::connect(port);
    attach_sender(&mut polite, "polite", 0, "queues/polite");
    assert_eq!(produce_small(&mut polite, 0, 0, 1, "warm"), 1);
    let baseline = settled_rss(pid);
    let watch = RssWatch::start(pid);

    let abusers: Vec<_> = (0..6)
        .map(|n| {
            std::thread::spawn(move || {
                let mut c = common::connect(port);
                let chunk = vec![n as u8; 64 * 1024];
                let mut conditions = Vec::new();
                for round in 0..3u32 {
                    // Four links, each with a delivery that never ends, fed in turn: together
                    // they pass the connection budget before any passes MaxMessageSize.
                    let handles: Vec<u32> = (4 * round..4 * round + 4).collect();
                    for &h in &handles {
                        attach_sender(&mut c, &format!("abuse-{h}"), h, "queues/abuse");
                        c.write(&peer::frame(
                            0,
                            &peer::transfer(h, Some(h), Some(b"t"), false, true),
                            &chunk,
                        ));
                    }
                    let mut sent = 4 * 64 * 1024;
                    let mut condition = None;
                    'abuse: while condition.is_none() && sent < 100 * MIB {
                        for &h in &handles {
                            if !c.try_write(&peer::frame(
                                0,
                                &peer::transfer(h, None, None, false, true),
                                &chunk,
                            )) {
                                break 'abuse;
                            }
                            sent += 64 * 1024;
                        }
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
                    // Free the handles for the next round (and answer the server's DETACH).
                    for &h in &handles {
                        c.write(&peer::frame(0, &peer::detach(h), &[]));
                    }
                    read_until(&mut c, Duration::from_millis(300), |_| false);
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
    // 32 MiB of budget, 6 × 256 KiB of guaranteed shares, and room for the reassembly buffers
    // being copied into their doubled successors.
    assert!(
        growth < 64 * MIB,
        "resident memory grew by {} MiB",
        growth / MIB
    );
    let stored = consume_all(port, "polite");
    assert_eq!(stored.len(), 201, "every accepted message is on the queue");
    let _ = server.kill();
    let _ = server.wait();
}

/// A consumer asking for pre-settled deliveries with plenty of credit and a session window of 0
/// gets next to nothing taken off the queue for it (a few messages past the window, never the
/// queue): the process's memory does not grow with the queue, a connection that ends with the
/// window shut loses at most those few, and a consumer whose window opens later receives every
/// other message, once.
#[test]
fn a_presettled_consumer_with_a_shut_window_takes_only_what_it_can_carry() {
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
    // The connection ends with the window still shut: what it took off the queue is lost
    // (at-most-once), and that must be no more than the few messages past the window.
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
    assert!(
        ids.len() + 4 >= QUEUED as usize,
        "{} of {QUEUED} messages left after a consumer that could carry none",
        ids.len()
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

/// Sockets that connect and say nothing: with CountConnectionsAfterHeader they hold no
/// connection slot (a client that sends its header is served while they wait), at most 4 ×
/// MaxConnections (64 here) are kept waiting and the rest are dropped at once, so the process's
/// descriptors stay bounded; each is closed at the handshake timeout.
#[test]
fn silent_sockets_hold_no_slot_and_are_dropped_at_the_handshake_timeout() {
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let mut server = start_connector(
        dir.path(),
        port,
        &[
            "--max-connections",
            "4",
            "--handshake-timeout-seconds",
            "2",
            "--count-connections-after-header",
            "true",
        ],
    );
    let pid = server.id();
    let before = open_descriptors(pid);
    let connect = || std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut silent: Vec<std::net::TcpStream> = (0..40).map(|_| connect()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let answer = open_answer(port);
    assert!(
        matches!(answer, Some(Performative::Open(_))),
        "a client with a header is refused while silent sockets wait: {answer:?}"
    );
    silent.extend((0..60).map(|_| connect()));
    std::thread::sleep(Duration::from_millis(300));
    let held = open_descriptors(pid).saturating_sub(before);
    assert!(
        held <= 64 + 2,
        "{held} descriptors held for 100 silent sockets"
    );
    // All are closed by the server: the extras at once, the waiting ones at the timeout.
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
    assert_eq!(closed, 100, "every silent socket is closed by the server");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed only after {:?}",
        started.elapsed()
    );
    let _ = server.kill();
    let _ = server.wait();
}

/// Counted from accept (the default), silent sockets do take the slots, but only until the
/// handshake timeout: a client refused while they wait is admitted once they are dropped.
#[test]
fn silent_sockets_counted_from_accept_free_their_slots_at_the_timeout() {
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let mut server = start_connector(
        dir.path(),
        port,
        &["--max-connections", "4", "--handshake-timeout-seconds", "1"],
    );
    // The slot of start_connector's own probe connection must be free again first.
    std::thread::sleep(Duration::from_millis(200));
    let silent: Vec<std::net::TcpStream> = (0..4)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    match open_answer(port) {
        Some(Performative::Close(c)) => assert_eq!(
            c.error.as_ref().map(peer::error_symbol).as_deref(),
            Some("amqp:resource-limit-exceeded")
        ),
        other => panic!("admitted past MaxConnections: {other:?}"),
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        matches!(open_answer(port), Some(Performative::Open(_))),
        "still locked out after the handshake timeout"
    );
    drop(silent);
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

//! Crash tests of the embedded store with real processes, real files and SIGKILL: every send
//! that was confirmed survives, nothing unsent appears, sequences stay strictly increasing, and
//! messages locked by a Get of the dead process are available again with their sequence
//! (KMQ-16: the embedded store confirms a send only once it is on disk).

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use connector::store::{Seq, Store};

fn probe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_store-crash-probe"))
}

fn rt() -> tokio::runtime::Runtime {
    interop_tests::runtime()
}

/// Drains the queue, returning (message ids, sequences) in delivery order.
fn drain(dir: &std::path::Path) -> (Vec<String>, Vec<Seq>) {
    rt().block_on(async {
        let (store, _) = Store::open(dir).unwrap();
        let mut ids = Vec::new();
        let mut seqs = Vec::new();
        loop {
            // Ask for exactly what is ready, so the Get returns at once instead of waiting.
            let ready = store.ready_count("crash");
            if ready == 0 {
                break;
            }
            let got = store.get("crash", ready, Duration::from_millis(1000)).await;
            for d in &got {
                ids.push(d.message.message_id.clone());
                seqs.push(d.sequence);
            }
            store.ack("crash", &got.iter().map(|d| d.sequence).collect::<Vec<_>>());
        }
        store.close();
        (ids, seqs)
    })
}

#[test]
fn sigkill_during_sends_loses_nothing_confirmed() {
    for round in 0..20u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut child = probe()
            .args(["send", dir.path().to_str().unwrap()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| l.strip_prefix("OK ").map(String::from))
                .collect::<Vec<String>>()
        });
        // A different moment each round, from right after start-up to well into the run.
        std::thread::sleep(Duration::from_millis(30 + round * 23 % 400));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let confirmed: Vec<String> = reader.join().unwrap();
        let (ids, seqs) = drain(dir.path());
        let found: HashSet<&String> = ids.iter().collect();
        for id in &confirmed {
            assert!(
                found.contains(id),
                "round {round}: confirmed {id} lost ({} confirmed, {} found)",
                confirmed.len(),
                ids.len()
            );
        }
        for id in &ids {
            assert!(
                id.starts_with("m-"),
                "round {round}: garbage message {id:?}"
            );
        }
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "round {round}: sequences not strictly increasing"
        );
        assert_eq!(
            found.len(),
            ids.len(),
            "round {round}: a message appeared twice"
        );
        // The store keeps working after recovery: new sequences continue past the old ones.
        rt().block_on(async {
            let (store, _) = Store::open(dir.path()).unwrap();
            let r = store
                .send(vec![connector::kubemq::QueueMessage {
                    client_id: "t".into(),
                    channel: "crash".into(),
                    body: b"after".to_vec().into(),
                    ..Default::default()
                }])
                .await;
            assert!(!r[0].is_error);
            let got = store.get("crash", 1, Duration::from_millis(1000)).await;
            assert!(
                got[0].sequence > seqs.last().copied().unwrap_or(Seq::NONE),
                "round {round}: sequence reused"
            );
            store.close();
        });
    }
}

#[test]
fn sigkill_with_locked_messages_returns_them() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let (store, _) = Store::open(dir.path()).unwrap();
        let msgs = (0..5)
            .map(|i| connector::kubemq::QueueMessage {
                message_id: format!("m-{i}"),
                client_id: "t".into(),
                channel: "crash".into(),
                body: b"x".to_vec().into(),
                ..Default::default()
            })
            .collect();
        store.send(msgs).await;
        store.close();
    });
    let mut child = probe()
        .args(["hold", dir.path().to_str().unwrap(), "3"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut held = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        if line == "READY" {
            break;
        }
        held.push(line.trim_start_matches("HELD ").parse::<u64>().unwrap());
    }
    assert_eq!(held, [1, 2, 3]);
    child.kill().unwrap();
    child.wait().unwrap();
    let (ids, seqs) = drain(dir.path());
    assert_eq!(
        seqs.iter().map(|s| s.get()).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5],
        "locked messages are back at once, same sequences, in order"
    );
    assert_eq!(ids.len(), 5);
}

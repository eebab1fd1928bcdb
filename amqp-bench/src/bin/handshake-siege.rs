//! handshake-siege: sockets that send only an AMQP protocol header, and how a real client fares
//! among them. HOSTILE sockets each send the 8-byte header (the SASL one when a token is given,
//! else the bare AMQP one) and nothing more, and are opened again as soon as the server drops
//! them; once they are in place, a client opens PROBES connections one after another (SASL PLAIN
//! with TOKEN as the password when given, then OPEN, all written at once) and the time to the
//! server's OPEN is reported as percentiles, with the refusals and the connections that got no
//! answer.
//!
//! Usage: `handshake-siege ADDR HOSTILE PROBES [TOKEN]`. With `SIEGE_PROBE_FROM` set to a local
//! address (on loopback, e.g. 127.0.0.2), the client connects from there: a client on another
//! host than the hostile sockets, as the server sees it.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use connector::engine::codec::{decode_performative, Performative};
use connector::engine::frame::{split_frame, TYPE_AMQP};
use connector::engine::{peer, HEADER_AMQP, HEADER_SASL};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// One hostile socket: the header, then silence until dropped; again and again.
async fn hostile(addr: SocketAddr, header: [u8; 8], reopened: Arc<AtomicU64>) {
    loop {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if s.write_all(&header).await.is_ok() {
            let mut sink = [0u8; 512];
            while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
        }
        reopened.fetch_add(1, Ordering::Relaxed);
    }
}

/// How one probe ended.
enum Probe {
    Opened(Duration),
    Refused(String),
    Unanswered,
}

/// The bytes a client writes to open: headers, SASL PLAIN with `token` if any, OPEN.
fn opening(token: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(token) = token {
        out.extend_from_slice(&HEADER_SASL);
        let mut response = b"\0siege\0".to_vec();
        response.extend_from_slice(token.as_bytes());
        out.extend(peer::sasl_frame(&fe2o3_amqp::types::sasl::SaslInit {
            mechanism: "PLAIN".into(),
            initial_response: Some(response.into()),
            hostname: None,
        }));
    }
    out.extend_from_slice(&HEADER_AMQP);
    out.extend(peer::frame(0, &peer::open("handshake-siege"), &[]));
    out
}

/// A connection to `addr`, from `from` when given.
async fn connect(addr: SocketAddr, from: Option<IpAddr>) -> std::io::Result<TcpStream> {
    let Some(from) = from else {
        return TcpStream::connect(addr).await;
    };
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(addr).await
}

/// One client: opens, waits for the server's OPEN and whatever CLOSE follows it.
async fn probe(addr: SocketAddr, from: Option<IpAddr>, bytes: &[u8]) -> Probe {
    let started = Instant::now();
    let Ok(mut s) = connect(addr, from).await else {
        return Probe::Unanswered;
    };
    if s.write_all(bytes).await.is_err() {
        return Probe::Unanswered;
    }
    let mut buf = BytesMut::new();
    let mut opened = None;
    loop {
        let wait = if opened.is_some() {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(10)
        };
        match tokio::time::timeout(wait, s.read_buf(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => break,
        }
        // Headers and SASL frames are skipped; AMQP frames decoded.
        loop {
            if buf.len() >= 8 && &buf[..4] == b"AMQP" {
                let _ = buf.split_to(8);
                continue;
            }
            match split_frame(&mut buf, u32::MAX) {
                Ok(Some(f)) if f.frame_type == TYPE_AMQP && !f.body.is_empty() => {
                    match decode_performative(&f.body) {
                        Ok(Performative::Open(_)) => opened = Some(started.elapsed()),
                        Ok(Performative::Close(c)) => {
                            return Probe::Refused(
                                c.error.as_ref().map(peer::error_symbol).unwrap_or_default(),
                            )
                        }
                        _ => {}
                    }
                }
                Ok(Some(_)) => {}
                _ => break,
            }
        }
    }
    opened.map_or(Probe::Unanswered, Probe::Opened)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (addr, n, probes, token) = match &args[..] {
        [addr, n, probes, rest @ ..] if rest.len() <= 1 => (
            addr.parse::<SocketAddr>(),
            n.parse::<usize>(),
            probes.parse::<usize>(),
            rest.first().cloned(),
        ),
        _ => {
            eprintln!("usage: handshake-siege ADDR HOSTILE PROBES [TOKEN]");
            std::process::exit(2);
        }
    };
    let (Ok(addr), Ok(n), Ok(probes)) = (addr, n, probes) else {
        eprintln!("usage: handshake-siege ADDR HOSTILE PROBES [TOKEN]");
        std::process::exit(2);
    };
    let header = if token.is_some() {
        HEADER_SASL
    } else {
        HEADER_AMQP
    };
    let reopened = Arc::new(AtomicU64::new(0));
    for _ in 0..n {
        tokio::spawn(hostile(addr, header, reopened.clone()));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let from = std::env::var("SIEGE_PROBE_FROM")
        .ok()
        .and_then(|a| a.parse::<IpAddr>().ok());
    let bytes = opening(token.as_deref());
    let (mut took, mut refused, mut unanswered) = (Vec::new(), Vec::new(), 0);
    for _ in 0..probes {
        match probe(addr, from, &bytes).await {
            Probe::Opened(d) => took.push(d),
            Probe::Refused(why) => refused.push(why),
            Probe::Unanswered => unanswered += 1,
        }
    }
    took.sort();
    let at = |q: f64| {
        let i = ((took.len() as f64 - 1.0) * q).round() as usize;
        took.get(i)
            .map(|d| format!("{:.1} ms", d.as_secs_f64() * 1e3))
            .unwrap_or_else(|| "-".into())
    };
    println!(
        "{n} header-only sockets, {probes} {} clients{}: {} opened (p50 {} p99 {} max {}), {} refused {:?}, {unanswered} unanswered; hostile sockets reopened {} times",
        if token.is_some() { "authenticated" } else { "plain" },
        from.map(|a| format!(" from {a}")).unwrap_or_default(),
        took.len(),
        at(0.5),
        at(0.99),
        at(1.0),
        refused.len(),
        refused.first(),
        reopened.load(Ordering::Relaxed)
    );
}

//! A lean AMQP 1.0 client for the load (`--client lean`), written on the connector's own client
//! half of the wire (`engine::peer`, `frame`, `codec`): one connection, session and link per
//! producer or consumer, driven by one task that writes each burst of frames at once.
//!
//! Why it exists: the overhead comparison sets the load through the connector against
//! the same load sent by a lean Rust gRPC client, on the same two cores. fe2o3-amqp, the default
//! client, spends about twice that client's CPU per message, so part of what the comparison
//! charged to the connector was the AMQP client's own cost. This client does what the fe2o3 mode
//! does on the wire (unsettled or pre-settled TRANSFERs, a credit window, ranged accepts), and
//! nothing else: no reconnects, no transactions, a single-section Data body.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use connector::engine::codec::{
    decode_performative, encode_transfer, write_amqp, Performative, TransferHead,
};
use connector::engine::frame::{split_frame, write_frame, TYPE_AMQP, TYPE_SASL};
use connector::engine::message::{data_sections, walk};
use connector::engine::peer;
use connector::engine::serial;
use connector::engine::DeliveryOutcome;
use fe2o3_amqp::types::definitions::{Role, SenderSettleMode};
use fe2o3_amqp::types::messaging::{Accepted, DeliveryState};
use fe2o3_amqp::types::performatives::{Close, Disposition, End, Flow};
use fe2o3_amqp::types::primitives::{Binary, Symbol};
use fe2o3_amqp::types::sasl::{SaslInit, SaslMechanisms, SaslOutcome};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{record, Args, Seen, Stop, Tally};

/// The one link's handle on our side, and the session's channel.
const HANDLE: u32 = 0;
/// Our session's incoming window: large, and re-announced with every FLOW we send.
const INCOMING_WINDOW: u32 = 1 << 20;
/// The session's first outgoing transfer-id (peer::begin announces 1).
const FIRST_OUTGOING_ID: u32 = 1;
/// Room left in a frame for the TRANSFER performative ahead of the payload.
const TRANSFER_OVERHEAD: usize = 64;

/// A byte stream to the connector: TCP, or TLS over TCP for `amqps://`.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Opens the stream for `url`: TLS (verified with the PEM CA bundle `ca`) for `amqps://`.
async fn open_stream(url: &str, ca: Option<&std::path::Path>) -> Result<Box<dyn Io>, String> {
    let (_, host) = super::split_url(url);
    let stream = TcpStream::connect(host)
        .await
        .map_err(|e| format!("{host}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    if !url.starts_with("amqps://") {
        return Ok(Box::new(stream));
    }
    let config = testkit::tls::client_config(ca.ok_or("amqps:// needs --ca")?)?;
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h).to_string();
    let name = rustls::pki_types::ServerName::try_from(name).map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, stream)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    Ok(Box::new(tls))
}

/// An open connection with one session: the socket, what has been read and not yet decoded, and
/// the frames waiting to be written.
struct Wire {
    stream: Box<dyn Io>,
    input: BytesMut,
    out: BytesMut,
    /// The server's max-frame-size.
    max_frame: usize,
    /// The server's idle timeout: we must send something at least twice as often.
    heartbeat: Option<Duration>,
    last_write: Instant,
    /// The next transfer-id we send, and the one we expect from the server (session flow).
    next_outgoing_id: u32,
    next_incoming_id: u32,
    /// The first transfer-id beyond the server's incoming window.
    session_limit: u32,
}

impl Wire {
    /// Connects, authenticates (SASL PLAIN with the URL's credentials, else ANONYMOUS), opens
    /// the connection and begins the session.
    async fn connect(
        url: &str,
        ca: Option<&std::path::Path>,
        container_id: &str,
    ) -> Result<Wire, String> {
        let (creds, _) = super::split_url(url);
        let stream = open_stream(url, ca).await?;
        let mut w = Wire {
            stream,
            input: BytesMut::with_capacity(1 << 16),
            out: BytesMut::with_capacity(1 << 16),
            max_frame: 512,
            heartbeat: None,
            last_write: Instant::now(),
            next_outgoing_id: FIRST_OUTGOING_ID,
            next_incoming_id: 0,
            session_limit: FIRST_OUTGOING_ID,
        };
        w.out.extend_from_slice(b"AMQP\x03\x01\x00\x00");
        w.flush().await?;
        w.header(3).await?;
        let mechanisms = w.sasl_frame().await?;
        let offered: SaslMechanisms =
            serde_amqp::from_slice(&mechanisms).map_err(|e| format!("sasl-mechanisms: {e}"))?;
        let (mechanism, response) = match creds {
            Some((user, pass)) => ("PLAIN", Some(format!("\0{user}\0{pass}").into_bytes())),
            None => ("ANONYMOUS", None),
        };
        if !offered
            .sasl_server_mechanisms
            .0
            .iter()
            .any(|m| m.0 == mechanism)
        {
            return Err(format!("the server does not offer SASL {mechanism}"));
        }
        let init = SaslInit {
            mechanism: Symbol::from(mechanism),
            initial_response: response.map(Binary::from),
            hostname: None,
        };
        w.out.extend_from_slice(&peer::sasl_frame(&init));
        w.flush().await?;
        let outcome: SaslOutcome =
            serde_amqp::from_slice(&w.sasl_frame().await?).map_err(|e| format!("sasl: {e}"))?;
        if !matches!(outcome.code, fe2o3_amqp::types::sasl::SaslCode::Ok) {
            return Err(format!("SASL {mechanism} refused: {:?}", outcome.code));
        }
        w.out.extend_from_slice(b"AMQP\x00\x01\x00\x00");
        write_amqp(&mut w.out, 0, &peer::open(container_id), &[]);
        write_amqp(&mut w.out, 0, &peer::begin(), &[]);
        w.flush().await?;
        w.header(0).await?;
        match w.next().await? {
            Performative::Open(o) => {
                w.max_frame = o.max_frame_size.0.max(512) as usize;
                w.heartbeat = o
                    .idle_time_out
                    .filter(|ms| *ms > 0)
                    .map(|ms| Duration::from_millis(u64::from(ms) / 2));
            }
            other => return Err(format!("expected OPEN, got {other:?}")),
        }
        match w.next().await? {
            Performative::Begin(b) => {
                w.next_incoming_id = b.next_outgoing_id;
                w.session_limit = FIRST_OUTGOING_ID.wrapping_add(b.incoming_window);
            }
            other => return Err(format!("expected BEGIN, got {other:?}")),
        }
        Ok(w)
    }

    /// Reads the server's 8-byte protocol header and checks its protocol id.
    async fn header(&mut self, protocol_id: u8) -> Result<(), String> {
        while self.input.len() < 8 {
            self.fill().await?;
        }
        let h = self.input.split_to(8);
        if &h[..4] != b"AMQP" || h[4] != protocol_id {
            return Err(format!("unexpected protocol header {:?}", &h[..]));
        }
        Ok(())
    }

    /// The body of the next SASL frame.
    async fn sasl_frame(&mut self) -> Result<bytes::Bytes, String> {
        loop {
            match split_frame(&mut self.input, u32::MAX).map_err(|e| e.to_string())? {
                Some(f) if f.frame_type == TYPE_SASL => return Ok(f.body),
                Some(_) => return Err("expected a SASL frame".into()),
                None => self.fill().await?,
            }
        }
    }

    /// Reads what the socket has; an error once the server closed it.
    async fn fill(&mut self) -> Result<(), String> {
        self.input.reserve(1 << 16);
        match self.stream.read_buf(&mut self.input).await {
            Ok(0) => Err("the server closed the connection".into()),
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// The next performative already read, if a whole frame is there; heartbeats are skipped.
    fn decoded(&mut self) -> Result<Option<Performative>, String> {
        loop {
            let Some(f) = split_frame(&mut self.input, u32::MAX).map_err(|e| e.to_string())? else {
                return Ok(None);
            };
            if f.body.is_empty() {
                continue;
            }
            if f.frame_type != TYPE_AMQP {
                return Err("SASL frame after SASL".into());
            }
            let p = decode_performative(&f.body).map_err(|e| e.to_string())?;
            if let Performative::Transfer(..) = p {
                self.next_incoming_id = self.next_incoming_id.wrapping_add(1);
            }
            return Ok(Some(p));
        }
    }

    /// The next performative, reading as needed.
    async fn next(&mut self) -> Result<Performative, String> {
        loop {
            if let Some(p) = self.decoded()? {
                return Ok(p);
            }
            self.fill().await?;
        }
    }

    /// Writes everything queued.
    async fn flush(&mut self) -> Result<(), String> {
        if !self.out.is_empty() {
            self.stream
                .write_all(&self.out)
                .await
                .map_err(|e| e.to_string())?;
            // TLS records can wait inside the stream; plain TCP has nothing to flush.
            self.stream.flush().await.map_err(|e| e.to_string())?;
            self.out.clear();
            self.last_write = Instant::now();
        }
        Ok(())
    }

    /// When an empty frame is due to keep the connection alive (far off when none is needed).
    fn heartbeat_due(&self) -> tokio::time::Instant {
        let every = self.heartbeat.unwrap_or(Duration::from_secs(3600));
        (self.last_write + every).into()
    }

    /// Queues an empty frame.
    fn queue_heartbeat(&mut self) {
        write_frame(&mut self.out, TYPE_AMQP, 0, |_| {});
    }

    /// Waits for the server's ATTACH in reply to ours; a refusal (an ATTACH without the
    /// terminus our link is about — the target of a link we send on, the source of one we
    /// receive on — followed by DETACH with an error) comes back as that error.
    async fn attached(&mut self, we_send: bool) -> Result<Option<u32>, String> {
        loop {
            match self.next().await? {
                Performative::Attach(connector::engine::codec::AttachFrame::Full(a)) => {
                    let refused = if we_send {
                        a.target.is_none()
                    } else {
                        a.source.is_none()
                    };
                    if refused {
                        return Err(format!("link refused: {:?}", self.error_after().await));
                    }
                    return Ok(a.initial_delivery_count);
                }
                Performative::Flow(_) => {}
                other => return Err(format!("expected ATTACH, got {other:?}")),
            }
        }
    }

    /// The error of the DETACH, END or CLOSE that follows a refusal.
    async fn error_after(&mut self) -> Option<String> {
        let p = tokio::time::timeout(Duration::from_secs(2), self.next())
            .await
            .ok()?
            .ok()?;
        peer::error_of(&p).map(|e| format!("{} {:?}", peer::error_symbol(e), e.description))
    }

    /// A link FLOW with the session's true counters.
    fn queue_flow(&mut self, delivery_count: u32, credit: u32) {
        let flow = Flow {
            next_incoming_id: Some(self.next_incoming_id),
            incoming_window: INCOMING_WINDOW,
            next_outgoing_id: self.next_outgoing_id,
            ..peer::link_flow(HANDLE, delivery_count, credit, false)
        };
        write_amqp(&mut self.out, 0, &flow, &[]);
    }

    /// Detaches the link, ends the session and closes the connection, waiting (briefly) for the
    /// server's CLOSE so that everything before it was processed.
    async fn close(mut self) {
        write_amqp(&mut self.out, 0, &peer::detach(HANDLE), &[]);
        write_amqp(&mut self.out, 0, &End { error: None }, &[]);
        write_amqp(&mut self.out, 0, &Close { error: None }, &[]);
        if self.flush().await.is_err() {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Ok(p) = self.next().await {
                if let Performative::Close(_) = p {
                    break;
                }
            }
        })
        .await;
    }
}

/// Unsettled sends in delivery-id order: when each was sent, until its outcome arrived.
struct InFlight {
    first: u32,
    sent: VecDeque<Option<Instant>>,
    open: usize,
}

impl InFlight {
    fn push(&mut self) {
        self.sent.push_back(Some(Instant::now()));
        self.open += 1;
    }

    /// Marks `id` settled: how long after its send; none when it was not in flight (already
    /// settled or never sent).
    fn settle(&mut self, id: u32) -> Option<Duration> {
        let i = id.wrapping_sub(self.first) as usize;
        let took = self.sent.get_mut(i)?.take()?.elapsed();
        self.open -= 1;
        while self.sent.front() == Some(&None) {
            self.sent.pop_front();
            self.first = self.first.wrapping_add(1);
        }
        Some(took)
    }
}

/// Sends `count` messages with up to `pipeline` unsettled (paced by `rate`), counting outcomes.
pub async fn produce(
    args: &Args,
    who: usize,
    first: u64,
    count: u64,
    started: Instant,
    tally: &Arc<Tally>,
) -> Result<(), String> {
    let mut w = Wire::connect(
        &args.url,
        args.ca.as_deref(),
        &format!("amqp-bench-producer-{who}"),
    )
    .await?;
    let mut attach = peer::attach_sender(&format!("producer-{who}"), HANDLE, &args.address);
    if args.presettled {
        attach.snd_settle_mode = SenderSettleMode::Settled;
    }
    write_amqp(&mut w.out, 0, &attach, &[]);
    w.flush().await?;
    w.attached(true).await?;
    let per_producer_rate = args.per_producer_rate();
    // The rate counts from this producer's start, not the run's: no burst to catch up.
    let paced = Instant::now();
    let pipeline = args.pipeline.max(1);
    let chunk = w.max_frame.saturating_sub(TRANSFER_OVERHEAD).max(1);
    // Link credit and the session's room, as the server last granted them.
    let mut delivery_count: u32 = 0;
    let mut credit_limit: u32 = 0;
    let mut flight = InFlight {
        first: 0,
        sent: VecDeque::new(),
        open: 0,
    };
    let mut sent: u64 = 0;
    let mut payload = Vec::new();
    loop {
        while let Some(p) = w.decoded()? {
            match p {
                Performative::Flow(f) => {
                    if let Some(next_in) = f.next_incoming_id {
                        w.session_limit = next_in.wrapping_add(f.incoming_window);
                    }
                    // A receiver that leaves delivery-count out (RabbitMQ does) counts from our
                    // initial one, which is 0 (peer::attach_sender).
                    if let (Some(_), Some(c)) = (f.handle, f.link_credit) {
                        credit_limit = f.delivery_count.unwrap_or(0).wrapping_add(c);
                    }
                }
                Performative::Disposition(d) if d.role == Role::Receiver => {
                    let accepted = matches!(d.state, Some(DeliveryOutcome::Accepted));
                    let mut id = d.first;
                    loop {
                        if let Some(took) = flight.settle(id) {
                            if accepted {
                                tally.stored(took);
                                tally.accepted.fetch_add(1, Ordering::Relaxed);
                            } else {
                                tally.failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        if id == d.last {
                            break;
                        }
                        id = id.wrapping_add(1);
                    }
                }
                Performative::Detach(_) | Performative::End(_) | Performative::Close(_) => {
                    return Err(format!(
                        "the server ended the link: {:?}",
                        peer::error_of(&p)
                    ));
                }
                _ => {}
            }
        }
        // Queue every message the window, the credit and the pacing allow right now.
        let mut due = None;
        while sent < count && flight.open < pipeline && serial::lt(delivery_count, credit_limit) {
            if per_producer_rate > 0.0 {
                let at = paced + Duration::from_secs_f64(sent as f64 / per_producer_rate);
                if at > Instant::now() {
                    due = Some(at);
                    break;
                }
            }
            data_section(&mut payload, first + sent, started, args.size);
            let frames = payload.len().div_ceil(chunk) as u32;
            if !serial::lt(w.next_outgoing_id.wrapping_add(frames - 1), w.session_limit) {
                break;
            }
            // The delivery-id is the link's delivery-count: one link per session.
            let id = delivery_count;
            let tag = id.to_be_bytes();
            for (i, part) in payload.chunks(chunk).enumerate() {
                let head = TransferHead {
                    handle: HANDLE,
                    delivery_id: (i == 0).then_some(id),
                    tag: (i == 0).then_some(&tag[..]),
                    message_format: (i == 0).then_some(0),
                    settled: (i == 0).then_some(args.presettled),
                    more: (i + 1) * chunk < payload.len(),
                };
                write_frame(&mut w.out, TYPE_AMQP, 0, |b| {
                    encode_transfer(b, &head);
                    b.extend_from_slice(part);
                });
                w.next_outgoing_id = w.next_outgoing_id.wrapping_add(1);
            }
            delivery_count = delivery_count.wrapping_add(1);
            sent += 1;
            tally.sent.fetch_add(1, Ordering::Relaxed);
            if args.presettled {
                tally.accepted.fetch_add(1, Ordering::Relaxed);
            } else {
                flight.push();
            }
        }
        w.flush().await?;
        if sent == count && flight.open == 0 {
            break;
        }
        let wake = due
            .map_or(w.heartbeat_due(), |d| d.into())
            .min(w.heartbeat_due());
        tokio::select! {
            r = w.fill() => r?,
            _ = tokio::time::sleep_until(wake) => {
                if w.heartbeat.is_some_and(|h| Instant::now() >= w.last_write + h) {
                    w.queue_heartbeat();
                }
                continue;
            }
        }
    }
    w.close().await;
    Ok(())
}

/// A header section marking the message durable (a list of one field, `true`), as the other
/// client sends it: brokers that keep non-durable messages in memory only must store it.
const DURABLE_HEADER: [u8; 7] = [0x00, 0x53, 0x70, 0xc0, 0x02, 0x01, 0x41];

/// Message `n` as a durable header and one Data section, written into `buf` (cleared first):
/// the body as the other clients' `body` makes it, built in place so the tool's own cost per
/// message stays small.
fn data_section(buf: &mut Vec<u8>, n: u64, started: Instant, size: usize) {
    let size = size.max(16);
    buf.clear();
    buf.extend_from_slice(&DURABLE_HEADER);
    buf.extend_from_slice(&[0x00, 0x53, 0x75, 0xb0]);
    buf.extend_from_slice(&(size as u32).to_be_bytes());
    buf.extend_from_slice(&n.to_be_bytes());
    buf.extend_from_slice(&(started.elapsed().as_nanos() as u64).to_be_bytes());
    buf.resize(DURABLE_HEADER.len() + 8 + size, 0x5a);
}

/// Receives with a window of `credit`, accepting every half window in ranged dispositions and
/// granting the credit back, until told to stop.
pub async fn consume(
    args: &Args,
    who: usize,
    started: Instant,
    tally: &Arc<Tally>,
    seen: &Arc<Mutex<Seen>>,
    mut stop: Stop,
) -> Result<(), String> {
    let mut w = Wire::connect(
        &args.url,
        args.ca.as_deref(),
        &format!("amqp-bench-consumer-{who}"),
    )
    .await?;
    let mut attach = peer::attach_receiver(&format!("consumer-{who}"), HANDLE, &args.address);
    let properties = args.link_properties();
    if !properties.is_empty() {
        attach.properties = Some(properties);
    }
    write_amqp(&mut w.out, 0, &attach, &[]);
    w.flush().await?;
    let window = args.credit.max(1);
    let mut delivery_count = w.attached(false).await?.unwrap_or(0);
    w.queue_flow(delivery_count, window);
    w.flush().await?;
    let settle_every = (window / 2).max(1) as usize;
    // Deliveries received and not yet accepted, as ranges of consecutive ids.
    let mut unsettled: Vec<(u32, u32)> = Vec::new();
    let mut since_flow = 0usize;
    // The delivery being assembled from frames with `more`.
    let mut partial: Option<(u32, bool, Vec<u8>)> = None;
    loop {
        while let Some(p) = w.decoded()? {
            match p {
                Performative::Transfer(t, payload) => {
                    let (id, settled, mut bytes) = match partial.take() {
                        Some(started) => started,
                        None => (
                            t.delivery_id.ok_or("TRANSFER without a delivery-id")?,
                            t.settled.unwrap_or(false),
                            Vec::new(),
                        ),
                    };
                    if t.more {
                        bytes.extend_from_slice(&payload);
                        partial = Some((id, settled, bytes));
                        continue;
                    }
                    let message: &[u8] = if bytes.is_empty() {
                        &payload
                    } else {
                        bytes.extend_from_slice(&payload);
                        &bytes
                    };
                    let layout = walk(message).map_err(|e| format!("message: {e:?}"))?;
                    // The number and send time are in the first 16 bytes: the first section.
                    let body = data_sections(&message[layout.body]).next().unwrap_or(&[]);
                    record(body, started, seen);
                    tally.received.fetch_add(1, Ordering::Relaxed);
                    delivery_count = delivery_count.wrapping_add(1);
                    since_flow += 1;
                    if !settled {
                        match unsettled.last_mut() {
                            Some((_, last)) if last.wrapping_add(1) == id => *last = id,
                            _ => unsettled.push((id, id)),
                        }
                    }
                }
                Performative::Detach(_) | Performative::End(_) | Performative::Close(_) => {
                    return Err(format!(
                        "the server ended the link: {:?}",
                        peer::error_of(&p)
                    ));
                }
                _ => {}
            }
        }
        // Everything received is accepted here, so the whole window is granted again.
        if since_flow >= settle_every {
            accept(&mut w, &mut unsettled);
            since_flow = 0;
            w.queue_flow(delivery_count, window);
            w.flush().await?;
        }
        let beat = w.heartbeat_due();
        tokio::select! {
            r = w.fill() => r?,
            _ = stop.changed() => break,
            _ = tokio::time::sleep_until(beat) => {
                w.queue_heartbeat();
                w.flush().await?;
                continue;
            }
        }
    }
    // What arrived since the last batch, before the link closes (or it would be released).
    accept(&mut w, &mut unsettled);
    w.close().await;
    Ok(())
}

/// Queues one settled `accepted` DISPOSITION per range.
fn accept(w: &mut Wire, ranges: &mut Vec<(u32, u32)>) {
    for (first, last) in ranges.drain(..) {
        let d = Disposition {
            role: Role::Receiver,
            first,
            last: (last != first).then_some(last),
            settled: true,
            state: Some(DeliveryState::Accepted(Accepted {})),
            batchable: false,
        };
        write_amqp(&mut w.out, 0, &d, &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lean producer's in-place Data section carries the body every other client sends:
    /// the message number, the send time, then filler up to the size.
    #[test]
    fn in_place_data_section_holds_the_common_body() {
        let started = Instant::now();
        let mut buf = vec![1, 2, 3];
        for size in [1, 16, 1024, 70_000] {
            data_section(&mut buf, 42, started, size);
            let common = super::super::body(42, started, size);
            let layout = connector::engine::message::walk(&buf).expect("a message");
            assert!(layout.header.is_some(), "durable header");
            let data = &buf[DURABLE_HEADER.len()..];
            assert_eq!(&data[..4], &[0x00, 0x53, 0x75, 0xb0]);
            assert_eq!(data[4..8], (common.len() as u32).to_be_bytes());
            let body = &data[8..];
            assert_eq!(body.len(), common.len());
            assert_eq!(body[..8], common[..8], "the message number");
            assert_eq!(body[16..], common[16..], "the filler");
        }
    }
}

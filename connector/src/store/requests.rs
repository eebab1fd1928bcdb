//! Commands and queries in memory (KubeMQ 4.7): a request reaches every matching responder
//! subscription without a group and one member of each group, with a reply address of its own;
//! the first response sent to that address completes the request, and a request that gets none
//! within its timeout — also with no responder at all — fails with `Error 301`. Nothing is kept.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::errors::{
    request_validation, response_validation, subscribe_channel, RequestKind, StoreError,
    SubscribeKind,
};
use super::fanout::{Channeled, Fanout};
use crate::engine::FastMap;
use crate::kubemq::{Request, Response};

/// Requests a responder subscription's buffer holds; past it a request is not delivered to that
/// responder (and times out unless another answers).
pub const SUBSCRIPTION_BUFFER: usize = 1024;

/// Prefix of the reply addresses requests carry to responders (KubeMQ's NATS inbox form).
const INBOX_PREFIX: &str = "_INBOX.";

/// A request waiting for its first response.
struct Waiting {
    kind: RequestKind,
    done: oneshot::Sender<Response>,
}

/// The in-memory commands and queries router.
pub struct RequestsHub {
    commands: Fanout<Request>,
    queries: Fanout<Request>,
    /// Requests waiting, by the uuid of their reply address (the hub's own, random: a fast hash
    /// is safe with them).
    waiting: Mutex<FastMap<u128, Waiting>>,
}

impl Default for RequestsHub {
    fn default() -> Self {
        RequestsHub {
            commands: Fanout::new(SUBSCRIPTION_BUFFER),
            queries: Fanout::new(SUBSCRIPTION_BUFFER),
            waiting: Mutex::default(),
        }
    }
}

/// Takes a waiting request off the table when its sender stops waiting, however it stops.
struct WaitGuard<'a> {
    hub: &'a RequestsHub,
    inbox: u128,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.hub.lock().remove(&self.inbox);
    }
}

/// The uuid of a reply address this hub gave (`_INBOX.` and a lowercase hyphenated uuid);
/// `None` for any other text, which no request waits on.
fn inbox_of(reply_channel: &str) -> Option<u128> {
    let text = reply_channel.strip_prefix(INBOX_PREFIX)?;
    let id = uuid::Uuid::try_parse(text).ok()?;
    let mut canonical = [0u8; uuid::fmt::Hyphenated::LENGTH];
    (id.hyphenated().encode_lower(&mut canonical).as_bytes() == text.as_bytes())
        .then_some(id.as_u128())
}

impl RequestsHub {
    fn lock(&self) -> std::sync::MutexGuard<'_, FastMap<u128, Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fanout(&self, kind: RequestKind) -> &Fanout<Request> {
        match kind {
            RequestKind::Command => &self.commands,
            RequestKind::Query => &self.queries,
        }
    }

    /// Sends a request (SendRequest) and waits for its first response, at most its Timeout:
    /// validated as KubeMQ does, then given to every matching responder without a group and one
    /// member of each group.
    pub async fn send(&self, mut request: Request) -> Result<Response, StoreError> {
        let kind = request_validation(&request)?;
        if request.request_id.is_empty() {
            request.request_id = crate::kubemq::new_id();
        }
        let inbox = uuid::Uuid::new_v4();
        let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
        request.reply_channel = [INBOX_PREFIX, inbox.hyphenated().encode_lower(&mut text)].concat();
        let timeout = Duration::from_millis(u64::try_from(request.timeout).unwrap_or(1));
        let (done, answer) = oneshot::channel();
        let inbox = inbox.as_u128();
        self.lock().insert(inbox, Waiting { kind, done });
        let _guard = WaitGuard { hub: self, inbox };
        self.fanout(kind).route(request);
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(response)) => Ok(response),
            _ => Err(StoreError::RequestTimeout),
        }
    }

    /// Subscribes a responder to `channel` (wildcards allowed) in `group`.
    pub fn subscribe(
        &self,
        kind: RequestKind,
        client_id: &str,
        channel: &str,
        group: &str,
    ) -> Result<mpsc::Receiver<Request>, StoreError> {
        subscribe_channel(client_id, channel, SubscribeKind::Requests)?;
        Ok(self.fanout(kind).subscribe(channel, group))
    }

    /// A responder's answer (SendResponse): the first one for a reply address completes its
    /// request; later ones, and ones for a request that timed out, are discarded without an
    /// error, as KubeMQ discards them.
    pub fn respond(&self, mut response: Response) -> Result<(), StoreError> {
        response_validation(&response)?;
        let Some(waiting) =
            inbox_of(&response.reply_channel).and_then(|id| self.lock().remove(&id))
        else {
            return Ok(());
        };
        response.reply_channel.clear();
        if waiting.kind == RequestKind::Command {
            // What a command's sender gets: the outcome, not data.
            response.metadata.clear();
            response.body.clear();
            response.cache_hit = false;
        }
        let _ = waiting.done.send(response);
        Ok(())
    }

    /// Requests waiting for a response right now.
    pub fn waiting(&self) -> usize {
        self.lock().len()
    }
}

impl Channeled for Request {
    fn channel(&self) -> &str {
        &self.channel
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubemq::request::RequestType;

    fn request(kind: RequestType, channel: &str, timeout_ms: i32) -> Request {
        Request {
            request_type_data: kind as i32,
            client_id: "asker".into(),
            channel: channel.into(),
            body: b"ping".to_vec(),
            metadata: "m".into(),
            timeout: timeout_ms,
            ..Default::default()
        }
    }

    fn answer(to: &Request, executed: bool) -> Response {
        Response {
            client_id: "responder".into(),
            request_id: to.request_id.clone(),
            reply_channel: to.reply_channel.clone(),
            metadata: "answer-metadata".into(),
            body: b"pong".to_vec(),
            cache_hit: true,
            executed,
            error: if executed { "" } else { "refused" }.into(),
            ..Default::default()
        }
    }

    /// KMQ 4.7: a command's sender gets the outcome with body, metadata and CacheHit stripped
    /// and the reply address cleared; a query's sender gets all the responder set; the table of
    /// waiting requests is empty afterwards.
    #[tokio::test]
    async fn first_response_completes_the_request() {
        let hub = std::sync::Arc::new(RequestsHub::default());
        let mut commands = hub.subscribe(RequestKind::Command, "r", "ops", "").unwrap();
        let mut queries = hub.subscribe(RequestKind::Query, "r", "ops", "").unwrap();
        let h = hub.clone();
        let cmd =
            tokio::spawn(async move { h.send(request(RequestType::Command, "ops", 5000)).await });
        let delivered = commands.recv().await.unwrap();
        assert!(delivered.reply_channel.starts_with(INBOX_PREFIX));
        assert!(!delivered.request_id.is_empty());
        hub.respond(answer(&delivered, false)).unwrap();
        // A second response to the same request is discarded without an error.
        hub.respond(answer(&delivered, true)).unwrap();
        let got = cmd.await.unwrap().unwrap();
        assert!(!got.executed);
        assert_eq!(got.error, "refused");
        assert!(got.body.is_empty() && got.metadata.is_empty() && !got.cache_hit);
        assert!(got.reply_channel.is_empty());
        let h = hub.clone();
        let query =
            tokio::spawn(async move { h.send(request(RequestType::Query, "ops", 5000)).await });
        let delivered = queries.recv().await.unwrap();
        assert!(commands.try_recv().is_err(), "a query is not a command");
        hub.respond(answer(&delivered, true)).unwrap();
        let got = query.await.unwrap().unwrap();
        assert_eq!(&got.body[..], b"pong");
        assert_eq!(got.metadata, "answer-metadata");
        assert!(got.cache_hit);
        assert_eq!(hub.waiting(), 0);
    }

    /// A response completes a request only through the exact reply address it was given, as
    /// KubeMQ compares them as text: the same uuid in capitals, another form or without the
    /// prefix completes nothing.
    #[tokio::test]
    async fn only_the_exact_reply_address_answers() {
        let hub = std::sync::Arc::new(RequestsHub::default());
        let mut queries = hub.subscribe(RequestKind::Query, "r", "ops", "").unwrap();
        let h = hub.clone();
        let query =
            tokio::spawn(async move { h.send(request(RequestType::Query, "ops", 5000)).await });
        let delivered = queries.recv().await.unwrap();
        let uuid = delivered
            .reply_channel
            .strip_prefix(INBOX_PREFIX)
            .unwrap()
            .to_string();
        for wrong in [
            format!("{INBOX_PREFIX}{}", uuid.to_uppercase()),
            format!("{INBOX_PREFIX}{}", uuid.replace('-', "")),
            format!("{INBOX_PREFIX}{{{uuid}}}"),
            uuid.clone(),
            format!("{INBOX_PREFIX}{uuid} "),
        ] {
            let mut r = answer(&delivered, true);
            r.reply_channel = wrong;
            hub.respond(r).unwrap();
            assert_eq!(hub.waiting(), 1);
        }
        hub.respond(answer(&delivered, true)).unwrap();
        assert!(query.await.unwrap().is_ok());
        assert_eq!(hub.waiting(), 0);
    }

    /// KMQ 4.7 step 6: no response — also with no responder at all — is `Error 301` after the
    /// full timeout, and nothing is left waiting.
    #[tokio::test]
    async fn no_response_times_out() {
        let hub = RequestsHub::default();
        let started = tokio::time::Instant::now();
        let e = hub
            .send(request(RequestType::Command, "nobody", 300))
            .await
            .unwrap_err();
        assert!(e.to_string().starts_with("Error 301"), "{e}");
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(hub.waiting(), 0);
    }

    /// Each responder without a group gets the request; one member of a group does.
    #[tokio::test]
    async fn groups_share_requests() {
        let hub = std::sync::Arc::new(RequestsHub::default());
        let mut solo = hub.subscribe(RequestKind::Query, "s", "q", "").unwrap();
        let mut g1 = hub.subscribe(RequestKind::Query, "g1", "q", "g").unwrap();
        let mut g2 = hub.subscribe(RequestKind::Query, "g2", "q", "g").unwrap();
        for _ in 0..4 {
            let h = hub.clone();
            tokio::spawn(async move { h.send(request(RequestType::Query, "q", 5000)).await });
            let r = solo.recv().await.unwrap();
            hub.respond(answer(&r, true)).unwrap();
        }
        let (mut a, mut b) = (0, 0);
        while g1.try_recv().is_ok() {
            a += 1;
        }
        while g2.try_recv().is_ok() {
            b += 1;
        }
        assert_eq!((a, b), (2, 2));
    }

    /// KubeMQ's validation, in its order.
    #[tokio::test]
    async fn validation() {
        let hub = RequestsHub::default();
        let mut r = request(RequestType::Command, "ch", 1000);
        r.client_id.clear();
        assert!(hub
            .send(r)
            .await
            .unwrap_err()
            .to_string()
            .starts_with("Error 101"));
        let r = request(RequestType::Command, "a.*", 1000);
        assert!(hub
            .send(r)
            .await
            .unwrap_err()
            .to_string()
            .starts_with("Error 107"));
        let r = request(RequestType::Command, "ch", 0);
        assert!(hub
            .send(r)
            .await
            .unwrap_err()
            .to_string()
            .starts_with("Error 109"));
        let mut r = request(RequestType::Command, "ch", 1000);
        r.body = Default::default();
        r.metadata.clear();
        assert!(hub
            .send(r)
            .await
            .unwrap_err()
            .to_string()
            .starts_with("Error 115"));
        let mut r = request(RequestType::Query, "ch", 1000);
        r.cache_key = "k".into();
        assert!(hub
            .send(r)
            .await
            .unwrap_err()
            .to_string()
            .starts_with("Error 116"));
        let r = request(RequestType::Unknown, "ch", 1000);
        assert!(hub
            .send(r)
            .await
            .unwrap_err()
            .to_string()
            .starts_with("Error 206"));
        let e = hub
            .respond(Response {
                client_id: "r".into(),
                reply_channel: "_INBOX.x".into(),
                ..Default::default()
            })
            .unwrap_err();
        assert!(e.to_string().starts_with("Error 117"), "{e}");
        assert!(hub.subscribe(RequestKind::Query, "c", "a.>", "").is_ok());
        assert_eq!(hub.waiting(), 0);
    }
}

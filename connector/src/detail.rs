//! The detail endpoints `GET /api/amqp10/connections` and `GET /api/amqp10/links` (OBS-1 …
//! OBS-4): every open connection joins a [`Registry`] and answers its probes from its own task,
//! so what the endpoints show is each connection's state at the moment it was asked, at no cost
//! to a connection nobody asks about.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::engine::{Connection, LinkId, LinkView};

/// How long one connection may take to answer a probe; one that takes longer (it is closing) is
/// left out of that answer.
const PROBE_WAIT: Duration = Duration::from_secs(2);
/// Probes one connection may have waiting: one per HTTP connection the endpoint serves at once.
const PROBES_WAITING: usize = 64;

/// A request for one connection's [`Snapshot`].
pub type Probe = oneshot::Sender<Snapshot>;

/// One connection in `GET /api/amqp10/connections` (OBS-2).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ConnectionView {
    /// The ClientID (SASL-6).
    pub client_id: String,
    /// The OPEN container-id, sanitized (CONN-6).
    pub container_id: String,
    /// The OPEN property `product`; empty when not sent.
    pub product: String,
    /// The OPEN property `version`; empty when not sent.
    pub version: String,
    /// Live sessions.
    pub sessions: usize,
    /// Live links across all sessions.
    pub links: usize,
    /// When the connection was accepted, RFC 3339 in UTC.
    pub connected_at: String,
    /// The peer's IP address.
    pub source_ip: String,
    /// `plain`, `anonymous`, `external` or `none`.
    pub sasl: &'static str,
    /// Whether the connection is TLS-terminated (TLS-6).
    pub tls: bool,
}

/// One link in `GET /api/amqp10/links` (OBS-3).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LinkDetail {
    /// The owning connection's ClientID.
    pub client_id: String,
    /// The link's name, chosen by the client.
    pub name: String,
    /// `sender` or `receiver`, from the server's point of view.
    pub role: &'static str,
    /// The resolved terminus address.
    pub address: String,
    /// `queues`, `events`, `events-store`, `commands`, `queries`, or a synthetic value.
    pub pattern: &'static str,
    /// The resolved KubeMQ channel.
    pub channel: String,
    /// Current link credit as the server sees it.
    pub credit: i64,
    /// Deliveries awaiting settlement.
    pub unsettled: i64,
    /// A durable events-store subscription (DUR-1).
    pub durable: bool,
    /// A dynamic-node terminus (ADDR-11).
    pub dynamic: bool,
}

/// What the application says a link serves (OBS-3).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkLabel {
    /// The resolved terminus address.
    pub address: String,
    /// The pattern it serves: `queues`, `events`, `events-store`, `commands`, `queries`, or a
    /// synthetic one such as `responses`.
    pub pattern: &'static str,
    /// The KubeMQ channel (empty for an anonymous or dynamic link).
    pub channel: String,
    /// A durable events-store subscription (DUR-1).
    pub durable: bool,
}

/// Where the labels of one connection's links come from: what serves them.
pub trait LinkLabels {
    /// What `link` serves; `None` while nothing does.
    fn link_label(&self, link: LinkId) -> Option<LinkLabel>;
}

/// One connection's answer to a probe.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The connection.
    pub connection: ConnectionView,
    /// Its links.
    pub links: Vec<LinkDetail>,
}

/// What a connection knows of itself from its accept and its OPEN; the rest comes from the engine
/// when asked.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The ClientID.
    pub client_id: String,
    /// The OPEN container-id, sanitized.
    pub container_id: String,
    /// OPEN `product`.
    pub product: Option<String>,
    /// OPEN `version`.
    pub version: Option<String>,
    /// When it was accepted.
    pub connected_at: SystemTime,
    /// The peer's address.
    pub source_ip: IpAddr,
    /// Whether it runs over TLS.
    pub tls: bool,
}

impl Identity {
    /// The connection's state now, from its engine, its links labelled by `labels`.
    pub fn snapshot(&self, conn: &Connection, labels: &dyn LinkLabels) -> Snapshot {
        let views = conn.link_views();
        let sasl = conn.identity().map_or("none", |i| i.mechanism.audit_name());
        let links = views
            .into_iter()
            .map(|v| {
                let label = labels.link_label(v.id).unwrap_or_default();
                self.link(v, label)
            })
            .collect::<Vec<_>>();
        Snapshot {
            connection: ConnectionView {
                client_id: self.client_id.clone(),
                container_id: self.container_id.clone(),
                product: self.product.clone().unwrap_or_default(),
                version: self.version.clone().unwrap_or_default(),
                sessions: conn.session_count(),
                links: links.len(),
                connected_at: rfc3339(self.connected_at),
                source_ip: self.source_ip.to_string(),
                sasl,
                tls: self.tls,
            },
            links,
        }
    }

    fn link(&self, v: LinkView, label: LinkLabel) -> LinkDetail {
        LinkDetail {
            client_id: self.client_id.clone(),
            name: v.name,
            role: v.role.name(),
            address: label.address,
            pattern: label.pattern,
            channel: label.channel,
            credit: i64::from(v.credit),
            unsettled: v.unsettled as i64,
            durable: label.durable,
            dynamic: v.dynamic,
        }
    }
}

/// RFC 3339 in UTC, to the millisecond.
fn rfc3339(t: SystemTime) -> String {
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    time::OffsetDateTime::from(t)
        .format(&format)
        .unwrap_or_default()
}

/// The open connections of the process, each reachable by a probe.
#[derive(Debug, Default)]
pub struct Registry {
    members: Mutex<HashMap<u64, mpsc::Sender<Probe>>>,
    next: AtomicU64,
}

/// A connection's place in the [`Registry`]; leaving is dropping it.
#[derive(Debug)]
pub struct Membership {
    registry: Arc<Registry>,
    id: u64,
    probes: mpsc::Receiver<Probe>,
}

impl Membership {
    /// The next probe for this connection, if one is waiting; wakes `cx` when one comes.
    pub fn poll_probe(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Probe>> {
        self.probes.poll_recv(cx)
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.registry
            .members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

impl Registry {
    /// Adds an open connection.
    pub fn join(self: &Arc<Self>) -> Membership {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, probes) = mpsc::channel(PROBES_WAITING);
        self.members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        Membership {
            registry: self.clone(),
            id,
            probes,
        }
    }

    /// Every open connection's state, in the order they joined.
    pub async fn snapshots(&self) -> Vec<Snapshot> {
        let mut members: Vec<(u64, mpsc::Sender<Probe>)> = self
            .members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, tx)| (*id, tx.clone()))
            .collect();
        members.sort_unstable_by_key(|(id, _)| *id);
        let asked = members.into_iter().map(|(_, tx)| async move {
            let (reply, answer) = oneshot::channel();
            tokio::time::timeout(PROBE_WAIT, async move {
                tx.send(reply).await.ok()?;
                answer.await.ok()
            })
            .await
            .ok()
            .flatten()
        });
        futures_util::future::join_all(asked)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// The body of `GET /api/amqp10/connections` (OBS-2).
    pub async fn connections_json(&self) -> String {
        let connections: Vec<ConnectionView> = self
            .snapshots()
            .await
            .into_iter()
            .map(|s| s.connection)
            .collect();
        listing("connections", &connections)
    }

    /// The body of `GET /api/amqp10/links` (OBS-3).
    pub async fn links_json(&self) -> String {
        let links: Vec<LinkDetail> = self
            .snapshots()
            .await
            .into_iter()
            .flat_map(|s| s.links)
            .collect();
        listing("links", &links)
    }
}

/// `{"<key>": [...], "total": <n>}`.
fn listing<T: Serialize>(key: &str, items: &[T]) -> String {
    let mut body = serde_json::Map::new();
    body.insert(
        key.to_string(),
        serde_json::to_value(items).unwrap_or_default(),
    );
    body.insert("total".to_string(), items.len().into());
    serde_json::Value::Object(body).to_string()
}

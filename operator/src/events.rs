//! Kubernetes Events about AmqpConnectors (events.k8s.io/v1), each saying what happened this
//! time. A note not published before is a new Event; only the same note again, about the same
//! object, within [`REPEAT_WINDOW`] counts up the earlier Event's series. kube-runtime's
//! `Recorder` tells repeats apart by type, reason and action alone, so a later "generation 9
//! applied" would only count up the Event that still reads "generation 1 applied".

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;

/// How long a published Event can be counted up by the same note again.
pub const REPEAT_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// Whether an Event reports something normal or something to look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Expected progress (a generation applied, a pause).
    Normal,
    /// Something a user should act on (an invalid spec, pods that cannot be made).
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One thing to tell about an AmqpConnector.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Announcement {
    /// Normal or Warning.
    pub type_: EventType,
    /// Why, in one CamelCase word (`Applied`, `InvalidSpec`, ...).
    pub reason: String,
    /// What the operator did (`Apply`, `Reconcile`).
    pub action: String,
    /// What happened this time, for people.
    pub note: String,
}

/// What makes two publications the same Event: the object and everything the announcement says.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    announcement: Announcement,
}

/// An Event this operator created, as far as counting it up needs.
#[derive(Debug)]
struct Published {
    name: String,
    count: i32,
    last: Timestamp,
}

/// Publishes Events as one reporting controller instance.
pub struct Announcer {
    client: Client,
    controller: String,
    instance: String,
    published: Mutex<HashMap<Key, Published>>,
}

impl Announcer {
    /// Events reported by `controller`, from `instance` (this replica; the controller's name
    /// when unknown).
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Announcer {
        Announcer {
            client,
            controller: controller.to_string(),
            instance: instance.unwrap_or_else(|| controller.to_string()),
            published: Mutex::new(HashMap::new()),
        }
    }

    /// Creates the Event of `announcement` about `regarding`, or counts up the one created for
    /// the same announcement within [`REPEAT_WINDOW`].
    pub async fn publish(
        &self,
        announcement: &Announcement,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = Key {
            namespace: regarding.namespace.clone(),
            name: regarding.name.clone(),
            uid: regarding.uid.clone(),
            announcement: announcement.clone(),
        };
        let repeat = {
            let mut published = self.published.lock().unwrap_or_else(|p| p.into_inner());
            published.retain(|_, p| p.last + REPEAT_WINDOW > now);
            published.get(&key).map(|p| (p.name.clone(), p.count + 1))
        };
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let counted = match repeat {
            Some((name, count)) => {
                let series = serde_json::json!({ "series": EventSeries {
                    count,
                    last_observed_time: MicroTime(now),
                }});
                match events
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&series))
                    .await
                {
                    Ok(_) => Some(Published {
                        name,
                        count,
                        last: now,
                    }),
                    // Deleted meanwhile (Events expire): tell it afresh.
                    Err(kube::Error::Api(e)) if e.code == 404 => None,
                    Err(e) => return Err(e),
                }
            }
            None => None,
        };
        let published = match counted {
            Some(p) => p,
            None => {
                let event = new_event(
                    &self.controller,
                    &self.instance,
                    announcement,
                    regarding,
                    now,
                );
                events.create(&PostParams::default(), &event).await?;
                Published {
                    name: event.metadata.name.unwrap_or_default(),
                    count: 1,
                    last: now,
                }
            }
        };
        self.published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, published);
        Ok(())
    }
}

/// The API server refuses an Event whose note is longer than this many bytes.
const NOTE_LIMIT: usize = 1024;

/// `note` cut to fit an Event (at a character boundary, ending in `…`), whole when it fits.
fn fit_note(note: String) -> String {
    if note.len() <= NOTE_LIMIT {
        return note;
    }
    let mut end = NOTE_LIMIT - '…'.len_utf8();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    let mut cut = note;
    cut.truncate(end);
    cut.push('…');
    cut
}

/// A new Event of `announcement` about `regarding`, named after the object and the moment.
fn new_event(
    controller: &str,
    instance: &str,
    announcement: &Announcement,
    regarding: &ObjectReference,
    now: Timestamp,
) -> K8sEvent {
    K8sEvent {
        metadata: ObjectMeta {
            namespace: regarding.namespace.clone(),
            name: Some(format!(
                "{}.{:x}",
                regarding.name.as_deref().unwrap_or(controller),
                now.as_nanosecond()
            )),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        type_: Some(announcement.type_.as_str().to_string()),
        reason: Some(announcement.reason.clone()),
        action: Some(announcement.action.clone()),
        note: Some(fit_note(announcement.note.clone())),
        regarding: Some(regarding.clone()),
        reporting_controller: Some(controller.to_string()),
        reporting_instance: Some(instance.to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(generation: u32) -> Announcement {
        Announcement {
            type_: EventType::Normal,
            reason: "Applied".into(),
            action: "Apply".into(),
            note: format!("generation {generation} applied"),
        }
    }

    fn orders() -> ObjectReference {
        ObjectReference {
            namespace: Some("apps".into()),
            name: Some("orders".into()),
            uid: Some("u-1".into()),
            kind: Some("AmqpConnector".into()),
            ..Default::default()
        }
    }

    #[test]
    fn an_event_carries_its_own_note_and_reporter() {
        let now = Timestamp::now();
        let e = new_event("op", "op-0", &applied(9), &orders(), now);
        assert_eq!(e.note.as_deref(), Some("generation 9 applied"));
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        assert_eq!(e.reason.as_deref(), Some("Applied"));
        assert_eq!(e.action.as_deref(), Some("Apply"));
        assert_eq!(e.reporting_controller.as_deref(), Some("op"));
        assert_eq!(e.reporting_instance.as_deref(), Some("op-0"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("apps"));
        assert_eq!(e.regarding, Some(orders()));
        assert!(e.series.is_none());
        let later = new_event(
            "op",
            "op-0",
            &applied(9),
            &orders(),
            now + SignedDuration::from_nanos(1),
        );
        assert_ne!(e.metadata.name, later.metadata.name);
    }

    /// A long error text still makes a valid Event: cut to the API server's limit at a
    /// character boundary; a short one is whole.
    #[test]
    fn event_notes_fit_the_limit() {
        assert_eq!(fit_note("short".into()), "short");
        for filler in ["x", "é", "日本"] {
            let long = filler.repeat(2000);
            let note = fit_note(long.clone());
            assert!(note.len() <= NOTE_LIMIT, "{} bytes", note.len());
            assert!(note.ends_with('…'));
            assert!(long.starts_with(note.trim_end_matches('…')));
        }
    }

    #[test]
    fn only_the_same_note_about_the_same_object_is_a_repeat() {
        let key = |a: Announcement, r: &ObjectReference| Key {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
            announcement: a,
        };
        let other = ObjectReference {
            uid: Some("u-2".into()),
            ..orders()
        };
        assert_eq!(key(applied(1), &orders()), key(applied(1), &orders()));
        assert_ne!(key(applied(1), &orders()), key(applied(2), &orders()));
        assert_ne!(key(applied(1), &orders()), key(applied(1), &other));
    }
}

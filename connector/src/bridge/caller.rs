//! Who the connector's KubeMQ calls for one connection are made as. A KubeMQ that authorizes
//! (the builds before v2.4.0) decides each call by the call's ClientID matched against its own
//! policy, whatever token it carries; so every call made for an authenticated connection carries
//! that connection's ClientID, or begins with it where KubeMQ needs a ClientID of its own per
//! subscription (AUTHZ-9).

use std::sync::Arc;

/// The ClientID of the Gets made for connections that did not authenticate.
const CONNECTOR_CLIENT_ID: &str = "kubemq-amqp-connector";

/// The prefix of the events-store subscriptions of connections that did not authenticate.
const CONNECTOR_PREFIX: &str = "amqp10";

/// Characters of a ClientID kept in a prefix (SASL-6 cuts ClientIDs at 256 as well).
const PREFIX_CHARS: usize = 256;

/// Who a connection's KubeMQ calls are made as.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Caller {
    /// The connector itself: authentication is off, so no call is any client's own.
    Connector,
    /// An authenticated connection, by its ClientID (SASL-6).
    Client(Arc<str>),
}

impl Caller {
    /// The caller for a connection identified as `client_id`, `authenticated` or not.
    pub fn of(authenticated: bool, client_id: &str) -> Caller {
        if authenticated {
            Caller::Client(client_id.into())
        } else {
            Caller::Connector
        }
    }

    /// The ClientID of Gets (a Get loop serves one caller).
    pub fn get_client_id(&self) -> &str {
        match self {
            Caller::Connector => CONNECTOR_CLIENT_ID,
            Caller::Client(id) => id,
        }
    }

    /// The ClientID of an events subscription without a durable cursor: for events-store a
    /// fresh one per link (`<prefix>-<uuid>`, only `[A-Za-z0-9_-]`), since KubeMQ resumes a
    /// ClientID's cursor and allows one subscription per ClientID; for events, where KubeMQ
    /// keeps no cursor, an authenticated caller's own.
    pub fn subscription_client_id(&self, store: bool) -> String {
        match self {
            Caller::Client(id) if !store => id.to_string(),
            _ => format!("{}-{}", self.prefix(), uuid::Uuid::new_v4().simple()),
        }
    }

    /// The ClientID of the durable subscription named `identity` (DUR-2): the identity itself,
    /// or, for an authenticated caller, `<ClientID>-<identity>`, so that KubeMQ authorizes it
    /// as its owner and one client can never resume another's cursor under the same
    /// container-id and link name.
    pub fn durable_client_id(&self, identity: &str) -> String {
        match self {
            Caller::Connector => identity.to_string(),
            Caller::Client(_) => format!("{}-{identity}", self.prefix()),
        }
    }

    /// The start of the ClientIDs KubeMQ needs in `[A-Za-z0-9_-]`.
    fn prefix(&self) -> String {
        match self {
            Caller::Connector => CONNECTOR_PREFIX.into(),
            Caller::Client(id) => crate::engine::sanitize_id(id, PREFIX_CHARS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AUTHZ-9: an authenticated connection's calls carry its ClientID, or begin with it.
    #[test]
    fn authz_9_an_authenticated_callers_client_ids_begin_with_its_own() {
        let alice = Caller::of(true, "team.alice");
        assert_eq!(alice.get_client_id(), "team.alice");
        assert_eq!(alice.subscription_client_id(false), "team.alice");
        let store = alice.subscription_client_id(true);
        assert!(store.starts_with("team_alice-"), "{store}");
        assert_ne!(store, alice.subscription_client_id(true));
        assert!(store
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'));
        assert_eq!(
            alice.durable_client_id("app_sub_0a1b2c3d"),
            "team_alice-app_sub_0a1b2c3d"
        );
    }

    /// Without authentication the connector calls as itself and durable ClientIDs are DUR-2's.
    #[test]
    fn an_unauthenticated_connection_calls_as_the_connector() {
        let c = Caller::of(false, "some-container");
        assert_eq!(c, Caller::Connector);
        assert_eq!(c.get_client_id(), "kubemq-amqp-connector");
        for store in [false, true] {
            let id = c.subscription_client_id(store);
            assert!(id.starts_with("amqp10-"), "{id}");
            assert_ne!(id, c.subscription_client_id(store));
        }
        assert_eq!(c.durable_client_id("app_sub_0a1b2c3d"), "app_sub_0a1b2c3d");
    }
}

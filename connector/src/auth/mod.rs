//! Who a client is and what it may do: the JWT check behind SASL PLAIN ([`jwt`]), the Casbin
//! access control list ([`policy`]) and the audit events ([`audit`]), put together from the
//! settings by [`Security::load`].

pub mod audit;
pub mod jwt;
pub mod policy;
pub mod throttle;

use std::sync::Arc;

use crate::config::Settings;
use crate::engine::{AmqpError, AuthPolicy, Condition};
use crate::pattern::Pattern;

use self::jwt::{JwtConfigError, JwtVerifier, KeySource};
use self::policy::{Action, Policy, PolicyError};

/// Why the security settings cannot be used; the connector does not start.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// The JWT key.
    #[error(transparent)]
    Jwt(#[from] JwtConfigError),
    /// The access control list.
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

/// Authentication and authorization, as configured.
#[derive(Debug, Clone)]
pub struct Security {
    /// How SASL authenticates (handed to the engine).
    pub auth: AuthPolicy,
    /// Who may do what; without a policy, everything (AUTHZ-1).
    pub access: Access,
    /// The JWT check, for the embedded store's gRPC façade to apply to its callers too.
    pub jwt: Option<Arc<JwtVerifier>>,
}

impl Security {
    /// Authentication and authorization off.
    pub fn open() -> Security {
        Security {
            auth: AuthPolicy::Disabled,
            access: Access::open(),
            jwt: None,
        }
    }

    /// Reads the key and the policy the settings name (validated already: a signature type
    /// and one key source when authentication is on; a policy only with authentication).
    pub async fn load(settings: &Settings) -> Result<Security, SecurityError> {
        if !settings.authentication {
            return Ok(Security::open());
        }
        let source = match (&settings.jwt_key, &settings.jwt_key_file) {
            (Some(key), _) => KeySource::Inline(key),
            (None, Some(path)) => KeySource::File(path),
            (None, None) => return Err(JwtConfigError::Empty.into()),
        };
        let Some(signature) = settings.jwt_signature_type else {
            return Err(JwtConfigError::NoSignatureType.into());
        };
        let verifier = Arc::new(JwtVerifier::new(signature, source)?);
        let policy = match &settings.authorization_policy_file {
            Some(path) => Some(Arc::new(Policy::from_file(path).await?)),
            None => None,
        };
        Ok(Security {
            auth: AuthPolicy::Jwt(verifier.clone()),
            access: Access(policy),
            jwt: Some(verifier),
        })
    }
}

/// KubeMQ refused the token a connection's call carried: the condition of a local denial,
/// and nothing of KubeMQ's reason (ERR-3).
pub fn refused_by_kubemq() -> AmqpError {
    AmqpError::new(
        Condition::UnauthorizedAccess,
        "KubeMQ refused the connection's credentials or its access",
    )
}

/// The authorization check the bridges make: with no policy everything is allowed (AUTHZ-1).
#[derive(Debug, Clone)]
pub struct Access(Option<Arc<Policy>>);

impl Access {
    /// Allows everything.
    pub fn open() -> Access {
        Access(None)
    }

    /// Checks `client_id` for `action` on `channel` of `pattern`; a denial is audited and
    /// becomes the generic `amqp:unauthorized-access` refusal (AUTHZ-6, ERR-3).
    pub fn check(
        &self,
        client_id: &str,
        pattern: Pattern,
        channel: &str,
        action: Action,
    ) -> Result<(), AmqpError> {
        match &self.0 {
            Some(policy) if !policy.allows(client_id, pattern, channel, action) => {
                audit::denied(client_id, pattern, channel, action);
                crate::failures::FAILURES.authorization_denied();
                Err(AmqpError::new(
                    Condition::UnauthorizedAccess,
                    format!("not authorized for {channel}"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Whether `client_id` may read `channel` of `pattern`, without auditing a refusal: asked
    /// for every event a wildcard subscription brings, against the event's own channel
    /// (AUTHZ-7); the decision cache makes it cheap.
    pub fn may_read(&self, client_id: &str, pattern: Pattern, channel: &str) -> bool {
        self.0
            .as_ref()
            .is_none_or(|policy| policy.allows(client_id, pattern, channel, Action::Read))
    }

    /// Whether a policy is in force (AUTHZ-1).
    pub fn is_enforced(&self) -> bool {
        self.0.is_some()
    }
}

//! SASL authentication: which mechanisms a connection is offered, what a SASL-INIT establishes,
//! and the ClientID rules of SASL-6.
//!
//! The rules are here, in the engine, so they are tested without sockets; the one part that
//! needs key material, checking a KubeMQ JWT, is behind [`TokenVerifier`], which the connector
//! implements.

use std::sync::Arc;
use std::time::Duration;

/// Longest SASL initial response accepted (SASL-8).
pub const MAX_INITIAL_RESPONSE: usize = 16 * 1024;

/// The SASL mechanisms that exist (SASL-10), in the order they are offered (SASL-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// The verified client certificate of an mTLS connection is the credential (SASL-7).
    External,
    /// RFC 4616 `authzid NUL authcid NUL passwd` (SASL-2).
    Plain,
    /// No credential; only with authentication off (SASL-5).
    Anonymous,
}

impl Mechanism {
    /// The name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::External => "EXTERNAL",
            Mechanism::Plain => "PLAIN",
            Mechanism::Anonymous => "ANONYMOUS",
        }
    }

    /// The name in audit events (AUD-4) and on the connections endpoint (OBS-2).
    pub fn audit_name(self) -> &'static str {
        match self {
            Mechanism::External => "external",
            Mechanism::Plain => "plain",
            Mechanism::Anonymous => "anonymous",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Mechanism::External, Mechanism::Plain, Mechanism::Anonymous]
            .into_iter()
            .find(|m| m.name() == name)
    }
}

/// A client's bearer token, forwarded to KubeMQ on the calls made for its connection. Its
/// `Debug` never shows it, so it cannot reach a log line by accident.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Credential(Arc<str>);

impl Credential {
    /// Wraps a token.
    pub fn new(token: &str) -> Self {
        Credential(token.into())
    }

    /// The token itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(redacted)")
    }
}

/// What a verified token says about its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedToken {
    /// The `ClientID` claim, unsanitized.
    pub client_id: String,
    /// How long from now the token stays valid (its `exp`); `None` when it never expires.
    pub valid_for: Option<Duration>,
}

impl From<&str> for VerifiedToken {
    /// A token for `client_id` that never expires.
    fn from(client_id: &str) -> Self {
        VerifiedToken {
            client_id: client_id.into(),
            valid_for: None,
        }
    }
}

/// Checks a KubeMQ JWT and says whose it is and for how long (SASL-3, SASL-13).
pub trait TokenVerifier: Send + Sync {
    /// `Err` says why the token is refused, without the token.
    fn verify(&self, token: &str) -> Result<VerifiedToken, AuthFailure>;
}

/// How clients authenticate.
#[derive(Clone)]
pub enum AuthPolicy {
    /// PLAIN takes any password, ANONYMOUS and the bare header are allowed (SASL-4, SASL-5, SASL-9).
    Disabled,
    /// PLAIN's password must be a JWT the verifier accepts (SASL-3); no ANONYMOUS, no bare header.
    Jwt(Arc<dyn TokenVerifier>),
}

impl std::fmt::Debug for AuthPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AuthPolicy::Disabled => "Disabled",
            AuthPolicy::Jwt(_) => "Jwt",
        })
    }
}

/// The verified certificate a client presented on an mTLS connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    /// The Subject's common name, as in the certificate; empty when it has none.
    pub common_name: String,
}

/// What a successful SASL exchange established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The sanitized ClientID, or `None` when the container-id is to be used (SASL-6).
    pub client_id: Option<String>,
    /// The mechanism that authenticated the client.
    pub mechanism: Mechanism,
    /// The token to present to KubeMQ for this connection (PLAIN with authentication on).
    pub credential: Option<Credential>,
    /// How long the credential stays valid from authentication; `None`: as long as the
    /// connection (SASL-13).
    pub valid_for: Option<Duration>,
}

/// Why authentication failed; kept for logs, never sent to the client (ERR-4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthFailure(pub String);

/// One SASL exchange as the audit log records it (AUD-1, AUD-2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthAttempt {
    /// `plain`, `anonymous` or `external`; another name a client asked for, lower-cased and
    /// sanitized.
    pub mechanism: String,
    /// PLAIN's username, recorded even when it is not the identity (AUD-4).
    pub username: Option<String>,
    /// The identity, or why there is none.
    pub result: Result<Identity, AuthFailure>,
}

impl AuthPolicy {
    /// Mechanisms to offer, in order (SASL-1): EXTERNAL with a verified client certificate
    /// (SASL-7), PLAIN always (SASL-2), ANONYMOUS with authentication off (SASL-5).
    pub fn mechanisms(&self, certificate: Option<&ClientCertificate>) -> Vec<Mechanism> {
        let mut offered = Vec::with_capacity(3);
        if certificate.is_some() {
            offered.push(Mechanism::External);
        }
        offered.push(Mechanism::Plain);
        if matches!(self, AuthPolicy::Disabled) {
            offered.push(Mechanism::Anonymous);
        }
        offered
    }

    /// Whether a connection may skip SASL and start with the bare AMQP header (SASL-9).
    pub fn allows_bare(&self) -> bool {
        matches!(self, AuthPolicy::Disabled)
    }

    /// Runs one SASL-INIT.
    pub fn authenticate(
        &self,
        certificate: Option<&ClientCertificate>,
        mechanism: &str,
        response: &[u8],
    ) -> AuthAttempt {
        let offered =
            Mechanism::from_name(mechanism).filter(|m| self.mechanisms(certificate).contains(m));
        let Some(mech) = offered else {
            return AuthAttempt {
                mechanism: sanitize_client_id(&mechanism.to_ascii_lowercase())
                    .chars()
                    .take(40)
                    .collect(),
                username: None,
                result: Err(AuthFailure(format!(
                    "mechanism {:?} not offered",
                    mechanism.chars().take(40).collect::<String>()
                ))),
            };
        };
        let mut attempt = AuthAttempt {
            mechanism: mech.audit_name().to_string(),
            username: None,
            result: Err(AuthFailure(String::new())),
        };
        if response.len() > MAX_INITIAL_RESPONSE {
            // SASL-8.
            attempt.result = Err(AuthFailure(format!(
                "initial response of {} bytes exceeds 16 KiB",
                response.len()
            )));
            return attempt;
        }
        attempt.result = match mech {
            Mechanism::Anonymous => Ok(Identity {
                client_id: None,
                mechanism: mech,
                credential: None,
                valid_for: None,
            }),
            Mechanism::External => external(certificate, response),
            Mechanism::Plain => match parse_plain(response) {
                Err(e) => Err(e),
                Ok(plain) => {
                    attempt.username = Some(recorded_username(plain.authcid));
                    self.plain(&plain)
                }
            },
        };
        attempt
    }

    fn plain(&self, plain: &Plain<'_>) -> Result<Identity, AuthFailure> {
        match self {
            AuthPolicy::Disabled => {
                let id = sanitize_client_id(plain.authcid);
                Ok(Identity {
                    client_id: (!id.is_empty()).then_some(id),
                    mechanism: Mechanism::Plain,
                    credential: None,
                    valid_for: None,
                })
            }
            AuthPolicy::Jwt(verifier) => {
                let token = verifier.verify(plain.passwd)?;
                let id = sanitize_client_id(&token.client_id);
                if id.is_empty() {
                    return Err(AuthFailure("token has an empty ClientID claim".into()));
                }
                Ok(Identity {
                    client_id: Some(id),
                    mechanism: Mechanism::Plain,
                    credential: Some(Credential::new(plain.passwd)),
                    valid_for: token.valid_for,
                })
            }
        }
    }
}

/// Longest username recorded (AUD-4).
const MAX_RECORDED_USERNAME: usize = 256;

/// PLAIN's username as the audit log records it (AUD-4): a client that puts its JWT in the
/// username slot as well (or instead) must not have it written to the log, so a username shaped
/// like a JWT (three base64url parts, the first the start of a JSON object) is recorded as
/// `[token]`; any other is cut to 256 characters.
pub fn recorded_username(username: &str) -> String {
    let parts: Vec<&str> = username.split('.').collect();
    let base64url = |p: &&str| {
        p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'=')
    };
    let jwt_shaped = parts.len() == 3
        && parts.first().is_some_and(|h| h.starts_with("eyJ"))
        && parts.iter().all(base64url);
    if jwt_shaped {
        return "[token]".into();
    }
    username.chars().take(MAX_RECORDED_USERNAME).collect()
}

/// EXTERNAL (SASL-7): the certificate's CN is the identity. The initial response, if any, is an
/// authorization identity, which may only repeat the CN.
fn external(
    certificate: Option<&ClientCertificate>,
    response: &[u8],
) -> Result<Identity, AuthFailure> {
    let Some(cert) = certificate else {
        return Err(AuthFailure("EXTERNAL without a client certificate".into()));
    };
    let id = sanitize_client_id(&cert.common_name);
    if id.is_empty() {
        return Err(AuthFailure("client certificate has no common name".into()));
    }
    if !response.is_empty() && response != cert.common_name.as_bytes() {
        return Err(AuthFailure(
            "EXTERNAL authorization identity differs from the certificate's common name".into(),
        ));
    }
    Ok(Identity {
        client_id: Some(id),
        mechanism: Mechanism::External,
        credential: None,
        valid_for: None,
    })
}

/// The fields of a PLAIN response that count; the authorization identity is ignored
/// (docs/decisions.md).
#[derive(Debug)]
pub struct Plain<'a> {
    /// The username.
    pub authcid: &'a str,
    /// The password: a JWT with authentication on.
    pub passwd: &'a str,
}

/// Splits an RFC 4616 PLAIN response `authzid NUL authcid NUL passwd`.
pub fn parse_plain(response: &[u8]) -> Result<Plain<'_>, AuthFailure> {
    let mut parts = response.split(|b| *b == 0);
    let (Some(a), Some(c), Some(p), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(AuthFailure(
            "PLAIN response is not authzid NUL authcid NUL passwd".into(),
        ));
    };
    let utf8 =
        |s| std::str::from_utf8(s).map_err(|_| AuthFailure("PLAIN response is not UTF-8".into()));
    utf8(a)?;
    Ok(Plain {
        authcid: utf8(c)?,
        passwd: utf8(p)?,
    })
}

/// Maps every character outside `[A-Za-z0-9_-]` to `_` and cuts to 256 characters (CONN-6, SASL-6).
pub fn sanitize_client_id(raw: &str) -> String {
    sanitize_id(raw, 256)
}

/// Maps every character outside `[A-Za-z0-9_-]` to `_` and keeps the first `max_chars`
/// characters: a string KubeMQ takes as a ClientID.
pub fn sanitize_id(raw: &str, max_chars: usize) -> String {
    raw.chars()
        .take(max_chars)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl TokenVerifier for Fixed {
        fn verify(&self, token: &str) -> Result<VerifiedToken, AuthFailure> {
            match token {
                "good" => Ok("svc.a".into()),
                "blank" => Ok("".into()),
                _ => Err(AuthFailure("bad signature".into())),
            }
        }
    }

    fn jwt() -> AuthPolicy {
        AuthPolicy::Jwt(Arc::new(Fixed))
    }

    fn cert(cn: &str) -> ClientCertificate {
        ClientCertificate {
            common_name: cn.into(),
        }
    }

    fn names(m: Vec<Mechanism>) -> Vec<&'static str> {
        m.into_iter().map(Mechanism::name).collect()
    }

    /// CONN-6 / SASL-6: sanitization maps and truncates.
    #[test]
    fn conn_6_sanitize() {
        assert_eq!(sanitize_client_id("my app/1.0 é"), "my_app_1_0__");
        assert_eq!(sanitize_client_id(&"x".repeat(300)).len(), 256);
    }

    /// SASL-1, SASL-2, SASL-5, SASL-7: the offer in its fixed order, per authentication and TLS
    /// state.
    #[test]
    fn sasl_1_offer_order() {
        let c = cert("a");
        assert_eq!(
            names(AuthPolicy::Disabled.mechanisms(None)),
            ["PLAIN", "ANONYMOUS"]
        );
        assert_eq!(
            names(AuthPolicy::Disabled.mechanisms(Some(&c))),
            ["EXTERNAL", "PLAIN", "ANONYMOUS"]
        );
        assert_eq!(names(jwt().mechanisms(None)), ["PLAIN"]);
        assert_eq!(names(jwt().mechanisms(Some(&c))), ["EXTERNAL", "PLAIN"]);
    }

    /// SASL-4: with auth off, PLAIN takes any password and the identity is the sanitized username.
    #[test]
    fn sasl_4_plain_any_password() {
        let a = AuthPolicy::Disabled.authenticate(None, "PLAIN", b"\0alice.b\0whatever");
        let id = a.result.unwrap();
        assert_eq!(id.client_id.as_deref(), Some("alice_b"));
        assert_eq!(id.credential, None);
        assert_eq!(a.username.as_deref(), Some("alice.b"));
        let a = AuthPolicy::Disabled.authenticate(None, "PLAIN", b"\0\0pw");
        assert_eq!(a.result.unwrap().client_id, None);
        assert!(AuthPolicy::Disabled
            .authenticate(None, "PLAIN", b"no-nuls")
            .result
            .is_err());
    }

    /// SASL-3, SASL-6 (1): with auth on, the identity is the token's ClientID claim, not the
    /// username; the token is kept to be forwarded; a refused token fails.
    #[test]
    fn sasl_3_plain_jwt() {
        let a = jwt().authenticate(None, "PLAIN", b"\0bob\0good");
        assert_eq!(a.username.as_deref(), Some("bob"));
        let id = a.result.unwrap();
        assert_eq!(id.client_id.as_deref(), Some("svc_a"));
        assert_eq!(id.credential.unwrap().expose(), "good");
        let a = jwt().authenticate(None, "PLAIN", b"\0bob\0forged");
        assert_eq!(a.result.unwrap_err().0, "bad signature");
        assert_eq!(a.username.as_deref(), Some("bob"));
        assert!(jwt()
            .authenticate(None, "PLAIN", b"\0bob\0blank")
            .result
            .is_err());
    }

    /// AUD-4: a username shaped like a JWT is recorded as `[token]`, a long one cut to 256
    /// characters; an ordinary one as it is.
    #[test]
    fn aud_4_a_token_in_the_username_is_not_recorded() {
        let token = "eyJhbGciOiJIUzI1NiJ9.eyJDbGllbnRJRCI6ImEifQ.c2lnbmF0dXJl";
        let mut response = b"\0".to_vec();
        response.extend_from_slice(token.as_bytes());
        response.extend_from_slice(b"\0good");
        let a = jwt().authenticate(None, "PLAIN", &response);
        assert_eq!(a.username.as_deref(), Some("[token]"));
        assert_eq!(recorded_username(&"x".repeat(1000)).len(), 256);
        assert_eq!(recorded_username("alice.b"), "alice.b");
        assert_eq!(recorded_username("svc.orders.eu"), "svc.orders.eu");
    }

    /// SASL-5: ANONYMOUS is refused with authentication on (not offered); SASL-10: nothing else.
    #[test]
    fn sasl_5_anonymous_only_without_auth() {
        let a = jwt().authenticate(None, "ANONYMOUS", b"");
        assert!(a.result.is_err());
        assert_eq!(a.mechanism, "anonymous");
        let a = AuthPolicy::Disabled.authenticate(None, "ANONYMOUS", b"x");
        assert_eq!(a.result.unwrap().mechanism, Mechanism::Anonymous);
        let a = AuthPolicy::Disabled.authenticate(None, "SCRAM-SHA-256", b"");
        assert!(a.result.is_err());
        assert_eq!(a.mechanism, "scram-sha-256");
    }

    /// SASL-7, SASL-6 (3): EXTERNAL only with a certificate; the identity is its sanitized CN;
    /// an empty CN fails; an authorization identity may only repeat the CN.
    #[test]
    fn sasl_7_external() {
        let c = cert("orders svc");
        for policy in [AuthPolicy::Disabled, jwt()] {
            assert!(policy.authenticate(None, "EXTERNAL", b"").result.is_err());
            let id = policy
                .authenticate(Some(&c), "EXTERNAL", b"")
                .result
                .unwrap();
            assert_eq!(id.client_id.as_deref(), Some("orders_svc"));
            assert_eq!(id.mechanism, Mechanism::External);
            assert!(policy
                .authenticate(Some(&c), "EXTERNAL", b"orders svc")
                .result
                .is_ok());
            assert!(policy
                .authenticate(Some(&c), "EXTERNAL", b"admin")
                .result
                .is_err());
            assert!(policy
                .authenticate(Some(&cert("")), "EXTERNAL", b"")
                .result
                .is_err());
        }
    }

    /// SASL-8: an initial response over 16 KiB fails whatever it holds.
    #[test]
    fn sasl_8_response_cap() {
        let mut big = b"\0u\0".to_vec();
        big.resize(MAX_INITIAL_RESPONSE + 1, b'a');
        assert!(AuthPolicy::Disabled
            .authenticate(None, "PLAIN", &big)
            .result
            .is_err());
        big.truncate(MAX_INITIAL_RESPONSE);
        assert!(AuthPolicy::Disabled
            .authenticate(None, "PLAIN", &big)
            .result
            .is_ok());
    }

    /// SASL-9: the bare header only with authentication off.
    #[test]
    fn sasl_9_bare_header() {
        assert!(AuthPolicy::Disabled.allows_bare());
        assert!(!jwt().allows_bare());
    }

    /// SASL-3: a token never shows in a Debug rendering.
    #[test]
    fn sasl_3_credential_redacted() {
        let c = Credential::new("eyJsecret");
        assert!(!format!("{c:?}").contains("eyJ"));
    }
}

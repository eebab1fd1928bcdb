//! SASL authentication behind a small trait, and the ClientID rules of SASL-6.
//!
//! The engine asks an [`Authenticator`] which mechanisms to offer and whether a SASL-INIT
//! succeeds. [`NoAuth`] is the authentication-disabled mode (SASL-4, SASL-5, SASL-9); JWT
//! validation against KubeMQ comes with a later issue behind the same trait.

/// Longest SASL initial response accepted (SASL-8).
pub const MAX_INITIAL_RESPONSE: usize = 16 * 1024;

/// What a successful SASL exchange established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The sanitized ClientID, or `None` when the container-id is to be used (SASL-6).
    pub client_id: Option<String>,
    /// The mechanism that authenticated the client.
    pub mechanism: &'static str,
}

/// Why authentication failed; kept for logs, never sent to the client (ERR-4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthFailure(pub String);

/// Decides SASL mechanisms and outcomes for the engine.
pub trait Authenticator: Send + Sync {
    /// Mechanisms to offer, in order (SASL-1).
    fn mechanisms(&self, tls: bool) -> Vec<&'static str>;
    /// Checks one SASL-INIT; `response` is at most [`MAX_INITIAL_RESPONSE`] bytes.
    fn authenticate(&self, mechanism: &str, response: &[u8]) -> Result<Identity, AuthFailure>;
    /// Whether a connection may skip SASL and start with the bare AMQP header (SASL-9).
    fn allows_bare(&self) -> bool;
}

/// Authentication disabled: PLAIN accepts any password, ANONYMOUS is offered, bare is allowed.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoAuth;

impl Authenticator for NoAuth {
    fn mechanisms(&self, _tls: bool) -> Vec<&'static str> {
        vec!["PLAIN", "ANONYMOUS"]
    }

    fn authenticate(&self, mechanism: &str, response: &[u8]) -> Result<Identity, AuthFailure> {
        match mechanism {
            "ANONYMOUS" => Ok(Identity {
                client_id: None,
                mechanism: "ANONYMOUS",
            }),
            "PLAIN" => {
                let (_authzid, authcid, _passwd) = parse_plain(response)?;
                let id = sanitize_client_id(authcid);
                Ok(Identity {
                    client_id: (!id.is_empty()).then_some(id),
                    mechanism: "PLAIN",
                })
            }
            other => Err(AuthFailure(format!("mechanism {other:?} not offered"))),
        }
    }

    fn allows_bare(&self) -> bool {
        true
    }
}

/// Splits an RFC 4616 PLAIN response `authzid NUL authcid NUL passwd`.
pub fn parse_plain(response: &[u8]) -> Result<(&str, &str, &str), AuthFailure> {
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
    Ok((utf8(a)?, utf8(c)?, utf8(p)?))
}

/// Maps every character outside `[A-Za-z0-9_-]` to `_` and cuts to 256 characters (CONN-6, SASL-6).
pub fn sanitize_client_id(raw: &str) -> String {
    raw.chars()
        .take(256)
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

    /// CONN-6 / SASL-6: sanitization maps and truncates.
    #[test]
    fn conn_6_sanitize() {
        assert_eq!(sanitize_client_id("my app/1.0 é"), "my_app_1_0__");
        assert_eq!(sanitize_client_id(&"x".repeat(300)).len(), 256);
    }

    /// SASL-4: with auth off, PLAIN takes any password and the identity is the sanitized username.
    #[test]
    fn sasl_4_plain_any_password() {
        let id = NoAuth
            .authenticate("PLAIN", b"\0alice.b\0whatever")
            .unwrap();
        assert_eq!(id.client_id.as_deref(), Some("alice_b"));
        let id = NoAuth.authenticate("PLAIN", b"\0\0pw").unwrap();
        assert_eq!(id.client_id, None);
        assert!(NoAuth.authenticate("PLAIN", b"no-nuls").is_err());
        assert!(NoAuth.authenticate("SCRAM-SHA-256", b"").is_err());
    }
}

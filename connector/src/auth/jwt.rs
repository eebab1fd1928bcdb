//! Checks KubeMQ JWTs as KubeMQ's `authentication.jwtConfig` does: one key, one signature type,
//! the registered time claims (`exp`, `nbf`, `iat`) enforced when present, with no leeway; and
//! reads the `ClientID` claim that names the connection (SASL-3). A time claim that is present
//! but not a number is refused, and `exp` sets how long the connection may live (SASL-13).

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use crate::engine::{AuthFailure, TokenVerifier, VerifiedToken};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

pub use ops::vocabulary::SignatureType;

/// The JWT library's algorithm for a signature type.
fn algorithm(t: SignatureType) -> Algorithm {
    match t {
        SignatureType::HS256 => Algorithm::HS256,
        SignatureType::HS384 => Algorithm::HS384,
        SignatureType::HS512 => Algorithm::HS512,
        SignatureType::RS256 => Algorithm::RS256,
        SignatureType::RS384 => Algorithm::RS384,
        SignatureType::RS512 => Algorithm::RS512,
        SignatureType::ES256 => Algorithm::ES256,
        SignatureType::ES384 => Algorithm::ES384,
    }
}

/// Where the verification key comes from.
#[derive(Debug, Clone, Copy)]
pub enum KeySource<'a> {
    /// Given inline (`JwtKey`).
    Inline(&'a str),
    /// A file (`JwtKeyFile`), read once at start-up.
    File(&'a Path),
}

/// Why the JWT settings cannot be used. Never contains key material.
#[derive(Debug, thiserror::Error)]
pub enum JwtConfigError {
    /// The key file cannot be read.
    #[error("cannot read JwtKeyFile {path}: {error}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// The key is not a PEM public key (or certificate) of the signature type's kind.
    #[error("the JWT key is not a PEM {kind} public key or certificate")]
    Pem {
        /// RSA or EC.
        kind: &'static str,
    },
    /// An empty key, or none given.
    #[error("the JWT key is empty")]
    Empty,
    /// No signature type given.
    #[error("JwtSignatureType is not set")]
    NoSignatureType,
}

/// Verifies KubeMQ JWTs with one key.
pub struct JwtVerifier {
    key: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of every rendering.
        f.debug_struct("JwtVerifier")
            .field("algorithms", &self.validation.algorithms)
            .finish_non_exhaustive()
    }
}

/// What a token's signature and claims allow.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// The `ClientID` claim, if there is one.
    pub client_id: Option<String>,
    /// Time left until `exp`; `None` without one.
    pub valid_for: Option<Duration>,
}

impl JwtVerifier {
    /// A verifier for `signature` with the key from `source`.
    pub fn new(signature: SignatureType, source: KeySource<'_>) -> Result<Self, JwtConfigError> {
        let bytes = match source {
            KeySource::Inline(k) => k.as_bytes().to_vec(),
            KeySource::File(path) => std::fs::read(path).map_err(|error| JwtConfigError::Read {
                path: path.display().to_string(),
                error,
            })?,
        };
        if bytes.is_empty() {
            return Err(JwtConfigError::Empty);
        }
        let key = match signature {
            // KubeMQ takes the secret's bytes as they are, a file's final newline included.
            SignatureType::HS256 | SignatureType::HS384 | SignatureType::HS512 => {
                DecodingKey::from_secret(&bytes)
            }
            SignatureType::RS256 | SignatureType::RS384 | SignatureType::RS512 => {
                DecodingKey::from_rsa_pem(&bytes)
                    .map_err(|_| JwtConfigError::Pem { kind: "RSA" })?
            }
            SignatureType::ES256 | SignatureType::ES384 => {
                DecodingKey::from_ec_pem(&bytes).map_err(|_| JwtConfigError::Pem { kind: "EC" })?
            }
        };
        let mut validation = Validation::new(algorithm(signature));
        // KubeMQ requires no claim, checks exp and nbf when present, with no leeway, and does
        // not look at aud. The time claims are checked here by `check`, which also refuses
        // one that is not a number (the library would let it pass as absent).
        validation.required_spec_claims = HashSet::new();
        validation.leeway = 0;
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        Ok(JwtVerifier { key, validation })
    }
}

impl JwtVerifier {
    /// Checks `token` as KubeMQ does, which needs no `ClientID` claim; returns the claim if
    /// there is one, and how long the token stays valid.
    pub fn check(&self, token: &str) -> Result<Checked, AuthFailure> {
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token,
            &self.key,
            &self.validation,
        )
        .map_err(|e| AuthFailure(reason(e.kind()).into()))?;
        let claims = data.claims;
        let time = |name: &'static str| -> Result<Option<f64>, AuthFailure> {
            match claims.get(name) {
                None => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| AuthFailure(format!("token claim {name} is not a number"))),
            }
        };
        let (exp, nbf, iat) = (time("exp")?, time("nbf")?, time("iat")?);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        if exp.is_some_and(|exp| exp < now) {
            return Err(AuthFailure("token expired".into()));
        }
        if nbf.is_some_and(|nbf| nbf > now) {
            return Err(AuthFailure("token not valid yet (nbf)".into()));
        }
        if iat.is_some_and(|iat| iat > now) {
            return Err(AuthFailure("token used before it was issued".into()));
        }
        let client_id = match claims.get("ClientID") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(id)) => Some(id.clone()),
            Some(_) => return Err(AuthFailure("token claims are not valid JSON".into())),
        };
        // A lifetime too long for a Duration is one that never ends.
        let valid_for = exp.and_then(|exp| Duration::try_from_secs_f64(exp - now).ok());
        Ok(Checked {
            client_id,
            valid_for,
        })
    }
}

impl TokenVerifier for JwtVerifier {
    /// A connection needs the claim: it is the ClientID its links are authorized as.
    fn verify(&self, token: &str) -> Result<VerifiedToken, AuthFailure> {
        let checked = self.check(token)?;
        let client_id = checked
            .client_id
            .ok_or_else(|| AuthFailure("token has no ClientID claim".into()))?;
        Ok(VerifiedToken {
            client_id,
            valid_for: checked.valid_for,
        })
    }
}

/// Why a token was refused, in words that never quote it.
fn reason(kind: &ErrorKind) -> &'static str {
    match kind {
        ErrorKind::ExpiredSignature => "token expired",
        ErrorKind::ImmatureSignature => "token not valid yet (nbf)",
        ErrorKind::InvalidSignature => "token signature is invalid",
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
            "token is signed with another algorithm"
        }
        ErrorKind::InvalidToken | ErrorKind::Base64(_) | ErrorKind::Utf8(_) => "token is not a JWT",
        ErrorKind::Json(_) => "token claims are not valid JSON",
        _ => "token is invalid",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    fn hs(claims: serde_json::Value, secret: &[u8]) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret),
        )
        .unwrap()
    }

    fn verifier() -> JwtVerifier {
        JwtVerifier::new(SignatureType::HS256, KeySource::Inline("s3cret")).unwrap()
    }

    /// SASL-3: a good token gives its ClientID claim; bad signature, expired, not yet valid,
    /// issued in the future, malformed, another algorithm and a missing claim all fail, and no
    /// reason quotes the token.
    #[test]
    fn sasl_3_token_checks() {
        let v = verifier();
        let good = hs(
            serde_json::json!({"ClientID": "orders", "exp": now() + 60}),
            b"s3cret",
        );
        assert_eq!(v.verify(&good).unwrap().client_id, "orders");
        // KubeMQ's own tests sign tokens without any time claim.
        let bare = hs(serde_json::json!({"ClientID": "orders"}), b"s3cret");
        assert_eq!(v.verify(&bare).unwrap().client_id, "orders");
        let cases = [
            (
                hs(serde_json::json!({"ClientID": "x"}), b"other"),
                "token signature is invalid",
            ),
            (
                hs(
                    serde_json::json!({"ClientID": "x", "exp": now() - 1}),
                    b"s3cret",
                ),
                "token expired",
            ),
            (
                hs(
                    serde_json::json!({"ClientID": "x", "nbf": now() + 60}),
                    b"s3cret",
                ),
                "token not valid yet (nbf)",
            ),
            (
                hs(
                    serde_json::json!({"ClientID": "x", "iat": now() + 60}),
                    b"s3cret",
                ),
                "token used before it was issued",
            ),
            (
                hs(serde_json::json!({"exp": now() + 60}), b"s3cret"),
                "token has no ClientID claim",
            ),
            ("not.a.jwt".to_string(), "token is not a JWT"),
            ("eyJhbGciOiJIUzI1NiJ9".to_string(), "token is not a JWT"),
            (
                encode(
                    &Header::new(Algorithm::HS384),
                    &serde_json::json!({"ClientID": "x"}),
                    &EncodingKey::from_secret(b"s3cret"),
                )
                .unwrap(),
                "token is signed with another algorithm",
            ),
        ];
        for (token, want) in cases {
            let got = v.verify(&token).unwrap_err().0;
            assert_eq!(got, want, "{token}");
            assert!(!got.contains(&token));
        }
    }

    /// SASL-13: a time claim that is there but not a number is refused (not taken as absent);
    /// a number in the past is expired; a token's lifetime is the time left until its `exp`.
    #[test]
    fn sasl_13_time_claims_must_be_numbers() {
        let v = verifier();
        for claim in ["exp", "nbf", "iat"] {
            for value in [
                serde_json::json!("0"),
                serde_json::json!(true),
                serde_json::Value::Null,
            ] {
                let token = hs(
                    serde_json::json!({"ClientID": "x", claim: value.clone()}),
                    b"s3cret",
                );
                assert_eq!(
                    v.verify(&token).unwrap_err().0,
                    format!("token claim {claim} is not a number"),
                    "{claim}: {value}"
                );
            }
        }
        // An object is not even read as claims.
        let object = hs(
            serde_json::json!({"ClientID": "x", "exp": {"at": 1}}),
            b"s3cret",
        );
        assert!(v.verify(&object).is_err());
        let minus_one = hs(serde_json::json!({"ClientID": "x", "exp": -1}), b"s3cret");
        assert_eq!(v.verify(&minus_one).unwrap_err().0, "token expired");
        let minute = hs(
            serde_json::json!({"ClientID": "x", "exp": now() + 60}),
            b"s3cret",
        );
        let left = v.verify(&minute).unwrap().valid_for.unwrap();
        assert!(
            left <= Duration::from_secs(60) && left > Duration::from_secs(58),
            "{left:?}"
        );
        let forever = hs(serde_json::json!({"ClientID": "x"}), b"s3cret");
        assert_eq!(v.verify(&forever).unwrap().valid_for, None);
    }

    /// SASL-3: the signature type names KubeMQ uses parse (any case); ES512 is refused at
    /// start-up; a PEM key that is not one fails with a message and no key material.
    #[test]
    fn sasl_3_key_settings() {
        assert_eq!("rs256".parse::<SignatureType>(), Ok(SignatureType::RS256));
        assert!("ES512".parse::<SignatureType>().is_err());
        assert!("none".parse::<SignatureType>().is_err());
        let e = JwtVerifier::new(SignatureType::RS256, KeySource::Inline("hunter2"))
            .err()
            .unwrap();
        assert!(!e.to_string().contains("hunter2"));
        assert!(matches!(
            JwtVerifier::new(SignatureType::HS256, KeySource::Inline("")),
            Err(JwtConfigError::Empty)
        ));
    }

    proptest::proptest! {
        /// SASL-3: whatever a client sends as its password — arbitrary text, or a good token
        /// with bytes changed — the check answers without panicking, and only the unchanged
        /// token passes.
        #[test]
        fn sasl_3_any_password_is_answered(
            text in ".{0,300}",
            edits in proptest::collection::vec((proptest::prelude::any::<usize>(), proptest::prelude::any::<u8>()), 1..4),
        ) {
            let v = verifier();
            let _ = v.verify(&text);
            let good = hs(serde_json::json!({"ClientID": "orders"}), b"s3cret");
            let mut bytes = good.clone().into_bytes();
            for (at, b) in edits {
                let i = at % bytes.len();
                bytes[i] = b;
            }
            let mutated = String::from_utf8_lossy(&bytes).into_owned();
            let r = v.verify(&mutated);
            if mutated != good {
                // A change may decode to the same bytes (base64 padding bits); otherwise it fails.
                proptest::prop_assert!(r.is_err() || r.map(|t| t.client_id).as_deref() == Ok("orders"));
            }
        }
    }
}

//! The words of the connector's settings that the operator writes and the connector reads,
//! declared once for both: KubeMQ's patterns (`DefaultPattern`) and the JWT signature types
//! (`JwtSignatureType`). With the `schema` feature each also describes itself for the CRD.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The five KubeMQ patterns, named as in addresses (`events-store/orders`) and settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Queues.
    Queues,
    /// Events.
    Events,
    /// Events-Store.
    EventsStore,
    /// Commands.
    Commands,
    /// Queries.
    Queries,
}

impl Pattern {
    /// Every pattern, in the order they are listed to users.
    pub const ALL: [Pattern; 5] = [
        Pattern::Queues,
        Pattern::Events,
        Pattern::EventsStore,
        Pattern::Commands,
        Pattern::Queries,
    ];

    /// The pattern's name as in addresses.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Queues => "queues",
            Pattern::Events => "events",
            Pattern::EventsStore => "events-store",
            Pattern::Commands => "commands",
            Pattern::Queries => "queries",
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Pattern {
    type Err = String;

    fn from_str(v: &str) -> Result<Self, String> {
        Pattern::ALL
            .into_iter()
            .find(|p| p.name() == v)
            .ok_or_else(|| {
                let names: Vec<&str> = Pattern::ALL.iter().map(|p| p.name()).collect();
                format!("must be one of {}, got {v:?}", names.join(", "))
            })
    }
}

/// The JWT signature types KubeMQ accepts (its `jwtConfig.signatureType`) that the connector
/// verifies; ES512 has no implementation in the connector's JWT library, so it is refused when
/// the setting is read rather than failing every login.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[allow(clippy::upper_case_acronyms)]
pub enum SignatureType {
    /// HMAC with SHA-256; the key is the shared secret, byte for byte.
    HS256,
    /// HMAC with SHA-384.
    HS384,
    /// HMAC with SHA-512.
    HS512,
    /// RSA PKCS#1 v1.5 with SHA-256; the key is a PEM public key or certificate.
    RS256,
    /// RSA with SHA-384.
    RS384,
    /// RSA with SHA-512.
    RS512,
    /// ECDSA P-256; the key is a PEM public key or certificate.
    ES256,
    /// ECDSA P-384.
    ES384,
}

impl FromStr for SignatureType {
    type Err = String;

    fn from_str(v: &str) -> Result<Self, String> {
        // KubeMQ upper-cases the configured name.
        Ok(match v.to_ascii_uppercase().as_str() {
            "HS256" => SignatureType::HS256,
            "HS384" => SignatureType::HS384,
            "HS512" => SignatureType::HS512,
            "RS256" => SignatureType::RS256,
            "RS384" => SignatureType::RS384,
            "RS512" => SignatureType::RS512,
            "ES256" => SignatureType::ES256,
            "ES384" => SignatureType::ES384,
            "ES512" => return Err("ES512 is not supported; use ES256 or ES384".into()),
            _ => {
                return Err(format!(
                "must be one of HS256, HS384, HS512, RS256, RS384, RS512, ES256, ES384, got {v:?}"
            ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CFG-10: a pattern reads back from the name it writes, in settings and in YAML alike.
    #[test]
    fn patterns_read_back_from_their_names() {
        for p in Pattern::ALL {
            assert_eq!(p.name().parse::<Pattern>(), Ok(p));
            let yaml = serde_json::to_string(&p).expect("serializes");
            assert_eq!(yaml, format!("\"{}\"", p.name()));
        }
        assert!("Queues".parse::<Pattern>().is_err());
    }

    /// A signature type is read whatever its case, as KubeMQ reads it, and written as the CRD
    /// spells it.
    #[test]
    fn signature_types_read_in_any_case() {
        assert_eq!("hs256".parse(), Ok(SignatureType::HS256));
        assert_eq!("ES384".parse(), Ok(SignatureType::ES384));
        assert!("ES512".parse::<SignatureType>().is_err());
        let json = serde_json::to_string(&SignatureType::RS512).expect("serializes");
        assert_eq!(json, "\"RS512\"");
    }
}

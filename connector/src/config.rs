//! The connector's settings (CFG-1 … CFG-14 and the connector's own), each declared once in
//! `settings!` below, read from a YAML file, `CONNECTORS_AMQP10_*` environment variables and
//! command-line flags, in rising precedence, and validated with every problem reported at once
//! (CFG-19).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::engine::{AuthPolicy, EngineConfig, ProcessBudget};
use crate::pattern::Pattern;
pub use ops::logs::LogFormat;
use ops::vocabulary::SignatureType;

/// Declares every setting once: its key (the YAML name, from which the environment variable and
/// the flag are derived), its field, type, default and parser. Generates [`Settings`], its
/// `Default`, the [`SETTINGS`] table and the per-value parsing; `(secret)` keeps a value out of
/// `--print-config`.
macro_rules! settings {
    (@hidden) => { false };
    (@hidden secret) => { true };
    ($(
        $(#[doc = $doc:literal])+
        $key:ident $(($hidden:ident))? => $field:ident: $ty:ty = $default:expr, $parse:expr;
    )+) => {
        /// Validated settings.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct Settings {
            $($(#[doc = $doc])+ pub $field: $ty,)+
        }

        impl Default for Settings {
            fn default() -> Self {
                Settings { $($field: $default,)+ }
            }
        }

        /// Every setting, in the order of the README's table.
        pub const SETTINGS: &[Setting] = &[$(Setting {
            key: stringify!($key),
            help: concat!($($doc),+),
            secret: settings!(@hidden $($hidden)?),
        },)+];

        impl Settings {
            /// Parses each value `get` has over the current one; a bad value leaves the field
            /// as it was and adds its problem to `errors`.
            fn parse_values(
                &mut self,
                get: impl Fn(&str) -> Option<String>,
                errors: &mut Vec<String>,
            ) {
                $(if let Some(v) = get(stringify!($key)) {
                    let parser: fn(&str) -> Result<$ty, String> = $parse;
                    match parser(&v) {
                        Ok(value) => self.$field = value,
                        Err(e) => errors.push(format!("{} {e}", stringify!($key))),
                    }
                })+
            }
        }

        /// `--print-config`: every setting by key, secrets left out.
        impl Serialize for Settings {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut map = serializer.serialize_map(None)?;
                $(if !settings!(@hidden $($hidden)?) {
                    map.serialize_entry(stringify!($key), &self.$field)?;
                })+
                map.end()
            }
        }
    };
}

settings! {
    /// `false` binds no listener and skips every other check.
    Enable => enable: bool = true, parse::boolean; // CFG-1, CFG-18
    /// Plain AMQP listener port; 0 disables it.
    Port => port: u16 = 5672, |v| parse::int(v, 0, 65535); // CFG-2
    /// TLS listener port; 0 disables it; binds only when TLS is configured.
    TlsPort => tls_port: u16 = 5671, |v| parse::int(v, 0, 65535); // CFG-3
    /// Upper bound of the negotiated frame size, at least 512.
    MaxFrameSize => max_frame_size: u32 = 131_072, |v| parse::int(v, 512, parse::U32); // CFG-4
    /// Largest message in bytes, advertised as the links' max-message-size.
    MaxMessageSize => max_message_size: u64 = 104_857_600,
        |v| parse::int(v, 1, parse::I64); // CFG-5
    /// Sessions per connection.
    SessionMax => session_max: u32 = 256, |v| parse::int(v, 1, 65535); // CFG-6
    /// Links per session.
    MaxLinksPerSession => max_links_per_session: u32 = 256,
        |v| parse::int(v, 1, parse::U32); // CFG-7
    /// Connections per connector process; 0 = unlimited.
    MaxConnections => max_connections: u32 = 1000, |v| parse::int(v, 0, parse::U32); // CFG-8
    /// Inbound idle limit in seconds; 0 disables it. Its half in milliseconds is
    /// advertised as an AMQP uint, which bounds it.
    IdleTimeoutSeconds => idle_timeout_seconds: u32 = 120,
        |v| parse::int(v, 0, parse::U32 * 2 / 1000); // CFG-9, OP-CFG-4
    /// Pattern of addresses without a prefix.
    DefaultPattern => default_pattern: Pattern = Pattern::Queues, |v| v.parse(); // CFG-10
    /// Ceiling on MaxItems of one queue Get, 1–1024.
    GetBatchSize => get_batch_size: u32 = 32, |v| parse::int(v, 1, 1024); // CFG-11
    /// Unsettled deliveries per consume link, and the produce credit window.
    MaxUnsettledPerLink => max_unsettled_per_link: u32 = 1024,
        |v| parse::int(v, 1, parse::U32); // CFG-12
    /// RPC timeout in seconds for requests without a ttl.
    DefaultRpcTimeoutSeconds => default_rpc_timeout_seconds: u32 = 30,
        |v| parse::int(v, 1, parse::U32); // CFG-13
    /// Pending RPCs per connection.
    RpcMaxPending => rpc_max_pending: u32 = 512, |v| parse::int(v, 1, parse::U32); // CFG-14
    /// Address the listeners bind to.
    BindAddress => bind_address: IpAddr = IpAddr::from([0, 0, 0, 0]), parse::ip;
    /// Folder of the embedded store.
    DataDir => data_dir: PathBuf = PathBuf::from("data"), parse::folder;
    /// KubeMQ's gRPC `host:port`; unset uses the embedded store.
    KubemqAddress => kubemq_address: Option<String> = None, parse::optional_text;
    /// Token sent to KubeMQ as `authorization` metadata; never printed.
    KubemqToken(secret) => kubemq_token: Option<String> = None, parse::token;
    /// Where to serve the embedded store as KubeMQ's gRPC API (`ip:port`); unset serves nothing.
    ServeKubemqGrpc => serve_kubemq_grpc: Option<SocketAddr> = None, parse::grpc_address;
    /// Where `/metrics`, `/livez` and `/readyz` are served (`ip:port`, or `off`).
    HttpAddress => http_address: Option<SocketAddr> =
        Some(SocketAddr::from(([0, 0, 0, 0], 9090))), parse::http_address;
    /// Bytes one connection may make the connector hold (partial and unconfirmed deliveries,
    /// transfers waiting for the client's window, dynamic-node mailboxes).
    MaxConnectionMemory => max_connection_memory: u64 = 256 * 1024 * 1024,
        |v| parse::int(v, 1, parse::I64);
    /// Bytes all connections together may hold beyond each one's guaranteed 256 KiB, with 16
    /// KiB for each live link; unset: half the container's memory limit, or 1 GiB without one.
    MaxProcessMemory => max_process_memory: Option<u64> = None,
        |v| if v.is_empty() {
            Ok(None)
        } else {
            parse::int(v, i128::from(MIN_PROCESS_MEMORY), parse::I64).map(Some)
        };
    /// Seconds from accept until the client's OPEN (SASL included); a slower client is dropped.
    HandshakeTimeoutSeconds => handshake_timeout_seconds: u32 = 5, |v| parse::int(v, 1, 3600);
    /// Log line format: text or json.
    LogFormat => log_format: LogFormat = LogFormat::Text, |v| v.parse();
    /// PEM certificate chain of the TLS listener (leaf first); with `TlsKeyFile` it turns the
    /// TLS listener on. Re-read when the file changes.
    TlsCertFile => tls_cert_file: Option<PathBuf> = None, parse::optional_path;
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `TlsCertFile`'s certificate.
    TlsKeyFile => tls_key_file: Option<PathBuf> = None, parse::optional_path;
    /// `tls`: clients authenticate with SASL; `mtls`: they must also present a certificate that
    /// `TlsClientCaFile` verifies.
    TlsMode => tls_mode: TlsMode = TlsMode::Tls, |v| v.parse();
    /// PEM bundle of the CAs that sign client certificates (mtls).
    TlsClientCaFile => tls_client_ca_file: Option<PathBuf> = None, parse::optional_path;
    /// Clients must authenticate: SASL PLAIN with a KubeMQ JWT as the password, or EXTERNAL
    /// with a client certificate on mtls; ANONYMOUS and connections without SASL are refused.
    Authentication => authentication: bool = false, parse::boolean;
    /// Signature type of the JWTs, as KubeMQ's `jwtConfig.signatureType`: HS256, HS384, HS512,
    /// RS256, RS384, RS512, ES256 or ES384.
    JwtSignatureType => jwt_signature_type: Option<SignatureType> = None,
        |v| if v.is_empty() { Ok(None) } else { v.parse().map(Some) };
    /// File holding the JWT verification key: the HMAC secret (its bytes as they are) or a PEM
    /// public key or certificate. Read at start-up.
    JwtKeyFile => jwt_key_file: Option<PathBuf> = None, parse::optional_path;
    /// The JWT verification key itself, instead of `JwtKeyFile`; never printed.
    JwtKey(secret) => jwt_key: Option<String> = None, parse::optional_text;
    /// KubeMQ's access control list (JSON, or base64 of it) deciding Read and Write per
    /// ClientID and channel; with `Authentication`, this or `AuthorizeEveryClient` is required.
    AuthorizationPolicyFile => authorization_policy_file: Option<PathBuf> = None,
        parse::optional_path;
    /// With `Authentication` and no `AuthorizationPolicyFile`: every authenticated client may
    /// read and write every channel. Must be said explicitly, because KubeMQ community v2.4.0
    /// enforces no authorization of its own.
    AuthorizeEveryClient => authorize_every_client: bool = false, parse::boolean;
}

/// The smallest `MaxProcessMemory`: room for 1,024 links' state.
pub const MIN_PROCESS_MEMORY: u64 = 16 * 1024 * 1024;

/// The process budget without `MaxProcessMemory`: half the container's memory `limit`, leaving
/// the other half for the process's baseline, the allocator and what budgets do not count; 1 GiB
/// without a limit.
pub fn default_process_memory(limit: Option<u64>) -> u64 {
    limit.map_or(1 << 30, |l| (l / 2).max(MIN_PROCESS_MEMORY))
}

/// What one live link makes the connector keep, reserved in `MaxProcessMemory` while it lives:
/// the engine's and the bridge's state for it and the Get loop of a queue of its own (about
/// 14 KiB measured, BENCHMARKS.md "Hostile clients").
pub const LINK_STATE_BYTES: u64 = 16 * 1024;

/// What one live session makes the connector keep beyond its links, reserved in
/// `MaxProcessMemory` while it lives (its state is about 0.2 KiB; its maps grow with its links,
/// which reserve their own).
pub const SESSION_STATE_BYTES: u64 = 1024;

/// Whether the TLS listener asks clients for a certificate (TLS-3, TLS-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// Server authentication only; clients authenticate at the SASL layer (TLS-3).
    #[default]
    Tls,
    /// A client certificate verified against `TlsClientCaFile` is required (TLS-4).
    Mtls,
}

impl std::str::FromStr for TlsMode {
    type Err = String;

    fn from_str(v: &str) -> Result<Self, String> {
        match v.to_ascii_lowercase().as_str() {
            "tls" => Ok(TlsMode::Tls),
            "mtls" => Ok(TlsMode::Mtls),
            _ => Err(format!("must be tls or mtls, got {v:?}")),
        }
    }
}

/// The files of the TLS listener, when TLS is configured (TLS-1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// With a CA bundle: client certificates are required and verified by it (mtls).
    pub client_ca: Option<PathBuf>,
}

/// One setting's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The YAML key, e.g. `MaxFrameSize`.
    pub key: &'static str,
    /// What it does, for `--help`.
    pub help: &'static str,
    /// Left out of `--print-config`.
    pub secret: bool,
}

impl Setting {
    /// Its environment variable: `CONNECTORS_AMQP10_` and the key in upper snake case
    /// (CFG-15), e.g. `CONNECTORS_AMQP10_MAX_FRAME_SIZE`.
    pub fn env(&self) -> String {
        format!("CONNECTORS_AMQP10_{}", self.words("_").to_ascii_uppercase())
    }

    /// Its command-line flag without the dashes, the key in kebab case, e.g. `max-frame-size`.
    pub fn flag(&self) -> String {
        self.words("-").to_ascii_lowercase()
    }

    /// The key's words (split before each capital) joined by `sep`.
    fn words(&self, sep: &str) -> String {
        let mut out = String::new();
        for (i, c) in self.key.char_indices() {
            if i > 0 && c.is_ascii_uppercase() {
                out.push_str(sep);
            }
            out.push(c);
        }
        out
    }
}

/// The parsers of setting values: each gets the trimmed text and says what is wrong with it in
/// words that follow the setting's key.
mod parse {
    use std::net::{IpAddr, SocketAddr};
    use std::path::PathBuf;

    /// `u32::MAX`, as a bound.
    pub const U32: i128 = u32::MAX as i128;
    /// `i64::MAX`, as a bound (byte counts must fit a signed 64-bit integer).
    pub const I64: i128 = i64::MAX as i128;

    /// An integer within `[min, max]`.
    pub fn int<T: TryFrom<i128>>(v: &str, min: i128, max: i128) -> Result<T, String> {
        let n = v
            .parse::<i128>()
            .map_err(|_| format!("must be an integer, got {v:?}"))?;
        if n < min || n > max {
            return Err(if max == U32 || max == I64 {
                format!("must be at least {min} (and at most {max}), got {n}")
            } else {
                format!("must be between {min} and {max}, got {n}")
            });
        }
        T::try_from(n).map_err(|_| format!("must be between {min} and {max}, got {n}"))
    }

    /// `true`/`false` (also `1`/`0`, `yes`/`no`).
    pub fn boolean(v: &str) -> Result<bool, String> {
        match v.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" => Ok(false),
            _ => Err(format!("must be true or false, got {v:?}")),
        }
    }

    /// An IP address.
    pub fn ip(v: &str) -> Result<IpAddr, String> {
        v.parse()
            .map_err(|_| format!("must be an IP address, got {v:?}"))
    }

    /// A folder name, not empty.
    pub fn folder(v: &str) -> Result<PathBuf, String> {
        if v.is_empty() {
            Err("must not be empty".into())
        } else {
            Ok(PathBuf::from(v))
        }
    }

    /// A file path; empty means unset.
    pub fn optional_path(v: &str) -> Result<Option<PathBuf>, String> {
        Ok((!v.is_empty()).then(|| PathBuf::from(v)))
    }

    /// Any text; empty means unset.
    pub fn optional_text(v: &str) -> Result<Option<String>, String> {
        Ok((!v.is_empty()).then(|| v.to_string()))
    }

    /// Printable ASCII (it goes into gRPC metadata); empty means unset.
    pub fn token(v: &str) -> Result<Option<String>, String> {
        if v.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
            optional_text(v)
        } else {
            Err("must be printable ASCII".into())
        }
    }

    /// `ip:port`; empty means unset.
    pub fn grpc_address(v: &str) -> Result<Option<SocketAddr>, String> {
        if v.is_empty() {
            return Ok(None);
        }
        v.parse()
            .map(Some)
            .map_err(|_| format!("must be host:port with an IP address, got {v:?}"))
    }

    /// `ip:port`, or `off` (or empty) for none.
    pub fn http_address(v: &str) -> Result<Option<SocketAddr>, String> {
        if v.is_empty() || v == "off" {
            return Ok(None);
        }
        v.parse()
            .map(Some)
            .map_err(|_| format!("must be ip:port or off, got {v:?}"))
    }
}

/// The spelling of CFG-5's variable used by several example READMEs (OP-CFG-1); accepted too.
const LEGACY_MAX_MESSAGE_SIZE_ENV: &str = "CONNECTORS_AMQP10_MAXMESSAGESIZE";

/// Every problem found in the configuration, one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration:\n  {}", .0.join("\n  "))]
pub struct ConfigError(pub Vec<String>);

/// Raw values by YAML key, before parsing.
pub type RawValues = BTreeMap<String, String>;

/// Reads the YAML file's values: a flat map of the field names above (unknown keys are errors,
/// so a typo cannot silently fall back to a default).
pub fn read_yaml(text: &str) -> Result<RawValues, ConfigError> {
    let value: serde_yaml::Value =
        serde_yaml::from_str(text).map_err(|e| ConfigError(vec![format!("config file: {e}")]))?;
    let mut out = RawValues::new();
    let map = match value {
        serde_yaml::Value::Null => return Ok(out),
        serde_yaml::Value::Mapping(m) => m,
        _ => {
            return Err(ConfigError(vec![
                "config file: expected a mapping of setting names to values".into(),
            ]))
        }
    };
    let mut errors = Vec::new();
    for (k, v) in map {
        let Some(key) = k.as_str() else {
            errors.push(format!("config file: non-string key {k:?}"));
            continue;
        };
        if !SETTINGS.iter().any(|f| f.key == key) {
            errors.push(format!("config file: unknown setting {key:?}"));
            continue;
        }
        let text = match v {
            serde_yaml::Value::String(s) => s,
            serde_yaml::Value::Number(n) => n.to_string(),
            serde_yaml::Value::Bool(b) => b.to_string(),
            other => {
                errors.push(format!(
                    "config file: {key} must be a scalar, got {other:?}"
                ));
                continue;
            }
        };
        out.insert(key.to_string(), text);
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ConfigError(errors))
    }
}

/// Reads `CONNECTORS_AMQP10_*` values through `get` (the process environment in production).
pub fn read_env(get: impl Fn(&str) -> Option<String>) -> RawValues {
    let mut out = RawValues::new();
    if let Some(v) = get(LEGACY_MAX_MESSAGE_SIZE_ENV) {
        out.insert("MaxMessageSize".into(), v);
    }
    for f in SETTINGS {
        if let Some(v) = get(&f.env()) {
            out.insert(f.key.to_string(), v);
        }
    }
    out
}

impl Settings {
    /// Layers file, environment and flags (later wins) over the defaults and validates the result.
    pub fn resolve(layers: &[RawValues]) -> Result<Settings, ConfigError> {
        let mut merged = RawValues::new();
        for layer in layers {
            merged.extend(layer.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let mut s = Settings::default();
        let mut errors = Vec::new();
        s.parse_values(|k| merged.get(k).map(|v| v.trim().to_string()), &mut errors);
        if !s.enable {
            // CFG-18: a disabled connector is valid whatever the rest says; it still logs in
            // the format asked for (or text, when that is invalid too).
            return Ok(Settings {
                enable: false,
                log_format: s.log_format,
                ..Settings::default()
            });
        }
        if s.max_connection_memory < s.max_message_size {
            errors.push(format!(
                "MaxConnectionMemory ({}) must be at least MaxMessageSize ({}): a message of the largest size would not fit",
                s.max_connection_memory, s.max_message_size
            ));
        }
        if s.kubemq_address.is_some() && s.serve_kubemq_grpc.is_some() {
            errors.push("ServeKubemqGrpc serves the embedded store, which is not used when KubemqAddress is set".into());
        }
        match (&s.tls_cert_file, &s.tls_key_file) {
            (Some(_), None) => errors.push("TlsCertFile is set without TlsKeyFile".into()),
            (None, Some(_)) => errors.push("TlsKeyFile is set without TlsCertFile".into()),
            _ => {}
        }
        match (s.tls_mode, &s.tls_client_ca_file) {
            (TlsMode::Mtls, None) => {
                errors.push("TlsMode mtls needs TlsClientCaFile to verify client certificates".into())
            }
            (TlsMode::Tls, Some(_)) => errors.push(
                "TlsClientCaFile is only used with TlsMode mtls (tls asks clients for no certificate)".into(),
            ),
            _ => {}
        }
        errors.extend(s.auth_problems());
        if errors.is_empty() && s.port == 0 && s.tls_files().is_none() {
            errors.push(if s.tls_port == 0 {
                "Port and TlsPort are both 0: no listener would be bound".into()
            } else {
                "Port is 0 and TLS is not configured (TlsCertFile, TlsKeyFile): no listener would be bound".into()
            });
        }
        if errors.is_empty() {
            Ok(s)
        } else {
            Err(ConfigError(errors))
        }
    }

    /// What is wrong with the authentication settings: with `Authentication`, a signature type
    /// and exactly one key; without it, none of the settings that only it uses (AUTHZ-1).
    fn auth_problems(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let key_given = self.jwt_key.is_some() || self.jwt_key_file.is_some();
        if self.authentication {
            if self.jwt_signature_type.is_none() {
                errors.push("Authentication needs JwtSignatureType".into());
            }
            match (&self.jwt_key, &self.jwt_key_file) {
                (None, None) => errors.push("Authentication needs JwtKeyFile or JwtKey".into()),
                (Some(_), Some(_)) => {
                    errors.push("JwtKey and JwtKeyFile are both set; give one".into())
                }
                _ => {}
            }
            // AUTHZ-8: who may use which channel never rests on the backend.
            match (&self.authorization_policy_file, self.authorize_every_client) {
                (None, false) => errors.push(
                    "Authentication needs AuthorizationPolicyFile, or AuthorizeEveryClient true \
                     to let every authenticated client use every channel"
                        .into(),
                ),
                (Some(_), true) => errors.push(
                    "AuthorizationPolicyFile and AuthorizeEveryClient are both set; give one"
                        .into(),
                ),
                _ => {}
            }
        } else {
            for (set, name) in [
                (self.jwt_signature_type.is_some(), "JwtSignatureType"),
                (key_given, "JwtKeyFile/JwtKey"),
                (
                    self.authorization_policy_file.is_some(),
                    "AuthorizationPolicyFile",
                ),
                (self.authorize_every_client, "AuthorizeEveryClient"),
            ] {
                if set {
                    errors.push(format!("{name} is only used with Authentication true"));
                }
            }
        }
        errors
    }

    /// The TLS listener's files, when it is to be bound: a certificate and key are configured
    /// and `TlsPort` is not 0 (TLS-1).
    pub fn tls_files(&self) -> Option<TlsFiles> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) if self.tls_port != 0 => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: match self.tls_mode {
                    TlsMode::Mtls => self.tls_client_ca_file.clone(),
                    TlsMode::Tls => None,
                },
            }),
            _ => None,
        }
    }

    /// Produce credit window: MaxUnsettledPerLink clamped into [1, 1 048 576] (FLOW-1, CFG-21).
    pub fn produce_credit_window(&self) -> u32 {
        self.max_unsettled_per_link.clamp(1, 1_048_576)
    }

    /// The engine's limits, with how clients authenticate.
    pub fn engine_config(&self, auth: AuthPolicy) -> EngineConfig {
        EngineConfig {
            max_frame_size: self.max_frame_size,
            max_message_size: self.max_message_size,
            session_max: self.session_max,
            max_links_per_session: self.max_links_per_session,
            idle_timeout: (self.idle_timeout_seconds > 0)
                .then(|| Duration::from_secs(u64::from(self.idle_timeout_seconds))),
            handshake_timeout: Duration::from_secs(u64::from(self.handshake_timeout_seconds)),
            close_timeout: Duration::from_secs(2),
            auth,
            connection_memory: self.max_connection_memory,
            process_memory: ProcessBudget::new(self.process_memory()),
            link_state_bytes: LINK_STATE_BYTES,
            session_state_bytes: SESSION_STATE_BYTES,
        }
    }

    /// The process memory budget: `MaxProcessMemory`, else what the container's memory limit
    /// allows.
    pub fn process_memory(&self) -> u64 {
        self.max_process_memory
            .unwrap_or_else(|| default_process_memory(crate::cgroup::memory_limit()))
    }

    /// The engine's limits with authentication disabled.
    pub fn engine_config_no_auth(&self) -> EngineConfig {
        self.engine_config(AuthPolicy::Disabled)
    }
}

/// The command line: the config file, a dry-run switch, and every setting as a flag (which
/// beats its environment variable).
#[derive(Debug, clap::Args)]
pub struct Cli {
    /// YAML file of settings, keyed by the setting names (README).
    #[arg(long, env = "CONNECTORS_AMQP10_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print the effective settings as YAML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// The settings given as flags, by key.
    #[arg(skip)]
    pub flags: RawValues,
}

impl Cli {
    /// The command: the arguments above and a `--<flag>` per setting.
    pub fn command() -> clap::Command {
        let cmd = clap::Command::new("kubemq-amqp-connector").version(env!("CARGO_PKG_VERSION"));
        // After augment_args, which would take this type's doc comment as the description.
        let cmd = <Cli as clap::Args>::augment_args(cmd).about("AMQP 1.0 connector for KubeMQ");
        cmd.args(SETTINGS.iter().map(|s| {
            clap::Arg::new(s.key)
                .long(s.flag())
                .value_name(s.key)
                .help(format!("{} [env: {}]", s.help.trim(), s.env()))
        }))
    }

    /// Parses `args` (the program name first).
    pub fn try_parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let matches = Cli::command().try_get_matches_from(args)?;
        let mut cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches)?;
        for s in SETTINGS {
            if let Some(v) = matches.get_one::<String>(s.key) {
                cli.flags.insert(s.key.to_string(), v.clone());
            }
        }
        Ok(cli)
    }

    /// Parses the process's arguments; prints the problem (or the help) and exits on `--help`,
    /// `--version` or a bad command line.
    pub fn parse() -> Cli {
        Cli::try_parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// File, then environment (through `env`), then flags, validated.
    pub fn settings(&self, env: impl Fn(&str) -> Option<String>) -> Result<Settings, ConfigError> {
        let file = match &self.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| ConfigError(vec![format!("config file {}: {e}", p.display())]))?;
                read_yaml(&text)?
            }
            None => RawValues::new(),
        };
        Settings::resolve(&[file, read_env(env), self.flags.clone()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(pairs: &[(&str, &str)]) -> RawValues {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// CFG-1 … CFG-14 defaults.
    #[test]
    fn cfg_defaults() {
        let s = Settings::resolve(&[]).unwrap();
        assert_eq!(s, Settings::default());
        assert_eq!(
            (s.port, s.tls_port, s.max_frame_size),
            (5672, 5671, 131_072)
        );
        assert_eq!(
            (s.max_message_size, s.session_max, s.max_links_per_session),
            (104_857_600, 256, 256)
        );
        assert_eq!(
            (s.max_connections, s.idle_timeout_seconds, s.get_batch_size),
            (1000, 120, 32)
        );
        assert_eq!(
            (
                s.max_unsettled_per_link,
                s.default_rpc_timeout_seconds,
                s.rpc_max_pending
            ),
            (1024, 30, 512)
        );
        assert_eq!(s.default_pattern, Pattern::Queues);
    }

    /// CFG-15: the 14 normative environment variable names, and flags overriding env over file.
    #[test]
    fn cfg_15_env_names_and_precedence() {
        let env: BTreeMap<&str, &str> = [
            ("CONNECTORS_AMQP10_ENABLE", "true"),
            ("CONNECTORS_AMQP10_PORT", "6000"),
            ("CONNECTORS_AMQP10_TLS_PORT", "6001"),
            ("CONNECTORS_AMQP10_MAX_FRAME_SIZE", "4096"),
            ("CONNECTORS_AMQP10_MAX_MESSAGE_SIZE", "1000"),
            ("CONNECTORS_AMQP10_SESSION_MAX", "8"),
            ("CONNECTORS_AMQP10_MAX_LINKS_PER_SESSION", "9"),
            ("CONNECTORS_AMQP10_MAX_CONNECTIONS", "0"),
            ("CONNECTORS_AMQP10_IDLE_TIMEOUT_SECONDS", "0"),
            ("CONNECTORS_AMQP10_DEFAULT_PATTERN", "events-store"),
            ("CONNECTORS_AMQP10_GET_BATCH_SIZE", "1024"),
            ("CONNECTORS_AMQP10_MAX_UNSETTLED_PER_LINK", "7"),
            ("CONNECTORS_AMQP10_DEFAULT_RPC_TIMEOUT_SECONDS", "5"),
            ("CONNECTORS_AMQP10_RPC_MAX_PENDING", "3"),
        ]
        .into_iter()
        .collect();
        let file = read_yaml("Port: 7000\nSessionMax: 2\n").unwrap();
        let cli = Cli::try_parse_from(["x", "--session-max", "4", "--print-config"]).unwrap();
        assert!(cli.print_config);
        let s = Settings::resolve(&[
            file,
            read_env(|k| env.get(k).map(|v| v.to_string())),
            cli.flags.clone(),
        ])
        .unwrap();
        assert_eq!(s.port, 6000, "env beats file");
        assert_eq!(s.session_max, 4, "flag beats env");
        assert_eq!(
            (s.tls_port, s.max_frame_size, s.max_message_size),
            (6001, 4096, 1000)
        );
        assert_eq!(
            (
                s.max_links_per_session,
                s.max_connections,
                s.idle_timeout_seconds
            ),
            (9, 0, 0)
        );
        assert_eq!(
            (s.default_pattern.name(), s.get_batch_size),
            ("events-store", 1024)
        );
        assert_eq!(
            (
                s.max_unsettled_per_link,
                s.default_rpc_timeout_seconds,
                s.rpc_max_pending
            ),
            (7, 5, 3)
        );
    }

    /// A value of every setting, none its default.
    fn all_changed() -> Settings {
        Settings {
            enable: true,
            port: 6000,
            tls_port: 6001,
            max_frame_size: 4096,
            max_message_size: 1000,
            session_max: 8,
            max_links_per_session: 9,
            max_connections: 0,
            idle_timeout_seconds: 0,
            default_pattern: Pattern::EventsStore,
            get_batch_size: 1024,
            max_unsettled_per_link: 7,
            default_rpc_timeout_seconds: 5,
            rpc_max_pending: 3,
            bind_address: IpAddr::from([127, 0, 0, 1]),
            data_dir: PathBuf::from("/var/lib/amqp"),
            kubemq_address: Some("kubemq:50000".into()),
            kubemq_token: Some("jwt".into()),
            serve_kubemq_grpc: None,
            http_address: None,
            max_connection_memory: 5000,
            max_process_memory: Some(MIN_PROCESS_MEMORY),
            handshake_timeout_seconds: 2,
            log_format: LogFormat::Json,
            tls_cert_file: Some(PathBuf::from("/tls/tls.crt")),
            tls_key_file: Some(PathBuf::from("/tls/tls.key")),
            tls_mode: TlsMode::Mtls,
            tls_client_ca_file: Some(PathBuf::from("/tls/ca.crt")),
            authentication: true,
            jwt_signature_type: Some(SignatureType::RS384),
            jwt_key_file: Some(PathBuf::from("/jwt/key.pem")),
            jwt_key: None,
            authorization_policy_file: Some(PathBuf::from("/policy/acl.json")),
            authorize_every_client: false,
        }
    }

    /// The value of a secret setting, which `--print-config` leaves out.
    fn secret_value(s: &Settings, key: &str) -> String {
        match key {
            "KubemqToken" => s.kubemq_token.clone(),
            "JwtKey" => s.jwt_key.clone(),
            other => panic!("{other} is not a secret setting"),
        }
        .unwrap_or_default()
    }

    /// The settings as `--print-config` writes them, each value as text, by key.
    fn printed(s: &Settings) -> BTreeMap<String, String> {
        let yaml = serde_yaml::to_string(s).unwrap();
        read_yaml(&yaml.replace(": null", ": ''")).unwrap()
    }

    /// Reads `want`, printed by `--print-config` (with its token added), back from a file, from
    /// the environment and from flags; returns the printed values.
    fn round_trip(want: &Settings) -> BTreeMap<String, String> {
        let mut text = printed(want);
        let keys: Vec<&str> = text.keys().map(String::as_str).collect();
        let mut all: Vec<&str> = SETTINGS
            .iter()
            .filter(|s| !s.secret)
            .map(|s| s.key)
            .collect();
        all.sort_unstable();
        assert_eq!(
            keys, all,
            "--print-config prints every setting but the secrets"
        );
        for s in SETTINGS.iter().filter(|s| s.secret) {
            text.insert(s.key.into(), secret_value(want, s.key));
        }
        let yaml: String = text.iter().map(|(k, v)| format!("{k}: '{v}'\n")).collect();
        let from_file = Settings::resolve(&[read_yaml(&yaml).unwrap()]).unwrap();
        assert_eq!(&from_file, want, "file");
        let env: BTreeMap<String, String> = SETTINGS
            .iter()
            .map(|s| (s.env(), text[s.key].clone()))
            .collect();
        let from_env = Settings::resolve(&[read_env(|k| env.get(k).cloned())]).unwrap();
        assert_eq!(&from_env, want, "environment");
        let mut args = vec!["x".to_string()];
        for s in SETTINGS {
            args.push(format!("--{}={}", s.flag(), text[s.key]));
        }
        let from_flags = Cli::try_parse_from(args)
            .unwrap()
            .settings(|_| None)
            .unwrap();
        assert_eq!(&from_flags, want, "flags");
        text
    }

    /// CFG-15: every declared setting is read from the file, from its environment variable and
    /// from its flag alike, and what `--print-config` prints reads back as the same settings.
    #[test]
    fn every_setting_reads_from_file_env_and_flag() {
        let over_kubemq = all_changed();
        // ServeKubemqGrpc only goes with the embedded store.
        let embedded = Settings {
            kubemq_address: None,
            kubemq_token: None,
            serve_kubemq_grpc: Some(SocketAddr::from(([127, 0, 0, 1], 50000))),
            ..all_changed()
        };
        // The JWT key given inline instead of from a file, and no policy.
        let inline_key = Settings {
            jwt_key: Some("hmac-secret".into()),
            jwt_key_file: None,
            authorization_policy_file: None,
            authorize_every_client: true,
            ..all_changed()
        };
        let a = round_trip(&over_kubemq);
        let b = round_trip(&embedded);
        let c = round_trip(&inline_key);
        let defaults = printed(&Settings::default());
        // Enable: false drops every other setting; cfg_18_disabled_skips_validation reads it.
        for (k, v) in defaults.iter().filter(|(k, _)| *k != "Enable") {
            assert!(
                a[k] != *v || b[k] != *v || c[k] != *v,
                "{k} is left at its default: not tested"
            );
        }
    }

    /// SASL-3, AUTHZ-1, AUTHZ-8: authentication needs a signature type, exactly one key and
    /// either a policy or `AuthorizeEveryClient`; the JWT and policy settings are refused
    /// without it.
    #[test]
    fn sasl_3_authentication_settings() {
        let on = |extra: &[(&str, &str)]| {
            let mut raw = RawValues::from([("Authentication".to_string(), "true".to_string())]);
            raw.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            Settings::resolve(&[raw])
        };
        let s = on(&[
            ("JwtSignatureType", "hs256"),
            ("JwtKey", "k"),
            ("AuthorizeEveryClient", "true"),
        ])
        .unwrap();
        assert_eq!(s.jwt_signature_type, Some(SignatureType::HS256));
        // AUTHZ-8: who may use which channel is said explicitly.
        let e = on(&[("JwtSignatureType", "HS256"), ("JwtKey", "k")])
            .unwrap_err()
            .0;
        assert_eq!(
            e,
            ["Authentication needs AuthorizationPolicyFile, or AuthorizeEveryClient true to let \
              every authenticated client use every channel"]
        );
        let e = on(&[
            ("JwtSignatureType", "HS256"),
            ("JwtKey", "k"),
            ("AuthorizationPolicyFile", "/acl.json"),
            ("AuthorizeEveryClient", "true"),
        ])
        .unwrap_err()
        .0;
        assert_eq!(
            e,
            ["AuthorizationPolicyFile and AuthorizeEveryClient are both set; give one"]
        );
        let e = on(&[]).unwrap_err().0;
        assert!(
            e.contains(&"Authentication needs JwtSignatureType".to_string()),
            "{e:?}"
        );
        assert!(
            e.contains(&"Authentication needs JwtKeyFile or JwtKey".to_string()),
            "{e:?}"
        );
        let e = on(&[
            ("JwtSignatureType", "HS256"),
            ("JwtKey", "k"),
            ("JwtKeyFile", "/k"),
            ("AuthorizeEveryClient", "true"),
        ])
        .unwrap_err()
        .0;
        assert_eq!(e, ["JwtKey and JwtKeyFile are both set; give one"]);
        let e = on(&[
            ("JwtSignatureType", "ES512"),
            ("JwtKey", "k"),
            ("AuthorizeEveryClient", "true"),
        ])
        .unwrap_err()
        .0;
        assert!(
            e[0].starts_with("JwtSignatureType ES512 is not supported"),
            "{e:?}"
        );
        let off = RawValues::from([
            ("JwtSignatureType".to_string(), "HS256".to_string()),
            (
                "AuthorizationPolicyFile".to_string(),
                "/acl.json".to_string(),
            ),
            ("AuthorizeEveryClient".to_string(), "true".to_string()),
        ]);
        let e = Settings::resolve(&[off]).unwrap_err().0;
        assert_eq!(
            e,
            [
                "JwtSignatureType is only used with Authentication true",
                "AuthorizationPolicyFile is only used with Authentication true",
                "AuthorizeEveryClient is only used with Authentication true"
            ]
        );
    }

    /// The derived names follow the key, word by word.
    #[test]
    fn names_derive_from_the_key() {
        let s = SETTINGS
            .iter()
            .find(|s| s.key == "DefaultRpcTimeoutSeconds")
            .unwrap();
        assert_eq!(s.env(), "CONNECTORS_AMQP10_DEFAULT_RPC_TIMEOUT_SECONDS");
        assert_eq!(s.flag(), "default-rpc-timeout-seconds");
        Cli::command().debug_assert();
    }

    /// README's table names exactly the declared settings, each with its variable, flag and
    /// default as the code has them.
    #[test]
    fn readme_table_matches_the_declarations() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"),
        )
        .unwrap();
        let rows: Vec<Vec<&str>> = readme
            .lines()
            .skip_while(|l| !l.starts_with("| Setting (YAML key)"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| l.split(" | ").map(|c| c.trim_matches(['|', ' '])).collect())
            .collect();
        let defaults = serde_yaml::to_value(Settings::default()).unwrap();
        assert_eq!(rows.len(), SETTINGS.len(), "one README row per setting");
        for (row, s) in rows.iter().zip(SETTINGS) {
            assert_eq!(row[0], format!("`{}`", s.key));
            assert_eq!(row[1], format!("`{}`", s.env()), "{}", s.key);
            assert_eq!(row[2], format!("`--{}`", s.flag()), "{}", s.key);
            let default = match &defaults[s.key] {
                serde_yaml::Value::Null => "unset".to_string(),
                v => format!("`{}`", serde_yaml::to_string(v).unwrap().trim()),
            };
            if s.secret {
                assert!(row[3].starts_with("unset"), "{}", s.key);
            } else {
                assert!(
                    row[3].starts_with(&default),
                    "{}: {} vs {default}",
                    s.key,
                    row[3]
                );
            }
        }
    }

    /// OP-CFG-2: the backend settings, and serving the embedded store only without KubeMQ.
    #[test]
    fn backend_settings() {
        let s = Settings::resolve(&[raw(&[
            ("KubemqAddress", "kubemq:50000"),
            ("KubemqToken", "jwt"),
        ])])
        .unwrap();
        assert_eq!(
            (s.kubemq_address.as_deref(), s.kubemq_token.as_deref()),
            (Some("kubemq:50000"), Some("jwt"))
        );
        assert!(
            !serde_yaml::to_string(&s).unwrap().contains("jwt"),
            "the token is never printed"
        );
        let both = Settings::resolve(&[raw(&[
            ("KubemqAddress", "k:1"),
            ("ServeKubemqGrpc", "127.0.0.1:50000"),
        ])]);
        assert!(both.unwrap_err().to_string().contains("ServeKubemqGrpc"));
        assert!(Settings::resolve(&[raw(&[("ServeKubemqGrpc", "nowhere")])]).is_err());
        assert!(Settings::resolve(&[raw(&[("DataDir", "")])]).is_err());
        assert_eq!(
            Settings::resolve(&[raw(&[("HttpAddress", "off")])])
                .unwrap()
                .http_address,
            None
        );
        assert!(Settings::resolve(&[raw(&[("HttpAddress", "8080")])]).is_err());
    }

    /// OP-CFG-1: the legacy spelling of the message-size variable is accepted.
    #[test]
    fn op_cfg_1_legacy_message_size_env() {
        let s = Settings::resolve(&[read_env(|k| {
            (k == LEGACY_MAX_MESSAGE_SIZE_ENV).then(|| "77".to_string())
        })])
        .unwrap();
        assert_eq!(s.max_message_size, 77);
    }

    /// CFG-19: every violation is reported, with the field's name.
    #[test]
    fn cfg_19_validation_messages() {
        let bad = raw(&[
            ("Port", "70000"),
            ("MaxFrameSize", "511"),
            ("MaxMessageSize", "0"),
            ("SessionMax", "0"),
            ("MaxLinksPerSession", "0"),
            ("MaxConnections", "-1"),
            ("IdleTimeoutSeconds", "-5"),
            ("DefaultPattern", "topics"),
            ("GetBatchSize", "1025"),
            ("MaxUnsettledPerLink", "0"),
            ("DefaultRpcTimeoutSeconds", "0"),
            ("RpcMaxPending", "abc"),
        ]);
        let err = Settings::resolve(&[bad]).unwrap_err();
        assert_eq!(err.0.len(), 12, "{err}");
        let text = err.to_string();
        for k in [
            "Port",
            "MaxFrameSize",
            "MaxMessageSize",
            "SessionMax",
            "MaxLinksPerSession",
            "MaxConnections",
        ] {
            assert!(text.contains(k), "{k} missing from {text}");
        }
        assert!(text.contains(
            "DefaultPattern must be one of queues, events, events-store, commands, queries"
        ));
        assert!(text.contains("RpcMaxPending must be an integer"));
        let both_zero = Settings::resolve(&[raw(&[("Port", "0"), ("TlsPort", "0")])]).unwrap_err();
        assert!(both_zero.to_string().contains("no listener"));
    }

    /// TLS-1, TLS-3, TLS-4: the TLS listener is configured by a certificate and key (both or
    /// neither); mtls needs a client CA and tls takes none; without TLS, Port 0 binds nothing.
    #[test]
    fn tls_settings() {
        let tls = |pairs: &[(&str, &str)]| Settings::resolve(&[raw(pairs)]);
        let cert = ("TlsCertFile", "/tls/tls.crt");
        let key = ("TlsKeyFile", "/tls/tls.key");
        let ca = ("TlsClientCaFile", "/tls/ca.crt");
        let on = tls(&[cert, key]).unwrap();
        let files = on.tls_files().unwrap();
        assert_eq!(files.cert, PathBuf::from("/tls/tls.crt"));
        assert_eq!(files.client_ca, None);
        let mutual = tls(&[cert, key, ca, ("TlsMode", "MTLS")]).unwrap();
        assert_eq!(
            mutual.tls_files().unwrap().client_ca,
            Some(PathBuf::from("/tls/ca.crt"))
        );
        assert_eq!(Settings::default().tls_files(), None);
        assert_eq!(
            tls(&[cert, key, ("TlsPort", "0")]).unwrap().tls_files(),
            None
        );
        assert!(tls(&[cert, key, ("Port", "0")]).is_ok(), "TLS only");
        for (pairs, says) in [
            (&[cert][..], "TlsCertFile is set without TlsKeyFile"),
            (&[key][..], "TlsKeyFile is set without TlsCertFile"),
            (
                &[cert, key, ("TlsMode", "mtls")][..],
                "TlsMode mtls needs TlsClientCaFile",
            ),
            (
                &[cert, key, ca][..],
                "TlsClientCaFile is only used with TlsMode mtls",
            ),
            (&[("TlsMode", "ssl")][..], "TlsMode must be tls or mtls"),
            (&[("Port", "0")][..], "Port is 0 and TLS is not configured"),
        ] {
            let e = tls(pairs).unwrap_err().to_string();
            assert!(e.contains(says), "{says} in {e}");
        }
    }

    /// The hostile-client limits: memory budgets, the pre-OPEN deadline and the log format; a
    /// connection budget below MaxMessageSize is refused.
    #[test]
    fn limits_settings() {
        let d = Settings::default();
        assert_eq!(
            (
                d.max_connection_memory,
                d.max_process_memory,
                d.handshake_timeout_seconds,
                d.log_format
            ),
            (256 << 20, None, 5, LogFormat::Text)
        );
        // Unset, the budget follows the container's memory limit.
        assert_eq!(default_process_memory(None), 1 << 30);
        assert_eq!(default_process_memory(Some(512 << 20)), 256 << 20);
        assert_eq!(default_process_memory(Some(8 << 20)), MIN_PROCESS_MEMORY);
        let env: BTreeMap<&str, &str> = [
            ("CONNECTORS_AMQP10_MAX_CONNECTION_MEMORY", "2000"),
            ("CONNECTORS_AMQP10_MAX_PROCESS_MEMORY", "16777216"),
            ("CONNECTORS_AMQP10_MAX_MESSAGE_SIZE", "2000"),
            ("CONNECTORS_AMQP10_HANDSHAKE_TIMEOUT_SECONDS", "2"),
            ("CONNECTORS_AMQP10_LOG_FORMAT", "json"),
        ]
        .into_iter()
        .collect();
        let s = Settings::resolve(&[read_env(|k| env.get(k).map(|v| v.to_string()))]).unwrap();
        assert_eq!(
            (
                s.max_connection_memory,
                s.max_process_memory,
                s.handshake_timeout_seconds,
                s.log_format
            ),
            (2000, Some(16 << 20), 2, LogFormat::Json)
        );
        let e = Settings::resolve(&[raw(&[
            ("MaxConnectionMemory", "1000"),
            ("MaxMessageSize", "1001"),
            ("HandshakeTimeoutSeconds", "0"),
            ("LogFormat", "xml"),
        ])])
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("MaxConnectionMemory (1000) must be at least MaxMessageSize (1001)"),
            "{text}"
        );
        assert!(
            text.contains("HandshakeTimeoutSeconds must be between 1 and 3600"),
            "{text}"
        );
        assert!(text.contains("LogFormat must be text or json"), "{text}");
    }

    /// CFG-18: disabled means valid whatever else is set.
    #[test]
    fn cfg_18_disabled_skips_validation() {
        let s = Settings::resolve(&[raw(&[
            ("Enable", "false"),
            ("Port", "banana"),
            ("SessionMax", "0"),
        ])])
        .unwrap();
        assert!(!s.enable);
    }

    /// CFG-21: produce credit window clamp.
    #[test]
    fn cfg_21_credit_window_clamp() {
        let s = Settings {
            max_unsettled_per_link: 5_000_000,
            ..Settings::default()
        };
        assert_eq!(s.produce_credit_window(), 1_048_576);
    }

    /// OP-CFG-4: values that overflow the wire fields are refused.
    #[test]
    fn op_cfg_4_overflow_rejected() {
        assert!(Settings::resolve(&[raw(&[("MaxFrameSize", "4294967296")])]).is_err());
        assert!(Settings::resolve(&[raw(&[("IdleTimeoutSeconds", "9000000")])]).is_err());
        assert!(Settings::resolve(&[raw(&[("IdleTimeoutSeconds", "8589934")])]).is_ok());
    }

    #[test]
    fn yaml_unknown_keys_and_bad_values() {
        assert!(read_yaml("Prot: 1\n")
            .unwrap_err()
            .to_string()
            .contains("unknown setting \"Prot\""));
        assert!(read_yaml("Port: [1]\n").is_err());
        assert_eq!(read_yaml("").unwrap(), RawValues::new());
        assert!(Cli::try_parse_from(["x", "--port"]).is_err());
        assert!(Cli::try_parse_from(["x", "--bogus"]).is_err());
    }

    #[test]
    fn load_reads_config_file() {
        let dir = std::env::temp_dir().join(format!("cfgtest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.yaml");
        std::fs::write(&path, "MaxConnections: 5\nDefaultPattern: events\n").unwrap();
        let cli =
            Cli::try_parse_from(["x", "--config", path.to_str().unwrap(), "--port=6000"]).unwrap();
        let s = cli.settings(|_| None).unwrap();
        assert_eq!(s.max_connections, 5);
        assert_eq!(s.default_pattern, Pattern::Events);
        assert_eq!(s.port, 6000);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

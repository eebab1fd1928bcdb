//! The connector's settings: CFG-1 … CFG-14 plus the bind address, read
//! from a YAML file, `CONNECTORS_AMQP10_*` environment variables and command-line flags, in
//! rising precedence, and validated with every problem reported at once (CFG-19).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::{Authenticator, EngineConfig, NoAuth, ProcessBudget};
pub use ops::logs::LogFormat;

/// One setting: its YAML key (the reference field name) and environment variable.
struct Field {
    key: &'static str,
    env: &'static str,
}

const FIELDS: [Field; 25] = [
    Field {
        key: "Enable",
        env: "CONNECTORS_AMQP10_ENABLE",
    },
    Field {
        key: "Port",
        env: "CONNECTORS_AMQP10_PORT",
    },
    Field {
        key: "TlsPort",
        env: "CONNECTORS_AMQP10_TLS_PORT",
    },
    Field {
        key: "MaxFrameSize",
        env: "CONNECTORS_AMQP10_MAX_FRAME_SIZE",
    },
    Field {
        key: "MaxMessageSize",
        env: "CONNECTORS_AMQP10_MAX_MESSAGE_SIZE",
    },
    Field {
        key: "SessionMax",
        env: "CONNECTORS_AMQP10_SESSION_MAX",
    },
    Field {
        key: "MaxLinksPerSession",
        env: "CONNECTORS_AMQP10_MAX_LINKS_PER_SESSION",
    },
    Field {
        key: "MaxConnections",
        env: "CONNECTORS_AMQP10_MAX_CONNECTIONS",
    },
    Field {
        key: "IdleTimeoutSeconds",
        env: "CONNECTORS_AMQP10_IDLE_TIMEOUT_SECONDS",
    },
    Field {
        key: "DefaultPattern",
        env: "CONNECTORS_AMQP10_DEFAULT_PATTERN",
    },
    Field {
        key: "GetBatchSize",
        env: "CONNECTORS_AMQP10_GET_BATCH_SIZE",
    },
    Field {
        key: "MaxUnsettledPerLink",
        env: "CONNECTORS_AMQP10_MAX_UNSETTLED_PER_LINK",
    },
    Field {
        key: "DefaultRpcTimeoutSeconds",
        env: "CONNECTORS_AMQP10_DEFAULT_RPC_TIMEOUT_SECONDS",
    },
    Field {
        key: "RpcMaxPending",
        env: "CONNECTORS_AMQP10_RPC_MAX_PENDING",
    },
    Field {
        key: "BindAddress",
        env: "CONNECTORS_AMQP10_BIND_ADDRESS",
    },
    Field {
        key: "DataDir",
        env: "CONNECTORS_AMQP10_DATA_DIR",
    },
    Field {
        key: "ServeKubemqGrpc",
        env: "CONNECTORS_AMQP10_SERVE_KUBEMQ_GRPC",
    },
    Field {
        key: "KubemqAddress",
        env: "CONNECTORS_AMQP10_KUBEMQ_ADDRESS",
    },
    Field {
        key: "KubemqToken",
        env: "CONNECTORS_AMQP10_KUBEMQ_TOKEN",
    },
    Field {
        key: "HttpAddress",
        env: "CONNECTORS_AMQP10_HTTP_ADDRESS",
    },
    Field {
        key: "MaxConnectionMemory",
        env: "CONNECTORS_AMQP10_MAX_CONNECTION_MEMORY",
    },
    Field {
        key: "MaxProcessMemory",
        env: "CONNECTORS_AMQP10_MAX_PROCESS_MEMORY",
    },
    Field {
        key: "HandshakeTimeoutSeconds",
        env: "CONNECTORS_AMQP10_HANDSHAKE_TIMEOUT_SECONDS",
    },
    Field {
        key: "CountConnectionsAfterHeader",
        env: "CONNECTORS_AMQP10_COUNT_CONNECTIONS_AFTER_HEADER",
    },
    Field {
        key: "LogFormat",
        env: "CONNECTORS_AMQP10_LOG_FORMAT",
    },
];

/// The spelling of CFG-5's variable used by several example READMEs (OP-CFG-1); accepted too.
const LEGACY_MAX_MESSAGE_SIZE_ENV: &str = "CONNECTORS_AMQP10_MAXMESSAGESIZE";

/// The five KubeMQ patterns a bare address may default to (CFG-10).
pub const PATTERNS: [&str; 5] = ["queues", "events", "events-store", "commands", "queries"];

/// Validated settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Settings {
    /// CFG-1: `false` binds no listener.
    pub enable: bool,
    /// CFG-2: plain listener port, 0 disables it.
    pub port: u16,
    /// CFG-3: TLS listener port, 0 disables it; binds only when TLS is configured.
    pub tls_port: u16,
    /// CFG-4: upper bound of the negotiated frame size.
    pub max_frame_size: u32,
    /// CFG-5: reassembly cap, advertised as link max-message-size.
    pub max_message_size: u64,
    /// CFG-6: sessions per connection.
    pub session_max: u32,
    /// CFG-7: links per session.
    pub max_links_per_session: u32,
    /// CFG-8: connections per connector process, 0 = unlimited.
    pub max_connections: u32,
    /// CFG-9: inbound idle limit in seconds, 0 disables it.
    pub idle_timeout_seconds: u32,
    /// CFG-10: pattern of bare addresses.
    pub default_pattern: String,
    /// CFG-11: ceiling on MaxItems per queue Get.
    pub get_batch_size: u32,
    /// CFG-12: unsettled cap per consume link and produce credit window.
    pub max_unsettled_per_link: u32,
    /// CFG-13: RPC timeout without ttl.
    pub default_rpc_timeout_seconds: u32,
    /// CFG-14: pending RPC cap per connection.
    pub rpc_max_pending: u32,
    /// Address the listeners bind to.
    pub bind_address: IpAddr,
    /// Folder of the embedded store.
    pub data_dir: PathBuf,
    /// Where to serve the embedded store as KubeMQ's gRPC API; `None` serves nothing.
    pub serve_kubemq_grpc: Option<std::net::SocketAddr>,
    /// KubeMQ's gRPC address (`host:port`); `None` uses the embedded store.
    pub kubemq_address: Option<String>,
    /// Token sent to KubeMQ as `authorization` metadata.
    #[serde(skip_serializing)]
    pub kubemq_token: Option<String>,
    /// Where `/metrics`, `/livez` and `/readyz` are served; `None` serves nothing.
    pub http_address: Option<std::net::SocketAddr>,
    /// Bytes one connection may make the connector hold (partial and unconfirmed deliveries,
    /// transfers waiting for the client's window, dynamic-node mailboxes).
    pub max_connection_memory: u64,
    /// Bytes all connections together may hold beyond each one's guaranteed 256 KiB.
    pub max_process_memory: u64,
    /// From accept until the client's OPEN (SASL included); a slower client is dropped.
    pub handshake_timeout_seconds: u32,
    /// Count a connection against MaxConnections only once its protocol header arrived, so
    /// silent sockets cannot hold the slots (they are still dropped at the handshake timeout).
    pub count_connections_after_header: bool,
    /// Log line format.
    pub log_format: LogFormat,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            enable: true,
            port: 5672,
            tls_port: 5671,
            max_frame_size: 131_072,
            max_message_size: 104_857_600,
            session_max: 256,
            max_links_per_session: 256,
            max_connections: 1000,
            idle_timeout_seconds: 120,
            default_pattern: "queues".into(),
            get_batch_size: 32,
            max_unsettled_per_link: 1024,
            default_rpc_timeout_seconds: 30,
            rpc_max_pending: 512,
            bind_address: IpAddr::from([0, 0, 0, 0]),
            data_dir: PathBuf::from("data"),
            serve_kubemq_grpc: None,
            kubemq_address: None,
            kubemq_token: None,
            http_address: Some(std::net::SocketAddr::from(([0, 0, 0, 0], 8080))),
            max_connection_memory: 256 * 1024 * 1024,
            max_process_memory: 1024 * 1024 * 1024,
            handshake_timeout_seconds: 5,
            count_connections_after_header: false,
            log_format: LogFormat::Text,
        }
    }
}

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
        if !FIELDS.iter().any(|f| f.key == key) {
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
    for f in &FIELDS {
        if let Some(v) = get(f.env) {
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
        let get = |k: &str| merged.get(k).map(|v| v.trim().to_string());
        let boolean = |k: &str, errors: &mut Vec<String>| -> Option<bool> {
            let v = get(k)?;
            match v.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" => Some(true),
                "false" | "0" | "no" => Some(false),
                _ => {
                    errors.push(format!("{k} must be true or false, got {v:?}"));
                    None
                }
            }
        };
        if let Some(b) = boolean("Enable", &mut errors) {
            s.enable = b;
        }
        // Read before CFG-18's early return: a disabled connector still logs that it is.
        if let Some(v) = get("LogFormat") {
            match v.parse() {
                Ok(f) => s.log_format = f,
                Err(e) => errors.push(format!("LogFormat {e}")),
            }
        }
        if !s.enable {
            // CFG-18: a disabled connector is valid whatever the rest says (a bad
            // LogFormat falls back to text).
            return Ok(s);
        }
        let int = |k: &str, min: i128, max: i128, errors: &mut Vec<String>| -> Option<i128> {
            let v = get(k)?;
            match v.parse::<i128>() {
                Ok(n) if n >= min && n <= max => Some(n),
                Ok(n) => {
                    errors.push(
                        if max == i128::from(u32::MAX) || max == i128::from(i64::MAX) {
                            format!("{k} must be at least {min} (and at most {max}), got {n}")
                        } else {
                            format!("{k} must be between {min} and {max}, got {n}")
                        },
                    );
                    None
                }
                Err(_) => {
                    errors.push(format!("{k} must be an integer, got {v:?}"));
                    None
                }
            }
        };
        let u32max = i128::from(u32::MAX);
        if let Some(n) = int("Port", 0, 65535, &mut errors) {
            s.port = n as u16;
        }
        if let Some(n) = int("TlsPort", 0, 65535, &mut errors) {
            s.tls_port = n as u16;
        }
        if let Some(n) = int("MaxFrameSize", 512, u32max, &mut errors) {
            s.max_frame_size = n as u32;
        }
        if let Some(n) = int("MaxMessageSize", 1, i128::from(i64::MAX), &mut errors) {
            s.max_message_size = n as u64;
        }
        if let Some(n) = int("SessionMax", 1, 65535, &mut errors) {
            s.session_max = n as u32;
        }
        if let Some(n) = int("MaxLinksPerSession", 1, u32max, &mut errors) {
            s.max_links_per_session = n as u32;
        }
        if let Some(n) = int("MaxConnections", 0, u32max, &mut errors) {
            s.max_connections = n as u32;
        }
        // The advertised idle-time-out (× 1000 / 2 ms) must fit AMQP's uint (OP-CFG-4).
        if let Some(n) = int("IdleTimeoutSeconds", 0, u32max * 2 / 1000, &mut errors) {
            s.idle_timeout_seconds = n as u32;
        }
        if let Some(v) = get("DefaultPattern") {
            if PATTERNS.contains(&v.as_str()) {
                s.default_pattern = v;
            } else {
                errors.push(format!(
                    "DefaultPattern must be one of {}, got {v:?}",
                    PATTERNS.join(", ")
                ));
            }
        }
        if let Some(n) = int("GetBatchSize", 1, 1024, &mut errors) {
            s.get_batch_size = n as u32;
        }
        if let Some(n) = int("MaxUnsettledPerLink", 1, u32max, &mut errors) {
            s.max_unsettled_per_link = n as u32;
        }
        if let Some(n) = int("DefaultRpcTimeoutSeconds", 1, u32max, &mut errors) {
            s.default_rpc_timeout_seconds = n as u32;
        }
        if let Some(n) = int("RpcMaxPending", 1, u32max, &mut errors) {
            s.rpc_max_pending = n as u32;
        }
        if let Some(v) = get("BindAddress") {
            match v.parse::<IpAddr>() {
                Ok(a) => s.bind_address = a,
                Err(_) => errors.push(format!("BindAddress must be an IP address, got {v:?}")),
            }
        }
        if let Some(v) = get("DataDir") {
            if v.is_empty() {
                errors.push("DataDir must not be empty".into());
            } else {
                s.data_dir = PathBuf::from(v);
            }
        }
        if let Some(v) = get("ServeKubemqGrpc") {
            if !v.is_empty() {
                match v.parse() {
                    Ok(a) => s.serve_kubemq_grpc = Some(a),
                    Err(_) => errors.push(format!(
                        "ServeKubemqGrpc must be host:port with an IP address, got {v:?}"
                    )),
                }
            }
        }
        if let Some(v) = get("KubemqAddress").filter(|v| !v.is_empty()) {
            s.kubemq_address = Some(v);
        }
        if let Some(v) = get("KubemqToken").filter(|v| !v.is_empty()) {
            if v.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
                s.kubemq_token = Some(v);
            } else {
                errors.push("KubemqToken must be printable ASCII".into());
            }
        }
        if let Some(v) = get("HttpAddress") {
            if v.is_empty() || v == "off" {
                s.http_address = None;
            } else {
                match v.parse() {
                    Ok(a) => s.http_address = Some(a),
                    Err(_) => errors.push(format!("HttpAddress must be ip:port or off, got {v:?}")),
                }
            }
        }
        if let Some(n) = int("MaxConnectionMemory", 1, i128::from(i64::MAX), &mut errors) {
            s.max_connection_memory = n as u64;
        }
        if let Some(n) = int("MaxProcessMemory", 0, i128::from(i64::MAX), &mut errors) {
            s.max_process_memory = n as u64;
        }
        if let Some(n) = int("HandshakeTimeoutSeconds", 1, 3600, &mut errors) {
            s.handshake_timeout_seconds = n as u32;
        }
        if let Some(b) = boolean("CountConnectionsAfterHeader", &mut errors) {
            s.count_connections_after_header = b;
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
        if errors.is_empty() && s.port == 0 && s.tls_port == 0 {
            errors.push("Port and TlsPort are both 0: no listener would be bound".into());
        }
        if errors.is_empty() {
            Ok(s)
        } else {
            Err(ConfigError(errors))
        }
    }

    /// Produce credit window: MaxUnsettledPerLink clamped into [1, 1 048 576] (FLOW-1, CFG-21).
    pub fn produce_credit_window(&self) -> u32 {
        self.max_unsettled_per_link.clamp(1, 1_048_576)
    }

    /// The engine's limits, with the SASL policy to use.
    pub fn engine_config(&self, authenticator: Arc<dyn Authenticator>) -> EngineConfig {
        EngineConfig {
            max_frame_size: self.max_frame_size,
            max_message_size: self.max_message_size,
            session_max: self.session_max,
            max_links_per_session: self.max_links_per_session,
            idle_timeout: (self.idle_timeout_seconds > 0)
                .then(|| Duration::from_secs(u64::from(self.idle_timeout_seconds))),
            handshake_timeout: Duration::from_secs(u64::from(self.handshake_timeout_seconds)),
            close_timeout: Duration::from_secs(2),
            authenticator,
            connection_memory: self.max_connection_memory,
            process_memory: ProcessBudget::new(self.max_process_memory),
        }
    }

    /// The engine's limits with authentication disabled.
    pub fn engine_config_no_auth(&self) -> EngineConfig {
        self.engine_config(Arc::new(NoAuth))
    }
}

/// The command line: every setting as a flag (which beats its environment variable), plus the
/// config file and a dry-run switch.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kubemq-amqp-connector",
    version,
    about = "AMQP 1.0 connector for KubeMQ"
)]
pub struct Cli {
    /// YAML file of settings, keyed by the setting names (README) (env: CONNECTORS_AMQP10_CONFIG).
    #[arg(long, env = "CONNECTORS_AMQP10_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print the effective settings as YAML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Enable (CONNECTORS_AMQP10_ENABLE).
    #[arg(long)]
    pub enable: Option<String>,
    /// Port (CONNECTORS_AMQP10_PORT).
    #[arg(long)]
    pub port: Option<String>,
    /// TlsPort (CONNECTORS_AMQP10_TLS_PORT).
    #[arg(long)]
    pub tls_port: Option<String>,
    /// MaxFrameSize (CONNECTORS_AMQP10_MAX_FRAME_SIZE).
    #[arg(long)]
    pub max_frame_size: Option<String>,
    /// MaxMessageSize (CONNECTORS_AMQP10_MAX_MESSAGE_SIZE).
    #[arg(long)]
    pub max_message_size: Option<String>,
    /// SessionMax (CONNECTORS_AMQP10_SESSION_MAX).
    #[arg(long)]
    pub session_max: Option<String>,
    /// MaxLinksPerSession (CONNECTORS_AMQP10_MAX_LINKS_PER_SESSION).
    #[arg(long)]
    pub max_links_per_session: Option<String>,
    /// MaxConnections (CONNECTORS_AMQP10_MAX_CONNECTIONS).
    #[arg(long)]
    pub max_connections: Option<String>,
    /// IdleTimeoutSeconds (CONNECTORS_AMQP10_IDLE_TIMEOUT_SECONDS).
    #[arg(long)]
    pub idle_timeout_seconds: Option<String>,
    /// DefaultPattern (CONNECTORS_AMQP10_DEFAULT_PATTERN).
    #[arg(long)]
    pub default_pattern: Option<String>,
    /// GetBatchSize (CONNECTORS_AMQP10_GET_BATCH_SIZE).
    #[arg(long)]
    pub get_batch_size: Option<String>,
    /// MaxUnsettledPerLink (CONNECTORS_AMQP10_MAX_UNSETTLED_PER_LINK).
    #[arg(long)]
    pub max_unsettled_per_link: Option<String>,
    /// DefaultRpcTimeoutSeconds (CONNECTORS_AMQP10_DEFAULT_RPC_TIMEOUT_SECONDS).
    #[arg(long)]
    pub default_rpc_timeout_seconds: Option<String>,
    /// RpcMaxPending (CONNECTORS_AMQP10_RPC_MAX_PENDING).
    #[arg(long)]
    pub rpc_max_pending: Option<String>,
    /// BindAddress (CONNECTORS_AMQP10_BIND_ADDRESS), default 0.0.0.0.
    #[arg(long)]
    pub bind_address: Option<String>,
    /// DataDir (CONNECTORS_AMQP10_DATA_DIR): folder of the embedded store, default ./data.
    #[arg(long)]
    pub data_dir: Option<String>,
    /// ServeKubemqGrpc (CONNECTORS_AMQP10_SERVE_KUBEMQ_GRPC): serve the embedded store as
    /// KubeMQ's gRPC API on this address, e.g. 127.0.0.1:50000.
    #[arg(long)]
    pub serve_kubemq_grpc: Option<String>,
    /// KubemqAddress (CONNECTORS_AMQP10_KUBEMQ_ADDRESS): KubeMQ's gRPC host:port; unset = the
    /// embedded store.
    #[arg(long)]
    pub kubemq_address: Option<String>,
    /// KubemqToken (CONNECTORS_AMQP10_KUBEMQ_TOKEN): sent as `authorization` metadata. Prefer the
    /// environment variable: flags are visible to every user of the machine.
    #[arg(long)]
    pub kubemq_token: Option<String>,
    /// HttpAddress (CONNECTORS_AMQP10_HTTP_ADDRESS): where /metrics, /livez and /readyz are
    /// served, default 0.0.0.0:8080; `off` disables it.
    #[arg(long)]
    pub http_address: Option<String>,
    /// MaxConnectionMemory (CONNECTORS_AMQP10_MAX_CONNECTION_MEMORY): bytes one connection may
    /// make the connector hold, default 256 MiB.
    #[arg(long)]
    pub max_connection_memory: Option<String>,
    /// MaxProcessMemory (CONNECTORS_AMQP10_MAX_PROCESS_MEMORY): bytes all connections may hold
    /// beyond 256 KiB each, default 1 GiB.
    #[arg(long)]
    pub max_process_memory: Option<String>,
    /// HandshakeTimeoutSeconds (CONNECTORS_AMQP10_HANDSHAKE_TIMEOUT_SECONDS): accept to OPEN,
    /// default 5.
    #[arg(long)]
    pub handshake_timeout_seconds: Option<String>,
    /// CountConnectionsAfterHeader (CONNECTORS_AMQP10_COUNT_CONNECTIONS_AFTER_HEADER): count a
    /// connection against MaxConnections from its protocol header instead of its accept.
    #[arg(long)]
    pub count_connections_after_header: Option<String>,
    /// LogFormat (CONNECTORS_AMQP10_LOG_FORMAT): text (default) or json.
    #[arg(long)]
    pub log_format: Option<String>,
}

impl Cli {
    /// The flag layer as raw values keyed like the file.
    pub fn flag_values(&self) -> RawValues {
        let pairs: [(&str, &Option<String>); 25] = [
            ("Enable", &self.enable),
            ("Port", &self.port),
            ("TlsPort", &self.tls_port),
            ("MaxFrameSize", &self.max_frame_size),
            ("MaxMessageSize", &self.max_message_size),
            ("SessionMax", &self.session_max),
            ("MaxLinksPerSession", &self.max_links_per_session),
            ("MaxConnections", &self.max_connections),
            ("IdleTimeoutSeconds", &self.idle_timeout_seconds),
            ("DefaultPattern", &self.default_pattern),
            ("GetBatchSize", &self.get_batch_size),
            ("MaxUnsettledPerLink", &self.max_unsettled_per_link),
            (
                "DefaultRpcTimeoutSeconds",
                &self.default_rpc_timeout_seconds,
            ),
            ("RpcMaxPending", &self.rpc_max_pending),
            ("BindAddress", &self.bind_address),
            ("DataDir", &self.data_dir),
            ("ServeKubemqGrpc", &self.serve_kubemq_grpc),
            ("KubemqAddress", &self.kubemq_address),
            ("KubemqToken", &self.kubemq_token),
            ("HttpAddress", &self.http_address),
            ("MaxConnectionMemory", &self.max_connection_memory),
            ("MaxProcessMemory", &self.max_process_memory),
            ("HandshakeTimeoutSeconds", &self.handshake_timeout_seconds),
            (
                "CountConnectionsAfterHeader",
                &self.count_connections_after_header,
            ),
            ("LogFormat", &self.log_format),
        ];
        pairs
            .into_iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k.to_string(), v)))
            .collect()
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
        Settings::resolve(&[file, read_env(env), self.flag_values()])
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
        assert_eq!(s.default_pattern, "queues");
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
        let cli =
            <Cli as clap::Parser>::try_parse_from(["x", "--session-max", "4", "--print-config"])
                .unwrap();
        assert!(cli.print_config);
        let s = Settings::resolve(&[
            file,
            read_env(|k| env.get(k).map(|v| v.to_string())),
            cli.flag_values(),
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
            (s.default_pattern.as_str(), s.get_batch_size),
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

    /// The hostile-client limits: memory budgets, the pre-OPEN deadline, when a connection
    /// counts, and the log format; a connection budget below MaxMessageSize is refused.
    #[test]
    fn limits_settings() {
        let d = Settings::default();
        assert_eq!(
            (
                d.max_connection_memory,
                d.max_process_memory,
                d.handshake_timeout_seconds,
                d.count_connections_after_header,
                d.log_format
            ),
            (256 << 20, 1 << 30, 5, false, LogFormat::Text)
        );
        let env: BTreeMap<&str, &str> = [
            ("CONNECTORS_AMQP10_MAX_CONNECTION_MEMORY", "2000"),
            ("CONNECTORS_AMQP10_MAX_PROCESS_MEMORY", "0"),
            ("CONNECTORS_AMQP10_MAX_MESSAGE_SIZE", "2000"),
            ("CONNECTORS_AMQP10_HANDSHAKE_TIMEOUT_SECONDS", "2"),
            ("CONNECTORS_AMQP10_COUNT_CONNECTIONS_AFTER_HEADER", "true"),
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
                s.count_connections_after_header,
                s.log_format
            ),
            (2000, 0, 2, true, LogFormat::Json)
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
        assert!(<Cli as clap::Parser>::try_parse_from(["x", "--port"]).is_err());
        assert!(<Cli as clap::Parser>::try_parse_from(["x", "--bogus"]).is_err());
    }

    #[test]
    fn load_reads_config_file() {
        let dir = std::env::temp_dir().join(format!("cfgtest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.yaml");
        std::fs::write(&path, "MaxConnections: 5\nDefaultPattern: events\n").unwrap();
        let cli = <Cli as clap::Parser>::try_parse_from([
            "x",
            "--config",
            path.to_str().unwrap(),
            "--port=6000",
        ])
        .unwrap();
        let s = cli.settings(|_| None).unwrap();
        assert_eq!(s.max_connections, 5);
        assert_eq!(s.default_pattern, "events");
        assert_eq!(s.port, 6000);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! What the connector and the operator both need to run as Kubernetes services: [`http`], the
//! endpoint probes and scrapers reach, bounded against clients that hold sockets; [`accept`],
//! the pause after failed accepts every listener takes; and [`logs`], the log output (plain or
//! JSON lines, colour only on a terminal).

pub mod accept;
pub mod http;
pub mod logs;

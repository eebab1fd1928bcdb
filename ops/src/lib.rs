//! What the connector and the operator both need to run as Kubernetes services: [`http`], the
//! endpoint probes and scrapers reach, bounded against clients that hold sockets; [`held`], the
//! bounded set of sockets where the quietest makes room for a newcomer; [`accept`],
//! the pause after failed accepts every listener takes; [`logs`], the log output (plain or
//! JSON lines, colour only on a terminal); and [`vocabulary`], the words of the settings the
//! operator writes and the connector reads.

pub mod accept;
pub mod held;
pub mod http;
pub mod listen;
pub mod logs;
pub mod vocabulary;

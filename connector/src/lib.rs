//! The KubeMQ AMQP 1.0 connector.
//!
//! [`engine`] is the sans-IO AMQP 1.0 server protocol engine; [`driver`] runs it on tokio sockets;
//! [`config`] reads the 14 connector settings.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
pub mod bridge;
pub mod config;
pub mod driver;
pub mod engine;
pub mod http;
pub mod kubemq;
pub mod metrics;
pub mod store;

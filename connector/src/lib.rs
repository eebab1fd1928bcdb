//! The KubeMQ AMQP 1.0 connector.
//!
//! [`engine`] is the sans-IO AMQP 1.0 server protocol engine (its own crate,
//! `kubemq-amqp-engine`, re-exported here); [`driver`] runs it on tokio sockets; [`config`] reads
//! the connector's settings.

pub mod auth;
pub mod backend;
pub mod bridge;
pub mod cgroup;
pub mod channel_traffic;
pub mod config;
pub mod detail;
pub mod driver;
pub mod facade;
pub mod failures;
pub use engine;
pub mod http;
pub mod kubemq;
pub mod metrics;
pub mod observed;
pub mod operations;
pub mod pattern;
pub mod spans;
pub mod stages;
pub mod store;

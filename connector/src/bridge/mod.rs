//! Pattern bridges: what sits between AMQP links and the KubeMQ backend. Address resolution and
//! the `amqp10` envelope are shared; [`queues`] is the first pattern.

pub mod address;
pub mod envelope;
pub mod events;
pub mod queues;
pub mod selector;

//! Pattern bridges: what sits between AMQP links and the KubeMQ backend. So far: address
//! resolution and the `amqp10` envelope; the queues bridge arrives with issue 4.

pub mod address;
pub mod envelope;

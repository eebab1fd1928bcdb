//! Pattern bridges: what sits between AMQP links and the KubeMQ backend. So far: address
//! resolution; the queues bridge arrives with issue 4.

pub mod address;

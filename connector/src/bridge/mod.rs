//! Pattern bridges: what sits between AMQP links and the KubeMQ backend. Address resolution and
//! the `amqp10` envelope are shared; [`queues`] runs a connection's links and hands those on
//! `events/` and `events-store/` to [`events`], whose selectors are [`selector`]'s.

pub mod address;
pub mod envelope;
pub mod events;
pub mod queues;
pub mod selector;

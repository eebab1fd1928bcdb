//! The client's side of the wire, for tests, benchmarks and tools: the performatives a client
//! sends, framed, and the error read back out of what the server answers. Nothing on the
//! server's path is here.

use bytes::BytesMut;
use fe2o3_amqp_types::definitions::{
    Error as WireError, ReceiverSettleMode, Role, SenderSettleMode,
};
use fe2o3_amqp_types::messaging::{Source, Target, TargetArchetype};
use fe2o3_amqp_types::performatives::{Attach, Begin, Flow, Open, Transfer};
use serde_bytes::ByteBuf;

use super::codec::{encode_into, Performative};
use super::frame::{write_frame, TYPE_AMQP, TYPE_SASL};

/// OPEN with the largest frame size and channel-max and no idle timeout.
pub fn open(container_id: &str) -> Open {
    Open {
        container_id: container_id.into(),
        hostname: None,
        max_frame_size: u32::MAX.into(),
        channel_max: u16::MAX.into(),
        idle_time_out: None,
        outgoing_locales: None,
        incoming_locales: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

/// BEGIN with next-outgoing-id 1 and windows of 5000 frames.
pub fn begin() -> Begin {
    Begin {
        remote_channel: None,
        next_outgoing_id: 1,
        incoming_window: 5000,
        outgoing_window: 5000,
        handle_max: u32::MAX.into(),
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

/// ATTACH of a client sender (it produces to `address`).
pub fn attach_sender(name: &str, handle: u32, address: &str) -> Attach {
    Attach {
        name: name.into(),
        handle: handle.into(),
        role: Role::Sender,
        snd_settle_mode: SenderSettleMode::Unsettled,
        rcv_settle_mode: ReceiverSettleMode::First,
        source: Some(Box::new(Source::builder().address("client").build())),
        target: Some(Box::new(TargetArchetype::Target(
            Target::builder().address(address.to_string()).build(),
        ))),
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: Some(0),
        max_message_size: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

/// ATTACH of a client receiver (it consumes from `address`).
pub fn attach_receiver(name: &str, handle: u32, address: &str) -> Attach {
    Attach {
        role: Role::Receiver,
        source: Some(Box::new(
            Source::builder().address(address.to_string()).build(),
        )),
        target: Some(Box::new(TargetArchetype::Target(
            Target::builder().address("client").build(),
        ))),
        initial_delivery_count: None,
        ..attach_sender(name, handle, address)
    }
}

/// A link FLOW granting `credit` from `delivery_count`, with open session windows.
pub fn link_flow(handle: u32, delivery_count: u32, credit: u32, drain: bool) -> Flow {
    Flow {
        next_incoming_id: Some(0),
        incoming_window: 5000,
        next_outgoing_id: 1,
        outgoing_window: 5000,
        handle: Some(handle.into()),
        delivery_count: Some(delivery_count),
        link_credit: Some(credit),
        available: None,
        drain,
        echo: false,
        properties: None,
    }
}

/// A TRANSFER; `id` and `tag` go on the first frame of a delivery only.
pub fn transfer(
    handle: u32,
    id: Option<u32>,
    tag: Option<&[u8]>,
    settled: bool,
    more: bool,
) -> Transfer {
    Transfer {
        handle: handle.into(),
        delivery_id: id,
        delivery_tag: tag.map(|t| ByteBuf::from(t.to_vec())),
        message_format: id.map(|_| 0),
        settled: Some(settled),
        more,
        rcv_settle_mode: None,
        state: None,
        resume: false,
        aborted: false,
        batchable: false,
    }
}

/// DETACH(closed) of `handle`.
pub fn detach(handle: u32) -> fe2o3_amqp_types::performatives::Detach {
    fe2o3_amqp_types::performatives::Detach {
        handle: handle.into(),
        closed: true,
        error: None,
    }
}

/// The bytes of one AMQP frame on `channel` carrying `perf` and `payload`.
pub fn frame<T: serde::Serialize>(channel: u16, perf: &T, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    write_frame(&mut out, TYPE_AMQP, channel, |b| {
        encode_into(b, perf);
        b.extend_from_slice(payload);
    });
    out.to_vec()
}

/// The bytes of one SASL frame.
pub fn sasl_frame<T: serde::Serialize>(perf: &T) -> Vec<u8> {
    let mut out = BytesMut::new();
    write_frame(&mut out, TYPE_SASL, 0, |b| encode_into(b, perf));
    out.to_vec()
}

/// The condition symbol of an error as it was on the wire.
pub fn error_symbol(e: &WireError) -> String {
    super::error::wire_symbol(e)
}

/// The error a CLOSE, END or DETACH carries, if any.
pub fn error_of(p: &Performative) -> Option<&WireError> {
    match p {
        Performative::Close(c) => c.error.as_ref(),
        Performative::End(e) => e.error.as_ref(),
        Performative::Detach(d) => d.error.as_ref(),
        _ => None,
    }
}

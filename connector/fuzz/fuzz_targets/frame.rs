//! Frame splitter, structural validator, performative decoder, SASL decoder and message walker on
//! arbitrary bytes: none may panic or allocate beyond the input.
#![no_main]

use bytes::{Bytes, BytesMut};
use connector::engine::codec::{decode_performative, decode_sasl};
use connector::engine::frame::split_frame;
use connector::engine::message::walk;
use connector::engine::validate::{validate_all, value_len};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = value_len(data);
    let _ = validate_all(data);
    let _ = walk(data);
    let body = Bytes::copy_from_slice(data);
    let _ = decode_performative(&body);
    let _ = decode_sasl(&body);
    let mut buf = BytesMut::from(data);
    while let Ok(Some(_)) = split_frame(&mut buf, 1 << 20) {}
});

//! The 8-byte AMQP frame header (SIZE, DOFF, TYPE, channel): splitting an input buffer into
//! frames with every length checked before anything is allocated, and writing frames out.

use bytes::{BufMut, Bytes, BytesMut};

/// Frame type code of AMQP frames.
pub const TYPE_AMQP: u8 = 0;
/// Frame type code of SASL frames.
pub const TYPE_SASL: u8 = 1;
/// Fixed part of every frame header.
pub const HEADER_LEN: usize = 8;

/// One complete frame cut out of the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    /// 0 for AMQP, 1 for SASL.
    pub frame_type: u8,
    /// The channel (AMQP) or 0 (SASL).
    pub channel: u16,
    /// The frame body after the (possibly extended) header; empty for a heartbeat.
    pub body: Bytes,
}

/// Why a frame header is unacceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// SIZE below the 8-byte header.
    #[error("frame size {0} is below the 8-byte header")]
    TooSmall(u32),
    /// SIZE above the negotiated maximum.
    #[error("frame size {size} exceeds max-frame-size {max}")]
    TooLarge {
        /// Declared size.
        size: u32,
        /// Allowed size.
        max: u32,
    },
    /// DOFF below 2 or pointing past the frame end.
    #[error("invalid data offset {0}")]
    BadDataOffset(u8),
    /// TYPE is neither AMQP nor SASL.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
}

/// Cuts one frame off the front of `buf` if it is complete.
///
/// Returns `Ok(None)` when more bytes are needed. The declared size is checked against `max`
/// before waiting for the rest, so a header claiming 4 GiB is refused after 8 bytes.
pub fn split_frame(buf: &mut BytesMut, max: u32) -> Result<Option<RawFrame>, FrameError> {
    let Some(&[s0, s1, s2, s3, doff, frame_type, c0, c1]) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let size = u32::from_be_bytes([s0, s1, s2, s3]);
    let channel = u16::from_be_bytes([c0, c1]);
    if size < HEADER_LEN as u32 {
        return Err(FrameError::TooSmall(size));
    }
    if size > max {
        return Err(FrameError::TooLarge { size, max });
    }
    let body_start = usize::from(doff) * 4;
    if doff < 2 || body_start > size as usize {
        return Err(FrameError::BadDataOffset(doff));
    }
    if frame_type != TYPE_AMQP && frame_type != TYPE_SASL {
        return Err(FrameError::UnknownType(frame_type));
    }
    if buf.len() < size as usize {
        return Ok(None);
    }
    let mut frame = buf.split_to(size as usize).freeze();
    let body = frame.split_off(body_start);
    Ok(Some(RawFrame {
        frame_type,
        channel,
        body,
    }))
}

/// Appends a frame whose body is written by `body` (which may write nothing: a heartbeat).
pub fn write_frame(
    out: &mut BytesMut,
    frame_type: u8,
    channel: u16,
    body: impl FnOnce(&mut BytesMut),
) {
    let start = out.len();
    out.put_u32(0);
    out.put_u8(2);
    out.put_u8(frame_type);
    out.put_u16(channel);
    body(out);
    let size = (out.len() - start) as u32;
    if let Some(size_field) = out.get_mut(start..start + 4) {
        size_field.copy_from_slice(&size.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_complete_frames_only() {
        let mut out = BytesMut::new();
        write_frame(&mut out, TYPE_AMQP, 3, |b| b.extend_from_slice(&[1, 2, 3]));
        let mut partial = BytesMut::from(&out[..9]);
        assert_eq!(split_frame(&mut partial, 512), Ok(None));
        let f = split_frame(&mut out, 512).unwrap().unwrap();
        assert_eq!(f.channel, 3);
        assert_eq!(&f.body[..], &[1, 2, 3]);
        assert!(out.is_empty());
    }

    /// A header claiming 4 GiB is refused from its first 8 bytes.
    #[test]
    fn huge_declared_size_refused_early() {
        let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0][..]);
        assert!(matches!(
            split_frame(&mut buf, 1 << 20),
            Err(FrameError::TooLarge { .. })
        ));
    }

    /// Extended headers (DOFF > 2) are skipped, as the AMQP spec requires.
    #[test]
    fn extended_header_skipped() {
        let mut buf = BytesMut::from(&[0, 0, 0, 13, 3, 0, 0, 1, 9, 9, 9, 9, 0x40][..]);
        let f = split_frame(&mut buf, 512).unwrap().unwrap();
        assert_eq!(&f.body[..], &[0x40]);
    }

    #[test]
    fn bad_headers() {
        let mut b = BytesMut::from(&[0, 0, 0, 5, 2, 0, 0, 0][..]);
        assert_eq!(split_frame(&mut b, 512), Err(FrameError::TooSmall(5)));
        let mut b = BytesMut::from(&[0, 0, 0, 8, 1, 0, 0, 0][..]);
        assert_eq!(split_frame(&mut b, 512), Err(FrameError::BadDataOffset(1)));
        let mut b = BytesMut::from(&[0, 0, 0, 8, 3, 0, 0, 0][..]);
        assert_eq!(split_frame(&mut b, 512), Err(FrameError::BadDataOffset(3)));
        let mut b = BytesMut::from(&[0, 0, 0, 8, 2, 7, 0, 0][..]);
        assert_eq!(split_frame(&mut b, 512), Err(FrameError::UnknownType(7)));
    }
}

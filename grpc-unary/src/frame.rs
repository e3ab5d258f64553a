//! HTTP/2 frames (RFC 9113 §4.1 and §6) as bytes, and what gRPC puts in
//! them: writing and reading a frame on a blocking stream, padding, a header
//! block of HPACK literals and gRPC's length-prefixed message.
//!
//! The CNI's one unary call ([`super::unary`]) speaks through it, and so do
//! the e2e's PodResources endpoint for Multus (a minimal HTTP/2 server);
//! neither frames bytes by itself. Header blocks a peer sends are decoded by
//! the `hpack` crate (they may use its tables and Huffman codes); the ones
//! [`encode_headers`] writes need neither.

use std::io::{ErrorKind, Read};

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// SETTINGS_MAX_FRAME_SIZE's initial value: the largest payload a peer may
/// send unless told otherwise (neither side here says otherwise).
pub const MAX_FRAME: usize = 16_384;

/// Frame types (RFC 9113 §6).
pub mod kind {
    /// DATA.
    pub const DATA: u8 = 0x0;
    /// HEADERS.
    pub const HEADERS: u8 = 0x1;
    /// RST_STREAM.
    pub const RST_STREAM: u8 = 0x3;
    /// SETTINGS.
    pub const SETTINGS: u8 = 0x4;
    /// PUSH_PROMISE.
    pub const PUSH_PROMISE: u8 = 0x5;
    /// PING.
    pub const PING: u8 = 0x6;
    /// GOAWAY.
    pub const GOAWAY: u8 = 0x7;
    /// WINDOW_UPDATE.
    pub const WINDOW_UPDATE: u8 = 0x8;
    /// CONTINUATION.
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags (RFC 9113 §6); one bit may mean different things per type.
pub mod flag {
    /// DATA, HEADERS: the sender's last frame on the stream.
    pub const END_STREAM: u8 = 0x1;
    /// SETTINGS, PING: an acknowledgement.
    pub const ACK: u8 = 0x1;
    /// HEADERS, CONTINUATION: the header block is complete.
    pub const END_HEADERS: u8 = 0x4;
    /// DATA, HEADERS: a pad length and padding surround the payload.
    pub const PADDED: u8 = 0x8;
    /// HEADERS: priority fields precede the header block fragment.
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS parameters (RFC 9113 §6.5.2).
pub mod setting {
    /// SETTINGS_ENABLE_PUSH.
    pub const ENABLE_PUSH: u16 = 0x2;
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
}

/// One frame as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The type ([`kind`]).
    pub kind: u8,
    /// The flags ([`flag`]).
    pub flags: u8,
    /// The stream identifier (the reserved bit cleared).
    pub stream: u32,
    /// The payload, padding included.
    pub payload: Vec<u8>,
}

/// Appends one frame to `out`.
pub fn put_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// Reads the next frame from `r`: `Ok(None)` when the peer closed the
/// connection between frames, an `UnexpectedEof` error when it closed in the
/// middle of one, and an `InvalidData` error (saying "a N-byte frame, larger
/// than the M allowed") without reading further when the payload would be
/// longer than `max`.
pub fn read_frame(r: &mut impl Read, max: usize) -> std::io::Result<Option<Frame>> {
    let mut head = [0u8; 9];
    let first = loop {
        match r.read(&mut head) {
            Ok(n) => break n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    if first == 0 {
        return Ok(None);
    }
    r.read_exact(&mut head[first..])?;
    let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    if len > max {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("a {len}-byte frame, larger than the {max} allowed"),
        ));
    }
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some(Frame {
        kind: head[3],
        flags: head[4],
        stream,
        payload,
    }))
}

/// The payload of a DATA or HEADERS frame without padding (and, for
/// HEADERS, without the priority fields).
pub fn strip_padding(payload: &[u8], flags: u8, headers: bool) -> Result<&[u8], String> {
    let mut p = payload;
    let mut pad = 0usize;
    if flags & flag::PADDED != 0 {
        let (&n, rest) = p.split_first().ok_or("an empty padded frame")?;
        pad = usize::from(n);
        p = rest;
    }
    if headers && flags & flag::PRIORITY != 0 {
        p = p.get(5..).ok_or("a truncated HEADERS priority")?;
    }
    p.get(..p.len().saturating_sub(pad))
        .filter(|_| pad <= p.len())
        .ok_or_else(|| "padding longer than the frame".to_string())
}

/// A header block of "literal header field without indexing, new name"
/// representations (RFC 7541 §6.2.2): no table state, no Huffman; any
/// decoder reads it.
pub fn encode_headers(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        out.push(0);
        put_int(&mut out, name.len(), 7, 0);
        out.extend_from_slice(name.as_bytes());
        put_int(&mut out, value.len(), 7, 0);
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// HPACK integer with an `n`-bit prefix (RFC 7541 §5.1).
fn put_int(out: &mut Vec<u8>, mut v: usize, n: u32, first: u8) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128 + 128) as u8);
        v /= 128;
    }
    out.push(v as u8);
}

/// Appends `message` as gRPC's Length-Prefixed-Message (uncompressed): a
/// zero byte, its length as four big-endian bytes, the message.
pub fn put_message(out: &mut Vec<u8>, message: &[u8]) -> Result<(), String> {
    let len = u32::try_from(message.len())
        .map_err(|_| format!("a {}-byte message is too large", message.len()))?;
    out.push(0);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_decode_with_a_real_hpack_decoder() {
        let long = "x".repeat(300);
        let block = encode_headers(&[(":path", "/v1.PodResourcesLister/List"), ("long", &long)]);
        let fields = hpack::Decoder::new().decode(&block).unwrap();
        assert_eq!(fields[0].0, b":path");
        assert_eq!(fields[0].1, b"/v1.PodResourcesLister/List");
        assert_eq!(fields[1].1, long.as_bytes());
    }

    #[test]
    fn padding_and_priority_are_stripped() {
        // PADDED: pad length 2, then 3 bytes of data, then 2 of padding.
        assert_eq!(
            strip_padding(&[2, b'a', b'b', b'c', 0, 0], flag::PADDED, false).unwrap(),
            b"abc"
        );
        let prio = [0, 0, 0, 0, 16, b'h'];
        assert_eq!(strip_padding(&prio, flag::PRIORITY, true).unwrap(), b"h");
        assert!(strip_padding(&[9, b'a'], flag::PADDED, false).is_err());
    }

    #[test]
    fn a_written_frame_reads_back() {
        let mut out = Vec::new();
        put_frame(&mut out, kind::DATA, flag::END_STREAM, 3, b"hello");
        put_frame(&mut out, kind::PING, 0, 0, &[7; 8]);
        assert_eq!(&out[..9], &[0, 0, 5, 0, 1, 0, 0, 0, 3]);
        let mut r = out.as_slice();
        let f = read_frame(&mut r, MAX_FRAME).unwrap().unwrap();
        assert_eq!(
            f,
            Frame {
                kind: kind::DATA,
                flags: flag::END_STREAM,
                stream: 3,
                payload: b"hello".to_vec()
            }
        );
        assert_eq!(
            read_frame(&mut r, MAX_FRAME).unwrap().unwrap().payload,
            [7; 8]
        );
        assert_eq!(read_frame(&mut r, MAX_FRAME).unwrap(), None);
    }

    #[test]
    fn a_cut_or_oversized_frame_is_an_error() {
        let mut out = Vec::new();
        put_frame(&mut out, kind::DATA, 0, 1, b"hello");
        for cut in 1..out.len() {
            let e = read_frame(&mut &out[..cut], MAX_FRAME).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::UnexpectedEof, "cut at {cut}");
        }
        let e = read_frame(&mut out.as_slice(), 4).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData);
        assert_eq!(e.to_string(), "a 5-byte frame, larger than the 4 allowed");
        // The reserved bit of the stream identifier is not part of it.
        let mut r: &[u8] = &[0, 0, 0, 4, 0, 0x80, 0, 0, 0];
        assert_eq!(read_frame(&mut r, MAX_FRAME).unwrap().unwrap().stream, 0);
    }

    #[test]
    fn a_message_gets_its_length_prefix() {
        let mut out = Vec::new();
        put_message(&mut out, &[7, 8]).unwrap();
        assert_eq!(out, [0, 0, 0, 0, 2, 7, 8]);
    }
}

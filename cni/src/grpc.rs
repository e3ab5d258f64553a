//! One unary gRPC call over a unix socket, with nothing but the standard
//! library: HTTP/2 frames (RFC 9113) written and read by hand on a blocking
//! socket, response headers decoded by the `hpack` crate.
//!
//! The CNI makes exactly one call per ADD (PodResources `List`) and must
//! stay a small, short-lived process with no async runtime, so a full HTTP/2
//! stack is not worth its size. What this speaks: the client preface and
//! SETTINGS (push off, the largest windows, so the server never waits for a
//! WINDOW_UPDATE), one request on stream 1 (HEADERS, then DATA with
//! END_STREAM), answers to the server's SETTINGS and PING, and the response:
//! HEADERS (with CONTINUATION, padding and priority), DATA, trailers,
//! RST_STREAM and GOAWAY. The gRPC status comes from the trailers (or a
//! trailers-only response), the message from the one length-prefixed DATA
//! message.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// The largest response body accepted (Multus accepts the same from this API).
pub const MAX_RESPONSE: usize = 16 * 1024 * 1024;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const STREAM: u32 = 1;
const MAX_WINDOW: u32 = 0x7fff_ffff;
const DEFAULT_WINDOW: u32 = 65_535;
/// Our SETTINGS_MAX_FRAME_SIZE is the default; a peer must not exceed it.
const MAX_FRAME: usize = 16_384;

mod frame {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}

mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

/// Calls `method` (e.g. `/v1.PodResourcesLister/List`) on the gRPC server at
/// `socket` with the encoded `request`; returns the encoded response, or a
/// sentence saying what went wrong. Gives up after `timeout`.
pub fn unary(
    socket: &Path,
    method: &str,
    request: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, String> {
    let deadline = Instant::now() + timeout;
    let mut conn = UnixStream::connect(socket).map_err(|e| format!("cannot connect: {e}"))?;
    conn.set_write_timeout(Some(timeout))
        .map_err(|e| format!("setting a timeout: {e}"))?;
    let mut out = Vec::with_capacity(256 + request.len());
    out.extend_from_slice(PREFACE);
    // ENABLE_PUSH = 0, INITIAL_WINDOW_SIZE = max.
    let mut settings = Vec::new();
    settings.extend_from_slice(&0x2u16.to_be_bytes());
    settings.extend_from_slice(&0u32.to_be_bytes());
    settings.extend_from_slice(&0x4u16.to_be_bytes());
    settings.extend_from_slice(&MAX_WINDOW.to_be_bytes());
    put_frame(&mut out, frame::SETTINGS, 0, 0, &settings);
    put_frame(
        &mut out,
        frame::WINDOW_UPDATE,
        0,
        0,
        &(MAX_WINDOW - DEFAULT_WINDOW).to_be_bytes(),
    );
    let headers = encode_headers(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", method),
        // What the kubelet itself sends to plugins since 1.26.
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]);
    put_frame(
        &mut out,
        frame::HEADERS,
        flag::END_HEADERS,
        STREAM,
        &headers,
    );
    let mut body = Vec::with_capacity(5 + request.len());
    body.push(0);
    body.extend_from_slice(&len_u32(request.len())?.to_be_bytes());
    body.extend_from_slice(request);
    put_frame(&mut out, frame::DATA, flag::END_STREAM, STREAM, &body);
    conn.write_all(&out)
        .map_err(|e| format!("sending the request: {e}"))?;
    read_response(&mut conn, deadline)
}

fn read_response(conn: &mut UnixStream, deadline: Instant) -> Result<Vec<u8>, String> {
    let mut decoder = hpack::Decoder::new();
    let mut block: Vec<u8> = Vec::new();
    let mut block_ends_stream = false;
    let mut in_headers = false;
    let mut status: Option<Vec<(Vec<u8>, Vec<u8>)>> = None;
    let mut body: Vec<u8> = Vec::new();
    loop {
        let (kind, flags, stream, payload) = read_frame(conn, deadline)?;
        if in_headers && kind != frame::CONTINUATION {
            return Err("the server interrupted a header block".into());
        }
        match kind {
            frame::SETTINGS if stream == 0 && flags & flag::ACK == 0 => {
                let mut ack = Vec::new();
                put_frame(&mut ack, frame::SETTINGS, flag::ACK, 0, &[]);
                conn.write_all(&ack)
                    .map_err(|e| format!("acknowledging SETTINGS: {e}"))?;
            }
            frame::PING if stream == 0 && flags & flag::ACK == 0 => {
                let mut pong = Vec::new();
                put_frame(&mut pong, frame::PING, flag::ACK, 0, &payload);
                conn.write_all(&pong)
                    .map_err(|e| format!("answering PING: {e}"))?;
            }
            frame::HEADERS if stream == STREAM => {
                let fragment = strip_padding(&payload, flags, true)?;
                block = fragment.to_vec();
                block_ends_stream = flags & flag::END_STREAM != 0;
                in_headers = flags & flag::END_HEADERS == 0;
            }
            frame::CONTINUATION if stream == STREAM && in_headers => {
                block.extend_from_slice(&payload);
                in_headers = flags & flag::END_HEADERS == 0;
            }
            frame::DATA if stream == STREAM => {
                let data = strip_padding(&payload, flags, false)?;
                if body.len() + data.len() > MAX_RESPONSE + 5 {
                    return Err(format!("the response is larger than {MAX_RESPONSE} bytes"));
                }
                body.extend_from_slice(data);
                if flags & flag::END_STREAM != 0 {
                    return Err("the response ended without a gRPC status (no trailers)".into());
                }
            }
            frame::RST_STREAM if stream == STREAM => {
                return Err(format!(
                    "the server reset the call (HTTP/2 error {})",
                    u32_at(&payload, 0).unwrap_or(0)
                ));
            }
            frame::GOAWAY => {
                return Err(format!(
                    "the server closed the connection (HTTP/2 error {})",
                    u32_at(&payload, 4).unwrap_or(0)
                ));
            }
            frame::PUSH_PROMISE => {
                return Err("the server pushed a stream although push is off".into());
            }
            // WINDOW_UPDATE, PRIORITY, unknown types and other streams: nothing to do.
            _ => {}
        }
        if (kind == frame::HEADERS || kind == frame::CONTINUATION) && !in_headers {
            let fields = decoder
                .decode(&block)
                // hpack's error has no Display; its Debug is no sentence.
                .map_err(|_| "the response headers are not valid HPACK".to_string())?;
            if status.is_none() {
                check_response_headers(&fields)?;
                status = Some(fields.clone());
            }
            if block_ends_stream {
                // Trailers, or a trailers-only response.
                check_grpc_status(&fields)?;
                return grpc_message(&body);
            }
        }
    }
}

fn read_frame(conn: &mut UnixStream, deadline: Instant) -> Result<(u8, u8, u32, Vec<u8>), String> {
    let mut head = [0u8; 9];
    read_exact_by(conn, &mut head, deadline)?;
    let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    if len > MAX_FRAME {
        return Err(format!(
            "the server sent a {len}-byte frame, larger than the {MAX_FRAME} allowed"
        ));
    }
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    read_exact_by(conn, &mut payload, deadline)?;
    Ok((head[3], head[4], stream, payload))
}

fn read_exact_by(conn: &mut UnixStream, buf: &mut [u8], deadline: Instant) -> Result<(), String> {
    let mut done = 0;
    while done < buf.len() {
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or("no answer within the timeout")?;
        conn.set_read_timeout(Some(left))
            .map_err(|e| format!("setting a timeout: {e}"))?;
        match conn.read(&mut buf[done..]) {
            Ok(0) => return Err("the server closed the connection mid-answer".into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err("no answer within the timeout".into());
            }
            Err(e) => return Err(format!("reading the answer: {e}")),
        }
    }
    Ok(())
}

/// The payload of a DATA or HEADERS frame without padding (and, for
/// HEADERS, without the priority fields).
fn strip_padding(payload: &[u8], flags: u8, headers: bool) -> Result<&[u8], String> {
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

fn header<'a>(fields: &'a [(Vec<u8>, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(n, _)| n.as_slice() == name.as_bytes())
        .map(|(_, v)| v.as_slice())
}

fn check_response_headers(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<(), String> {
    match header(fields, ":status") {
        Some(b"200") => {}
        Some(s) => {
            return Err(format!(
                "the server answered HTTP status {}",
                String::from_utf8_lossy(s)
            ));
        }
        None => return Err("the answer has no :status".into()),
    }
    match header(fields, "content-type") {
        Some(ct) if ct.starts_with(b"application/grpc") => Ok(()),
        other => Err(format!(
            "the answer is not gRPC (content-type {:?})",
            other.map(String::from_utf8_lossy).unwrap_or_default()
        )),
    }
}

fn check_grpc_status(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<(), String> {
    let status = header(fields, "grpc-status").ok_or("the answer has no grpc-status")?;
    if status == b"0" {
        return Ok(());
    }
    let message = header(fields, "grpc-message")
        .map(percent_decode)
        .unwrap_or_default();
    Err(format!(
        "the server answered gRPC status {} ({}){}",
        String::from_utf8_lossy(status),
        grpc_code_name(status),
        if message.is_empty() {
            String::new()
        } else {
            format!(": {message}")
        }
    ))
}

fn grpc_code_name(status: &[u8]) -> &'static str {
    match status {
        b"1" => "cancelled",
        b"2" => "unknown",
        b"3" => "invalid argument",
        b"4" => "deadline exceeded",
        b"5" => "not found",
        b"7" => "permission denied",
        b"8" => "resource exhausted",
        b"12" => "unimplemented",
        b"13" => "internal",
        b"14" => "unavailable",
        _ => "error",
    }
}

/// The one length-prefixed message of a unary response.
fn grpc_message(body: &[u8]) -> Result<Vec<u8>, String> {
    let (&compressed, rest) = body.split_first().ok_or("the answer has no message")?;
    if compressed != 0 {
        return Err("the answer is compressed, which was not asked for".into());
    }
    let len = u32_at(rest, 0).ok_or("the answer's message prefix is truncated")? as usize;
    let msg = rest
        .get(4..4 + len)
        .ok_or("the answer's message is shorter than its prefix says")?;
    if rest.len() != 4 + len {
        return Err("the answer holds more than one message".into());
    }
    Ok(msg.to_vec())
}

fn percent_decode(v: &[u8]) -> String {
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        if v[i] == b'%' && i + 2 < v.len() {
            if let Ok(b) = u8::from_str_radix(&String::from_utf8_lossy(&v[i + 1..i + 3]), 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(v[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at + 4)?;
    Some(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

fn len_u32(n: usize) -> Result<u32, String> {
    u32::try_from(n).map_err(|_| format!("a {n}-byte request is too large"))
}

fn put_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// HPACK "literal header field without indexing, new name" for each header
/// (RFC 7541 §6.2.2): no table state, no Huffman; any server decodes it.
fn encode_headers(headers: &[(&str, &str)]) -> Vec<u8> {
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
    fn grpc_statuses_read_as_sentences() {
        let f = |s: &str, m: &str| {
            vec![
                (b"grpc-status".to_vec(), s.as_bytes().to_vec()),
                (b"grpc-message".to_vec(), m.as_bytes().to_vec()),
            ]
        };
        assert!(check_grpc_status(&f("0", "")).is_ok());
        let e = check_grpc_status(&f("12", "method%20List%20not%20implemented")).unwrap_err();
        assert_eq!(
            e,
            "the server answered gRPC status 12 (unimplemented): method List not implemented"
        );
    }

    #[test]
    fn the_message_prefix_is_checked() {
        assert_eq!(grpc_message(&[0, 0, 0, 0, 2, 7, 8]).unwrap(), vec![7, 8]);
        assert!(grpc_message(&[0, 0, 0, 0, 3, 7, 8]).is_err());
        assert!(grpc_message(&[1, 0, 0, 0, 0]).is_err());
        assert!(grpc_message(&[]).is_err());
    }
}

//! One unary gRPC call over a unix socket, with nothing but the standard
//! library: HTTP/2 frames (RFC 9113, written and read by [`frame`]) on a
//! blocking socket, response headers decoded by the `hpack` crate.
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
//! message. A failed call says why as a [`CallError`], so a caller can tell
//! a refusal it may retry from a missing socket or a silent server.
//!
//! Its own crate so that the CNI (ADD's PodResources `List`) and the e2e
//! (its lenient HTTP/2 relay in front of the test kubelet, the PodResources
//! burst bench) share one HTTP/2 framing without the e2e depending on the
//! CNI binary's insides.

pub mod frame;

use frame::{MAX_FRAME, PREFACE, encode_headers, flag, kind, put_frame, put_message, setting};
use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// The largest response body accepted (Multus accepts the same from this API).
pub const MAX_RESPONSE: usize = 16 * 1024 * 1024;

/// gRPC status codes a caller treats on purpose.
pub mod code {
    /// `RESOURCE_EXHAUSTED`: the kubelet's rate limit refused the call.
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    /// `UNAVAILABLE`: the server cannot take the call now.
    pub const UNAVAILABLE: u32 = 14;
}

/// Why a unary call brought no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The socket could not be connected: `kind` is `NotFound` when it does
    /// not exist, `ConnectionRefused` when nothing listens on it.
    Connect {
        /// The connect error's kind.
        kind: ErrorKind,
        /// The connect error as the OS words it.
        detail: String,
    },
    /// No answer came before the deadline.
    Timeout,
    /// The server answered a gRPC status other than OK.
    Status {
        /// The status code, e.g. [`code::RESOURCE_EXHAUSTED`].
        code: u32,
        /// The status message, percent-decoded; may be empty.
        message: String,
    },
    /// Any other failure (HTTP/2, HTTP, framing), as a sentence.
    Other(String),
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Connect { detail, .. } => write!(f, "cannot connect: {detail}"),
            CallError::Timeout => f.write_str("no answer within the timeout"),
            CallError::Status { code, message } => {
                write!(f, "the server answered {}", status_text(*code, message))
            }
            CallError::Other(s) => f.write_str(s),
        }
    }
}

impl From<String> for CallError {
    fn from(s: String) -> Self {
        CallError::Other(s)
    }
}

impl From<&str> for CallError {
    fn from(s: &str) -> Self {
        CallError::Other(s.to_string())
    }
}

const STREAM: u32 = 1;
const MAX_WINDOW: u32 = 0x7fff_ffff;
const DEFAULT_WINDOW: u32 = 65_535;

/// Calls `method` (e.g. `/v1.PodResourcesLister/List`) on the gRPC server at
/// `socket` with the encoded `request`; returns the encoded response, or
/// what went wrong. Gives up after `timeout`.
pub fn unary(
    socket: &Path,
    method: &str,
    request: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, CallError> {
    let deadline = Instant::now() + timeout;
    let mut conn = UnixStream::connect(socket).map_err(|e| CallError::Connect {
        kind: e.kind(),
        detail: e.to_string(),
    })?;
    conn.set_write_timeout(Some(timeout))
        .map_err(|e| format!("setting a timeout: {e}"))?;
    let mut out = Vec::with_capacity(256 + request.len());
    out.extend_from_slice(PREFACE);
    // ENABLE_PUSH = 0, INITIAL_WINDOW_SIZE = max.
    let mut settings = Vec::new();
    settings.extend_from_slice(&setting::ENABLE_PUSH.to_be_bytes());
    settings.extend_from_slice(&0u32.to_be_bytes());
    settings.extend_from_slice(&setting::INITIAL_WINDOW_SIZE.to_be_bytes());
    settings.extend_from_slice(&MAX_WINDOW.to_be_bytes());
    put_frame(&mut out, kind::SETTINGS, 0, 0, &settings);
    put_frame(
        &mut out,
        kind::WINDOW_UPDATE,
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
    put_frame(&mut out, kind::HEADERS, flag::END_HEADERS, STREAM, &headers);
    let mut body = Vec::with_capacity(5 + request.len());
    put_message(&mut body, request)?;
    put_frame(&mut out, kind::DATA, flag::END_STREAM, STREAM, &body);
    conn.write_all(&out)
        .map_err(|e| format!("sending the request: {e}"))?;
    read_response(&mut conn, deadline)
}

fn read_response(conn: &mut UnixStream, deadline: Instant) -> Result<Vec<u8>, CallError> {
    let mut decoder = hpack::Decoder::new();
    let mut block: Vec<u8> = Vec::new();
    let mut block_ends_stream = false;
    let mut in_headers = false;
    let mut status: Option<Vec<(Vec<u8>, Vec<u8>)>> = None;
    let mut body: Vec<u8> = Vec::new();
    loop {
        let frame::Frame {
            kind: frame_type,
            flags,
            stream,
            payload,
        } = read_frame(conn, deadline)?;
        if in_headers && frame_type != kind::CONTINUATION {
            return Err("the server interrupted a header block".into());
        }
        match frame_type {
            kind::SETTINGS if stream == 0 && flags & flag::ACK == 0 => {
                let mut ack = Vec::new();
                put_frame(&mut ack, kind::SETTINGS, flag::ACK, 0, &[]);
                conn.write_all(&ack)
                    .map_err(|e| format!("acknowledging SETTINGS: {e}"))?;
            }
            kind::PING if stream == 0 && flags & flag::ACK == 0 => {
                let mut pong = Vec::new();
                put_frame(&mut pong, kind::PING, flag::ACK, 0, &payload);
                conn.write_all(&pong)
                    .map_err(|e| format!("answering PING: {e}"))?;
            }
            kind::HEADERS if stream == STREAM => {
                let fragment = frame::strip_padding(&payload, flags, true)?;
                block = fragment.to_vec();
                block_ends_stream = flags & flag::END_STREAM != 0;
                in_headers = flags & flag::END_HEADERS == 0;
            }
            kind::CONTINUATION if stream == STREAM && in_headers => {
                block.extend_from_slice(&payload);
                in_headers = flags & flag::END_HEADERS == 0;
            }
            kind::DATA if stream == STREAM => {
                let data = frame::strip_padding(&payload, flags, false)?;
                if body.len() + data.len() > MAX_RESPONSE + 5 {
                    return Err(format!("the response is larger than {MAX_RESPONSE} bytes").into());
                }
                body.extend_from_slice(data);
                if flags & flag::END_STREAM != 0 {
                    return Err("the response ended without a gRPC status (no trailers)".into());
                }
            }
            kind::RST_STREAM if stream == STREAM => {
                return Err(format!(
                    "the server reset the call (HTTP/2 error {})",
                    u32_at(&payload, 0).unwrap_or(0)
                )
                .into());
            }
            kind::GOAWAY => {
                return Err(format!(
                    "the server closed the connection (HTTP/2 error {})",
                    u32_at(&payload, 4).unwrap_or(0)
                )
                .into());
            }
            kind::PUSH_PROMISE => {
                return Err("the server pushed a stream although push is off".into());
            }
            // WINDOW_UPDATE, PRIORITY, unknown types and other streams: nothing to do.
            _ => {}
        }
        if (frame_type == kind::HEADERS || frame_type == kind::CONTINUATION) && !in_headers {
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
                return Ok(grpc_message(&body)?);
            }
        }
    }
}

/// The next frame of the answer, read by `deadline`.
fn read_frame(conn: &mut UnixStream, deadline: Instant) -> Result<frame::Frame, CallError> {
    match frame::read_frame(&mut ByDeadline { conn, deadline }, MAX_FRAME) {
        Ok(Some(f)) => Ok(f),
        Ok(None) => Err("the server closed the connection mid-answer".into()),
        Err(e) => Err(match e.kind() {
            ErrorKind::UnexpectedEof => "the server closed the connection mid-answer".into(),
            ErrorKind::WouldBlock | ErrorKind::TimedOut => CallError::Timeout,
            ErrorKind::InvalidData => format!("the server sent {e}").into(),
            _ => format!("reading the answer: {e}").into(),
        }),
    }
}

/// The connection read with what is left until `deadline` as its timeout:
/// past it, a read fails with `TimedOut`.
struct ByDeadline<'a> {
    conn: &'a mut UnixStream,
    deadline: Instant,
}

impl Read for ByDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self
            .deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(ErrorKind::TimedOut)?;
        self.conn.set_read_timeout(Some(left))?;
        self.conn.read(buf)
    }
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

fn check_grpc_status(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<(), CallError> {
    let status = header(fields, "grpc-status").ok_or("the answer has no grpc-status")?;
    if status == b"0" {
        return Ok(());
    }
    let code = std::str::from_utf8(status)
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .ok_or_else(|| {
            format!(
                "the answer's grpc-status {:?} is not a number",
                String::from_utf8_lossy(status)
            )
        })?;
    let message = header(fields, "grpc-message")
        .map(percent_decode)
        .unwrap_or_default();
    Err(CallError::Status { code, message })
}

/// A gRPC status as people read it: `gRPC status 8 (resource exhausted):
/// rejected by rate limit`.
pub fn status_text(code: u32, message: &str) -> String {
    let name = grpc_code_name(code);
    if message.is_empty() {
        format!("gRPC status {code} ({name})")
    } else {
        format!("gRPC status {code} ({name}): {message}")
    }
}

fn grpc_code_name(code: u32) -> &'static str {
    match code {
        1 => "cancelled",
        2 => "unknown",
        3 => "invalid argument",
        4 => "deadline exceeded",
        5 => "not found",
        7 => "permission denied",
        8 => "resource exhausted",
        12 => "unimplemented",
        13 => "internal",
        14 => "unavailable",
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

#[cfg(test)]
mod tests {
    use super::*;

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
            e.to_string(),
            "the server answered gRPC status 12 (unimplemented): method List not implemented"
        );
        assert_eq!(
            check_grpc_status(&f("8", "rejected%20by%20rate%20limit")).unwrap_err(),
            CallError::Status {
                code: code::RESOURCE_EXHAUSTED,
                message: "rejected by rate limit".into()
            }
        );
        assert!(matches!(
            check_grpc_status(&f("x", "")).unwrap_err(),
            CallError::Other(_)
        ));
    }

    #[test]
    fn the_message_prefix_is_checked() {
        assert_eq!(grpc_message(&[0, 0, 0, 0, 2, 7, 8]).unwrap(), vec![7, 8]);
        assert!(grpc_message(&[0, 0, 0, 0, 3, 7, 8]).is_err());
        assert!(grpc_message(&[1, 0, 0, 0, 0]).is_err());
        assert!(grpc_message(&[]).is_err());
    }
}

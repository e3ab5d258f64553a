//! gRPC on a unix socket for clients that send the socket's path as the
//! HTTP/2 `:authority`, as the kubelet's plugin watcher does when it asks a
//! plugin's registration socket `GetInfo` (grpc-go dialing a bare path
//! with the passthrough resolver; kubernetes/kubernetes#109081). hyper's
//! h2 refuses such a request with `PROTOCOL_ERROR` (a path is no URI
//! authority; hyperium/h2#487, unmerged), so the kubelet never registers
//! the plugin.
//!
//! [`serve_unix_any_authority`] puts a pump between each accepted
//! connection and the gRPC server: frames from the client pass through
//! unchanged, except each request's header block, which is decoded
//! (HPACK, with the connection's own decoder state) and written again as
//! literals without indexing (so the server's decoder table is never
//! touched), an `:authority` holding a `/` replaced by `localhost`. Frames
//! to the client pass through untouched.

use crate::transport::{Connections, Counted};
use std::future::Future;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::codegen::{Service, http};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame types and flags (RFC 9113 §6).
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame payload written: the default SETTINGS_MAX_FRAME_SIZE,
/// which every peer accepts.
const MAX_WRITE: usize = 16_384;
/// The largest frame payload or header block read (2^24 - 1 is the wire
/// format's bound; a header block this large is no gRPC request).
const MAX_READ: usize = 1 << 20;
/// The buffer between the pump and the server.
const PIPE: usize = 64 * 1024;

fn malformed(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// An HPACK integer with an `n`-bit prefix whose other bits are `first`
/// (RFC 7541 §5.1).
fn put_int(out: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// `headers` as HPACK literals without indexing, new names, no Huffman
/// (RFC 7541 §6.2.2): decodable by any decoder, whatever its table holds.
pub(crate) fn literal_block(headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        out.push(0x00);
        put_int(&mut out, 0, 7, name.len());
        out.extend_from_slice(name);
        put_int(&mut out, 0, 7, value.len());
        out.extend_from_slice(value);
    }
    out
}

/// Whether h2 takes `value` as an `:authority`: it parses it exactly so
/// (`http::uri::Authority`, h2 `server.rs` `convert_poll_message`).
fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// `headers` with an `:authority` that h2 would refuse (a socket path, as
/// it is or percent-encoded as grpc-go encodes it) made `localhost`; the
/// rest as they were.
pub(crate) fn fix_authority(headers: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    headers
        .into_iter()
        .map(|(name, value)| {
            if name == b":authority" && !valid_authority(&value) {
                (name, b"localhost".to_vec())
            } else {
                (name, value)
            }
        })
        .collect()
}

/// One frame's header (9 bytes) and payload.
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

async fn read_frame(r: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Option<Frame>> {
    let mut head = [0u8; 9];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    if len > MAX_READ {
        return Err(malformed("a frame larger than 1 MiB"));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok(Some(Frame {
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
        payload,
    }))
}

fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The header block fragment of a HEADERS frame's payload: its padding and
/// priority fields taken off (RFC 9113 §6.2).
fn fragment(flags: u8, payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut body = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&n, rest) = body
            .split_first()
            .ok_or_else(|| malformed("a padded HEADERS frame without its pad length"))?;
        pad = n as usize;
        body = rest;
    }
    if flags & PRIORITY != 0 {
        body = body
            .get(5..)
            .ok_or_else(|| malformed("a HEADERS frame shorter than its priority"))?;
    }
    let end = body
        .len()
        .checked_sub(pad)
        .ok_or_else(|| malformed("a HEADERS frame shorter than its padding"))?;
    Ok(body[..end].to_vec())
}

/// The client's frames to the server, each request's header block
/// rewritten by [`fix_authority`].
async fn client_to_server(
    r: &mut (impl AsyncRead + Unpin),
    w: &mut (impl AsyncWrite + Unpin),
) -> std::io::Result<()> {
    let mut preface = [0u8; 24];
    r.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(malformed("no HTTP/2 connection preface"));
    }
    w.write_all(&preface).await?;
    let mut decoder = hpack::Decoder::new();
    while let Some(f) = read_frame(r).await? {
        if f.kind != HEADERS {
            w.write_all(&frame_bytes(f.kind, f.flags, f.stream, &f.payload))
                .await?;
            continue;
        }
        let mut block = fragment(f.flags, &f.payload)?;
        let mut ended = f.flags & END_HEADERS != 0;
        while !ended {
            let c = read_frame(r)
                .await?
                .ok_or_else(|| malformed("the connection ended inside a header block"))?;
            if c.kind != CONTINUATION || c.stream != f.stream {
                return Err(malformed("a header block not continued by CONTINUATION"));
            }
            if block.len() + c.payload.len() > MAX_READ {
                return Err(malformed("a header block larger than 1 MiB"));
            }
            block.extend_from_slice(&c.payload);
            ended = c.flags & END_HEADERS != 0;
        }
        let headers = decoder.decode(&block).map_err(|e| {
            malformed(&format!(
                "an HPACK header block that does not decode: {e:?}"
            ))
        })?;
        let out = literal_block(&fix_authority(headers));
        let mut chunks = out.chunks(MAX_WRITE).peekable();
        let mut first = true;
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            let (kind, mut flags) = if first {
                (HEADERS, f.flags & END_STREAM)
            } else {
                (CONTINUATION, 0)
            };
            if last {
                flags |= END_HEADERS;
            }
            w.write_all(&frame_bytes(kind, flags, f.stream, chunk))
                .await?;
            first = false;
        }
        if out.is_empty() {
            w.write_all(&frame_bytes(
                HEADERS,
                (f.flags & END_STREAM) | END_HEADERS,
                f.stream,
                &[],
            ))
            .await?;
        }
    }
    Ok(())
}

/// Pumps one connection: `client` (the accepted socket) to and from
/// `server` (the gRPC server's end of a pipe), until either side ends.
async fn pump(client: UnixStream, server: DuplexStream) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = tokio::io::split(server);
    let up = async {
        let _ = client_to_server(&mut cr, &mut sw).await;
        let _ = sw.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}

/// Serves the gRPC service `svc` on `listener` as
/// [`serve_unix`](crate::transport::serve_unix) does, for clients that send
/// the socket's path as `:authority` (each connection through the pump of
/// this module).
pub async fn serve_unix_any_authority<S>(
    svc: S,
    listener: UnixListener,
    shutdown: impl Future<Output = ()>,
    connections: Connections,
) -> std::result::Result<(), tonic::transport::Error>
where
    S: Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let count = connections.0;
    let incoming = UnixListenerStream::new(listener).map(move |accepted| {
        accepted.map(|client| {
            let (ours, theirs) = tokio::io::duplex(PIPE);
            tokio::spawn(pump(client, theirs));
            Counted::new(ours, count.clone())
        })
    });
    tonic::transport::Server::builder()
        .serve_with_incoming_shutdown(svc, incoming, shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pluginregistration::registration_server::{Registration, RegistrationServer};
    use crate::pluginregistration::{
        InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    };
    use crate::transport::{bind_unix, serve_unix};
    use prost::Message;

    #[derive(Clone)]
    struct Plugin;

    #[tonic::async_trait]
    impl Registration for Plugin {
        async fn get_info(
            &self,
            _: tonic::Request<InfoRequest>,
        ) -> Result<tonic::Response<PluginInfo>, tonic::Status> {
            Ok(tonic::Response::new(PluginInfo {
                name: "example.com".into(),
                ..Default::default()
            }))
        }

        async fn notify_registration_status(
            &self,
            _: tonic::Request<RegistrationStatus>,
        ) -> Result<tonic::Response<RegistrationStatusResponse>, tonic::Status> {
            Ok(tonic::Response::new(RegistrationStatusResponse {}))
        }
    }

    /// How the server answered one request.
    #[derive(Debug, PartialEq)]
    enum Answer {
        /// The stream was reset with this HTTP/2 error code.
        Reset(u32),
        /// gRPC status, and the name in the PluginInfo answered.
        Grpc(String, String),
    }

    /// `GetInfo` on `socket` as grpc-go sends it when it dials a bare path:
    /// the path, percent-encoded, as `:authority`.
    async fn get_info_with_path_authority(socket: &std::path::Path) -> Answer {
        let encoded: String = socket
            .to_string_lossy()
            .chars()
            .map(|c| {
                if c == '/' {
                    "%2F".to_string()
                } else {
                    c.to_string()
                }
            })
            .collect();
        let mut s = UnixStream::connect(socket).await.unwrap();
        let block = literal_block(&[
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (
                b":path".to_vec(),
                b"/pluginregistration.Registration/GetInfo".to_vec(),
            ),
            (b":authority".to_vec(), encoded.into_bytes()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
            (b"te".to_vec(), b"trailers".to_vec()),
        ]);
        let mut out = PREFACE.to_vec();
        out.extend(frame_bytes(0x4, 0, 0, &[]));
        out.extend(frame_bytes(HEADERS, END_HEADERS, 1, &block));
        out.extend(frame_bytes(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]));
        s.write_all(&out).await.unwrap();
        let mut decoder = hpack::Decoder::new();
        let (mut name, mut status) = (String::new(), String::new());
        while let Some(f) = read_frame(&mut s).await.unwrap() {
            match (f.kind, f.stream) {
                (0x3, 1) => {
                    let code = u32::from_be_bytes(f.payload[..4].try_into().unwrap());
                    return Answer::Reset(code);
                }
                (0x0, 1) if f.payload.len() >= 5 => {
                    name = PluginInfo::decode(&f.payload[5..]).unwrap().name;
                }
                (HEADERS, 1) => {
                    let headers = decoder
                        .decode(&fragment(f.flags, &f.payload).unwrap())
                        .unwrap();
                    for (n, v) in headers {
                        if n == b"grpc-status" {
                            status = String::from_utf8(v).unwrap();
                        }
                    }
                    if f.flags & END_STREAM != 0 {
                        return Answer::Grpc(status, name);
                    }
                }
                (0x4, 0) if f.flags & 0x1 == 0 => {
                    s.write_all(&frame_bytes(0x4, 0x1, 0, &[])).await.unwrap();
                }
                _ => {}
            }
        }
        panic!("the server closed the connection without answering");
    }

    /// The kubelet's plugin watcher's request: refused by the plain server
    /// (the reason this module exists), answered through the pump.
    #[tokio::test]
    async fn a_path_as_authority_is_refused_by_h2_and_answered_through_the_pump() {
        let tmp = tempfile::tempdir().unwrap();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let plain = tmp.path().join("plain.sock");
        let listener = bind_unix(&plain).unwrap();
        let server = tokio::spawn(serve_unix(
            RegistrationServer::new(Plugin),
            listener,
            wait(stopped.clone()),
            Connections::default(),
        ));
        assert_eq!(
            get_info_with_path_authority(&plain).await,
            Answer::Reset(0x1)
        );
        let pumped = tmp.path().join("pumped.sock");
        let listener = bind_unix(&pumped).unwrap();
        let pumped_server = tokio::spawn(serve_unix_any_authority(
            RegistrationServer::new(Plugin),
            listener,
            wait(stopped),
            Connections::default(),
        ));
        assert_eq!(
            get_info_with_path_authority(&pumped).await,
            Answer::Grpc("0".into(), "example.com".into())
        );
        stop.send(true).unwrap();
        server.await.unwrap().unwrap();
        pumped_server.await.unwrap().unwrap();
    }

    #[test]
    fn literals_decode_to_the_same_headers_and_a_path_authority_becomes_localhost() {
        let headers = vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (
                b":authority".to_vec(),
                b"/var/lib/kubelet/plugins_registry/x-reg.sock".to_vec(),
            ),
            (b"x-long".to_vec(), vec![b'a'; 300]),
        ];
        let fixed = fix_authority(headers.clone());
        assert_eq!(fixed[1].1, b"localhost");
        assert_eq!(fixed[0], headers[0]);
        let block = literal_block(&fixed);
        assert_eq!(hpack::Decoder::new().decode(&block).unwrap(), fixed);
        let kept = fix_authority(vec![(b":authority".to_vec(), b"localhost:80".to_vec())]);
        assert_eq!(kept[0].1, b"localhost:80");
        // grpc-go percent-encodes the path (its clientconn.go
        // `encodeAuthority`); h2 refuses that too.
        let encoded = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock".to_vec();
        let fixed = fix_authority(vec![(b":authority".to_vec(), encoded)]);
        assert_eq!(fixed[0].1, b"localhost");
    }

    #[test]
    fn padding_and_priority_are_taken_off_a_fragment() {
        // Pad length 2, priority (5 bytes), fragment "ab", padding.
        let payload = [2, 0, 0, 0, 1, 16, b'a', b'b', 0, 0];
        assert_eq!(fragment(PADDED | PRIORITY, &payload).unwrap(), b"ab");
        assert!(fragment(PADDED, &[9, b'a']).is_err());
    }
}

//! The kubelet's PodResources socket at a second path, answering any
//! client the real kubelet answers.
//!
//! The kubelet serves PodResources with grpc-go, which does not check a
//! request's `:authority`. Multus (`pkg/kubeletclient/kubeletclient.go`)
//! dials `/var/lib/kubelet/pod-resources/kubelet.sock` with grpc-go's
//! default (passthrough) resolver, so its requests carry the socket path as
//! `:authority`, which the test kubelet's tonic server rejects
//! (`PROTOCOL_ERROR`, malformed authority). So this endpoint speaks just
//! enough HTTP/2 to take unary `List` calls from any client, and answers
//! each with what the node's [`TestPodResources`] answers at that moment
//! (it asks it over its own socket), so both paths report one state.
//!
//! Frames are read and written by [`grpc_unary::frame`],
//! and the node's socket is asked with the CNI's own unary client
//! ([`grpc_unary::unary`]), so HTTP/2 is framed in one place.
//!
//! The same relay ([`LenientUnary`]) serves the kubelet's Registration
//! socket for the Go project's device plugin, whose grpc-go client (v1.56,
//! via device-plugin-manager) dials `kubelet.sock` by path and so sends the
//! path as `:authority` too: `Register` is relayed to the test kubelet with
//! its request.
//!
//! [`TestPodResources`]: test_kubelet::TestPodResources

use anyhow::{Context, Result, bail};
use grpc_unary::frame::{
    self, MAX_FRAME, PREFACE, encode_headers, flag, kind, put_frame, put_message,
};
use macvtap_cni::podresources::LIST;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long the node's socket may take to answer a relayed `List`.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(10);

/// A PodResources endpoint on `path` that relays `List` to the node's test
/// kubelet socket `upstream`; removes its socket on drop.
pub struct LenientPodResources {
    _relay: LenientUnary,
}

impl LenientPodResources {
    /// Binds `path` (which must not exist) and serves it from a thread.
    pub fn serve(path: &Path, upstream: &Path) -> Result<Self> {
        Ok(Self {
            _relay: LenientUnary::serve(path, upstream, &[LIST])?,
        })
    }
}

/// A gRPC endpoint on `path` that takes unary calls of `methods` from any
/// client and relays each, with its request, to the server at `upstream`;
/// other methods are unimplemented. Removes its socket on drop.
pub struct LenientUnary {
    path: PathBuf,
    stop: Arc<AtomicBool>,
}

impl LenientUnary {
    /// Binds `path` (which must not exist) and serves it from a thread.
    pub fn serve(path: &Path, upstream: &Path, methods: &'static [&'static str]) -> Result<Self> {
        let listener =
            UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (s, up) = (stop.clone(), upstream.to_path_buf());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let up = up.clone();
                std::thread::spawn(move || {
                    // A client that hangs up after its answer is not an error.
                    if let Err(e) = serve_connection(conn, &up, methods) {
                        let gone = e.downcast_ref::<std::io::Error>().is_some_and(|e| {
                            matches!(
                                e.kind(),
                                std::io::ErrorKind::BrokenPipe
                                    | std::io::ErrorKind::ConnectionReset
                            )
                        });
                        if !gone {
                            eprintln!("gRPC relay at the host path: {e:#}");
                        }
                    }
                });
            }
        });
        Ok(LenientUnary {
            path: path.to_path_buf(),
            stop,
        })
    }
}

impl Drop for LenientUnary {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Writes one frame to `out`.
fn send(out: &mut impl Write, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Result<()> {
    let mut buf = Vec::with_capacity(9 + payload.len());
    put_frame(&mut buf, kind, flags, stream, payload);
    out.write_all(&buf)?;
    Ok(())
}

struct Call {
    block: Vec<u8>,
    body: Vec<u8>,
    headers_done: bool,
    ended: bool,
}

fn serve_connection(conn: UnixStream, upstream: &Path, methods: &[&str]) -> Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut reader = conn.try_clone()?;
    let mut out = conn;
    let mut preface = [0u8; 24];
    reader.read_exact(&mut preface)?;
    if preface != PREFACE {
        bail!("not an HTTP/2 client");
    }
    send(&mut out, kind::SETTINGS, 0, 0, &[])?;
    let mut decoder = hpack::Decoder::new();
    let mut calls: std::collections::HashMap<u32, Call> = Default::default();
    while let Some(f) = frame::read_frame(&mut reader, MAX_FRAME)? {
        let (flags, stream) = (f.flags, f.stream);
        match f.kind {
            kind::SETTINGS if flags & flag::ACK == 0 => {
                send(&mut out, kind::SETTINGS, flag::ACK, 0, &[])?
            }
            kind::PING if flags & flag::ACK == 0 => {
                send(&mut out, kind::PING, flag::ACK, 0, &f.payload)?
            }
            kind::GOAWAY => return Ok(()),
            kind::HEADERS | kind::CONTINUATION => {
                let c = calls.entry(stream).or_insert(Call {
                    block: Vec::new(),
                    body: Vec::new(),
                    headers_done: false,
                    ended: false,
                });
                if f.kind == kind::HEADERS {
                    let fragment = frame::strip_padding(&f.payload, flags, true)
                        .map_err(|e| anyhow::anyhow!("stream {stream}: {e}"))?;
                    c.block.extend_from_slice(fragment);
                    if flags & flag::END_STREAM != 0 {
                        c.ended = true;
                    }
                } else {
                    c.block.extend_from_slice(&f.payload);
                }
                if flags & flag::END_HEADERS != 0 {
                    c.headers_done = true;
                }
            }
            kind::DATA => {
                if let Some(c) = calls.get_mut(&stream) {
                    let data = frame::strip_padding(&f.payload, flags, false)
                        .map_err(|e| anyhow::anyhow!("stream {stream}: {e}"))?;
                    c.body.extend_from_slice(data);
                    if flags & flag::END_STREAM != 0 {
                        c.ended = true;
                    }
                }
            }
            _ => {}
        }
        let ready: Vec<u32> = calls
            .iter()
            .filter(|(_, c)| c.headers_done && c.ended)
            .map(|(s, _)| *s)
            .collect();
        for s in ready {
            let Some(c) = calls.remove(&s) else { continue };
            let headers = decoder
                .decode(&c.block)
                .map_err(|e| anyhow::anyhow!("undecodable request headers: {e:?}"))?;
            let path = headers
                .iter()
                .find(|(k, _)| k.as_slice() == b":path")
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            // The gRPC message after its 5-byte prefix (flag, length).
            let request = c.body.get(5..).unwrap_or_default();
            respond(&mut out, s, &path, request, upstream, methods)?;
        }
    }
    Ok(())
}

fn respond(
    out: &mut impl Write,
    stream: u32,
    path: &str,
    request: &[u8],
    upstream: &Path,
    methods: &[&str],
) -> Result<()> {
    let head = encode_headers(&[(":status", "200"), ("content-type", "application/grpc")]);
    send(out, kind::HEADERS, flag::END_HEADERS, stream, &head)?;
    let mut message = String::new();
    let status = if methods.contains(&path) {
        match relay(upstream, path, request) {
            Ok(msg) => {
                let mut body = Vec::with_capacity(5 + msg.len());
                put_message(&mut body, &msg).map_err(anyhow::Error::msg)?;
                for chunk in body.chunks(MAX_FRAME) {
                    send(out, kind::DATA, 0, stream, chunk)?;
                }
                "0"
            }
            Err(e) => {
                // The upstream's refusal reaches the caller (as UNKNOWN,
                // its text percent-free and on one line).
                message = format!("{e:#}").replace(['%', '\n', '\r'], " ");
                "2"
            }
        }
    } else {
        "12"
    };
    let mut trailer = vec![("grpc-status", status)];
    if !message.is_empty() {
        trailer.push(("grpc-message", message.as_str()));
    }
    let trailers = encode_headers(&trailer);
    send(
        out,
        kind::HEADERS,
        flag::END_HEADERS | flag::END_STREAM,
        stream,
        &trailers,
    )?;
    out.flush()?;
    Ok(())
}

/// The upstream's answer to `method` with `request` (both encoded; `List`'s
/// request has no fields, so its encoding is empty).
fn relay(upstream: &Path, method: &str, request: &[u8]) -> Result<Vec<u8>> {
    grpc_unary::unary(upstream, method, request, UPSTREAM_TIMEOUT)
        .map_err(|e| anyhow::anyhow!("{method} on {}: {e}", upstream.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use macvtap_cni::podresources::{self, devices_of};
    use test_kubelet::TestPodResources;

    #[test]
    fn list_is_relayed_whole_and_other_methods_are_unimplemented() {
        let dir = tempfile::tempdir().unwrap();
        let upstream = dir.path().join("node.sock");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let node = rt.block_on(TestPodResources::start(&upstream)).unwrap();
        node.set_allocated("macvtap.network.kubevirt.io/dataplane", &["dataplaneMvp1"]);
        // Enough pods that the answer spans several DATA frames.
        for i in 0..400 {
            node.add_pod("tenant", &format!("pod-{i}"), &[("example.com/r", &["d"])]);
        }
        let host = dir.path().join("host.sock");
        let relay = LenientPodResources::serve(&host, &upstream).unwrap();

        let direct = podresources::list(&upstream).unwrap();
        let relayed = podresources::list(&host).unwrap();
        assert_eq!(relayed, direct);
        assert_eq!(relayed.len(), 401);
        let held = devices_of(&relayed, "default", "test-pod").unwrap();
        assert_eq!(held[0].id, "dataplaneMvp1");

        let err = grpc_unary::unary(
            &host,
            "/v1.PodResourcesLister/Get",
            &[],
            Duration::from_secs(5),
        )
        .unwrap_err();
        let err = err.to_string();
        assert!(err.contains("gRPC status 12 (unimplemented)"), "{err}");

        drop(relay);
        assert!(!host.exists());
        drop(node);
    }

    #[test]
    fn a_unary_call_is_relayed_with_its_request_and_its_refusal_comes_back() {
        use kubelet_proto::v1beta1::RegisterRequest;
        use prost::Message;
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let kubelet = rt
            .block_on(test_kubelet::TestKubelet::start(dir.path()))
            .unwrap();
        let upstream = dir.path().join("upstream.sock");
        std::fs::rename(dir.path().join("kubelet.sock"), &upstream).unwrap();
        let front = dir.path().join("kubelet.sock");
        const REGISTER: &str = "/v1beta1.Registration/Register";
        let relay = LenientUnary::serve(&front, &upstream, &[REGISTER]).unwrap();
        // A version the kubelet refuses: the refusal records what arrived.
        let request = RegisterRequest {
            version: "v1alpha".into(),
            endpoint: "example.sock".into(),
            resource_name: "example.com/relayed".into(),
            options: None,
        };
        let err = grpc_unary::unary(
            &front,
            REGISTER,
            &request.encode_to_vec(),
            Duration::from_secs(5),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("v1alpha"), "{err}");
        let refused = kubelet.refusals();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].request, request);
        drop(relay);
        drop(kubelet);
    }
}

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
//! [`TestPodResources`]: test_kubelet::TestPodResources

use anyhow::{Context, Result, bail};
use kubelet_proto::podresources::v1::ListPodResourcesRequest;
use kubelet_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use prost::Message;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const LIST_PATH: &str = "/v1.PodResourcesLister/List";
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// A PodResources endpoint on `path` that relays `List` to the node's test
/// kubelet socket `upstream`; removes its socket on drop.
pub struct LenientPodResources {
    path: PathBuf,
    stop: Arc<AtomicBool>,
}

impl LenientPodResources {
    /// Binds `path` (which must not exist) and serves it from a thread.
    pub fn serve(path: &Path, upstream: &Path) -> Result<Self> {
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
                    if let Err(e) = serve_connection(conn, &up) {
                        let gone = e.downcast_ref::<std::io::Error>().is_some_and(|e| {
                            matches!(
                                e.kind(),
                                std::io::ErrorKind::BrokenPipe
                                    | std::io::ErrorKind::ConnectionReset
                            )
                        });
                        if !gone {
                            eprintln!("PodResources at the host path: {e:#}");
                        }
                    }
                });
            }
        });
        Ok(LenientPodResources {
            path: path.to_path_buf(),
            stop,
        })
    }
}

impl Drop for LenientPodResources {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
    }
}

fn frame(out: &mut impl Write, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Result<()> {
    let len = u32::try_from(payload.len())?;
    let mut h = [0u8; 9];
    h[..3].copy_from_slice(&len.to_be_bytes()[1..]);
    h[3] = kind;
    h[4] = flags;
    h[5..].copy_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.write_all(&h)?;
    out.write_all(payload)?;
    Ok(())
}

/// One HTTP/2 frame: type, flags, stream, payload.
type Frame = (u8, u8, u32, Vec<u8>);

/// The next frame; `None` at end of stream.
fn read_frame(conn: &mut impl Read) -> Result<Option<Frame>> {
    let mut h = [0u8; 9];
    match conn.read_exact(&mut h) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
    let mut payload = vec![0; len];
    conn.read_exact(&mut payload)?;
    Ok(Some((h[3], h[4], stream, payload)))
}

/// Strips padding (and priority fields of HEADERS) from a frame payload.
fn unpad(kind: u8, flags: u8, p: &[u8]) -> Result<Vec<u8>> {
    let mut start = 0;
    let mut end = p.len();
    if flags & PADDED != 0 {
        let pad = usize::from(*p.first().context("empty padded frame")?);
        start = 1;
        end = end
            .checked_sub(pad)
            .context("padding longer than the frame")?;
    }
    if kind == HEADERS && flags & PRIORITY != 0 {
        start += 5;
    }
    Ok(p.get(start..end).context("short frame")?.to_vec())
}

struct Call {
    block: Vec<u8>,
    headers_done: bool,
    ended: bool,
}

fn serve_connection(conn: UnixStream, upstream: &Path) -> Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut reader = conn.try_clone()?;
    let mut out = conn;
    let mut preface = [0u8; 24];
    reader.read_exact(&mut preface)?;
    if preface != PREFACE {
        bail!("not an HTTP/2 client");
    }
    frame(&mut out, SETTINGS, 0, 0, &[])?;
    let mut decoder = hpack::Decoder::new();
    let mut calls: std::collections::HashMap<u32, Call> = Default::default();
    while let Some((kind, flags, stream, payload)) = read_frame(&mut reader)? {
        match kind {
            SETTINGS if flags & ACK == 0 => frame(&mut out, SETTINGS, ACK, 0, &[])?,
            PING if flags & ACK == 0 => frame(&mut out, PING, ACK, 0, &payload)?,
            GOAWAY => return Ok(()),
            HEADERS | CONTINUATION => {
                let c = calls.entry(stream).or_insert(Call {
                    block: Vec::new(),
                    headers_done: false,
                    ended: false,
                });
                c.block.extend(unpad(kind, flags, &payload)?);
                if kind == HEADERS && flags & END_STREAM != 0 {
                    c.ended = true;
                }
                if flags & END_HEADERS != 0 {
                    c.headers_done = true;
                }
            }
            DATA => {
                if let Some(c) = calls.get_mut(&stream) {
                    if flags & END_STREAM != 0 {
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
            respond(&mut out, s, &path, upstream)?;
        }
    }
    Ok(())
}

fn respond(out: &mut impl Write, stream: u32, path: &str, upstream: &Path) -> Result<()> {
    let mut enc = hpack::Encoder::new();
    let head = enc.encode(vec![
        (&b":status"[..], &b"200"[..]),
        (&b"content-type"[..], &b"application/grpc"[..]),
    ]);
    frame(out, HEADERS, END_HEADERS, stream, &head)?;
    let status = if path == LIST_PATH {
        let msg = list(upstream)?;
        let mut body = vec![0u8];
        body.extend_from_slice(&u32::try_from(msg.len())?.to_be_bytes());
        body.extend_from_slice(&msg);
        for chunk in body.chunks(16_384) {
            frame(out, DATA, 0, stream, chunk)?;
        }
        "0"
    } else {
        "12"
    };
    let trailers = enc.encode(vec![(&b"grpc-status"[..], status.as_bytes())]);
    frame(out, HEADERS, END_HEADERS | END_STREAM, stream, &trailers)?;
    out.flush()?;
    Ok(())
}

/// The node's test kubelet's `List` answer, encoded.
fn list(upstream: &Path) -> Result<Vec<u8>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let channel = kubelet_proto::transport::connect_unix(upstream, Duration::from_secs(10))
            .await
            .map_err(|e| anyhow::anyhow!("dialing {}: {e}", upstream.display()))?;
        let resp = PodResourcesListerClient::new(channel)
            .list(ListPodResourcesRequest {})
            .await
            .map_err(|e| anyhow::anyhow!("List on {}: {e}", upstream.display()))?
            .into_inner();
        Ok(resp.encode_to_vec())
    })
}

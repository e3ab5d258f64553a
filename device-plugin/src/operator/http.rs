//! The HTTP server of `/metrics` and `/healthz`: hyper's HTTP/1.1 on its
//! own thread and runtime, so a wedged daemon loop cannot wedge the probe
//! that reports it.
//!
//! Limits, for a port every pod on the node can reach:
//! - at most `MAX_CONNECTIONS` connections. Beyond it, a new connection
//!   takes the place of the oldest one that has not sent its request head
//!   yet (an idle one), which is closed; when none is idle, the new one
//!   waits (and the ones after it wait in the kernel's accept queue) until
//!   a request is answered. So idle connections cannot keep a scrape out,
//!   and the daemon holds at most `MAX_CONNECTIONS + 1` sockets of clients;
//! - the request head within [`HEADER_READ_TIMEOUT`] of connecting, and
//!   the whole exchange within [`CONNECTION_LIFETIME`];
//! - a request head of at most `MAX_HEAD_BYTES` and `MAX_HEADERS`
//!   headers (larger gets 431), and no body (413);
//! - one request per connection (no keep-alive).

use crate::error::{Error, Result};
use crate::operator::liveness::Liveness;
use crate::operator::metrics::Metrics;
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};
use tracing::{debug, info};

/// Most client connections open at once.
pub(crate) const MAX_CONNECTIONS: usize = 32;
/// How long a client has to send its whole request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection may last in all, answer included.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(15);
/// The largest request head read (hyper's smallest buffer).
pub(crate) const MAX_HEAD_BYTES: usize = 8192;
/// The most headers a request may have.
pub(crate) const MAX_HEADERS: usize = 32;
/// The kernel's queue of connections not accepted yet: while the server
/// makes room (closing an idle connection per new one), a burst of
/// connections waits here instead of having its SYNs dropped.
const LISTEN_BACKLOG: u32 = 1024;
/// The content type of `/metrics`: OpenMetrics text, as `prometheus-client`
/// encodes it and serves it in its examples.
pub(crate) const METRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the endpoints answer from.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// The daemon's metrics, for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// The daemon loop's heartbeat, for `/healthz`.
    pub liveness: Arc<Liveness>,
}

/// The running server; dropping it stops it.
#[derive(Debug)]
pub struct Server {
    local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl Server {
    /// Where it listens (the bound port when `addr` asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Binds `addr` and serves `/metrics` and `/healthz` from `endpoints` on a
/// thread of its own until the returned [`Server`] is dropped.
pub fn spawn(addr: SocketAddr, endpoints: Endpoints) -> Result<Server> {
    let bind_err = |e: std::io::Error| Error::Transport {
        op: "binding the metrics listener".into(),
        path: addr.to_string().into(),
        msg: e.to_string(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Task(format!("cannot start the metrics server's runtime: {e}")))?;
    // Bound here, so a taken port fails the start, and registered with the
    // server's runtime (entered, not blocked on: the caller may be inside
    // its own runtime), which serves it on the thread.
    let listener = {
        let _in_runtime = runtime.enter();
        let bind = || {
            let socket = match addr {
                SocketAddr::V4(_) => TcpSocket::new_v4(),
                SocketAddr::V6(_) => TcpSocket::new_v6(),
            }?;
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(LISTEN_BACKLOG)
        };
        bind().map_err(bind_err)?
    };
    let local_addr = listener.local_addr().map_err(bind_err)?;
    let (stop_tx, stop_rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || runtime.block_on(serve(listener, endpoints, stop_rx)))
        .map_err(|e| Error::Task(format!("cannot start the metrics server's thread: {e}")))?;
    info!(addr = %local_addr, "serving /metrics and /healthz");
    Ok(Server {
        local_addr,
        stop: Some(stop_tx),
    })
}

/// Connections that have not sent a request head yet, oldest first; each
/// closes when its `Notify` is notified.
#[derive(Debug, Default)]
struct IdleConnections {
    next_id: u64,
    waiting: VecDeque<(u64, Arc<Notify>)>,
}

type Idle = Arc<Mutex<IdleConnections>>;

fn lock(idle: &Idle) -> std::sync::MutexGuard<'_, IdleConnections> {
    // The queue stays consistent across a panic: every change is one call.
    idle.lock().unwrap_or_else(|e| e.into_inner())
}

/// Accepts connections within the limits until `stop` fires.
async fn serve(listener: TcpListener, endpoints: Endpoints, mut stop: oneshot::Receiver<()>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let idle: Idle = Arc::default();
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of fds or memory: let connections finish first.
                    debug!(error = %e, "accepting a metrics connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // Full: the oldest idle connection makes room, else wait for
                // an answered one.
                let oldest = lock(&idle).waiting.pop_front();
                if let Some((_, close)) = oldest {
                    close.notify_one();
                }
                tokio::select! {
                    _ = &mut stop => return,
                    p = slots.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                }
            }
        };
        // Counted as idle from its accept on (not from when its task first
        // runs), so a burst of accepts always finds one to close.
        let close = Arc::new(Notify::new());
        let id = {
            let mut q = lock(&idle);
            let id = q.next_id;
            q.next_id += 1;
            q.waiting.push_back((id, close.clone()));
            id
        };
        let conn = Connection {
            id,
            close,
            idle: idle.clone(),
            permit,
        };
        tokio::spawn(conn.serve(stream, peer, endpoints.clone()));
    }
}

/// One accepted connection's place in the limits.
struct Connection {
    /// Its entry in the idle queue, while it has not sent a request head.
    id: u64,
    /// Notified to close it (idle, to make room).
    close: Arc<Notify>,
    idle: Idle,
    /// Its slot among [`MAX_CONNECTIONS`], freed when it is dropped.
    permit: OwnedSemaphorePermit,
}

impl Connection {
    /// No longer idle: a request head arrived, or it is closing.
    fn not_idle(&self) {
        lock(&self.idle).waiting.retain(|(i, _)| *i != self.id);
    }

    /// Serves the one request of `stream`, then frees the slot.
    async fn serve(self, stream: TcpStream, peer: SocketAddr, endpoints: Endpoints) {
        let service = service_fn(|req: Request<Incoming>| {
            // Never made to give way once its request is in.
            self.not_idle();
            let resp = respond(&req, &endpoints, Instant::now());
            async move { Ok::<_, Infallible>(resp) }
        });
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .max_buf_size(MAX_HEAD_BYTES)
            .max_headers(MAX_HEADERS)
            .keep_alive(false)
            .serve_connection(TokioIo::new(stream), service);
        tokio::select! {
            r = tokio::time::timeout(CONNECTION_LIFETIME, conn) => match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(%peer, error = %e, "metrics connection"),
                Err(_) => debug!(%peer, "metrics connection closed: it lasted too long"),
            },
            _ = self.close.notified() => debug!(%peer, "idle metrics connection closed to make room"),
        }
        // The socket is closed (dropped with `conn`) before the slot is freed.
        self.not_idle();
        drop(self.permit);
    }
}

/// The answer to `req` at `now`.
fn respond(req: &Request<Incoming>, endpoints: &Endpoints, now: Instant) -> Response<String> {
    let has_body = req.headers().contains_key(TRANSFER_ENCODING)
        || req
            .headers()
            .get(CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    if has_body {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Requests have no body here.\n".into(),
        );
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            let mut resp = Response::new(endpoints.metrics.render());
            resp.headers_mut().insert(
                CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(METRICS_CONTENT_TYPE),
            );
            resp
        }
        (&Method::GET, "/healthz") => match endpoints.liveness.check(now) {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        (&Method::GET, _) => text(StatusCode::NOT_FOUND, "not found\n".into()),
        _ => text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".into(),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response<String> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::liveness::STUCK_AFTER;
    use std::io::{Read, Write};

    fn get(server: &Server, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(server.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn healthz_answers_503_with_a_sentence_while_the_loop_is_stuck() {
        // The loop's last beat, as the test's clock sets it: a loop that
        // stopped beating longer ago than the bound.
        let stalled_at = Instant::now()
            .checked_sub(STUCK_AFTER + Duration::from_secs(5))
            .unwrap();
        let liveness = Arc::new(Liveness::new(stalled_at));
        let server = spawn(
            "127.0.0.1:0".parse().unwrap(),
            Endpoints {
                metrics: Arc::new(Metrics::default()),
                liveness: liveness.clone(),
            },
        )
        .unwrap();
        let stuck = get(&server, "/healthz");
        assert!(
            stuck.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{stuck}"
        );
        assert!(
            stuck.ends_with("\r\n\r\nThe daemon's loop has not run for 35 s (more than 30 s), so it is stuck and restarting the daemon is the fix.\n"),
            "{stuck}"
        );
        // /metrics still answers while the loop is stuck.
        assert!(get(&server, "/metrics").starts_with("HTTP/1.1 200 OK\r\n"));
        // The loop beats again: alive.
        liveness.beat(Instant::now());
        let alive = get(&server, "/healthz");
        assert!(alive.starts_with("HTTP/1.1 200 OK\r\n"), "{alive}");
        assert!(alive.ends_with("\r\n\r\nok\n"), "{alive}");
    }

    #[test]
    fn routes() {
        let server = spawn(
            "127.0.0.1:0".parse().unwrap(),
            Endpoints {
                metrics: Arc::new(Metrics::default()),
                liveness: Arc::new(Liveness::new(Instant::now())),
            },
        )
        .unwrap();
        assert!(get(&server, "/nope").starts_with("HTTP/1.1 404 Not Found\r\n"));
        assert!(get(&server, "/metrics?x=1").contains("macvtap_dp_"));
    }
}

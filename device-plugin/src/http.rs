//! A tiny HTTP/1.1 responder for `/metrics` and `/healthz`.
//!
//! Two read-only GET endpoints do not need an HTTP framework: read the
//! request head, answer, close.

use crate::error::{Error, Result};
use crate::metrics::Metrics;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info};

/// Binds `addr` and serves `/metrics` and `/healthz` until the task is dropped.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Transport {
            op: "binding the metrics listener".into(),
            path: addr.to_string().into(),
            msg: e.to_string(),
        })?;
    info!(%addr, "serving /metrics and /healthz");
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                if let Err(e) = answer(stream, &metrics).await {
                    debug!(%peer, error = %e, "metrics connection");
                }
            });
        }
    }))
}

/// How long a client has to send its request head.
const REQUEST_HEAD_WAIT: Duration = Duration::from_secs(5);

async fn answer(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    // Read the request head (bounded in size and time).
    let read = tokio::time::timeout(REQUEST_HEAD_WAIT, async {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return Ok(());
    }
    let head = String::from_utf8_lossy(&buf);
    let (status, ctype, body) = route(head.lines().next().unwrap_or(""), metrics);
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(resp.as_bytes()).await?;
    stream.shutdown().await
}

/// The status line, content type and body for a request line.
pub fn route(request_line: &str, metrics: &Metrics) -> (&'static str, &'static str, String) {
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or("");
    let path = parts.next().unwrap_or("");
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render(),
        ),
        ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".into()),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".into()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let m = Metrics::default();
        assert_eq!(route("GET /healthz HTTP/1.1", &m).0, "200 OK");
        assert!(route("GET /metrics HTTP/1.1", &m).2.contains("macvtap_dp_"));
        assert_eq!(route("GET /nope HTTP/1.1", &m).0, "404 Not Found");
        assert_eq!(
            route("POST /metrics HTTP/1.1", &m).0,
            "405 Method Not Allowed"
        );
    }
}

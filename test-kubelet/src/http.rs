//! One plain HTTP/1.1 GET from inside a test namespace, for the servers our
//! binaries run there (the device plugin's `/metrics` and `/healthz`).

use anyhow::Result;
use std::io::{Read, Write};
use std::time::Duration;
use test_support::TestNs;

/// How long a server has to answer.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends `GET path` to `127.0.0.1:port` from inside `ns` and returns the
/// whole response (status line, headers and body) once the server closes
/// the connection.
pub fn http_get(ns: &TestNs, port: u16, path: &str) -> Result<String> {
    let path = path.to_string();
    ns.run(move || http_get_here(port, &path))
}

/// [`http_get`] from the calling thread's own namespace (the host's, for a
/// server on a real node's host network).
pub fn http_get_here(port: u16, path: &str) -> Result<String> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    s.write_all(req.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

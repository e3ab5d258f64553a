//! gRPC over unix sockets, as the kubelet's APIs are served: binding a
//! listener, serving a generated service on it, and dialing a socket. The
//! device plugin serves and dials with these, and so does the workspace's
//! test kubelet, so both speak the transport the same way.

use hyper_util::rt::TokioIo;
use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::codegen::{Service, http};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Uri};

/// Result of the transport helpers.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong binding or dialing a unix socket; each variant names
/// the socket.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file operation on the socket path failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done, e.g. `binding the socket`.
        op: &'static str,
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Dialing the socket failed; `msg` gives the usual cause where there
    /// is one.
    #[error("connecting to {path}: {msg}")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// Why, in words.
        msg: String,
    },
}

/// A closure making an [`Error::Io`] for `op` on `path`, for `map_err`.
fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { op, path, source }
}

/// The mode of every socket bound here: read and write for root only.
pub const SOCKET_MODE: u32 = 0o600;

/// Binds a unix listener at `path` with mode 0600, first removing a stale
/// socket file left by an earlier run (an unlink, which never follows a
/// link).
///
/// Whoever can connect to a plugin socket can Allocate, that is create links
/// on a host NIC, so only root may. The daemon runs with umask 077 (set in
/// its `main`), so the socket never exists with wider permissions; the
/// explicit chmod makes the mode independent of any umask for other callers
/// too. The chmod follows no link (`restrict_socket`): the kubelet's
/// device-plugins directory is shared with every device plugin of the node,
/// and a link planted at `path` between the bind and the chmod must not
/// hand the chmod another file.
pub fn bind_unix(path: &Path) -> Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("removing the stale socket", path)(e)),
    }
    let listener = UnixListener::bind(path).map_err(io("binding the socket", path))?;
    restrict_socket(path)?;
    Ok(listener)
}

/// Sets the socket at `path` to [`SOCKET_MODE`] without following a link:
/// `path` is opened `O_PATH|O_NOFOLLOW` (a symbolic link there is opened
/// as itself), checked on that descriptor to be a socket, and chmodded
/// through `/proc/self/fd/<n>`, which names exactly the opened inode
/// (`fchmod` does not take an `O_PATH` descriptor, and `fchmodat` with
/// `AT_SYMLINK_NOFOLLOW` needs Linux 6.6). Anything else at `path` (the
/// socket replaced since the bind) is refused and left as it is.
fn restrict_socket(path: &Path) -> Result<()> {
    let op = "setting the mode of the socket";
    let fd = nix::fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io(op, path)(e.into()))?;
    let st = nix::sys::stat::fstat(&fd).map_err(|e| io(op, path)(e.into()))?;
    let format = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
    if format != SFlag::S_IFSOCK {
        let found = match format {
            SFlag::S_IFLNK => "a symbolic link",
            SFlag::S_IFREG => "a regular file",
            SFlag::S_IFDIR => "a directory",
            SFlag::S_IFIFO => "a FIFO",
            _ => "a device node",
        };
        return Err(io(op, path)(std::io::Error::other(format!(
            "it is {found}, not the socket just bound (something replaced it since the bind); \
             refusing to change its mode"
        ))));
    }
    std::fs::set_permissions(
        format!("/proc/self/fd/{}", fd.as_raw_fd()),
        std::fs::Permissions::from_mode(SOCKET_MODE),
    )
    .map_err(io(op, path))
}

/// How many connections a server holds open, so that a stop can wait for
/// its clients to close theirs.
#[derive(Debug, Clone)]
pub struct Connections(pub(crate) Arc<watch::Sender<usize>>);

impl Default for Connections {
    fn default() -> Self {
        Self(Arc::new(watch::channel(0).0))
    }
}

impl Connections {
    /// The connections open now.
    pub fn open(&self) -> usize {
        *self.0.borrow()
    }

    /// Waits until no connection is open.
    pub async fn all_closed(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

/// An accepted connection, counted in its server's [`Connections`] until it
/// is dropped.
pub(crate) struct Counted<T = UnixStream> {
    inner: T,
    count: Arc<watch::Sender<usize>>,
}

impl<T> Counted<T> {
    pub(crate) fn new(inner: T, count: Arc<watch::Sender<usize>>) -> Self {
        count.send_modify(|n| *n += 1);
        Self { inner, count }
    }
}

impl<T> Drop for Counted<T> {
    fn drop(&mut self) {
        self.count.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl<T: Connected> Connected for Counted<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serves the gRPC service `svc` (a generated `…Server`) on `listener`
/// until `shutdown` completes, counting the open connections in
/// `connections`: the plugin servers, and the test kubelet's.
pub async fn serve_unix<S>(
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
    let incoming = UnixListenerStream::new(listener)
        .map(move |accepted| accepted.map(|s| Counted::new(s, count.clone())));
    tonic::transport::Server::builder()
        .serve_with_incoming_shutdown(svc, incoming, shutdown)
        .await
}

/// Opens a gRPC channel to the server on unix socket `path`, failing after
/// `timeout` if it does not answer. Requests carry `:authority localhost`,
/// as the kubelet's own dials do (kubelet 1.26 and later).
pub async fn connect_unix(path: &Path, timeout: Duration) -> Result<Channel> {
    let socket: PathBuf = path.to_path_buf();
    // The URI is required by tonic but unused: the connector dials the socket.
    let endpoint = Endpoint::from_static("http://localhost").connect_timeout(timeout);
    endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|e| Error::Connect {
            path: path.to_path_buf(),
            msg: connect_failure(&e),
        })
}

/// Why a unix socket could not be dialed, with the usual reason for the
/// errors that have one.
fn connect_failure(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::NotFound => {
                    return "the socket does not exist (its server is not running, or the \
                            directory is not the one the server uses)"
                        .into();
                }
                std::io::ErrorKind::ConnectionRefused => {
                    return "nothing listens on the socket (a stale socket file of a server \
                            that stopped)"
                        .into();
                }
                std::io::ErrorKind::PermissionDenied => {
                    return "permission denied (the daemon must run as root)".into();
                }
                _ => {}
            }
        }
        cur = err.source();
    }
    error_chain(e)
}

/// A message with every cause, e.g. `transport error: No such file or directory`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let part = s.to_string();
        if !msg.contains(&part) {
            msg.push_str(": ");
            msg.push_str(&part);
        }
        cur = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_bound_socket_replaces_a_stale_file_and_is_for_root_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.sock");
        std::fs::write(&path, "stale").unwrap();
        let _listener = bind_unix(&path).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()));
        assert_eq!(meta.permissions().mode() & 0o777, SOCKET_MODE);
    }

    #[test]
    fn the_socket_chmod_follows_no_link_planted_after_the_bind() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("multus-shim");
        std::fs::write(&target, "ELF").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        let socket = dir.path().join("other.sock");
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
        // What a planter can put at the path between the bind and the
        // chmod: a link to a file, a link to a socket, a file.
        for (i, (aim, found)) in [(&target, "a symbolic link"), (&socket, "a symbolic link")]
            .into_iter()
            .enumerate()
        {
            let path = dir.path().join(format!("p{i}.sock"));
            std::os::unix::fs::symlink(aim, &path).unwrap();
            let e = restrict_socket(&path).unwrap_err().to_string();
            assert_eq!(
                e,
                format!(
                    "setting the mode of the socket {}: it is {found}, not the socket just bound \
                     (something replaced it since the bind); refusing to change its mode",
                    path.display()
                )
            );
        }
        let file = dir.path().join("file.sock");
        std::fs::write(&file, "").unwrap();
        assert!(
            restrict_socket(&file)
                .unwrap_err()
                .to_string()
                .contains("it is a regular file")
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(
            mode(&target),
            0o755,
            "the chmod followed the link to a file"
        );
        assert_eq!(
            mode(&socket),
            0o777,
            "the chmod followed the link to a socket"
        );
        // The socket itself, through its descriptor.
        restrict_socket(&socket).unwrap();
        assert_eq!(mode(&socket), SOCKET_MODE);
    }

    #[tokio::test]
    async fn a_missing_socket_is_named_with_the_likely_cause() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet.sock");
        let e = connect_unix(&path, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "connecting to {}: the socket does not exist (its server is not running, or the \
                 directory is not the one the server uses)",
                path.display()
            )
        );
    }
}

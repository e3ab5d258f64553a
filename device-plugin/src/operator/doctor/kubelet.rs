//! The kubelet as the daemon meets it (its directory, `kubelet.sock`, the
//! PodResources socket) and the daemon's own registration: its `/healthz`,
//! and a live socket in `device-plugins/` for each resource.

use super::{Finding, Level, TIMEOUT};
use crate::config::ResourceConfig;
use crate::core::degraded::Degraded;
use crate::core::reclaim;
use crate::options::{Front, Options, dra_socket, registration_socket};
use kubelet_proto::v1beta1::KUBELET_SOCKET;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Whether something listens on Unix socket `path`; says why not.
pub(crate) fn probe_socket(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "it does not exist".to_string(),
        _ => format!("cannot stat it: {}", macvtap_link::error::io_cause(&e)),
    })?;
    if !meta.file_type().is_socket() {
        return Err("it is not a socket".into());
    }
    UnixStream::connect(path).map(drop).map_err(|e| {
        format!(
            "nothing listens on it: {}",
            macvtap_link::error::io_cause(&e)
        )
    })
}

/// The kubelet directory, `kubelet.sock` (where device plugins register)
/// and the PodResources socket.
pub(crate) fn check_kubelet(opts: &Options) -> Vec<Finding> {
    let dir = &opts.kubelet_dir;
    if !dir.is_dir() {
        return vec![Finding::problem(
            "kubelet",
            format!(
                "the kubelet directory {} does not exist; give the kubelet's root dir with \
                 --kubelet-dir",
                dir.display()
            ),
        )];
    }
    let mut out = vec![Finding::ok(
        "kubelet",
        format!("the kubelet directory {} exists", dir.display()),
    )];
    let sock = opts.plugin_dir().join(KUBELET_SOCKET);
    out.push(match probe_socket(&sock) {
        Ok(()) => Finding::ok(
            "kubelet-socket",
            format!("the kubelet listens on {}", sock.display()),
        ),
        Err(why) => Finding::problem(
            "kubelet-socket",
            format!(
                "the kubelet's registration socket {} is not usable ({why}): the kubelet is \
                 not running, or --kubelet-dir is not its root dir",
                sock.display()
            ),
        ),
    });
    out.push(check_pod_resources(&opts.pod_resources_socket()));
    out
}

/// The PodResources socket at `socket`, in the daemon's own sentence when
/// it cannot be read: a warning when its directory is not mounted (the Go
/// project's DaemonSets mount none: the daemon serves, without reclaim and
/// heal), a problem when it is and the kubelet does not serve there.
pub(crate) fn check_pod_resources(socket: &Path) -> Finding {
    const CHECK: &str = "pod-resources-socket";
    match probe_socket(socket) {
        Ok(()) => Finding::ok(
            CHECK,
            format!(
                "the kubelet's PodResources API listens on {}",
                socket.display()
            ),
        ),
        Err(why) => {
            let gap = Degraded::pod_resources(socket, why);
            let level = if gap.mount().is_dir() {
                Level::Problem
            } else {
                Level::Warning
            };
            Finding::new(level, CHECK, gap.to_string())
        }
    }
}

/// What pods hold of ours, per the kubelet's PodResources `List` (the
/// reclaimer's call).
pub(crate) async fn list_allocated(opts: &Options) -> Result<reclaim::Held, String> {
    reclaim::list_allocated(&opts.pod_resources_socket(), TIMEOUT)
        .await
        .map_err(|e| e.to_string())
}

/// The daemon's own state: its `/healthz` when it serves one
/// (`--metrics-addr`), and each resource's socket in `device-plugins/`.
pub(crate) fn check_registration(opts: &Options, configs: &[ResourceConfig]) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some(addr) = opts.metrics_addr {
        let addr = reachable(addr);
        out.push(match healthz(addr) {
            Ok(()) => Finding::ok(
                "daemon",
                format!("the daemon answers http://{addr}/healthz"),
            ),
            Err(why) => Finding::problem(
                "daemon",
                format!(
                    "the daemon does not answer http://{addr}/healthz ({why}): it is not \
                     running here, or serves elsewhere (--metrics-addr)"
                ),
            ),
        });
    }
    if opts.front == Front::Dra {
        out.extend(check_dra_sockets(&opts.kubelet_dir));
        return out;
    }
    for cfg in configs {
        let sock = opts.plugin_dir().join(cfg.socket_name());
        out.push(match probe_socket(&sock) {
            Ok(()) => Finding::ok(
                "plugin-socket",
                format!(
                    "the daemon serves {} on {}",
                    cfg.resource_name(),
                    sock.display()
                ),
            ),
            Err(why) => Finding::problem(
                "plugin-socket",
                format!(
                    "the daemon's socket for {} at {} is not usable ({why}): the daemon is not \
                     running, or not serving this resource",
                    cfg.resource_name(),
                    sock.display()
                ),
            ),
        });
    }
    out
}

/// DRA mode (`--front dra`): the daemon's DRA socket and its registration
/// socket in the kubelet's plugin watcher directory, both live.
fn check_dra_sockets(kubelet_dir: &Path) -> Vec<Finding> {
    [
        ("dra-socket", dra_socket(kubelet_dir), "its DRA service"),
        (
            "dra-registration",
            registration_socket(kubelet_dir),
            "its registration with the kubelet",
        ),
    ]
    .into_iter()
    .map(|(check, sock, what)| match probe_socket(&sock) {
        Ok(()) => Finding::ok(
            check,
            format!("the DRA driver serves {what} on {}", sock.display()),
        ),
        Err(why) => Finding::problem(
            check,
            format!(
                "the DRA driver's socket for {what} at {} is not usable ({why}): the daemon is \
                 not running in DRA mode here",
                sock.display()
            ),
        ),
    })
    .collect()
}

/// `addr` with an unspecified IP (`0.0.0.0`, `::`) replaced by loopback.
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port())
        }
        _ => addr,
    }
}

/// `GET /healthz` on `addr`; `Ok` on a 200 answer.
fn healthz(addr: SocketAddr) -> Result<(), String> {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(TIMEOUT))
        .and_then(|_| s.set_write_timeout(Some(TIMEOUT)))
        .and_then(|_| {
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: doctor\r\nConnection: close\r\n\r\n")
        })
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    let status = answer.lines().next().unwrap_or("").trim();
    if status.starts_with("HTTP/1.1 200") {
        Ok(())
    } else {
        Err(format!("it answered {status:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_dra_mode_the_dra_sockets_are_checked_not_the_device_plugins() {
        let tmp = tempfile::tempdir().unwrap();
        let opts = Options {
            kubelet_dir: tmp.path().to_path_buf(),
            front: Front::Dra,
            ..Options::for_tests(None)
        };
        let configs = [ResourceConfig::for_nic("eth1")];
        let checks = |f: &[Finding]| -> Vec<(String, Level)> {
            f.iter().map(|f| (f.check.to_string(), f.level)).collect()
        };
        assert_eq!(
            checks(&check_registration(&opts, &configs)),
            [
                ("dra-socket".to_string(), Level::Problem),
                ("dra-registration".to_string(), Level::Problem)
            ]
        );
        let sock = dra_socket(tmp.path());
        std::fs::create_dir_all(sock.parent().unwrap()).unwrap();
        let _live = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let found = check_registration(&opts, &configs);
        assert_eq!(found[0].level, Level::Ok, "{}", found[0].message);
        assert!(
            found[0].message.contains("dra.sock"),
            "{}",
            found[0].message
        );
    }

    #[test]
    fn an_unspecified_address_is_asked_on_loopback() {
        assert_eq!(
            reachable("0.0.0.0:9402".parse().unwrap()),
            "127.0.0.1:9402".parse().unwrap()
        );
        assert_eq!(
            reachable("[::]:9402".parse().unwrap()),
            "[::1]:9402".parse().unwrap()
        );
        assert_eq!(
            reachable("10.0.0.1:9402".parse().unwrap()),
            "10.0.0.1:9402".parse().unwrap()
        );
    }

    #[test]
    fn a_pod_resources_socket_not_mounted_warns_naming_the_mount() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("pod-resources");
        let f = check_pod_resources(&dir.join("kubelet.sock"));
        assert_eq!(f.level, Level::Warning, "{f:?}");
        for want in [
            "it does not exist; its directory is not mounted in this container",
            "leaked macvtaps are never deleted and lost ones never re-created",
            &format!("mount the host's {} (hostPath)", dir.display()),
        ] {
            assert!(f.message.contains(want), "want {want:?} in {f:?}");
        }
        // Mounted, and nothing serves there: the kubelet's trouble.
        std::fs::create_dir(&dir).unwrap();
        let f = check_pod_resources(&dir.join("kubelet.sock"));
        assert_eq!(f.level, Level::Problem, "{f:?}");
        assert!(
            f.message.contains("the kubelet does not serve it there"),
            "{f:?}"
        );
    }

    #[test]
    fn a_plain_file_is_no_socket() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("kubelet.sock");
        assert_eq!(probe_socket(&f).unwrap_err(), "it does not exist");
        std::fs::write(&f, "").unwrap();
        assert_eq!(probe_socket(&f).unwrap_err(), "it is not a socket");
        let l = std::os::unix::net::UnixListener::bind(d.path().join("s")).unwrap();
        assert!(probe_socket(&d.path().join("s")).is_ok());
        drop(l);
        assert!(probe_socket(&d.path().join("s")).is_err(), "a stale socket");
    }
}

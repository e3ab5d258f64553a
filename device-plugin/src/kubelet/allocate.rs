//! Allocate as the kubelet's device plugin API asks it: the request's
//! device IDs handed to the core ([`crate::core::link`]) and its prepared
//! devices answered as `DeviceSpec`s, one `ContainerAllocateResponse` per
//! container asked for, the outcome timed, logged and (a refusal) posted
//! as an Event. Nothing here decides: it translates.

use crate::config::ResourceConfig;
#[cfg(test)]
use crate::core::host::Host;
use crate::core::host::SharedHost;
use crate::core::ledger::Assignments;
use crate::core::ledger::clock::AllocationClock;
use crate::core::link::{PreparedDevice, hand_out};
#[cfg(test)]
use crate::core::link::{check_ids, prepare};
use crate::error::{Error, Result};
use crate::kubelet::context::ServerContext;
use crate::operator::events::NodeEvent;
use kubelet_proto::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, DeviceSpec,
};
use std::path::Path;
use std::time::Instant;
use tracing::{info, warn};

/// The request's device IDs, container after container.
fn ids(req: &AllocateRequest) -> Vec<&str> {
    req.container_requests
        .iter()
        .flat_map(|c| c.devices_ids.iter().map(String::as_str))
        .collect()
}

/// Checks that every ID of the request belongs to `cfg`, before anything is
/// created, so that a bad request changes nothing.
#[cfg(test)]
pub(crate) fn check_request(req: &AllocateRequest, cfg: &ResourceConfig) -> Result<()> {
    check_ids(cfg, ids(req))
}

/// Serves an `AllocateRequest` in the calling thread's network namespace
/// on `host`'s kernel: (re)creates each device's macvtap on the lower NIC
/// and answers with its tap node. On any failure every link made for this
/// request is deleted.
#[cfg(test)]
pub(crate) fn allocate(
    host: &SharedHost,
    req: &AllocateRequest,
    cfg: &ResourceConfig,
) -> Result<AllocateResponse> {
    check_request(req, cfg)?;
    host.run(|host| allocate_on(host, req, cfg))
}

/// An Allocate as the plugin server serves it, on `host` (the daemon's
/// shared handle on its kernel): `hand_out` (leak clocks, links, the
/// record), answered.
pub fn serve(
    host: &SharedHost,
    req: &AllocateRequest,
    cfg: &ResourceConfig,
    clock: &AllocationClock,
    assignments: &Assignments,
) -> Result<AllocateResponse> {
    let prepared = hand_out(host, cfg, &ids(req), clock, assignments)?;
    Ok(response(req, &prepared))
}

/// An Allocate of resource `cfg` as the plugin server answers it: [`serve`]
/// on a blocking thread with the daemon's shared state `ctx`, timed in the
/// metrics, logged, and a refusal posted as an Event and turned into the
/// gRPC status the kubelet reads.
pub(crate) async fn answer(
    ctx: &ServerContext,
    cfg: ResourceConfig,
    req: AllocateRequest,
) -> std::result::Result<AllocateResponse, tonic::Status> {
    let resource = cfg.resource_name();
    let started = Instant::now();
    let device_ids: Vec<String> = ids(&req).into_iter().map(str::to_string).collect();
    let (clock, assignments) = (ctx.clock.clone(), ctx.assignments.clone());
    let host = ctx.host.clone();
    let Some(pass) = ctx.inflight.enter().await else {
        warn!(%resource, "Allocate refused: the daemon is exiting");
        return Err(tonic::Status::unavailable(format!(
            "the macvtap device plugin for {resource} is exiting; no device is made"
        )));
    };
    let res = tokio::task::spawn_blocking(move || {
        let _pass = pass;
        serve(&host, &req, &cfg, &clock, &assignments)
    })
    .await
    .map_err(|e| Error::Task(format!("the Allocate task failed: {e}")))
    .and_then(|r| r);
    ctx.metrics
        .allocation(&resource, res.is_ok(), started.elapsed());
    match res {
        Ok(resp) => {
            ctx.metrics
                .handed_out(&resource, &device_ids, Instant::now());
            info!(%resource, elapsed_ms = started.elapsed().as_millis() as u64, "Allocate done");
            Ok(resp)
        }
        Err(e) => {
            warn!(%resource, error = %e, "Allocate failed");
            ctx.events.post(NodeEvent::AllocateRefused {
                resource: resource.clone(),
                error: e.to_string(),
            });
            Err(e.to_status())
        }
    }
}

/// [`allocate`] on `host` (the real kernel's in the daemon, the fake's in
/// unit tests), after [`check_request`].
#[cfg(test)]
fn allocate_on(
    host: &Host,
    req: &AllocateRequest,
    cfg: &ResourceConfig,
) -> Result<AllocateResponse> {
    let prepared = prepare(host, cfg, &ids(req))?;
    Ok(response(req, &prepared))
}

/// The answer to `req` whose devices, in its order, are `prepared`.
fn response(req: &AllocateRequest, prepared: &[PreparedDevice]) -> AllocateResponse {
    let mut devices = prepared.iter();
    AllocateResponse {
        container_responses: req
            .container_requests
            .iter()
            .map(|c| ContainerAllocateResponse {
                devices: devices
                    .by_ref()
                    .take(c.devices_ids.len())
                    .map(|d| device_spec(&d.node))
                    .collect(),
                ..Default::default()
            })
            .collect(),
    }
}

/// The kubelet's view of a tap node: the same path in the container, `rw`.
fn device_spec(node: &Path) -> DeviceSpec {
    let path = node.to_string_lossy().into_owned();
    DeviceSpec {
        container_path: path.clone(),
        host_path: path,
        permissions: "rw".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_proto::v1beta1::ContainerAllocateRequest;
    use macvtap_link::{Link, MacvtapMode, link_name_for_device};
    use nix::errno::Errno;

    /// Issue 37's first failure: the soak's daemon held two descriptors
    /// more (its namespace and a netlink socket) for every thread of the
    /// blocking pool that had served an Allocate. Allocates on many threads
    /// in one namespace (as the daemon's, the host's) now keep one handle.
    #[test]
    fn allocates_on_many_threads_keep_one_host_handle_between_them() {
        use std::os::fd::AsFd;
        use std::os::unix::fs::MetadataExt;
        use std::sync::{Arc, Barrier};
        use test_support::netns::{TestNs, require_root};
        require_root().unwrap();
        let _lock = test_support::tapnode::tap_node_lock().unwrap();
        let ns = TestNs::new("spare").unwrap();
        ns.add_nic("lower0").unwrap();
        let netns = ns.netns().unwrap();
        let id = |m: std::fs::Metadata| (m.dev(), m.ino());
        let target = id(std::fs::metadata(ns.path()).unwrap());
        // Descriptors of this process on the test's namespace.
        let held = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::metadata(e.ok()?.path()).ok())
                .filter(|m| id(m.clone()) == target)
                .count()
        };
        let before = held();
        const THREADS: usize = 4;
        let cfg = ResourceConfig {
            capacity: THREADS as u32,
            ..ResourceConfig::for_nic("lower0")
        };
        let (allocated, done) = (
            Arc::new(Barrier::new(THREADS + 1)),
            Arc::new(Barrier::new(THREADS + 1)),
        );
        let host = Arc::new(SharedHost::new(
            &macvtap_link::Linux,
            crate::core::host::HostPaths::default(),
        ));
        let threads: Vec<_> = (0..THREADS)
            .map(|i| {
                let fd = netns.as_fd().try_clone_to_owned().unwrap();
                let (cfg, allocated, done) = (cfg.clone(), allocated.clone(), done.clone());
                let host = host.clone();
                std::thread::spawn(move || {
                    nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                    let req = AllocateRequest {
                        container_requests: vec![ContainerAllocateRequest {
                            devices_ids: vec![format!("lower0Mvp{i}")],
                        }],
                    };
                    let got = allocate(&host, &req, &cfg);
                    // Alive until counted: a thread's own handle would
                    // live as long as the thread.
                    allocated.wait();
                    done.wait();
                    got.map(|_| ())
                })
            })
            .collect();
        allocated.wait();
        let kept = held() - before;
        done.wait();
        for t in threads {
            t.join().unwrap().unwrap();
        }
        // The spare holds the namespace (and its macvtaps): let it go.
        drop(host);
        assert_eq!(held(), before);
        assert_eq!(kept, 1, "{THREADS} threads served an Allocate each");
    }

    #[test]
    fn unknown_ids_are_invalid_arguments() {
        let cfg = ResourceConfig {
            capacity: 2,
            ..ResourceConfig::for_nic("eth0")
        };
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["eth0Mvp1".into(), "eth0Mvp2".into()],
            }],
        };
        let e = check_request(&req, &cfg).unwrap_err();
        assert_eq!(e.grpc_code(), tonic::Code::InvalidArgument);
        assert!(e.to_string().contains("\"eth0Mvp2\""), "{e}");
        let kernel = FakeKernel::new();
        let host = SharedHost::new(&kernel, crate::core::host::HostPaths::default());
        let e = allocate(&host, &req, &cfg).unwrap_err();
        assert_eq!(e.grpc_code(), tonic::Code::InvalidArgument);
        assert!(kernel.calls().is_empty(), "{:?}", kernel.calls());
    }

    use macvtap_link::Op;
    use test_support::fake::{FakeKernel, HOST};

    /// Runs Allocate for `ids` (one container) on the fake kernel.
    fn allocate_fake(kernel: &FakeKernel, ids: &[&str]) -> Result<AllocateResponse> {
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        };
        let cfg = ResourceConfig::for_nic("lower0");
        check_request(&req, &cfg)?;
        allocate_on(&Host::current(kernel).unwrap(), &req, &cfg)
    }

    fn fake_node() -> FakeKernel {
        let kernel = FakeKernel::new();
        kernel.add_nic(HOST, "lower0");
        kernel
    }

    fn host_link_names(kernel: &FakeKernel) -> Vec<String> {
        kernel.links_of(HOST).into_iter().map(|l| l.name).collect()
    }

    #[test]
    fn allocate_creates_each_macvtap_and_answers_its_tap_node() {
        let kernel = fake_node();
        let resp = allocate_fake(&kernel, &["lower0Mvp0", "lower0Mvp1"]).unwrap();
        let specs = &resp.container_responses[0].devices;
        assert_eq!(specs.len(), 2);
        for (spec, id) in specs.iter().zip(["lower0Mvp0", "lower0Mvp1"]) {
            let link = kernel.link(HOST, &link_name_for_device(id)).unwrap();
            assert_eq!(spec.host_path, format!("/dev/tap{}", link.index));
            assert_eq!(spec.permissions, "rw");
        }
    }

    #[test]
    fn serve_hands_out_on_the_shared_hosts_kernel() {
        let kernel = fake_node();
        let host = SharedHost::new(&kernel, crate::core::host::HostPaths::default());
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["lower0Mvp0".into()],
            }],
        };
        let cfg = ResourceConfig::for_nic("lower0");
        let (clock, assignments) = (AllocationClock::default(), Assignments::default());
        let resp = serve(&host, &req, &cfg, &clock, &assignments).unwrap();
        let link = kernel
            .link(HOST, &link_name_for_device("lower0Mvp0"))
            .unwrap();
        assert_eq!(
            resp.container_responses[0].devices[0].host_path,
            format!("/dev/tap{}", link.index)
        );
        assert_eq!(kernel.count(Op::AddMacvtap), 1);
    }

    #[test]
    fn every_failure_after_creation_deletes_what_the_request_made() {
        // (operation, call number): the first device's checks, the second
        // device's creation, the second device's checks.
        for (op, nth) in [
            (Op::TapDevice, 1),
            (Op::OpenTapNode, 1),
            (Op::AddMacvtap, 2),
            (Op::TapDevice, 2),
            (Op::OpenTapNode, 2),
        ] {
            let kernel = fake_node();
            kernel.fail(op, nth, Errno::EIO);
            let e = allocate_fake(&kernel, &["lower0Mvp0", "lower0Mvp1"]).unwrap_err();
            assert!(e.to_string().contains("lower0Mvp"), "{op:?} {nth}: {e}");
            assert_eq!(
                host_link_names(&kernel),
                ["lower0"],
                "{op:?} call {nth} failing left a link"
            );
        }
    }

    #[test]
    fn a_reused_macvtap_is_kept_when_a_later_device_fails() {
        let kernel = fake_node();
        allocate_fake(&kernel, &["lower0Mvp0"]).unwrap();
        let held = kernel
            .link(HOST, &link_name_for_device("lower0Mvp0"))
            .unwrap();
        // The init container's device again (its creation is refused,
        // EEXIST, call 2), plus one whose creation fails (call 3).
        kernel.fail(Op::AddMacvtap, 3, Errno::ENOMEM);
        let e = allocate_fake(&kernel, &["lower0Mvp0", "lower0Mvp1"]).unwrap_err();
        assert!(e.to_string().contains("(ENOMEM)"), "{e}");
        assert!(e.to_string().contains("lower0Mvp1"), "{e}");
        assert_eq!(kernel.count(Op::AddMacvtap), 3);
        assert_eq!(
            kernel.link(HOST, &held.name),
            Some(held),
            "a pod may already hold it"
        );
        assert_eq!(kernel.count(Op::DelLink), 0);
    }

    /// Runs Allocate of `ids` (one container) of `cfg` on the fake kernel.
    fn allocate_cfg(
        kernel: &FakeKernel,
        cfg: &ResourceConfig,
        ids: &[&str],
    ) -> Result<AllocateResponse> {
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        };
        check_request(&req, cfg)?;
        allocate_on(&Host::current(kernel).unwrap(), &req, cfg)
    }

    fn on_lower0(name: &str, mode: MacvtapMode, capacity: u32) -> ResourceConfig {
        ResourceConfig {
            name: name.into(),
            lower_device: "lower0".into(),
            mode,
            capacity,
        }
    }

    /// A foreign `kind` link on the fake node's lower0 in `mode`.
    fn foreign_port(kernel: &FakeKernel, name: &str, kind: &str, mode: MacvtapMode) {
        let lower = kernel.link(HOST, "lower0").unwrap().index;
        kernel.insert_link(
            HOST,
            Link {
                macvtap_mode: (kind == "macvtap").then_some(mode),
                ..test_support::fake::link(0, name, kind, Some(lower))
            },
        );
    }

    #[test]
    fn a_passthru_allocate_beside_another_port_is_refused_naming_it() {
        let kernel = fake_node();
        let pt = on_lower0("pt", MacvtapMode::Passthru, 1);
        foreign_port(&kernel, "mv0", "macvlan", MacvtapMode::Bridge);
        let e = allocate_cfg(&kernel, &pt, &["ptMvp0"]).unwrap_err();
        assert_eq!(e.grpc_code(), tonic::Code::FailedPrecondition);
        assert_eq!(e.refusal(), crate::error::PORT_IN_THE_WAY);
        assert_eq!(
            e.to_string(),
            "resource macvtap.network.kubevirt.io/pt cannot get a macvtap: NIC lower0 already \
             carries macvlan mv0; the kernel allows a passthru macvtap only alone on its NIC, so \
             delete mv0 or give the passthru resource a NIC of its own"
        );
        assert_eq!(kernel.count(Op::AddMacvtap), 0, "nothing was tried");
        // Its own device's link is no port in the way: a repeated Allocate reuses it.
        // (A repeated Allocate tries the create, meets the name and reuses
        // the link: same answer, nothing deleted.)
        let kernel = fake_node();
        let first = allocate_cfg(&kernel, &pt, &["ptMvp0"]).unwrap();
        let again = allocate_cfg(&kernel, &pt, &["ptMvp0"]).unwrap();
        assert_eq!(first, again);
        assert_eq!(kernel.count(Op::DelLink), 0);
    }

    #[test]
    fn the_kernels_einval_or_ebusy_becomes_the_port_in_the_way() {
        // A passthru port that appeared after the check (the fake refuses as
        // the kernel does): a bridge-mode Allocate names it, whatever the errno.
        for errno in [Errno::EINVAL, Errno::EBUSY] {
            let kernel = fake_node();
            foreign_port(&kernel, "mvtpt", "macvtap", MacvtapMode::Passthru);
            kernel.fail(Op::AddMacvtap, 1, errno);
            let e = allocate_fake(&kernel, &["lower0Mvp0"]).unwrap_err();
            assert_eq!(e.refusal(), crate::error::PORT_IN_THE_WAY, "{errno}: {e}");
            assert!(
                e.to_string().contains("carries passthru macvtap mvtpt"),
                "{errno}: {e}"
            );
        }
        // A passthru create refused with EINVAL when the node's namespace
        // shows no port: one in a pod's namespace.
        let kernel = fake_node();
        kernel.fail(Op::AddMacvtap, 1, Errno::EINVAL);
        let e = allocate_cfg(
            &kernel,
            &on_lower0("pt", MacvtapMode::Passthru, 1),
            &["ptMvp0"],
        )
        .unwrap_err();
        assert_eq!(e.refusal(), crate::error::PORT_IN_THE_WAY, "{e}");
        assert!(
            e.to_string().contains(
                "NIC lower0 already carries another macvlan/macvtap port (the kernel refused the \
                 passthru macvtap with EINVAL, and no such port is in the node's namespace, so a \
                 pod holds it)"
            ),
            "{e}"
        );
        // Likewise a bridge-mode EINVAL: a passthru port in a pod's namespace.
        let kernel = fake_node();
        kernel.fail(Op::AddMacvtap, 1, Errno::EINVAL);
        let e = allocate_fake(&kernel, &["lower0Mvp0"]).unwrap_err();
        assert_eq!(e.refusal(), crate::error::PORT_IN_THE_WAY, "{e}");
        assert!(
            e.to_string().contains(
                "NIC lower0 carries a passthru macvlan/macvtap port (the kernel refused the \
                 macvtap with EINVAL, and no such port is in the node's namespace, so a pod \
                 holds it)"
            ),
            "{e}"
        );
        // Without any port EBUSY stays the busy NIC, and other errnos the kernel's.
        let kernel = fake_node();
        kernel.fail(Op::AddMacvtap, 1, Errno::EPERM);
        let e = allocate_fake(&kernel, &["lower0Mvp0"]).unwrap_err();
        assert_eq!(e.refusal(), crate::error::INTERNAL, "{e}");
        let kernel = fake_node();
        kernel.fail(Op::AddMacvtap, 1, Errno::EBUSY);
        let e = allocate_fake(&kernel, &["lower0Mvp0"]).unwrap_err();
        assert_eq!(e.refusal(), crate::error::LOWER_DEVICE_BUSY, "{e}");
    }

    #[test]
    fn a_new_device_is_created_without_looking_it_up_first() {
        let kernel = fake_node();
        allocate_fake(&kernel, &["lower0Mvp0"]).unwrap();
        // The lower NIC's look-up only; the creation answers with the link.
        assert_eq!(kernel.count(Op::GetLink), 1, "{:?}", kernel.calls());
        assert_eq!(kernel.count(Op::AddMacvtap), 1);
    }

    #[test]
    fn a_taken_name_is_reused_when_right_and_replaced_when_wrong() {
        let kernel = fake_node();
        let name = link_name_for_device("lower0Mvp0");
        let lower = kernel.link(HOST, "lower0").unwrap();
        let wrong = kernel.insert_link(
            HOST,
            test_support::fake::link(40, &name, "macvlan", Some(lower.index)),
        );
        let resp = allocate_fake(&kernel, &["lower0Mvp0"]).unwrap();
        let made = kernel.link(HOST, &name).unwrap();
        assert!(made.is_macvtap(), "{made:?}");
        assert_ne!(made.index, wrong.index);
        assert_eq!(kernel.count(Op::DelLink), 1);
        assert_eq!(
            resp.container_responses[0].devices[0].host_path,
            format!("/dev/tap{}", made.index)
        );
        // Asked again: the right macvtap is kept, not made anew.
        let again = allocate_fake(&kernel, &["lower0Mvp0"]).unwrap();
        assert_eq!(kernel.link(HOST, &name), Some(made.clone()));
        assert_eq!(kernel.count(Op::DelLink), 1);
        assert_eq!(
            again.container_responses[0].devices[0].host_path,
            format!("/dev/tap{}", made.index)
        );
    }

    /// The host's file systems as a privileged container without the
    /// host's `/dev` sees them: sysfs at `sysfs`, its own empty copy of
    /// `/dev` at `dev`, where no tap node ever shows.
    fn without_host_dev(
        sysfs: &tempfile::TempDir,
        dev: &tempfile::TempDir,
    ) -> crate::core::host::HostPaths {
        crate::core::host::HostPaths {
            sysfs: sysfs.path().to_path_buf(),
            dev: dev.path().to_path_buf(),
            tap_nodes: crate::core::host::TapNodes::Unseen {
                fstype: "tmpfs".into(),
            },
            ..Default::default()
        }
    }

    /// Makes `sysfs` show macvtap `name` with `ifindex` and char device `dev`,
    /// as the kernel does under `class/net/<name>/macvtap/tap<ifindex>/dev`.
    fn sysfs_shows(sysfs: &tempfile::TempDir, name: &str, ifindex: u32, dev: (u64, u64)) {
        let dir = sysfs
            .path()
            .join(format!("class/net/{name}/macvtap/tap{ifindex}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("dev"), format!("{}:{}\n", dev.0, dev.1)).unwrap();
    }

    #[test]
    fn without_the_hosts_dev_allocate_answers_the_host_path_sysfs_shows() {
        let kernel = fake_node();
        let (sysfs, dev) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let name = link_name_for_device("lower0Mvp0");
        let lower = kernel.link(HOST, "lower0").unwrap();
        // The device's macvtap is on the node already (an init container's
        // Allocate made it), and sysfs shows its char device.
        kernel.insert_link(
            HOST,
            Link {
                macvtap_mode: Some(MacvtapMode::Bridge),
                ..test_support::fake::link(40, &name, "macvtap", Some(lower.index))
            },
        );
        sysfs_shows(&sysfs, &name, 40, (240, 7));
        // Neither the namespace nor a tap node could say more: the answer
        // comes from sysfs alone.
        kernel.fail(Op::TapDevice, 1, Errno::EIO);
        kernel.fail(Op::OpenTapNode, 1, Errno::ENOENT);
        let host = Host::current(&kernel)
            .unwrap()
            .with_paths(without_host_dev(&sysfs, &dev));
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["lower0Mvp0".into()],
            }],
        };
        let resp = allocate_on(&host, &req, &ResourceConfig::for_nic("lower0")).unwrap();
        let spec = &resp.container_responses[0].devices[0];
        // The host's node, not the container's copy of /dev.
        assert_eq!(spec.host_path, "/dev/tap40");
        assert_eq!(spec.container_path, "/dev/tap40");
        assert_eq!(spec.permissions, "rw");
        assert_eq!(kernel.count(Op::OpenTapNode), 0, "no node is waited for");
        assert_eq!(kernel.count(Op::TapDevice), 0, "sysfs showed it");
        assert_eq!(kernel.count(Op::DelLink), 0);
    }

    #[test]
    fn without_the_hosts_dev_a_new_macvtap_is_answered_without_its_node() {
        let kernel = fake_node();
        let (sysfs, dev) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let host = Host::current(&kernel)
            .unwrap()
            .with_paths(without_host_dev(&sysfs, &dev));
        let cfg = ResourceConfig::for_nic("lower0");
        let req = |id: &str| AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![id.into()],
            }],
        };
        // The tap node never shows: waiting for it would fail.
        kernel.fail(Op::OpenTapNode, 1, Errno::ENOENT);
        let resp = allocate_on(&host, &req("lower0Mvp0"), &cfg).unwrap();
        let link = kernel
            .link(HOST, &link_name_for_device("lower0Mvp0"))
            .unwrap();
        assert_eq!(
            resp.container_responses[0].devices[0].host_path,
            format!("/dev/tap{}", link.index)
        );
        assert_eq!(kernel.count(Op::OpenTapNode), 0);
        // A link whose char device nothing shows is no macvtap to hand out:
        // refused, and the link made for it deleted.
        kernel.fail(Op::TapDevice, 2, Errno::ENOENT);
        let e = allocate_on(&host, &req("lower0Mvp1"), &cfg).unwrap_err();
        assert!(e.to_string().contains("lower0Mvp1"), "{e}");
        assert_eq!(kernel.link(HOST, &link_name_for_device("lower0Mvp1")), None);
    }
}

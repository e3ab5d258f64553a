//! The devices of one request (what Allocate asks, and a DRA prepare
//! would): made, reused or refused by [`prepare`] after [`check_ids`], on
//! the fake kernel without root, and on many threads sharing one
//! [`SharedHost`] as root.

use super::PreparedDevice;
use super::prepare::{check_ids, hand_out, prepare};
use crate::config::ResourceConfig;
use crate::core::host::{Host, HostPaths, SharedHost, TapNodes};
use crate::core::ledger::{AllocationClock, Assignments};
use crate::error::Result;
use macvtap_link::{Link, MacvtapMode, Op, link_name_for_device};
use nix::errno::Errno;
use test_support::fake::{FakeKernel, HOST};

/// Checks and prepares `ids` of `cfg` on the fake kernel's host namespace.
fn prepare_cfg(
    kernel: &FakeKernel,
    cfg: &ResourceConfig,
    ids: &[&str],
) -> Result<Vec<PreparedDevice>> {
    check_ids(cfg, ids.iter().copied())?;
    prepare(&Host::current(kernel).unwrap(), cfg, ids)
}

/// Checks and prepares `ids` of the resource on lower0.
fn prepare_fake(kernel: &FakeKernel, ids: &[&str]) -> Result<Vec<PreparedDevice>> {
    prepare_cfg(kernel, &ResourceConfig::for_nic("lower0"), ids)
}

fn fake_node() -> FakeKernel {
    let kernel = FakeKernel::new();
    kernel.add_nic(HOST, "lower0");
    kernel
}

fn host_link_names(kernel: &FakeKernel) -> Vec<String> {
    kernel.links_of(HOST).into_iter().map(|l| l.name).collect()
}

/// A device's tap node, as the kubelet is told it.
fn node(d: &PreparedDevice) -> String {
    d.node.display().to_string()
}

/// Issue 37's first failure: the soak's daemon held two descriptors more
/// (its namespace and a netlink socket) for every thread of the blocking
/// pool that had served an Allocate. Allocates on many threads in one
/// namespace (as the daemon's, the host's) now keep one handle.
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
    let host = Arc::new(SharedHost::new(&macvtap_link::Linux, HostPaths::default()));
    let threads: Vec<_> = (0..THREADS)
        .map(|i| {
            let fd = netns.as_fd().try_clone_to_owned().unwrap();
            let (cfg, allocated, done) = (cfg.clone(), allocated.clone(), done.clone());
            let host = host.clone();
            std::thread::spawn(move || {
                nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                let id = format!("lower0Mvp{i}");
                let got = check_ids(&cfg, [id.as_str()])
                    .and_then(|()| host.run(|host| prepare(host, &cfg, &[id.as_str()])));
                // Alive until counted: a thread's own handle would live as
                // long as the thread.
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
    let ids = ["eth0Mvp1", "eth0Mvp2"];
    let e = check_ids(&cfg, ids).unwrap_err();
    assert_eq!(e.grpc_code(), tonic::Code::InvalidArgument);
    assert!(e.to_string().contains("\"eth0Mvp2\""), "{e}");
    let kernel = FakeKernel::new();
    let host = SharedHost::new(&kernel, HostPaths::default());
    let (clock, assignments) = (AllocationClock::default(), Assignments::default());
    let e = hand_out(&host, &cfg, &ids, &clock, &assignments).unwrap_err();
    assert_eq!(e.grpc_code(), tonic::Code::InvalidArgument);
    assert!(kernel.calls().is_empty(), "{:?}", kernel.calls());
}

#[test]
fn prepare_creates_each_macvtap_and_gives_its_tap_node() {
    let kernel = fake_node();
    let prepared = prepare_fake(&kernel, &["lower0Mvp0", "lower0Mvp1"]).unwrap();
    assert_eq!(prepared.len(), 2);
    for (d, id) in prepared.iter().zip(["lower0Mvp0", "lower0Mvp1"]) {
        let link = kernel.link(HOST, &link_name_for_device(id)).unwrap();
        assert_eq!(node(d), format!("/dev/tap{}", link.index));
        assert!(d.created);
    }
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
        let e = prepare_fake(&kernel, &["lower0Mvp0", "lower0Mvp1"]).unwrap_err();
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
    prepare_fake(&kernel, &["lower0Mvp0"]).unwrap();
    let held = kernel
        .link(HOST, &link_name_for_device("lower0Mvp0"))
        .unwrap();
    // The init container's device again (its creation is refused, EEXIST,
    // call 2), plus one whose creation fails (call 3).
    kernel.fail(Op::AddMacvtap, 3, Errno::ENOMEM);
    let e = prepare_fake(&kernel, &["lower0Mvp0", "lower0Mvp1"]).unwrap_err();
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

fn on_lower0(name: &str, mode: MacvtapMode, capacity: u32) -> ResourceConfig {
    ResourceConfig {
        name: name.into(),
        lower_device: "lower0".into(),
        mode,
        capacity,
        placement: None,
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
    let e = prepare_cfg(&kernel, &pt, &["ptMvp0"]).unwrap_err();
    assert_eq!(e.grpc_code(), tonic::Code::FailedPrecondition);
    assert_eq!(e.refusal(), crate::error::PORT_IN_THE_WAY);
    assert_eq!(
        e.to_string(),
        "resource macvtap.network.kubevirt.io/pt cannot get a macvtap: NIC lower0 already \
         carries macvlan mv0; the kernel allows a passthru macvtap only alone on its NIC, so \
         delete mv0 or give the passthru resource a NIC of its own"
    );
    assert_eq!(kernel.count(Op::AddMacvtap), 0, "nothing was tried");
    // Its own device's link is no port in the way: a repeated Allocate
    // reuses it. (A repeated Allocate tries the create, meets the name and
    // reuses the link: same answer, nothing deleted.)
    let kernel = fake_node();
    let first = prepare_cfg(&kernel, &pt, &["ptMvp0"]).unwrap();
    let again = prepare_cfg(&kernel, &pt, &["ptMvp0"]).unwrap();
    assert_eq!(node(&first[0]), node(&again[0]));
    assert_eq!(first[0].link, again[0].link);
    assert!(!again[0].created);
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
        let e = prepare_fake(&kernel, &["lower0Mvp0"]).unwrap_err();
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
    let e = prepare_cfg(
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
    let e = prepare_fake(&kernel, &["lower0Mvp0"]).unwrap_err();
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
    let e = prepare_fake(&kernel, &["lower0Mvp0"]).unwrap_err();
    assert_eq!(e.refusal(), crate::error::INTERNAL, "{e}");
    let kernel = fake_node();
    kernel.fail(Op::AddMacvtap, 1, Errno::EBUSY);
    let e = prepare_fake(&kernel, &["lower0Mvp0"]).unwrap_err();
    assert_eq!(e.refusal(), crate::error::LOWER_DEVICE_BUSY, "{e}");
}

#[test]
fn a_new_device_is_created_without_looking_it_up_first() {
    let kernel = fake_node();
    prepare_fake(&kernel, &["lower0Mvp0"]).unwrap();
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
    let prepared = prepare_fake(&kernel, &["lower0Mvp0"]).unwrap();
    let made = kernel.link(HOST, &name).unwrap();
    assert!(made.is_macvtap(), "{made:?}");
    assert_ne!(made.index, wrong.index);
    assert_eq!(kernel.count(Op::DelLink), 1);
    assert_eq!(node(&prepared[0]), format!("/dev/tap{}", made.index));
    // Asked again: the right macvtap is kept, not made anew.
    let again = prepare_fake(&kernel, &["lower0Mvp0"]).unwrap();
    assert_eq!(kernel.link(HOST, &name), Some(made.clone()));
    assert_eq!(kernel.count(Op::DelLink), 1);
    assert_eq!(node(&again[0]), format!("/dev/tap{}", made.index));
}

/// The host's file systems as a privileged container without the host's
/// `/dev` sees them: sysfs at `sysfs`, its own empty copy of `/dev` at
/// `dev`, where no tap node ever shows.
fn without_host_dev(sysfs: &tempfile::TempDir, dev: &tempfile::TempDir) -> HostPaths {
    HostPaths {
        sysfs: sysfs.path().to_path_buf(),
        dev: dev.path().to_path_buf(),
        tap_nodes: TapNodes::Unseen {
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
fn without_the_hosts_dev_the_host_path_sysfs_shows_is_given() {
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
    // Neither the namespace nor a tap node could say more: the answer comes
    // from sysfs alone.
    kernel.fail(Op::TapDevice, 1, Errno::EIO);
    kernel.fail(Op::OpenTapNode, 1, Errno::ENOENT);
    let host = Host::current(&kernel)
        .unwrap()
        .with_paths(without_host_dev(&sysfs, &dev));
    let prepared = prepare(&host, &ResourceConfig::for_nic("lower0"), &["lower0Mvp0"]).unwrap();
    // The host's node, not the container's copy of /dev.
    assert_eq!(node(&prepared[0]), "/dev/tap40");
    assert_eq!(kernel.count(Op::OpenTapNode), 0, "no node is waited for");
    assert_eq!(kernel.count(Op::TapDevice), 0, "sysfs showed it");
    assert_eq!(kernel.count(Op::DelLink), 0);
}

#[test]
fn without_the_hosts_dev_a_new_macvtap_is_given_without_its_node() {
    let kernel = fake_node();
    let (sysfs, dev) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let host = Host::current(&kernel)
        .unwrap()
        .with_paths(without_host_dev(&sysfs, &dev));
    let cfg = ResourceConfig::for_nic("lower0");
    // The tap node never shows: waiting for it would fail.
    kernel.fail(Op::OpenTapNode, 1, Errno::ENOENT);
    let prepared = prepare(&host, &cfg, &["lower0Mvp0"]).unwrap();
    let link = kernel
        .link(HOST, &link_name_for_device("lower0Mvp0"))
        .unwrap();
    assert_eq!(node(&prepared[0]), format!("/dev/tap{}", link.index));
    assert_eq!(kernel.count(Op::OpenTapNode), 0);
    // A link whose char device nothing shows is no macvtap to hand out:
    // refused, and the link made for it deleted.
    kernel.fail(Op::TapDevice, 2, Errno::ENOENT);
    let e = prepare(&host, &cfg, &["lower0Mvp1"]).unwrap_err();
    assert!(e.to_string().contains("lower0Mvp1"), "{e}");
    assert_eq!(kernel.link(HOST, &link_name_for_device("lower0Mvp1")), None);
}

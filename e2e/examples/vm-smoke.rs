//! Manual smoke run: boots the guest inside a pod namespace on a macvtap,
//! with QEMU (uid 107) on a tap node or with libvirtd (uid 107) on an interface name.
//! `vm-smoke qemu POD_NS /dev/tapN MAC` or `vm-smoke libvirt POD_NS IFNAME MAC`.

fn main() -> std::process::ExitCode {
    macvtap_e2e::exit::report(run())
}

fn run() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-guest");
    let g = macvtap_e2e::guest::build(&dir)?;
    let net = macvtap_e2e::vm::GuestNet {
        mac: a[4].clone(),
        ip: "192.0.2.2/24".into(),
        peer: "192.0.2.1".into(),
        tries: 10,
    };
    let work = tempfile::tempdir()?;
    let run = if a[1] == "qemu" {
        macvtap_e2e::vm::run_qemu(&a[2], std::path::Path::new(&a[3]), &g, &net, work.path())?
    } else {
        let lv = tempfile::tempdir()?;
        let t = std::time::Instant::now();
        let d = macvtap_e2e::vm::Libvirtd::start(&a[2], lv.path())?;
        println!("libvirtd ready in {:?}", t.elapsed());
        let vm = macvtap_e2e::vm::VmIface {
            mac_address: Some(a[4].clone()),
            queues: 1,
        };
        d.run_vm("smoke", &a[2], &a[3], &vm, &g, &net)?.0
    };
    println!(
        "{}\nping_ok={} to_marker={:?} total={:?}",
        run.markers(),
        run.ping_ok,
        run.to_marker,
        run.total
    );
    Ok(())
}

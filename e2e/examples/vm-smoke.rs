//! Manual smoke run: boots the guest inside a pod namespace on a macvtap,
//! with QEMU on a tap node or with libvirtd on an interface name.
//! `vm-smoke qemu POD_NS /dev/tapN MAC` or `vm-smoke libvirt POD_NS IFNAME MAC`.

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-guest");
    let g = macvtap_e2e::guest::build(&dir)?;
    let net = macvtap_e2e::vm::GuestNet {
        mac: a[4].clone(),
        ip: "192.0.2.2/24".into(),
        peer: "192.0.2.1".into(),
        tries: 10,
    };
    let run = if a[1] == "qemu" {
        macvtap_e2e::vm::run_qemu(&a[2], std::path::Path::new(&a[3]), &g, &net, &dir)?
    } else {
        let lv = tempfile::tempdir()?;
        let t = std::time::Instant::now();
        let d = macvtap_e2e::vm::Libvirtd::start(&a[2], lv.path())?;
        println!("libvirtd ready in {:?}", t.elapsed());
        d.run_domain("smoke", &a[3], &g, &net)?
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

//! Times the pieces of the CNI's ADD outside the kernel's move (manual profiling aid).
fn main() -> anyhow::Result<()> {
    let pod = macvtap_link::Netns::open("/run/netns/tt-pod")?;
    for _ in 0..5 {
        let t = std::time::Instant::now();
        let dev = macvtap_link::tapdev::tap_dev_in_netns(&pod, "net1")?;
        let t1 = t.elapsed();
        let t = std::time::Instant::now();
        let h = macvtap_link::Handle::in_netns(&pod)?;
        let t2 = t.elapsed();
        let t = std::time::Instant::now();
        let _ = h.get_link("net1")?;
        let t3 = t.elapsed();
        println!("tap_dev {dev:?} {t1:?}; handle in netns {t2:?}; get_link {t3:?}");
    }
    Ok(())
}

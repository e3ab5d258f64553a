//! The soak in CI: 200 pod lifecycles on one sandbox node with kubelet
//! restarts, NIC flaps, device plugin restarts and killed CNI runs, from a
//! fixed seed (`SOAK_SEED` replays another; the benchmark runs a longer
//! soak from a random one). See `macvtap_e2e::soak`.

use macvtap_e2e::soak::{Settings, run};

/// The seed CI runs.
const SEED: u64 = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_lifecycles_with_restarts_flaps_and_kills_leave_nothing_behind() {
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .map(|s| s.parse().expect("SOAK_SEED is a number"))
        .unwrap_or(SEED);
    let report = run(Settings {
        seed,
        lifecycles: 200,
        max_live: 4,
    })
    .await
    .unwrap();
    eprintln!("{}", report.summary());
    // The seed must exercise every disruption, or the soak proves less
    // than it says.
    assert!(report.lifecycles >= 200, "{}", report.summary());
    assert!(report.kubelet_restarts > 0, "{}", report.summary());
    assert!(report.nic_flaps > 0, "{}", report.summary());
    assert!(
        report.plugin_kills > 0 && report.plugin_stops > 0,
        "{}",
        report.summary()
    );
    assert!(
        report.add_kills > 0 && report.del_kills > 0,
        "{}",
        report.summary()
    );
}

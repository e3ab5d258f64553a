//! The soak as a benchmark: a longer run than CI's from a random seed
//! (printed, so a failure replays with `SOAK_SEED`), its counts, wall time
//! and the last daemon's descriptors and memory in the report.

use super::report::Report;
use crate::soak::{Settings, run};
use anyhow::{Context, Result};

/// Runs `lifecycles` pod lifecycles from `seed` (a random one when `None`)
/// and writes what happened.
pub async fn soak(lifecycles: usize, seed: Option<u64>, report: &mut Report) -> Result<()> {
    let seed = seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        t ^ u64::from(std::process::id())
    });
    report.section(
        "Soak",
        &format!(
            "{lifecycles} pod lifecycles on one sandbox node (Allocate, PodResources, CNI ADD in a \
             new namespace, DEL), mixed from seed {seed} with kubelet restarts, NIC flaps, device \
             plugin stops and SIGKILLs, and CNI ADDs and DELs killed at a netlink send, each \
             followed by the runtime's next step (replay: `SOAK_SEED={seed} BENCH_ONLY=soak`). \
             CI runs 200 from a fixed seed and every seed that once failed (`e2e/tests/soak.rs`)."
        ),
    );
    let r = run(Settings {
        seed,
        lifecycles,
        max_live: 4,
    })
    .await
    .with_context(|| format!("the soak from seed {seed}"))?;
    let last = r.samples.last().context("no samples")?;
    let first = r
        .samples
        .iter()
        .find(|s| s.pid == last.pid)
        .context("no samples")?;
    report.text(&format!(
        "| lifecycles | wall s | kubelet restarts | NIC flaps | plugin stops | plugin kills | \
         killed ADDs | killed DELs | last daemon fds first → last | last daemon RSS KiB first → \
         last |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n| {} | \
         {:.1} | {} | {} | {} | {} | {} | {} | {} → {} | {} → {} |\n\nAfter the run no link and no \
         tap node was left; every live pod's link was at its `/dev/tapN`'s ifindex after every \
         step; the last daemon's descriptors and memory stayed flat after its warm-up of {} \
         lifecycles.\n\n```\n{}\n```",
        r.lifecycles,
        r.took.as_secs_f64(),
        r.kubelet_restarts,
        r.nic_flaps,
        r.plugin_stops,
        r.plugin_kills,
        r.add_kills,
        r.del_kills,
        first.fds,
        last.fds,
        first.rss_kib,
        last.rss_kib,
        crate::soak::flat::WARM_UP,
        r.descriptors()
    ));
    Ok(())
}

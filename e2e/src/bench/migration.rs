//! Live migration of a VM on our macvtap between two nodes on one switch
//! (`crate::migration`), with the target pod's link silent (our CNI) and
//! chatty (IPv6 left on, as the Go project's CNI leaves it), interleaved:
//! ping loss, longest gap, longest round trip and time from switchover to
//! the first reply, as the peer host sees them pinging every 10 ms.

use super::report::Report;
use crate::migration::{Binaries, Cluster, Outcome, TARGET_LEAD, Variant, port};
use anyhow::Result;
use std::path::Path;

/// The order of variants, repeated: each variant migrates in both
/// directions equally often (the VM goes A→B, then B→A, and so on).
const ORDER: [Variant; 4] = [
    Variant::Silent,
    Variant::Chatty,
    Variant::Chatty,
    Variant::Silent,
];

/// Median, min and max of `v`, formatted with `fmt`.
fn spread(v: &[f64], fmt: impl Fn(f64) -> String) -> [String; 3] {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return ["n/a".into(), "n/a".into(), "n/a".into()];
    }
    [fmt(s[(s.len() - 1) / 2]), fmt(s[0]), fmt(s[s.len() - 1])]
}

/// A row: its name, the value of one migration, and whether it has a
/// fractional part worth showing.
type Measure<'a> = (&'a str, &'a dyn Fn(&Outcome) -> f64, bool);

fn table(silent: &[Outcome], chatty: &[Outcome]) -> String {
    let mut md = format!(
        "| measure ({} migrations each) | silent median | min | max | chatty median | min | max |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        silent.len().min(chatty.len())
    );
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    let rows: [Measure; 7] = [
        (
            "pings lost (of one every 10 ms)",
            &|o| o.figures.lost as f64,
            false,
        ),
        (
            "longest gap between replies, ms",
            &|o| ms(o.figures.longest_gap),
            true,
        ),
        ("longest round trip, ms", &|o| ms(o.figures.max_rtt), true),
        (
            "switchover to first reply, ms",
            &|o| o.figures.to_first_reply.map_or(f64::NAN, ms),
            true,
        ),
        (
            "QEMU downtime (its estimate), ms",
            &|o| o.downtime_ms.map_or(f64::NAN, |d| d as f64),
            false,
        ),
        ("migrate to completed, ms", &|o| ms(o.migration), true),
        (
            "switch had the VM's MAC on the target port before migrate (1 = yes)",
            &|o| {
                f64::from(u8::from(
                    o.port_before.as_deref() == o.port_after.as_deref(),
                ))
            },
            false,
        ),
    ];
    for (name, f, frac) in rows {
        let fmt = |x: f64| {
            if frac {
                format!("{x:.1}")
            } else {
                format!("{x:.0}")
            }
        };
        let a = spread(&silent.iter().map(f).collect::<Vec<_>>(), fmt);
        let b = spread(&chatty.iter().map(f).collect::<Vec<_>>(), fmt);
        md.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {} | {} |\n",
            a[0], a[1], a[2], b[0], b[1], b[2]
        ));
    }
    md
}

/// Runs `per_variant` migrations of each variant, interleaved, ping-pong
/// between the two nodes, with the shipped binaries in `static_dir`.
pub async fn compare(static_dir: &Path, per_variant: usize, report: &mut Report) -> Result<()> {
    let bins = Binaries {
        cni: static_dir.join("macvtap"),
        device_plugin: static_dir.join("macvtap-deviceplugin"),
    };
    let mut cluster = Cluster::start(bins).await?;
    let first = ORDER[0];
    let source = cluster.pod(0, first).await?;
    let mut vm = tokio::task::block_in_place(|| cluster.boot(source))?;
    let (mut silent, mut chatty) = (Vec::new(), Vec::new());
    for i in 0..per_variant * 2 {
        let variant = ORDER[i % ORDER.len()];
        let to = if vm.pod.host == 0 { 1 } else { 0 };
        let (next, outcome) = cluster.migrate(vm, to, variant).await?;
        vm = next;
        println!(
            "migration {} ({} to {}): {}",
            i + 1,
            port(1 - to),
            port(to),
            outcome.describe()
        );
        match variant {
            Variant::Silent => silent.push(outcome),
            Variant::Chatty => chatty.push(outcome),
        }
    }
    tokio::task::block_in_place(|| cluster.stop(vm))?;
    cluster.finish()?;
    report.section(
        "Live migration: silent vs chatty target link",
        &format!(
            "Two sandbox nodes and a peer host on one Linux bridge in a \"switch\" namespace \
             (learning, default ageing), each node running our device plugin (same resource) \
             and its test kubelet. The VM (QEMU TCG, 128 MiB, as uid 107 on `/dev/tapN`, \
             `macAddress` set) migrates between the nodes, back and forth: for each migration \
             the target node allocates a device and runs our CNI's ADD with the VM's MAC, QEMU \
             there waits with `-incoming`, and {} s later the source QEMU migrates to it over a \
             unix socket through QMP; then the source pod's CNI DEL. The peer pings the VM \
             every 10 ms throughout, from its raw socket. **silent**: our CNI (no IPv6 on the \
             pod-side link). **chatty**: IPv6 re-enabled on the target pod's link right after \
             ADD, so the kernel sends MLD reports, a DAD probe and router solicitations from \
             the VM's MAC, as the Go project's CNI does. The variants alternate (silent, \
             chatty, chatty, silent, ...), so each migrates both ways equally often. Loss \
             counts requests sent after the VM first answered that never got a reply; a request \
             the target's macvtap queued (the target QEMU holds `/dev/tapN` while it waits) \
             and the VM answered after the switchover shows as a long round trip, not a loss (that \
             queue holds 1000 frames, the NIC's txqueuelen: 10 s of these pings; busier \
             traffic or a longer wait overflows it, and then it is loss).",
            TARGET_LEAD.as_secs_f64()
        ),
    );
    report.text(&table(&silent, &chatty));
    Ok(())
}

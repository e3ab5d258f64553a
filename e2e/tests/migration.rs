//! Live migration of a VM on our macvtap between two sandbox nodes on one
//! L2 segment (see `macvtap_e2e::migration`): the migration completes, the
//! VM answers the peer's pings from the target node after the switchover
//! (and the switch has learned its MAC there), and once the pods are gone
//! nothing is left on either node. Once with our silent pod-side link and
//! once with the link left chatty: a capture on node B's switch port, from
//! before the target pod's CNI ADD until `migrate`, sees no frame from the
//! VM's MAC from the silent link and at least one from the chatty link (the
//! FDB read once before `migrate` cannot show it: the VM's replies to the
//! peer's pings re-teach node A's port within 10 ms). Whether one variant
//! loses fewer pings than the other is for the benchmark to report
//! (`BENCH_ONLY=migration hack/bench.sh`), not asserted here, and no timing
//! is asserted.

use anyhow::{Result, ensure};
use macvtap_e2e::migration::{Binaries, Cluster, Variant, port};
use macvtap_e2e::sandbox::require_root;
use macvtap_e2e::steps::Steps;

async fn migrate_once(variant: Variant) -> Result<()> {
    require_root()?;
    let mut steps = Steps::new();
    steps.step("switch namespace with a bridge, peer host, two nodes each with our device plugin");
    let mut cluster = Cluster::start(Binaries::workspace()?).await?;

    steps.step("source pod on node A: Allocate, CNI ADD with the VM's MAC; QEMU boots the VM");
    let source = cluster.pod(0, variant).await?;
    let vm = tokio::task::block_in_place(|| cluster.boot(source))?;

    steps.step(&format!(
        "target pod on node B ({}), QEMU -incoming, migrate through QMP while the peer pings",
        variant.name()
    ));
    let (vm, outcome) = cluster.migrate(vm, 1, variant).await?;
    steps.say(outcome.describe());
    ensure!(
        outcome.target_status == "running",
        "the target VM is {} after the migration",
        outcome.target_status
    );
    let frames: Vec<String> = outcome
        .target_frames
        .iter()
        .map(|f| format!("{} ({} bytes)", f.ethertype(), f.bytes.len()))
        .collect();
    match variant {
        Variant::Silent => ensure!(
            frames.is_empty(),
            "the silent target link sent {} frames from the VM's MAC into the switch before \
             the migration (EtherType, size): {frames:?}",
            frames.len()
        ),
        Variant::Chatty => ensure!(
            !frames.is_empty(),
            "the chatty target link sent no frame from the VM's MAC into the switch before the \
             migration, so the capture on {} could not tell it from a silent one",
            port(1)
        ),
    }
    if variant == Variant::Silent {
        // Nothing but the VM on node A sent from its MAC before the
        // migration: the silent target link taught the switch nothing.
        ensure!(
            outcome.port_before.as_deref() == Some(port(0).as_str()),
            "before the migration the switch had the VM's MAC on {:?}, not on node A's {}: \
             the target pod's link sent frames from the VM's MAC",
            outcome.port_before,
            port(0)
        );
    }
    ensure!(
        outcome.port_after.as_deref() == Some(port(1).as_str()),
        "the switch has the VM's MAC on port {:?}, not on node B's {}",
        outcome.port_after,
        port(1)
    );
    ensure!(
        outcome.figures.to_first_reply.is_some(),
        "no reply came after the switchover"
    );

    steps.step("teardown: target VM stopped, its CNI DEL; links reclaimed on both nodes");
    tokio::task::block_in_place(|| cluster.stop(vm))?;
    cluster.finish()?;
    println!("\n{}", steps.summary());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vm_migrates_to_another_node_and_answers_from_there() -> Result<()> {
    migrate_once(Variant::Silent).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vm_migrates_with_a_chatty_target_link_and_answers_from_there() -> Result<()> {
    migrate_once(Variant::Chatty).await
}

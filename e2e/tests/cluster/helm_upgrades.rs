//! Upgrades with the chart that keep the node's state, on the real node
//! (issue 46, item 2): the chart installed laid out as the kustomize base
//! (the release in `default`, our objects in `macvtap-system`, which the
//! chart makes), a VM pod on its resource answering the peer's pings for
//! the whole sequence, and not one ping lost from the first upgrade to the
//! rollback: `helm upgrade` to another image tag (the DaemonSet rolls
//! out); `macvtapResources` changed (a capacity, applied live by the
//! running daemon) and then unset (the ConfigMap kept as it was, so the
//! node serves what it served: README's deliberate meaning); the
//! ConfigMap replaced by one made by hand, which Helm refuses to take
//! until README's adoption recipe, run as written, marks it; our objects
//! moved to another namespace and the chart's Namespace dropped, both
//! refused before anything changes (a deleted DaemonSet would be an
//! uninstall to the daemon); `helm rollback` to the install's revision
//! (the first tag and capacity back); then `helm uninstall`.

use super::{
    DS, HELM_RELEASE, IMAGE_REPO, NIC, NS, PING_EVERY, RESOURCE, RESOURCE_PREFIX, Run,
    lost_between, repo, resource_list,
};
use anyhow::{Context, Result, ensure};
use macvtap_e2e::icmp::Pinger;
use macvtap_e2e::sandbox::TestNs;
use serde_json::Value;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const CM: &str = "macvtap-deviceplugin-config";
const VM: &str = "virt-launcher-vmup";
const VM_MAC: &str = "02:00:c6:33:64:aa";
const VM_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 170);

/// [`resource_list`] as `--set-json` takes it.
fn resources(capacity: i64) -> String {
    format!("macvtapResources={}", resource_list(capacity))
}

/// `helm VERB` of our release (in namespace `default`) with `args`, the
/// chart from the repository (`rollback` takes none).
fn helm_release(run: &Run, verb: &str, args: &[&str]) -> Result<String> {
    let chart = repo().join("charts/macvtap-rs");
    let chart = chart.to_string_lossy();
    let mut a = vec![verb, HELM_RELEASE];
    if verb != "rollback" {
        a.push(&chart);
    }
    a.extend_from_slice(&["--namespace", "default"]);
    a.extend_from_slice(args);
    run.c.helm(&a)
}

/// The ConfigMap as the API server has it.
fn configmap(run: &Run) -> Result<Value> {
    run.c.get_json(&["-n", NS, "configmap", CM])
}

/// The resource list in the ConfigMap, parsed.
fn conf(cm: &Value) -> Result<Value> {
    let text = cm["data"]["DP_MACVTAP_CONF"]
        .as_str()
        .context("the ConfigMap has no DP_MACVTAP_CONF")?;
    Ok(serde_json::from_str(text)?)
}

/// The uid and restart count of our daemon's one pod: the same before and
/// after a step means the daemon did not restart.
fn daemon_identity(run: &Run) -> Result<(Value, Value)> {
    let pod = run.daemon_pod()?;
    Ok((
        pod["metadata"]["uid"].clone(),
        pod["status"]["containerStatuses"][0]["restartCount"].clone(),
    ))
}

/// The image the daemon's pod runs.
fn daemon_image(run: &Run) -> Result<String> {
    Ok(run.daemon_pod()?["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or("")
        .to_string())
}

/// Fails unless the VM lost none of the pings sent from `from` until now;
/// returns how many were sent.
fn none_lost(pinger: &Pinger, from: Instant, what: &str) -> Result<usize> {
    let (sent, lost) = lost_between(pinger, from, Instant::now())?;
    ensure!(
        sent > 0 && lost == 0,
        "the VM lost {lost} of {sent} pings during {what}"
    );
    Ok(sent)
}

/// README's recipe for handing a ConfigMap made by hand to the release
/// (*Changing it live*), run as written with this test's release: kubectl
/// and helm from the test's tools, the admin kubeconfig, the repository
/// as the working directory.
fn readme_adoption(run: &Run) -> Result<()> {
    let script = super::readme_sh_block("To hand a ConfigMap you made")?;
    let first = "RELEASE=macvtap-rs RELEASE_NAMESPACE=macvtap-system NAMESPACE=macvtap-system";
    ensure!(
        script.starts_with(first),
        "README's adoption recipe changed shape:\n{script}"
    );
    let script = script.replacen(
        first,
        &format!("RELEASE={HELM_RELEASE} RELEASE_NAMESPACE=default NAMESPACE={NS}"),
        1,
    );
    super::run_readme_sh(Some(run.c), &script, "README's adoption recipe")?;
    Ok(())
}

/// The sequence, with our image's tags `tag_a` and `tag_b` (of
/// `IMAGE_REPO`) and the VM image imported.
pub(super) fn upgrades_keep_the_node(
    run: &mut Run,
    peer: &TestNs,
    (tag_a, tag_b): (&str, &str),
) -> Result<()> {
    let c = run.c;

    run.steps
        .step("helm install (macvtapResources: dataplane, capacity 2), a VM pod pinging");
    run.helm_install_as_base(tag_a, 2)?;
    run.wait_ds_ready()?;
    run.wait_allocatable(2)?;
    // README, "A first VM": the example NAD, naming the chart's resource.
    let example_nad = std::fs::read_to_string(repo().join("manifests/examples/nad.yaml"))?;
    let nad = example_nad.replace(
        &format!("{RESOURCE_PREFIX}eth1\n"),
        &format!("{RESOURCE}\n"),
    );
    ensure!(nad != example_nad, "nad.yaml changed shape:\n{example_nad}");
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&nad))?;
    run.start_vm(VM, VM_MAC, VM_IP)?;
    let pinger = Pinger::start(peer, VM_IP, PING_EVERY)?;
    ensure!(
        pinger.wait_for(Duration::from_secs(60), |l| l.first_reply().is_some()),
        "the guest of {VM} never answered a ping from the peer"
    );
    let start = Instant::now();
    run.steps.say(format!(
        "{DS} Ready on {tag_a}; {RESOURCE}: 2; {VM}'s guest answers the peer's pings"
    ));

    run.steps
        .step("helm upgrade to another image tag: the DaemonSet rolls out");
    let t = Instant::now();
    helm_release(
        run,
        "upgrade",
        &[
            "--reset-then-reuse-values",
            "--set",
            &format!("image.tag={tag_b}"),
        ],
    )?;
    run.rollout_done()?;
    let image = daemon_image(run)?;
    ensure!(
        image == format!("{IMAGE_REPO}:{tag_b}"),
        "the rolled-out pod runs {image}, not {tag_b}"
    );
    run.wait_allocatable(2)?;
    let sent = none_lost(&pinger, t, "the upgrade to another tag")?;
    run.steps.say(format!(
        "rolled out to {tag_b} in {:.0} s; {RESOURCE}: 2; 0 of {sent} pings lost",
        t.elapsed().as_secs_f64()
    ));

    run.steps
        .step("macvtapResources changed (capacity 2 to 3): applied live, no restart");
    let before = daemon_identity(run)?;
    let t = Instant::now();
    helm_release(
        run,
        "upgrade",
        &["--reset-then-reuse-values", "--set-json", &resources(3)],
    )?;
    run.wait_allocatable(3)?;
    ensure!(
        daemon_identity(run)? == before,
        "the config change restarted the daemon"
    );
    run.steps.say(format!(
        "{RESOURCE}: 3, {:.0} s after helm upgrade (the kubelet's ConfigMap volume sync), the same daemon",
        t.elapsed().as_secs_f64()
    ));

    run.steps
        .step("macvtapResources unset: the ConfigMap kept as it was, the node serves the same");
    let cm_before = configmap(run)?;
    helm_release(
        run,
        "upgrade",
        &[
            "--reset-then-reuse-values",
            "--set-json",
            "macvtapResources=null",
        ],
    )?;
    let manifest = c.helm(&["get", "manifest", HELM_RELEASE, "--namespace", "default"])?;
    ensure!(
        !manifest.contains("kind: ConfigMap"),
        "with macvtapResources unset the release still renders the ConfigMap"
    );
    let cm_after = configmap(run)?;
    ensure!(
        cm_after["metadata"]["resourceVersion"] == cm_before["metadata"]["resourceVersion"],
        "unsetting macvtapResources changed the ConfigMap: {} -> {}",
        cm_before["data"],
        cm_after["data"]
    );
    ensure!(
        cm_after["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep",
        "the kept ConfigMap lacks the keep policy: {}",
        cm_after["metadata"]
    );
    ensure!(
        run.allocatable()? == Some(3) && daemon_identity(run)? == before,
        "unsetting macvtapResources changed what the node serves"
    );
    run.steps.say(format!(
        "the release no longer renders {CM}; it stays untouched (resourceVersion {}), {RESOURCE}: 3",
        cm_after["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("?")
    ));

    run.steps.step(
        "a ConfigMap made by hand: helm upgrade refused on Helm's ownership, then README's adoption recipe",
    );
    // What an operator writes: no mode, another key order and spacing; the
    // same resources as the daemon runs.
    let by_hand = format!(r#"[{{"name": "dataplane", "capacity": 3, "lowerDevice": "{NIC}"}}]"#);
    let made = c.kubectl(&[
        "-n",
        NS,
        "create",
        "configmap",
        CM,
        &format!("--from-literal=DP_MACVTAP_CONF={by_hand}"),
        "--dry-run=client",
        "-o",
        "json",
    ])?;
    c.kubectl_stdin(&["replace", "-f", "-"], Some(&made))?;
    let hand = configmap(run)?;
    ensure!(
        hand["metadata"]["labels"]["app.kubernetes.io/managed-by"].is_null()
            && hand["metadata"]["annotations"]["meta.helm.sh/release-name"].is_null(),
        "the ConfigMap made by hand still carries Helm's marks: {}",
        hand["metadata"]
    );
    let refused = helm_release(
        run,
        "upgrade",
        &["--reset-then-reuse-values", "--set-json", &resources(3)],
    );
    let err = format!(
        "{:#}",
        refused
            .err()
            .context("Helm took over a ConfigMap made by hand")?
    );
    ensure!(
        err.contains("invalid ownership metadata"),
        "Helm refused the ConfigMap made by hand for another reason: {err}"
    );
    readme_adoption(run)?;
    let adopted = configmap(run)?;
    let meta = &adopted["metadata"];
    ensure!(
        meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
            && meta["annotations"]["meta.helm.sh/release-name"] == HELM_RELEASE
            && meta["annotations"]["meta.helm.sh/release-namespace"] == "default"
            && meta["annotations"]["helm.sh/resource-policy"] == "keep",
        "the adopted ConfigMap lacks the release's marks: {meta}"
    );
    ensure!(
        conf(&adopted)? == serde_json::from_str::<Value>(&by_hand)?,
        "the adoption changed the resources: {by_hand} -> {}",
        adopted["data"]
    );
    let values = c.helm(&[
        "get",
        "values",
        HELM_RELEASE,
        "--namespace",
        "default",
        "-o",
        "json",
    ])?;
    let values: Value = serde_json::from_str(&values)?;
    ensure!(
        values["macvtapResources"] == conf(&adopted)?,
        "the release's macvtapResources are not the ConfigMap's: {}",
        values["macvtapResources"]
    );
    ensure!(
        run.allocatable()? == Some(3) && daemon_identity(run)? == before,
        "the adoption changed what the node serves"
    );
    run.steps.say(format!(
        "refused first ({}); after README's recipe the release owns {CM}, its resources as made by hand, {RESOURCE}: 3",
        err.lines()
            .find(|l| l.contains("invalid ownership metadata"))
            .unwrap_or("")
            .trim()
    ));

    run.steps.step(
        "our objects moved to another namespace, the chart's Namespace dropped: both refused, nothing changed",
    );
    let ds_uid = c.get_json(&["-n", NS, "ds", DS])?["metadata"]["uid"].clone();
    let history = |run: &Run| -> Result<usize> {
        let h = run.c.helm(&[
            "history",
            HELM_RELEASE,
            "--namespace",
            "default",
            "-o",
            "json",
        ])?;
        Ok(serde_json::from_str::<Value>(&h)?
            .as_array()
            .map_or(0, Vec::len))
    };
    let revisions = history(run)?;
    let moved = helm_release(
        run,
        "upgrade",
        &[
            "--reset-then-reuse-values",
            "--set",
            "namespace.name=macvtap-moved",
        ],
    );
    let moved = format!(
        "{:#}",
        moved.err().context("helm upgrade moved our objects")?
    );
    ensure!(
        moved.contains("Helm cannot move a release's objects"),
        "the namespace change failed for another reason: {moved}"
    );
    let dropped = helm_release(
        run,
        "upgrade",
        &[
            "--reset-then-reuse-values",
            "--set",
            "namespace.create=false",
        ],
    );
    let dropped = format!(
        "{:#}",
        dropped
            .err()
            .context("helm upgrade dropped the chart's Namespace")?
    );
    ensure!(
        dropped.contains("this release made the Namespace"),
        "dropping namespace.create failed for another reason: {dropped}"
    );
    ensure!(
        c.get_json(&["-n", NS, "ds", DS])?["metadata"]["uid"] == ds_uid
            && daemon_identity(run)? == before
            && history(run)? == revisions,
        "a refused namespace change changed the release or the DaemonSet"
    );
    ensure!(
        c.kubectl(&["get", "namespace", "macvtap-moved", "--ignore-not-found"])?
            .trim()
            .is_empty(),
        "a refused namespace change made the namespace macvtap-moved"
    );
    run.steps.say(
        "both refused by the chart before Helm changed anything: the same DaemonSet, daemon and revisions",
    );

    run.steps
        .step("helm rollback to the install's revision: the first tag and capacity back");
    let t = Instant::now();
    helm_release(run, "rollback", &["1", "--wait", "--timeout", "180s"])?;
    run.rollout_done()?;
    let image = daemon_image(run)?;
    ensure!(
        image == format!("{IMAGE_REPO}:{tag_a}"),
        "after the rollback the pod runs {image}, not {tag_a}"
    );
    run.wait_allocatable(2)?;
    ensure!(
        conf(&configmap(run)?)? == resource_list(2),
        "the rollback did not restore the install's resources"
    );
    let sent = none_lost(&pinger, t, "the rollback")?;
    run.steps.say(format!(
        "rolled back to {tag_a} in {:.0} s; {RESOURCE}: 2; 0 of {sent} pings lost",
        t.elapsed().as_secs_f64()
    ));
    let (sent, lost) = lost_between(&pinger, start, Instant::now())?;
    ensure!(
        lost == 0,
        "the VM lost {lost} of {sent} pings from its first reply to the rollback"
    );
    run.steps.say(format!(
        "from the guest's first reply to the rollback ({:.0} s): 0 of {sent} pings lost",
        start.elapsed().as_secs_f64()
    ));
    drop(pinger);

    run.steps
        .step("helm uninstall, then README's manual clean-up: nothing of ours left");
    run.delete_vm_pods(&[VM])?;
    run.helm_uninstall()?;
    run.wait_allocatable(0)?;
    let deleted = super::manual_leftover_cleanup()?;
    super::assert_uninstalled(c)?;
    run.steps.say(format!(
        "uninstalled (the namespace, with the kept ConfigMap, deleted); README's manual step deleted {deleted:?}; nothing of ours left"
    ));
    Ok(())
}

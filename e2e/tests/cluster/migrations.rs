//! The migrations from the Go project's DaemonSets to ours on the real
//! node (issue 45, item 1), as README's *From kubevirt/macvtap-cni* says,
//! for two ways of installing the Go project: its own
//! `manifests/macvtap.yaml` (`e2e/fixtures/go-macvtap.yaml`, namespace
//! `default`), and what cluster-network-addons-operator (CNAO) renders for
//! `spec.macvtap` (`e2e/fixtures/cnao-macvtap.yaml`, namespace
//! `cluster-network-addons`, with a `devicePluginConfig` naming a ConfigMap
//! of the admin's beside the one CNAO renders).
//!
//! Each runs first with our image in the Go DaemonSet (the image swap):
//! Ready with its init container's `cp` and probes, the resource
//! advertised, a VM pod whose guest answers pings, our daemon saying what
//! it cannot do without `pod-resources` and `doctor` that it cannot check
//! the CNI. Then, with that VM pinged every 200 ms throughout: README's
//! `sh` block run as written (our namespace, the Go ConfigMap's list copied
//! into ours), the Go DaemonSet removed as its owner removes it (upstream's
//! with README's `kubectl delete ds`; CNAO's objects deleted as CNAO's
//! reconcile deletes them when `macvtap` leaves its NetworkAddonsConfig:
//! each object it rendered, with the API's default propagation,
//! `RenderObjsToRemove` in `pkg/network/network.go` and `DeleteOwnedObject`
//! in `pkg/apply/apply.go` of CNAO v0.102.0, since no CNAO runs here), its
//! pod gone, ours applied (`kubectl apply -k` of the base with our image):
//! no ping lost, the same resource and capacity. The running VM's DEL then
//! goes through the CNI ours installed and gives the link back to the
//! host; a new VM starts on ours; ours is uninstalled, README's manual step
//! removes the links kept, and nothing of ours is left.

use super::{
    CAPACITY, CNAO_NS, DS, IMAGE_REPO, NS, RESOURCE, Run, WAIT, assert_uninstalled, lost_between,
    macvtaps_on_nic, manual_leftover_cleanup, repo, start_pinged_vm,
};
use anyhow::{Context, Result, ensure};
use macvtap_e2e::cluster::last_lines;
use macvtap_e2e::sandbox::TestNs;
use serde_json::{Value, json};
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

/// The ConfigMap CNAO's `spec.macvtap.devicePluginConfig` names in the
/// test: the admin's, not the one CNAO renders.
const CNAO_DP_CONFIG: &str = "macvtap-e2e-dataplane";

/// A VM pod: its name, MAC and guest address.
type Vm = (&'static str, &'static str, Ipv4Addr);

/// One way the Go project was installed.
struct Way {
    /// What it is, for the steps and messages.
    what: &'static str,
    /// Its namespace.
    ns: &'static str,
    /// Every object it installed, in the order applied.
    objects: Vec<Value>,
    /// How its owner removes its DaemonSet.
    removal: Removal,
}

/// How the Go DaemonSet is removed.
enum Removal {
    /// README's `kubectl -n "$GO_NS" delete ds macvtap-cni`.
    DeleteDaemonSet,
    /// What CNAO deletes when `macvtap` leaves its NetworkAddonsConfig:
    /// each of these (kind, name) it rendered, in its order.
    AsCnao(Vec<(String, String)>),
}

/// Both migrations; `peer` is the namespace beyond the NIC, `tag` our
/// image's tag (of `IMAGE_REPO`).
pub(super) fn go_daemonsets_to_ours(run: &mut Run, peer: &TestNs, tag: &str) -> Result<()> {
    let image = format!("{IMAGE_REPO}:{tag}");
    let conf = super::resource_list(CAPACITY).to_string();
    // README, "A first VM": the example NAD, on the ConfigMap's resource.
    let example_nad = std::fs::read_to_string(repo().join("manifests/examples/nad.yaml"))?;
    let nad = example_nad.replace(
        "macvtap.network.kubevirt.io/eth1\n",
        &format!("{RESOURCE}\n"),
    );
    ensure!(nad != example_nad, "nad.yaml changed shape:\n{example_nad}");
    run.c.kubectl_stdin(&["apply", "-f", "-"], Some(&nad))?;

    let (cm, ds) = macvtap_e2e::manifests::go_macvtap(&image, &conf)?;
    let upstream = Way {
        what: "the Go project's manifests/macvtap.yaml (namespace default)",
        ns: "default",
        objects: vec![cm, ds],
        removal: Removal::DeleteDaemonSet,
    };
    migrate(
        run,
        peer,
        tag,
        upstream,
        [
            (
                "virt-launcher-vm3",
                "02:00:c6:33:64:a4",
                Ipv4Addr::new(198, 51, 100, 164),
            ),
            (
                "virt-launcher-vm6",
                "02:00:c6:33:64:a7",
                Ipv4Addr::new(198, 51, 100, 167),
            ),
        ],
    )?;
    run.c.kubectl(&[
        "-n",
        "default",
        "delete",
        "configmap",
        "macvtap-deviceplugin-config",
    ])?;

    run.c
        .apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CNAO_NS}}))?;
    let rendered = macvtap_e2e::manifests::cnao_rendering(CNAO_NS, &image, CNAO_DP_CONFIG)?;
    let owned = rendered
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or("?").to_lowercase(),
                o["metadata"]["name"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect();
    let admins = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CNAO_DP_CONFIG, "namespace": CNAO_NS},
        "data": {"DP_MACVTAP_CONF": conf}
    });
    let mut objects = vec![admins];
    objects.extend(rendered);
    let cnao = Way {
        what: "cluster-network-addons-operator's rendering (namespace cluster-network-addons)",
        ns: CNAO_NS,
        objects,
        removal: Removal::AsCnao(owned),
    };
    migrate(
        run,
        peer,
        tag,
        cnao,
        [
            (
                "virt-launcher-vm4",
                "02:00:c6:33:64:a5",
                Ipv4Addr::new(198, 51, 100, 165),
            ),
            (
                "virt-launcher-vm7",
                "02:00:c6:33:64:a8",
                Ipv4Addr::new(198, 51, 100, 168),
            ),
        ],
    )?;
    // README: the admin's ConfigMap is theirs to delete once ours runs.
    run.c.kubectl(&[
        "delete",
        "namespace",
        CNAO_NS,
        "--wait=true",
        "--timeout=180s",
    ])?;
    run.c.kubectl_stdin(&["delete", "-f", "-"], Some(&nad))?;
    Ok(())
}

/// One migration: `way` with our image and VM `vms[0]` on it, then ours in
/// its place with that VM pinging, then `vms[1]` on ours, then ours
/// uninstalled.
fn migrate(run: &mut Run, peer: &TestNs, tag: &str, way: Way, vms: [Vm; 2]) -> Result<()> {
    let c = run.c;
    let Way {
        what,
        ns,
        objects,
        removal,
    } = way;
    run.steps.step(&format!("{what} with our image"));
    for o in &objects {
        c.apply(o)?;
    }
    c.wait(&format!("{what}: the DaemonSet Ready"), WAIT, || {
        run.ds_ready_in(ns)
    })?;
    run.wait_allocatable(CAPACITY)?;
    let pods = c.get_json(&["-n", ns, "pods", "-l", "name=macvtap-cni"])?;
    let pod = &pods["items"][0];
    let status = &pod["status"]["containerStatuses"][0];
    run.steps.say(format!(
        "{}: ready {}, restarts {}, image {}; allocatable {RESOURCE}: {CAPACITY}",
        pod["metadata"]["name"].as_str().unwrap_or("?"),
        status["ready"],
        status["restartCount"],
        status["image"].as_str().unwrap_or("?"),
    ));
    let (name, _, _) = vms[0];
    let pinger = start_pinged_vm(run, peer, vms[0]).with_context(|| what.to_string())?;
    run.steps.say(format!(
        "the guest of {name} answers pings through our macvtap"
    ));
    degraded_mode_said(run, what, ns)?;

    run.steps.step(&format!(
        "{what} replaced by ours as README says, {name} pinging"
    ));
    let from = Instant::now();
    readme_copies_the_config(run)?;
    let ours = c.get_json(&["-n", NS, "configmap", "macvtap-deviceplugin-config"])?;
    let copied = ours["data"]["DP_MACVTAP_CONF"].as_str().unwrap_or("");
    let theirs = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["data"]["DP_MACVTAP_CONF"] != "[]")
        .and_then(|o| o["data"]["DP_MACVTAP_CONF"].as_str())
        .context("the Go install has no ConfigMap of resources")?;
    ensure!(
        copied == theirs,
        "README's block copied {copied:?} into ours; the Go DaemonSet read {theirs:?}"
    );
    match &removal {
        Removal::DeleteDaemonSet => {
            c.kubectl(&["-n", ns, "delete", "ds", DS])?;
        }
        Removal::AsCnao(owned) => {
            for (kind, name) in owned {
                c.kubectl(&["-n", ns, "delete", kind, name])?;
            }
        }
    }
    // README: wait for its pod to be gone before ours registers the same
    // resource.
    c.kubectl(&[
        "-n",
        ns,
        "wait",
        "--for=delete",
        "pod",
        "-l",
        "name=macvtap-cni",
        "--timeout=120s",
    ])?;
    let kdir = tempfile::tempdir()?;
    our_kustomization(kdir.path(), tag)?;
    c.kubectl(&["apply", "-k", &kdir.path().to_string_lossy()])?;
    run.wait_ds_ready()?;
    run.wait_allocatable(CAPACITY)?;
    let ours_pod = run.daemon_pod()?;
    let to = Instant::now();
    let (sent, lost) = lost_between(&pinger, from, to)?;
    pinger.stop(Duration::from_secs(2))?;
    ensure!(
        sent > 0 && lost == 0,
        "{name}'s guest lost {lost} of {sent} pings while {what} was replaced by ours"
    );
    run.steps.say(format!(
        "README's block copied the list into ours; {what} removed; ours ({}) Ready, allocatable {RESOURCE}: {CAPACITY}; {name}'s guest answered all {sent} pings sent meanwhile",
        ours_pod["metadata"]["name"].as_str().unwrap_or("?")
    ));

    run.steps
        .step(&format!("{name} deleted through our CNI; a new VM on ours"));
    let before = macvtaps_on_nic()?;
    run.delete_vm_pods(&[name])?;
    c.wait(&format!("{name}'s DEL giving its link back"), WAIT, || {
        Ok((macvtaps_on_nic()?.len() == before.len() + 1).then_some(()))
    })?;
    let (name, _, _) = vms[1];
    start_pinged_vm(run, peer, vms[1])
        .context("a VM started on ours")?
        .stop(Duration::from_secs(2))?;
    run.delete_vm_pods(&[name])?;
    run.steps.say(format!(
        "the old VM's link came back to the host at its DEL; {name} started on ours and its guest answered pings"
    ));

    run.steps.step("ours uninstalled, README's manual step");
    run.delete_kustomization(kdir.path())?;
    run.wait_allocatable(0)?;
    let kept = manual_leftover_cleanup()?;
    assert_uninstalled(c)?;
    run.steps.say(format!(
        "uninstalled; the links handed out within the grace {kept:?} removed by README's manual step; nothing of ours left"
    ));
    Ok(())
}

/// Our daemon in the Go DaemonSet of namespace `ns` says what it cannot do
/// without `pod-resources`, and `doctor` there says it cannot check the
/// CNI (the CNI bin dir is mounted in the init container only) instead of
/// calling it missing.
fn degraded_mode_said(run: &Run, what: &str, ns: &str) -> Result<()> {
    let c = run.c;
    let logs = c.kubectl(&[
        "-n",
        ns,
        "logs",
        &format!("ds/{DS}"),
        "-c",
        "macvtap-cni",
        "--tail=-1",
    ])?;
    ensure!(
        logs.contains("pod-resources"),
        "{what}: our daemon did not say what it cannot do without pod-resources:\n{}",
        last_lines(&logs, 30)
    );
    let out = c.kubectl_output(
        &[
            "-n",
            ns,
            "exec",
            &format!("ds/{DS}"),
            "-c",
            "macvtap-cni",
            "--",
            "/macvtap-deviceplugin",
            "doctor",
        ],
        None,
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        text.contains("the installed CNI is not checked") && !text.contains("no CNI binary at"),
        "{what}: doctor in the Go DaemonSet's container:\n{text}"
    );
    Ok(())
}

/// README's block that finds the Go DaemonSet and its ConfigMap, makes our
/// namespace and copies the list into our ConfigMap: taken from README
/// itself and run with bash from the repository, `kubectl` on the `PATH`
/// with the cluster's kubeconfig.
fn readme_copies_the_config(run: &Run) -> Result<()> {
    let script = super::readme_sh_block("### From kubevirt/macvtap-cni")?;
    ensure!(
        script.contains("create configmap") && script.contains("GO_CM="),
        "README's migration block changed shape:\n{script}"
    );
    super::run_readme_sh(Some(run.c), &script, "README's migration block")
}

/// Our install as README's step 2 gives it: `kubectl apply -k` of the base,
/// here through a kustomization in `dir` that only sets our image `tag`.
fn our_kustomization(dir: &Path, tag: &str) -> Result<()> {
    macvtap_e2e::cluster::realnode::write_kustomization(dir, tag, &[], None)
}

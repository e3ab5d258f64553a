//! Ours moved to another namespace and back as a GitOps tool moves it, on
//! the real node, with a VM pinged throughout: each time the install in
//! the new namespace is applied while the old one still runs, then the old
//! one is pruned (README, *Uninstall*). The first move prunes by deleting
//! the old namespace (its controller may stop our pod before it deletes
//! our DaemonSet: the daemon then takes the exit for a rollout and leaves
//! everything); the second deletes the old install's objects, DaemonSet
//! first, then its namespace (the daemon takes it for an uninstall and
//! keeps what the running VM holds: its link and the CNI files).
//!
//! Each time, our DaemonSet's metrics port on the host's network makes
//! the scheduler hold the new pod Pending while the old pod runs, so
//! nothing of the new install reaches the node before the old daemon has
//! exited; then the new one serves the same resource, the running VM
//! loses no ping, and at the end a new VM starts on ours and, after the
//! uninstall, nothing of ours is left. Without that port (the chart's
//! `metrics.enabled=false`) the two run at once; what the old one's
//! uninstall then leaves to the new install is tested in
//! `device-plugin/src/core/cleanup.rs`.

use super::{
    CAPACITY, NS, RESOURCE, Run, WAIT, assert_uninstalled, cni_files, lost_between,
    manual_leftover_cleanup, repo, resource_list, start_pinged_vm,
};
use anyhow::{Context, Result, ensure};
use macvtap_e2e::cluster::last_lines;
use macvtap_e2e::cluster::realnode::{self, DAEMON, DS};
use macvtap_e2e::sandbox::TestNs;
use serde_json::json;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

/// The namespace ours moves to, and from.
pub(super) const MOVED: &str = "macvtap-moved";

/// How a move removes the old install.
#[derive(Clone, Copy)]
enum Prune {
    /// `kubectl delete namespace`, and nothing else.
    Namespace,
    /// The old install's namespaced objects, DaemonSet first, then its
    /// namespace; the cluster-wide ones are the new install's too.
    ObjectsThenNamespace,
}

/// Ours installed in [`NS`] with a VM pinging, moved to [`MOVED`] and
/// back; `peer` is the namespace beyond the NIC, `tag` our image's tag (of
/// `IMAGE_REPO`).
pub(super) fn moved_as_gitops_moves_it(run: &mut Run, peer: &TestNs, tag: &str) -> Result<()> {
    let c = run.c;
    run.steps.step(&format!("ours in {NS}, a VM pinging"));
    let example_nad = std::fs::read_to_string(repo().join("manifests/examples/nad.yaml"))?;
    let nad = example_nad.replace(
        "macvtap.network.kubevirt.io/eth1\n",
        &format!("{RESOURCE}\n"),
    );
    ensure!(nad != example_nad, "nad.yaml changed shape:\n{example_nad}");
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&nad))?;
    let home = tempfile::tempdir()?;
    kustomization(home.path(), tag, None)?;
    install(run, NS, home.path())?;
    run.wait_ds_ready()?;
    run.wait_allocatable(CAPACITY)?;
    let name = "virt-launcher-vm8";
    let pinger = start_pinged_vm(
        run,
        peer,
        (name, "02:00:c6:33:64:a9", Ipv4Addr::new(198, 51, 100, 169)),
    )?;
    run.steps.say(format!(
        "the guest of {name} answers pings through our macvtap"
    ));

    let moved = tempfile::tempdir()?;
    kustomization(moved.path(), tag, Some(MOVED))?;
    let from = Instant::now();
    move_to(run, (NS, MOVED), moved.path(), Prune::Namespace)?;
    move_to(run, (MOVED, NS), home.path(), Prune::ObjectsThenNamespace)?;
    let (sent, lost) = lost_between(&pinger, from, Instant::now())?;
    pinger.stop(Duration::from_secs(2))?;
    ensure!(
        sent > 0 && lost == 0,
        "{name}'s guest lost {lost} of {sent} pings while ours moved to {MOVED} and back"
    );
    run.steps.say(format!(
        "{name}'s guest answered all {sent} pings sent during both moves"
    ));

    run.steps
        .step("a new VM on ours after the moves, then ours uninstalled");
    let name2 = "virt-launcher-vm9";
    start_pinged_vm(
        run,
        peer,
        (name2, "02:00:c6:33:64:aa", Ipv4Addr::new(198, 51, 100, 170)),
    )
    .context("a VM started on ours after the moves")?
    .stop(Duration::from_secs(2))?;
    run.delete_vm_pods(&[name, name2])?;
    run.delete_kustomization(home.path())?;
    run.wait_allocatable(0)?;
    let links = manual_leftover_cleanup()?;
    assert_uninstalled(c)?;
    c.kubectl_stdin(&["delete", "-f", "-"], Some(&nad))?;
    run.steps.say(format!(
        "{name2}'s guest answered pings; uninstalled, the links handed out within the grace {links:?} removed by README's manual step; nothing of ours left"
    ));
    Ok(())
}

/// One move of ours from namespace `ns.0` to `ns.1` (the kustomization in
/// `kdir`), the old install removed by `prune`, while a VM holds one of
/// our devices.
fn move_to(run: &mut Run, ns: (&str, &str), kdir: &Path, prune: Prune) -> Result<()> {
    let c = run.c;
    let (old_ns, new_ns) = ns;
    let how = match prune {
        Prune::Namespace => format!("{old_ns} deleted"),
        Prune::ObjectsThenNamespace => format!("{old_ns}'s objects deleted, then {old_ns}"),
    };
    run.steps.step(&format!(
        "moved from {old_ns} to {new_ns} in one sync: {new_ns} applied, then {how}"
    ));
    let old_pod = pod_name(run, old_ns)?;
    let installed = cni_files()?;
    install(run, new_ns, kdir)?;
    // The fence: the DaemonSet declares its metrics port on the host's
    // network, so the scheduler holds the new pod while the old one runs.
    let (new_pod, why) = c.wait(
        &format!("the pod of {new_ns} held Pending by the scheduler"),
        WAIT,
        || {
            let pods = c.get_json(&["-n", new_ns, "pods", "-l", "name=macvtap-cni"])?;
            Ok(pods["items"].as_array().and_then(|items| {
                items.iter().find_map(|p| {
                    let held = p["status"]["conditions"].as_array()?.iter().find(|c| {
                        c["type"] == "PodScheduled"
                            && c["status"] == "False"
                            && c["message"]
                                .as_str()
                                .is_some_and(|m| m.contains("free ports"))
                    })?;
                    Some((
                        p["metadata"]["name"].as_str()?.to_string(),
                        held["message"].as_str()?.to_string(),
                    ))
                })
            }))
        },
    )?;
    ensure!(
        cni_files()? == installed,
        "nothing of the install in {new_ns} should have reached the node yet"
    );
    run.steps.say(format!("{new_pod} Pending: {why}"));
    let followed = c.follow_logs(
        &format!("the daemon pod {old_pod}"),
        &["-n", old_ns, &old_pod, "-c", DAEMON],
    )?;
    if let Prune::ObjectsThenNamespace = prune {
        c.kubectl(&[
            "-n",
            old_ns,
            "delete",
            &format!("daemonset/{DS}"),
            "serviceaccount/macvtap-cni",
            "role/macvtap-cni-owner",
            "rolebinding/macvtap-cni-owner",
            "configmap/macvtap-deviceplugin-config",
            "--wait=false",
        ])?;
    }
    c.kubectl(&["delete", "namespace", old_ns, "--wait=false"])?;
    let log = c.log_to_end(followed, WAIT)?;
    let exit = log
        .lines()
        .find(|l| l.contains("uninstall: kept on this node") || l.contains("not an uninstall"))
        .with_context(|| {
            format!(
                "{old_pod} should say how it took its exit; its log ends:\n{}",
                last_lines(&log, 20)
            )
        })?;
    let as_uninstall = exit.contains("uninstall: kept on this node");
    match prune {
        Prune::ObjectsThenNamespace => ensure!(
            as_uninstall && exit.contains("pods hold 1 of our devices"),
            "{old_pod} should take the DaemonSet's deletion for an uninstall and keep the CNI files for the running VM: {exit}"
        ),
        // Which the namespace's controller stops first, the pod or the
        // DaemonSet, is its own order: either way nothing in use goes.
        Prune::Namespace => ensure!(
            !as_uninstall || exit.contains("pods hold 1 of our devices"),
            "{old_pod} should keep the CNI files for the running VM: {exit}"
        ),
    }
    c.wait(&format!("namespace {old_ns} gone"), WAIT, || {
        let out = c.kubectl(&["get", "namespace", old_ns, "--ignore-not-found"])?;
        Ok(out.trim().is_empty().then_some(()))
    })?;
    ensure!(
        cni_files()? == installed,
        "the CNI files should be as installed after {old_pod} exited"
    );
    c.wait(&format!("our DaemonSet in {new_ns} Ready"), WAIT, || {
        run.ds_ready_in(new_ns)
    })?;
    run.wait_allocatable(CAPACITY)?;
    run.steps.say(format!(
        "{old_pod} exited ({}); {new_pod} scheduled once it was gone, Ready, allocatable {RESOURCE}: {CAPACITY}",
        if as_uninstall {
            "an uninstall, which kept what the VM holds"
        } else {
            "not an uninstall: its pod went before its DaemonSet"
        }
    ));
    Ok(())
}

/// The name of our DaemonSet's one live pod in `ns`.
fn pod_name(run: &Run, ns: &str) -> Result<String> {
    let pods = run
        .c
        .get_json(&["-n", ns, "pods", "-l", "name=macvtap-cni"])?;
    let live: Vec<String> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    ensure!(
        live.len() == 1,
        "{} live pods of ours in {ns}, not 1",
        live.len()
    );
    Ok(live[0].clone())
}

/// Our install in `ns` as README's migration makes it: the namespace and
/// the ConfigMap first, then `kubectl apply -k` of the kustomization in
/// `kdir`.
fn install(run: &Run, ns: &str, kdir: &Path) -> Result<()> {
    let c = run.c;
    c.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))?;
    c.apply(&json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "macvtap-deviceplugin-config", "namespace": ns},
        "data": {"DP_MACVTAP_CONF": resource_list(CAPACITY).to_string()}
    }))?;
    c.kubectl(&["apply", "-k", &kdir.to_string_lossy()])?;
    Ok(())
}

/// A kustomization of the base in `kdir` with our image `tag`
/// ([`realnode::write_kustomization`]), in the namespace `ns` when given
/// (kustomize's `namespace`, which also renames our Namespace object and
/// the bindings' subjects).
fn kustomization(kdir: &Path, tag: &str, ns: Option<&str>) -> Result<()> {
    realnode::write_kustomization(kdir, tag, &[], None)?;
    if let Some(ns) = ns {
        let file = kdir.join("kustomization.yaml");
        let text = std::fs::read_to_string(&file)?;
        std::fs::write(&file, format!("{text}namespace: {ns}\n"))?;
    }
    Ok(())
}

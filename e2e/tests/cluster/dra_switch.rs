//! A node switched from the device plugin front to DRA with a VM pod
//! running (issue 47, point 4), on the real node: our DaemonSet as the
//! base (the device plugin) with a resource of two devices and a VM pod
//! holding one of them, pinged throughout; the same kustomization with
//! `components/dra` applied over it (a rollout, not an uninstall). The DRA
//! front leaves the device the running pod holds out of its slice (it
//! knows from PodResources). The kubelet keeps the device plugin's name in
//! the node's allocatable, at 0 once the plugin is gone (kubernetes
//! `pkg/kubelet/nodestatus/setters.go`: a removed device plugin resource
//! is set to 0, never removed), and the scheduler serves a name through
//! DRA on a node whose allocatable of it is 0 or absent
//! (`pkg/scheduler/framework/plugins/noderesources/fit.go`,
//! `shouldDelegateResourceToDRA`): a new VM pod under the same resource
//! name is served through DRA. Then back: the DRA pod deleted (its claim
//! unprepared by the DRA front; a claim left prepared would keep its pod
//! Terminating once the driver is gone, kubernetes
//! `pkg/kubelet/kubelet.go` `SyncTerminatedPod`), the base applied again,
//! and a new VM pod served through the device plugin. The first VM pod
//! runs throughout and loses no ping. The uninstall leaves nothing.

use super::dra::{NAME, cdi_specs, examples, install, slices};
use super::{PING_EVERY, RESOURCE_PREFIX};
use super::{Run, WAIT, guest_answers, lost_between, macvtaps_on_nic};
use anyhow::{Context, Result, ensure};
use macvtap_e2e::icmp::Pinger;
use macvtap_e2e::sandbox::TestNs;
use serde_json::Value;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// The device IDs our slice offers.
fn offered_ids(run: &Run) -> Result<Vec<String>> {
    let mut ids: Vec<String> = slices(run.c)?
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter_map(|d: Value| {
            d["attributes"]["k8s.cni.cncf.io/deviceID"]["string"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    ids.sort();
    Ok(ids)
}

/// The scenario; `peer` is the namespace beyond the NIC, `tag` our image's
/// tag.
pub(super) fn from_the_device_plugin(run: &mut Run, peer: &TestNs, tag: &str) -> Result<()> {
    let c = run.c;
    let resource = format!("{RESOURCE_PREFIX}{NAME}");

    run.steps.step(
        "switching fronts: the device plugin with a resource of two devices, a VM pod holding one",
    );
    let kdir = tempfile::tempdir()?;
    let (class, nad) = examples()?;
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&class))?;
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&nad))?;
    install(run.c, tag, kdir.path(), false, 2)?;
    run.wait_allocatable_of(&resource, 2)?;
    let vm11 = (
        "virt-launcher-vm11",
        "02:00:c6:33:64:ac",
        Ipv4Addr::new(198, 51, 100, 172),
    );
    run.start_vm_on(&resource, vm11.0, vm11.1, vm11.2)?;
    let pod = c.get_json(&["-n", "default", "pod", vm11.0])?;
    ensure!(
        pod["status"]["extendedResourceClaimStatus"].is_null(),
        "{} got a DRA claim while the device plugin serves the name",
        vm11.0
    );
    let pinger = Pinger::start(peer, vm11.2, PING_EVERY)?;
    ensure!(
        pinger.wait_for(Duration::from_secs(60), |l| l.first_reply().is_some()),
        "the guest of {} never answered",
        vm11.0
    );
    let t0 = Instant::now();

    run.steps
        .step("components/dra applied over it: the held device left out of the slice");
    install(run.c, tag, kdir.path(), true, 2)?;
    let offered = c.wait("our slice offering one device", WAIT, || {
        let ids = offered_ids(run)?;
        Ok((ids.len() == 1).then_some(ids))
    })?;
    run.steps.say(format!(
        "the DRA front offers {offered:?}: the other device is {}'s, handed out by the device plugin",
        vm11.0
    ));
    let left = c.wait(
        &format!("{resource} at 0 in the node's allocatable (the device plugin gone)"),
        WAIT,
        || {
            let n = run.allocatable_of(&resource)?;
            Ok(n.is_none_or(|n| n == 0).then_some(n))
        },
    )?;
    run.steps.say(format!(
        "the node's allocatable of {resource}: {left:?} (the kubelet keeps a device plugin's name at 0)"
    ));

    run.steps
        .step("a new VM pod under the same name, served through DRA, beside the running one");
    let vm12 = (
        "virt-launcher-vm12",
        "02:00:c6:33:64:ad",
        Ipv4Addr::new(198, 51, 100, 173),
    );
    run.start_vm_on(&resource, vm12.0, vm12.1, vm12.2)?;
    guest_answers(peer, vm12.0, vm12.2)?;
    let pod = c.get_json(&["-n", "default", "pod", vm12.0])?;
    let claim = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        .as_str()
        .context("the new VM pod has no extended resource claim: DRA did not serve it")?
        .to_string();
    let (sent, lost) = lost_between(&pinger, t0, Instant::now())?;
    ensure!(
        sent > 0 && lost == 0,
        "{} lost {lost} of {sent} pings over the switch",
        vm11.0
    );
    run.steps.say(format!(
        "{} started on {offered:?} (claim {claim}); {} lost 0 of {sent} pings over the switch",
        vm12.0, vm11.0
    ));

    run.steps.step(
        "back to the device plugin (the DRA pod deleted first), the first VM pod still running",
    );
    run.delete_vm_pods(&[vm12.0])?;
    c.wait(&format!("{}'s claim unprepared", vm12.0), WAIT, || {
        Ok(cdi_specs()?.is_empty().then_some(()))
    })?;
    install(run.c, tag, kdir.path(), false, 2)?;
    run.wait_allocatable_of(&resource, 2)?;
    c.wait(
        "our ResourceSlices gone (the kubelet's, once the driver left)",
        WAIT,
        || Ok(slices(run.c)?.is_empty().then_some(())),
    )?;
    let vm13 = (
        "virt-launcher-vm13",
        "02:00:c6:33:64:ae",
        Ipv4Addr::new(198, 51, 100, 174),
    );
    run.start_vm_on(&resource, vm13.0, vm13.1, vm13.2)?;
    guest_answers(peer, vm13.0, vm13.2)?;
    let pod = c.get_json(&["-n", "default", "pod", vm13.0])?;
    ensure!(
        pod["status"]["extendedResourceClaimStatus"].is_null(),
        "{} got a DRA claim after the switch back",
        vm13.0
    );
    let (sent, lost) = lost_between(&pinger, t0, Instant::now())?;
    ensure!(
        sent > 0 && lost == 0,
        "{} lost {lost} of {sent} pings over the two switches",
        vm11.0
    );
    run.steps.say(format!(
        "{} started through the device plugin again; {} lost 0 of {sent} pings over both switches",
        vm13.0, vm11.0
    ));
    drop(pinger);
    run.delete_vm_pods(&[vm11.0, vm13.0])?;
    c.wait("no macvtap left", WAIT, || {
        Ok(macvtaps_on_nic()?.is_empty().then_some(()))
    })?;
    c.kubectl_stdin(&["delete", "-f", "-", "--ignore-not-found"], Some(&class))?;
    c.kubectl_stdin(&["delete", "-f", "-", "--ignore-not-found"], Some(&nad))?;
    run.delete_kustomization(kdir.path())?;
    run.steps.say("uninstalled: nothing left");
    Ok(())
}

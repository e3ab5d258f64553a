//! A node switched from the device plugin front to DRA with a VM pod
//! running (issue 47, point 4), on the real node: our DaemonSet as the
//! base (the device plugin) with a resource of two devices and a VM pod
//! holding one of them, pinged throughout; the same kustomization with
//! `components/dra` applied over it (a rollout, not an uninstall). The DRA
//! front leaves the device the running pod holds out of its slice (it
//! knows from PodResources); the kubelet keeps the device plugin's name in
//! the node's allocatable for its endpoint's stop grace (5 minutes,
//! kubernetes `pkg/kubelet/cm/devicemanager/types.go`,
//! `endpointStopGracePeriod`), and once it is gone a new VM pod under the
//! same resource name is served through DRA. The running VM loses no
//! ping; once it is deleted its device is offered again. The uninstall
//! leaves nothing.

use super::dra::{NAME, cdi_specs, examples, install, slices};
use super::{PING_EVERY, RESOURCE_PREFIX};
use super::{Run, WAIT, guest_answers, lost_between, macvtaps_on_nic};
use anyhow::{Context, Result, ensure};
use macvtap_e2e::icmp::Pinger;
use macvtap_e2e::sandbox::TestNs;
use serde_json::Value;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// How long the kubelet may keep the device plugin's name in the node's
/// allocatable after the plugin went: its 5 minutes' grace, and a node
/// status update after it.
const PLUGIN_GRACE: Duration = Duration::from_secs(7 * 60);

/// The device IDs our slice offers.
fn offered_ids(run: &Run) -> Result<Vec<String>> {
    let mut ids: Vec<String> = slices(run)?
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
    install(run, tag, kdir.path(), false, 2)?;
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
    install(run, tag, kdir.path(), true, 2)?;
    let offered = c.wait("our slice offering one device", WAIT, || {
        let ids = offered_ids(run)?;
        Ok((ids.len() == 1).then_some(ids))
    })?;
    run.steps.say(format!(
        "the DRA front offers {offered:?}: the other device is {}'s, handed out by the device plugin",
        vm11.0
    ));
    let waited = Instant::now();
    c.wait(
        &format!("{resource} gone from the node's allocatable (the kubelet's grace for a plugin that left)"),
        PLUGIN_GRACE,
        || Ok(run.allocatable_of(&resource)?.is_none().then_some(())),
    )?;
    run.steps.say(format!(
        "the kubelet dropped {resource} from the node's allocatable after {} s",
        waited.elapsed().as_secs()
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

    run.steps
        .step("the device plugin's VM pod deleted: its device offered again");
    drop(pinger);
    run.delete_vm_pods(&[vm11.0])?;
    c.wait("our slice offering both devices again", WAIT, || {
        Ok((offered_ids(run)?.len() == 2).then_some(()))
    })?;
    run.delete_vm_pods(&[vm12.0])?;
    c.wait("the claims unprepared and no macvtap left", WAIT, || {
        Ok((cdi_specs()?.is_empty() && macvtaps_on_nic()?.is_empty()).then_some(()))
    })?;
    c.kubectl_stdin(&["delete", "-f", "-", "--ignore-not-found"], Some(&class))?;
    c.kubectl_stdin(&["delete", "-f", "-", "--ignore-not-found"], Some(&nad))?;
    c.kubectl(&[
        "delete",
        "-k",
        &kdir.path().to_string_lossy(),
        "--wait=true",
        "--timeout=180s",
    ])?;
    c.wait("our ResourceSlices gone", WAIT, || {
        Ok(slices(run)?.is_empty().then_some(()))
    })?;
    run.steps
        .say("both devices back in the slice, then uninstalled: nothing left");
    Ok(())
}

//! DRA mode on the real node (issue 47): our DaemonSet with
//! `manifests/components/dra`, a ConfigMap naming a resource the device
//! plugin never served here, the example DeviceClass for it, and VM pods
//! in KubeVirt's shape that request the resource by its extended name. The
//! real scheduler serves the request from our ResourceSlice (KEP-5004), the
//! real kubelet prepares the claim through our DRA socket, containerd
//! gives the container `/dev/tapN` from our CDI spec, the released Multus
//! calls our CNI without a `deviceID`, and the guest answers the peer's
//! pings. A second pod over the capacity of one waits Pending with the
//! scheduler's reason, and starts on the same device once the first is
//! deleted (unprepared: its CDI spec gone; its link deleted by the
//! unprepare, or by the reclaimer when the DEL gave it back after the
//! unprepare). With that pod running, `dra_faults.rs` kills the daemon and
//! the kubelet during prepares and takes the NIC down. An uninstall leaves
//! no slice, spec or link. Then `dra_switch.rs` switches a node with a VM
//! pod running from the device plugin front to DRA.

use super::{RESOURCE_PREFIX, Run, WAIT, guest_answers, macvtaps_on_nic};
use anyhow::{Context, Result, ensure};
use macvtap_e2e::cluster::realnode::DRIVER;
pub(super) use macvtap_e2e::cluster::realnode::{
    CDI_DIR, NAME, cdi_specs, examples, install, slices,
};
use macvtap_e2e::sandbox::TestNs;
use std::net::Ipv4Addr;
use std::path::Path;

/// Waits until the scheduler found pod `name` of namespace `default`
/// unschedulable, and returns its message.
pub(super) fn wait_unschedulable(run: &Run, name: &str) -> Result<String> {
    let c = run.c;
    c.wait(&format!("{name} unschedulable"), WAIT, || {
        let p = c.get_json(&["-n", "default", "pod", name])?;
        Ok(p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "PodScheduled" && c["reason"] == "Unschedulable")
            .map(|c| c["message"].as_str().unwrap_or("").to_string()))
    })
}

/// The scenario; `peer` is the namespace beyond the NIC, `tag` our
/// image's tag (of `IMAGE_REPO`).
pub(super) fn dra_mode(run: &mut Run, peer: &TestNs, tag: &str) -> Result<()> {
    let c = run.c;
    let resource = format!("{RESOURCE_PREFIX}{NAME}");

    run.steps
        .step("DRA mode: the base with components/dra, a ConfigMap of one device");
    let kdir = tempfile::tempdir()?;
    install(run.c, tag, kdir.path(), true, 1)?;
    let registry =
        Path::new("/var/lib/kubelet/plugins_registry").join(format!("{DRIVER}-reg.sock"));
    c.wait("our registration socket", WAIT, || {
        Ok(registry.exists().then_some(()))
    })?;
    let published = c.wait("our ResourceSlice with the resource's device", WAIT, || {
        let s = slices(run.c)?;
        let names: Vec<String> = s
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .filter_map(|d| d["name"].as_str().map(str::to_string))
            .collect();
        Ok((names == [format!("{NAME}-mvp-0")]).then_some(s))
    })?;
    let device = &published[0]["spec"]["devices"][0];
    ensure!(
        device["attributes"]["k8s.cni.cncf.io/resourceName"]["string"] == resource.as_str()
            && device["attributes"]["k8s.cni.cncf.io/deviceID"]["string"]
                == format!("{NAME}Mvp0").as_str(),
        "the device's attributes: {device}"
    );
    ensure!(
        published[0]["spec"]["nodeName"] == super::NODE
            && published[0]["spec"]["pool"]["name"] == super::NODE,
        "the slice's node and pool: {}",
        published[0]["spec"]
    );
    ensure!(
        run.allocatable_of(&resource)?.is_none_or(|n| n == 0),
        "the node's allocatable lists {resource}: the device plugin serves it too"
    );
    run.steps.say(format!(
        "slice {} published: device {NAME}-mvp-0 with deviceID {NAME}Mvp0; {resource} not in the node's allocatable",
        published[0]["metadata"]["name"]
    ));

    run.steps
        .step("the example DeviceClass and NAD for the resource");
    let (class, nad) = examples()?;
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&class))?;
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&nad))?;

    run.steps
        .step("a VM pod on the resource: scheduled through the DeviceClass, prepared, pinging");
    let vm6 = (
        "virt-launcher-vm6",
        "02:00:c6:33:64:a7",
        Ipv4Addr::new(198, 51, 100, 167),
    );
    run.start_vm_on(&resource, vm6.0, vm6.1, vm6.2)?;
    guest_answers(peer, vm6.0, vm6.2)?;
    let pod = c.get_json(&["-n", "default", "pod", vm6.0])?;
    let claim = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        .as_str()
        .context("the VM pod has no extended resource claim: the device plugin served it")?
        .to_string();
    let specs = cdi_specs()?;
    ensure!(specs.len() == 1, "CDI specs on the node: {specs:?}");
    run.steps.say(format!(
        "{}: claim {claim}, CDI spec {}, tap {}, guest answers",
        vm6.0,
        specs[0],
        run.vm_tap_node(vm6.0)?
    ));

    run.steps
        .step("a second VM pod over the capacity: Pending until the first is deleted");
    let vm7 = (
        "virt-launcher-vm7",
        "02:00:c6:33:64:a8",
        Ipv4Addr::new(198, 51, 100, 168),
    );
    run.apply_vm_pod(&resource, vm7.0, vm7.1, vm7.2)?;
    let why = wait_unschedulable(run, vm7.0)?;
    run.steps.say(format!("{} Pending: {why}", vm7.0));
    run.delete_vm_pods(&[vm6.0])?;
    run.wait_vm_serving(vm7.0)?;
    guest_answers(peer, vm7.0, vm7.2)?;
    let now = cdi_specs()?;
    ensure!(
        now.len() == 1 && now != specs,
        "after vm6's unprepare and vm7's prepare the CDI specs are {now:?} (before: {specs:?})"
    );
    run.steps.say(format!(
        "{} started on the device vm6 gave back; CDI specs now {now:?}",
        vm7.0
    ));

    super::dra_faults::killed_during_prepare(run, peer, &resource, (vm7.0, vm7.2))?;
    super::dra_faults::nic_down(run, peer, &resource, (vm7.0, vm7.2))?;

    run.steps
        .step("vm7 deleted, then uninstall: no slice, spec or link left");
    run.delete_vm_pods(&[vm7.0])?;
    // The kubelet may unprepare a claim before the sandbox's DEL has given
    // its link back (its DRA manager unprepares the claims of pods that
    // are no longer running; seen here when a DEL failed and was retried):
    // such a link is no longer held, and the reclaimer removes it after
    // the grace (30 s here).
    c.wait("vm7's claim unprepared and its link gone", WAIT, || {
        Ok((cdi_specs()?.is_empty() && macvtaps_on_nic()?.is_empty()).then_some(()))
    })?;
    c.kubectl_stdin(&["delete", "-f", "-", "--ignore-not-found"], Some(&class))?;
    c.kubectl_stdin(&["delete", "-f", "-", "--ignore-not-found"], Some(&nad))?;
    run.delete_kustomization(kdir.path())?;
    c.wait("our ResourceSlices gone", WAIT, || {
        Ok(slices(run.c)?.is_empty().then_some(()))
    })?;
    c.wait("no macvtap of ours on the NIC", WAIT, || {
        Ok(macvtaps_on_nic()?.is_empty().then_some(()))
    })?;
    ensure!(
        !registry.exists(),
        "the uninstall left the registration socket {}",
        registry.display()
    );
    run.steps
        .say("no ResourceSlice, CDI spec, socket or macvtap of ours left");
    super::dra_switch::from_the_device_plugin(run, peer, tag)
}

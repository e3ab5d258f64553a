//! DRA mode's faults on the real node (issue 47, point 4), run by
//! `dra.rs` while one VM pod holds a device:
//!
//! - **The daemon killed during a prepare.** strace's fault injection
//!   (`-P /var/run/cdi -e inject=unlinkat:signal=KILL`, no hook in the
//!   daemon) kills it at the first system call of the claim's CDI spec
//!   write: the device's macvtap is made, the spec is not. The DaemonSet's
//!   container starts again, the kubelet prepares the claim again on the
//!   new daemon, and the VM pod starts and pings.
//! - **The kubelet killed during a prepare.** The same injection with
//!   `SIGSTOP` holds the daemon there; the kubelet is killed, the daemon
//!   goes on and finishes the prepare for nobody, and the kubelet started
//!   again prepares the claim again: answered from the spec, the pod
//!   starts and pings.
//! - **The NIC down.** Every device of the resource is tainted in the
//!   slice, so a new VM pod stays Pending while a device is free; a pod
//!   holding a device through a claim of its own shows it `Unhealthy` in
//!   its container's `allocatedResourcesStatus` (KEP-4680, from our health
//!   stream), while a VM pod in KubeVirt's shape, holding one through its
//!   extended resource request, shows nothing there (the kubelet's
//!   `UpdateAllocatedResourcesStatus` skips containers without claims).
//!   With the NIC up again the Pending pod starts and pings, and the claim
//!   pod's device is `Healthy`.
//!
//! Nothing leaks: at the end the pods are deleted and no spec or macvtap
//! is left.

use super::dra::{NAME, cdi_specs, slices};
use super::{NIC, NS, Run, VM_IMAGE, WAIT, daemon_pid, guest_answers, ip, macvtaps_on_nic};
use anyhow::{Context, Result, bail, ensure};
use macvtap_e2e::sandbox::TestNs;
use serde_json::{Value, json};
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The DeviceClass the example makes for [`NAME`], which the claim pod's
/// template names.
const CLASS: &str = "macvtap-dradata";
/// The claim pod: a pod holding a device through a claim of its own.
const CLAIM_POD: &str = "dra-claim-holder";

/// Sets the resource's capacity by its ConfigMap and waits for the slice
/// to offer that many devices.
pub(super) fn set_capacity(run: &Run, capacity: u32) -> Result<()> {
    let conf = format!(r#"[{{"name":"{NAME}","lowerDevice":"{NIC}","capacity":{capacity}}}]"#);
    run.c.apply(&json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "macvtap-deviceplugin-config", "namespace": NS},
        "data": {"DP_MACVTAP_CONF": conf}
    }))?;
    run.c.wait(
        &format!("our slice offering {capacity} devices"),
        WAIT,
        || Ok((devices(run)?.len() == capacity as usize).then_some(())),
    )
}

/// The devices our slices publish.
fn devices(run: &Run) -> Result<Vec<Value>> {
    Ok(slices(run.c)?
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect())
}

/// strace attached to our daemon (all its threads, and the ones it
/// starts), acting with `signal` on its first `unlinkat` in the CDI
/// directory, which only a claim's spec write makes (the temporary file's
/// removal before it is created); its trace goes to a file.
struct Injected {
    child: Child,
    trace: tempfile::NamedTempFile,
    pid: u32,
}

impl Injected {
    fn attach(signal: &str) -> Result<Self> {
        let pid = daemon_pid()?;
        let trace = tempfile::NamedTempFile::new()?;
        let child = Command::new("strace")
            .args(["-f", "-qq", "-p", &pid.to_string(), "-o"])
            .arg(trace.path())
            // The daemon's container mounts the runtime's CDI directory at
            // the same path; strace names a descriptor by the path the
            // daemon opened it by.
            .args([
                "-P",
                super::dra::CDI_DIR,
                "-P",
                "/run/cdi",
                "-e",
                "trace=unlinkat",
                "-e",
                &format!("inject=unlinkat:signal={signal}:when=1"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting strace (hack/setup.sh installs it)")?;
        let me = Self { child, trace, pid };
        let tracer = me.child.id().to_string();
        // Attached once every thread of the daemon names strace as its
        // tracer.
        let attached = || -> Result<bool> {
            let mut all = true;
            for t in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
                let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
                let of = status
                    .lines()
                    .find_map(|l| l.strip_prefix("TracerPid:"))
                    .map(str::trim);
                all &= of == Some(tracer.as_str());
            }
            Ok(all)
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if attached()? {
                return Ok(me);
            }
            if std::time::Instant::now() > deadline {
                bail!("strace did not attach to our daemon (pid {pid}) within 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn trace(&self) -> String {
        std::fs::read_to_string(self.trace.path()).unwrap_or_default()
    }

    /// Waits for strace to end (its tracee killed) and returns its trace.
    fn wait_killed(mut self, run: &Run) -> Result<String> {
        let child = &mut self.child;
        run.c.wait("strace's SIGKILL of our daemon", WAIT, || {
            Ok(child.try_wait()?.map(|_| ()))
        })?;
        let trace = self.trace();
        ensure!(
            trace.contains("+++ killed by SIGKILL +++") && trace.contains("unlinkat("),
            "strace ended without killing the daemon at a spec write:\n{trace}"
        );
        Ok(trace)
    }

    /// Waits for the daemon to stop at the injection.
    fn wait_stopped(&self, run: &Run) -> Result<String> {
        run.c
            .wait("our daemon stopped at its spec write", WAIT, || {
                let t = self.trace();
                Ok(t.contains("stopped by SIGSTOP").then_some(t))
            })
    }

    /// Detaches strace and lets the daemon go on.
    fn release(mut self) -> Result<()> {
        let strace = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(strace, nix::sys::signal::Signal::SIGINT)?;
        self.child.wait()?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid as i32),
            nix::sys::signal::Signal::SIGCONT,
        )?;
        Ok(())
    }
}

impl Drop for Injected {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid as i32),
                nix::sys::signal::Signal::SIGCONT,
            );
        }
    }
}

/// The restart count of our daemon's container.
fn daemon_restarts(run: &Run) -> Result<i64> {
    let p = run.daemon_pod()?;
    Ok(p["status"]["containerStatuses"][0]["restartCount"]
        .as_i64()
        .unwrap_or(0))
}

/// The two kills. `holder` is the VM pod that holds a device throughout.
pub(super) fn killed_during_prepare(
    run: &mut Run,
    peer: &TestNs,
    resource: &str,
    (holder, holder_ip): (&str, Ipv4Addr),
) -> Result<()> {
    let c = run.c;
    run.steps
        .step("capacity 3: two more devices, for the prepares the kills interrupt");
    set_capacity(run, 3)?;

    run.steps
        .step("the daemon killed during a prepare (at its CDI spec write)");
    let restarts = daemon_restarts(run)?;
    let strace = Injected::attach("KILL")?;
    let vm8 = (
        "virt-launcher-vm8",
        "02:00:c6:33:64:a9",
        Ipv4Addr::new(198, 51, 100, 169),
    );
    run.apply_vm_pod(resource, vm8.0, vm8.1, vm8.2)?;
    strace.wait_killed(run)?;
    let specs = cdi_specs()?;
    let links = macvtaps_on_nic()?;
    ensure!(
        specs.len() == 1 && links.len() == 1,
        "killed at the spec write, the prepare should have made the macvtap and no spec: \
         specs {specs:?}, macvtaps on the NIC {links:?}"
    );
    run.steps.say(format!(
        "killed with macvtap {} made and no spec for {}'s claim",
        links[0], vm8.0
    ));
    c.wait("our daemon's container started again", WAIT, || {
        Ok((daemon_restarts(run)? > restarts && run.ds_ready()?.is_some()).then_some(()))
    })?;
    run.wait_vm_serving(vm8.0)?;
    guest_answers(peer, vm8.0, vm8.2)?;
    ensure!(
        cdi_specs()?.len() == 2,
        "after the retried prepare: specs {:?}",
        cdi_specs()?
    );
    run.steps.say(format!(
        "the kubelet prepared the claim again on the new daemon: {} started and answers",
        vm8.0
    ));

    run.steps
        .step("the kubelet killed during a prepare (the daemon held at its spec write)");
    let strace = Injected::attach("STOP")?;
    let vm9 = (
        "virt-launcher-vm9",
        "02:00:c6:33:64:aa",
        Ipv4Addr::new(198, 51, 100, 170),
    );
    run.apply_vm_pod(resource, vm9.0, vm9.1, vm9.2)?;
    strace.wait_stopped(run)?;
    ensure!(
        cdi_specs()?.len() == 2 && macvtaps_on_nic()?.len() == 1,
        "held at the spec write: specs {:?}, macvtaps on the NIC {:?}",
        cdi_specs()?,
        macvtaps_on_nic()?
    );
    let kubelet = c.pid_of("kubelet")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(kubelet as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    strace.release()?;
    c.wait(
        "the prepare finished for nobody (its spec written)",
        WAIT,
        || Ok((cdi_specs()?.len() == 3).then_some(())),
    )?;
    c.ensure_up()?;
    run.wait_vm_serving(vm9.0)?;
    guest_answers(peer, vm9.0, vm9.2)?;
    guest_answers(peer, holder, holder_ip)?;
    ensure!(
        cdi_specs()?.len() == 3 && macvtaps_on_nic()?.is_empty(),
        "after the kubelet's restart: specs {:?}, macvtaps left on the NIC {:?}",
        cdi_specs()?,
        macvtaps_on_nic()?
    );
    run.steps.say(format!(
        "the new kubelet prepared the claim again (answered from its spec): {} started and answers, {holder} still does",
        vm9.0
    ));
    run.delete_vm_pods(&[vm8.0, vm9.0])?;
    c.wait(
        &format!("{} and {}'s claims unprepared", vm8.0, vm9.0),
        WAIT,
        || Ok((cdi_specs()?.len() == 1 && macvtaps_on_nic()?.is_empty()).then_some(())),
    )?;
    Ok(())
}

/// The claim pod's template: one device of the example class.
fn claim_template() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": CLASS, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "tap", "exactly": {"deviceClassName": CLASS}}
        ]}}}
    })
}

/// The claim pod: a container with a claim of its own, which lists its
/// tap node and sleeps.
fn claim_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": CLAIM_POD, "namespace": "default", "labels": {"e2e": "cluster"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "tap", "resourceClaimTemplateName": CLASS}],
            "containers": [{
                "name": "holder", "image": VM_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "ls /dev; exec sleep 100000"],
                "resources": {"claims": [{"name": "tap"}]}
            }]
        }
    })
}

/// The health the kubelet shows for the claim pod's device, once it
/// shows one.
fn claim_pod_health(run: &Run) -> Result<Option<(String, String)>> {
    let p = run.c.get_json(&["-n", "default", "pod", CLAIM_POD])?;
    let st = &p["status"]["containerStatuses"][0]["allocatedResourcesStatus"];
    let Some(first) = st.as_array().and_then(|a| a.first()) else {
        return Ok(None);
    };
    let r = &first["resources"][0];
    Ok(r["health"].as_str().map(|h| {
        (
            h.to_string(),
            format!(
                "{}: {} {}",
                first["name"].as_str().unwrap_or(""),
                r["resourceID"].as_str().unwrap_or(""),
                r["message"].as_str().unwrap_or("")
            ),
        )
    }))
}

/// Waits for the claim pod's device to show `health`.
fn wait_claim_pod_health(run: &Run, health: &str) -> Result<String> {
    run.c.wait(
        &format!("{CLAIM_POD}'s device {health} in its status"),
        WAIT,
        || {
            Ok(claim_pod_health(run)?
                .filter(|(h, _)| h == health)
                .map(|(_, what)| what))
        },
    )
}

/// The NIC down and up again. `holder` holds a device, in KubeVirt's
/// shape; on return the pods this made are deleted again.
pub(super) fn nic_down(
    run: &mut Run,
    peer: &TestNs,
    resource: &str,
    (holder, holder_ip): (&str, Ipv4Addr),
) -> Result<()> {
    let c = run.c;
    run.steps
        .step("a pod with a claim of its own: its device Healthy in its status");
    c.apply(&claim_template())?;
    c.apply(&claim_pod())?;
    c.wait(&format!("{CLAIM_POD} Running"), WAIT, || {
        Ok((run.pod_phase(CLAIM_POD)? == "Running").then_some(()))
    })?;
    let healthy = wait_claim_pod_health(run, "Healthy")?;
    run.steps.say(format!("{CLAIM_POD}: {healthy}"));

    run.steps.step(
        "the NIC down: devices tainted, a new VM pod Pending, the claim pod's device Unhealthy",
    );
    ip(&["link", "set", NIC, "down"])?;
    let tainted = c.wait("every device of the slice tainted", WAIT, || {
        let ds = devices(run)?;
        Ok(ds
            .iter()
            .all(|d| d["taints"][0]["key"] == "macvtap.network.kubevirt.io/nic-unhealthy")
            .then(|| ds[0]["taints"][0].clone()))
    })?;
    let unhealthy = wait_claim_pod_health(run, "Unhealthy")?;
    let vm = c.get_json(&["-n", "default", "pod", holder])?;
    let shown = &vm["status"]["containerStatuses"][0]["allocatedResourcesStatus"];
    ensure!(
        shown.is_null() || shown.as_array().is_some_and(Vec::is_empty),
        "{holder} (an extended resource request, no claims of its own) shows {shown}"
    );
    let vm10 = (
        "virt-launcher-vm10",
        "02:00:c6:33:64:ab",
        Ipv4Addr::new(198, 51, 100, 171),
    );
    run.apply_vm_pod(resource, vm10.0, vm10.1, vm10.2)?;
    let why = super::dra::wait_unschedulable(run, vm10.0)?;
    let free = 3 - cdi_specs()?.len();
    ensure!(
        free == 1,
        "{free} devices free while {} waits: the taint is what keeps it Pending only with one free",
        vm10.0
    );
    run.steps.say(format!(
        "taint {tainted}; {CLAIM_POD}: {unhealthy}; {holder}: no allocatedResourcesStatus; \
         {} Pending with one device free: {why}",
        vm10.0
    ));

    run.steps
        .step("the NIC up: the taint gone, the Pending pod starts, the claim pod's device Healthy");
    ip(&["link", "set", NIC, "up"])?;
    run.wait_vm_serving(vm10.0)?;
    guest_answers(peer, vm10.0, vm10.2)?;
    guest_answers(peer, holder, holder_ip)?;
    let healthy = wait_claim_pod_health(run, "Healthy")?;
    run.steps.say(format!(
        "{} started and answers, {holder} answers, {CLAIM_POD}: {healthy}",
        vm10.0
    ));
    run.delete_vm_pods(&[vm10.0, CLAIM_POD])?;
    c.kubectl(&[
        "-n",
        "default",
        "delete",
        "resourceclaimtemplate",
        CLASS,
        "--ignore-not-found",
    ])?;
    Ok(())
}

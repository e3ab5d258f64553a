//! A node-selected resource on the real node (issue 46, item 4): our
//! DaemonSet (the base, our image, the test's daemon flags) with a
//! ConfigMap, made before the daemon starts, of two entries on the test's
//! NIC: `dataplane` by `lowerDevice`, and `labelled` by a `nicSelector`
//! (a name that does not exist here, then the NIC) and a `nodeSelector`.
//! The real API server's Node is labelled and unlabelled with kubectl: the
//! resource appears in the node's allocatable within the watch's delay and
//! goes again, live, with no restart and no ConfigMap edit; the daemon's
//! log and `doctor` say which NIC it took and what it passed over; the
//! plain entry is served throughout.

use super::{DAEMON, DS, NIC, NODE, NS, RESOURCE_PREFIX, Run, WAIT, repo};
use anyhow::{Result, ensure};
use macvtap_e2e::cluster::realnode;
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

/// The label the `labelled` entry's node selector asks for, `=yes`.
pub(super) const LABEL: &str = "macvtap-e2e.example.com/labelled";
/// A NIC name this node does not have, tried first.
const ABSENT: &str = "mvtclnic9";

/// The install: the base, our image `tag`, the test's daemon flags, and
/// the ConfigMap, applied first so the daemon reads it at its start.
fn install(run: &Run, tag: &str, kdir: &Path) -> Result<()> {
    let args = realnode::test_daemon_args(Duration::from_secs(30));
    realnode::write_kustomization(kdir, tag, &[], Some(&args))?;
    let conf = json!([
        {"name": "dataplane", "lowerDevice": NIC, "capacity": 2},
        {"name": "labelled", "capacity": 3,
         "nicSelector": {"names": [ABSENT, NIC]},
         "nodeSelector": {LABEL: "yes"}}
    ]);
    run.c.kubectl(&[
        "apply",
        "-f",
        &repo()
            .join("manifests/base/namespace.yaml")
            .to_string_lossy(),
    ])?;
    run.c.apply(&json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "macvtap-deviceplugin-config", "namespace": NS},
        "data": {"DP_MACVTAP_CONF": conf.to_string()}
    }))?;
    run.c.kubectl(&["apply", "-k", &kdir.to_string_lossy()])?;
    run.wait_ds_ready()
}

/// The scenario, with our image's `tag` (of `IMAGE_REPO`).
pub(super) fn labelled_resource(run: &mut Run, tag: &str) -> Result<()> {
    let c = run.c;
    let labelled = format!("{RESOURCE_PREFIX}labelled");
    let dataplane = format!("{RESOURCE_PREFIX}dataplane");

    run.steps
        .step("install with a ConfigMap of a plain entry and a node-selected one");
    let kdir = tempfile::tempdir()?;
    install(run, tag, kdir.path())?;
    run.wait_allocatable_of(&dataplane, 2)?;
    ensure!(
        run.allocatable_of(&labelled)?.is_none_or(|n| n == 0),
        "{labelled} is advertised on a node without the label {LABEL}"
    );
    c.wait(
        "the daemon saying why the node does not serve it",
        WAIT,
        || {
            Ok(run
                .daemon_logs()?
                .contains(&format!("it has no label {LABEL}"))
                .then_some(()))
        },
    )?;
    run.steps.say(format!(
        "{dataplane}: 2; {labelled}: not advertised, the Node lacks {LABEL}"
    ));

    run.steps
        .step("the Node labelled: the resource appears, live");
    let t = Instant::now();
    c.kubectl(&["label", "node", NODE, &format!("{LABEL}=yes")])?;
    run.wait_allocatable_of(&labelled, 3)?;
    let took = t.elapsed();
    let log = run.daemon_logs()?;
    ensure!(
        log.contains(&format!(
            "on NIC {NIC}, the first NIC named {ABSENT} or {NIC}; passed over {ABSENT} (there is no such link)"
        )),
        "the daemon does not say which NIC it took:\n{}",
        super::last_lines(&log, 20)
    );
    let doctor = c.kubectl_output(
        &[
            "-n",
            NS,
            "exec",
            &format!("ds/{DS}"),
            "-c",
            DAEMON,
            "--",
            "/macvtap-deviceplugin",
            "doctor",
            "--output",
            "json",
        ],
        None,
    )?;
    let findings: serde_json::Value = serde_json::from_slice(&doctor.stdout)?;
    let placement: Vec<String> = findings
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["check"] == "placement")
        .filter_map(|f| f["message"].as_str().map(str::to_string))
        .collect();
    ensure!(
        placement.iter().any(
            |m| m.starts_with(&format!("{labelled} is served on this node"))
                && m.contains(&format!("on NIC {NIC}"))
        ),
        "doctor's placement findings: {placement:?}"
    );
    run.steps.say(format!(
        "{labelled}: 3 on {NIC}, {:.1} s after kubectl label; doctor says so",
        took.as_secs_f64()
    ));

    run.steps.step("the label removed: the resource goes, live");
    let t = Instant::now();
    c.kubectl(&["label", "node", NODE, &format!("{LABEL}-")])?;
    c.wait(&format!("{labelled} withdrawn"), WAIT, || {
        Ok(run
            .allocatable_of(&labelled)?
            .is_none_or(|n| n == 0)
            .then_some(()))
    })?;
    ensure!(
        run.allocatable_of(&dataplane)? == Some(2),
        "the plain entry went too"
    );
    run.steps.say(format!(
        "{labelled} withdrawn {:.1} s after the label's removal; {dataplane} still 2",
        t.elapsed().as_secs_f64()
    ));

    run.steps.step("uninstall");
    run.delete_kustomization(kdir.path())?;
    Ok(())
}

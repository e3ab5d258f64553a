//! CNI figures: per-command latency of our plugin against the kernel's floor
//! (the same netlink operations issued in-process by `macvtap-link`) and the
//! Go `macvlan` plugin; VERSION against `/bin/true`; 64 concurrent ADDs/DELs.

use super::exec;
use super::report::{Report, Row};
use super::stats::Samples;
use crate::sandbox::TestNs;
use anyhow::{Context, Result, bail, ensure};
use macvtap_link::{Handle, LinkChange, Links, MacvtapMode, Netns, link_name_for_device};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where the plugins are.
#[derive(Debug, Clone)]
pub struct Plugins {
    /// Our `macvtap` (release build).
    pub ours: PathBuf,
    /// The reference plugins' Go `macvlan` (v1.10.0).
    pub go_macvlan: PathBuf,
    /// The reference plugins' `host-local` (v1.10.0).
    pub host_local: PathBuf,
}

// Siblings on one NIC may not share a MAC: each implementation gets its own.
const MAC: &str = "02:00:c0:00:02:aa";
const GO_MAC: &str = "02:00:c0:00:02:ac";
const CHECKED_MAC: &str = "02:00:c0:00:02:ad";

/// What the `ours+check` series needs: the node settings file that points
/// our plugin at a PodResources server (the test kubelet's) listing the pod
/// `default/test-pod` with the device [`CHECKED_DEVICE`].
#[derive(Debug, Clone)]
pub struct OwnershipCheck {
    /// The settings file (`MACVTAP_CNI_SETTINGS`), `podResourcesCheck: enforce`.
    pub settings: PathBuf,
    /// `CNI_ARGS` pod identity of the pod holding the device.
    pub pod_args: String,
}

/// The device the PodResources server lists for the `ours+check` series.
pub const CHECKED_DEVICE: &str = "benchMvp2";
const FLOOR_MAC: [u8; 6] = [0x02, 0x00, 0xc0, 0x00, 0x02, 0xab];
/// The MAC the floor's DEL gives back (another one, as ours gives a random one).
const FLOOR_DEL_MAC: [u8; 6] = [0x02, 0x00, 0xc0, 0x00, 0x02, 0xcd];

/// The node: `lower0` in `node`, three pod namespaces.
struct Node {
    node: TestNs,
    ours: TestNs,
    floor: TestNs,
    go: TestNs,
    checked: TestNs,
    _peer: TestNs,
    // Fresh namespaces number links from 1: hold the tests' tap-node lock so
    // no test makes a macvtap with the same ifindex meanwhile.
    _tap_lock: nix::fcntl::Flock<std::fs::File>,
}

impl Node {
    fn new() -> Result<Self> {
        let lock = test_support::tap_node_lock()?;
        let node = TestNs::new("bn")?;
        let peer = TestNs::new("bp")?;
        node.ip(&[
            "link", "add", "lower0", "type", "veth", "peer", "name", "peer0", "netns", &peer.name,
        ])?;
        node.ip(&["link", "set", "lower0", "up"])?;
        peer.ip(&["link", "set", "peer0", "up"])?;
        Ok(Node {
            node,
            ours: TestNs::new("bo")?,
            floor: TestNs::new("bf")?,
            go: TestNs::new("bg")?,
            checked: TestNs::new("bc")?,
            _peer: peer,
            _tap_lock: lock,
        })
    }
}

fn ours_conf(device: &str, ipam: Option<&serde_json::Value>) -> serde_json::Value {
    let mut c = json!({"cniVersion": "1.0.0", "name": "bench", "type": "macvtap",
                       "deviceID": device, "mtu": 1500});
    if let Some(i) = ipam {
        c["ipam"] = i.clone();
    }
    c
}

fn go_conf(ipam: Option<&serde_json::Value>) -> serde_json::Value {
    let mut c = json!({"cniVersion": "1.0.0", "name": "bench-go", "type": "macvlan",
                       "master": "lower0", "mode": "bridge", "mtu": 1500});
    if let Some(i) = ipam {
        c["ipam"] = i.clone();
    }
    c
}

fn with_prev(mut conf: serde_json::Value, result: &str) -> Result<String> {
    conf["prevResult"] = serde_json::from_str(result).context("plugin result is not JSON")?;
    Ok(conf.to_string())
}

/// The in-process floor of ADD: move + rename, then MTU/MAC/up.
fn floor_add(host: &Handle, pod_ns: &Netns, name: &str) -> Result<()> {
    let link = host.get_link(name)?.context("floor link missing")?;
    let pod = Handle::in_netns(pod_ns)?;
    host.set_link_ns(link.index, name, pod_ns, "net1")?;
    let change = LinkChange {
        mtu: Some(1500),
        mac: Some(FLOOR_MAC),
        up: Some(true),
        promisc: Some(false),
        ..Default::default()
    };
    pod.set_link(link.index, "net1", &change)?;
    Ok(())
}

/// The in-process floor of DEL: the same netlink work as ours, which gives
/// the link back to the host (get; host look-ups of index and name; down and
/// promisc off, then a fresh MAC, in the pod; move + rename keeping the
/// ifindex).
fn floor_del(host_ns: &Netns, host: &Handle, pod_ns: &Netns, host_name: &str) -> Result<()> {
    let pod = Handle::in_netns(pod_ns)?;
    let link = pod.get_link("net1")?.context("floor net1 missing")?;
    ensure!(host.get_link_by_index(link.index)?.is_none(), "index taken");
    ensure!(host.get_link(host_name)?.is_none(), "name taken");
    let down = LinkChange {
        promisc: Some(false),
        up: Some(false),
        ..Default::default()
    };
    pod.set_link(link.index, "net1", &down)?;
    let fresh_mac = LinkChange {
        mac: Some(FLOOR_DEL_MAC),
        ..Default::default()
    };
    pod.set_link(link.index, "net1", &fresh_mac)?;
    pod.set_link_ns(link.index, "net1", host_ns, host_name)?;
    host.get_link(host_name)?.context("floor link not back")?;
    Ok(())
}

fn floor_check(pod_ns: &Netns) -> Result<()> {
    let pod = Handle::in_netns(pod_ns)?;
    let link = pod.get_link("net1")?.context("floor net1 missing")?;
    ensure!(link.is_up() && link.mtu == 1500, "floor link not as set");
    pod.list_addrs(link.index)?;
    Ok(())
}

/// Figure 1 (and its IPAM variant): ADD, CHECK, DEL per implementation,
/// interleaved, `n` rounds. Runs with the calling thread in the node netns.
pub fn per_command(
    plugins: &Plugins,
    check: &OwnershipCheck,
    n: usize,
    with_ipam: bool,
    report: &mut Report,
) -> Result<Vec<(String, Vec<Samples>)>> {
    let node = Node::new()?;
    let data = tempfile::tempdir()?;
    let ipam = with_ipam.then(|| {
        json!({"type": "host-local", "dataDir": data.path(),
               "ranges": [[{"subnet": "192.0.2.0/24"}]]})
    });
    let suffix = if with_ipam { " +host-local" } else { "" };
    const WHO: [&str; 4] = ["ours", "floor", "go-macvlan", "ours+check"];
    const CMDS: [&str; 3] = ["ADD", "CHECK", "DEL"];
    // samples[who][command]
    let mut samples: Vec<Vec<Samples>> = WHO
        .iter()
        .map(|w| {
            CMDS.iter()
                .map(|c| Samples::new(format!("{w} {c}{suffix}")))
                .collect()
        })
        .collect();

    node.node.run(|| {
        let host = Handle::current()?;
        let host_ns = Netns::current()?;
        let lower = host.get_link("lower0")?.context("lower0 missing")?;
        let ours_dev = "benchMvp0";
        let floor_dev = "benchMvp1";
        let ours_link = link_name_for_device(ours_dev);
        let floor_link = link_name_for_device(floor_dev);
        let floor_ns = Netns::open(node.floor.path())?;
        let floor_ipam_conf = json!({"cniVersion": "1.0.0", "name": "bench-floor", "ipam": ipam});
        let checked_link = link_name_for_device(CHECKED_DEVICE);
        let settings = check.settings.display().to_string();
        // (plugin, config, CNI_ARGS, pod netns, extra env) of the executed
        // plugins, indexed by WHO (the floor's slot is unused).
        let none: Vec<(&str, &str)> = Vec::new();
        let plugins_run = [
            (
                &plugins.ours,
                ours_conf(ours_dev, ipam.as_ref()),
                format!("IgnoreUnknown=true;MAC={MAC}"),
                node.ours.path(),
                none.clone(),
            ),
            (
                &plugins.ours,
                ours_conf(ours_dev, ipam.as_ref()),
                String::new(),
                node.floor.path(),
                none.clone(),
            ),
            (
                &plugins.go_macvlan,
                go_conf(ipam.as_ref()),
                format!("IgnoreUnknown=true;MAC={GO_MAC}"),
                node.go.path(),
                none.clone(),
            ),
            (
                &plugins.ours,
                ours_conf(CHECKED_DEVICE, ipam.as_ref()),
                format!("IgnoreUnknown=true;{};MAC={CHECKED_MAC}", check.pod_args),
                node.checked.path(),
                vec![("MACVTAP_CNI_SETTINGS", settings.as_str())],
            ),
        ];
        for round in 0..n {
            // The device plugin's part, not measured.
            host.add_macvtap_at(&ours_link, lower.index, MacvtapMode::Bridge, None, None)?;
            host.add_macvtap_at(&floor_link, lower.index, MacvtapMode::Bridge, None, None)?;
            host.add_macvtap_at(&checked_link, lower.index, MacvtapMode::Bridge, None, None)?;
            // ADD results, for CHECK's prevResult, indexed by WHO.
            let mut added = [String::new(), String::new(), String::new(), String::new()];
            for (c, cmd) in CMDS.iter().enumerate() {
                // Rotate the order so no implementation always runs first.
                for k in 0..WHO.len() {
                    let who = (round + k) % WHO.len();
                    let took = if who == 1 {
                        let t = Instant::now();
                        match *cmd {
                            "ADD" => {
                                floor_add(&host, &floor_ns, &floor_link)?;
                                if with_ipam {
                                    floor_ipam(
                                        plugins,
                                        &floor_ns,
                                        &node.floor.path(),
                                        &floor_ipam_conf,
                                        "ADD",
                                    )?;
                                }
                            }
                            "CHECK" => floor_check(&floor_ns)?,
                            _ => {
                                if with_ipam {
                                    floor_ipam(
                                        plugins,
                                        &floor_ns,
                                        &node.floor.path(),
                                        &floor_ipam_conf,
                                        "DEL",
                                    )?;
                                }
                                floor_del(&host_ns, &host, &floor_ns, &floor_link)?;
                            }
                        }
                        t.elapsed()
                    } else {
                        let (plugin, conf, args, netns, env) = &plugins_run[who];
                        let stdin = if *cmd == "CHECK" {
                            with_prev(conf.clone(), &added[who])?
                        } else {
                            conf.to_string()
                        };
                        let r = exec::cni_with_env(plugin, cmd, netns, "net1", args, &stdin, env)?;
                        ensure!(r.ok, "{} {cmd} failed: {}", WHO[who], r.stdout);
                        if *cmd == "ADD" {
                            added[who] = r.stdout;
                        }
                        r.took
                    };
                    samples[who][c].push(took);
                }
            }
            // DEL gave both macvtaps back; the device plugin's reclaim would
            // remove them once their pod is gone. Not measured.
            for name in [&ours_link, &floor_link, &checked_link] {
                let back = host
                    .get_link(name)?
                    .context("DEL did not give the link back")?;
                host.del_link(back.index, name)?;
            }
        }
        Ok(())
    })?;

    let what = format!(
        "Wall time of each CNI command, {n} interleaved rounds{}. `floor` is the same \
         netlink work issued in-process by `macvtap-link` with no exec (move+rename, \
         MTU/MAC/up; for DEL the same give-back as ours: get, host look-ups, down, fresh MAC, \
         move+rename back; get+list addresses for CHECK){}. The Go macvlan plugin's DEL deletes its link. `go-macvlan` is Debian's \
         Go macvlan plugin doing the same commands: it creates its link directly in the pod \
         namespace and so skips the namespace move (about 16 ms of RCU waiting on this kernel) \
         that a macvtap made at Allocate time cannot skip, so it stands for another kind of plugin, not for the project we replace; compare ours with the floor, and with the Go project's own CNI on the same kind of links in *Side by side: CNI*. `ours+check` is our plugin as the manifests install it: ADD \
         first asks the kubelet's PodResources API (a test kubelet's, on a unix socket) whether \
         the pod holds the device (`podResourcesCheck: enforce`).",
        if with_ipam {
            " with the reference host-local IPAM"
        } else {
            ""
        },
        if with_ipam {
            ", plus exec of host-local and its address"
        } else {
            ""
        }
    );
    report.section(&format!("CNI per command{suffix}"), &what);
    let mut panels = Vec::new();
    for (c, cmd) in CMDS.iter().enumerate() {
        let (o, f, g, k) = (
            samples[0][c].clone(),
            samples[1][c].clone(),
            samples[2][c].clone(),
            samples[3][c].clone(),
        );
        let fp = f.p50();
        let mut rows = vec![
            Row {
                series: f.clone(),
                reference: None,
            },
            Row {
                series: o.clone(),
                reference: Some(("floor".into(), fp)),
            },
        ];
        let mut series = vec![o, f, g.clone()];
        // The PodResources check runs on ADD only; the other commands of
        // the series are the same as ours.
        if *cmd == "ADD" {
            rows.push(Row {
                series: k.clone(),
                reference: Some(("floor".into(), fp)),
            });
            series.push(k);
        }
        rows.push(Row {
            series: g,
            reference: Some(("floor".into(), fp)),
        });
        report.latency_table(&rows);
        panels.push((format!("CNI {cmd}{suffix}"), series));
    }
    Ok(panels)
}

fn floor_ipam(
    plugins: &Plugins,
    pod_ns: &Netns,
    netns_path: &str,
    conf: &serde_json::Value,
    cmd: &str,
) -> Result<()> {
    let r = exec::cni(
        &plugins.host_local,
        cmd,
        netns_path,
        "net1",
        "",
        &conf.to_string(),
    )?;
    ensure!(r.ok, "host-local {cmd} failed: {}", r.stdout);
    if cmd == "ADD" {
        let v: serde_json::Value = serde_json::from_str(&r.stdout)?;
        let addr = v["ips"][0]["address"]
            .as_str()
            .context("host-local gave no address")?;
        let (ip, prefix) = addr.split_once('/').context("bad address")?;
        let pod = Handle::in_netns(pod_ns)?;
        let link = pod.get_link("net1")?.context("floor net1 missing")?;
        pod.add_addr(link.index, ip.parse()?, prefix.parse()?)?;
    }
    Ok(())
}

/// Figure 2: VERSION, ours vs Go macvlan vs `/bin/true`.
pub fn version(plugins: &Plugins, n: usize, report: &mut Report) -> Result<Vec<Samples>> {
    let mut ours = Samples::new("ours VERSION");
    let mut go = Samples::new("go-macvlan VERSION");
    let mut truth = Samples::new("/bin/true");
    let stdin = r#"{"cniVersion":"1.0.0"}"#;
    for round in 0..n {
        for k in 0..3 {
            match (round + k) % 3 {
                0 => ours.push(exec::cni(&plugins.ours, "VERSION", "", "", "", stdin)?.took),
                1 => go.push(exec::cni(&plugins.go_macvlan, "VERSION", "", "", "", stdin)?.took),
                _ => truth.push(exec::plain(Path::new("/bin/true"))?),
            }
        }
    }
    report.section(
        "Process overhead: VERSION",
        &format!("Wall time of `CNI_COMMAND=VERSION`, {n} interleaved rounds; `/bin/true` is the cost of a process at all."),
    );
    let gp = go.p50();
    report.latency_table(&[
        Row {
            series: go.clone(),
            reference: None,
        },
        Row {
            series: ours.clone(),
            reference: Some(("go-macvlan".into(), gp)),
        },
        Row {
            series: truth.clone(),
            reference: Some(("go-macvlan".into(), gp)),
        },
    ]);
    Ok(vec![ours, go, truth])
}

/// Figure 3: `count` concurrent ADDs, then `count` concurrent DELs, on one
/// node; wall time, failures and links left over, ours vs Go macvlan.
pub fn concurrent(plugins: &Plugins, count: usize, report: &mut Report) -> Result<()> {
    let node = Node::new()?;
    let pods: Vec<TestNs> = (0..count)
        .map(|i| TestNs::new(&format!("c{i}")))
        .collect::<Result<_>>()?;
    // No MAC: siblings on one NIC may not share one.
    let args = "IgnoreUnknown=true".to_string();
    let mut md = String::from(
        "| plugin | ADD wall ms | ADD failures | DEL wall ms | DEL failures | links left in pods | links back on the node |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for who in ["ours", "go-macvlan"] {
        let (add_ms, add_fail, del_ms, del_fail) = node.node.run(|| {
            let host = Handle::current()?;
            let lower = host.get_link("lower0")?.context("lower0 missing")?;
            let confs: Vec<String> = (0..count)
                .map(|i| {
                    if who == "ours" {
                        ours_conf(&format!("cMvp{i}"), None).to_string()
                    } else {
                        go_conf(None).to_string()
                    }
                })
                .collect();
            if who == "ours" {
                for i in 0..count {
                    host.add_macvtap_at(
                        &link_name_for_device(&format!("cMvp{i}")),
                        lower.index,
                        MacvtapMode::Bridge,
                        None,
                        None,
                    )?;
                }
            }
            let plugin = if who == "ours" {
                &plugins.ours
            } else {
                &plugins.go_macvlan
            };
            let run_all = |cmd: &str| -> Result<(f64, usize)> {
                let start = Instant::now();
                // Threads spawned here inherit this thread's (the node's) netns.
                let fails = std::thread::scope(|s| {
                    let handles: Vec<_> = pods
                        .iter()
                        .zip(&confs)
                        .map(|(p, c)| {
                            let path = p.path();
                            let args = &args;
                            s.spawn(move || {
                                exec::cni(plugin, cmd, &path, "net1", args, c)
                                    .map(|e| e.ok)
                                    .unwrap_or(false)
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap_or(false))
                        .filter(|ok| !ok)
                        .count()
                });
                Ok((start.elapsed().as_secs_f64() * 1000.0, fails))
            };
            let (add_ms, add_fail) = run_all("ADD")?;
            let (del_ms, del_fail) = run_all("DEL")?;
            Ok((add_ms, add_fail, del_ms, del_fail))
        })?;
        let mut left = 0;
        for p in &pods {
            left += p.links()?.iter().filter(|l| *l != "lo").count();
        }
        let returned: Vec<String> = node
            .node
            .links()?
            .into_iter()
            .filter(|l| l.starts_with("mvt"))
            .collect();
        md.push_str(&format!(
            "| {who} | {add_ms:.0} | {add_fail} | {del_ms:.0} | {del_fail} | {left} | {} |\n",
            returned.len()
        ));
        // Clean up so the next plugin starts from an empty node: links left
        // in pods, and the links our DEL gave back (the device plugin's
        // reclaim removes those once their pods are gone).
        for p in &pods {
            let _ = p.ip(&["link", "del", "net1"]);
        }
        for l in &returned {
            let _ = node.node.ip(&["link", "del", l]);
        }
    }
    report.section(
        &format!("{count} concurrent ADDs, then {count} concurrent DELs"),
        &format!("All {count} ADDs start at once, each for its own pod namespace; then all DELs. Wall time of each burst, failed commands, links left in the pods afterwards, and links back on the node (our DEL gives every macvtap back to the host; the Go plugin deletes its links)."),
    );
    report.text(&md);
    Ok(())
}

/// Fails early with a clear message when a plugin is missing.
pub fn check_plugins(p: &Plugins) -> Result<()> {
    for path in [&p.ours, &p.go_macvlan, &p.host_local] {
        if !path.exists() {
            bail!(
                "{} is missing (hack/build-static.sh builds ours; the reference plugins come from hack/peers/cni-plugins)",
                path.display()
            );
        }
    }
    Ok(())
}

//! Leaked links: macvtaps the plugin made that no pod will ever take.
//!
//! The kubelet calls Allocate before the pod's sandbox exists; if the pod
//! then goes away before the CNI moves the link, the link stays in the host
//! namespace. Every interval, the `mvt…` macvtaps on our NICs are listed,
//! then compared with the device IDs the PodResources API says are allocated
//! (in that order: a link listed before the question existed before the
//! answer). A link that has belonged to no allocated device for longer than
//! a grace period is deleted, unless its device was allocated within the
//! grace period: a pod just admitted is not in PodResources yet, and its
//! container starts only after the CNI took the link. The clock is kept per
//! link identity (name and ifindex), so a recreated link starts over.
//!
//! The same round heals the opposite case: a device that PodResources says
//! a pod holds, but whose macvtap exists nowhere. A pod's network namespace
//! destroyed without CNI DEL takes the macvtap with it, and the kubelet
//! keeps handing the pod's containers the `/dev/tap<N>` of the first
//! Allocate. When no link of the device's name is in the host namespace and
//! `/dev/tap<N>` is gone (devtmpfs keeps a tap node exactly as long as its
//! macvtap exists in any namespace), the macvtap is created again on the
//! resource's NIC with ifindex N, so the sandbox's retried CNI ADD works and
//! the kubelet's DeviceSpec is right again. A tap node's deletion in `/dev`
//! starts a round at once.

use crate::allocate;
use crate::config::ResourceConfig;
use crate::error::{Error, Result};
use crate::events::{EventSink, NodeEvent};
use crate::metrics::Metrics;
use kubelet_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use kubelet_proto::podresources::v1::{ListPodResourcesRequest, ListPodResourcesResponse};
use kubelet_proto::transport::connect_unix;
use macvtap_link::device::is_device_link_name;
use macvtap_link::tapdev::tap_node_path;
use macvtap_link::{Handle, Link, Netns, RESOURCE_PREFIX, link_name_for_device};
use nix::errno::Errno;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How long one PodResources `List` may take.
const POD_RESOURCES_WAIT: Duration = Duration::from_secs(5);
/// How long an Allocate is remembered at the least (the reclaim grace when
/// that is longer); older ones are forgotten so the map stays small.
const MIN_CLOCK_MEMORY: Duration = Duration::from_secs(1);

/// When each device link was last handed out by Allocate, shared by the
/// plugin servers (which write) and the reclaimer (which reads).
#[derive(Debug, Clone, Default)]
pub struct AllocationClock {
    last: Arc<Mutex<HashMap<String, Instant>>>,
}

impl AllocationClock {
    /// Records that the link named `link` was allocated at `now`.
    pub fn allocated(&self, link: &str, now: Instant) {
        let mut m = self.last.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(link.to_string(), now);
    }

    /// When the link named `link` was last allocated.
    pub fn last_allocated(&self, link: &str) -> Option<Instant> {
        let m = self.last.lock().unwrap_or_else(|e| e.into_inner());
        m.get(link).copied()
    }

    /// Forgets allocations older than `age` at `now`, keeping the map small.
    pub fn forget_older_than(&self, age: Duration, now: Instant) {
        let mut m = self.last.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|_, t| now.duration_since(*t) < age);
    }
}

/// The ifindex each device's macvtap had when Allocate last handed it out
/// (so its pod's containers get `/dev/tap<ifindex>`), with its resource's
/// short name. Written by the plugin servers, read by the healer.
#[derive(Debug, Clone, Default)]
pub struct Assignments {
    by_device: Arc<Mutex<HashMap<String, Assigned>>>,
}

/// Where a device's macvtap was when it was handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    /// The resource's short name (`dataplane`).
    pub resource: String,
    /// The ifindex, i.e. the N of `/dev/tapN` in the DeviceSpec.
    pub ifindex: u32,
}

impl Assignments {
    /// Records that `device_id` of `resource` was handed out as `/dev/tap<ifindex>`.
    pub fn assigned(&self, device_id: &str, resource: &str, ifindex: u32) {
        let mut m = self.by_device.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(
            device_id.to_string(),
            Assigned {
                resource: resource.to_string(),
                ifindex,
            },
        );
    }

    /// Where `device_id` was handed out, if this daemon handed it out.
    pub fn get(&self, device_id: &str) -> Option<Assigned> {
        let m = self.by_device.lock().unwrap_or_else(|e| e.into_inner());
        m.get(device_id).cloned()
    }
}

/// The N of a DeviceSpec's `/dev/tapN`.
pub fn tap_index(host_path: &str) -> Option<u32> {
    host_path.strip_prefix("/dev/tap")?.parse().ok()
}

/// A device to heal: held by a pod, its macvtap gone everywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// The device ID.
    pub device_id: String,
    /// Where it was handed out.
    pub at: Assigned,
}

/// The devices that a pod holds (`allocated`) and that were handed out by
/// this daemon (`assignments`), whose link is not in the host namespace
/// (`links`) and whose tap node no longer exists (`node_exists`).
pub fn lost_devices(
    allocated: &HashSet<String>,
    assignments: &Assignments,
    links: &[Link],
    node_exists: impl Fn(u32) -> bool,
) -> Vec<Lost> {
    let host_names: HashSet<&str> = links.iter().map(|l| l.name.as_str()).collect();
    let mut lost: Vec<Lost> = allocated
        .iter()
        .filter_map(|id| Some((id, assignments.get(id)?)))
        .filter(|(id, _)| !host_names.contains(link_name_for_device(id).as_str()))
        .filter(|(_, at)| !node_exists(at.ifindex))
        .map(|(id, at)| Lost {
            device_id: id.clone(),
            at,
        })
        .collect();
    lost.sort_by(|a, b| a.device_id.cmp(&b.device_id));
    lost
}

/// A link as the reclaimer tells links apart: a link deleted and created
/// again under the same name has another ifindex, and starts over.
type LinkIdentity = (String, u32);

/// The device IDs of our resources that the kubelet reports as allocated.
pub fn allocated_ids(resp: &ListPodResourcesResponse) -> HashSet<String> {
    let prefix = format!("{RESOURCE_PREFIX}/");
    resp.pod_resources
        .iter()
        .flat_map(|p| &p.containers)
        .flat_map(|c| &c.devices)
        .filter(|d| d.resource_name.starts_with(&prefix))
        .flat_map(|d| d.device_ids.iter().cloned())
        .collect()
}

/// The links that look leaked: macvtaps named like device links, on one of
/// the `lowers` (NIC names), whose name is not that of an allocated device.
pub fn leaked_links(
    links: &[Link],
    lowers: &HashSet<String>,
    allocated: &HashSet<String>,
) -> Vec<Link> {
    let lower_index: HashSet<u32> = links
        .iter()
        .filter(|l| lowers.contains(&l.name))
        .map(|l| l.index)
        .collect();
    let in_use: HashSet<String> = allocated
        .iter()
        .map(|id| link_name_for_device(id))
        .collect();
    links
        .iter()
        .filter(|l| l.is_macvtap() && is_device_link_name(&l.name))
        .filter(|l| l.lower_index.is_some_and(|i| lower_index.contains(&i)))
        .filter(|l| !in_use.contains(&l.name))
        .cloned()
        .collect()
}

/// The links the Go device plugin v0.13.1 made that look leaked: macvtaps
/// named after a device ID of one of `resources` (`<name>Mvp<i>`) on that
/// resource's NIC, whose device is not allocated. CNI DEL gives such a link
/// back under that name, so nothing else would ever remove it.
pub fn go_era_leaked_links(
    links: &[Link],
    resources: &[ResourceConfig],
    allocated: &HashSet<String>,
) -> Vec<Link> {
    let names: HashMap<u32, &str> = links.iter().map(|l| (l.index, l.name.as_str())).collect();
    links
        .iter()
        .filter(|l| l.is_macvtap() && !l.lower_in_other_netns && !allocated.contains(&l.name))
        .filter(|l| {
            let Some((resource, _)) = macvtap_link::device::parse_device_id(&l.name) else {
                return false;
            };
            let lower = l.lower_index.and_then(|i| names.get(&i).copied());
            resources
                .iter()
                .any(|r| r.name == resource && lower == Some(r.lower_device.as_str()))
        })
        .cloned()
        .collect()
}

/// Remembers since when each link has looked leaked.
#[derive(Debug)]
pub struct Reclaimer {
    socket: PathBuf,
    grace: Duration,
    first_seen: HashMap<LinkIdentity, Instant>,
    clock: AllocationClock,
    assignments: Assignments,
    dev_dir: PathBuf,
    said_socket_absent: bool,
    events: EventSink,
}

impl Reclaimer {
    /// A reclaimer asking the PodResources API on `socket`, deleting links
    /// that have looked leaked for longer than `grace` and whose device was
    /// not allocated (per `clock`) within `grace` either.
    pub fn new(socket: PathBuf, grace: Duration, clock: AllocationClock) -> Self {
        Self {
            socket,
            grace,
            first_seen: HashMap::new(),
            clock,
            assignments: Assignments::default(),
            dev_dir: PathBuf::from(crate::allocate::DEV_DIR),
            said_socket_absent: false,
            events: EventSink::off(),
        }
    }

    /// Heals lost devices from `assignments` (what Allocate handed out),
    /// checking tap nodes in `dev_dir`.
    pub fn with_healing(mut self, assignments: Assignments, dev_dir: PathBuf) -> Self {
        self.assignments = assignments;
        self.dev_dir = dev_dir;
        self
    }

    /// Posts a Kubernetes Event for every leaked link removed.
    pub fn with_events(mut self, events: EventSink) -> Self {
        self.events = events;
        self
    }

    /// Records the links that look leaked now and returns those that have
    /// looked leaked for longer than the grace period and were not
    /// allocated within it.
    pub fn due(&mut self, leaked: &[Link], now: Instant) -> Vec<Link> {
        let ids: HashSet<LinkIdentity> = leaked.iter().map(identity).collect();
        self.first_seen.retain(|k, _| ids.contains(k));
        let mut due = Vec::new();
        for l in leaked {
            let since = *self.first_seen.entry(identity(l)).or_insert_with(|| {
                debug!(ifname = %l.name, ifindex = l.index, "a link looks leaked; it is deleted when it still does after the grace period");
                now
            });
            if now.duration_since(since) < self.grace {
                continue;
            }
            if let Some(at) = self.clock.last_allocated(&l.name) {
                let ago = now.saturating_duration_since(at);
                if ago < self.grace {
                    debug!(ifname = %l.name, ifindex = l.index, allocated_ms_ago = ago.as_millis() as u64,
                        "keeping a link that looks leaked: its device was allocated within the grace period");
                    continue;
                }
            }
            due.push(l.clone());
        }
        due
    }

    /// One round: ask the kubelet, list links, delete what is due. Without a
    /// PodResources socket it logs that once and does nothing.
    pub async fn run_once(
        &mut self,
        resources: &[ResourceConfig],
        metrics: &Metrics,
    ) -> Result<RoundOutcome> {
        if !self.socket.exists() {
            if !self.said_socket_absent {
                info!(socket = %self.socket.display(), "no PodResources socket; leaked-link reclaim is skipped until it appears");
                self.said_socket_absent = true;
            }
            self.first_seen.clear();
            return Ok(RoundOutcome::Skipped);
        }
        self.said_socket_absent = false;
        // Links first: every link listed existed before PodResources answers.
        let links = tokio::task::spawn_blocking(|| Handle::current()?.list_links())
            .await
            .map_err(|e| Error::Task(format!("the task listing links failed: {e}")))??;
        let allocated = list_allocated(&self.socket, POD_RESOURCES_WAIT).await?;
        let dev_dir = self.dev_dir.clone();
        let lost = lost_devices(&allocated, &self.assignments, &links, |i| {
            tap_node_path(&dev_dir, i).exists()
        });
        if !lost.is_empty() {
            let resources = resources.to_vec();
            let healed = tokio::task::spawn_blocking(move || heal(&lost, &resources, &dev_dir))
                .await
                .map_err(|e| {
                    Error::Task(format!("the task re-creating lost links failed: {e}"))
                })??;
            metrics.links_healed(healed);
        }
        let lowers: HashSet<String> = resources.iter().map(|r| r.lower_device.clone()).collect();
        self.clock
            .forget_older_than(self.grace.max(MIN_CLOCK_MEMORY), Instant::now());
        let mut leaked = leaked_links(&links, &lowers, &allocated);
        leaked.extend(go_era_leaked_links(&links, resources, &allocated));
        let due = self.due(&leaked, Instant::now());
        debug!(leaked = leaked.len(), due = due.len(), "reclaim round done");
        if due.is_empty() {
            return Ok(RoundOutcome::Done);
        }
        let deleted = tokio::task::spawn_blocking(move || delete_links(&due))
            .await
            .map_err(|e| Error::Task(format!("the task deleting leaked links failed: {e}")))??;
        for id in &deleted {
            self.first_seen.remove(id);
            self.events.post(NodeEvent::LeakedLinkRemoved {
                link: id.0.clone(),
                ifindex: id.1,
            });
        }
        metrics.leaked_links_removed(deleted.len() as u64);
        Ok(RoundOutcome::Done)
    }
}

/// How a reclaim round ended, counted in `macvtap_dp_reclaim_rounds_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundOutcome {
    /// The round asked the kubelet and acted on its answer.
    Done,
    /// There was no PodResources socket, so the round did nothing.
    Skipped,
    /// The round failed (a netlink or PodResources error, logged).
    Failed,
}

impl RoundOutcome {
    /// The `outcome` label value.
    pub fn label(self) -> &'static str {
        match self {
            RoundOutcome::Done => "done",
            RoundOutcome::Skipped => "skipped",
            RoundOutcome::Failed => "failed",
        }
    }
}

/// Asks the PodResources API which device IDs of ours are allocated.
pub async fn list_allocated(socket: &Path, timeout: Duration) -> Result<HashSet<String>> {
    let channel = connect_unix(socket, timeout).await?;
    let mut client = PodResourcesListerClient::new(channel);
    let resp = tokio::time::timeout(timeout, client.list(ListPodResourcesRequest {}))
        .await
        .map_err(|_| Error::Grpc {
            op: "listing pod resources".into(),
            status: Box::new(tonic::Status::deadline_exceeded(format!(
                "no answer within {} ms",
                timeout.as_millis()
            ))),
        })?
        .map_err(|status| Error::Grpc {
            op: "listing pod resources".into(),
            status: Box::new(status),
        })?;
    Ok(allocated_ids(resp.get_ref()))
}

/// Re-creates each lost device's macvtap with its old ifindex; returns how
/// many came back. A device whose ifindex is taken on the host, or whose
/// resource or NIC is gone, is logged and left.
fn heal(lost: &[Lost], resources: &[ResourceConfig], dev_dir: &Path) -> Result<u64> {
    let handle = Handle::current()?;
    let netns = Netns::current()?;
    let mut healed = 0;
    for l in lost {
        let Some(cfg) = resources.iter().find(|r| r.name == l.at.resource) else {
            warn!(device_id = %l.device_id, resource = %l.at.resource,
                "a pod holds this device but its macvtap is gone, and its resource is no longer configured: not re-created");
            continue;
        };
        let Some(lower) = handle.get_link(&cfg.lower_device)? else {
            warn!(device_id = %l.device_id, lower = %cfg.lower_device,
                "a pod holds this device but its macvtap is gone, and so is its NIC: not re-created");
            continue;
        };
        if let Some(other) = handle.get_link_by_index(l.at.ifindex)? {
            warn!(device_id = %l.device_id, ifindex = l.at.ifindex, other = %other.name,
                "a pod holds this device but its macvtap is gone, and its ifindex is now taken on the host, so /dev/tap{} cannot come back: the pod needs to be re-created", l.at.ifindex);
            continue;
        }
        match allocate::recreate_device(
            &handle,
            &netns,
            cfg,
            &lower,
            &l.device_id,
            l.at.ifindex,
            dev_dir,
        ) {
            Ok(link) => {
                healed += 1;
                info!(device_id = %l.device_id, ifname = %link.name, ifindex = link.index,
                    "re-created the macvtap of a device a pod still holds (its namespace went without CNI DEL), so the sandbox's retried ADD finds it");
            }
            Err(e) => {
                warn!(device_id = %l.device_id, error = %e, "could not re-create a lost macvtap")
            }
        }
    }
    Ok(healed)
}

fn identity(l: &Link) -> LinkIdentity {
    (l.name.clone(), l.index)
}

fn delete_links(links: &[Link]) -> Result<Vec<LinkIdentity>> {
    let handle = Handle::current()?;
    let mut deleted = Vec::new();
    for l in links {
        match handle.del_link(l.index, &l.name) {
            Ok(()) => {
                info!(ifname = %l.name, "deleted a leaked macvtap (allocated to no pod)");
                deleted.push(identity(l));
            }
            Err(e) if e.errno() == Some(Errno::ENODEV) => {}
            Err(e) => warn!(ifname = %l.name, error = %e, "could not delete a leaked macvtap"),
        }
    }
    Ok(deleted)
}

/// Runs [`Reclaimer::run_once`] every `interval` with the current resources.
/// Also runs a round as soon as `tap_gone` reports a tap node deleted.
pub async fn reclaim_loop(
    mut reclaimer: Reclaimer,
    interval: Duration,
    resources: tokio::sync::watch::Receiver<Vec<ResourceConfig>>,
    metrics: Arc<Metrics>,
    mut tap_gone: tokio::sync::mpsc::UnboundedReceiver<()>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watching = true;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            got = tap_gone.recv(), if watching => {
                if got.is_none() {
                    watching = false;
                    continue;
                }
                // One round for a burst of deletions.
                while tap_gone.try_recv().is_ok() {}
            }
        }
        let current = resources.borrow().clone();
        let outcome = match reclaimer.run_once(&current, &metrics).await {
            Ok(outcome) => outcome,
            Err(e) => {
                warn!(error = %e, "leaked-link reclaim round failed");
                RoundOutcome::Failed
            }
        };
        metrics.reclaim_round(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_proto::podresources::v1::{ContainerDevices, ContainerResources, PodResources};

    fn link(index: u32, name: &str, kind: &str, lower: Option<u32>) -> Link {
        Link {
            index,
            name: name.into(),
            kind: Some(kind.into()),
            lower_index: lower,
            ..Default::default()
        }
    }

    #[test]
    fn lost_devices_are_held_handed_out_and_gone_everywhere() {
        let a = Assignments::default();
        a.assigned("dpMvp1", "dp", 40);
        a.assigned("dpMvp2", "dp", 41);
        a.assigned("dpMvp3", "dp", 42);
        a.assigned("dpMvp4", "dp", 43);
        let allocated: HashSet<String> = ["dpMvp1", "dpMvp2", "dpMvp3", "dpMvp5"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        // dpMvp1: its link is on the host (returned by DEL, or not yet moved).
        let links = vec![link(
            40,
            &link_name_for_device("dpMvp1"),
            "macvtap",
            Some(2),
        )];
        // dpMvp2: its tap node exists, so the link lives in some pod.
        let lost = lost_devices(&allocated, &a, &links, |i| i == 41);
        // dpMvp3 is lost; dpMvp4 is held by no pod; dpMvp5 was never handed out here.
        assert_eq!(
            lost,
            vec![Lost {
                device_id: "dpMvp3".into(),
                at: Assigned {
                    resource: "dp".into(),
                    ifindex: 42
                }
            }]
        );
    }

    #[test]
    fn tap_indexes_come_from_device_specs() {
        assert_eq!(tap_index("/dev/tap42"), Some(42));
        assert_eq!(tap_index("/dev/tapx"), None);
        assert_eq!(tap_index("/dev/net/tun"), None);
    }

    #[test]
    fn allocated_ids_are_ours_only() {
        let resp = ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "vm".into(),
                namespace: "default".into(),
                containers: vec![ContainerResources {
                    name: "compute".into(),
                    devices: vec![
                        ContainerDevices {
                            resource_name: "macvtap.network.kubevirt.io/eth0".into(),
                            device_ids: vec!["eth0Mvp1".into()],
                            topology: None,
                        },
                        ContainerDevices {
                            resource_name: "nvidia.com/gpu".into(),
                            device_ids: vec!["GPU-1".into()],
                            topology: None,
                        },
                    ],
                    ..Default::default()
                }],
            }],
        };
        assert_eq!(
            allocated_ids(&resp),
            HashSet::from(["eth0Mvp1".to_string()])
        );
    }

    #[test]
    fn only_unallocated_device_macvtaps_on_our_nics_are_leaked() {
        let used = link_name_for_device("eth0Mvp1");
        let free = link_name_for_device("eth0Mvp2");
        let links = vec![
            link(2, "eth0", "veth", None),
            link(3, "eth9", "veth", None),
            link(10, &used, "macvtap", Some(2)),
            link(11, &free, "macvtap", Some(2)),
            link(12, &link_name_for_device("eth9Mvp0"), "macvtap", Some(3)),
            link(13, "macvtap0", "macvtap", Some(2)),
            link(14, &link_name_for_device("eth0Mvp3"), "macvlan", Some(2)),
        ];
        let lowers = HashSet::from(["eth0".to_string()]);
        let allocated = HashSet::from(["eth0Mvp1".to_string()]);
        let leaked = leaked_links(&links, &lowers, &allocated);
        assert_eq!(leaked.iter().map(|l| l.index).collect::<Vec<_>>(), [11]);
    }

    #[test]
    fn go_era_links_of_our_resources_on_their_nics_are_leaked_when_unallocated() {
        let links = vec![
            link(2, "eth0", "veth", None),
            link(3, "eth9", "veth", None),
            link(10, "dpMvp1", "macvtap", Some(2)),
            link(11, "dpMvp2", "macvtap", Some(2)),
            // Another resource's name, the wrong NIC, not a macvtap, no shape.
            link(12, "otherMvp0", "macvtap", Some(2)),
            link(13, "dpMvp3", "macvtap", Some(3)),
            link(14, "dpMvp4", "macvlan", Some(2)),
            link(15, "dpMvpx", "macvtap", Some(2)),
            Link {
                lower_in_other_netns: true,
                ..link(16, "dpMvp5", "macvtap", Some(2))
            },
        ];
        let resources = vec![ResourceConfig {
            name: "dp".into(),
            lower_device: "eth0".into(),
            mode: macvtap_link::MacvtapMode::Bridge,
            capacity: 10,
        }];
        let allocated = HashSet::from(["dpMvp1".to_string()]);
        let leaked = go_era_leaked_links(&links, &resources, &allocated);
        assert_eq!(leaked.iter().map(|l| l.index).collect::<Vec<_>>(), [11]);
        // The mvt… scan never picks them up itself.
        let lowers = HashSet::from(["eth0".to_string()]);
        assert!(leaked_links(&links, &lowers, &HashSet::new()).is_empty());
    }

    /// A reclaimer with a 60 s grace period and no PodResources socket.
    fn reclaimer(clock: AllocationClock) -> Reclaimer {
        Reclaimer::new("/nonexistent".into(), Duration::from_secs(60), clock)
    }

    #[test]
    fn links_are_due_only_after_the_grace_period() {
        let mut r = reclaimer(AllocationClock::default());
        let l = vec![link(11, "mvt000000000001", "macvtap", Some(2))];
        let t0 = Instant::now();
        assert!(r.due(&l, t0).is_empty());
        assert!(r.due(&l, t0 + Duration::from_secs(30)).is_empty());
        assert_eq!(r.due(&l, t0 + Duration::from_secs(61)).len(), 1);
        // A link that stops looking leaked starts over.
        assert!(r.due(&[], t0 + Duration::from_secs(62)).is_empty());
        assert!(r.due(&l, t0 + Duration::from_secs(63)).is_empty());
    }

    #[test]
    fn a_recreated_link_starts_over() {
        let mut r = reclaimer(AllocationClock::default());
        let t0 = Instant::now();
        assert!(
            r.due(&[link(11, "mvt000000000001", "macvtap", Some(2))], t0)
                .is_empty()
        );
        // Same name, new ifindex: a new link, whose clock starts now.
        let again = vec![link(12, "mvt000000000001", "macvtap", Some(2))];
        assert!(r.due(&again, t0 + Duration::from_secs(61)).is_empty());
        assert_eq!(r.due(&again, t0 + Duration::from_secs(122)).len(), 1);
    }

    #[test]
    fn a_link_allocated_within_the_grace_period_is_kept() {
        let clock = AllocationClock::default();
        let mut r = reclaimer(clock.clone());
        let l = vec![link(11, "mvt000000000001", "macvtap", Some(2))];
        let t0 = Instant::now();
        assert!(r.due(&l, t0).is_empty());
        // Looked leaked for 100 s, but allocated again 10 s ago.
        clock.allocated("mvt000000000001", t0 + Duration::from_secs(90));
        assert!(r.due(&l, t0 + Duration::from_secs(100)).is_empty());
        assert!(r.due(&l, t0 + Duration::from_secs(149)).is_empty());
        assert_eq!(r.due(&l, t0 + Duration::from_secs(151)).len(), 1);
    }
}

//! The device list a resource advertises: IDs, health and NUMA topology.

use kubelet_proto::v1beta1::{Device, HEALTHY, NumaNode, TopologyInfo, UNHEALTHY};
use macvtap_link::device_id;

/// The full device list of resource `name` with `capacity` devices, all with
/// the same health and NUMA node (they share one lower NIC).
pub(crate) fn device_list(
    name: &str,
    capacity: u32,
    healthy: bool,
    numa: Option<i64>,
) -> Vec<Device> {
    let health = if healthy { HEALTHY } else { UNHEALTHY };
    let topology = numa.map(|id| TopologyInfo {
        nodes: vec![NumaNode { id }],
    });
    (0..capacity)
        .map(|i| Device {
            id: device_id(name, i),
            health: health.to_string(),
            topology: topology.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_has_capacity_devices_with_go_ids() {
        let l = device_list("eth0", 3, true, Some(1));
        let ids: Vec<_> = l.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["eth0Mvp0", "eth0Mvp1", "eth0Mvp2"]);
        assert!(l.iter().all(|d| d.health == "Healthy"));
        assert_eq!(l[0].topology.as_ref().unwrap().nodes[0].id, 1);
        let l = device_list("eth0", 2, false, None);
        assert!(
            l.iter()
                .all(|d| d.health == "Unhealthy" && d.topology.is_none())
        );
    }
}

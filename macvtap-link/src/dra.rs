//! The names a macvtap resource's devices have under Dynamic Resource
//! Allocation, which the device plugin publishes in its ResourceSlices and
//! the CNI reads back from the kubelet's PodResources answer.
//!
//! Each device of resource `<name>` is published as its own exclusive DRA
//! device, named by [`dra_device_name`] (a DNS label, as the API requires
//! of `Device.name`), with the attributes [`ATTR_RESOURCE_NAME`] (the
//! extended resource, `macvtap.network.kubevirt.io/<name>`) and
//! [`ATTR_DEVICE_ID`] (the device plugin's ID, `<name>Mvp<i>`), the two that
//! Multus' DRA lookup (multus-cni `pkg/draclient/draclient.go`) reads. So a
//! device has the same ID, the same link name and the same tap node under
//! both fronts.

use crate::device::{RESOURCE_PREFIX, device_id};
use xxhash_rust::xxh64::xxh64;

/// The DRA driver name: the ResourceSlices' `spec.driver`, the DeviceClasses'
/// selector, the kubelet plugin's name and its sockets' directory.
pub const DRIVER: &str = RESOURCE_PREFIX;

/// The device attribute carrying the extended resource name a NAD's
/// `k8s.v1.cni.cncf.io/resourceName` annotation names.
pub const ATTR_RESOURCE_NAME: &str = "k8s.cni.cncf.io/resourceName";

/// The device attribute carrying the device plugin's device ID, which a
/// Multus with DRA support passes to the CNI as `deviceID`.
pub const ATTR_DEVICE_ID: &str = "k8s.cni.cncf.io/deviceID";

/// The device attribute naming the host NIC the device's macvtap sits on.
pub const ATTR_NIC: &str = "macvtap.network.kubevirt.io/nic";

/// The device attribute naming the macvtap mode (`bridge`, `vepa`, ...).
pub const ATTR_MODE: &str = "macvtap.network.kubevirt.io/mode";

/// The CDI kind of our devices: vendor `macvtap.network.kubevirt.io`,
/// class `tap`.
pub const CDI_KIND: &str = "macvtap.network.kubevirt.io/tap";

/// The CDI device name of device `device_id` prepared for claim
/// `claim_uid`: `<claim UID>_<device ID>` (a Kubernetes UID has no `_`,
/// so the first `_` splits them; both parts are CDI name characters).
pub fn cdi_device_name(claim_uid: &str, device_id: &str) -> String {
    format!("{claim_uid}_{device_id}")
}

/// The fully qualified CDI device ID the kubelet passes to the runtime and
/// lists in PodResources (`macvtap.network.kubevirt.io/tap=<name>`).
pub fn cdi_device_id(claim_uid: &str, device_id: &str) -> String {
    format!("{CDI_KIND}={}", cdi_device_name(claim_uid, device_id))
}

/// The device ID a CDI device ID of ours names, the inverse of
/// [`cdi_device_id`]; `None` for another kind's or a malformed one.
pub fn device_id_of_cdi(cdi_id: &str) -> Option<&str> {
    let name = cdi_id.strip_prefix(CDI_KIND)?.strip_prefix('=')?;
    let (uid, id) = name.split_once('_')?;
    (!uid.is_empty() && crate::device::parse_device_id(id).is_some()).then_some(id)
}

/// Longest string value of a device attribute the API accepts
/// (`resource.k8s.io/v1` `DeviceAttribute.string`).
pub const MAX_ATTRIBUTE_VALUE: usize = 64;

/// Longest DNS label, the API's limit on a device name.
const MAX_LABEL: usize = 63;

/// Longest prefix of a device name: the label less `-mvp-` and the ten
/// digits of the largest index, so every index of a resource fits.
const MAX_PREFIX: usize = MAX_LABEL - "-mvp-".len() - 10;

/// Why resource `name` cannot be served through DRA, or `None` if it can:
/// its extended resource name must fit a device attribute's value.
pub fn dra_name_problem(name: &str) -> Option<String> {
    let resource = format!("{RESOURCE_PREFIX}/{name}");
    let id = device_id(name, u32::MAX);
    if resource.len() > MAX_ATTRIBUTE_VALUE {
        return Some(format!(
            "{resource} is {} characters, and a DRA device attribute holds at most {MAX_ATTRIBUTE_VALUE}: \
             give the resource a name of at most {} characters to serve it through DRA",
            resource.len(),
            MAX_ATTRIBUTE_VALUE - RESOURCE_PREFIX.len() - 1
        ));
    }
    // The device ID is shorter than the resource name for every name that
    // passed the check above, but say so if that ever changes.
    if id.len() > MAX_ATTRIBUTE_VALUE {
        return Some(format!(
            "device IDs of {name} are up to {} characters, more than a DRA device attribute holds ({MAX_ATTRIBUTE_VALUE})",
            id.len()
        ));
    }
    None
}

/// Whether `s` is already a DNS label short enough to be a prefix as it is.
fn plain_prefix(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_PREFIX
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The part of every device name of resource `name` before `-mvp-<i>`: the
/// name itself when it is a short lower-case DNS label, else its letters
/// and digits lower-cased (other characters as `-`), cut to fit, then `-`
/// and 8 hex digits of its xxhash64, so two names never share a prefix by
/// being spelled alike.
pub fn dra_device_prefix(name: &str) -> String {
    if plain_prefix(name) {
        return name.to_string();
    }
    let hash = xxh64(name.as_bytes(), 0) & 0xffff_ffff;
    let keep = MAX_PREFIX - 9;
    let label: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(keep)
        .collect();
    let label = label.trim_matches('-');
    if label.is_empty() {
        format!("x{hash:08x}")
    } else {
        format!("{label}-{hash:08x}")
    }
}

/// The DRA device name of the `index`-th device of resource `name`, e.g.
/// `eth1-mvp-3` for `eth1Mvp3`.
pub fn dra_device_name(name: &str, index: u32) -> String {
    format!("{}-mvp-{index}", dra_device_prefix(name))
}

/// The index of DRA device `device` of resource `name` if it is one of its
/// first `capacity` devices, the inverse of [`dra_device_name`].
pub fn dra_device_index(name: &str, capacity: u32, device: &str) -> Option<u32> {
    let prefix = dra_device_prefix(name);
    let index = device.strip_prefix(&prefix)?.strip_prefix("-mvp-")?;
    let canonical = !index.is_empty()
        && index.bytes().all(|b| b.is_ascii_digit())
        && (index == "0" || !index.starts_with('0'));
    if !canonical {
        return None;
    }
    index.parse().ok().filter(|i| *i < capacity)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_dns_label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    #[test]
    fn a_cdi_device_id_names_its_device_id() {
        let id = cdi_device_id("0b5e4c9a-1111-2222-3333-444455556666", "eth_1Mvp3");
        assert_eq!(
            id,
            "macvtap.network.kubevirt.io/tap=0b5e4c9a-1111-2222-3333-444455556666_eth_1Mvp3"
        );
        assert_eq!(device_id_of_cdi(&id), Some("eth_1Mvp3"));
        for other in [
            "vendor.example.com/gpu=u_eth1Mvp0",
            "macvtap.network.kubevirt.io/tap=u-eth1Mvp0",
            "macvtap.network.kubevirt.io/tap=_eth1Mvp0",
            "macvtap.network.kubevirt.io/tap=u_eth1",
        ] {
            assert_eq!(device_id_of_cdi(other), None, "{other}");
        }
    }

    #[test]
    fn a_plain_name_keeps_its_spelling() {
        assert_eq!(dra_device_name("eth1", 3), "eth1-mvp-3");
        assert_eq!(dra_device_name("dataplane", 0), "dataplane-mvp-0");
        assert_eq!(dra_device_index("eth1", 4, "eth1-mvp-3"), Some(3));
    }

    #[test]
    fn every_valid_resource_name_gives_dns_labels_that_read_back() {
        let names = [
            "eth1",
            "ens5f0",
            "Eth1",
            "eth_1",
            "eth.1",
            "eth-1",
            "_x_",
            "...",
            "a-very-long-resource-name-that-is-still-valid-of-63-characters1",
            "UPPER",
        ];
        for name in names {
            for i in [0, 7, 99, u32::MAX] {
                let d = dra_device_name(name, i);
                assert!(is_dns_label(&d), "{name} {i}: {d:?} is not a DNS label");
                assert_eq!(
                    dra_device_index(name, u32::MAX, &d),
                    (i < u32::MAX).then_some(i)
                );
            }
        }
    }

    #[test]
    fn names_spelled_alike_get_distinct_prefixes() {
        let names = ["eth_1", "eth.1", "eth-1", "Eth-1", "ETH-1"];
        let prefixes: std::collections::BTreeSet<String> =
            names.iter().map(|n| dra_device_prefix(n)).collect();
        assert_eq!(prefixes.len(), names.len(), "{prefixes:?}");
    }

    #[test]
    fn another_resources_or_out_of_range_devices_are_not_read_as_ours() {
        assert_eq!(dra_device_index("eth1", 4, "eth1-mvp-4"), None);
        assert_eq!(dra_device_index("eth1", 4, "eth10-mvp-1"), None);
        assert_eq!(dra_device_index("eth1", 4, "eth1-mvp-01"), None);
        assert_eq!(dra_device_index("eth1", 4, "eth1-mvp-"), None);
        assert_eq!(dra_device_index("eth1", 4, "eth1-mvp--1"), None);
        assert_eq!(dra_device_index("eth1", 4, "eth1Mvp1"), None);
        assert_eq!(dra_device_index("eth", 4, "eth1-mvp-1"), None);
    }

    #[test]
    fn a_name_too_long_for_the_resource_attribute_is_refused_by_name() {
        assert_eq!(dra_name_problem("eth1"), None);
        let longest_ok = "a".repeat(MAX_ATTRIBUTE_VALUE - RESOURCE_PREFIX.len() - 1);
        assert_eq!(dra_name_problem(&longest_ok), None);
        let too_long = format!("{longest_ok}b");
        let why = dra_name_problem(&too_long).unwrap();
        assert!(why.contains("at most 36 characters"), "{why}");
    }
}

//! Device IDs and the link names derived from them.
//!
//! These values are fixed by compatibility with kubevirt/macvtap-cni: a pod
//! scheduled with the Go device plugin and this CNI (or the other way round)
//! must find the same link.

use xxhash_rust::xxh64::xxh64;

/// Prefix of every extended resource this project advertises.
pub const RESOURCE_PREFIX: &str = "macvtap.network.kubevirt.io";

/// Prefix of every macvtap link name made for a device ID.
pub const LINK_PREFIX: &str = "mvt";

/// The device ID of the `index`-th device of resource `name`, e.g. `eth0Mvp3`.
pub fn device_id(name: &str, index: u32) -> String {
    format!("{name}Mvp{index}")
}

/// The macvtap link name for a device ID: `mvt` and 12 hex digits of its
/// xxhash64 (seed 0), always 15 bytes so it fits `IFNAMSIZ`.
pub fn link_name_for_device(device_id: &str) -> String {
    let hash = xxh64(device_id.as_bytes(), 0) & 0xffff_ffff_ffff;
    format!("{LINK_PREFIX}{hash:012x}")
}

/// Whether a link name has the shape of a name made by [`link_name_for_device`].
pub fn is_device_link_name(name: &str) -> bool {
    name.len() == 15
        && name.starts_with(LINK_PREFIX)
        && name[LINK_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Splits a device ID `<name>Mvp<i>` into the resource name and the index,
/// or `None` when it does not have that shape. The Go device plugin's last
/// release (v0.13.1) named each link after its device ID, so this also
/// recognises the links it made.
pub fn parse_device_id(id: &str) -> Option<(&str, u32)> {
    let (name, index) = id.rsplit_once("Mvp")?;
    let name_ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let index_ok = !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit());
    if !name_ok || !index_ok {
        return None;
    }
    Some((name, index.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_names_match_the_go_project() {
        assert_eq!(link_name_for_device("eth0Mvp0"), "mvtf2644cc3624e");
        assert_eq!(link_name_for_device("eth0Mvp7"), "mvted95a7da7eb8");
        assert_eq!(link_name_for_device("dataplaneMvp42"), "mvt1d9e32f0b2c5");
    }

    #[test]
    fn link_names_fit_ifnamsiz_and_are_recognised() {
        for i in 0..1000 {
            let name = link_name_for_device(&device_id("nic", i));
            assert_eq!(name.len(), 15);
            assert!(is_device_link_name(&name), "{name}");
        }
        assert!(!is_device_link_name("eth0"));
        assert!(!is_device_link_name("mvtXYZ000000000"));
    }

    #[test]
    fn device_ids_have_the_go_shape() {
        assert_eq!(device_id("dataplane", 42), "dataplaneMvp42");
        assert_eq!(parse_device_id("dataplaneMvp42"), Some(("dataplane", 42)));
        assert_eq!(parse_device_id("aMvpbMvp3"), Some(("aMvpb", 3)));
        for bad in [
            "eth0",
            "Mvp1",
            "eth0Mvp",
            "eth0Mvpx",
            "a/bMvp1",
            "eth0Mvp99999999999",
        ] {
            assert_eq!(parse_device_id(bad), None, "{bad}");
        }
    }
}

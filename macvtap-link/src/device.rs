//! Device IDs and the link names derived from them.
//!
//! These values are fixed by compatibility with kubevirt/macvtap-cni: a pod
//! scheduled with the Go device plugin and this CNI (or the other way round)
//! must find the same link.

use xxhash_rust::xxh64::xxh64;

/// Prefix of every extended resource this project advertises.
pub const RESOURCE_PREFIX: &str = "macvtap.network.kubevirt.io";

/// Prefix of every macvtap link name made for a device ID.
pub(crate) const LINK_PREFIX: &str = "mvt";

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

/// What a link name says about the device it was made for, as
/// [`parse_link_name`] reads it: the two names a device's link has had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceLinkName<'a> {
    /// `mvt` + 12 lower-case hex digits, made by [`link_name_for_device`]:
    /// the device ID cannot be read back from it.
    Hashed,
    /// The Go device plugin's v0.13.1 name: the device ID `<resource>Mvp<index>`
    /// itself, when it fits `IFNAMSIZ`.
    GoEra {
        /// The resource's short name.
        resource: &'a str,
        /// The device's index.
        index: u32,
    },
}

/// The one reading of a link name both binaries use: the device plugin's
/// hashed name, the Go project's v0.13.1 name (the device ID), or `None` for
/// any other name.
pub fn parse_link_name(name: &str) -> Option<DeviceLinkName<'_>> {
    let hashed = name.len() == 15
        && name.starts_with(LINK_PREFIX)
        && name[LINK_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if hashed {
        return Some(DeviceLinkName::Hashed);
    }
    if name.len() > 15 {
        return None;
    }
    let (resource, index) = parse_device_id(name)?;
    Some(DeviceLinkName::GoEra { resource, index })
}

/// Whether `name` is the link of one of the first `capacity` devices of
/// `resource`, under either name a device's link has had ([`parse_link_name`]).
pub fn is_link_of_resource(name: &str, resource: &str, capacity: u32) -> bool {
    match parse_link_name(name) {
        Some(DeviceLinkName::Hashed) => {
            (0..capacity).any(|i| link_name_for_device(&device_id(resource, i)) == name)
        }
        Some(DeviceLinkName::GoEra { resource: r, index }) => r == resource && index < capacity,
        None => false,
    }
}

/// Splits a device ID `<name>Mvp<i>` into the resource name and the index,
/// or `None` when it does not have exactly the shape [`device_id`] makes
/// (a name of letters, digits, `-`, `_` and `.`; an index without sign or
/// leading zero that fits `u32`): the one device-ID grammar of both
/// binaries. The Go device plugin's last release (v0.13.1) named each link
/// after its device ID, so this also reads the links it made
/// ([`parse_link_name`]).
pub fn parse_device_id(id: &str) -> Option<(&str, u32)> {
    let (name, index) = id.rsplit_once("Mvp")?;
    let name_ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let index_ok = !index.is_empty()
        && index.bytes().all(|b| b.is_ascii_digit())
        && (index == "0" || !index.starts_with('0'));
    if !name_ok || !index_ok {
        return None;
    }
    Some((name, index.parse().ok()?))
}

/// The index of device `id` of resource `name` if it is one of its first
/// `capacity` devices (`<name>Mvp<i>` with `i < capacity`, by
/// [`parse_device_id`]).
pub fn device_index(name: &str, capacity: u32, id: &str) -> Option<u32> {
    parse_device_id(id)
        .filter(|(n, i)| *n == name && *i < capacity)
        .map(|(_, i)| i)
}

/// Checks that `name` may follow `macvtap.network.kubevirt.io/` in an
/// extended resource name: a Kubernetes qualified name's name part (1 to 63
/// letters, digits, `-`, `_` and `.`, starting and ending with a letter or
/// digit). The error says what is wrong, quoting `name` escaped.
pub fn check_resource_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name after the prefix is empty".into());
    }
    if name.len() > 63 {
        return Err(format!(
            "the name after the prefix is {} characters, more than the 63 a resource name allows",
            name.len()
        ));
    }
    let inner_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let ends_ok = name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !ends_ok || !name.chars().all(inner_ok) {
        return Err(format!(
            "{name:?} is not a resource name (letters, digits, '-', '_' and '.', starting and \
             ending with a letter or digit)"
        ));
    }
    Ok(())
}

/// The name `<name>` of an extended resource of ours written in full,
/// `macvtap.network.kubevirt.io/<name>`, by [`check_resource_name`]; the
/// error says what is wrong.
pub fn resource_short_name(full: &str) -> Result<&str, String> {
    let name = full
        .strip_prefix(RESOURCE_PREFIX)
        .and_then(|rest| rest.strip_prefix('/'))
        .ok_or_else(|| format!("it does not start with {RESOURCE_PREFIX}/"))?;
    check_resource_name(name)?;
    Ok(name)
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
            assert_eq!(
                parse_link_name(&name),
                Some(DeviceLinkName::Hashed),
                "{name}"
            );
        }
        assert_eq!(parse_link_name("eth0"), None);
        assert_eq!(parse_link_name("mvtXYZ000000000"), None);
    }

    #[test]
    fn link_names_are_hashed_or_the_go_projects() {
        assert_eq!(
            parse_link_name("mvt0123456789ab"),
            Some(DeviceLinkName::Hashed)
        );
        assert_eq!(
            parse_link_name("eth0Mvp12"),
            Some(DeviceLinkName::GoEra {
                resource: "eth0",
                index: 12
            })
        );
        assert!(matches!(
            parse_link_name("dp.x-1_Mvp0"),
            Some(DeviceLinkName::GoEra { .. })
        ));
        for bad in [
            "eth0",
            "mvt0123456789aB",
            "mvt0123456789abc",
            "Mvp1",
            "eth0Mvp",
            "eth0Mvpx",
            "eth0Mvp01",
            "a/bMvp1",
            "averylongnameMvp1",
            "",
        ] {
            assert_eq!(parse_link_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_resources_links_have_either_name() {
        assert!(is_link_of_resource("dpMvp3", "dp", 4));
        assert!(is_link_of_resource(
            &link_name_for_device("dpMvp3"),
            "dp",
            4
        ));
        assert!(!is_link_of_resource("dpMvp4", "dp", 4));
        assert!(!is_link_of_resource(
            &link_name_for_device("dpMvp4"),
            "dp",
            4
        ));
        assert!(!is_link_of_resource("dqMvp0", "dp", 4));
        assert!(!is_link_of_resource("eth0", "dp", 4));
    }

    #[test]
    fn only_own_ids_within_capacity_are_recognised() {
        assert_eq!(device_index("eth0", 10, "eth0Mvp9"), Some(9));
        assert_eq!(device_index("eth0", 10, "eth0Mvp0"), Some(0));
        assert_eq!(device_index("eth0", 10, "eth0Mvp10"), None);
        assert_eq!(device_index("eth0", 10, "eth1Mvp1"), None);
        assert_eq!(device_index("eth0", 10, "eth0Mvp01"), None);
        assert_eq!(device_index("eth0", 10, "eth0Mvp+1"), None);
        assert_eq!(device_index("eth0", 10, "eth0Mvp"), None);
        assert_eq!(device_index("eth", 10, "eth0Mvp1"), None);
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
            "eth0Mvp01",
            "eth0Mvp+1",
            "a/bMvp1",
            "eth0Mvp99999999999",
        ] {
            assert_eq!(parse_device_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn full_resource_names_are_ours_and_well_formed() {
        assert_eq!(
            resource_short_name("macvtap.network.kubevirt.io/eth1"),
            Ok("eth1")
        );
        assert_eq!(
            resource_short_name("macvtap.network.kubevirt.io/a.b-c_9"),
            Ok("a.b-c_9")
        );
        let long = format!("macvtap.network.kubevirt.io/{}", "a".repeat(64));
        for bad in [
            "eth1",
            "intel.com/sriov",
            "macvtap.network.kubevirt.io",
            "macvtap.network.kubevirt.io/",
            "macvtap.network.kubevirt.io/-a",
            "macvtap.network.kubevirt.io/a/b",
            "macvtap.network.kubevirt.io/a\nb",
            "macvtap.network.kubevirt.io/../x",
            "macvtap.network.kubevirt.ioX/a",
            long.as_str(),
        ] {
            let e = resource_short_name(bad).unwrap_err();
            assert!(!e.contains('\n'), "{e}");
        }
    }
}

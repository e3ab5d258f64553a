//! Interface names: the one rule both binaries apply to a name they hand to
//! the kernel (the CNI's `CNI_IFNAME`, the device plugin's `lowerDevice`).
//!
//! The kernel refuses an empty name, one of `IFNAMSIZ` (16) bytes or more,
//! `.` and `..`, names with `/`, `:` or whitespace (`dev_valid_name`), and
//! `all` and `default`, the namespace-wide entries of
//! `/proc/sys/net/ipv{4,6}/conf/` (`EINVAL`). This rule refuses the same,
//! and control characters too: the kernel takes them, but such a name would
//! reach logs and messages raw.

use crate::error::{Error, Result};

/// The longest interface name the kernel accepts, in bytes (`IFNAMSIZ` - 1).
pub(crate) const MAX_IFNAME_LEN: usize = 15;

/// Checks that `name` is an interface name the kernel accepts and that
/// names no namespace-wide setting; the error says which rule it breaks.
pub fn check_ifname(name: &str) -> Result<()> {
    let reason = if name.is_empty() || name.len() > MAX_IFNAME_LEN {
        "1 to 15 bytes"
    } else if matches!(name, "." | ".." | "all" | "default") {
        "., .., all and default are reserved"
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
    {
        "no '/', ':', whitespace or control characters"
    } else {
        return Ok(());
    };
    Err(Error::InvalidIfname {
        name: name.to_string(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_kernel_takes_pass() {
        for good in [
            "eth0",
            "net1",
            "a",
            "mvtf2644cc3624e",
            "br-0.100",
            "ens3f0np0",
        ] {
            check_ifname(good).unwrap();
        }
    }

    #[test]
    fn each_broken_rule_is_named() {
        for (bad, reason) in [
            ("", "1 to 15 bytes"),
            ("0123456789abcdef", "1 to 15 bytes"),
            (".", "reserved"),
            ("..", "reserved"),
            ("all", "reserved"),
            ("default", "reserved"),
            ("a/b", "no '/'"),
            ("a:1", "no '/'"),
            ("a b", "whitespace"),
            ("a\tb", "whitespace"),
            ("a\u{7}b", "control characters"),
            ("a\u{85}b", "control characters"),
        ] {
            let e = check_ifname(bad).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("{bad:?} is not a valid interface name (")),
                "{bad:?}: {e}"
            );
            assert!(e.contains(reason), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_limit_is_in_bytes() {
        check_ifname("ééééééé").unwrap();
        assert!(check_ifname("éééééééé").is_err(), "16 bytes");
    }
}

//! The contract shared by the macvtap device plugin and the macvtap CNI plugin.
//!
//! The device plugin creates a macvtap link for a device ID in the host
//! network namespace; the CNI finds that same link by the same name and moves
//! it into a pod. Everything both sides must agree on lives here exactly once:
//! how a device ID maps to a link name ([`device`]) and to a DRA device name
//! ([`dra`]), which interface names
//! are valid ([`ifname`]), the CNI's node settings file ([`settings`]), how
//! network namespaces are held and entered ([`netns`]), the netlink link,
//! address and route operations ([`netlink`], [`link`], [`addr`],
//! [`route`]) and how `/dev/tapN` is matched to its link ([`tapdev`]). The
//! operations both binaries use sit behind [`kernel::Kernel`] and
//! [`kernel::Links`] (real in [`Linux`] and [`Handle`]), so that unit tests
//! drive every failure path on a fake (`test_support::fake`).

pub mod addr;
pub mod device;
pub mod dra;
pub mod error;
pub mod ifname;
pub mod kernel;
pub mod link;
pub mod linux;
pub mod monitor;
pub mod netlink;
pub mod netns;
pub mod op;
pub mod route;
pub mod settings;
pub mod tapdev;

pub use addr::Address;
pub use device::{
    DeviceLinkName, RESOURCE_PREFIX, check_resource_name, device_id, device_index,
    is_link_of_resource, link_name_for_device, parse_device_id, parse_link_name,
    resource_short_name,
};
pub use error::{Error, Result};
pub use ifname::check_ifname;
pub use kernel::{Kernel, Links};
pub use link::{Link, LinkChange, MacvtapMode};
pub use linux::Linux;
pub use netlink::Handle;
pub use netns::Netns;
pub use op::Op;
pub use route::DefaultRoute;
pub use settings::{
    CNI_ABOUT_PREFIX, CNI_SETTINGS_FILE, DEFAULT_KUBELET_DIR, NodeSettingsFile, PodResourcesCheck,
    admin_only,
};

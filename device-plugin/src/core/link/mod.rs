//! A device's macvtap: made or reused ([`create`]), a refusal of the
//! kernel's explained ([`refusal`]), its tap node checked ([`devfs`], with
//! [`mountinfo`] for why a node never appears), and the devices of one
//! request made all or none ([`prepare`]).

mod create;
mod devfs;
mod mountinfo;
mod prepare;
mod refusal;

pub use create::{PreparedDevice, Recreated, create_device, recreate_device, unusable_reason};
pub use mountinfo::{missing_tap_node_cause, not_devtmpfs};
pub use prepare::{check_ids, hand_out, prepare};

//! The macvtap device plugin.
//!
//! For each host NIC it is told about (or finds), it advertises the kubelet
//! extended resource `macvtap.network.kubevirt.io/<name>` with `capacity`
//! devices `<name>Mvp<i>`, serving the kubelet's device plugin API on
//! `<kubelet dir>/device-plugins/macvtap.network.kubevirt.io_<name>`. When
//! the kubelet allocates a device it creates the macvtap named by
//! [`macvtap_link::link_name_for_device`] on that NIC, in the host network
//! namespace, and hands the pod its `/dev/tapN`; the macvtap CNI then moves
//! the link into the pod.
//!
//! Map: [`core`] is the node's truth (NICs and health, the link table,
//! link creation and reuse, the ledger of what was handed out, heal,
//! reclaim, the host's namespace and paths on the kernel seam); the fronts
//! only translate: [`kubelet`] (the device plugin API: the tonic service,
//! Allocate, Register, the device list) and [`operator`] (metrics, Events,
//! `doctor`, HTTP). [`daemon`] is the loop wiring them; [`config`] (with
//! [`placement`], an entry's NIC and node selectors),
//! [`options`] and [`cli`] say what it is told (with the Go project's flags
//! in [`glog`]); `fswatch` is its one
//! inotify instance; [`install`] is the `install-cni` subcommand.

pub mod cli;
pub mod config;
pub mod core;
pub mod daemon;
pub mod dra;
pub mod error;
pub(crate) mod fswatch;
pub mod glog;
pub mod install;
pub mod kubelet;
pub mod logging;
pub mod operator;
pub mod options;
pub mod placement;
#[cfg(test)]
mod testdata;
#[cfg(test)]
mod testlog;

pub use error::{Error, Result};

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
//! Map: [`config`] (sources, precedence, validation), [`discovery`] and
//! [`links`] (which NICs exist, from netlink events), [`health`] and
//! [`topology`] (device health and NUMA), [`devices`] (the device list),
//! [`server`] and [`allocate`] (the gRPC service), [`registration`] and
//! [`fswatch`] (the kubelet's lifecycle), [`reclaim`] and [`heal`] (leaked and
//! lost links; [`assignment_file`] keeps what heal needs across restarts),
//! [`host`] (the kernel handle Allocate, reclaim and heal share),
//! [`events`] (Kubernetes Events on the Node), [`metrics`], [`procstat`],
//! [`liveness`] and [`http`] (observability), [`port`] (a port in the way of passthru), [`options`] (what the daemon is told, from
//! [`cli`]), [`daemon`] (the loop tying them together), [`doctor`] (the
//! `doctor` subcommand's checks of a node).

pub mod cli;
pub mod config;
pub mod core;
pub mod daemon;
pub mod error;
pub mod fswatch;
pub mod install;
pub mod kubelet;
pub mod logging;
pub mod operator;
pub mod options;

pub use error::{Error, Result};

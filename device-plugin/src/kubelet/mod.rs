//! The kubelet's device plugin front: it translates the kubelet's API to
//! the core's calls and back, and decides nothing. One tonic
//! `DevicePlugin` service per resource (`server`) that forwards
//! ListAndWatch to the resource's snapshot and Allocate to [`allocate`];
//! the resource's device list (`devices`); `Register` on the kubelet's
//! socket ([`register`]); what the servers share with the daemon
//! (`context`).

pub mod allocate;
pub(crate) mod context;
pub(crate) mod devices;
pub mod register;
pub(crate) mod server;

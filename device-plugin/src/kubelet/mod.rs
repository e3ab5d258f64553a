//! The kubelet's device plugin front: it translates the kubelet's API to
//! the core's calls and back, and decides nothing.

pub mod allocate;
pub mod devices;

//! End-to-end harness: a sandbox node made of network namespaces, the test
//! guest, the ways virt-launcher runs it, and the benchmarks. The tests in
//! `tests/`, the `sandbox` and the `bench` binaries drive the real
//! `macvtap-deviceplugin` and `macvtap` binaries with it.

pub mod bench;
pub mod cluster;
pub mod cpio;
pub mod exit;
pub mod guest;
pub mod host_kubelet;
pub mod icmp;
pub mod kubelet_socket;
pub mod manifests;
pub mod migration;
pub mod multus;
pub mod node;
pub mod node_locks;
pub mod qmp;
pub mod runtime;
pub mod sandbox;
pub mod soak;
pub mod steps;
pub mod switch;
pub mod vm;

//! End-to-end harness: a sandbox node made of network namespaces, the test
//! guest, and the ways virt-launcher runs it. The tests in `tests/` and the
//! `sandbox` binary drive the real `macvtap-deviceplugin` and `macvtap`
//! binaries with it.

pub mod cpio;
pub mod guest;
pub mod vm;

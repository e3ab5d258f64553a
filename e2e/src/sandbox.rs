//! Throwaway network namespaces for the e2e tests, the sandbox node and the
//! benchmarks: the workspace's one set, from the `test-support` crate.

pub use test_support::netns::{TestNs, ip, require_root, sh};

//! Fixtures that the kernel tests of every crate, the e2e harness, the
//! sandbox node and the benchmarks share, so that each exists once.
//!
//! - [`netns`]: the root check, `ip` runs that fail with their stderr, and
//!   [`TestNs`], a throwaway network namespace deleted on drop, with veth
//!   pairs as fake NICs.
//! - [`fake`]: [`FakeKernel`], an in-memory `macvtap_link::Kernel` for unit
//!   tests of every failure path without root.
//! - [`tapnode`]: how tests that run at once avoid two macvtaps claiming one
//!   `/dev/tapN`: [`tap_node_lock`] for tests whose macvtaps get
//!   kernel-chosen ifindexes, [`unique_ifindex`] for tests that choose one.
//! - [`gopeers`]: the Go programs the tests run beside ours (Multus, the
//!   reference CNI plugins, the Go project we replace), built from the Go
//!   module proxy by the pinned modules under `hack/peers/`.
//! - [`lockfile`]: [`flock`], an exclusive lock on a lock file, for
//!   fixtures that take turns across processes.
//! - [`capture`]: every frame an interface sees, from an `AF_PACKET`
//!   socket, for tests that show a link stayed silent or spoke.
//!
//! Errors are `anyhow` errors, as in the e2e harness: every caller either
//! prints them or fails a test with them, none matches on a variant (the
//! fake kernel answers with `macvtap_link::Error`, as the real one does).

pub mod capture;
pub mod fake;
pub mod gopeers;
pub mod lockfile;
pub mod netns;
pub mod tapnode;

pub use fake::FakeKernel;
pub use lockfile::flock;
pub use netns::{TestNs, ip, require_root, sh};
pub use tapnode::{TAP_NODE_LOCK, tap_node_lock, test_namespace_owner, unique_ifindex};

//! Benchmarks: our binaries against the kernel's floor and the reference
//! implementations, in one interleaved run. `hack/bench.sh` runs them.

pub mod burst;
pub mod churn;
pub mod cni;
pub mod datapath;
pub mod dp;
pub mod dra;
pub mod exec;
pub mod gobench;
pub mod migration;
pub mod plot;
pub mod report;
pub mod sizes;
pub mod soak;
pub mod stats;

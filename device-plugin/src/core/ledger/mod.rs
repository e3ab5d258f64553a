//! The ledger: what was handed out. The allocation clock (`clock`: when
//! each device's link was last handed out, which reclaim deletes by), the
//! record of which `/dev/tap<ifindex>` each device was handed out as
//! (`record`, for heal), and the record's file ([`record_file`]).

pub(crate) mod clock;
pub(crate) mod record;
pub mod record_file;

pub use clock::AllocationClock;
pub(crate) use record::Assigned;
pub use record::Assignments;

//! The ledger: what was handed out. The allocation clock ([`clock`]: when
//! each device's link was last handed out, which reclaim deletes by), the
//! record of which `/dev/tap<ifindex>` each device was handed out as
//! ([`record`], for heal), and the record's file ([`record_file`]).

pub mod clock;
pub mod record;
pub mod record_file;

pub use clock::{AllocationClock, ClockHold};
pub use record::{Assigned, Assignments};

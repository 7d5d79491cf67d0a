//! Time: when a job fires ([`Schedule`]: a cron expression in a time zone, with its
//! daylight saving policy, [`DstPolicy`]) and the wall clock it is read against ([`Clock`]: the
//! system's, or a [`ManualClock`] moved by hand in tests).

mod clock;
mod dst;
mod schedule;

pub use self::clock::{BoxFuture, Clock, ManualClock, SystemClock};
pub(crate) use self::clock::{earlier, instant_after, later};
pub use self::dst::{DstPolicy, Fold, Gap};
pub use self::schedule::Schedule;

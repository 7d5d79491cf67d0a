//! The lock keys a scheduler makes from its name and its jobs' names, and how long
//! those names may be so that every key fits.
//!
//! Every lock goes through [`redlock_core::Redlock`], which refuses a resource name
//! longer than its [`max_resource_len`](redlock_core::RedlockBuilder::max_resource_len)
//! (by default [`DEFAULT_MAX_RESOURCE_LEN`], 512 bytes). A scheduler named `S` with a
//! job named `J` takes these locks, and, with a [`History`](crate::History), fences its
//! runs' transactions under one more name:
//!
//! | what | resource | longest suffix |
//! | --- | --- | --- |
//! | leadership | `S:leader` | 7 bytes |
//! | a tick's claim | `S:job:J:<tick in Unix ms>` | 5 + 1 + [`TICK_MS_WIDTH`] (20) bytes |
//! | a run going on | `S:job:J:run` | 5 + 4 bytes |
//! | a run's transaction (the history's fence) | `run:<len of S>:S/J` | up to 4 + 3 + 2 bytes |
//!
//! The tick is reckoned at its widest (any `i64` of milliseconds, sign included), so a
//! name that fits today fits for every tick a schedule can give. So:
//!
//! - a **job name** may be at most [`max_job_name_len`]`(S, max_resource_len)` bytes:
//!   `max_resource_len - len(S) - 26` with the default limit (the claim is the longest
//!   key); the fence's names are held to [`DEFAULT_MAX_RESOURCE_LEN`] whatever the
//!   client's limit, so a client limit raised above it gains only up to
//!   `512 - len(S) - 6 - digits(len(S))`;
//! - a **scheduler name** may be at most [`max_scheduler_name_len`]`(max_resource_len)`
//!   bytes (485 by default): what leaves room for a job name of one byte.
//!
//! [`SchedulerBuilder::build`](crate::SchedulerBuilder::build) refuses a longer name
//! with [`BuildError::NameTooLong`](crate::error::BuildError), and a change made
//! at run time ([`Scheduler::add_job`](crate::Scheduler::add_job),
//! [`SchedulerAdmin::add_job`](crate::admin::SchedulerAdmin::add_job), ...) with
//! [`RequestError::NameTooLong`](crate::error::RequestError::NameTooLong), each giving
//! the bound in bytes.
//!
//! ```
//! use redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN;
//! use redlock_scheduler::keys::{max_job_name_len, max_scheduler_name_len};
//!
//! assert_eq!(max_scheduler_name_len(DEFAULT_MAX_RESOURCE_LEN), 485);
//! // `scheduler` (the default name) is 9 bytes: 512 - 9 - 26.
//! assert_eq!(max_job_name_len("scheduler", DEFAULT_MAX_RESOURCE_LEN), 477);
//! ```

pub use redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN;

pub use crate::error::build::NameKind;
use crate::error::build::{BuildError, NameTooLong};

/// The widest tick suffix a claim's resource can have: an `i64` of Unix milliseconds
/// written out, sign included (`-9223372036854775808`).
pub const TICK_MS_WIDTH: usize = 20;

/// The longest name the history's fence takes (a run's transaction is fenced under
/// `run:<len of S>:S/J`), whatever the client's limit.
pub const FENCE_MAX_RESOURCE_LEN: usize = DEFAULT_MAX_RESOURCE_LEN;

/// How many bytes of a refused name its error keeps (then `…`).
const START_LEN: usize = 64;

/// `S:leader`: what the scheduler `S`'s replicas campaign for.
pub(crate) fn leader(scheduler: &str) -> String {
    format!("{scheduler}:leader")
}

/// `S:job:J:<tick ms>`: the claim of one tick of the job `J`.
pub(crate) fn claim(scheduler: &str, job: &str, tick_ms: i64) -> String {
    format!("{scheduler}:job:{job}:{tick_ms}")
}

/// `S:job:J:run`: held by a run of the job `J` while it goes on.
pub(crate) fn run(scheduler: &str, job: &str) -> String {
    format!("{scheduler}:job:{job}:run")
}

/// `run:<len of S>:S/J`: the history's fence for the runs of the job `J`, which holds
/// the highest run lock token that committed (the scheduler's name is length-prefixed:
/// no two pairs of names give the same resource). Earlier versions fenced leadership
/// tokens under `<len of S>:S/J`: the prefix keeps those rows, whose tokens are not
/// comparable with run tokens, out of the way.
pub(crate) fn fence(scheduler: &str, job: &str) -> String {
    format!("{FENCE_PREFIX}{}:{scheduler}/{job}", scheduler.len())
}

/// What starts the fence's resource of a run.
const FENCE_PREFIX: &str = "run:";

/// The decimal digits of `n`.
fn digits(mut n: usize) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

/// The longest job name, in bytes, whose keys fit under `max_resource_len` for the
/// scheduler named `scheduler` (see the [module](self) for the keys): 0 if the
/// scheduler's name leaves no room.
pub fn max_job_name_len(scheduler: &str, max_resource_len: usize) -> usize {
    let s = scheduler.len();
    // The claim `S:job:J:<tick>` and the run lock `S:job:J:run`.
    let claim = max_resource_len.saturating_sub(s + ":job:".len() + 1 + TICK_MS_WIDTH);
    let run = max_resource_len.saturating_sub(s + ":job:".len() + ":run".len());
    // The fence `run:<len of S>:S/J`.
    let fence = FENCE_MAX_RESOURCE_LEN.saturating_sub(FENCE_PREFIX.len() + digits(s) + 1 + s + 1);
    claim.min(run).min(fence)
}

/// The longest scheduler name, in bytes, whose keys fit under `max_resource_len` with
/// a job name of one byte (see the [module](self) for the keys): 485 for
/// [`DEFAULT_MAX_RESOURCE_LEN`].
pub fn max_scheduler_name_len(max_resource_len: usize) -> usize {
    // `S:leader` and the job's keys with `J` of one byte.
    let leader = max_resource_len.saturating_sub(":leader".len());
    let jobs = max_resource_len.saturating_sub(":job:".len() + 1 + 1 + TICK_MS_WIDTH);
    // The fence `run:<len of S>:S/J`, with J of one byte: the longest S with
    // digits(S) + S <= room (at most 20 digits to try).
    let room = FENCE_MAX_RESOURCE_LEN.saturating_sub(FENCE_PREFIX.len() + 1 + 1 + 1);
    let fence = (1..=TICK_MS_WIDTH)
        .filter_map(|d| room.checked_sub(d).filter(|&s| digits(s) <= d))
        .max()
        .unwrap_or(0);
    leader.min(jobs).min(fence)
}

/// The first bytes of `name` (cut at a character boundary), with `…` if cut.
fn start_of(name: &str) -> String {
    if name.len() <= START_LEN {
        return name.to_owned();
    }
    let mut end = START_LEN;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &name[..end])
}

/// Refuses `name` (a `kind`) above `max` bytes.
pub(crate) fn check_len(kind: NameKind, name: &str, max: usize) -> Result<(), BuildError> {
    if name.len() > max {
        return Err(BuildError::NameTooLong(NameTooLong {
            kind,
            start: start_of(name),
            len: name.len(),
            max,
        }));
    }
    Ok(())
}

/// Refuses a scheduler name too long for its keys under `max_resource_len`.
pub(crate) fn check_scheduler(scheduler: &str, max_resource_len: usize) -> Result<(), BuildError> {
    check_len(
        NameKind::Scheduler,
        scheduler,
        max_scheduler_name_len(max_resource_len),
    )
}

/// Refuses a job name too long for its keys (the scheduler's name first, so that a
/// scheduler name that leaves no room is named as such).
pub(crate) fn check_job(
    scheduler: &str,
    job: &str,
    max_resource_len: usize,
) -> Result<(), BuildError> {
    check_scheduler(scheduler, max_resource_len)?;
    check_len(
        NameKind::Job,
        job,
        max_job_name_len(scheduler, max_resource_len),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

    use redlock_core::check_resource_name;

    use super::*;

    /// Every key of `scheduler` and `job`, at the widest tick, with its limit.
    fn keys(scheduler: &str, job: &str, max: usize) -> Vec<(String, usize)> {
        vec![
            (leader(scheduler), max),
            (claim(scheduler, job, i64::MIN), max),
            (claim(scheduler, job, i64::MAX), max),
            (run(scheduler, job), max),
            (fence(scheduler, job), FENCE_MAX_RESOURCE_LEN),
        ]
    }

    fn all_fit(scheduler: &str, job: &str, max: usize) -> bool {
        keys(scheduler, job, max)
            .iter()
            .all(|(key, limit)| check_resource_name(key, *limit).is_ok())
    }

    #[test]
    fn the_widest_tick_is_as_wide_as_assumed() {
        assert_eq!(i64::MIN.to_string().len(), TICK_MS_WIDTH);
        assert!(i64::MAX.to_string().len() <= TICK_MS_WIDTH);
    }

    #[test]
    fn the_longest_job_name_fits_every_key_and_one_byte_more_does_not() {
        for max in [1, 27, 28, 64, 100, 300, 512, 513, 600, 1024, 4096] {
            for s in [1, 2, 9, 10, 99, 100, 200, 485, 486, 502, 503, 1000] {
                let scheduler = "s".repeat(s);
                let bound = max_job_name_len(&scheduler, max);
                if bound == 0 {
                    assert!(!all_fit(&scheduler, "j", max), "max {max}, scheduler {s}");
                    continue;
                }
                assert!(
                    all_fit(&scheduler, &"j".repeat(bound), max),
                    "max {max}, scheduler {s}: {bound}"
                );
                assert!(
                    !all_fit(&scheduler, &"j".repeat(bound + 1), max),
                    "max {max}, scheduler {s}: {bound} + 1"
                );
            }
        }
    }

    #[test]
    fn the_longest_scheduler_name_leaves_room_for_a_one_byte_job() {
        for max in [1, 27, 28, 29, 64, 512, 513, 533, 534, 600, 4096, usize::MAX] {
            let bound = max_scheduler_name_len(max);
            let s = "s".repeat(bound);
            if bound > 0 {
                assert!(all_fit(&s, "j", max), "max {max}: {bound}");
                assert!(max_job_name_len(&s, max) >= 1, "max {max}: {bound}");
            }
            let longer = "s".repeat(bound + 1);
            assert!(!all_fit(&longer, "j", max), "max {max}: {bound} + 1");
            assert_eq!(max_job_name_len(&longer, max), 0, "max {max}: {bound} + 1");
        }
        assert_eq!(max_scheduler_name_len(DEFAULT_MAX_RESOURCE_LEN), 485);
        // Above the fence's limit, the fence bounds the name.
        assert_eq!(max_scheduler_name_len(4096), 502);
    }

    #[test]
    fn a_refused_name_is_named_by_its_start() {
        let name = "é".repeat(100);
        match check_len(NameKind::Job, &name, 10) {
            Err(BuildError::NameTooLong(NameTooLong {
                kind: NameKind::Job,
                start,
                len: 200,
                max: 10,
            })) => {
                assert!(start.len() <= START_LEN + '…'.len_utf8(), "{start}");
                assert!(start.ends_with('…'));
            }
            other => panic!("{other:?}"),
        }
        assert!(check_len(NameKind::Job, "short", 10).is_ok());
        assert!(check_len(NameKind::Job, &"x".repeat(10), 10).is_ok());
    }
}

//! When a job fires: a cron expression in a time zone.
//!
//! Expressions are parsed by [`croner`]: five fields (minute precision) or six (a leading
//! seconds field), `L`, `W`, `#`, ranges, steps and `@daily`-style nicknames.
//!
//! # Daylight saving time
//!
//! Ticks are wall-clock times in the job's zone, turned into instants:
//!
//! - **Fall back** (a local hour repeats): a *fixed-time* job (a single second, minute and
//!   hour, such as `0 30 1 * * *`) runs once, at the first pass of that time. An interval
//!   job (`*/15 * * * *`) runs in both passes, in time order: nothing is skipped and
//!   nothing repeats, since every tick is a distinct instant.
//! - **Spring forward** (a local hour is skipped): a fixed-time job whose time does not
//!   exist that day runs at the first valid time after the gap (02:30 → 03:00); interval
//!   ticks inside the gap do not exist and are not run.
//!
//! ```
//! use chrono::{TimeZone, Utc};
//! use redlock_scheduler::Schedule;
//!
//! let schedule = Schedule::parse("0 30 1 * * *", "America/New_York")?;
//! // 2026-11-01: 01:30 EDT happens, 01:30 EST (an hour later) does not.
//! let before = Utc.with_ymd_and_hms(2026, 11, 1, 5, 0, 0).unwrap();
//! let first = schedule.next_after(before).unwrap();
//! assert_eq!(first, Utc.with_ymd_and_hms(2026, 11, 1, 5, 30, 0).unwrap());
//! let second = schedule.next_after(first).unwrap();
//! assert_eq!(second, Utc.with_ymd_and_hms(2026, 11, 2, 6, 30, 0).unwrap());
//! # Ok::<(), String>(())
//! ```

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, LocalResult, NaiveDateTime, Offset, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use croner::{Cron, JobType};

/// How far a DST transition can move local time (the largest shift in use is 2 h).
const SHIFT: chrono::Duration = chrono::Duration::hours(3);

/// A cron expression in a time zone.
#[derive(Clone)]
pub struct Schedule {
    expression: String,
    cron: Cron,
    zone: Tz,
    fixed_time: bool,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("expression", &self.expression)
            .field("zone", &self.zone.name())
            .finish()
    }
}

impl Schedule {
    /// Parses `expression` for the IANA time zone `zone` (`"UTC"`, `"Europe/Paris"`).
    ///
    /// # Errors
    ///
    /// A message naming what is wrong, for an invalid expression or an unknown zone.
    pub fn parse(expression: &str, zone: &str) -> Result<Self, String> {
        let zone = Tz::from_str(zone).map_err(|_| format!("unknown time zone `{zone}`"))?;
        Self::parse_in(expression, zone)
    }

    /// Parses `expression` for `zone`.
    ///
    /// # Errors
    ///
    /// A message naming what is wrong, for an invalid expression.
    pub fn parse_in(expression: &str, zone: Tz) -> Result<Self, String> {
        let cron = Cron::from_str(expression).map_err(|err| err.to_string())?;
        // An expression that never matches (30 February) would make every search fail.
        let probe = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).single();
        if let Some(probe) = probe
            && cron.find_next_occurrence(&probe, false).is_err()
        {
            return Err("the expression never matches".to_owned());
        }
        Ok(Self {
            expression: expression.trim().to_owned(),
            fixed_time: cron.determine_job_type() == JobType::FixedTime,
            cron,
            zone,
        })
    }

    /// The expression as given (trimmed).
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The time zone.
    pub fn zone(&self) -> Tz {
        self.zone
    }

    /// The first tick strictly after `after`, or `None` if there is none (or none before
    /// the year 9999).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Local wall times, matched as if they were UTC, then placed in the zone. Near a
        // transition local time is not monotonic: look from a few hours back and keep
        // the earliest instant after `after`.
        // Ticks are whole seconds: search from the second `after` falls in.
        let local = after.with_timezone(&self.zone).naive_local();
        let local = local.with_nanosecond(0).unwrap_or(local);
        let near_transition = self.offset_at(after - SHIFT) != self.offset_at(after + SHIFT);
        let mut cursor = if near_transition {
            local - SHIFT
        } else {
            local
        };
        let mut best: Option<DateTime<Utc>> = None;
        for _ in 0..100_000 {
            let naive = self
                .cron
                .find_next_occurrence(&Utc.from_utc_datetime(&cursor), false)
                .ok()?
                .naive_utc();
            if let Some(found) = best
                && naive > found.with_timezone(&self.zone).naive_local() + SHIFT
            {
                break;
            }
            for instant in self.instants(naive) {
                if instant > after && best.is_none_or(|b| instant < b) {
                    best = Some(instant);
                }
            }
            if best.is_some() && !near_transition {
                break;
            }
            cursor = naive;
        }
        best
    }

    /// Every tick in `(after, until]`, oldest first.
    pub fn ticks_between(&self, after: DateTime<Utc>, until: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        let mut ticks = Vec::new();
        let mut cursor = after;
        while let Some(next) = self.next_after(cursor) {
            if next > until {
                break;
            }
            ticks.push(next);
            cursor = next;
        }
        ticks
    }

    fn offset_at(&self, at: DateTime<Utc>) -> i32 {
        self.zone
            .offset_from_utc_datetime(&at.naive_utc())
            .fix()
            .local_minus_utc()
    }

    /// The instants a matching local time stands for (see the module docs on DST).
    fn instants(&self, naive: NaiveDateTime) -> Vec<DateTime<Utc>> {
        match self.zone.from_local_datetime(&naive) {
            LocalResult::Single(dt) => vec![dt.with_timezone(&Utc)],
            LocalResult::Ambiguous(first, second) => {
                if self.fixed_time {
                    vec![first.with_timezone(&Utc)]
                } else {
                    vec![first.with_timezone(&Utc), second.with_timezone(&Utc)]
                }
            }
            LocalResult::None if self.fixed_time => {
                // The first valid local time after the gap.
                let mut probe = naive;
                for _ in 0..(4 * 60) {
                    probe += chrono::Duration::minutes(1);
                    let truncated = probe.with_second(0).unwrap_or(probe);
                    if let Some(dt) = self.zone.from_local_datetime(&truncated).earliest() {
                        return vec![dt.with_timezone(&Utc)];
                    }
                }
                Vec::new()
            }
            LocalResult::None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
    }

    #[test]
    fn every_second_and_minute_precision() {
        let s = Schedule::parse("* * * * * *", "UTC").unwrap();
        let t = utc(2026, 1, 1, 0, 0, 0);
        assert_eq!(s.next_after(t), Some(utc(2026, 1, 1, 0, 0, 1)));
        // From within a second: the next whole second.
        let within = t + chrono::Duration::milliseconds(375);
        assert_eq!(s.next_after(within), Some(utc(2026, 1, 1, 0, 0, 1)));
        let m = Schedule::parse("*/5 * * * *", "UTC").unwrap();
        assert_eq!(m.next_after(t), Some(utc(2026, 1, 1, 0, 5, 0)));
        assert_eq!(m.ticks_between(t, utc(2026, 1, 1, 0, 20, 0)).len(), 4);
    }

    #[test]
    fn fall_back_runs_a_fixed_time_job_once() {
        let s = Schedule::parse("0 30 1 * * *", "America/New_York").unwrap();
        let ticks = s.ticks_between(utc(2026, 10, 31, 12, 0, 0), utc(2026, 11, 2, 12, 0, 0));
        // 01:30 EDT on Nov 1 (05:30Z), not 01:30 EST (06:30Z); 01:30 EST on Nov 2.
        assert_eq!(
            ticks,
            vec![utc(2026, 11, 1, 5, 30, 0), utc(2026, 11, 2, 6, 30, 0)]
        );
    }

    #[test]
    fn fall_back_runs_interval_ticks_in_both_passes_in_order() {
        let s = Schedule::parse("*/30 * * * *", "America/New_York").unwrap();
        let ticks = s.ticks_between(utc(2026, 11, 1, 4, 45, 0), utc(2026, 11, 1, 7, 15, 0));
        // 00:30 EDT is 04:30Z; from 04:45Z: 01:00 EDT, 01:30 EDT, 01:00 EST, 01:30 EST,
        // 02:00 EST = 05:00Z, 05:30Z, 06:00Z, 06:30Z, 07:00Z.
        assert_eq!(
            ticks,
            vec![
                utc(2026, 11, 1, 5, 0, 0),
                utc(2026, 11, 1, 5, 30, 0),
                utc(2026, 11, 1, 6, 0, 0),
                utc(2026, 11, 1, 6, 30, 0),
                utc(2026, 11, 1, 7, 0, 0),
            ]
        );
    }

    #[test]
    fn spring_forward_runs_a_fixed_time_job_after_the_gap() {
        let s = Schedule::parse("0 30 2 * * *", "America/New_York").unwrap();
        // 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00Z).
        let tick = s.next_after(utc(2026, 3, 8, 5, 0, 0)).unwrap();
        assert_eq!(tick, utc(2026, 3, 8, 7, 0, 0));
        // The next day: 02:30 EDT.
        assert_eq!(s.next_after(tick), Some(utc(2026, 3, 9, 6, 30, 0)));
    }

    #[test]
    fn invalid_input_is_reported() {
        assert!(Schedule::parse("not cron", "UTC").is_err());
        assert!(
            Schedule::parse("* * * * *", "Mars/Olympus")
                .unwrap_err()
                .contains("Mars/Olympus")
        );
        assert!(Schedule::parse("0 0 30 2 *", "UTC").is_err());
    }
}

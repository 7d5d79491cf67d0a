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
//! use redlock_scheduler::time::Schedule;
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

/// How far apart the zone's offset is sampled when looking for a DST transition: two
/// transitions closer than this (none in the tz database since 1950 are) would be missed.
const PROBE: chrono::Duration = chrono::Duration::hours(24);

/// A bound on the steps of one search: each step finds a tick, crosses a transition,
/// or passes over a repeated wall time, so real schedules need a handful.
const MAX_STEPS: usize = 1000;

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
    ///
    /// The cost is bounded whatever the date: one cron match per stretch of constant UTC
    /// offset it crosses, plus a daily sample of the offset up to the tick found.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.search(after).0
    }

    /// [`next_after`](Self::next_after), and what it cost: cron matches plus offset
    /// lookups.
    fn search(&self, after: DateTime<Utc>) -> (Option<DateTime<Utc>>, usize) {
        let mut cost = 0;
        // Ticks are whole seconds: search after the second `after` falls in.
        let mut from = after.with_nanosecond(0).unwrap_or(after);
        for _ in 0..MAX_STEPS {
            // The stretch starting just after `from` has one offset: wall time there is
            // the instant plus that offset. Find the first wall time matching after
            // `from`'s, and check the stretch reaches it.
            let offset = self.offset_at(from + chrono::Duration::seconds(1));
            let wall_from = from.naive_utc() + offset;
            let Ok(wall) = self
                .cron
                .find_next_occurrence(&Utc.from_utc_datetime(&wall_from), false)
            else {
                return (None, cost);
            };
            let wall = wall.naive_utc();
            let instant = Utc.from_utc_datetime(&(wall - offset));
            cost += 1;
            match self.transition_between(from, instant, offset, &mut cost) {
                None => {
                    if self.fixed_time && self.is_second_pass(wall, instant) {
                        // A fixed-time job ran at this wall time's first pass.
                        from = instant;
                        continue;
                    }
                    return (Some(instant), cost);
                }
                Some(change) => {
                    let after_change = self.offset_at(change);
                    // Spring forward: a fixed-time job whose wall time falls in the gap
                    // runs when the gap ends.
                    if self.fixed_time
                        && after_change > offset
                        && wall < change.naive_utc() + after_change
                    {
                        return (Some(change), cost);
                    }
                    from = change - chrono::Duration::seconds(1);
                }
            }
        }
        (None, cost)
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

    fn offset_at(&self, at: DateTime<Utc>) -> chrono::Duration {
        let seconds = self
            .zone
            .offset_from_utc_datetime(&at.naive_utc())
            .fix()
            .local_minus_utc();
        chrono::Duration::seconds(i64::from(seconds))
    }

    /// The first instant in `(from, until]` whose offset is not `offset`, to the second.
    fn transition_between(
        &self,
        from: DateTime<Utc>,
        until: DateTime<Utc>,
        offset: chrono::Duration,
        cost: &mut usize,
    ) -> Option<DateTime<Utc>> {
        let mut low = from;
        while low < until {
            let high = (low + PROBE).min(until);
            *cost += 1;
            if self.offset_at(high) != offset {
                // The change lies in (low, high]: halve down to the second.
                let mut high = high;
                while high - low > chrono::Duration::seconds(1) {
                    let mid = low + (high - low) / 2;
                    let mid = mid.with_nanosecond(0).unwrap_or(mid);
                    *cost += 1;
                    if self.offset_at(mid) == offset {
                        low = mid;
                    } else {
                        high = mid;
                    }
                }
                return Some(high);
            }
            low = high;
        }
        None
    }

    /// Whether `instant` is the second of two instants the wall time `wall` stands for
    /// (the repeated hour after a fall-back).
    fn is_second_pass(&self, wall: NaiveDateTime, instant: DateTime<Utc>) -> bool {
        matches!(
            self.zone.from_local_datetime(&wall),
            LocalResult::Ambiguous(_, second) if second.with_timezone(&Utc) == instant
        )
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

    /// Every tick of `schedule` in `(from, to]`, with the largest cost of one lookup.
    fn walk(
        schedule: &Schedule,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> (Vec<DateTime<Utc>>, usize) {
        let (mut ticks, mut worst, mut cursor) = (Vec::new(), 0, from);
        loop {
            let (next, cost) = schedule.search(cursor);
            worst = worst.max(cost);
            match next {
                Some(t) if t <= to => {
                    ticks.push(t);
                    cursor = t;
                }
                _ => return (ticks, worst),
            }
        }
    }

    /// A per-second job across both 2026 transitions of `zone`: every second that exists
    /// runs once, in order; each lookup costs a few steps, at the transition too.
    fn per_second_across(zone: &str, spring: DateTime<Utc>, fall: DateTime<Utc>) {
        let s = Schedule::parse("* * * * * *", zone).unwrap();
        for change in [spring, fall] {
            let from = change - chrono::Duration::minutes(10);
            let to = change + chrono::Duration::minutes(10);
            let (ticks, worst) = walk(&s, from, to);
            // Instants are distinct seconds: 1,200 of them, none skipped or repeated.
            assert_eq!(ticks.len(), 1200, "{zone} at {change}");
            assert!(
                ticks
                    .windows(2)
                    .all(|w| w[1] - w[0] == chrono::Duration::seconds(1))
            );
            // A normal lookup costs 2 (one match, one offset sample); one next to a
            // transition adds the halving (about 17 samples) and one more match.
            assert!(worst <= 40, "{zone}: a lookup cost {worst} steps");
        }
    }

    #[test]
    fn per_second_jobs_cross_dst_in_bounded_steps() {
        // Europe/Berlin: 2026-03-29 01:00Z (02:00 → 03:00), 2026-10-25 01:00Z (03:00 → 02:00).
        per_second_across(
            "Europe/Berlin",
            utc(2026, 3, 29, 1, 0, 0),
            utc(2026, 10, 25, 1, 0, 0),
        );
        // America/New_York: 2026-03-08 07:00Z, 2026-11-01 06:00Z.
        per_second_across(
            "America/New_York",
            utc(2026, 3, 8, 7, 0, 0),
            utc(2026, 11, 1, 6, 0, 0),
        );
    }

    #[test]
    fn a_daily_0230_job_across_dst() {
        // Berlin: 02:30 does not exist on 2026-03-29 (runs at 03:00 CEST = 01:00Z); it
        // exists once on 2026-10-25 (02:30 CEST = 00:30Z; 02:30 CET an hour later is the
        // repeated pass, not run).
        let berlin = Schedule::parse("0 30 2 * * *", "Europe/Berlin").unwrap();
        let (spring, worst) = walk(
            &berlin,
            utc(2026, 3, 27, 12, 0, 0),
            utc(2026, 3, 30, 12, 0, 0),
        );
        assert_eq!(
            spring,
            vec![
                utc(2026, 3, 28, 1, 30, 0),
                utc(2026, 3, 29, 1, 0, 0),
                utc(2026, 3, 30, 0, 30, 0)
            ]
        );
        assert!(worst <= 40, "cost {worst}");
        let (fall, worst) = walk(
            &berlin,
            utc(2026, 10, 23, 12, 0, 0),
            utc(2026, 10, 26, 12, 0, 0),
        );
        assert_eq!(
            fall,
            vec![
                utc(2026, 10, 24, 0, 30, 0),
                utc(2026, 10, 25, 0, 30, 0),
                utc(2026, 10, 26, 1, 30, 0)
            ]
        );
        assert!(worst <= 40, "cost {worst}");
        // New York: 02:30 is in the gap on 2026-03-08 (runs 03:00 EDT = 07:00Z); on
        // 2026-11-01 02:30 happens once (EST, 07:30Z): the repeated hour is 01:00-02:00.
        let ny = Schedule::parse("0 30 2 * * *", "America/New_York").unwrap();
        let (spring, _) = walk(&ny, utc(2026, 3, 7, 0, 0, 0), utc(2026, 3, 9, 12, 0, 0));
        assert_eq!(
            spring,
            vec![
                utc(2026, 3, 7, 7, 30, 0),
                utc(2026, 3, 8, 7, 0, 0),
                utc(2026, 3, 9, 6, 30, 0)
            ]
        );
        let (fall, _) = walk(&ny, utc(2026, 10, 31, 0, 0, 0), utc(2026, 11, 2, 12, 0, 0));
        assert_eq!(
            fall,
            vec![
                utc(2026, 10, 31, 6, 30, 0),
                utc(2026, 11, 1, 7, 30, 0),
                utc(2026, 11, 2, 7, 30, 0)
            ]
        );
    }

    #[test]
    fn rare_schedules_stay_bounded() {
        // Once a year, and once every four years (29 February): offset samples are daily.
        let yearly = Schedule::parse("0 0 1 1 *", "Europe/Berlin").unwrap();
        let (next, cost) = yearly.search(utc(2026, 1, 2, 0, 0, 0));
        assert_eq!(next, Some(utc(2026, 12, 31, 23, 0, 0)));
        assert!(cost < 500, "cost {cost}");
        let leap = Schedule::parse("0 0 29 2 *", "America/New_York").unwrap();
        let (next, cost) = leap.search(utc(2026, 3, 1, 0, 0, 0));
        assert_eq!(next, Some(utc(2028, 2, 29, 5, 0, 0)));
        assert!(cost < 1000, "cost {cost}");
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

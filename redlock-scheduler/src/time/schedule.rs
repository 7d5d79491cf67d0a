//! When a job fires: a cron expression in a time zone, with its daylight saving policy.
//!
//! Expressions are parsed by [`croner`]: five fields (minute precision) or six (a leading
//! seconds field), `L`, `W`, `#`, ranges, steps and `@daily`-style nicknames.
//!
//! # Daylight saving time
//!
//! Ticks are wall-clock times in the job's zone, turned into instants. What happens when
//! a wall time does not exist (spring forward: a *gap*) or exists twice (fall back: a
//! *fold*) depends on the kind of job:
//!
//! - A **fixed-time** job (one second, one minute and one hour, none a wildcard or a
//!   step: `0 30 1 * * *`, `30 2 * * *`; see [`is_fixed_time`](Schedule::is_fixed_time))
//!   follows its [`DstPolicy`] ([`with_dst`](Schedule::with_dst)). By default, on fall
//!   back it runs once, at the first pass of its time ([`Fold::Once`]; [`Fold::Twice`]
//!   runs it at both passes), and on spring forward a time that does not exist that day
//!   runs at the first valid time after the gap, 02:30 → 03:00 ([`Gap::RunAtEnd`];
//!   [`Gap::Skip`] does not run it that day).
//! - Any other job (`*/15 * * * *`, `30 * * * *`, `0 30 1,2 * * *`) is an **interval**
//!   job, whatever its policy: it runs in both passes of a repeated hour, in time order
//!   (nothing is skipped and nothing repeats, since every tick is a distinct instant), and
//!   its ticks inside a gap do not exist and are not run. An every-15-minutes job keeps
//!   its 15-minute cadence in real time across both transitions.
//!
//! The policy only chooses between branches of the same search, so a lookup stays within
//! the same bound under every policy (see [`next_after`](Schedule::next_after)): at most
//! one more cron match when a gap or a second pass is passed over.
//!
//! ```
//! use chrono::{TimeZone, Utc};
//! use redlock_scheduler::time::{DstPolicy, Fold, Schedule};
//!
//! let schedule = Schedule::parse("0 30 1 * * *", "America/New_York")?;
//! // 2026-11-01: 01:30 EDT happens, 01:30 EST (an hour later) does not.
//! let before = Utc.with_ymd_and_hms(2026, 11, 1, 5, 0, 0).unwrap();
//! let first = schedule.next_after(before).unwrap();
//! assert_eq!(first, Utc.with_ymd_and_hms(2026, 11, 1, 5, 30, 0).unwrap());
//! let second = schedule.next_after(first).unwrap();
//! assert_eq!(second, Utc.with_ymd_and_hms(2026, 11, 2, 6, 30, 0).unwrap());
//! // With `Fold::Twice`, 01:30 EST runs too.
//! let twice = schedule.with_dst(DstPolicy::new().fold(Fold::Twice));
//! assert_eq!(twice.next_after(first), Some(Utc.with_ymd_and_hms(2026, 11, 1, 6, 30, 0).unwrap()));
//! # Ok::<(), String>(())
//! ```

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, LocalResult, NaiveDateTime, Offset, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use croner::{Cron, JobType};

use super::dst::{DstPolicy, Fold, Gap};

/// How far apart the zone's offset is sampled when looking for a DST transition: two
/// transitions closer than this (none in the tz database since 1950 are) would be missed.
const PROBE: chrono::Duration = chrono::Duration::hours(24);

/// A bound on the steps of one search: each step finds a tick, crosses a transition,
/// or passes over a repeated wall time, so real schedules need a handful.
const MAX_STEPS: usize = 1000;

/// A cron expression in a time zone, with a [`DstPolicy`] for the days a fixed-time tick
/// falls in a skipped or repeated stretch of local time: see [`DstPolicy`] for which
/// schedules are fixed-time, what the policy does, and what the others do.
#[derive(Clone)]
pub struct Schedule {
    expression: String,
    cron: Cron,
    zone: Tz,
    fixed_time: bool,
    dst: DstPolicy,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("expression", &self.expression)
            .field("zone", &self.zone.name())
            .field("dst", &self.dst)
            .finish()
    }
}

impl Schedule {
    /// Parses `expression` for the IANA time zone `zone` (`"UTC"`, `"Europe/Paris"`),
    /// with the default [`DstPolicy`].
    ///
    /// # Errors
    ///
    /// A message naming what is wrong, for an invalid expression or an unknown zone.
    pub fn parse(expression: &str, zone: &str) -> Result<Self, String> {
        let zone = Tz::from_str(zone).map_err(|_| format!("unknown time zone `{zone}`"))?;
        Self::parse_in(expression, zone)
    }

    /// Parses `expression` for `zone`.
    fn parse_in(expression: &str, zone: Tz) -> Result<Self, String> {
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
            dst: DstPolicy::new(),
        })
    }

    /// This schedule with `dst` as its daylight saving policy (for fixed-time schedules;
    /// others ignore it, see [`is_fixed_time`](Self::is_fixed_time)).
    #[must_use]
    pub fn with_dst(mut self, dst: DstPolicy) -> Self {
        self.dst = dst;
        self
    }

    /// The daylight saving policy (the default unless [`with_dst`](Self::with_dst) set
    /// one).
    pub fn dst(&self) -> DstPolicy {
        self.dst
    }

    /// Whether the expression is fixed-time (exactly one second, one minute and one
    /// hour, none a wildcard or a step: `0 30 2 * * *`, `30 2 * * 1-5`), so that its
    /// [`DstPolicy`] applies. Others (`*/15 * * * *`, `30 * * * *`, `0 30 1,2 * * *`)
    /// are interval schedules: their ticks run in both passes of a repeated hour and not
    /// in a skipped one, whatever the policy.
    pub fn is_fixed_time(&self) -> bool {
        self.fixed_time
    }

    /// The expression as given (trimmed).
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The time zone's IANA name (`"UTC"`, `"Europe/Paris"`).
    pub fn zone(&self) -> &'static str {
        self.zone.name()
    }

    /// The first tick strictly after `after`, or `None` if there is none (or none before
    /// the year 9999).
    ///
    /// The cost is bounded whatever the date and the [`DstPolicy`]: one cron match per
    /// stretch of constant UTC offset it crosses (or per skipped pass or gap), plus a
    /// daily sample of the offset up to the tick found.
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
                    if self.fixed_time
                        && self.dst.fold == Fold::Once
                        && self.is_second_pass(wall, instant)
                    {
                        // A fixed-time job ran at this wall time's first pass.
                        from = instant;
                        continue;
                    }
                    return (Some(instant), cost);
                }
                Some(change) => {
                    let after_change = self.offset_at(change);
                    // Spring forward: a fixed-time job whose wall time falls in the gap
                    // runs when the gap ends (or, with `Gap::Skip`, not that day: the
                    // search goes on from the gap's end, as for an interval job).
                    if self.fixed_time
                        && self.dst.gap == Gap::RunAtEnd
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

    /// The four policies, in the order the tables below list them.
    const POLICIES: [DstPolicy; 4] = [
        DstPolicy::new(),
        DstPolicy::new().gap(Gap::Skip),
        DstPolicy::new().fold(Fold::Twice),
        DstPolicy::new().gap(Gap::Skip).fold(Fold::Twice),
    ];

    fn hm(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        utc(y, mo, d, h, mi, 0)
    }

    /// A spring-forward night: a fixed-time job whose wall time is in the gap, its UTC
    /// ticks the day before, at the gap's end (with `Gap::RunAtEnd`) and the day after.
    struct GapCase {
        zone: &'static str,
        expression: &'static str,
        before: DateTime<Utc>,
        gap_end: DateTime<Utc>,
        after: DateTime<Utc>,
    }

    /// A fall-back night: a fixed-time job whose wall time is in the fold, its UTC ticks
    /// the day before, at the first and second pass, and the day after.
    struct FoldCase {
        zone: &'static str,
        expression: &'static str,
        before: DateTime<Utc>,
        first: DateTime<Utc>,
        second: DateTime<Utc>,
        after: DateTime<Utc>,
    }

    /// Every 2026 and 2027 gap of the zones tested, and Mexico City's last one (2022).
    /// Hand-computed from the rules: Berlin 02:00 CET → 03:00 CEST (01:00Z, last Sunday
    /// of March); New York 02:00 EST → 03:00 EDT (07:00Z, second Sunday of March); Lord
    /// Howe 02:00 +10:30 → 02:30 +11 (15:30Z the day before, first Sunday of October);
    /// Mexico City 02:00 CST → 03:00 CDT (08:00Z, first Sunday of April, until 2022).
    fn gaps() -> Vec<GapCase> {
        let case = |zone, expression, before, gap_end, after| GapCase {
            zone,
            expression,
            before,
            gap_end,
            after,
        };
        vec![
            // 02:30 CET, [03:00 CEST], 02:30 CEST.
            case(
                "Europe/Berlin",
                "30 2 * * *",
                hm(2026, 3, 28, 1, 30),
                hm(2026, 3, 29, 1, 0),
                hm(2026, 3, 30, 0, 30),
            ),
            case(
                "Europe/Berlin",
                "30 2 * * *",
                hm(2027, 3, 27, 1, 30),
                hm(2027, 3, 28, 1, 0),
                hm(2027, 3, 29, 0, 30),
            ),
            // 02:30 EST, [03:00 EDT], 02:30 EDT.
            case(
                "America/New_York",
                "30 2 * * *",
                hm(2026, 3, 7, 7, 30),
                hm(2026, 3, 8, 7, 0),
                hm(2026, 3, 9, 6, 30),
            ),
            case(
                "America/New_York",
                "30 2 * * *",
                hm(2027, 3, 13, 7, 30),
                hm(2027, 3, 14, 7, 0),
                hm(2027, 3, 15, 6, 30),
            ),
            // 02:15 +10:30 (15:45Z the day before), [02:30 +11], 02:15 +11 (15:15Z).
            case(
                "Australia/Lord_Howe",
                "15 2 * * *",
                hm(2026, 10, 2, 15, 45),
                hm(2026, 10, 3, 15, 30),
                hm(2026, 10, 4, 15, 15),
            ),
            case(
                "Australia/Lord_Howe",
                "15 2 * * *",
                hm(2027, 10, 1, 15, 45),
                hm(2027, 10, 2, 15, 30),
                hm(2027, 10, 3, 15, 15),
            ),
            // 2022-04-03, before Mexico abolished DST: 02:30 CST, [03:00 CDT], 02:30 CDT.
            case(
                "America/Mexico_City",
                "30 2 * * *",
                hm(2022, 4, 2, 8, 30),
                hm(2022, 4, 3, 8, 0),
                hm(2022, 4, 4, 7, 30),
            ),
        ]
    }

    /// Every 2026 and 2027 fold of the zones tested, and Mexico City's last one (2022):
    /// Berlin 03:00 CEST → 02:00 CET (01:00Z, last Sunday of October); New York 02:00 EDT
    /// → 01:00 EST (06:00Z, first Sunday of November); Lord Howe 02:00 +11 → 01:30
    /// +10:30 (15:00Z the day before, first Sunday of April); Mexico City 02:00 CDT →
    /// 01:00 CST (07:00Z, last Sunday of October, 2022).
    fn folds() -> Vec<FoldCase> {
        let case = |zone, expression, before, first, second, after| FoldCase {
            zone,
            expression,
            before,
            first,
            second,
            after,
        };
        vec![
            // 02:30 CEST, 02:30 CEST, [02:30 CET], 02:30 CET.
            case(
                "Europe/Berlin",
                "30 2 * * *",
                hm(2026, 10, 24, 0, 30),
                hm(2026, 10, 25, 0, 30),
                hm(2026, 10, 25, 1, 30),
                hm(2026, 10, 26, 1, 30),
            ),
            case(
                "Europe/Berlin",
                "30 2 * * *",
                hm(2027, 10, 30, 0, 30),
                hm(2027, 10, 31, 0, 30),
                hm(2027, 10, 31, 1, 30),
                hm(2027, 11, 1, 1, 30),
            ),
            // 01:30 EDT, 01:30 EDT, [01:30 EST], 01:30 EST.
            case(
                "America/New_York",
                "30 1 * * *",
                hm(2026, 10, 31, 5, 30),
                hm(2026, 11, 1, 5, 30),
                hm(2026, 11, 1, 6, 30),
                hm(2026, 11, 2, 6, 30),
            ),
            case(
                "America/New_York",
                "30 1 * * *",
                hm(2027, 11, 6, 5, 30),
                hm(2027, 11, 7, 5, 30),
                hm(2027, 11, 7, 6, 30),
                hm(2027, 11, 8, 6, 30),
            ),
            // 01:45 +11, 01:45 +11, [01:45 +10:30, 30 minutes later], 01:45 +10:30.
            case(
                "Australia/Lord_Howe",
                "45 1 * * *",
                hm(2026, 4, 3, 14, 45),
                hm(2026, 4, 4, 14, 45),
                hm(2026, 4, 4, 15, 15),
                hm(2026, 4, 5, 15, 15),
            ),
            case(
                "Australia/Lord_Howe",
                "45 1 * * *",
                hm(2027, 4, 2, 14, 45),
                hm(2027, 4, 3, 14, 45),
                hm(2027, 4, 3, 15, 15),
                hm(2027, 4, 4, 15, 15),
            ),
            // 2022-10-30: 01:30 CDT, 01:30 CDT, [01:30 CST], 01:30 CST.
            case(
                "America/Mexico_City",
                "30 1 * * *",
                hm(2022, 10, 29, 6, 30),
                hm(2022, 10, 30, 6, 30),
                hm(2022, 10, 30, 7, 30),
                hm(2022, 10, 31, 7, 30),
            ),
        ]
    }

    #[test]
    fn a_fixed_time_job_in_a_gap_follows_its_policy() {
        for case in gaps() {
            for policy in POLICIES {
                let s = Schedule::parse(case.expression, case.zone)
                    .unwrap()
                    .with_dst(policy);
                assert!(s.is_fixed_time());
                let from = case.before - chrono::Duration::hours(1);
                let to = case.after + chrono::Duration::hours(1);
                let (ticks, worst) = walk(&s, from, to);
                let expected = match policy.gap {
                    Gap::RunAtEnd => vec![case.before, case.gap_end, case.after],
                    _ => vec![case.before, case.after],
                };
                assert_eq!(ticks, expected, "{} {} {policy}", case.zone, case.gap_end);
                assert!(worst <= 40, "{} {policy}: cost {worst}", case.zone);
                assert_eq!(s.ticks_between(from, to), expected);
            }
        }
    }

    #[test]
    fn a_fixed_time_job_in_a_fold_follows_its_policy() {
        for case in folds() {
            for policy in POLICIES {
                let s = Schedule::parse(case.expression, case.zone)
                    .unwrap()
                    .with_dst(policy);
                let from = case.before - chrono::Duration::hours(1);
                let to = case.after + chrono::Duration::hours(1);
                let (ticks, worst) = walk(&s, from, to);
                let expected = match policy.fold {
                    Fold::Once => vec![case.before, case.first, case.after],
                    _ => vec![case.before, case.first, case.second, case.after],
                };
                assert_eq!(ticks, expected, "{} {} {policy}", case.zone, case.first);
                assert!(worst <= 40, "{} {policy}: cost {worst}", case.zone);
                // From between the passes: the second pass, or the next day.
                let between = case.first + chrono::Duration::minutes(1);
                let next = match policy.fold {
                    Fold::Once => case.after,
                    _ => case.second,
                };
                assert_eq!(s.next_after(between), Some(next), "{} {policy}", case.zone);
            }
        }
    }

    #[test]
    fn mexico_city_has_no_transition_since_2022_under_any_policy() {
        // The old rule (first Sunday of April, last Sunday of October, at 02:00) would
        // have made 02:30 a gap on 2026-04-05 and 2027-04-04 and 01:30 a fold on
        // 2026-10-25 and 2027-10-31. Since October 2022 the zone is UTC-6 all year:
        // each day has its tick at the same UTC time, once.
        for (expression, days, utc_hour) in [
            ("30 2 * * *", [(2026, 4, 5), (2027, 4, 4)], 8),
            ("30 1 * * *", [(2026, 10, 25), (2027, 10, 31)], 7),
        ] {
            for (y, mo, d) in days {
                let day = hm(y, mo, d, utc_hour, 30);
                let one_day = chrono::Duration::days(1);
                for policy in POLICIES {
                    let s = Schedule::parse(expression, "America/Mexico_City")
                        .unwrap()
                        .with_dst(policy);
                    let from = day - one_day - chrono::Duration::hours(1);
                    let (ticks, _) = walk(&s, from, day + one_day + chrono::Duration::hours(1));
                    assert_eq!(
                        ticks,
                        vec![day - one_day, day, day + one_day],
                        "{day} {policy}"
                    );
                }
            }
        }
    }

    /// Every transition tested (2026 and 2027 of Berlin, New York, Lord Howe; Mexico
    /// City's old-rule dates of 2026, where nothing changes any more).
    fn transitions() -> Vec<(&'static str, DateTime<Utc>)> {
        vec![
            ("Europe/Berlin", hm(2026, 3, 29, 1, 0)),
            ("Europe/Berlin", hm(2026, 10, 25, 1, 0)),
            ("Europe/Berlin", hm(2027, 3, 28, 1, 0)),
            ("Europe/Berlin", hm(2027, 10, 31, 1, 0)),
            ("America/New_York", hm(2026, 3, 8, 7, 0)),
            ("America/New_York", hm(2026, 11, 1, 6, 0)),
            ("America/New_York", hm(2027, 3, 14, 7, 0)),
            ("America/New_York", hm(2027, 11, 7, 6, 0)),
            ("Australia/Lord_Howe", hm(2026, 4, 4, 15, 0)),
            ("Australia/Lord_Howe", hm(2026, 10, 3, 15, 30)),
            ("Australia/Lord_Howe", hm(2027, 4, 3, 15, 0)),
            ("Australia/Lord_Howe", hm(2027, 10, 2, 15, 30)),
            ("America/Mexico_City", hm(2026, 4, 5, 8, 0)),
            ("America/Mexico_City", hm(2026, 10, 25, 8, 0)),
        ]
    }

    #[test]
    fn an_interval_job_keeps_its_cadence_across_every_transition_under_every_policy() {
        for (zone, change) in transitions() {
            let from = change - chrono::Duration::hours(2);
            let to = change + chrono::Duration::hours(2);
            for policy in POLICIES {
                let s = Schedule::parse("*/15 * * * *", zone)
                    .unwrap()
                    .with_dst(policy);
                assert!(!s.is_fixed_time());
                let (ticks, worst) = walk(&s, from, to);
                // Every offset here is a whole number of quarter hours: the ticks are
                // every quarter hour of UTC, 16 of them, none twice, none skipped.
                let expected: Vec<_> = (1..=16)
                    .map(|i| from + chrono::Duration::minutes(15 * i))
                    .collect();
                assert_eq!(ticks, expected, "{zone} {change} {policy}");
                assert!(worst <= 40, "{zone} {policy}: cost {worst}");
            }
        }
    }

    #[test]
    fn hourly_and_listed_times_are_interval_jobs_under_every_policy() {
        for policy in POLICIES {
            // An hourly job: 01:30 EDT and 01:30 EST are two hours' ticks, an hour apart.
            let hourly = Schedule::parse("30 * * * *", "America/New_York")
                .unwrap()
                .with_dst(policy);
            assert_eq!(
                hourly.ticks_between(hm(2026, 11, 1, 5, 0), hm(2026, 11, 1, 7, 0)),
                vec![hm(2026, 11, 1, 5, 30), hm(2026, 11, 1, 6, 30)],
                "{policy}"
            );
            // In the gap, 02:30 does not exist: 01:30 EST, then 03:30 EDT, an hour later.
            assert_eq!(
                hourly.ticks_between(hm(2026, 3, 8, 6, 0), hm(2026, 3, 8, 8, 0)),
                vec![hm(2026, 3, 8, 6, 30), hm(2026, 3, 8, 7, 30)],
                "{policy}"
            );
            // Two listed hours are not a fixed time: both passes of 01:30 run, and 02:30
            // EST (07:30Z); on the spring night 02:30 does not exist and does not run.
            let listed = Schedule::parse("0 30 1,2 * * *", "America/New_York")
                .unwrap()
                .with_dst(policy);
            assert!(!listed.is_fixed_time());
            assert_eq!(
                listed.ticks_between(hm(2026, 11, 1, 5, 0), hm(2026, 11, 1, 8, 0)),
                vec![
                    hm(2026, 11, 1, 5, 30),
                    hm(2026, 11, 1, 6, 30),
                    hm(2026, 11, 1, 7, 30)
                ],
                "{policy}"
            );
            assert_eq!(
                listed.ticks_between(hm(2026, 3, 8, 6, 0), hm(2026, 3, 9, 0, 0)),
                vec![hm(2026, 3, 8, 6, 30)],
                "{policy}"
            );
        }
    }

    #[test]
    fn which_expressions_are_fixed_time() {
        for (expression, fixed) in [
            ("0 30 2 * * *", true),
            ("30 2 * * *", true),
            ("0 15 1 * * MON-FRI", true),
            ("0 0 3 1 * *", true),
            ("@daily", true),
            ("*/15 * * * *", false),
            ("30 * * * *", false),
            ("0 0 */2 * * *", false),
            ("0 30 1,2 * * *", false),
            ("0 0,30 2 * * *", false),
            ("* 30 2 * * *", false),
        ] {
            let s = Schedule::parse(expression, "UTC").unwrap();
            assert_eq!(s.is_fixed_time(), fixed, "{expression}");
            assert_eq!(s.dst(), DstPolicy::new(), "{expression}");
        }
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

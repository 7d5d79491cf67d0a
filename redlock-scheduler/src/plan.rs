//! What to do with the ticks that came due: a pure function of the schedule's ticks, the
//! time, and the job's misfire policy. The firing loop only carries the plan out (pause
//! and overlap are checked when a tick is claimed, since they change while it waits).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::spec::Misfire;
use crate::time::earlier;

/// A tick whose time passed less than this long ago is on time; older ones are missed.
pub(crate) const ON_TIME: Duration = Duration::from_secs(1);

/// At most this many missed ticks are recorded one by one in one plan; older ones are
/// counted (and logged) instead.
pub(crate) const MAX_RECORDED: usize = 1000;

/// What to do with one tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Run it; `late` if it is a missed tick run by the misfire policy (such runs go one
    /// after the other, and the next tick waits for them instead of being skipped).
    Run { late: bool },
    /// Record it as skipped, for this reason.
    Skip(String),
}

/// The plan for the ticks that came due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Ticks, oldest first, with what to do.
    pub(crate) steps: Vec<(DateTime<Utc>, Action)>,
    /// Missed ticks beyond [`MAX_RECORDED`]: neither run nor recorded one by one.
    pub(crate) uncounted: usize,
}

/// Plans `due` (every tick in `(cursor, now]`, oldest first) under `misfire`.
pub(crate) fn plan(due: &[DateTime<Utc>], now: DateTime<Utc>, misfire: Misfire) -> Plan {
    let on_time = due
        .last()
        .copied()
        .filter(|t| (now - *t).to_std().unwrap_or_default() < ON_TIME);
    let missed = &due[..due.len() - usize::from(on_time.is_some())];
    let (run, reason): (&[DateTime<Utc>], String) = match misfire {
        Misfire::Skip => (&[], "missed: no replica fired it in time (misfire policy: skip)".to_owned()),
        Misfire::RunOnce if on_time.is_some() => (
            &[],
            "missed: no replica fired it in time, and a later tick ran on time (misfire policy: run once)"
                .to_owned(),
        ),
        Misfire::RunOnce => (
            &missed[missed.len().saturating_sub(1)..],
            "missed: no replica fired it in time; a later missed tick ran instead (misfire policy: run once)"
                .to_owned(),
        ),
        Misfire::CatchUp { max } => {
            let keep = usize::try_from(max).unwrap_or(usize::MAX).min(missed.len());
            (
                &missed[missed.len() - keep..],
                format!(
                    "missed: no replica fired it in time, beyond the {max} latest that ran (misfire policy: catch up)"
                ),
            )
        }
    };
    let skipped = missed.len() - run.len();
    let uncounted = skipped.saturating_sub(MAX_RECORDED);
    let mut steps: Vec<(DateTime<Utc>, Action)> = missed[uncounted..skipped]
        .iter()
        .map(|t| (*t, Action::Skip(reason.clone())))
        .collect();
    steps.extend(run.iter().map(|t| (*t, Action::Run { late: true })));
    steps.extend(on_time.map(|t| (t, Action::Run { late: false })));
    Plan { steps, uncounted }
}

/// Plans the first ticks of a leadership elected at `elected` and firing them at `now`
/// (later than its election when it first had to wait for the history).
///
/// The ticks due by the election were missed by the fail-over: they are planned as
/// they would have been at the election, so the policy's count applies to them alone.
/// The ticks that came due while the leader waited are planned at `now`, as a late
/// leader's are. A tick that was on time at the election but is late by now runs as a
/// late run (after the runs before it). Without such a wait, this is [`plan`] at `now`.
pub(crate) fn plan_first(
    due: &[DateTime<Utc>],
    elected: DateTime<Utc>,
    now: DateTime<Utc>,
    misfire: Misfire,
) -> Plan {
    if !is_late(elected, now) {
        return plan(due, now, misfire);
    }
    let split = due.partition_point(|t| *t <= elected);
    let mut first = plan(&due[..split], elected, misfire);
    for (tick, action) in &mut first.steps {
        if let Action::Run { late } = action {
            *late = *late || is_late(*tick, now);
        }
    }
    let then = plan(&due[split..], now, misfire);
    first.steps.extend(then.steps);
    first.uncounted += then.uncounted;
    first
}

/// Whether `tick`, acted on at `now`, is late (a misfire), not on time.
fn is_late(tick: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    (now - tick).to_std().unwrap_or_default() >= ON_TIME
}

/// Where a leader elected at `elected` starts looking for due ticks, at `now`.
///
/// - With a history that has a row for the job: after its latest scheduled tick;
/// - with a history without one: the job never ran anywhere, so nothing was missed
///   before this leadership (a fresh deployment does not catch up on the past): just
///   before the election;
/// - without a history (or when it could not be read in time): the grace window, the
///   Redis claims of the ticks in it telling what ran.
///
/// Never earlier than the grace window before `now` (older ticks are forgotten: their
/// claims may have expired).
pub(crate) fn start_cursor(
    recorded: Recorded,
    elected: DateTime<Utc>,
    now: DateTime<Utc>,
    grace: Duration,
) -> DateTime<Utc> {
    let floor = earlier(now, grace);
    match recorded {
        Recorded::Last(last) => last.max(floor),
        Recorded::Never => earlier(elected.min(now), ON_TIME).max(floor),
        Recorded::Unknown => floor,
    }
}

/// What the history says about a job's last scheduled tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// Its latest tick.
    Last(DateTime<Utc>),
    /// No row: it never ran.
    Never,
    /// No history, or it could not be read.
    Unknown,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use chrono::TimeZone;

    use super::*;

    fn at(s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, s).unwrap()
    }

    fn runs(plan: &Plan) -> Vec<(u32, bool)> {
        plan.steps
            .iter()
            .filter_map(|(t, a)| match a {
                Action::Run { late } => Some((chrono::Timelike::second(t), *late)),
                Action::Skip(_) => None,
            })
            .collect()
    }

    fn skips(plan: &Plan) -> Vec<u32> {
        plan.steps
            .iter()
            .filter(|(_, a)| matches!(a, Action::Skip(_)))
            .map(|(t, _)| chrono::Timelike::second(t))
            .collect()
    }

    #[test]
    fn plans_by_policy() {
        let due = [at(1), at(2), at(3), at(4), at(5)];
        let on_time_now = at(5) + chrono::Duration::milliseconds(200);
        let late_now = at(5) + chrono::Duration::seconds(3);
        // (policy, now, runs, skips)
        type Row = (Misfire, DateTime<Utc>, Vec<(u32, bool)>, Vec<u32>);
        let table: Vec<Row> = vec![
            (
                Misfire::Skip,
                on_time_now,
                vec![(5, false)],
                vec![1, 2, 3, 4],
            ),
            (Misfire::Skip, late_now, vec![], vec![1, 2, 3, 4, 5]),
            (
                Misfire::RunOnce,
                on_time_now,
                vec![(5, false)],
                vec![1, 2, 3, 4],
            ),
            (
                Misfire::RunOnce,
                late_now,
                vec![(5, true)],
                vec![1, 2, 3, 4],
            ),
            (
                Misfire::CatchUp { max: 2 },
                on_time_now,
                vec![(3, true), (4, true), (5, false)],
                vec![1, 2],
            ),
            (
                Misfire::CatchUp { max: 2 },
                late_now,
                vec![(4, true), (5, true)],
                vec![1, 2, 3],
            ),
            (
                Misfire::CatchUp { max: 10 },
                late_now,
                vec![(1, true), (2, true), (3, true), (4, true), (5, true)],
                vec![],
            ),
            (
                Misfire::CatchUp { max: 0 },
                on_time_now,
                vec![(5, false)],
                vec![1, 2, 3, 4],
            ),
        ];
        for (policy, now, run, skip) in table {
            let plan = plan(&due, now, policy);
            assert_eq!(runs(&plan), run, "{policy:?} at {now}");
            assert_eq!(skips(&plan), skip, "{policy:?} at {now}");
            assert_eq!(plan.uncounted, 0);
            // Oldest first, every due tick accounted for once.
            assert_eq!(plan.steps.len(), due.len());
        }
        assert!(plan(&[], at(0), Misfire::Skip).steps.is_empty());
    }

    #[test]
    fn skip_reasons_name_the_policy() {
        let plan = plan(&[at(1), at(2)], at(9), Misfire::RunOnce);
        let Action::Skip(reason) = &plan.steps[0].1 else {
            panic!("the older tick is skipped");
        };
        assert!(reason.contains("run once"), "{reason}");
    }

    #[test]
    fn floods_are_counted_not_recorded() {
        let due: Vec<DateTime<Utc>> = (0..5000)
            .map(|i| at(0) + chrono::Duration::seconds(i))
            .collect();
        let now = *due.last().unwrap() + chrono::Duration::seconds(30);
        let plan = plan(&due, now, Misfire::RunOnce);
        assert_eq!(plan.uncounted, 5000 - 1 - MAX_RECORDED);
        assert_eq!(plan.steps.len(), MAX_RECORDED + 1);
        assert_eq!(plan.steps.last().unwrap().0, *due.last().unwrap());
    }

    #[test]
    fn a_wait_for_the_history_does_not_count_against_the_fail_overs_misfires() {
        // Nobody led for ticks 1..=4; the leader, elected at 4.3, could read the history
        // at 7.1 only: ticks 5 and 6 came due while it waited.
        let due = [at(1), at(2), at(3), at(4), at(5), at(6), at(7)];
        let elected = at(4) + chrono::Duration::milliseconds(300);
        let now = at(7) + chrono::Duration::milliseconds(100);
        let policy = Misfire::CatchUp { max: 3 };
        let first = plan_first(&due, elected, now, policy);
        // At the election: 1, 2, 3 missed (the latest 3 run), 4 on time (late by now);
        // then 5 and 6 missed while waiting, 7 on time.
        assert_eq!(
            runs(&first),
            vec![
                (1, true),
                (2, true),
                (3, true),
                (4, true),
                (5, true),
                (6, true),
                (7, false)
            ]
        );
        assert_eq!(first.steps.len(), due.len());
        let once = plan_first(&due, elected, now, Misfire::RunOnce);
        assert_eq!(runs(&once), vec![(4, true), (7, false)]);
        assert_eq!(skips(&once), vec![1, 2, 3, 5, 6]);
        let skip = plan_first(&due, elected, now, Misfire::Skip);
        assert_eq!(runs(&skip), vec![(4, true), (7, false)]);
        // Without a wait: the plan at now.
        let prompt = at(7) + chrono::Duration::milliseconds(50);
        assert_eq!(
            plan_first(&due, at(7), prompt, policy),
            plan(&due, prompt, policy)
        );
        // More missed before the election than the policy runs: the oldest is skipped.
        let many = plan_first(
            &due,
            at(5) + chrono::Duration::milliseconds(500),
            now,
            policy,
        );
        assert_eq!(skips(&many), vec![1]);
        assert_eq!(many.steps.len(), due.len());
    }

    #[test]
    fn start_cursors() {
        let now = at(59);
        let grace = Duration::from_secs(30);
        assert_eq!(
            start_cursor(Recorded::Last(at(50)), now, now, grace),
            at(50)
        );
        assert_eq!(
            start_cursor(Recorded::Last(at(10)), now, now, grace),
            at(29)
        );
        assert_eq!(start_cursor(Recorded::Never, now, now, grace), at(58));
        assert_eq!(start_cursor(Recorded::Unknown, now, now, grace), at(29));
        // Elected earlier, then waiting for the history: a job that never ran plans the
        // ticks from its election on; the grace window still counts back from now.
        assert_eq!(start_cursor(Recorded::Never, at(50), now, grace), at(49));
        assert_eq!(start_cursor(Recorded::Never, at(10), now, grace), at(29));
        assert_eq!(
            start_cursor(Recorded::Last(at(10)), at(20), now, grace),
            at(29)
        );
        // An absurd grace does not overflow.
        assert_eq!(
            start_cursor(Recorded::Unknown, now, now, Duration::MAX),
            DateTime::<Utc>::MIN_UTC
        );
        assert_eq!(
            crate::time::later(now, Duration::MAX),
            DateTime::<Utc>::MAX_UTC
        );
    }
}

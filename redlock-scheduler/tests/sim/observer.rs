//! The observer: what the replicas did, seen from outside the scheduler, and the checks
//! of the crate's promises on it (docs/SCHEDULER.md, "How a tick runs once"):
//!
//! - **leadership exclusion**: at no sampled instant do two replicas hold a current
//!   leadership (each by its own monotonic clock, which a pause or crash does not stop:
//!   a paused replica's leadership lasts exactly as long as it says);
//! - **each tick at most once**: no scheduled tick of a job starts twice, on any
//!   replicas, whatever failed (its claim is released only when no run started);
//! - **no overlap, cluster-wide**: no run of a job starts while another run of it goes
//!   on, on any replica (a run whose run lock is lost, its replica paused or crashed, is
//!   told to stop before the lock's validity ends, and the handlers here stop at once);
//! - **effects once**: the fenced resource the handlers write to holds at most one
//!   effect per tick, every run that returned `Ok` has its effect there, and none came
//!   from a run that failed;
//! - **with a history** (`sim/history.rs`), the effects are the run transactions'
//!   writes that committed, and further: a tick's effect is in the history if and only
//!   if its row says `succeeded` (the row naming the replica that wrote it), every run
//!   that started has its tick's row once the database answers again (but those of a
//!   crashed replica), and every trigger an operator saw succeed ran its tick;
//! - **each tick exactly once without faults**: in a seed with no fault at all, every
//!   tick of every job from the first election (plus a second) to the end (less the
//!   longest run and a second) starts once and succeeds, unless it came due while a run
//!   of its job was going (give or take the replicas' clock skew): such an on-time tick
//!   is skipped, by the no-overlap rule.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use redlock_testkit::sim::Log;
use tokio::time::Instant;

/// How far apart the replicas' clocks may be, in ms (each is within 300 ms of true time).
const SKEW_MS: i64 = 600;

/// How a handler run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// Its effect was written (the fence took its token).
    Wrote,
    /// The fence refused its token: a later leadership wrote first.
    Refused,
    /// The handler failed on purpose, before writing.
    Failed,
    /// Its cancellation token fired first.
    Cancelled,
    /// Its commit's outcome was not known (with a history): either way.
    Unknown,
    /// Its replica crashed while it ran (before it began to commit).
    Crashed,
}

/// One handler run.
#[derive(Debug)]
struct Run {
    replica: usize,
    job: usize,
    tick: i64,
    token: u64,
    end: Option<End>,
    /// It began to commit its transaction (with a history).
    committing: bool,
    /// When it started and ended, in ms of true wall time.
    from: i64,
    to: Option<i64>,
}

/// One effect the fenced resource took.
#[derive(Debug)]
struct Effect {
    run: usize,
    job: usize,
    tick: i64,
}

pub(crate) struct Observer {
    log: Log,
    /// True wall time at `origin`, in ms.
    wall_ms: i64,
    origin: Instant,
    /// No fault in this seed: every tick in the window must run once.
    faultless: bool,
    runs: Vec<Run>,
    /// Per job: the highest token written (the fence).
    fence: BTreeMap<usize, u64>,
    effects: Vec<Effect>,
    /// The first instant a replica was seen leading, ms of wall time.
    first_leader: Option<i64>,
    /// The replica seen leading at the last sample.
    leading: Option<usize>,
    pub(crate) violations: Vec<String>,
    pub(crate) counts: BTreeMap<&'static str, u64>,
}

impl Observer {
    pub(crate) fn new(log: Log, faultless: bool, wall_ms: i64) -> Self {
        Self {
            log,
            wall_ms,
            origin: Instant::now(),
            faultless,
            runs: Vec::new(),
            fence: BTreeMap::new(),
            effects: Vec::new(),
            first_leader: None,
            leading: None,
            violations: Vec::new(),
            counts: BTreeMap::new(),
        }
    }

    /// True wall time now, in ms.
    fn now_ms(&self) -> i64 {
        self.wall_ms + i64::try_from(self.origin.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// A line in the trace.
    pub(crate) fn note(&self, line: impl FnOnce() -> String) {
        self.log.log(line);
    }

    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    fn violation(&mut self, what: String) {
        self.log.log(|| format!("VIOLATION: {what}"));
        self.violations.push(what);
    }

    /// A sample of who leads now: the replicas whose leadership is current.
    pub(crate) fn leaders(&mut self, now: DateTime<Utc>, leading: &[(usize, u64)]) {
        self.count("leadership samples");
        if leading.len() > 1 {
            let what = format!("{} replicas lead at once: {leading:?}", leading.len());
            if !self.violations.contains(&what) {
                self.violation(what);
            }
        }
        let first = leading.first().map(|(replica, _)| *replica);
        if first != self.leading {
            self.log
                .log(|| format!("leader now {first:?} (replica, epoch: {leading:?})"));
            self.leading = first;
        }
        if first.is_some() && self.first_leader.is_none() {
            self.first_leader = Some(now.timestamp_millis());
        }
    }

    /// A handler starts: its run's number.
    pub(crate) fn started(
        &mut self,
        replica: usize,
        job: usize,
        tick: i64,
        token: u64,
        clock: i64,
    ) -> usize {
        self.count("runs");
        self.log.log(|| {
            format!("r{replica} runs job{job} tick {tick} (token {token}) at {clock} by its clock")
        });
        if let Some(going) = self
            .runs
            .iter()
            .find(|run| run.job == job && run.end.is_none())
        {
            let what = format!(
                "job{job} tick {tick} started on r{replica} while tick {} still runs on r{}",
                going.tick, going.replica
            );
            self.violation(what);
        }
        if let Some(earlier) = self
            .runs
            .iter()
            .find(|run| run.job == job && run.tick == tick)
        {
            let what = format!(
                "job{job} tick {tick} started twice: on r{} (token {}) and on r{replica} (token {token})",
                earlier.replica, earlier.token
            );
            self.violation(what);
        }
        self.runs.push(Run {
            replica,
            job,
            tick,
            token,
            end: None,
            committing: false,
            from: self.now_ms(),
            to: None,
        });
        self.runs.len() - 1
    }

    /// Run `run` writes its effect through the fence: whether the fence took it.
    pub(crate) fn write(&mut self, run: usize) -> bool {
        let Run {
            job, tick, token, ..
        } = self.runs[run];
        let fence = self.fence.entry(job).or_default();
        if token < *fence {
            return false;
        }
        *fence = token;
        self.effects.push(Effect { run, job, tick });
        true
    }

    pub(crate) fn ended(&mut self, run: usize, end: End) {
        let Run {
            replica, job, tick, ..
        } = self.runs[run];
        if self.runs[run].end.is_some() {
            // Its replica crashed: what its handler does afterwards is not seen.
            return;
        }
        self.log
            .log(|| format!("r{replica} job{job} tick {tick} ends: {end:?}"));
        self.runs[run].end = Some(end);
        self.runs[run].to = Some(self.now_ms());
    }

    /// The effects a memory history kept, each naming the run that wrote it: (job,
    /// tick, run number).
    pub(crate) fn history_effects(&mut self, effects: &[(String, DateTime<Utc>, String)]) {
        for (job, tick, what) in effects {
            let Some(run) = what
                .parse::<usize>()
                .ok()
                .filter(|&run| run < self.runs.len())
            else {
                self.violation(format!(
                    "an effect of {job} tick {tick} names no run: {what}"
                ));
                continue;
            };
            let (run_job, run_tick) = (self.runs[run].job, self.runs[run].tick);
            if *job != format!("job{run_job}") || tick.timestamp_millis() != run_tick {
                self.violation(format!(
                    "run {run} (job{run_job} tick {run_tick}) committed as {job} tick {tick}"
                ));
            }
            self.effects.push(Effect {
                run,
                job: run_job,
                tick: run_tick,
            });
        }
    }

    /// The history's rows against the runs seen: `succeeded` where and only where a
    /// tick's effect is, by the replica that wrote it; a row for every run started
    /// before `until` on a replica that did not crash. `rows`: (job, tick, instance,
    /// succeeded).
    pub(crate) fn check_rows(
        &mut self,
        rows: &[(usize, i64, String, bool)],
        crashed: &[bool],
        until: i64,
    ) {
        let mut found = Vec::new();
        for effect in &self.effects {
            let writer = format!("r{}", self.runs[effect.run].replica);
            let row = rows
                .iter()
                .find(|(job, tick, ..)| *job == effect.job && *tick == effect.tick);
            match row {
                Some((.., instance, true)) if *instance == writer => {}
                other => found.push(format!(
                    "job{} tick {} has an effect by {writer}, but its row is {other:?}",
                    effect.job, effect.tick
                )),
            }
        }
        for (job, tick, instance, succeeded) in rows {
            let effect = self
                .effects
                .iter()
                .any(|effect| effect.job == *job && effect.tick == *tick);
            if *succeeded && !effect {
                found.push(format!(
                    "job{job} tick {tick} is recorded as succeeded on {instance} without its effect"
                ));
            }
        }
        for run in &self.runs {
            let counted = !crashed[run.replica] && run.from < until;
            if counted
                && !rows
                    .iter()
                    .any(|(job, tick, ..)| *job == run.job && *tick == run.tick)
            {
                found.push(format!(
                    "job{} tick {} ran on r{} and has no row",
                    run.job, run.tick, run.replica
                ));
            }
        }
        self.count_by("history rows", rows.len());
        for what in found {
            self.violation(what);
        }
    }

    /// Triggers an operator saw succeed: (job, tick run). Each must have started once,
    /// unless a replica crashed (the run may have been its).
    pub(crate) fn check_triggers(&mut self, triggered: &[(usize, i64)], any_crashed: bool) {
        for &(job, tick) in triggered {
            self.count("triggers that succeeded");
            let started = self
                .runs
                .iter()
                .any(|run| run.job == job && run.tick == tick);
            if !started && !any_crashed {
                self.violation(format!(
                    "job{job}: a trigger succeeded with tick {tick}, which never ran"
                ));
            }
        }
    }

    fn count_by(&mut self, what: &'static str, n: usize) {
        *self.counts.entry(what).or_default() += u64::try_from(n).unwrap_or(u64::MAX);
    }

    /// Run `run` sends its commit: a crash from now on may come after it took effect.
    pub(crate) fn committing(&mut self, run: usize) {
        self.runs[run].committing = true;
    }

    /// `replica` crashes: its runs end now, those whose commit was sent in doubt.
    pub(crate) fn crashed(&mut self, replica: usize) {
        let now = self.now_ms();
        for run in self
            .runs
            .iter_mut()
            .filter(|run| run.replica == replica && run.end.is_none())
        {
            run.end = Some(if run.committing {
                End::Unknown
            } else {
                End::Crashed
            });
            run.to = Some(now);
        }
    }

    /// The checks made once the seed has run, ticks in ms of wall time: `ticks` per job,
    /// the scheduled ticks up to `until` (the end less the longest run and a margin).
    pub(crate) fn check(&mut self, ticks: &[Vec<i64>], until: i64) {
        let mut per_tick: BTreeMap<(usize, i64), Vec<usize>> = BTreeMap::new();
        for effect in &self.effects {
            per_tick
                .entry((effect.job, effect.tick))
                .or_default()
                .push(effect.run);
        }
        let mut found = Vec::new();
        for ((job, tick), runs) in &per_tick {
            if runs.len() > 1 {
                found.push(format!("job{job} tick {tick} has {} effects", runs.len()));
            }
        }
        for (i, run) in self.runs.iter().enumerate() {
            let written = self.effects.iter().any(|effect| effect.run == i);
            match run.end {
                Some(End::Wrote) if !written => found.push(format!(
                    "job{} tick {} succeeded without its effect",
                    run.job, run.tick
                )),
                Some(End::Failed | End::Cancelled | End::Refused | End::Crashed) if written => {
                    found.push(format!(
                        "job{} tick {} failed, yet wrote",
                        run.job, run.tick
                    ))
                }
                _ => {}
            }
        }
        if self.faultless {
            match self.first_leader {
                None => found.push("no replica ever led in a seed without faults".to_owned()),
                Some(first) => {
                    for (job, ticks) in ticks.iter().enumerate() {
                        for &tick in ticks.iter().filter(|&&t| t > first + 1000 && t <= until) {
                            self.counts
                                .entry("ticks checked exactly once")
                                .and_modify(|n| *n += 1)
                                .or_insert(1);
                            let runs: Vec<&Run> = self
                                .runs
                                .iter()
                                .filter(|run| run.job == job && run.tick == tick)
                                .collect();
                            let overlapped = self.runs.iter().any(|run| {
                                run.job == job
                                    && run.tick != tick
                                    && run.from <= tick + SKEW_MS
                                    && run.to.unwrap_or(i64::MAX) >= tick - SKEW_MS
                            });
                            match runs.as_slice() {
                                [] if overlapped => {}
                                [run] if run.end == Some(End::Wrote) => {}
                                [run] if run.end == Some(End::Failed) => {}
                                [] => found.push(format!(
                                    "job{job} tick {tick} never ran in a seed without faults"
                                )),
                                [run, ..] => found.push(format!(
                                    "job{job} tick {tick} ended {:?} in a seed without faults",
                                    run.end
                                )),
                            }
                        }
                    }
                }
            }
        }
        for what in found {
            self.violation(what);
        }
    }
}

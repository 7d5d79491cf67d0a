//! Leading: find where each job stands, then fire its ticks while leadership lasts; and
//! the leader's housekeeping (pauses, operators' requests, runs left behind, retention).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::handoff::{BEAT, Placed, RESCAN};
use super::parts::Parts;
use super::requests::REQUEST_POLL;
use super::state::{JobDef, JobState, lock};
use super::tick::{AHEAD, NotTaken};
use crate::leader::LeaderEvent;
use crate::leader::Leadership;
use crate::plan::{self, Action, Recorded};
use crate::telemetry::SkipReason;

/// How often the leader refreshes the pauses other replicas set in the history.
const PAUSE_REFRESH: Duration = Duration::from_secs(1);

/// How often the leader looks for runs left `running` by a dead replica: a few run-lock
/// TTLs (a dead replica's run lock is gone one TTL after it died), within these bounds.
const SWEEP_MIN: Duration = Duration::from_secs(1);
const SWEEP_MAX: Duration = Duration::from_secs(30);

/// How often the leader prunes the history (with a retention set).
const PRUNE_INTERVAL: Duration = Duration::from_secs(600);

/// Carries out one planned tick.
async fn handle_tick(
    parts: &Parts,
    index: usize,
    tick: DateTime<Utc>,
    action: Action,
    leadership: &Leadership,
) {
    let Some(state) = parts.ctx.jobs.get(index) else {
        return;
    };
    let state = &*state;
    let deadline = parts.ctx.deadline(state, tick);
    let token = leadership.epoch();
    // An on-time run that may go anywhere is placed ahead of its time, and claimed
    // then if it goes to another replica; a run that stays here is claimed at its
    // time, so that a leader that stops before leaves the tick to the next one.
    let mut placed = None;
    if matches!(action, Action::Run { late: false }) && parts.ctx.spreads(state) {
        match parts.handoffs.place(leadership, deadline, true).await {
            Placed::Stopped => return,
            place => placed = Some(place),
        }
    }
    let handing_over = matches!(placed, Some(Placed::There(_)));
    if !handing_over && !parts.ticks.wait_for_tick(tick, Some(leadership)).await {
        return;
    }
    // A replica chosen ahead that gets no hand-off after all.
    let withdraw = || {
        if let Some(Placed::There(replica)) = &placed {
            parts.handoffs.withdraw(replica);
        }
    };
    let claim = match parts.ticks.claim(state, tick, deadline, leadership).await {
        Ok(claim) => claim,
        Err(NotTaken::Held) => {
            tracing::debug!(job = %state.name, %tick, "tick already claimed elsewhere");
            withdraw();
            return;
        }
        Err(NotTaken::Stopped) => {
            withdraw();
            return;
        }
        Err(NotTaken::Failed(err)) => {
            withdraw();
            tracing::warn!(job = %state.name, %tick, error = %err, "could not claim the tick within its grace window: not run");
            parts.ticks.record_skip(
                state,
                tick,
                token,
                SkipReason::Unclaimable,
                format!("not claimable within the grace window: {err}"),
            );
            return;
        }
    };
    let late = match action {
        Action::Skip(reason) => {
            parts
                .ticks
                .record_skip(state, tick, token, SkipReason::Missed, reason);
            claim.keep();
            return;
        }
        Action::Run { late } => late,
    };
    if state.paused.load(Ordering::Acquire) {
        withdraw();
        let paused = SkipReason::Paused;
        parts
            .ticks
            .record_skip(state, tick, token, paused, "paused".to_owned());
        claim.keep();
        return;
    }
    if parts.ticks.dropped(state, tick, token) {
        withdraw();
        claim.keep();
        return;
    }
    if let Some(Placed::There(replica)) = &placed {
        match parts
            .handoffs
            .hand_over(state, tick, replica, leadership)
            .await
        {
            // Leadership ended while the hand-off was retried: one that failed may have
            // landed all the same (its answer lost), so the claim stays.
            Ok(()) | Err(None) => {}
            Err(Some(reason)) => {
                withdraw();
                parts
                    .ticks
                    .record_skip(state, tick, token, SkipReason::Untaken, reason);
            }
        }
        claim.keep();
        return;
    }
    // Here: when this replica has room for it.
    let placed = match placed {
        Some(placed) => placed,
        None => parts.handoffs.place(leadership, deadline, false).await,
    };
    let slot = match placed {
        Placed::Here(slot) => slot,
        Placed::Nowhere => {
            let reason =
                "no replica had room for the run (max_concurrent_runs) within the grace window";
            parts
                .ticks
                .record_skip(state, tick, token, SkipReason::NoRoom, reason.to_owned());
            claim.keep();
            return;
        }
        Placed::There(_) => {
            claim.keep();
            return;
        }
        Placed::Stopped => {
            // Leadership ended first: the tick is the next leader's.
            claim.give_back().await;
            return;
        }
    };
    if parts
        .ticks
        .run_here(index, tick, late, slot, leadership)
        .await
    {
        claim.keep();
    } else {
        // Leadership ended before the run started: the tick is the next leader's.
        claim.give_back().await;
    }
}

/// Follows the election: while this replica leads, fires the jobs.
pub(super) async fn lead(parts: Parts, mut events: tokio::sync::watch::Receiver<LeaderEvent>) {
    loop {
        let leadership = match &*events.borrow_and_update() {
            LeaderEvent::Elected(l) if l.is_current() => Some(l.clone()),
            _ => None,
        };
        if let Some(leadership) = leadership {
            let firing = CancellationToken::new();
            if parts.ctx.recorder.is_some() {
                tokio::spawn(housekeeping(
                    parts.clone(),
                    leadership.clone(),
                    firing.clone(),
                ));
            }
            tokio::select! {
                biased;
                () = leadership.ended_token().cancelled() => {}
                () = parts.ctx.stop_firing.cancelled() => {}
                () = fire_jobs(&parts, &leadership, &firing) => {}
            }
            firing.cancel();
        }
        tokio::select! {
            biased;
            () = parts.ctx.stop_firing.cancelled() => return,
            changed = events.changed() => if changed.is_err() { return },
        }
    }
}

/// A job's firing loop: the definition it fires, and how to retire it.
struct Firing {
    version: u64,
    retire: Retire,
}

/// Tells a firing loop to stop: at once (the job was removed), or after firing its
/// definition's ticks up to the time the next definition took effect.
#[derive(Clone)]
struct Retire {
    token: CancellationToken,
    at: Arc<std::sync::Mutex<Option<DateTime<Utc>>>>,
}

impl Retire {
    fn new(parent: &CancellationToken) -> Self {
        Self {
            token: parent.child_token(),
            at: Arc::default(),
        }
    }

    /// Retires the loop, its ticks fired up to `at` (none more if `None`).
    fn retire(&self, at: Option<DateTime<Utc>>) {
        *lock(&self.at) = at;
        self.token.cancel();
    }

    /// `None` while the loop goes on; then up to when it fires its ticks.
    fn retired(&self) -> Option<Option<DateTime<Utc>>> {
        self.token.is_cancelled().then(|| *lock(&self.at))
    }
}

/// Fires every job in force while `leadership` lasts: a loop per job, started at the
/// election from where the history says each job stands, and restarted (or ended)
/// when a job is rescheduled, added or removed at run time.
async fn fire_jobs(parts: &Parts, leadership: &Leadership, firing: &CancellationToken) {
    let mut changes = parts.ctx.jobs.subscribe();
    changes.mark_unchanged();
    let elected = parts.ctx.clock.now();
    let recorded = last_ticks(parts, leadership).await;
    // The jobs as changed at run time until now (read with the history: if it could
    // not be, the changes apply as they come).
    if recorded.is_some() {
        parts.changes.sync().await;
    }
    let mut loops: HashMap<usize, Firing> = HashMap::new();
    let mut first = true;
    loop {
        for (index, state) in parts.ctx.jobs.all() {
            let def = state.def();
            if state.is_removed() {
                if let Some(old) = loops.remove(&index) {
                    old.retire.retire(None);
                }
                continue;
            }
            if loops.get(&index).is_some_and(|f| f.version == def.version) {
                continue;
            }
            let start = match loops.remove(&index) {
                // Redefined while this replica leads: the new definition's ticks from
                // when it took effect (those the old one fired are claimed already).
                Some(old) => {
                    // The old one fires its ticks up to the switch, the new one after.
                    let now = parts.ctx.clock.now();
                    old.retire
                        .retire(Some(def.since.map_or(now, |since| since.min(now))));
                    Start::Switch
                }
                // At the election (or added since): from where the history says the
                // job stands, and not before its definition took effect.
                None => Start::Elected {
                    recorded: match &recorded {
                        Some(map) => map
                            .get(&*state.name)
                            .map_or(Recorded::Never, |t| Recorded::Last(*t)),
                        None => Recorded::Unknown,
                    },
                    elected,
                    added: !first,
                    at: parts.ctx.clock.now(),
                },
            };
            // At the election, the definitions replaced while nobody led fire their
            // missed ticks first, each up to when the next took effect (by its own
            // misfire policy, one after the other, so that their late runs do not
            // overlap), then the one in force. Every loop reckons from the same time
            // (`at`), so that they part the ticks without a gap.
            let replaced = match start {
                Start::Elected {
                    added: false, at, ..
                } => state
                    .replaced()
                    .into_iter()
                    .map(|old| (old.def, old.until.min(at)))
                    .collect(),
                _ => Vec::new(),
            };
            let retire = Retire::new(firing);
            loops.insert(
                index,
                Firing {
                    version: def.version,
                    retire: retire.clone(),
                },
            );
            let (parts, leadership, firing) = (parts.clone(), leadership.clone(), firing.clone());
            tokio::spawn(async move {
                for (old, until) in replaced {
                    let ended = Retire::new(&firing);
                    ended.retire(Some(until));
                    let state = Arc::clone(&state);
                    let (parts, leadership) = (parts.clone(), leadership.clone());
                    fire_loop(parts, index, state, old, start, leadership, ended).await;
                }
                fire_loop(parts, index, state, def, start, leadership, retire).await;
            });
        }
        first = false;
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// Where a firing loop starts.
#[derive(Debug, Clone, Copy)]
enum Start {
    /// At an election: from the job's last recorded tick, and not before its
    /// definition took effect (`added`: a job added while this replica leads, which
    /// has no replaced definitions to fire first).
    Elected {
        recorded: Recorded,
        elected: DateTime<Utc>,
        added: bool,
        /// When the loop was started: it starts from where it would have then, also
        /// after waiting for the loops of replaced definitions.
        at: DateTime<Utc>,
    },
    /// A new definition while parts: from when it took effect.
    Switch,
}

impl Start {
    /// Where a loop of a definition in force from `since` (`None`: declared in code)
    /// starts, run at `now` with the grace window `grace`: the time after which it
    /// fires ticks, and the election to plan its first ticks against (none at a
    /// switch). A loop started at an election reckons from when it was started (`at`),
    /// however long it waited for the loops of replaced definitions.
    fn cursor(
        self,
        since: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
        grace: Duration,
    ) -> (DateTime<Utc>, Option<DateTime<Utc>>) {
        match self {
            Start::Elected {
                recorded,
                elected,
                at,
                ..
            } => {
                // A definition set at run time fires no tick from before it took
                // effect, and is where its job stands when it never ran since: its
                // ticks after it that nobody ran were missed (unlike those of a job
                // declared in code, which is as new as the deployment).
                let since = since.map(|since| since.min(at));
                let recorded = match (recorded, since) {
                    (Recorded::Last(last), Some(since)) => Recorded::Last(last.max(since)),
                    (Recorded::Never | Recorded::Unknown, Some(since)) => Recorded::Last(since),
                    (recorded, _) => recorded,
                };
                let cursor = plan::start_cursor(recorded, elected, at, grace);
                (
                    since.map_or(cursor, |since| cursor.max(since)),
                    Some(elected),
                )
            }
            Start::Switch => (
                since
                    .map_or(now, |since| since.min(now))
                    .max(crate::time::earlier(now, grace)),
                None,
            ),
        }
    }
}

/// The latest recorded tick of each job, read with retries: a new leader does not fire
/// before it knows what ran (then the misfire policy decides about what did not). `None`
/// without a history, or when it stays unreadable past the longest grace window: the
/// Redis claims of the ticks in the window then tell what ran.
async fn last_ticks(
    parts: &Parts,
    leadership: &Leadership,
) -> Option<HashMap<String, DateTime<Utc>>> {
    let recorder = parts.ctx.recorder.as_ref()?;
    let give_up = parts
        .ctx
        .jobs
        .live()
        .iter()
        .map(|s| parts.ctx.grace(s))
        .max()
        .unwrap_or_default();
    let started = tokio::time::Instant::now();
    let mut backoff = Duration::from_millis(100);
    let mut failing = false;
    loop {
        match recorder.history().last_ticks(&parts.ctx.name).await {
            Ok(ticks) => {
                recorder.health.read_ok();
                if failing {
                    tracing::warn!(waited = ?started.elapsed(), "history readable again: the missed ticks are handled per each job's misfire policy");
                }
                return Some(ticks);
            }
            Err(err) => {
                recorder.health.fail(&err);
                if !failing {
                    tracing::warn!(error = %err, "cannot read the last ticks from the history: firing waits for it (missed ticks then go by each job's misfire policy)");
                    failing = true;
                }
                if started.elapsed() >= give_up {
                    tracing::error!(error = %err, "history unreadable for the whole grace window: firing from the grace window, the Redis claims telling what ran");
                    return None;
                }
            }
        }
        tokio::select! {
            biased;
            () = leadership.ended_token().cancelled() => return None,
            () = parts.ctx.stop_firing.cancelled() => return None,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// Fires one job's ticks under one definition while `leadership` lasts, until the
/// definition is replaced (`retire`). The first plan of an election sets the ticks
/// missed before it apart from those that came due while the leader waited for the
/// history ([`plan::plan_first`]).
async fn fire_loop(
    parts: Parts,
    index: usize,
    state: Arc<JobState>,
    def: Arc<JobDef>,
    start: Start,
    leadership: Leadership,
    retire: Retire,
) {
    let (mut cursor, mut elected) =
        start.cursor(def.since, parts.ctx.clock.now(), parts.ctx.grace(&state));
    // Runs handed to other replicas are handed out ahead of their time.
    let ahead = if parts.ctx.spreads(&state) {
        AHEAD
    } else {
        Duration::ZERO
    };
    let misfire = def.job.spec.misfire_policy();
    loop {
        let now = parts.ctx.clock.now();
        let mut until = crate::time::later(now, ahead);
        let retired = retire.retired();
        match retired {
            None => {}
            // Removed: nothing more.
            Some(None) => return,
            // Replaced: this definition's ticks up to the switch, then the new one's.
            Some(Some(at)) => until = until.min(at),
        }
        let due = def.schedule.ticks_between(cursor, until);
        if let Some(last) = due.last() {
            cursor = *last;
            let plan = match elected.take() {
                Some(elected) => plan::plan_first(&due, elected, now, misfire),
                None => plan::plan(&due, now, misfire),
            };
            if plan.uncounted > 0 {
                tracing::warn!(job = %state.name, ticks = plan.uncounted, "missed ticks neither run nor recorded one by one (too many)");
            }
            for (tick, action) in plan.steps {
                // Late runs go one after the other; the next tick waits for them.
                if state.catching_up.load(Ordering::Acquire) {
                    tokio::select! {
                        biased;
                        () = leadership.ended_token().cancelled() => return,
                        () = parts.ctx.stop_firing.cancelled() => return,
                        () = state.wait_idle() => {}
                    }
                }
                // Removed: nothing more (also for the loop of a replaced definition,
                // which no retirement reaches).
                if !leadership.is_current()
                    || parts.ctx.stop_firing.is_cancelled()
                    || state.is_removed()
                {
                    return;
                }
                let late = matches!(action, plan::Action::Run { late: true });
                let task = {
                    let (parts, leadership) = (parts.clone(), leadership.clone());
                    async move { handle_tick(&parts, index, tick, action, &leadership).await }
                };
                if late {
                    // Claimed and started before the next one is considered. Not cut
                    // short when leadership ends: the tick stops by itself then, and
                    // gives its claim back if it did not start.
                    parts.ctx.runs.track_future(task).await;
                } else {
                    parts.ctx.runs.spawn(task);
                }
            }
        } else {
            elected = None;
        }
        if retired.is_some() {
            return;
        }
        let Some(next) = def.schedule.next_after(cursor.max(now)) else {
            return;
        };
        let wake = next - chrono::Duration::from_std(ahead).unwrap_or_default();
        tokio::select! {
            // A tick due now fires before a retirement is heeded (it may be before the
            // switch); a retired loop goes round once more to fire up to the switch.
            biased;
            () = parts.ctx.clock.sleep_until(wake) => {}
            () = retire.token.cancelled() => {}
            () = leadership.ended_token().cancelled() => return,
            () = parts.ctx.stop_firing.cancelled() => return,
        }
    }
}

/// The leader's chores: refresh pauses set by other replicas; carry out operators'
/// requests; close runs whose replica died; prune the history per its retention.
async fn housekeeping(parts: Parts, leadership: Leadership, firing: CancellationToken) {
    let Some(recorder) = parts.ctx.recorder.clone() else {
        return;
    };
    // The leader's record for admin tools: renewed while parts, ended with it.
    let (tenure, elected) = (Arc::clone(&parts.tenure), leadership.clone());
    tokio::spawn(async move { tenure.keep_record(elected).await });
    let mut pauses = tokio::time::interval(PAUSE_REFRESH);
    let mut requests = tokio::time::interval(REQUEST_POLL);
    // A slow round (a trigger waiting on Redis) is not made up for with a burst.
    requests.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sweeps =
        tokio::time::interval((parts.ticks.run_lock_ttl() * 2).clamp(SWEEP_MIN, SWEEP_MAX));
    let mut prunes = tokio::time::interval(PRUNE_INTERVAL);
    // Where runs go: who is alive, and the hand-offs not taken.
    parts.handoffs.reset();
    let mut replicas = tokio::time::interval(BEAT);
    let mut rescans = tokio::time::interval(RESCAN);
    replicas.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    rescans.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // The end first; then the chores in this order (each an interval: ready once per
        // period, so none starves the others).
        tokio::select! {
            biased;
            () = firing.cancelled() => return,
            () = leadership.ended_token().cancelled() => return,
            _ = pauses.tick() => match recorder.history().control().paused_jobs(&parts.ctx.name).await {
                Ok(paused) => {
                    recorder.health.read_ok();
                    for state in parts.ctx.jobs.live() {
                        state.paused.store(paused.iter().any(|p| *p == *state.name), Ordering::Release);
                    }
                }
                // The pauses last read stay in force.
                Err(err) => recorder.health.fail(&err),
            },
            _ = requests.tick() => parts.requests.serve(&parts.ticks, &parts.tenure, &leadership).await,
            _ = sweeps.tick() => parts.ticks.sweep_abandoned(&leadership).await,
            _ = replicas.tick() => parts.handoffs.refresh_replicas().await,
            _ = rescans.tick() => parts.handoffs.rescan(&parts.ticks, &leadership).await,
            _ = prunes.tick(), if recorder.history().prunes() => {
                match recorder.history().prune(&parts.ctx.name, parts.ctx.clock.now()).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(rows = n, "history pruned"),
                    Err(err) => recorder.health.fail(&err),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use chrono::TimeZone;

    use super::*;

    fn at(second: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, second).unwrap()
    }

    fn elected(recorded: Recorded, at_: DateTime<Utc>) -> Start {
        Start::Elected {
            recorded,
            elected: at_,
            added: false,
            at: at_,
        }
    }

    #[test]
    fn a_loop_started_late_at_an_election_starts_where_it_would_have_at_once() {
        let grace = Duration::from_secs(5);
        // Elected at 20, the job last ran at 10, its definition in force since 15: the
        // ticks after 15 are its own, also when its loop starts at 40 (after the loops
        // of replaced definitions ran their late runs), past the grace window.
        let start = elected(Recorded::Last(at(10)), at(20));
        for now in [at(20), at(40)] {
            assert_eq!(
                start.cursor(Some(at(15)), now, grace),
                (at(15), Some(at(20)))
            );
        }
        // Declared in code: from the last tick, within the grace window of the election.
        assert_eq!(start.cursor(None, at(40), grace).0, at(15));
        let start = elected(Recorded::Last(at(18)), at(20));
        assert_eq!(start.cursor(Some(at(15)), at(40), grace).0, at(18));
    }

    #[test]
    fn a_definition_set_at_run_time_that_never_ran_starts_at_its_change() {
        let grace = Duration::from_secs(5);
        for recorded in [Recorded::Never, Recorded::Unknown] {
            let start = elected(recorded, at(20));
            assert_eq!(start.cursor(Some(at(17)), at(20), grace).0, at(17));
            // Not before the grace window.
            assert_eq!(start.cursor(Some(at(2)), at(20), grace).0, at(15));
            // Not after the election, for a change stamped by a clock ahead.
            assert_eq!(start.cursor(Some(at(30)), at(20), grace).0, at(20));
        }
        // A job declared in code that never ran: as new as the deployment.
        let start = elected(Recorded::Never, at(20));
        assert!(start.cursor(None, at(20), grace).0 >= at(19));
    }

    #[test]
    fn a_switch_starts_at_the_change_within_the_grace_window() {
        let grace = Duration::from_secs(5);
        let now = at(20);
        assert_eq!(
            Start::Switch.cursor(Some(at(18)), now, grace),
            (at(18), None)
        );
        assert_eq!(Start::Switch.cursor(Some(at(2)), now, grace).0, at(15));
        assert_eq!(Start::Switch.cursor(Some(at(30)), now, grace).0, now);
        assert_eq!(Start::Switch.cursor(None, now, grace).0, now);
    }
}

//! Runs spread over the replicas: the leader decides which ticks run (claims, misfire
//! policy, pauses, history rows) and hands each on-time run of a job that may run
//! anywhere to the replica with the fewest runs going among those alive with room
//! ([`Placement`](super::placement::Placement)), through the history database:
//!
//! - every replica says every [`BEAT`] that it is alive, its limit and its runs going;
//! - the leader hands a tick over [`AHEAD`](super::tick::AHEAD) of its time (a row naming the replica);
//! - the replica looks for its rows every [`POLL`], waits for the tick, takes the job's
//!   run lock (no overlap, cluster-wide), then takes the row (deleting it where it still
//!   names this replica: one replica at most), inserts the tick's run row and runs it
//!   under the leader's fencing token; a replica at its limit, or without the job,
//!   declines the row instead;
//! - the leader moves a row that was declined, or not taken [`TAKE_WITHIN`] after its
//!   tick by a replica that stopped beating (it died, or is paused or cut off; one that
//!   beats may be waiting for the run lock), to another replica or to itself, and
//!   records the tick skipped once its grace window is over.
//!
//! A run handed over holds the job's run lock as every run does: a replica that dies
//! mid-run leaves it to expire, and the leader's sweep records the run abandoned.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::context::Context;
use super::placement::Place;
use super::placement::Placement;
use super::state::{JobState, Slot, lock};
use super::tick::{Grant, RunLockRefused, Ticks};
use crate::history::{Handoff, Outcome, Presence};
use crate::leader::Leadership;
use crate::telemetry::SkipReason;

/// How often a replica says it is alive (and the leader reads who is).
pub(super) const BEAT: Duration = Duration::from_millis(250);

/// A replica silent for this long is given no runs (four beats missed).
const ALIVE: Duration = Duration::from_millis(1000);

/// A replica silent for this long is forgotten (its row deleted).
const FORGET: Duration = Duration::from_secs(3600);

/// How often a replica looks for the ticks handed to it.
const POLL: Duration = Duration::from_millis(100);

/// A tick not taken this long after its time is moved to another replica (a live
/// replica takes it at its time; this is how late a run whose replica died starts).
const TAKE_WITHIN: Duration = Duration::from_millis(500);

/// How often a replica writes the names of its handlers beside its beat.
const HANDLERS_EVERY: Duration = Duration::from_secs(30);

/// How often the leader looks for ticks declined or not taken.
pub(super) const RESCAN: Duration = Duration::from_millis(250);

/// How often a tick that found every replica full looks for room again.
const ROOM_WAIT: Duration = Duration::from_millis(50);

/// Where [`Handoffs::place`] puts a run.
pub(super) enum Placed {
    /// Here, counted by this slot.
    Here(Slot),
    /// On that replica.
    There(String),
    /// No replica had room within the grace window.
    Nowhere,
    /// Leadership ended or shutdown began.
    Stopped,
}

fn earlier(t: DateTime<Utc>, by: Duration) -> DateTime<Utc> {
    t - chrono::Duration::from_std(by).unwrap_or_default()
}

/// Hand-offs: the leader's view of the replicas (where runs go) and what this replica
/// says of itself to the leader.
pub(super) struct Handoffs {
    ctx: Arc<Context>,
    /// The leader's view of where runs go.
    placement: Mutex<Placement>,
    /// A digest of the names of the jobs declared in code: runs are handed only to
    /// replicas with the same (jobs changed at run time are the same on every replica
    /// once applied; one that lacks a job or its handler yet declines its runs).
    jobs_digest: String,
    /// The names of the handlers registered here, sorted, as a JSON array (for the
    /// replica's beats).
    handler_names: String,
}

impl Handoffs {
    pub(super) fn new(ctx: Arc<Context>, jobs_digest: String, handler_names: String) -> Self {
        Self {
            ctx,
            placement: Mutex::new(Placement::default()),
            jobs_digest,
            handler_names,
        }
    }

    /// The leader, elected: forgets what an earlier leadership knew of the replicas.
    pub(super) fn reset(&self) {
        lock(&self.placement).reset();
    }

    /// The leader: where the next run goes, on any replica (`anywhere`) or here only.
    /// Waits for room (every replica full, or this one) until `deadline`.
    pub(super) async fn place(
        &self,
        leadership: &Leadership,
        deadline: DateTime<Utc>,
        anywhere: bool,
    ) -> Placed {
        loop {
            let now = self.ctx.clock.now();
            // While the history fails, nothing is handed over (a hand-off would wait
            // for it): runs stay here, their Redis claims keeping them to this replica.
            let anywhere = anywhere && self.ctx.recorder.as_ref().is_some_and(|r| r.health.is_ok());
            if !anywhere {
                if let Some(slot) = self.ctx.slots.try_take() {
                    return Placed::Here(slot);
                }
            } else {
                match self.choose(&[], now) {
                    Some(Place::Here) => {
                        if let Some(slot) = self.ctx.slots.try_take() {
                            return Placed::Here(slot);
                        }
                        // A run started here meanwhile: choose again.
                        continue;
                    }
                    Some(Place::There(replica)) => return Placed::There(replica),
                    None => {}
                }
            }
            if crate::time::later(now, ROOM_WAIT) > deadline {
                return Placed::Nowhere;
            }
            tokio::select! {
                biased;
                () = leadership.ended_token().cancelled() => return Placed::Stopped,
                () = self.ctx.stop_firing.cancelled() => return Placed::Stopped,
                () = tokio::time::sleep(ROOM_WAIT) => {}
            }
        }
    }

    /// The leader: `replica`, chosen by [`place`](Self::place), gets no hand-off after
    /// all (see [`Placement::withdraw`]).
    pub(super) fn withdraw(&self, replica: &str) {
        lock(&self.placement).withdraw(replica);
    }

    /// The leader: hands the claimed `tick` of `state` to `replica`, retrying a failed
    /// insert until the tick's grace window ends (the insert is idempotent: a row
    /// written by an attempt whose answer was lost is found by the next). `Err` with the
    /// reason when it could not, or `Err(None)` when leadership ended meanwhile.
    pub(super) async fn hand_over(
        &self,
        state: &JobState,
        tick: DateTime<Utc>,
        replica: &str,
        leadership: &Leadership,
    ) -> Result<(), Option<String>> {
        let Some(recorder) = &self.ctx.recorder else {
            return Err(Some("no history to hand it over through".to_owned()));
        };
        let deadline = self.ctx.deadline(state, tick);
        let mut backoff = ROOM_WAIT;
        loop {
            let now = self.ctx.clock.now();
            let handed = recorder
                .history()
                .dispatch()
                .hand_off(
                    &self.ctx.name,
                    &state.name,
                    tick,
                    replica,
                    leadership.epoch(),
                    now,
                )
                .await;
            let err = match handed {
                Ok(handed) => {
                    if !handed {
                        tracing::debug!(job = %state.name, %tick, "tick already handed over");
                    }
                    return Ok(());
                }
                Err(err) => err,
            };
            recorder.health.fail(&err);
            if crate::time::later(now, backoff) > deadline {
                return Err(Some(format!(
                    "the history did not take its hand-off: {err}"
                )));
            }
            tracing::debug!(job = %state.name, %tick, error = %err, "hand-off failed; retrying");
            tokio::select! {
                biased;
                () = leadership.ended_token().cancelled() => return Err(None),
                () = self.ctx.stop_firing.cancelled() => return Err(None),
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// What this replica says of itself to the leader, having picked up the hand-offs
    /// made until `polled_ms`.
    fn presence(&self, polled_ms: i64) -> Presence {
        let running = self.ctx.slots.running();
        Presence {
            instance: self.ctx.instance.to_string(),
            capacity: self
                .ctx
                .slots
                .capacity()
                .map(|c| u32::try_from(c).unwrap_or(u32::MAX)),
            running: u32::try_from(running).unwrap_or(u32::MAX),
            polled_ms,
            jobs_digest: self.jobs_digest.clone(),
            seen: self.ctx.clock.now(),
        }
    }

    /// The placement's choice for one run, replicas in `exclude` passed over.
    fn choose(&self, exclude: &[&str], now: DateTime<Utc>) -> Option<Place> {
        let slots = &self.ctx.slots;
        lock(&self.placement).choose(
            &self.ctx.instance,
            slots.running(),
            slots.capacity(),
            exclude,
            now,
        )
    }

    /// The leader: reads which replicas are alive and how busy (every [`BEAT`]).
    pub(super) async fn refresh_replicas(&self) {
        let Some(recorder) = &self.ctx.recorder else {
            return;
        };
        let now = self.ctx.clock.now();
        let replicas = recorder
            .history()
            .dispatch()
            .replicas(&self.ctx.name, earlier(now, ALIVE), earlier(now, FORGET))
            .await;
        match replicas {
            Ok(replicas) => {
                recorder.health.read_ok();
                lock(&self.placement).refresh(replicas, &self.presence(0), now);
            }
            // Unknown: none gets runs until they are read again.
            Err(err) => {
                recorder.health.fail(&err);
                lock(&self.placement).refresh(Vec::new(), &self.presence(0), now);
            }
        }
    }

    /// The leader: moves the hand-offs declined, or not taken within [`TAKE_WITHIN`]
    /// of their tick, to another replica (this one included); records those whose grace
    /// window ended as skipped.
    pub(super) async fn rescan(&self, ticks: &Arc<Ticks>, leadership: &Leadership) {
        let Some(recorder) = &self.ctx.recorder else {
            return;
        };
        let history = recorder.history();
        let now = self.ctx.clock.now();
        let stale = match history
            .dispatch()
            .stale_handoffs(&self.ctx.name, earlier(now, TAKE_WITHIN))
            .await
        {
            Ok(stale) => stale,
            Err(err) => {
                recorder.health.fail(&err);
                return;
            }
        };
        for handoff in stale {
            if !leadership.is_current() || self.ctx.stop_firing.is_cancelled() {
                return;
            }
            let token = leadership.epoch();
            if let Some((_, state)) = self.ctx.jobs.find(&handoff.job)
                && (state.is_removed() || state.superseded(handoff.tick))
            {
                if let Ok(true) = history
                    .dispatch()
                    .move_handoff(&self.ctx.name, &handoff, None, token, now)
                    .await
                {
                    ticks.dropped(&state, handoff.tick, token);
                }
                continue;
            }
            let Ok((_, state)) = self.ctx.job(&handoff.job) else {
                // A job this replica does not have (replicas declare different jobs):
                // nobody here can run it.
                if let Ok(true) = history
                    .dispatch()
                    .move_handoff(&self.ctx.name, &handoff, None, token, now)
                    .await
                {
                    tracing::warn!(job = %handoff.job, tick = %handoff.tick, "a tick of a job this leader does not declare was not taken: dropped");
                }
                continue;
            };
            let state = &*state;
            // A replica alive may be waiting for the job's run lock (a late tick): its
            // hand-off stays with it. One that stopped beating, or declined, loses it.
            let alive = *handoff.replica == *self.ctx.instance
                || lock(&self.placement).is_alive(&handoff.replica);
            if handoff.declined_by.is_none()
                && alive
                && now <= self.ctx.deadline(state, handoff.tick)
            {
                continue;
            }
            let why = match &handoff.declined_by {
                Some(by) => format!("declined by replica {by}"),
                None => format!("not taken by replica {}", handoff.replica),
            };
            if now > self.ctx.deadline(state, handoff.tick) {
                if let Ok(true) = history
                    .dispatch()
                    .move_handoff(&self.ctx.name, &handoff, None, token, now)
                    .await
                {
                    let reason = format!("handed over but {why} within the grace window");
                    ticks.record_skip(state, handoff.tick, token, SkipReason::Untaken, reason);
                }
                continue;
            }
            // Not the replica that declined it, nor the one that did not take it (unless
            // that is this one: its history was away). This replica, when it declined
            // a job it can run, did so for want of room (a run started here between the
            // choice and the take) or of a quorum for the run lock: it stays a
            // candidate, `choose` checking its room again.
            let declined_here =
                handoff.declined_by.as_deref() == Some(&*self.ctx.instance) && state.def().runnable;
            let mut exclude: Vec<&str> = handoff
                .declined_by
                .iter()
                .map(String::as_str)
                .filter(|_| !declined_here)
                .collect();
            if handoff.replica != *self.ctx.instance {
                exclude.push(&handoff.replica);
            }
            match self.choose(&exclude, now) {
                Some(Place::There(replica)) => {
                    if let Ok(true) = history
                        .dispatch()
                        .move_handoff(&self.ctx.name, &handoff, Some(&replica), token, now)
                        .await
                    {
                        tracing::info!(job = %state.name, tick = %handoff.tick, %why, to = %replica, "tick handed over again");
                    }
                }
                Some(Place::Here) => {
                    // Handed to this replica, as to any other: its `serve` takes it, and
                    // runs it whether or not this leadership lasts until the run starts
                    // (its replica may have died holding the job's run lock: a tick
                    // handed over after its time waits for it as a late run waits).
                    // Run by the leader itself, it would be lost if the leadership ended
                    // first: the hand-off gone, and no claim for the next leader to see.
                    let instance: &str = &self.ctx.instance;
                    if let Ok(true) = history
                        .dispatch()
                        .move_handoff(&self.ctx.name, &handoff, Some(instance), token, now)
                        .await
                    {
                        tracing::info!(job = %state.name, tick = %handoff.tick, %why, "tick handed over here");
                    }
                }
                // Every replica is full (or gone): looked at again on the next rescan,
                // until its grace window ends.
                None => {}
            }
        }
    }

    /// Every replica with a history, from `start()` to shutdown: says it is alive,
    /// and takes the ticks handed to it. On shutdown, declines those it has not started
    /// and takes itself out of the replicas runs are handed to.
    pub(super) async fn serve(self: Arc<Self>, ticks: Arc<Ticks>, stop: CancellationToken) {
        let inner = self;
        let Some(recorder) = inner.ctx.recorder.clone() else {
            return;
        };
        let history = recorder.history();
        let taking: Arc<Mutex<HashSet<(String, i64, i64)>>> = Arc::default();
        // The newest hand-off picked up (its slot reserved, so `running` counts it).
        let mut polled_ms = 0;
        let mut beat = tokio::time::interval(BEAT);
        let mut poll = tokio::time::interval(POLL);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut handlers_said: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                biased;
                () = inner.ctx.stop_firing.cancelled() => break,
                () = stop.cancelled() => break,
                _ = beat.tick() => {
                    if let Err(err) = history.dispatch().beat(&inner.ctx.name, &inner.presence(polled_ms)).await {
                        recorder.health.fail(&err);
                        continue;
                    }
                    // The handlers' names, for admin tools: with the first beat, then now
                    // and then (the list does not change; a row written anew gets it back).
                    if handlers_said.is_none_or(|at| at.elapsed() >= HANDLERS_EVERY) {
                        match history
                            .dispatch().say_handlers(&inner.ctx.name, &inner.ctx.instance, &inner.handler_names)
                            .await
                        {
                            Ok(()) => handlers_said = Some(tokio::time::Instant::now()),
                            Err(err) => recorder.health.fail(&err),
                        }
                    }
                }
                _ = poll.tick() => {
                    let handed = match history.dispatch().handed_to(&inner.ctx.name, &inner.ctx.instance).await {
                        Ok(handed) => handed,
                        Err(err) => {
                            recorder.health.fail(&err);
                            continue;
                        }
                    };
                    for handoff in handed {
                        polled_ms = polled_ms.max(handoff.dispatched_ms);
                        let key = (handoff.job.clone(), handoff.tick.timestamp_millis(), handoff.dispatched_ms);
                        if !lock(&taking).insert(key.clone()) {
                            continue;
                        }
                        // Counted here from now on (or declined, at the limit).
                        let slot = inner.ctx.slots.try_take();
                        let (handoffs, ticks, taking) =
                            (Arc::clone(&inner), Arc::clone(&ticks), Arc::clone(&taking));
                        inner.ctx.runs.spawn(async move {
                            handoffs.take_handoff(&ticks, handoff, slot).await;
                            lock(&taking).remove(&key);
                        });
                    }
                }
            }
        }
        // Leaving: what was handed here and not started goes back to the leader at once.
        if let Ok(handed) = history
            .dispatch()
            .handed_to(&inner.ctx.name, &inner.ctx.instance)
            .await
        {
            for handoff in handed {
                let key = (
                    handoff.job.clone(),
                    handoff.tick.timestamp_millis(),
                    handoff.dispatched_ms,
                );
                if !lock(&taking).contains(&key) {
                    let _ = history
                        .dispatch()
                        .decline_handoff(&inner.ctx.name, &handoff)
                        .await;
                }
            }
        }
        if let Err(err) = history
            .dispatch()
            .leave(&inner.ctx.name, &inner.ctx.instance)
            .await
        {
            tracing::debug!(error = %err, "could not take this replica out of the history's replicas");
        }
    }

    /// A replica: runs a tick the leader handed to it, or declines it (at its limit,
    /// without the job, without a quorum for the run lock, or shutting down).
    async fn take_handoff(&self, ticks: &Arc<Ticks>, handoff: Handoff, slot: Option<Slot>) {
        let Some(recorder) = &self.ctx.recorder else {
            return;
        };
        let history = recorder.history();
        let handoff = &handoff;
        let decline = |why: &'static str| async move {
            tracing::debug!(job = %handoff.job, tick = %handoff.tick, why, "declining a tick handed over");
            if let Err(err) = history
                .dispatch()
                .decline_handoff(&self.ctx.name, handoff)
                .await
            {
                recorder.health.fail(&err);
            }
        };
        let Ok((index, state)) = self.ctx.job(&handoff.job) else {
            decline("this replica does not declare the job").await;
            return;
        };
        let state = &*state;
        if !state.def().runnable {
            decline("this replica has no handler of the job's name").await;
            return;
        }
        let Some(slot) = slot else {
            decline("at max_concurrent_runs").await;
            return;
        };
        if !ticks.wait_for_tick(handoff.tick, None).await {
            decline("shutting down").await;
            return;
        }
        if state.superseded(handoff.tick) {
            // Rescheduled since: given back, for the leader to record.
            decline("the job was rescheduled without this tick").await;
            return;
        }
        if self.ctx.clock.now() > self.ctx.deadline(state, handoff.tick) {
            // Past its grace window: given back, for the leader to record.
            decline("past its grace window").await;
            return;
        }
        // A tick handed over after its time (moved from a replica that did not take
        // it, maybe one that died holding the job's run lock) waits for the run lock as
        // a late run does, within the grace window.
        let late = handoff.dispatched_ms > handoff.tick.timestamp_millis();
        let run_lock = match ticks.take_run_lock(state, handoff.tick, late, None).await {
            Ok(run_lock) => run_lock,
            Err(RunLockRefused::Overlap(reason)) => {
                // The tick is this replica's to record only once it took it.
                let taken = history
                    .dispatch()
                    .take_handoff(
                        &self.ctx.name,
                        handoff,
                        Outcome::Skipped,
                        Some(&reason),
                        self.ctx.clock.now(),
                    )
                    .await;
                if let Ok(true) = taken {
                    ticks.note_skip(state, handoff.tick, SkipReason::Overlap, &reason);
                }
                return;
            }
            Err(RunLockRefused::Stopped) => {
                decline("shutting down").await;
                return;
            }
            Err(RunLockRefused::Failed(_)) => {
                decline("the job's run lock could not be taken").await;
                return;
            }
        };
        let taken = history
            .dispatch()
            .take_handoff(
                &self.ctx.name,
                handoff,
                Outcome::Running,
                None,
                self.ctx.clock.now(),
            )
            .await;
        match taken {
            Ok(true) => {}
            Ok(false) => {
                // Moved to another replica meanwhile (or its row is another's).
                let _ = run_lock.release().await;
                return;
            }
            Err(err) => {
                // The answer was lost: the run's row says whether the take committed.
                recorder.health.fail(&err);
                let row = history
                    .run_at(&self.ctx.name, &handoff.job, handoff.tick)
                    .await;
                let ours = row.is_ok_and(|row| {
                    row.is_some_and(|row| {
                        *row.instance == *self.ctx.instance && row.outcome == Outcome::Running
                    })
                });
                if !ours {
                    let _ = run_lock.release().await;
                    return;
                }
            }
        }
        let grant = Grant::handed(handoff.token);
        ticks.start_run(index, handoff.tick, run_lock, grant, slot, false, false);
    }
}

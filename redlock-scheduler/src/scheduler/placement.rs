//! Where the leader runs a tick: on the replica with the fewest runs going among those
//! alive with room for one more (its `max_concurrent_runs`), itself included; ties go
//! to the replica given the fewest ticks so far, so runs spread evenly.
//!
//! Pure bookkeeping over what the replicas last said (`running`, refreshed every
//! [`BEAT`](super::handoff::BEAT)) plus the hand-offs made after the newest one each
//! had picked up, which its count cannot include yet.

use std::collections::{HashMap, VecDeque};

use chrono::{DateTime, Utc};

use crate::history::Presence;

/// How long a hand-off counts towards its replica's load when the replica has not said
/// anything newer (it beats far more often).
const RECENT_MS: i64 = 5_000;

/// Where a tick goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Place {
    /// On this replica (the leader).
    Here,
    /// Handed to that replica.
    There(String),
}

/// The leader's view of the replicas' load.
#[derive(Debug, Default)]
pub(super) struct Placement {
    /// The other replicas alive, as they last said.
    replicas: Vec<Presence>,
    /// When the hand-offs made lately to each replica were made (Unix ms, oldest first).
    recent: HashMap<String, VecDeque<i64>>,
    /// Ticks given to each replica (this one included) since this replica leads.
    given: HashMap<String, u64>,
}

/// A candidate's standing: fewer runs, then fewer ticks given, wins.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Standing {
    load: u64,
    given: u64,
}

impl Placement {
    /// What the replicas other than `me` said, alive ones only: those that declare
    /// the same jobs as `me` (the others may lack a job handed to them: during a
    /// rolling deploy that changes the jobs, runs stay with the leader's set).
    pub(super) fn refresh(&mut self, replicas: Vec<Presence>, me: &Presence, now: DateTime<Utc>) {
        self.replicas = replicas
            .into_iter()
            .filter(|r| r.instance != me.instance && r.jobs_digest == me.jobs_digest)
            .collect();
        let horizon = now.timestamp_millis() - RECENT_MS;
        for made in self.recent.values_mut() {
            while made.front().is_some_and(|at| *at < horizon) {
                made.pop_front();
            }
        }
        self.recent.retain(|_, made| !made.is_empty());
    }

    /// Whether `name` said it was alive at the last refresh (with the same jobs).
    pub(super) fn is_alive(&self, name: &str) -> bool {
        self.replicas.iter().any(|r| r.instance == name)
    }

    /// Takes back the latest choice of `name` (a replica chosen by
    /// [`choose`](Self::choose)) that was not handed over after all: the tick was
    /// claimed elsewhere, skipped or dropped, or the hand-off could not be made. It no
    /// longer counts towards the replica's load: a replica that gets no hand-off never
    /// says it picked one up, so a choice left standing would count against it until it
    /// ages out, and a replica taking one run at a time would look full all that while.
    pub(super) fn withdraw(&mut self, name: &str) {
        if let Some(made) = self.recent.get_mut(name) {
            made.pop_back();
        }
        if let Some(given) = self.given.get_mut(name) {
            *given = given.saturating_sub(1);
        }
    }

    /// Forgets what a past leadership gave out.
    pub(super) fn reset(&mut self) {
        self.recent.clear();
        self.given.clear();
    }

    /// Chooses where the next run goes: `None` if no replica has room. `me` has
    /// `running` runs going and room for `capacity` (`None`: no limit); replicas named
    /// in `exclude` are passed over. The choice counts towards its replica's load.
    pub(super) fn choose(
        &mut self,
        me: &str,
        running: usize,
        capacity: Option<usize>,
        exclude: &[&str],
        now: DateTime<Utc>,
    ) -> Option<Place> {
        let given = |name: &str| self.given.get(name).copied().unwrap_or(0);
        let mut best: Option<(Standing, Place)> = None;
        let here_load = u64::try_from(running).unwrap_or(u64::MAX);
        if !exclude.contains(&me) && capacity.is_none_or(|c| running < c) {
            best = Some((
                Standing {
                    load: here_load,
                    given: given(me),
                },
                Place::Here,
            ));
        }
        for replica in &self.replicas {
            if exclude.contains(&replica.instance.as_str()) {
                continue;
            }
            // The hand-offs it had not picked up when it said so.
            let since_said = self.recent.get(&replica.instance).map_or(0, |made| {
                made.len() - made.partition_point(|at| *at <= replica.polled_ms)
            });
            let load =
                u64::from(replica.running).saturating_add(u64::try_from(since_said).unwrap_or(0));
            if replica.capacity.is_some_and(|c| load >= u64::from(c)) {
                continue;
            }
            let standing = Standing {
                load,
                given: given(&replica.instance),
            };
            if best.as_ref().is_none_or(|(b, _)| standing < *b) {
                best = Some((standing, Place::There(replica.instance.clone())));
            }
        }
        let (_, place) = best?;
        let name = match &place {
            Place::Here => me.to_owned(),
            Place::There(name) => {
                let made = self.recent.entry(name.clone()).or_default();
                // Bounded also while no refresh comes (the history is away).
                while made
                    .front()
                    .is_some_and(|at| *at < now.timestamp_millis() - RECENT_MS)
                {
                    made.pop_front();
                }
                // Kept in order (a clock stepping back counts as no later).
                let at = made.back().map_or(now.timestamp_millis(), |last| {
                    now.timestamp_millis().max(*last)
                });
                made.push_back(at);
                name.clone()
            }
        };
        *self.given.entry(name).or_insert(0) += 1;
        Some(place)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly

    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    fn replica(name: &str, capacity: Option<u32>, running: u32, seen: i64) -> Presence {
        Presence {
            instance: name.to_owned(),
            capacity,
            running,
            polled_ms: at(seen).timestamp_millis(),
            jobs_digest: "jobs".to_owned(),
            seen: at(seen),
        }
    }

    fn me() -> Presence {
        replica("me", None, 0, 0)
    }

    #[test]
    fn runs_spread_evenly_over_idle_replicas() {
        let mut placement = Placement::default();
        placement.refresh(
            vec![
                replica("me", None, 0, 0),
                replica("b", None, 0, 0),
                replica("c", None, 0, 0),
            ],
            &me(),
            at(0),
        );
        let mut counts: HashMap<Place, u32> = HashMap::new();
        for i in 0..300 {
            // Runs end as fast as they start: only the ticks given tell replicas apart.
            let place = placement.choose("me", 0, None, &[], at(i)).unwrap();
            placement.refresh(
                vec![replica("b", None, 0, i + 1), replica("c", None, 0, i + 1)],
                &me(),
                at(i + 1),
            );
            *counts.entry(place).or_default() += 1;
        }
        assert_eq!(counts.len(), 3);
        assert!(counts.values().all(|&n| n == 100), "{counts:?}");
    }

    #[test]
    fn the_least_loaded_replica_with_room_wins() {
        let mut placement = Placement::default();
        placement.refresh(
            vec![replica("b", Some(2), 2, 0), replica("c", None, 5, 0)],
            &me(),
            at(0),
        );
        // b is full; c has 5 going, this replica 3.
        assert_eq!(
            placement.choose("me", 3, Some(4), &[], at(1)),
            Some(Place::Here)
        );
        // This replica is full now: c, although busier.
        assert_eq!(
            placement.choose("me", 4, Some(4), &[], at(2)),
            Some(Place::There("c".to_owned()))
        );
        // The hand-off to c counts until c says something newer.
        placement.refresh(
            vec![replica("b", Some(2), 1, 3), replica("c", None, 0, 0)],
            &me(),
            at(3),
        );
        assert_eq!(
            placement.choose("me", 4, Some(4), &[], at(4)),
            Some(Place::There("b".to_owned()))
        );
        // Everyone full (b counts the hand-off just made): nowhere.
        assert_eq!(placement.choose("me", 4, Some(4), &["c"], at(5)), None);
    }

    #[test]
    fn a_choice_withdrawn_no_longer_counts() {
        let mut placement = Placement::default();
        placement.refresh(vec![replica("b", Some(1), 0, 0)], &me(), at(0));
        // This replica is full: b, which takes one run at a time.
        assert_eq!(
            placement.choose("me", 1, Some(1), &[], at(1)),
            Some(Place::There("b".to_owned()))
        );
        // The tick was claimed elsewhere: b got nothing, and has room still, however
        // long it says nothing newer.
        placement.withdraw("b");
        placement.refresh(vec![replica("b", Some(1), 0, 0)], &me(), at(2));
        assert_eq!(
            placement.choose("me", 1, Some(1), &[], at(3)),
            Some(Place::There("b".to_owned()))
        );
        // A choice that stands counts: b is full until it says it picked it up.
        assert_eq!(placement.choose("me", 1, Some(1), &[], at(4)), None);
    }

    #[test]
    fn replicas_with_other_jobs_get_none() {
        let mut placement = Placement::default();
        let mut other = replica("b", None, 0, 0);
        other.jobs_digest = "other jobs".to_owned();
        placement.refresh(vec![other], &me(), at(0));
        assert_eq!(
            placement.choose("me", 9, None, &[], at(1)),
            Some(Place::Here)
        );
        assert_eq!(placement.choose("me", 0, None, &["me"], at(2)), None);
    }

    #[test]
    fn excluded_replicas_are_passed_over() {
        let mut placement = Placement::default();
        placement.refresh(vec![replica("b", None, 0, 0)], &me(), at(0));
        assert_eq!(
            placement.choose("me", 10, None, &["b"], at(1)),
            Some(Place::Here)
        );
        assert_eq!(
            placement.choose("me", 0, None, &["me"], at(2)),
            Some(Place::There("b".to_owned()))
        );
        placement.reset();
        placement.refresh(Vec::new(), &me(), at(10_000));
        assert_eq!(placement.choose("me", 0, None, &["me"], at(10_001)), None);
    }
}

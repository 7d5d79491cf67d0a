//! The replicas and hand-offs tables in memory, each statement a method that does what
//! [`Dispatch`](super::super::Dispatch)'s SQL does.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::super::{Handoff, Presence, from_ms, ms, token};

/// The most rows a read of hand-offs returns (its SQL's `LIMIT`).
const HANDOFFS_READ: usize = 1000;

/// A replica's row.
#[derive(Debug, Clone)]
struct ReplicaRow {
    capacity: Option<i64>,
    running: i64,
    polled_ms: i64,
    jobs_digest: String,
    seen_ms: i64,
    /// The handlers' names (a JSON array); `None` in a row a version without job
    /// changes wrote.
    handlers: Option<String>,
}

/// The replicas table: (scheduler, instance) to its row.
#[derive(Debug, Default)]
pub(in super::super) struct Replicas {
    rows: BTreeMap<(String, String), ReplicaRow>,
}

impl Replicas {
    /// [`Dispatch::beat`](super::super::Dispatch::beat).
    pub(in super::super) fn beat(&mut self, scheduler: &str, presence: &Presence) {
        let key = (scheduler.to_owned(), presence.instance.clone());
        let handlers = self
            .rows
            .get(&key)
            .map_or(Some(String::new()), |row| row.handlers.clone());
        let row = ReplicaRow {
            capacity: presence.capacity.map(i64::from),
            running: i64::from(presence.running),
            polled_ms: presence.polled_ms,
            jobs_digest: presence.jobs_digest.clone(),
            seen_ms: ms(presence.seen),
            handlers,
        };
        self.rows.insert(key, row);
    }

    /// [`Dispatch::say_handlers`](super::super::Dispatch::say_handlers).
    pub(in super::super) fn say_handlers(
        &mut self,
        scheduler: &str,
        instance: &str,
        handlers: &str,
    ) {
        if let Some(row) = self
            .rows
            .get_mut(&(scheduler.to_owned(), instance.to_owned()))
        {
            row.handlers = Some(handlers.to_owned());
        }
    }

    /// The rows of `scheduler` seen at `since_ms` or later, by instance.
    fn seen(&self, scheduler: &str, since_ms: i64) -> impl Iterator<Item = (&str, &ReplicaRow)> {
        self.rows
            .iter()
            .filter(move |((s, _), row)| s == scheduler && row.seen_ms >= since_ms)
            .map(|((_, instance), row)| (instance.as_str(), row))
    }

    /// [`Dispatch::replicas_without_changes`](super::super::Dispatch::replicas_without_changes).
    pub(in super::super) fn replicas_without_changes(
        &self,
        scheduler: &str,
        since: DateTime<Utc>,
    ) -> Vec<String> {
        self.seen(scheduler, ms(since))
            .filter(|(_, row)| row.handlers.is_none())
            .map(|(instance, _)| instance.to_owned())
            .collect()
    }

    /// [`Dispatch::handler_registered`](super::super::Dispatch::handler_registered).
    pub(in super::super) fn handler_registered(
        &self,
        scheduler: &str,
        handler: &str,
        since: DateTime<Utc>,
    ) -> Option<bool> {
        let mut seen = self.seen(scheduler, ms(since)).peekable();
        seen.peek()?;
        Some(seen.any(|(_, row)| {
            row.handlers.as_deref().is_some_and(|list| {
                serde_json::from_str::<Vec<String>>(list)
                    .is_ok_and(|names| names.iter().any(|name| name == handler))
            })
        }))
    }

    /// [`Dispatch::leave`](super::super::Dispatch::leave).
    pub(in super::super) fn leave(&mut self, scheduler: &str, instance: &str) {
        self.rows
            .remove(&(scheduler.to_owned(), instance.to_owned()));
    }

    /// [`Dispatch::replicas`](super::super::Dispatch::replicas): those silent since
    /// before `forget` deleted, those seen at `since` or later read, by instance.
    pub(in super::super) fn replicas(
        &mut self,
        scheduler: &str,
        since: DateTime<Utc>,
        forget: DateTime<Utc>,
    ) -> Vec<Presence> {
        let forget_ms = ms(forget);
        self.rows
            .retain(|(s, _), row| s != scheduler || row.seen_ms >= forget_ms);
        self.seen(scheduler, ms(since))
            .map(|(instance, row)| Presence {
                instance: instance.to_owned(),
                capacity: row.capacity.map(|c| u32::try_from(c).unwrap_or(u32::MAX)),
                running: u32::try_from(row.running).unwrap_or(0),
                polled_ms: row.polled_ms,
                jobs_digest: row.jobs_digest.clone(),
                seen: from_ms(row.seen_ms),
            })
            .collect()
    }
}

/// A hand-off's row, keyed by (scheduler, job, tick ms).
#[derive(Debug, Clone)]
struct HandoffRow {
    replica: String,
    token: i64,
    dispatched_ms: i64,
    declined_by: Option<String>,
}

/// The hand-offs table.
#[derive(Debug, Default)]
pub(in super::super) struct Handoffs {
    rows: BTreeMap<(String, String, i64), HandoffRow>,
}

/// The row of a hand-off as it was read: its key and the version read.
fn key(scheduler: &str, handoff: &Handoff) -> (String, String, i64) {
    (scheduler.to_owned(), handoff.job.clone(), ms(handoff.tick))
}

impl Handoffs {
    /// [`Dispatch::hand_off`](super::super::Dispatch::hand_off): `false` if the tick
    /// was handed to someone already.
    pub(in super::super) fn hand_off(
        &mut self,
        scheduler: &str,
        job: &str,
        tick: DateTime<Utc>,
        replica: &str,
        run_token: u64,
        now: DateTime<Utc>,
    ) -> bool {
        let key = (scheduler.to_owned(), job.to_owned(), ms(tick));
        if self.rows.contains_key(&key) {
            return false;
        }
        let row = HandoffRow {
            replica: replica.to_owned(),
            token: token(run_token),
            dispatched_ms: ms(now),
            declined_by: None,
        };
        self.rows.insert(key, row);
        true
    }

    /// The hand-offs of `scheduler` whose rows `keep` selects, by tick (then by job),
    /// at most [`HANDOFFS_READ`].
    fn read(&self, scheduler: &str, keep: impl Fn(i64, &HandoffRow) -> bool) -> Vec<Handoff> {
        let mut read: Vec<Handoff> = self
            .rows
            .iter()
            .filter(|((s, _, tick_ms), row)| s == scheduler && keep(*tick_ms, row))
            .map(|((_, job, tick_ms), row)| Handoff {
                job: job.clone(),
                tick: from_ms(*tick_ms),
                replica: row.replica.clone(),
                token: u64::try_from(row.token).unwrap_or(0),
                dispatched_ms: row.dispatched_ms,
                declined_by: row.declined_by.clone(),
            })
            .collect();
        read.sort_by(|a, b| a.tick.cmp(&b.tick).then_with(|| a.job.cmp(&b.job)));
        read.truncate(HANDOFFS_READ);
        read
    }

    /// [`Dispatch::handed_to`](super::super::Dispatch::handed_to).
    pub(in super::super) fn handed_to(&self, scheduler: &str, replica: &str) -> Vec<Handoff> {
        self.read(scheduler, |_, row| {
            row.replica == replica && row.declined_by.is_none()
        })
    }

    /// Deletes `handoff` where it still names its replica, unmoved and not declined.
    pub(in super::super) fn take(&mut self, scheduler: &str, handoff: &Handoff) -> bool {
        let key = key(scheduler, handoff);
        let as_read = self.rows.get(&key).is_some_and(|row| {
            row.replica == handoff.replica
                && row.dispatched_ms == handoff.dispatched_ms
                && row.declined_by.is_none()
        });
        if as_read {
            self.rows.remove(&key);
        }
        as_read
    }

    /// [`Dispatch::decline_handoff`](super::super::Dispatch::decline_handoff).
    pub(in super::super) fn decline(&mut self, scheduler: &str, handoff: &Handoff) -> bool {
        match self.rows.get_mut(&key(scheduler, handoff)) {
            Some(row)
                if row.replica == handoff.replica
                    && row.dispatched_ms == handoff.dispatched_ms
                    && row.declined_by.is_none() =>
            {
                row.declined_by = Some(handoff.replica.clone());
                true
            }
            _ => false,
        }
    }

    /// [`Dispatch::stale_handoffs`](super::super::Dispatch::stale_handoffs).
    pub(in super::super) fn stale(&self, scheduler: &str, before: DateTime<Utc>) -> Vec<Handoff> {
        let before = ms(before);
        self.read(scheduler, |tick_ms, row| {
            row.declined_by.is_some() || (tick_ms < before && row.dispatched_ms < before)
        })
    }

    /// [`Dispatch::move_handoff`](super::super::Dispatch::move_handoff).
    pub(in super::super) fn move_to(
        &mut self,
        scheduler: &str,
        handoff: &Handoff,
        replica: Option<&str>,
        run_token: u64,
        now: DateTime<Utc>,
    ) -> bool {
        let key = key(scheduler, handoff);
        let as_read = self.rows.get(&key).is_some_and(|row| {
            row.replica == handoff.replica && row.dispatched_ms == handoff.dispatched_ms
        });
        if !as_read {
            return false;
        }
        match replica {
            None => {
                self.rows.remove(&key);
            }
            Some(replica) => {
                let row = HandoffRow {
                    replica: replica.to_owned(),
                    token: token(run_token),
                    dispatched_ms: ms(now).max(handoff.dispatched_ms.saturating_add(1)),
                    declined_by: None,
                };
                self.rows.insert(key, row);
            }
        }
        true
    }
}

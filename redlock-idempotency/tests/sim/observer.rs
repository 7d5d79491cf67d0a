//! The observer: what the handlers, the clients and the store saw, on simulated time,
//! and the crate's promises checked on it from outside the engine (only what its public
//! API and the `Store` trait show).
//!
//! | check | the promise (crate docs) |
//! | --- | --- |
//! | 1 exclusion | "The handler runs once per key while the lock holds" (lib.rs, Guarantees): no two runs of a key within the validity each saw its lock hold |
//! | 2 stored is final | Semantics: "same key after the first finished, same fingerprint: the stored response (status, headers, body), marked `Idempotent-Replayed: true`; the handler does not run"; the crate's summary: "its retries get the first run's response, replayed byte for byte" |
//! | 3 fingerprint | Semantics: "same key, different fingerprint: `422`; nothing runs" |
//! | 4 once | Guarantees: once per key while the lock holds; it runs again only after a status not stored (Semantics, `store_if`), a store failure while the response is written (Guarantees), a lost lock or a crash (not promised then): checked in seeds without crashes and pauses past the TTL |
//! | 5 fence | Guarantees: "every record write is fenced by the lock's token"; `Store`: "a lower token than the record's is refused and nothing changes" |

use std::collections::BTreeMap;

use bytes::Bytes;
use redlock_core::LockHandle;
use redlock_idempotency::{Fingerprint, Finished, Record, RecordState, StoredResponse};
use tokio::time::Instant;

use redlock_testkit::sim::{Log, ms};

/// One handler run.
struct RunObs {
    id: String,
    replica: usize,
    token: u64,
    handle: LockHandle,
    start: Instant,
    end: Option<Instant>,
    /// The lock held when the handler started.
    held_at_start: bool,
    /// The end of the validity the run last saw while its lock held.
    last_valid: Option<Instant>,
    /// The lock was seen not held while the handler ran.
    lost: bool,
    crashed: bool,
    /// The handler's response (status, headers, body) and what the final write did.
    answered: Option<StoredResponse>,
    finished: Option<Finished>,
}

impl RunObs {
    fn sample(&mut self) {
        if self.handle.is_held() {
            let valid = Instant::from_std(self.handle.valid_until());
            self.last_valid = Some(self.last_valid.map_or(valid, |v| v.max(valid)));
        } else {
            self.lost = true;
        }
    }

    /// Why another run of its key may start after it (check 4), if it may.
    fn excuse(&self) -> Option<&'static str> {
        if self.crashed {
            Some("crashed")
        } else if self.lost {
            Some("lost its lock")
        } else if self.answered.as_ref().is_some_and(|a| a.status >= 500) {
            Some("answered a status not stored")
        } else if self.finished == Some(Finished::Failed) {
            Some("its final write failed")
        } else {
            None
        }
    }
}

/// What the store holds of one key, as its writes went.
#[derive(Default)]
struct KeyObs {
    /// The first completed record: when it was written, and its response and fingerprint.
    stored: Option<(Instant, StoredResponse, Fingerprint, u64)>,
    /// Every fingerprint a record of the key was written with.
    written: Vec<Fingerprint>,
}

pub(crate) struct Observer {
    log: Log,
    origin: Instant,
    runs: Vec<RunObs>,
    keys: BTreeMap<String, KeyObs>,
    /// Check 4 applies (no crash, no pause past the TTL in this seed).
    pub(crate) once: bool,
    pub(crate) violations: Vec<String>,
    /// Counts, for the summary: runs, replays, refusals by status.
    pub(crate) counts: BTreeMap<&'static str, u64>,
}

impl Observer {
    pub(crate) fn new(log: Log, once: bool) -> Self {
        Self {
            log,
            origin: Instant::now(),
            runs: Vec::new(),
            keys: BTreeMap::new(),
            once,
            violations: Vec::new(),
            counts: BTreeMap::new(),
        }
    }

    fn at(&self, at: Instant) -> String {
        format!("{:.3} ms", ms(self.origin, at))
    }

    fn violation(&mut self, line: String) {
        self.log.log(|| format!("VIOLATION {line}"));
        self.violations.push(line);
    }

    pub(crate) fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    /// The store applies `new` over `prev` (the live record, if any) for `id`.
    pub(crate) fn store_write(&mut self, op: &str, id: &str, prev: Option<&Record>, new: &Record) {
        let now = Instant::now();
        self.log.log(|| {
            format!(
                "store {op} {id}: {:?} token {} status {:?} over {:?}",
                new.state,
                new.token,
                new.status,
                prev.map(|p| (p.state, p.token))
            )
        });
        // 5: no write under a lower token than the record's.
        if let Some(prev) = prev
            && new.token < prev.token
        {
            self.violation(format!(
                "{id}: record of token {} ({:?}) overwritten at {} by a {op} with the lower token {} ({:?})",
                prev.token,
                prev.state,
                self.at(now),
                new.token,
                new.state
            ));
        }
        let key = self.keys.entry(id.to_owned()).or_default();
        if !key.written.contains(&new.fingerprint) {
            key.written.push(new.fingerprint);
        }
        // 2: a completed record stays as it is.
        if let Some(prev) = prev
            && prev.state == RecordState::Completed
            && prev != new
        {
            let line = format!(
                "{id}: completed record of token {} replaced at {} by a {op} of token {} ({:?})",
                prev.token,
                self.at(now),
                new.token,
                new.state
            );
            self.violation(line);
        }
        let key = self.keys.entry(id.to_owned()).or_default();
        if new.state == RecordState::Completed
            && key.stored.is_none()
            && let Some(response) = &new.response
        {
            key.stored = Some((now, response.clone(), new.fingerprint, new.token));
        }
    }

    /// Samples the lock of every run of `id` still running.
    fn sample_open(&mut self, id: &str) {
        for run in self
            .runs
            .iter_mut()
            .filter(|r| r.id == id && r.finished.is_none() && !r.crashed)
        {
            run.sample();
        }
    }

    /// A handler starts on `replica` for `id`, under `token`; returns the run's number.
    pub(crate) fn run_started(
        &mut self,
        id: &str,
        replica: usize,
        token: u64,
        fingerprint: Fingerprint,
        handle: LockHandle,
    ) -> usize {
        let now = Instant::now();
        self.count("runs");
        self.sample_open(id);
        let mut found = Vec::new();
        if let Some(key) = self.keys.get(id)
            && let Some((at, _, stored_fp, stored_token)) = &key.stored
        {
            // 2: no run once a response is stored.
            found.push(format!(
                "{id}: r{replica}'s handler (token {token}) started at {}, after the response of token {stored_token} was stored at {}",
                self.at(now),
                self.at(*at)
            ));
            // 3: never a run of another fingerprint once one is stored.
            if *stored_fp != fingerprint {
                found.push(format!(
                    "{id}: r{replica}'s handler ran a request of another fingerprint at {}",
                    self.at(now)
                ));
            }
        }
        for line in found {
            self.violation(line);
        }
        let mut run = RunObs {
            id: id.to_owned(),
            replica,
            token,
            handle,
            start: now,
            end: None,
            held_at_start: false,
            last_valid: None,
            lost: false,
            crashed: false,
            answered: None,
            finished: None,
        };
        run.sample();
        run.held_at_start = !run.lost;
        self.log.log(|| {
            format!(
                "run #{} of {id} starts on r{replica}, token {token}, held {}",
                self.runs.len(),
                run.held_at_start
            )
        });
        self.runs.push(run);
        self.runs.len() - 1
    }

    /// The handler of run `run` is still running: its lock is looked at.
    pub(crate) fn sample(&mut self, run: usize) {
        self.runs[run].sample();
    }

    /// The handler of run `run` answered `response`.
    pub(crate) fn answered(&mut self, run: usize, response: StoredResponse) {
        let r = &mut self.runs[run];
        r.sample();
        r.end = Some(Instant::now());
        r.answered = Some(response);
    }

    /// The final write of run `run` did `finished`.
    pub(crate) fn finished(&mut self, run: usize, finished: Finished) {
        self.runs[run].sample();
        self.runs[run].finished = Some(finished);
        self.count(match finished {
            Finished::Stored => "runs stored",
            Finished::StatusNotStored => "runs not stored (status)",
            Finished::Failed => "runs whose final write failed",
            _ => "runs not stored (other)",
        });
        let id = self.runs[run].id.clone();
        self.log
            .log(|| format!("run #{run} of {id} finished: {finished:?}"));
    }

    /// Replica `replica` crashed: its handlers stop now.
    pub(crate) fn crashed(&mut self, replica: usize) {
        let now = Instant::now();
        for run in self
            .runs
            .iter_mut()
            .filter(|r| r.replica == replica && r.end.is_none())
        {
            run.end = Some(now);
            run.crashed = true;
            *self.counts.entry("runs crashed").or_default() += 1;
        }
    }

    /// A request for `id` with `fingerprint` got the replay `response`.
    pub(crate) fn replayed(
        &mut self,
        id: &str,
        fingerprint: Fingerprint,
        response: &StoredResponse,
    ) {
        let now = Instant::now();
        self.count("replays");
        let Some((_, stored, stored_fp, token)) = self.keys.get(id).and_then(|k| k.stored.clone())
        else {
            self.violation(format!(
                "{id}: a replay at {} with no response stored",
                self.at(now)
            ));
            return;
        };
        if stored_fp != fingerprint {
            self.violation(format!(
                "{id}: a request of another fingerprint got the stored response at {}",
                self.at(now)
            ));
        }
        let mut expected = stored.clone();
        expected.headers.push((
            "idempotent-replayed".to_owned(),
            Bytes::from_static(b"true"),
        ));
        if *response != expected {
            self.violation(format!(
                "{id}: the replay at {} is not the stored response of token {token}: {response:?} against {expected:?}",
                self.at(now)
            ));
        }
    }

    /// A request for `id` with `fingerprint` was refused with `status`.
    pub(crate) fn refused(&mut self, id: &str, fingerprint: Fingerprint, status: u16) {
        self.count(match status {
            409 => "409",
            422 => "422",
            503 => "503",
            _ => "other refusals",
        });
        if status == 422 {
            // 3: `422` only where a record of another fingerprint was written.
            let other = self
                .keys
                .get(id)
                .is_some_and(|k| k.written.iter().any(|f| *f != fingerprint));
            if !other {
                let line = format!(
                    "{id}: 422 at {} though no record of another fingerprint was written",
                    self.at(Instant::now())
                );
                self.violation(line);
            }
        }
    }

    /// The checks over the whole history: exclusion (1), and every stored response the
    /// one its run answered (2).
    pub(crate) fn check(&mut self) {
        let lost = self.runs.iter().filter(|r| r.lost).count() as u64;
        *self.counts.entry("runs that lost their lock").or_default() += lost;
        let mut found = Vec::new();
        let holdings: Vec<(usize, &RunObs, Instant, Instant)> = self
            .runs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.held_at_start)
            .filter_map(|(i, r)| {
                let end = r.end?.min(r.last_valid?);
                (end > r.start).then_some((i, r, r.start, end))
            })
            .collect();
        for (n, (i, a, a_start, a_end)) in holdings.iter().enumerate() {
            for (j, b, b_start, b_end) in &holdings[n + 1..] {
                if a.id == b.id && a_start < b_end && b_start < a_end {
                    found.push(format!(
                        "{}: runs #{i} (r{}, token {}, [{}, {})) and #{j} (r{}, token {}, [{}, {})) overlap within their locks' validity",
                        a.id,
                        a.replica,
                        a.token,
                        self.at(*a_start),
                        self.at(*a_end),
                        b.replica,
                        b.token,
                        self.at(*b_start),
                        self.at(*b_end)
                    ));
                }
            }
        }
        // 4: a second run only after one that may be run again (its final write's
        // outcome known by now).
        if self.once {
            for (j, b) in self.runs.iter().enumerate() {
                for (i, a) in self.runs[..j].iter().enumerate() {
                    if a.id == b.id && a.excuse().is_none() {
                        found.push(format!(
                            "{}: run #{j} (r{}, token {}) started at {}, after run #{i} (r{}, token {}, from {}, finished {:?}) which neither crashed, failed to store, lost its lock, nor answered a status not stored",
                            b.id,
                            b.replica,
                            b.token,
                            self.at(b.start),
                            a.replica,
                            a.token,
                            self.at(a.start),
                            a.finished
                        ));
                    }
                }
            }
        }
        for (id, key) in &self.keys {
            let Some((_, stored, _, token)) = &key.stored else {
                continue;
            };
            let run = self.runs.iter().find(|r| r.id == *id && r.token == *token);
            match run.and_then(|r| r.answered.as_ref()) {
                Some(answered) if answered == stored => {}
                Some(answered) => found.push(format!(
                    "{id}: the stored response of token {token} is not what its handler answered: {stored:?} against {answered:?}"
                )),
                None => found.push(format!(
                    "{id}: a response stored under token {token}, which no handler answered"
                )),
            }
        }
        for line in found {
            self.violation(line);
        }
    }
}

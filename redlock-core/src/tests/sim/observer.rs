//! The observer: what the holders saw, on simulated time, and the invariants checked on
//! it, from outside the library (only what its public API reports):
//!
//! - mutual exclusion per resource: no two holdings of a resource overlap (a `lock_many`
//!   holding counts on each of its resources), no more semaphore holdings at once than
//!   permits;
//! - fencing tokens per resource: a fenced resource never refuses a write of a holder
//!   within its validity, and tokens rise in the order holdings of a resource begin
//!   (`lock_many`'s one token is above every earlier token of each of its resources);
//! - read-write locks: no writer's holding overlaps a reader's or another writer's (a
//!   downgrading writer's write holding ends when it asks, its read holding begins
//!   when the downgrade returns), and writers' tokens rise;
//! - loss notification: `lost()` completes by the end of the validity;
//! - hand-over in queue order, where the queue promises it (see
//!   [`Observer::check_queue_order`]).

use std::collections::BTreeMap;

use std::time::Duration;

use tokio::time::Instant;

/// One holding: from the moment the acquisition returned to the end of the validity the
/// holder last saw while it held (cut short by its release or crash).
#[derive(Clone, Debug)]
pub(super) struct Holding {
    pub(super) client: usize,
    pub(super) start: Instant,
    pub(super) end: Instant,
    pub(super) token: Option<u64>,
}

/// One `lock` call of a single resource, in a seed that checks the queue's order: when
/// it was made and when it returned, with the lock or not.
#[derive(Clone, Debug)]
pub(super) struct Call {
    pub(super) client: usize,
    pub(super) resource: String,
    pub(super) start: Instant,
    pub(super) end: Instant,
    pub(super) acquired: bool,
    /// A call that waits in the queue (`lock`; not a poll of `try_lock` calls).
    pub(super) queues: bool,
}

/// A release of a lock still valid, which the library reported as held (on a
/// majority, not expired): one that hands the lock over to the queue's head.
#[derive(Clone, Debug)]
pub(super) struct Release {
    pub(super) client: usize,
    pub(super) resource: String,
    pub(super) at: Instant,
}

/// How long after its `lock` call a waiter has surely joined the queue, when the
/// network loses nothing: a first attempt (at most the node timeout, 20 ms), the nodes'
/// time (another) and joining (another), with room to spare.
const JOINED_AFTER: Duration = Duration::from_millis(80);

/// How much earlier than another a waiter's call must begin for the queue to order them
/// surely: the queue orders by the nodes' time as each waiter read it (the median of a
/// majority's clocks, which differ by up to 5 ms, read once a second and counted on
/// since), and a call joins after its first attempt (up to 20 ms).
const SURELY_BEFORE: Duration = Duration::from_millis(40);

/// The side of a read-write lock's holding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Side {
    Read,
    Write,
}

#[derive(Default)]
pub(super) struct Observer {
    /// Per lock (or semaphore), its holdings, and the permits it has (1 for a lock).
    holdings: BTreeMap<String, (u32, Vec<Holding>)>,
    /// Per fenced resource, the highest token it accepted.
    fenced: BTreeMap<String, u64>,
    pub(super) violations: Vec<String>,
    origin: Option<Instant>,
    /// The `lock` calls and releases of a seed that checks the queue's order.
    calls: Vec<Call>,
    releases: Vec<Release>,
    /// Releases after which the queue's order was checked.
    pub(super) hand_overs_checked: u64,
    /// The read-write lock's holdings, each with its side.
    rw: Vec<(Side, Holding)>,
}

impl Observer {
    pub(super) fn new(origin: Instant) -> Self {
        Self {
            origin: Some(origin),
            ..Self::default()
        }
    }

    fn ms(&self, at: Instant) -> f64 {
        self.origin
            .map_or(0.0, |o| at.duration_since(o).as_secs_f64() * 1000.0)
    }

    /// `holding` of `name` (of `permits` permits) ended.
    pub(super) fn held(&mut self, name: &str, permits: u32, holding: Holding) {
        if holding.end > holding.start {
            let entry = self
                .holdings
                .entry(name.to_owned())
                .or_insert((permits, Vec::new()));
            entry.1.push(holding);
        }
    }

    /// A holder writes to the fenced resource `name` with `token`: accepted unless below
    /// a token accepted before.
    pub(super) fn fenced_write(&mut self, name: &str, client: usize, token: u64, at: Instant) {
        let at_ms = self.ms(at);
        let highest = self.fenced.entry(name.to_owned()).or_insert(0);
        if token < *highest {
            let line = format!(
                "{name}: c{client}'s write at {at_ms:.3} ms with token {token}, within its validity, refused: the resource had accepted {highest}",
                highest = *highest
            );
            self.violations.push(line);
        } else {
            *highest = token;
        }
    }

    /// `client`'s lock reported its loss at `at`, after its validity ended at `until`.
    pub(super) fn late_loss(&mut self, client: usize, at: Instant, until: Instant) {
        let line = format!(
            "c{client}'s loss reported at {:.3} ms, after its validity ended at {:.3} ms",
            self.ms(at),
            self.ms(until)
        );
        self.violations.push(line);
    }

    /// A holding of the read-write lock ended.
    pub(super) fn rw_held(&mut self, side: Side, holding: Holding) {
        if holding.end > holding.start {
            self.rw.push((side, holding));
        }
    }

    /// The read-write lock's invariants: no writer's holding overlaps a reader's or
    /// another writer's, and the writers' fencing tokens rise in the order their
    /// holdings began.
    fn check_rw(&self) -> Vec<String> {
        let mut found = Vec::new();
        let describe = |(side, h): &(Side, Holding)| {
            format!(
                "c{} {side:?} [{:.3}, {:.3}) ms token {:?}",
                h.client,
                self.ms(h.start),
                self.ms(h.end),
                h.token
            )
        };
        for (i, a) in self.rw.iter().enumerate() {
            for b in &self.rw[i + 1..] {
                let overlap = a.1.start < b.1.end && b.1.start < a.1.end;
                if overlap && (a.0 == Side::Write || b.0 == Side::Write) {
                    found.push(format!(
                        "rw: a writer beside another holder within their validity: {}; {}",
                        describe(a),
                        describe(b)
                    ));
                }
            }
        }
        let mut writers: Vec<&Holding> = self
            .rw
            .iter()
            .filter(|(side, h)| *side == Side::Write && h.token.is_some())
            .map(|(_, h)| h)
            .collect();
        writers.sort_by_key(|h| h.start);
        for pair in writers.windows(2) {
            if let (Some(a), Some(b)) = (pair[0].token, pair[1].token)
                && b <= a
            {
                found.push(format!(
                    "rw: writer token {b} of c{} (from {:.3} ms) not above token {a} of c{} (from {:.3} ms)",
                    pair[1].client,
                    self.ms(pair[1].start),
                    pair[0].client,
                    self.ms(pair[0].start)
                ));
            }
        }
        found
    }

    /// A `lock` call of one resource ended.
    pub(super) fn call(&mut self, call: Call) {
        self.calls.push(call);
    }

    /// A holder released a valid lock, which the library reported held.
    pub(super) fn released(&mut self, release: Release) {
        self.releases.push(release);
    }

    /// Hand-over in queue order, as the wait queue promises it (`queue.rs`: "a released
    /// lock goes to the client that has waited longest"), checked where the promise is
    /// made without exception:
    ///
    /// - a release of a lock still valid, reported held (a lock that expired is not
    ///   handed over: the waiters' timers race for it);
    /// - before `quiet_until`: the first fault of the schedule or client pause of the
    ///   seed (a waiter whose attempts are lost or that pauses loses its place when it
    ///   lapses; node clocks that jump or drift reorder the queue's times), in a seed
    ///   whose network loses nothing;
    /// - the waiters: `lock` calls (not polls with `try_lock`, which do not queue) of the
    ///   resource under way at the release, begun after
    ///   the released holding began (so they found it held and joined the queue) and at
    ///   least [`JOINED_AFTER`] before the release (so they had joined).
    ///
    /// Then the next acquisition of the resource after the release goes to the waiter
    /// whose call began first, unless that waiter had given up by then (its call ended
    /// first), or the one that took it began less than [`SURELY_BEFORE`] after it (the
    /// queue's times cannot order them surely). A newcomer (a call begun after the
    /// release, or without time to join) never takes it: the hand-over reserves it; nor
    /// does a `lock` call begun before the head's (it would have been the head).
    pub(super) fn check_queue_order(&mut self, quiet_until: Instant) {
        let mut found = Vec::new();
        for release in &self.releases {
            if release.at >= quiet_until {
                continue;
            }
            let Some(held_from) = self.holdings.get(&release.resource).and_then(|(_, hs)| {
                hs.iter()
                    .filter(|h| h.client == release.client && h.start <= release.at)
                    .map(|h| h.start)
                    .max()
            }) else {
                continue;
            };
            let Some(next) = self
                .calls
                .iter()
                .filter(|c| c.resource == release.resource && c.acquired && c.end > release.at)
                .min_by_key(|c| c.end)
            else {
                continue;
            };
            if next.end >= quiet_until {
                continue;
            }
            let head = self
                .calls
                .iter()
                .filter(|c| {
                    c.resource == release.resource
                        && c.queues
                        && c.client != release.client
                        && c.start > held_from
                        && c.start + JOINED_AFTER <= release.at
                        && c.end > release.at
                })
                .min_by_key(|c| c.start);
            let Some(head) = head else { continue };
            self.hand_overs_checked += 1;
            let overtaken = next.client != head.client
                && head.end > next.end
                && next.start >= head.start + SURELY_BEFORE;
            if overtaken {
                found.push(format!(
                    "{}: released by c{} at {:.3} ms, taken at {:.3} ms by c{} (waiting since {:.3} ms) before c{}, waiting since {:.3} ms and until {:.3} ms",
                    release.resource,
                    release.client,
                    self.ms(release.at),
                    self.ms(next.end),
                    next.client,
                    self.ms(next.start),
                    head.client,
                    self.ms(head.start),
                    self.ms(head.end),
                ));
            }
        }
        self.violations.extend(found);
    }

    /// The invariants over every holding: no more holders at once than permits (no
    /// two holders of a lock within their validity), and tokens rising in the order the
    /// holdings began.
    pub(super) fn check(&mut self) {
        let mut found = Vec::new();
        for (name, (permits, holdings)) in &self.holdings {
            let mut edges: Vec<(Instant, i32, usize)> = Vec::new();
            for h in holdings {
                edges.push((h.start, 1, h.client));
                edges.push((h.end, -1, h.client));
            }
            // Ends before starts at the same instant: [start, end) intervals.
            edges.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
            let mut held = 0;
            for (at, delta, _) in &edges {
                held += delta;
                if held > i32::try_from(*permits).unwrap_or(i32::MAX) {
                    let at_ms = self.ms(*at);
                    let who: Vec<String> = holdings
                        .iter()
                        .filter(|h| h.start <= *at && *at < h.end)
                        .map(|h| {
                            format!(
                                "c{} [{:.3}, {:.3}) ms token {:?}",
                                h.client,
                                self.ms(h.start),
                                self.ms(h.end),
                                h.token
                            )
                        })
                        .collect();
                    found.push(format!(
                        "{name}: {held} holders within their validity at {at_ms:.3} ms (permits: {permits}): {}",
                        who.join("; ")
                    ));
                    break;
                }
            }
            if *permits == 1 {
                let mut by_start: Vec<&Holding> = holdings.iter().collect();
                by_start.sort_by_key(|h| h.start);
                for pair in by_start.windows(2) {
                    if let (Some(a), Some(b)) = (pair[0].token, pair[1].token)
                        && b <= a
                    {
                        found.push(format!(
                            "{name}: token {b} of c{} (from {:.3} ms) not above token {a} of c{} (from {:.3} ms)",
                            pair[1].client,
                            self.ms(pair[1].start),
                            pair[0].client,
                            self.ms(pair[0].start)
                        ));
                    }
                }
            }
        }
        found.extend(self.check_rw());
        self.violations.extend(found);
    }
}

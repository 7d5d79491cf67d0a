//! An in-memory server behind the node layer, for fast, deterministic unit tests of the
//! layers above it (quorum, validity, fencing, cleanup), and, with feature `sim`, for
//! simulations of crates built on this one (see [`crate::sim`]).
//!
//! It is a `ConnectionLike`: it answers the very commands `protocol::build` makes (`SET
//! NX PX`, and each script by its `EVALSHA` hash) the way the scripts do on a server, so
//! the code under test runs unchanged down to the connection. Faults are injected per
//! server: latency, error replies, replies lost after the command took effect, and
//! restarts without persistence. Keys expire on tokio's clock, so tests run with paused
//! time. The wait queue is modelled too (its sorted sets, its places' deadlines, and
//! hand-overs), and so are the read-write lock's keys (the readers' set, the writers'
//! queue); publishing is not (hand-overs are picked up by the waiters' timed attempts,
//! as with wake on release off, and `PUBLISH` reaches nobody). `tests::fidelity` runs
//! the same commands against a real server and compares every reply.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Arg, Cmd, Pipeline, RedisError, RedisFuture, Value};
use tokio::time::Instant;

use crate::protocol::scripts;

/// One fake server; clones share it.
#[derive(Clone, Default)]
pub struct FakeServer(Arc<Mutex<State>>, Link);

/// One client's side of a fake server (see [`FakeServer::for_client`]): which client it
/// is, and the server's last run it has seen (its "connection").
#[derive(Clone, Default)]
struct Link {
    client: usize,
    seen_run: Arc<std::sync::atomic::AtomicU64>,
}

/// What happens to one request on its way to a node and back, as a [`Network`] decides.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fate {
    /// Time to reach the node (commands of one client to one node still run in order).
    pub request_delay: Duration,
    /// The request never arrives: no effect, no reply.
    pub request_lost: bool,
    /// Time for the reply to come back.
    pub reply_delay: Duration,
    /// The command takes effect but its reply never comes.
    pub reply_lost: bool,
}

/// The network between clients and fake servers (the simulator's): decides each
/// request's fate and hears each command applied, for its trace.
pub trait Network: Send + Sync {
    /// The fate of `cmds`, sent by `client` to node `node`.
    fn fate(&self, node: usize, client: usize, cmds: &[Cmd]) -> Fate;
    /// `cmds` from `client` were applied on `node`, answering `replies`.
    fn applied(
        &self,
        node: usize,
        client: usize,
        cmds: &[Cmd],
        replies: &Result<Vec<Value>, RedisError>,
    );
}

#[derive(Default)]
struct State {
    keys: HashMap<Vec<u8>, Entry>,
    /// Sorted sets (the wait queues and their deadlines).
    zsets: HashMap<Vec<u8>, ZSet>,
    /// Sets (a read-write lock's reader keys), ordered so that a script's pick among
    /// their members is the same on every run.
    sets: HashMap<Vec<u8>, BTreeSet<Vec<u8>>>,
    /// The server clock's origin: tokio's instant and the wall clock (µs) at first use.
    origin: Option<(Instant, u64)>,
    latency: Duration,
    failing: bool,
    losing_replies: bool,
    commands: u64,
    /// The network the requests go through, and this node's number on it.
    network: Option<(usize, Arc<dyn Network>)>,
    /// Restarts so far: the server's run (its `run_id`), and when it began.
    run: u64,
    booted: Option<Instant>,
    /// Uptime before `booted` (a server up since before the test began).
    up_before: Duration,
    /// The node's clock: its rate against true time (above 1: fast, keys expire early)
    /// and how far it jumped (µs, added to its time, negative for a jump back; expiries
    /// moved earlier, or later, by as much).
    clock_rate: f64,
    clock_jump_us: i64,
    /// Per client, the last time a request of it reaches this node (the order of one
    /// connection's commands).
    arrivals: HashMap<usize, Instant>,
    /// Model knobs for the simulator's negative controls: tokens without the clock
    /// floor, releases that skip the holder check, the per-node permit counter.
    no_fence_floor: bool,
    unchecked_release: bool,
    counted_permits: bool,
    /// Where a test stopped true time for this node (see [`FakeServer::set_now`]).
    stopped: Option<Instant>,
}

struct Entry {
    value: Vec<u8>,
    expires: Option<Instant>,
}

/// A sorted set: member to score.
#[derive(Default)]
struct ZSet {
    members: BTreeMap<Vec<u8>, f64>,
    expires: Option<Instant>,
}

impl FakeServer {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A handle on the same server for client `client`: its requests go through the
    /// network as that client's, and it connects afresh after each restart.
    pub fn for_client(&self, client: usize) -> Self {
        Self(
            Arc::clone(&self.0),
            Link {
                client,
                seen_run: Arc::default(),
            },
        )
    }

    /// Sends requests through `network`, as its node `node`.
    pub fn set_network(&self, node: usize, network: Arc<dyn Network>) {
        self.state().network = Some((node, network));
    }

    /// The node's wall clock reads `us` (µs since the Unix epoch) now, instead of the
    /// host's clock at first use.
    pub fn set_wall_clock(&self, us: u64) {
        let mut state = self.state();
        state.origin = Some((state.now(), us));
    }

    /// Stops the node's sense of true time at `at` (`None`: tokio's clock again): the
    /// commands that follow run as if at that instant. For a test that compares it with
    /// a real server, evaluating each command at the instant the real one ran it.
    #[cfg(test)]
    pub(crate) fn set_now(&self, at: Option<Instant>) {
        self.state().stopped = at;
    }

    /// The server has been up for `uptime` now.
    pub fn set_uptime(&self, uptime: Duration) {
        let mut state = self.state();
        state.booted = Some(Instant::now());
        state.up_before = uptime;
    }

    /// The node's clock runs at `rate` against true time (1.1: 10% fast, so its keys
    /// expire after TTL / 1.1).
    pub fn set_clock_rate(&self, rate: f64) {
        self.state().clock_rate = rate;
    }

    /// The node's clock jumps forward by `by`: its time moves on, and every expiry comes
    /// that much sooner.
    pub fn jump_clock(&self, by: Duration) {
        let mut state = self.state();
        state.clock_jump_us = state
            .clock_jump_us
            .saturating_add(i64::try_from(by.as_micros()).unwrap_or(i64::MAX));
        let now = Instant::now();
        let sooner = |at: &mut Option<Instant>| {
            if let Some(at) = at {
                *at = at.checked_sub(by).unwrap_or(now).max(now);
            }
        };
        for entry in state.keys.values_mut() {
            sooner(&mut entry.expires);
        }
        for zset in state.zsets.values_mut() {
            sooner(&mut zset.expires);
        }
    }

    /// The node's clock jumps back by `by`: its time reads that much earlier, and every
    /// expiry comes that much later (a server's expiries are times on its own clock).
    pub fn jump_clock_back(&self, by: Duration) {
        let mut state = self.state();
        state.clock_jump_us = state
            .clock_jump_us
            .saturating_sub(i64::try_from(by.as_micros()).unwrap_or(i64::MAX));
        let later = |at: &mut Option<Instant>| {
            if let Some(at) = at {
                *at += by;
            }
        };
        for entry in state.keys.values_mut() {
            later(&mut entry.expires);
        }
        for zset in state.zsets.values_mut() {
            later(&mut zset.expires);
        }
    }

    /// Fencing tokens count on from the counters alone, without the clock floor (a
    /// negative control: tokens fall back after counters are lost).
    #[cfg(test)]
    pub(crate) fn set_no_fence_floor(&self, on: bool) {
        self.state().no_fence_floor = on;
    }

    /// Releases delete the key whoever holds it (a negative control).
    #[cfg(test)]
    pub(crate) fn set_unchecked_release(&self, on: bool) {
        self.state().unchecked_release = on;
    }

    /// Answers `COUNTED.GRANT key member permits ttl_ms` and `COUNTED.RELEASE key
    /// member`: a semaphore counted on each node alone (a sorted set of holders by
    /// expiry, as one script per node would keep it), for a negative control granting
    /// a permit on a majority of such counters.
    #[cfg(test)]
    pub(crate) fn set_counted_permits(&self, on: bool) {
        self.state().counted_permits = on;
    }

    /// `INFO server` as a new connection reads it (`run_id`, `uptime_in_seconds`), if
    /// the server restarted since this client's handle last connected (or never did).
    pub(crate) fn reconnected(&self) -> Option<String> {
        use std::sync::atomic::Ordering;
        let mut state = self.state();
        let run = state.run + 1;
        if self.1.seen_run.swap(run, Ordering::Relaxed) == run {
            return None;
        }
        let booted = *state.booted.get_or_insert_with(Instant::now);
        let uptime = (state.scaled_elapsed(booted) + state.up_before).as_secs();
        Some(format!(
            "# Server\r\nrun_id:{run:040x}\r\nuptime_in_seconds:{uptime}\r\n"
        ))
    }

    /// Every reply takes this long to come back.
    pub fn set_latency(&self, latency: Duration) {
        self.state().latency = latency;
    }

    /// Answers every command with an error (changing nothing) while on.
    pub fn set_failing(&self, on: bool) {
        self.state().failing = on;
    }

    /// While on, commands take effect but their replies never come.
    pub fn set_losing_replies(&self, on: bool) {
        self.state().losing_replies = on;
    }

    /// A restart without persistence: every key is forgotten.
    pub fn restart(&self) {
        let mut state = self.state();
        state.keys.clear();
        state.zsets.clear();
        state.sets.clear();
        state.run += 1;
        state.booted = Some(Instant::now());
        state.up_before = Duration::ZERO;
    }

    /// Puts waiter `id` in the wait queue of lock key `key` as the queue scripts do,
    /// waiting since `since_ms`, its place kept for `keep` (a waiter that then dies).
    #[cfg(test)]
    pub(crate) fn enqueue(&self, key: &str, id: &str, since_ms: u64, keep: Duration) {
        let queues = crate::protocol::with_queues(&[key.to_owned()]);
        let keys: Vec<&[u8]> = queues.iter().map(String::as_bytes).collect();
        let keep = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX);
        self.state()
            .take_places(&keys, 1, id.as_bytes(), since_ms as f64, keep);
    }

    /// Takes waiter `id` out of the wait queue of lock key `key` (its join never reached
    /// this node).
    #[cfg(test)]
    pub(crate) fn dequeue(&self, key: &str, id: &str) {
        let queues = crate::protocol::with_queues(&[key.to_owned()]);
        let mut state = self.state();
        for queue in &queues[1..] {
            state.zrem(queue.as_bytes(), id.as_bytes());
        }
    }

    /// The members of the sorted set `key` (a wait queue), lowest score first.
    #[cfg(test)]
    pub(crate) fn queue(&self, key: &str) -> Vec<String> {
        let mut state = self.state();
        state.zset(key.as_bytes()).map_or_else(Vec::new, |z| {
            z.ordered()
                .into_iter()
                .map(|m| String::from_utf8_lossy(&m).into_owned())
                .collect()
        })
    }

    /// Sets `key` to `value`, without expiry (a stray value, a counter).
    #[cfg(test)]
    pub(crate) fn set(&self, key: &str, value: &str) {
        self.state().set(key.as_bytes(), value.as_bytes(), None);
    }

    /// The live value of `key`, if any.
    #[cfg(test)]
    pub(crate) fn get(&self, key: &str) -> Option<String> {
        let mut state = self.state();
        state
            .live(key.as_bytes())
            .map(|e| String::from_utf8_lossy(&e.value).into_owned())
    }

    /// Commands received so far.
    #[cfg(test)]
    pub(crate) fn commands(&self) -> u64 {
        self.state().commands
    }

    /// The node's clock now (µs since the Unix epoch), as `TIME` reads it.
    #[cfg(test)]
    pub(crate) fn clock_us(&self) -> u64 {
        self.state().now_us()
    }

    /// Every instant at which a reply may change with time alone: the expiries of the
    /// keys (also those passed but not yet looked at), and the moments the node's clock
    /// reaches each sorted-set score read as a time in ms (a place's deadline). For a
    /// test comparing this server with a real one: a command sent close to one of them
    /// may meet it on one side and not on the other.
    #[cfg(test)]
    pub(crate) fn changes(&self) -> Vec<Instant> {
        let mut state = self.state();
        let mut at: Vec<Instant> = state.keys.values().filter_map(|e| e.expires).collect();
        at.extend(state.zsets.values().filter_map(|z| z.expires));
        let now_us = state.now_us();
        let now = state.now();
        let rate = if state.clock_rate > 0.0 {
            state.clock_rate
        } else {
            1.0
        };
        for zset in state.zsets.values() {
            for score in zset.members.values() {
                // Clock time to go until the score, then true time.
                let ahead_us = score * 1000.0 - now_us as f64;
                if ahead_us.abs() < 3_600_000_000.0 {
                    let true_us = ahead_us / rate;
                    let delta = Duration::from_micros(true_us.abs() as u64);
                    let when = if true_us >= 0.0 {
                        now.checked_add(delta)
                    } else {
                        now.checked_sub(delta)
                    };
                    at.extend(when);
                }
            }
        }
        at.sort();
        at
    }

    /// Takes the commands in at once (so that commands to one server run in the order
    /// they were sent, as on one connection), answers after the latency.
    async fn run(&self, cmds: Vec<Cmd>) -> Result<Vec<Value>, RedisError> {
        let network = self.state().network.clone();
        if let Some((node, network)) = network {
            return self.through(node, network, cmds).await;
        }
        let (latency, replies, lost) = {
            let mut state = self.state();
            state.commands += cmds.len() as u64;
            let replies = if state.failing {
                Err(RedisError::from(std::io::Error::other("injected failure")))
            } else {
                cmds.iter()
                    .map(|cmd| state.apply(cmd))
                    .collect::<Result<Vec<_>, _>>()
            };
            (state.latency, replies, state.losing_replies)
        };
        tokio::time::sleep(latency).await;
        if lost {
            std::future::pending::<()>().await;
        }
        replies
    }
}

impl FakeServer {
    /// [`run`](Self::run) through the simulator's network: the request travels (or is
    /// lost), takes effect on the node in a task of its own (a caller that gives up does
    /// not take back a request already sent), and its reply travels back (or is lost).
    async fn through(
        &self,
        node: usize,
        network: Arc<dyn Network>,
        cmds: Vec<Cmd>,
    ) -> Result<Vec<Value>, RedisError> {
        let client = self.1.client;
        let fate = network.fate(node, client, &cmds);
        if fate.request_lost {
            return std::future::pending().await;
        }
        let (arrival, run) = {
            let mut state = self.state();
            let now = Instant::now();
            let last = state.arrivals.get(&client).copied().unwrap_or(now);
            let arrival = (now + fate.request_delay).max(last);
            state.arrivals.insert(client, arrival);
            (arrival, state.run)
        };
        let server = self.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            tokio::time::sleep_until(arrival).await;
            let replies = {
                let mut state = server.state();
                state.commands += cmds.len() as u64;
                if state.run != run {
                    // The connection it was sent on broke with the restart.
                    Err(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "the node restarted",
                    )))
                } else if state.failing {
                    Err(RedisError::from(std::io::Error::other("injected failure")))
                } else {
                    cmds.iter()
                        .map(|cmd| state.apply(cmd))
                        .collect::<Result<Vec<_>, _>>()
                }
            };
            network.applied(node, client, &cmds, &replies);
            let _ = tx.send(replies);
        });
        let replies = rx
            .await
            .unwrap_or_else(|_| Err(RedisError::from(std::io::Error::other("dropped"))));
        tokio::time::sleep(fate.reply_delay).await;
        if fate.reply_lost {
            std::future::pending::<()>().await;
        }
        replies
    }
}

impl State {
    /// True time `ttl_ms` of this node's clock lasts (shorter on a fast clock).
    fn ttl(&self, ttl_ms: u64) -> Duration {
        let ttl = Duration::from_millis(ttl_ms);
        if self.clock_rate > 0.0 && self.clock_rate != 1.0 {
            ttl.div_f64(self.clock_rate)
        } else {
            ttl
        }
    }

    /// The node's clock's time elapsed since `since` (true time).
    fn scaled_elapsed(&self, since: Instant) -> Duration {
        let elapsed = self.now().duration_since(since);
        if self.clock_rate > 0.0 && self.clock_rate != 1.0 {
            elapsed.mul_f64(self.clock_rate)
        } else {
            elapsed
        }
    }

    /// True time: tokio's clock, or where a test stopped it (see
    /// [`FakeServer::set_now`]).
    fn now(&self) -> Instant {
        self.stopped.unwrap_or_else(Instant::now)
    }

    fn live(&mut self, key: &[u8]) -> Option<&Entry> {
        let now = self.now();
        let expired = self
            .keys
            .get(key)
            .is_some_and(|e| e.expires.is_some_and(|at| at <= now));
        if expired {
            self.keys.remove(key);
        }
        self.keys.get(key)
    }

    /// The server's clock (ms since the Unix epoch), advancing with tokio's clock.
    fn now_ms(&mut self) -> u64 {
        self.now_us() / 1000
    }

    /// The server's clock in microseconds since the Unix epoch (`TIME`), advancing with
    /// tokio's clock.
    fn now_us(&mut self) -> u64 {
        let now = self.now();
        let (at, wall) = *self.origin.get_or_insert_with(|| {
            let wall = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_micros();
            (now, u64::try_from(wall).unwrap_or(0))
        });
        let elapsed = u64::try_from(self.scaled_elapsed(at).as_micros()).unwrap_or(0);
        wall.saturating_add(elapsed)
            .saturating_add_signed(self.clock_jump_us)
    }

    /// A fencing token as the acquire scripts compute it from the counters `fences`:
    /// one above the highest, and not below the clock in microseconds rounded down to a
    /// multiple of `step`.
    fn next_token(&mut self, fences: &[&[u8]], step: u64) -> u64 {
        let highest = fences.iter().map(|k| self.number(k)).max().unwrap_or(0);
        let now = if self.no_fence_floor {
            0
        } else {
            self.now_us()
        };
        let floor = now - now % step.max(1);
        highest.saturating_add(1).max(floor)
    }

    fn zset(&mut self, key: &[u8]) -> Option<&mut ZSet> {
        let now = self.now();
        let expired = self
            .zsets
            .get(key)
            .is_some_and(|z| z.expires.is_some_and(|at| at <= now));
        if expired {
            self.zsets.remove(key);
        }
        self.zsets.get_mut(key)
    }

    fn zadd(&mut self, key: &[u8], score: f64, member: &[u8]) {
        if self.zset(key).is_none() {
            self.zsets.insert(key.to_vec(), ZSet::default());
        }
        if let Some(z) = self.zsets.get_mut(key) {
            z.members.insert(member.to_vec(), score);
        }
    }

    /// Removes `member`; an empty set is deleted, as on a server.
    fn zrem(&mut self, key: &[u8], member: &[u8]) {
        let empty = self.zset(key).is_some_and(|z| {
            z.members.remove(member);
            z.members.is_empty()
        });
        if empty {
            self.zsets.remove(key);
        }
    }

    /// `PTTL`: ms left by the node's clock (more than the true time left on a fast
    /// clock), -1 without expiry, -2 if missing (strings, sorted sets and sets).
    fn pttl(&mut self, key: &[u8]) -> i64 {
        let now = self.now();
        let rate = self.clock_rate;
        let left = |expires: Option<Instant>| {
            expires.map_or(-1, |at| {
                let mut left = at.saturating_duration_since(now);
                if rate > 0.0 && rate != 1.0 {
                    left = left.mul_f64(rate);
                }
                i64::try_from(left.as_millis()).unwrap_or(i64::MAX)
            })
        };
        if let Some(e) = self.live(key) {
            return left(e.expires);
        }
        if let Some(z) = self.zset(key) {
            return left(z.expires);
        }
        if self.sets.contains_key(key) {
            return -1;
        }
        -2
    }

    /// `EXISTS` of one key, of any type.
    fn exists(&mut self, key: &[u8]) -> bool {
        self.live(key).is_some() || self.zset(key).is_some() || self.sets.contains_key(key)
    }

    /// `DEL` of one key, of any type: whether it was there.
    fn del(&mut self, key: &[u8]) -> bool {
        let existed = self.exists(key);
        self.keys.remove(key);
        self.zsets.remove(key);
        self.sets.remove(key);
        existed
    }

    /// `TYPE`.
    fn key_type(&mut self, key: &[u8]) -> &'static str {
        if self.live(key).is_some() {
            "string"
        } else if self.zset(key).is_some() {
            "zset"
        } else if self.sets.contains_key(key) {
            "set"
        } else {
            "none"
        }
    }

    /// `SADD` of one member: whether it is new.
    fn sadd(&mut self, key: &[u8], member: &[u8]) -> bool {
        self.sets
            .entry(key.to_vec())
            .or_default()
            .insert(member.to_vec())
    }

    /// `SREM` of one member: whether it was there; an empty set is deleted, as on a
    /// server.
    fn srem(&mut self, key: &[u8], member: &[u8]) -> bool {
        let Some(set) = self.sets.get_mut(key) else {
            return false;
        };
        let removed = set.remove(member);
        if set.is_empty() {
            self.sets.remove(key);
        }
        removed
    }

    /// `SMEMBERS`, in byte order.
    fn smembers(&self, key: &[u8]) -> Vec<Vec<u8>> {
        self.sets
            .get(key)
            .map_or_else(Vec::new, |set| set.iter().cloned().collect())
    }

    fn pexpire(&mut self, key: &[u8], ms: u64) {
        let at = self.now() + self.ttl(ms);
        if let Some(z) = self.zset(key) {
            z.expires = Some(at);
        } else if self.live(key).is_some()
            && let Some(e) = self.keys.get_mut(key)
        {
            e.expires = Some(at);
        }
    }

    /// The queue scripts' `take_places`: waiter `id`, waiting `since`, joins the queues
    /// of the `n` lock keys of `keys`, its places kept `keep` ms past now.
    fn take_places(&mut self, keys: &[&[u8]], n: usize, id: &[u8], since: f64, keep: u64) {
        let now = self.now_ms();
        let instant = self.now();
        for i in 0..n {
            let (Some(queue), Some(deadlines)) = (keys.get(n + i), keys.get(2 * n + i)) else {
                continue;
            };
            // The waiters' mark on a held key.
            if let Some(entry) = keys.get(i).and_then(|k| self.keys.get_mut(*k))
                && entry.expires.is_none_or(|at| at > instant)
                && entry.value.first() != Some(&b'~')
                && entry.value.last() != Some(&b'+')
            {
                entry.value.push(b'+');
            }
            self.zadd(queue, since, id);
            self.zadd(deadlines, now.saturating_add(keep) as f64, id);
            for key in [queue, deadlines] {
                if self.pttl(key) < i64::try_from(keep).unwrap_or(i64::MAX) {
                    self.pexpire(key, keep);
                }
            }
        }
    }

    /// A permit counted on this node alone: the holders whose expiry (by this node's
    /// clock) has passed are dropped (`ZREMRANGEBYSCORE`), and `member` is added, to
    /// expire `ttl_ms` from now, if fewer than `permits` remain (`ZCARD`, `ZADD`).
    fn counted_grant(&mut self, key: &[u8], member: &[u8], permits: u64, ttl_ms: u64) -> bool {
        let now = self.now_ms();
        let empty = self.zset(key).is_some_and(|z| {
            z.members.retain(|_, expiry| *expiry > now as f64);
            z.members.is_empty()
        });
        if empty {
            self.zsets.remove(key);
        }
        let count = self.zset(key).map_or(0, |z| z.members.len() as u64);
        if count >= permits {
            return false;
        }
        self.zadd(key, now.saturating_add(ttl_ms) as f64, member);
        true
    }

    /// `SET` (a key of another type is replaced, as on a server).
    fn set(&mut self, key: &[u8], value: &[u8], ttl_ms: Option<u64>) {
        let now = self.now();
        let expires = ttl_ms.map(|ms| now + self.ttl(ms));
        self.zsets.remove(key);
        self.sets.remove(key);
        self.keys.insert(
            key.to_vec(),
            Entry {
                value: value.to_vec(),
                expires,
            },
        );
    }

    fn number(&mut self, key: &[u8]) -> u64 {
        self.live(key)
            .and_then(|e| std::str::from_utf8(&e.value).ok()?.parse().ok())
            .unwrap_or(0)
    }

    /// A key that is free for an acquisition (with `barge`, one being handed over).
    fn free(&mut self, key: &[u8], barge: bool) -> bool {
        match self.live(key) {
            None => true,
            Some(e) => barge && e.value.first() == Some(&b'~'),
        }
    }

    fn apply(&mut self, cmd: &Cmd) -> Result<Value, RedisError> {
        let args: Vec<&[u8]> = cmd
            .args_iter()
            .filter_map(|a| match a {
                Arg::Simple(bytes) => Some(bytes),
                _ => None,
            })
            .collect();
        let text = |i: usize| {
            args.get(i)
                .and_then(|a| std::str::from_utf8(a).ok())
                .unwrap_or("")
        };
        let num = |i: usize| text(i).parse::<u64>().unwrap_or(0);
        Ok(match text(0).to_ascii_uppercase().as_str() {
            // `SET key value NX PX ttl [GET]`.
            "SET" => {
                let (key, value) = (args[1], args[2]);
                let get = text(6).eq_ignore_ascii_case("GET");
                match self.live(key) {
                    Some(entry) if get => Value::BulkString(entry.value.clone()),
                    Some(_) => Value::Nil,
                    None => {
                        self.set(key, value, Some(num(5)));
                        if get { Value::Nil } else { Value::Okay }
                    }
                }
            }
            "PING" => Value::SimpleString("PONG".into()),
            // The plain commands the library sends besides: a read lock's release (`DEL`,
            // `SREM`, `PUBLISH`), a look at keys (`PTTL`, `GET`, `ZCARD`); and those that
            // read a key's state, for tests.
            "GET" => self
                .live(args[1])
                .map_or(Value::Nil, |e| Value::BulkString(e.value.clone())),
            "PTTL" => Value::Int(self.pttl(args[1])),
            "TYPE" => Value::SimpleString(self.key_type(args[1]).to_owned()),
            "EXISTS" => Value::Int(args[1..].iter().filter(|k| self.exists(k)).count() as i64),
            "DEL" => Value::Int(args[1..].iter().filter(|k| self.del(k)).count() as i64),
            "SADD" => Value::Int(args[2..].iter().filter(|m| self.sadd(args[1], m)).count() as i64),
            "SREM" => Value::Int(args[2..].iter().filter(|m| self.srem(args[1], m)).count() as i64),
            "SMEMBERS" => Value::Array(
                self.smembers(args[1])
                    .into_iter()
                    .map(Value::BulkString)
                    .collect(),
            ),
            "SCARD" => Value::Int(self.sets.get(args[1]).map_or(0, |s| s.len() as i64)),
            // Nobody listens on a fake server.
            "PUBLISH" => Value::Int(0),
            "ZCARD" => Value::Int(self.zset(args[1]).map_or(0, |z| z.members.len() as i64)),
            // `ZRANGE key start stop [WITHSCORES]`, by index.
            "ZRANGE" => {
                let index = |i: usize| text(i).parse::<i64>().unwrap_or(0);
                let (start, stop) = (index(2), index(3));
                let scores = text(4).eq_ignore_ascii_case("WITHSCORES");
                let members = self.zset(args[1]).map_or_else(Vec::new, |z| {
                    z.ordered()
                        .into_iter()
                        .map(|m| {
                            let score = z.members.get(&m).copied().unwrap_or(0.0);
                            (m, score)
                        })
                        .collect()
                });
                let len = members.len() as i64;
                let at = |i: i64| if i < 0 { len + i } else { i };
                let (start, stop) = (at(start).max(0), at(stop).min(len - 1));
                let mut reply = Vec::new();
                if start <= stop {
                    for (member, score) in &members[start as usize..=stop as usize] {
                        reply.push(Value::BulkString(member.clone()));
                        if scores {
                            reply.push(Value::BulkString(score_text(*score).into_bytes()));
                        }
                    }
                }
                Value::Array(reply)
            }
            "COUNTED.GRANT" if self.counted_permits => {
                let (key, member) = (args[1], args[2]);
                Value::Int(i64::from(self.counted_grant(key, member, num(3), num(4))))
            }
            "COUNTED.RELEASE" if self.counted_permits => {
                self.zrem(args[1], args[2]);
                Value::Int(1)
            }
            "EVALSHA" => {
                let n = usize::try_from(num(2)).unwrap_or(0);
                let keys: Vec<&[u8]> = args[3..3 + n].to_vec();
                let argv: Vec<&str> = (3 + n..args.len()).map(text).collect();
                self.script(text(1), &keys, &argv)?
            }
            _ => return Err(unsupported()),
        })
    }

    fn script(&mut self, sha: &str, keys: &[&[u8]], argv: &[&str]) -> Result<Value, RedisError> {
        let arg = |i: usize| argv.get(i).copied().unwrap_or("");
        let ms = |i: usize| arg(i).parse::<u64>().unwrap_or(0);
        let int = |n: u64| Value::Int(i64::try_from(n).unwrap_or(i64::MAX));
        Ok(if sha == scripts::ACQUIRE_MANY.get_hash() {
            let barge = arg(2) == "1";
            if !keys.iter().all(|k| self.free(k, barge)) {
                return Ok(int(0));
            }
            for key in keys {
                self.set(key, arg(0).as_bytes(), Some(ms(1)));
            }
            int(1)
        } else if sha == scripts::ACQUIRE_FENCED.get_hash() {
            let (locks, fences) = keys.split_at(keys.len() / 2);
            let barge = arg(2) == "1";
            if !locks.iter().all(|k| self.free(k, barge)) {
                return Ok(int(0));
            }
            let token = self.next_token(fences, ms(3));
            for (lock, fence) in locks.iter().zip(fences) {
                self.set(fence, token.to_string().as_bytes(), None);
                self.set(lock, arg(0).as_bytes(), Some(ms(1)));
            }
            int(token)
        } else if sha == scripts::RAISE_FENCE.get_hash() {
            let token = ms(0);
            for key in keys {
                if self.number(key) < token {
                    self.set(key, arg(0).as_bytes(), None);
                }
            }
            int(1)
        } else if sha == scripts::EXTEND.get_hash() {
            // Per lock: its key count, value and TTL; its keys next in `keys`.
            let mut answers = Vec::new();
            let mut next = 0;
            for lock in argv.chunks(3) {
                let [n, value, ttl] = lock else { break };
                let n = n.parse::<usize>().unwrap_or(0);
                let ttl = ttl.parse::<u64>().unwrap_or(0);
                let lock_keys = keys.get(next..next + n).unwrap_or_default();
                next += n;
                let held = lock_keys
                    .iter()
                    .all(|k| self.live(k).is_some_and(|e| holds(&e.value, value)));
                if held {
                    let at = self.now() + self.ttl(ttl);
                    for key in lock_keys {
                        if let Some(entry) = self.keys.get_mut(*key) {
                            entry.expires = Some(at);
                        }
                    }
                }
                answers.push(int(u64::from(held)));
            }
            Value::Array(answers)
        } else if sha == scripts::RELEASE.get_hash() {
            self.release(keys, arg(0), arg(1), ms(2), arg(3))
        } else if sha == scripts::ACQUIRE_QUEUED.get_hash() {
            let n = usize::try_from(ms(5)).unwrap_or(0);
            let mine = format!("~{}", arg(2));
            let free = keys
                .iter()
                .take(n)
                .all(|k| self.live(k).is_none_or(|e| e.value == mine.as_bytes()));
            if !free {
                self.take_places(keys, n, arg(2).as_bytes(), ms(3) as f64, ms(4));
                return Ok(int(0));
            }
            let mut token = 1;
            if keys.len() == 4 * n {
                token = self.next_token(&keys[3 * n..], ms(6));
                for fence in &keys[3 * n..] {
                    self.set(fence, token.to_string().as_bytes(), None);
                }
            }
            for i in 0..n {
                self.zrem(keys[n + i], arg(2).as_bytes());
                self.zrem(keys[2 * n + i], arg(2).as_bytes());
                let mut value = arg(0).as_bytes().to_vec();
                if self.zset(keys[n + i]).is_some() {
                    value.push(b'+');
                }
                self.set(keys[i], &value, Some(ms(1)));
            }
            int(token)
        } else if sha == scripts::JOIN_QUEUE.get_hash() {
            let n = keys.len() / 3;
            self.take_places(keys, n, arg(0).as_bytes(), ms(1) as f64, ms(2));
            let longest = keys[..n].iter().map(|k| self.pttl(k)).max().unwrap_or(0);
            int(u64::try_from(longest).unwrap_or(0))
        } else if sha == scripts::REMAINING.get_hash() {
            let longest = keys.iter().map(|k| self.pttl(k)).max().unwrap_or(0);
            int(u64::try_from(longest).unwrap_or(0))
        } else if sha == scripts::SERVER_TIME.get_hash() {
            int(self.now_ms())
        } else if sha == scripts::MARK.get_hash() {
            let mut held = 0;
            for key in keys {
                if self.live(key).is_none() {
                    continue;
                }
                held += 1;
                if let Some(entry) = self.keys.get_mut(*key)
                    && entry.value.first() != Some(&b'~')
                    && entry.value.last() != Some(&b'+')
                {
                    // `APPEND`: the TTL stays.
                    entry.value.push(b'+');
                }
            }
            int(held)
        } else if sha == scripts::ACQUIRE_READ.get_hash() {
            int(u64::from(self.acquire_read(keys[0], arg(0), ms(1))))
        } else if sha == scripts::ACQUIRE_WRITE.get_hash() {
            int(self.acquire_write(keys, argv))
        } else if sha == scripts::RELEASE_WRITE.get_hash() {
            let held = self
                .live(keys[0])
                .is_some_and(|e| e.value == arg(0).as_bytes());
            if held {
                self.keys.remove(keys[0]);
            }
            int(u64::from(held))
        } else if sha == scripts::DOWNGRADE.get_hash() {
            let (writer, readers, reader) = (keys[0], keys[1], keys[2]);
            if self
                .live(writer)
                .is_none_or(|e| e.value != arg(0).as_bytes())
            {
                return Ok(int(0));
            }
            let ttl = self.pttl(writer);
            if ttl <= 0 {
                return Ok(int(0));
            }
            self.keys.remove(writer);
            self.set(reader, arg(0).as_bytes(), Some(ttl.unsigned_abs()));
            self.sadd(readers, reader);
            int(1)
        } else if sha == scripts::LEAVE_WRITERS.get_hash() {
            self.zrem(keys[0], arg(0).as_bytes());
            self.zrem(keys[1], arg(0).as_bytes());
            int(1)
        } else {
            return Err(unsupported());
        })
    }
}

impl State {
    /// The read lock's script (see `scripts::ACQUIRE_READ`): `writer` is the writer's
    /// key, the other names are built from it. Whether the reader's key was set.
    fn acquire_read(&mut self, writer: &[u8], value: &str, ttl_ms: u64) -> bool {
        if self.exists(writer) {
            return false;
        }
        let deadlines = [writer, b":writer-waiting:until"].concat();
        if self.zset(&deadlines).is_some() {
            let now = self.now_ms() as f64;
            // `ZCOUNT deadlines (now +inf`: a writer waits.
            if self
                .zset(&deadlines)
                .is_some_and(|z| z.members.values().any(|&deadline| deadline > now))
            {
                return false;
            }
        }
        let readers = [writer, b":readers"].concat();
        let reader = [writer, b":reader:", value.as_bytes()].concat();
        self.set(&reader, value.as_bytes(), Some(ttl_ms));
        self.sadd(&readers, &reader);
        // One acquisition in 16 (by its value's last byte) with more than 64 names drops
        // the dead ones among 32 of them. The script picks them at random
        // (`SRANDMEMBER`); here the first 32 in byte order, one of its possible picks,
        // so that a run replays.
        let last = value.as_bytes().last().copied().unwrap_or(0);
        if last % 16 == 0 && self.sets.get(&readers).is_some_and(|s| s.len() > 64) {
            let picked: Vec<Vec<u8>> = self.smembers(&readers).into_iter().take(32).collect();
            for other in picked {
                if !self.exists(&other) {
                    self.srem(&readers, &other);
                }
            }
        }
        true
    }

    /// The write lock's script (see `scripts::ACQUIRE_WRITE`). `keys`: the writer's
    /// key, the readers' set, the writers' queue, its deadlines, (with fencing) the
    /// counter. `argv`: value, TTL, writer id, since, keep, fence step. The token
    /// (1 without fencing), or 0 if refused.
    fn acquire_write(&mut self, keys: &[&[u8]], argv: &[&str]) -> u64 {
        let arg = |i: usize| argv.get(i).copied().unwrap_or("");
        let (writer, readers, queue, deadlines) = (keys[0], keys[1], keys[2], keys[3]);
        let id = arg(2).as_bytes();
        let queued = self.zset(deadlines).is_some();
        let mut now = None;
        if queued {
            let at = self.now_ms();
            now = Some(at);
            // `ZRANGEBYSCORE deadlines -inf now`: the writers whose place expired.
            let gone: Vec<Vec<u8>> = self.zset(deadlines).map_or_else(Vec::new, |z| {
                z.members
                    .iter()
                    .filter(|(_, deadline)| **deadline <= at as f64)
                    .map(|(m, _)| m.clone())
                    .collect()
            });
            for member in gone {
                self.zrem(queue, &member);
                self.zrem(deadlines, &member);
            }
        }
        let mut free = !self.exists(writer);
        if free {
            // Every name is looked at: the dead readers' are dropped, even past a live one.
            for reader in self.smembers(readers) {
                if self.exists(&reader) {
                    free = false;
                } else {
                    self.srem(readers, &reader);
                }
            }
        }
        if free
            && queued
            && let Some(head) = self
                .zset(queue)
                .and_then(|z| z.ordered().into_iter().next())
            && head != id
        {
            free = false;
        }
        if !free {
            let keep = arg(4).parse::<i64>().unwrap_or(0);
            if keep <= 0 {
                return 0;
            }
            let now = now.unwrap_or_else(|| self.now_ms());
            let since = arg(3).parse::<f64>().unwrap_or(0.0);
            self.zadd(queue, since, id);
            self.zadd(
                deadlines,
                now.saturating_add(keep.unsigned_abs()) as f64,
                id,
            );
            for key in [queue, deadlines] {
                if self.pttl(key) < keep {
                    self.pexpire(key, keep.unsigned_abs());
                }
            }
            return 0;
        }
        if queued {
            self.zrem(queue, id);
            self.zrem(deadlines, id);
        }
        let mut token = 1;
        if let Some(fence) = keys.get(4) {
            let step = arg(5).parse::<u64>().unwrap_or(0);
            token = self.next_token(&[fence], step);
            self.set(fence, token.to_string().as_bytes(), None);
        }
        let ttl = arg(1).parse::<u64>().unwrap_or(0);
        self.set(writer, arg(0).as_bytes(), Some(ttl));
        token
    }

    /// The release script (see `scripts::RELEASE`): `keys` holds the lock keys, then
    /// their queues (each queue's deadlines are `<queue>:until`).
    fn release(
        &mut self,
        keys: &[&[u8]],
        value: &str,
        mode: &str,
        handoff_ms: u64,
        dequeue: &str,
    ) -> Value {
        let n = keys.len() / 2;
        // A lock's release passes the value alone.
        let lock_release = mode.is_empty();
        let mode = if lock_release { "1" } else { mode };
        let (mut released, mut pending) = (0u64, 0u64);
        for i in 0..n {
            let (key, queue) = (keys[i], keys[n + i]);
            let deadlines = [queue, b":until"].concat();
            let deadlines = deadlines.as_slice();
            if !dequeue.is_empty() {
                self.zrem(queue, dequeue.as_bytes());
                self.zrem(deadlines, dequeue.as_bytes());
            }
            let current = self.live(key).map(|e| e.value.clone());
            let mut free = false;
            if mode == "2" {
                match &current {
                    None => {
                        released += 1;
                        free = true;
                    }
                    Some(v) if v.first() == Some(&b'~') => {
                        pending = pending.max(u64::try_from(self.pttl(key)).unwrap_or(0));
                    }
                    Some(_) => {}
                }
            } else if current
                .as_deref()
                .is_some_and(|c| holds(c, value) || self.unchecked_release)
            {
                released += 1;
                free = true;
            }
            if !free {
                continue;
            }
            // A lock's release of one key without the waiters' mark: nobody waits.
            let unmarked = n == 1 && lock_release && current.as_deref() == Some(value.as_bytes());
            let mut heir = None;
            if mode != "0" && !unmarked && self.zset(queue).is_some() {
                let now = self.now_ms() as f64;
                while heir.is_none() {
                    let Some(head) = self
                        .zset(queue)
                        .and_then(|z| z.ordered().into_iter().next())
                    else {
                        break;
                    };
                    let deadline = self
                        .zset(deadlines)
                        .and_then(|z| z.members.get(&head).copied())
                        .unwrap_or(0.0);
                    self.zrem(queue, &head);
                    self.zrem(deadlines, &head);
                    if deadline > now {
                        heir = Some(head);
                    }
                }
            }
            if let Some(heir) = heir {
                let hold =
                    hand_over_time(&heir).unwrap_or(if handoff_ms == 0 { 25 } else { handoff_ms });
                let mut placeholder = b"~".to_vec();
                placeholder.extend_from_slice(&heir);
                self.set(key, &placeholder, Some(hold));
                pending = pending.max(hold);
            } else if current.is_some() {
                self.keys.remove(key);
            }
        }
        Value::Int(i64::try_from(released + 65536 * pending).unwrap_or(i64::MAX))
    }
}

impl ZSet {
    /// Members by score, then by member (as `ZRANGE` orders them).
    fn ordered(&self) -> Vec<Vec<u8>> {
        let mut members: Vec<(&Vec<u8>, f64)> = self.members.iter().map(|(m, s)| (m, *s)).collect();
        members.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(b.0)));
        members.into_iter().map(|(m, _)| m.clone()).collect()
    }
}

/// Whether a lock key's value `stored` is `value`, with or without the waiters' mark.
fn holds(stored: &[u8], value: &str) -> bool {
    stored.strip_suffix(b"+").unwrap_or(stored) == value.as_bytes() || stored == value.as_bytes()
}

/// The hand-over time a waiter's id ends with (`...:<ms>`), as the script reads it.
fn hand_over_time(id: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(id).ok()?;
    let (_, ms) = text.rsplit_once(':')?;
    (!ms.is_empty() && ms.bytes().all(|b| b.is_ascii_digit()))
        .then(|| ms.parse().ok())
        .flatten()
}

/// A sorted set's score as a server writes it in a reply: integers without a fraction.
fn score_text(score: f64) -> String {
    if score.fract() == 0.0 && score.abs() < 1e17 {
        format!("{}", score as i64)
    } else {
        format!("{score}")
    }
}

/// A command the fake does not model.
fn unsupported() -> RedisError {
    RedisError::from((
        redis::ErrorKind::Client,
        "the fake server does not model this command",
    ))
}

impl ConnectionLike for FakeServer {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut replies = self.run(vec![cmd.clone()]).await?;
            let reply = replies.pop().unwrap_or(Value::Nil);
            reply.extract_error()
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let cmds: Vec<Cmd> = pipeline.cmd_iter().cloned().collect();
            let replies = self.run(cmds).await?;
            Ok(replies.into_iter().skip(offset).take(count).collect())
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

impl crate::protocol::Send1 for FakeServer {
    fn send1<'a>(
        &'a mut self,
        cmd: &'a Cmd,
    ) -> impl std::future::Future<Output = Result<Value, RedisError>> + Send + 'a {
        self.req_packed_command(cmd)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::FakeServer;
    use crate::{Error, Redlock, RetryPolicy};

    fn client(servers: &[FakeServer]) -> Redlock {
        servers
            .iter()
            .fold(Redlock::builder(), |b, s| b.fake(s.clone()))
            .restart_quarantine(false)
            .wake_on_release(false)
            .fencing(true)
            .node_timeout(Duration::from_millis(100))
            .retry(RetryPolicy::once())
            .build()
            .expect("valid configuration")
    }

    /// Waits (real time, at most 2 s) until `check` holds.
    async fn eventually(mut check: impl FnMut() -> bool) {
        for _ in 0..200 {
            if check() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not reached within 2 s");
    }

    fn taken<T: std::fmt::Debug>(result: Result<T, Error>) -> bool {
        matches!(result, Err(Error::Taken { .. }))
    }

    /// A read-write lock through the client, on fake servers: readers share, a writer
    /// is alone, a downgrade lets readers in but no writer, and a waiting writer keeps
    /// new readers out until it has had its turn.
    #[tokio::test]
    async fn a_read_write_lock_works_on_fake_servers() {
        let servers: Vec<FakeServer> = (0..3).map(|_| FakeServer::default()).collect();
        let redlock = client(&servers);
        let rw = redlock.rw_lock("doc").unwrap();
        let key = redlock.key_for(&rw.resource());

        // Two readers together; no writer next to them.
        let first = rw.read().await.expect("a free lock");
        let second = rw.read().await.expect("readers share");
        assert!(taken(rw.try_write().await), "a writer next to readers");
        // A refused last attempt takes no place: readers still come in.
        let third = rw.try_read().await.expect("no writer waits");
        for reader in [first, second, third] {
            assert!(reader.release().await.unwrap().was_held());
        }

        // A writer alone.
        let writer = rw.try_write().await.expect("no reader left");
        let token = writer.fencing_token().expect("fencing on");
        assert!(taken(rw.try_read().await), "a reader next to the writer");
        assert!(taken(rw.try_write().await), "a second writer");
        for server in &servers {
            assert_eq!(server.get(&key).as_deref(), Some(writer.value()));
        }

        // Downgraded: the same value now reads, with the writer's key gone; readers
        // join it, writers stay out.
        let value = writer.value().to_owned();
        let reading = writer.downgrade().await.expect("held on every node");
        for server in &servers {
            assert_eq!(server.get(&key), None);
            assert_eq!(
                server.get(&format!("{key}:reader:{value}")).as_deref(),
                Some(value.as_str())
            );
        }
        let other = rw.try_read().await.expect("readers join a downgraded lock");
        assert!(
            taken(rw.try_write().await),
            "a writer next to the downgraded lock"
        );
        reading.release().await.unwrap();
        other.release().await.unwrap();
        let next = rw.try_write().await.expect("all readers left");
        assert!(next.fencing_token().unwrap() > token);
        next.release().await.unwrap();

        // A writer that waits for a reader keeps new readers out, and then gets the
        // lock.
        let reader = rw.read().await.unwrap();
        let waiting = rw.clone().retry(
            RetryPolicy::deadline(Duration::from_secs(3))
                .with_delay(Duration::from_millis(10), Duration::from_millis(5)),
        );
        let writer = tokio::spawn(async move { waiting.write().await });
        let queue = format!("{key}:writer-waiting");
        eventually(|| {
            servers
                .iter()
                .filter(|s| s.queue(&queue).len() == 1)
                .count()
                >= 2
        })
        .await;
        assert!(taken(rw.try_read().await), "a reader while a writer waits");
        reader.release().await.unwrap();
        let writer = writer.await.unwrap().expect("the reader left");
        assert!(taken(rw.try_read().await));
        writer.release().await.unwrap();
        // The writer left the queue: readers come in again.
        rw.try_read()
            .await
            .expect("nobody waits")
            .release()
            .await
            .unwrap();
    }
}

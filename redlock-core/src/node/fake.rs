//! An in-memory server behind the node layer, for fast, deterministic unit tests of the
//! layers above it (quorum, validity, fencing, cleanup).
//!
//! It is a `ConnectionLike`: it answers the very commands `protocol::build` makes (`SET
//! NX PX`, and each script by its `EVALSHA` hash) the way the scripts do on a server, so
//! the code under test runs unchanged down to the connection. Faults are injected per
//! server: latency, error replies, replies lost after the command took effect, and
//! restarts without persistence. Keys expire on tokio's clock, so tests run with paused
//! time. The wait queue is modelled too (its sorted sets, its places' deadlines, and
//! hand-overs); publishing is not (hand-overs are picked up by the waiters' timed
//! attempts, as with wake on release off).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Arg, Cmd, Pipeline, RedisError, RedisFuture, Value};
use tokio::time::Instant;

use crate::protocol::scripts;

/// One fake server; clones share it.
#[derive(Clone, Default)]
pub(crate) struct FakeServer(Arc<Mutex<State>>, Link);

/// One client's side of a fake server (see [`FakeServer::for_client`]): which client it
/// is, and the server's last run it has seen (its "connection").
#[derive(Clone, Default)]
struct Link {
    client: usize,
    seen_run: Arc<std::sync::atomic::AtomicU64>,
}

/// What happens to one request on its way to a node and back, as a [`Network`] decides.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Fate {
    /// Time to reach the node (commands of one client to one node still run in order).
    pub(crate) request_delay: Duration,
    /// The request never arrives: no effect, no reply.
    pub(crate) request_lost: bool,
    /// Time for the reply to come back.
    pub(crate) reply_delay: Duration,
    /// The command takes effect but its reply never comes.
    pub(crate) reply_lost: bool,
}

/// The network between clients and fake servers (the simulator's): decides each
/// request's fate and hears each command applied, for its trace.
pub(crate) trait Network: Send + Sync {
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
    pub(crate) fn for_client(&self, client: usize) -> Self {
        Self(
            Arc::clone(&self.0),
            Link {
                client,
                seen_run: Arc::default(),
            },
        )
    }

    /// Sends requests through `network`, as its node `node`.
    pub(crate) fn set_network(&self, node: usize, network: Arc<dyn Network>) {
        self.state().network = Some((node, network));
    }

    /// The node's wall clock reads `us` (µs since the Unix epoch) now, instead of the
    /// host's clock at first use.
    pub(crate) fn set_wall_clock(&self, us: u64) {
        self.state().origin = Some((Instant::now(), us));
    }

    /// The server has been up for `uptime` now.
    pub(crate) fn set_uptime(&self, uptime: Duration) {
        let mut state = self.state();
        state.booted = Some(Instant::now());
        state.up_before = uptime;
    }

    /// The node's clock runs at `rate` against true time (1.1: 10% fast, so its keys
    /// expire after TTL / 1.1).
    pub(crate) fn set_clock_rate(&self, rate: f64) {
        self.state().clock_rate = rate;
    }

    /// The node's clock jumps forward by `by`: its time moves on, and every expiry comes
    /// that much sooner.
    pub(crate) fn jump_clock(&self, by: Duration) {
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
    pub(crate) fn jump_clock_back(&self, by: Duration) {
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
    pub(crate) fn set_no_fence_floor(&self, on: bool) {
        self.state().no_fence_floor = on;
    }

    /// Releases delete the key whoever holds it (a negative control).
    pub(crate) fn set_unchecked_release(&self, on: bool) {
        self.state().unchecked_release = on;
    }

    /// Answers `COUNTED.GRANT key member permits ttl_ms` and `COUNTED.RELEASE key
    /// member`: a semaphore counted on each node alone (a sorted set of holders by
    /// expiry, as one script per node would keep it), for a negative control granting
    /// a permit on a majority of such counters.
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
    pub(crate) fn set_latency(&self, latency: Duration) {
        self.state().latency = latency;
    }

    /// Answers every command with an error (changing nothing) while on.
    pub(crate) fn set_failing(&self, on: bool) {
        self.state().failing = on;
    }

    /// While on, commands take effect but their replies never come.
    pub(crate) fn set_losing_replies(&self, on: bool) {
        self.state().losing_replies = on;
    }

    /// A restart without persistence: every key is forgotten.
    pub(crate) fn restart(&self) {
        let mut state = self.state();
        state.keys.clear();
        state.zsets.clear();
        state.run += 1;
        state.booted = Some(Instant::now());
        state.up_before = Duration::ZERO;
    }

    /// Puts waiter `id` in the wait queue of lock key `key` as the queue scripts do,
    /// waiting since `since_ms`, its place kept for `keep` (a waiter that then dies).
    pub(crate) fn enqueue(&self, key: &str, id: &str, since_ms: u64, keep: Duration) {
        let queues = crate::protocol::with_queues(&[key.to_owned()]);
        let keys: Vec<&[u8]> = queues.iter().map(String::as_bytes).collect();
        let keep = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX);
        self.state()
            .take_places(&keys, 1, id.as_bytes(), since_ms as f64, keep);
    }

    /// The members of the sorted set `key` (a wait queue), lowest score first.
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
    pub(crate) fn set(&self, key: &str, value: &str) {
        self.state().set(key.as_bytes(), value.as_bytes(), None);
    }

    /// The live value of `key`, if any.
    pub(crate) fn get(&self, key: &str) -> Option<String> {
        let mut state = self.state();
        state
            .live(key.as_bytes())
            .map(|e| String::from_utf8_lossy(&e.value).into_owned())
    }

    /// Commands received so far.
    pub(crate) fn commands(&self) -> u64 {
        self.state().commands
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
        let elapsed = Instant::now().duration_since(since);
        if self.clock_rate > 0.0 && self.clock_rate != 1.0 {
            elapsed.mul_f64(self.clock_rate)
        } else {
            elapsed
        }
    }

    fn live(&mut self, key: &[u8]) -> Option<&Entry> {
        let expired = self
            .keys
            .get(key)
            .is_some_and(|e| e.expires.is_some_and(|at| at <= Instant::now()));
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
        let (at, wall) = *self.origin.get_or_insert_with(|| {
            let wall = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_micros();
            (Instant::now(), u64::try_from(wall).unwrap_or(0))
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
        let expired = self
            .zsets
            .get(key)
            .is_some_and(|z| z.expires.is_some_and(|at| at <= Instant::now()));
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

    /// `PTTL`: ms left, -1 without expiry, -2 if missing (strings and sorted sets).
    fn pttl(&mut self, key: &[u8]) -> i64 {
        let now = Instant::now();
        let left = |expires: Option<Instant>| {
            expires.map_or(-1, |at| {
                i64::try_from(at.saturating_duration_since(now).as_millis()).unwrap_or(i64::MAX)
            })
        };
        if let Some(e) = self.live(key) {
            return left(e.expires);
        }
        self.zset(key).map_or(-2, |z| left(z.expires))
    }

    fn pexpire(&mut self, key: &[u8], ms: u64) {
        let at = Instant::now() + self.ttl(ms);
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
        for i in 0..n {
            let (Some(queue), Some(deadlines)) = (keys.get(n + i), keys.get(2 * n + i)) else {
                continue;
            };
            // The waiters' mark on a held key.
            if let Some(entry) = keys.get(i).and_then(|k| self.keys.get_mut(*k))
                && entry.expires.is_none_or(|at| at > Instant::now())
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

    fn set(&mut self, key: &[u8], value: &[u8], ttl_ms: Option<u64>) {
        let expires = ttl_ms.map(|ms| Instant::now() + self.ttl(ms));
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
                    let ttl = self.ttl(ttl);
                    for key in lock_keys {
                        if let Some(entry) = self.keys.get_mut(*key) {
                            entry.expires = Some(Instant::now() + ttl);
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
            let now = Instant::now();
            let longest = keys
                .iter()
                .filter_map(|k| self.live(k).and_then(|e| e.expires))
                .map(|at| at.saturating_duration_since(now).as_millis() as u64)
                .max()
                .unwrap_or(0);
            int(longest)
        } else if sha == scripts::SERVER_TIME.get_hash() {
            int(self.now_ms())
        } else {
            return Err(unsupported());
        })
    }
}

impl State {
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
                    None => free = true,
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

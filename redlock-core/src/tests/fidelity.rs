//! The fake server (`node::fake`) against a real one: the same seeded random command
//! sequences go to a [`FakeServer`] and to a `redis-server` (or the binary in
//! `REDIS_SERVER`, such as `valkey-server`), and every reply is compared, then the
//! state of every key the sequence may touch. So the model the unit tests and the
//! simulator run on cannot drift from the Lua scripts unnoticed.
//!
//! The commands are built by the library's own builders (`Op`, `Command`,
//! `Extensions`) and sent through `Command::execute`, as a node sends them, over a few
//! resources, holder values and waiters, so that they collide; their TTLs and queue
//! places last tens of ms, so keys expire and places lapse within a sequence.
//!
//! Both sides run on real time, the fake stopped, for each command and each look at
//! the keys, at the middle of the real server's round trip: when the real one ran it,
//! give or take half the round trip (plus [`BASE_SLACK`]: ms rounding, and the fake's
//! clock set from the server's `TIME`). A reply that depends on the clock (a remaining
//! TTL, the server's time, a place's deadline, a fencing token floored by the clock in
//! steps shorter than [`EXACT_STEP_US`]) is compared within twice that uncertainty;
//! everything else exactly. Before each command the sequence waits until no key
//! expires, no place lapses and no long clock step of the tokens passes near it (as
//! the fake reckons them): a command that meets such an instant within its uncertainty
//! may see it on one side only, and a sequence that then disagrees runs again, on new
//! keys. So does one whose round trips grow long (a loaded machine), a few times
//! before it is compared within the wider tolerance. A disagreement anywhere else
//! fails, with the seed, the commands so far and both sides' replies
//! (`REDLOCK_FIDELITY_SEED=<seed>` runs that sequence alone).

use std::fmt::Write as _;
use std::future::Future;
use std::io::Write as _;
use std::time::Duration;

use futures_util::StreamExt;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use tokio::time::Instant;

use crate::node::fake::FakeServer;
use crate::protocol::{Command, Extensions, Op, ReleaseMode, RwKeys, Send1, Waiter, WaitingWriter};

/// Sequences per run (`REDLOCK_FIDELITY_SEED=<n>` runs that one alone).
const SEQUENCES: u64 = 100;
/// Sequences run at once (each on its own keys and its own fake server): most of a
/// sequence's time is spent waiting for expiries.
const AT_ONCE: usize = 4;
/// Runs of one sequence before a mismatch counts even where an expiry came within a
/// step's uncertainty.
const ATTEMPTS: u32 = 10;
/// A sequence whose round trips grow longer than twice this (a loaded machine) is run
/// again rather than compared within so wide a tolerance, [`SLOW_RUNS`] times; then
/// it goes on.
const MAX_SLACK: Duration = Duration::from_millis(10);
const SLOW_RUNS: u32 = 3;
/// Added to the uncertainty of when the real server ran a command (half its round
/// trip): ms rounding, the fake's clock set from the server's `TIME`.
const BASE_SLACK: Duration = Duration::from_millis(2);
/// Before a command, the sequence waits until no key expires and no place lapses (as
/// the fake reckons it) this far ahead, beyond the uncertainty.
const LOOKAHEAD: Duration = Duration::from_millis(4);
/// A fencing clock step at least this long (µs) is kept clear of, so that tokens
/// compare exactly; a shorter one is compared within the tolerance.
const EXACT_STEP_US: u64 = 100_000;

/// A reply as compared: a value, or an error by its code.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    Value(Value),
    Error(String),
}

impl Reply {
    fn of(reply: &RedisResult<Value>) -> Self {
        match reply {
            Ok(value) => Self::of_value(value),
            Err(err) => Self::Error(err.code().unwrap_or("(client)").to_owned()),
        }
    }

    fn of_value(value: &Value) -> Self {
        match value {
            Value::ServerError(err) => Self::Error(err.code().to_owned()),
            value => Self::Value(value.clone()),
        }
    }
}

/// A connection that keeps every raw reply it passes on.
struct Recorder<C> {
    inner: C,
    replies: Vec<Reply>,
}

impl<C: ConnectionLike + Send> ConnectionLike for Recorder<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let reply = self.inner.req_packed_command(cmd).await;
            self.replies.push(Reply::of(&reply));
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let replies = self
                .inner
                .req_packed_commands(pipeline, offset, count)
                .await;
            match &replies {
                Ok(values) => self.replies.extend(values.iter().map(Reply::of_value)),
                Err(err) => self
                    .replies
                    .push(Reply::Error(err.code().unwrap_or("(client)").to_owned())),
            }
            replies
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

impl<C: ConnectionLike + Send> Send1 for Recorder<C> {
    fn send1<'a>(
        &'a mut self,
        cmd: &'a Cmd,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a {
        self.req_packed_command(cmd)
    }
}

/// How two answers of one command compare.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rule {
    /// Equal.
    Exact,
    /// A fencing token: equal, or within the tolerance and the clock step when the
    /// step is shorter than [`EXACT_STEP_US`].
    Token,
    /// A time in ms (remaining TTLs, the clock): within the tolerance; negative ones
    /// (`PTTL`'s -1 and -2) equal.
    Ms,
    /// A release's answer: the keys released equal, the longest hand-over pending
    /// (found by its TTL, in follow-up mode) within the tolerance.
    Release,
}

/// One command of a sequence, its data owned.
#[derive(Debug, Clone)]
enum Action {
    Acquire {
        keys: Vec<String>,
        fences: Vec<String>,
        value: String,
        ttl_ms: u64,
        waiter: Option<Waiter>,
        barge: bool,
    },
    RaiseFence {
        fences: Vec<String>,
        token: u64,
    },
    Release {
        keys: Vec<String>,
        value: String,
        mode: ReleaseMode,
        handoff_ms: u64,
        dequeue: Option<String>,
    },
    Extend {
        keys: Vec<String>,
        value: String,
        ttl_ms: u64,
    },
    /// A watchdog round: several locks' extensions in one command.
    ExtendMany {
        locks: Vec<(Vec<String>, String, u64)>,
    },
    Remaining {
        keys: Vec<String>,
    },
    ServerTime,
    JoinQueue {
        keys: Vec<String>,
        waiter: Waiter,
    },
    Mark {
        keys: Vec<String>,
    },
    AcquireRead {
        rw: usize,
        value: String,
        ttl_ms: u64,
    },
    AcquireWrite {
        rw: usize,
        fence: bool,
        value: String,
        ttl_ms: u64,
        writer: WaitingWriter,
    },
    ReleaseRead {
        rw: usize,
        value: String,
        wake: bool,
    },
    ReleaseWrite {
        rw: usize,
        value: String,
        wake: bool,
    },
    Downgrade {
        rw: usize,
        value: String,
    },
    LeaveWriters {
        rw: usize,
        writer: WaitingWriter,
    },
    /// `PTTL` of keys in one pipeline (a look at a semaphore's slots).
    Look {
        keys: Vec<String>,
    },
}

/// The key space of one sequence.
struct Space {
    /// Per resource: its lock key (also a read-write lock's writer's key).
    locks: Vec<String>,
    fences: Vec<String>,
    rw: Vec<RwKeys>,
    values: Vec<String>,
    waiters: Vec<Waiter>,
    /// Writer ids and when each began waiting.
    writers: Vec<(String, u64)>,
    /// The fencing clock floor's step (µs).
    step_us: u64,
    /// Which commands it draws from (see [`FOCUS`]).
    focus: usize,
}

/// The kinds of command a sequence draws from (numbered as in `Space::action`, some
/// more than once): all of them, or those of a lock's wait queue, or those of a
/// read-write lock. A sequence that keeps to a few kinds makes them meet more often
/// (a release finding a queue of several waiters, some of whose places lapsed).
const FOCUS: [&[u8]; 3] = [
    &[
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
    ],
    &[
        0, 3, 3, 4, 4, 6, 6, 7, 7, 8, 8, 9, 10, 11, 13, 13, 13, 14, 5,
    ],
    &[15, 15, 16, 17, 17, 18, 19, 19, 20, 20, 21, 9, 10, 11, 12],
];

impl Space {
    fn new(rng: &mut StdRng, prefix: &str, now_ms: u64) -> Self {
        let resources = rng.random_range(1..=3);
        let locks: Vec<String> = (0..resources).map(|i| format!("{prefix}:r{i}")).collect();
        let hex = |rng: &mut StdRng, bytes: usize| -> String {
            (0..bytes)
                .map(|_| format!("{:02x}", rng.random::<u8>()))
                .collect()
        };
        let values = (0..2).map(|i| format!("h{i}/{}", hex(rng, 20))).collect();
        // Places in the queues: the nodes' time the waiter began, some at once.
        let base = now_ms - 1000;
        let waiters = (0..rng.random_range(2..=3))
            .map(|i| {
                let id = format!(
                    "c{i}.{}:{}",
                    hex(rng, 8),
                    [15, 30, 60][rng.random_range(0..3)]
                );
                Waiter {
                    placeholder: format!("~{id}"),
                    id,
                    since_ms: base + rng.random_range(0..3),
                    keep_ms: 100,
                }
            })
            .collect();
        let writers = (0..2)
            .map(|_| (hex(rng, 20), base + rng.random_range(0..3)))
            .collect();
        Self {
            fences: locks.iter().map(|k| format!("{k}:fence")).collect(),
            rw: locks.iter().map(|k| RwKeys::new(k.clone())).collect(),
            locks,
            values,
            waiters,
            writers,
            step_us: [1, 1000, 1_000_000, 10_000_000][rng.random_range(0..4)],
            focus: rng.random_range(0..FOCUS.len()),
        }
    }

    /// Every key a sequence may touch, with how its state is compared.
    fn keys(&self) -> Vec<(String, Kind)> {
        let mut all = Vec::new();
        for (i, lock) in self.locks.iter().enumerate() {
            let rw = &self.rw[i];
            all.push((lock.clone(), Kind::Text));
            all.push((self.fences[i].clone(), Kind::Token));
            all.push((format!("{lock}:queue"), Kind::Queue));
            all.push((format!("{lock}:queue:until"), Kind::Deadlines));
            all.push((rw.readers.clone(), Kind::Set));
            all.push((rw.writers.clone(), Kind::Queue));
            all.push((rw.writer_deadlines.clone(), Kind::Deadlines));
            for value in &self.values {
                all.push((rw.reader(value), Kind::Text));
            }
        }
        all
    }

    fn pick<'a, T>(rng: &mut StdRng, of: &'a [T]) -> &'a T {
        &of[rng.random_range(0..of.len())]
    }

    /// 1 to `most` distinct resources, in order.
    fn resources(&self, rng: &mut StdRng, most: usize) -> Vec<usize> {
        let n = rng.random_range(1..=most.min(self.locks.len()));
        let mut picked: Vec<usize> = (0..self.locks.len()).collect();
        while picked.len() > n {
            picked.remove(rng.random_range(0..picked.len()));
        }
        picked
    }

    /// How long a waiter's place is kept: as the library keeps it (at least 100 ms),
    /// or shorter, so that places lapse within a sequence more often.
    fn keep(rng: &mut StdRng) -> u64 {
        [15, 30, 100, 130][rng.random_range(0..4)]
    }

    fn ttl(rng: &mut StdRng) -> u64 {
        [15, 25, 40, 60, 100, 300][rng.random_range(0..6)]
    }

    fn action(&self, rng: &mut StdRng, now_us: u64) -> Action {
        let value = Self::pick(rng, &self.values).clone();
        let rw = rng.random_range(0..self.rw.len());
        let writer = |rng: &mut StdRng| {
            let (id, since_ms) = Self::pick(rng, &self.writers).clone();
            WaitingWriter {
                id,
                since_ms,
                keep_ms: [0, 30, 60, 100, 150][rng.random_range(0..5)],
            }
        };
        let kinds = FOCUS[self.focus];
        match kinds[rng.random_range(0..kinds.len())] {
            0..=2 => {
                let picked = self.resources(rng, 2);
                let fenced = rng.random_bool(0.4);
                Action::Acquire {
                    keys: picked.iter().map(|&i| self.locks[i].clone()).collect(),
                    fences: if fenced {
                        picked.iter().map(|&i| self.fences[i].clone()).collect()
                    } else {
                        Vec::new()
                    },
                    value,
                    ttl_ms: Self::ttl(rng),
                    waiter: None,
                    barge: rng.random_bool(0.5),
                }
            }
            3 | 4 => {
                // A queued waiter's attempt: one resource, with or without fencing.
                let i = rng.random_range(0..self.locks.len());
                Action::Acquire {
                    keys: vec![self.locks[i].clone()],
                    fences: if rng.random_bool(0.4) {
                        vec![self.fences[i].clone()]
                    } else {
                        Vec::new()
                    },
                    value,
                    ttl_ms: Self::ttl(rng),
                    waiter: Some(Waiter {
                        keep_ms: Self::keep(rng),
                        ..Self::pick(rng, &self.waiters).clone()
                    }),
                    barge: false,
                }
            }
            5 => Action::RaiseFence {
                fences: self
                    .resources(rng, 2)
                    .iter()
                    .map(|&i| self.fences[i].clone())
                    .collect(),
                token: match rng.random_range(0..3) {
                    0 => rng.random_range(1..1000),
                    // Past every token the clock gives: later ones count from it, exactly.
                    1 => now_us + 1_000_000_000_000 + rng.random_range(0..1000),
                    _ => now_us - rng.random_range(0..2_000_000),
                },
            },
            6..=8 => {
                let keys = self
                    .resources(rng, 2)
                    .iter()
                    .map(|&i| self.locks[i].clone())
                    .collect();
                let handoff_ms = [10, 25][rng.random_range(0..2)];
                match rng.random_range(0..5) {
                    0 | 1 => Action::Release {
                        keys,
                        value,
                        mode: ReleaseMode::HandOver,
                        handoff_ms,
                        dequeue: None,
                    },
                    2 => Action::Release {
                        keys,
                        value,
                        mode: ReleaseMode::Quiet,
                        handoff_ms,
                        dequeue: None,
                    },
                    3 => Action::Release {
                        keys,
                        value,
                        mode: ReleaseMode::FollowUp,
                        handoff_ms,
                        dequeue: None,
                    },
                    _ => {
                        // A waiter leaving, passing on a hand-over it did not take.
                        let waiter = Self::pick(rng, &self.waiters);
                        Action::Release {
                            keys,
                            value: waiter.placeholder.clone(),
                            mode: ReleaseMode::HandOver,
                            handoff_ms,
                            dequeue: Some(waiter.id.clone()),
                        }
                    }
                }
            }
            9 => Action::Extend {
                keys: self
                    .resources(rng, 2)
                    .iter()
                    .map(|&i| self.locks[i].clone())
                    .collect(),
                value,
                ttl_ms: Self::ttl(rng),
            },
            10 => Action::ExtendMany {
                locks: (0..rng.random_range(2..=3))
                    .map(|_| {
                        let keys = if rng.random_bool(0.3) {
                            // A read lock's key.
                            vec![self.rw[rw].reader(Self::pick(rng, &self.values).as_str())]
                        } else {
                            self.resources(rng, 2)
                                .iter()
                                .map(|&i| self.locks[i].clone())
                                .collect()
                        };
                        (keys, Self::pick(rng, &self.values).clone(), Self::ttl(rng))
                    })
                    .collect(),
            },
            11 => Action::Remaining {
                keys: self
                    .resources(rng, 3)
                    .iter()
                    .map(|&i| self.locks[i].clone())
                    .collect(),
            },
            12 => {
                if rng.random_bool(0.5) {
                    Action::ServerTime
                } else {
                    Action::Look {
                        keys: self
                            .resources(rng, 3)
                            .iter()
                            .map(|&i| self.locks[i].clone())
                            .collect(),
                    }
                }
            }
            13 => Action::JoinQueue {
                keys: self
                    .resources(rng, 2)
                    .iter()
                    .map(|&i| self.locks[i].clone())
                    .collect(),
                waiter: Waiter {
                    keep_ms: Self::keep(rng),
                    ..Self::pick(rng, &self.waiters).clone()
                },
            },
            14 => Action::Mark {
                keys: self
                    .resources(rng, 3)
                    .iter()
                    .map(|&i| self.locks[i].clone())
                    .collect(),
            },
            15 | 16 => Action::AcquireRead {
                rw,
                value,
                ttl_ms: Self::ttl(rng),
            },
            17 | 18 => Action::AcquireWrite {
                rw,
                fence: rng.random_bool(0.4),
                value,
                ttl_ms: Self::ttl(rng),
                writer: writer(rng),
            },
            19 => Action::ReleaseRead {
                rw,
                value,
                wake: rng.random_bool(0.5),
            },
            20 => {
                if rng.random_bool(0.5) {
                    Action::ReleaseWrite {
                        rw,
                        value,
                        wake: rng.random_bool(0.5),
                    }
                } else {
                    Action::Downgrade { rw, value }
                }
            }
            _ => Action::LeaveWriters {
                rw,
                writer: writer(rng),
            },
        }
    }
}

impl Action {
    fn rule(&self) -> Rule {
        match self {
            Action::Acquire { fences, .. } if !fences.is_empty() => Rule::Token,
            Action::AcquireWrite { fence: true, .. } => Rule::Token,
            Action::Release {
                mode: ReleaseMode::FollowUp,
                ..
            } => Rule::Release,
            Action::Remaining { .. }
            | Action::ServerTime
            | Action::JoinQueue { .. }
            | Action::Look { .. } => Rule::Ms,
            _ => Rule::Exact,
        }
    }

    /// Sends the command on `conn` as a node does; its answer (`None` for the commands
    /// answered raw only).
    async fn run<C: Send1>(&self, space: &Space, conn: &mut C) -> Option<Result<u64, String>> {
        let op = match self {
            Action::Acquire {
                keys,
                fences,
                value,
                ttl_ms,
                waiter,
                barge,
            } => Op::Acquire {
                keys,
                fence_keys: fences,
                value,
                ttl_ms: *ttl_ms,
                waiter: waiter.as_ref(),
                barge: *barge,
                fence_step_us: space.step_us,
            },
            Action::RaiseFence { fences, token } => Op::RaiseFence {
                fence_keys: fences,
                token: *token,
            },
            Action::Release {
                keys,
                value,
                mode,
                handoff_ms,
                dequeue,
            } => Op::Release {
                keys,
                value,
                mode: *mode,
                handoff_ms: *handoff_ms,
                dequeue: dequeue.as_deref(),
            },
            Action::Extend {
                keys,
                value,
                ttl_ms,
            } => Op::Extend {
                keys,
                value,
                ttl_ms: *ttl_ms,
            },
            Action::ExtendMany { locks } => {
                let extensions = Extensions::new(
                    locks
                        .iter()
                        .map(|(keys, value, ttl)| (keys.as_slice(), value.as_str(), *ttl)),
                );
                for cmd in extensions.commands() {
                    let _ = conn.send1(cmd).await;
                }
                return None;
            }
            Action::Remaining { keys } => Op::Remaining { keys },
            Action::ServerTime => Op::ServerTime,
            Action::JoinQueue { keys, waiter } => Op::JoinQueue { keys, waiter },
            Action::Mark { keys } => Op::Mark { keys },
            Action::AcquireRead { rw, value, ttl_ms } => {
                let rw = &space.rw[*rw];
                let key = rw.reader(value);
                return Some(
                    Command::new(Op::AcquireRead {
                        key: &key,
                        rw,
                        value,
                        ttl_ms: *ttl_ms,
                    })
                    .execute(conn)
                    .await
                    .map_err(|e| e.to_string()),
                );
            }
            Action::AcquireWrite {
                rw,
                fence,
                value,
                ttl_ms,
                writer,
            } => {
                let fences = if *fence {
                    vec![space.fences[*rw].clone()]
                } else {
                    Vec::new()
                };
                return Some(
                    Command::new(Op::AcquireWrite {
                        rw: &space.rw[*rw],
                        fence_keys: &fences,
                        value,
                        ttl_ms: *ttl_ms,
                        writer,
                        fence_step_us: space.step_us,
                    })
                    .execute(conn)
                    .await
                    .map_err(|e| e.to_string()),
                );
            }
            Action::ReleaseRead { rw, value, wake } => {
                let rw = &space.rw[*rw];
                let key = rw.reader(value);
                return Some(
                    Command::new(Op::ReleaseRead {
                        key: &key,
                        rw,
                        value,
                        wake: *wake,
                    })
                    .execute(conn)
                    .await
                    .map_err(|e| e.to_string()),
                );
            }
            Action::ReleaseWrite { rw, value, wake } => Op::ReleaseWrite {
                rw: &space.rw[*rw],
                value,
                wake: *wake,
            },
            Action::Downgrade { rw, value } => {
                let rw = &space.rw[*rw];
                let key = rw.reader(value);
                return Some(
                    Command::new(Op::Downgrade {
                        key: &key,
                        rw,
                        value,
                    })
                    .execute(conn)
                    .await
                    .map_err(|e| e.to_string()),
                );
            }
            Action::LeaveWriters { rw, writer } => Op::LeaveWriters {
                rw: &space.rw[*rw],
                writer,
            },
            Action::Look { keys } => {
                let mut pipe = redis::pipe();
                for key in keys {
                    pipe.cmd("PTTL").arg(key);
                }
                let _ = conn.send_pipeline(&pipe).await;
                return None;
            }
        };
        Some(
            Command::new(op)
                .execute(conn)
                .await
                .map_err(|e| e.to_string()),
        )
    }
}

/// How a key's state is read and compared.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// A string (`GET`).
    Text,
    /// A fencing counter (`GET`, compared as a token).
    Token,
    /// A wait queue: members in order, scores given by the commands.
    Queue,
    /// A queue's deadlines: members, scores from the clock.
    Deadlines,
    /// A set (`SMEMBERS`).
    Set,
}

/// The state of `keys`: per key its `TYPE`, `PTTL` and contents.
async fn snapshot<C: ConnectionLike>(keys: &[(String, Kind)], conn: &mut C) -> Vec<Reply> {
    let mut pipe = redis::pipe();
    for (key, kind) in keys {
        pipe.cmd("TYPE").arg(key);
        pipe.cmd("PTTL").arg(key);
        match kind {
            Kind::Text | Kind::Token => pipe.cmd("GET").arg(key),
            Kind::Queue | Kind::Deadlines => {
                pipe.cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES")
            }
            Kind::Set => pipe.cmd("SMEMBERS").arg(key),
        };
    }
    match conn.req_packed_commands(&pipe, 0, 3 * keys.len()).await {
        Ok(values) => values.iter().map(Reply::of_value).collect(),
        Err(err) => vec![Reply::of(&Err(err))],
    }
}

fn int(reply: &Reply) -> Option<i64> {
    match reply {
        Reply::Value(Value::Int(n)) => Some(*n),
        Reply::Value(Value::BulkString(bytes)) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        _ => None,
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".to_owned(),
        other => format!("{other:?}"),
    }
}

/// How far apart two values derived from the clock may be.
#[derive(Debug, Clone, Copy)]
struct Tolerance {
    /// Times (ms).
    ms: u64,
    /// The fencing clock floor's step (µs).
    step_us: u64,
}

/// Whether two numbers agree under `rule`.
fn numbers_agree(rule: Rule, tolerance: Tolerance, a: i64, b: i64) -> bool {
    match rule {
        Rule::Exact => a == b,
        Rule::Token => {
            a == b
                || (tolerance.step_us < EXACT_STEP_US
                    && a > 0
                    && b > 0
                    && a.abs_diff(b) <= tolerance.ms * 1000 + tolerance.step_us)
        }
        Rule::Ms => {
            if a < 0 || b < 0 {
                a == b
            } else {
                a.abs_diff(b) <= tolerance.ms
            }
        }
        Rule::Release => a % 65536 == b % 65536 && (a / 65536).abs_diff(b / 65536) <= tolerance.ms,
    }
}

fn values_agree(rule: Rule, tolerance: Tolerance, a: &Reply, b: &Reply) -> bool {
    match (a, b) {
        (Reply::Value(Value::Int(x)), Reply::Value(Value::Int(y))) => {
            numbers_agree(rule, tolerance, *x, *y)
        }
        (Reply::Value(Value::Array(x)), Reply::Value(Value::Array(y))) => {
            x.len() == y.len()
                && x.iter().zip(y).all(|(x, y)| {
                    values_agree(rule, tolerance, &Reply::of_value(x), &Reply::of_value(y))
                })
        }
        (Reply::Value(x), Reply::Value(y)) => text(x) == text(y),
        (a, b) => a == b,
    }
}

/// A sorted set's `ZRANGE .. WITHSCORES` reply: members and scores, in order.
fn scored(reply: &Reply) -> Option<Vec<(String, f64)>> {
    let Reply::Value(Value::Array(items)) = reply else {
        return None;
    };
    items
        .chunks(2)
        .map(|pair| match pair {
            [member, score] => Some((text(member), text(score).parse().ok()?)),
            _ => None,
        })
        .collect()
}

/// The differences between two snapshots of `keys`, one line each.
fn snapshot_differences(
    keys: &[(String, Kind)],
    tolerance: Tolerance,
    real: &[Reply],
    fake: &[Reply],
) -> Vec<String> {
    if real.len() != fake.len() {
        return vec![format!("snapshot: real {real:?}\n  fake {fake:?}")];
    }
    let mut out = Vec::new();
    for (i, (key, kind)) in keys.iter().enumerate() {
        let (r, f) = (&real[3 * i..3 * i + 3], &fake[3 * i..3 * i + 3]);
        let mut differ = |what: &str, a: &Reply, b: &Reply| {
            out.push(format!("{key} {what}: real {a:?}, fake {b:?}"));
        };
        if r[0] != f[0] {
            differ("TYPE", &r[0], &f[0]);
            continue;
        }
        if !values_agree(Rule::Ms, tolerance, &r[1], &f[1]) {
            differ("PTTL", &r[1], &f[1]);
        }
        let agree = match kind {
            Kind::Text => r[2] == f[2],
            Kind::Token => match (int(&r[2]), int(&f[2])) {
                (Some(a), Some(b)) => numbers_agree(Rule::Token, tolerance, a, b),
                _ => r[2] == f[2],
            },
            Kind::Queue => r[2] == f[2] || scored(&r[2]) == scored(&f[2]),
            Kind::Deadlines => match (scored(&r[2]), scored(&f[2])) {
                (Some(mut a), Some(mut b)) => {
                    // By member: places that lapse within a ms of each other may
                    // order either way.
                    a.sort_by(|x, y| x.0.cmp(&y.0));
                    b.sort_by(|x, y| x.0.cmp(&y.0));
                    a.len() == b.len()
                        && a.iter()
                            .zip(&b)
                            .all(|(x, y)| x.0 == y.0 && (x.1 - y.1).abs() <= tolerance.ms as f64)
                }
                _ => r[2] == f[2],
            },
            Kind::Set => {
                let members = |reply: &Reply| match reply {
                    Reply::Value(Value::Array(items)) => {
                        let mut all: Vec<String> = items.iter().map(text).collect();
                        all.sort();
                        Some(all)
                    }
                    _ => None,
                };
                members(&r[2]).is_some() && members(&r[2]) == members(&f[2])
            }
        };
        if !agree {
            differ("contents", &r[2], &f[2]);
        }
    }
    out
}

/// Whether anything that changes with time alone (an expiry, a place lapsing, with a
/// long fencing step the clock floor) falls within `from..=to`, as `fake` reckons it.
fn changes_within(fake: &FakeServer, step_us: u64, from: Instant, to: Instant) -> bool {
    if fake.changes().into_iter().any(|at| from <= at && at <= to) {
        return true;
    }
    if step_us < EXACT_STEP_US {
        return false;
    }
    // The fake's clock (stopped or not) at `from` and `to`: in different steps?
    let now = Instant::now();
    let clock = fake.clock_us();
    let at = |t: Instant| {
        if t >= now {
            clock + t.duration_since(now).as_micros() as u64
        } else {
            clock.saturating_sub(now.duration_since(t).as_micros() as u64)
        }
    };
    at(from) / step_us != at(to) / step_us
}

/// Waits until nothing changes with time alone within `slack` behind or `slack` and
/// [`LOOKAHEAD`] ahead, on the fake's reckoning (its time running).
async fn settle(fake: &FakeServer, step_us: u64, slack: Duration) {
    for _ in 0..1000 {
        let now = Instant::now();
        let from = now.checked_sub(slack).unwrap_or(now);
        if !changes_within(fake, step_us, from, now + slack + LOOKAHEAD) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Runs `run` on the real server, then on the fake stopped at the middle of the real
/// one's round trip (when the real server ran it, give or take half the round trip);
/// the fake's time runs on afterwards. Returns both results, when the round trip began
/// and ended.
async fn both<'a, T, R, F>(fake_server: &FakeServer, real: R, fake: F) -> (T, T, Instant, Instant)
where
    R: Future<Output = T> + 'a,
    F: FnOnce() -> std::pin::Pin<Box<dyn Future<Output = T> + 'a>>,
{
    let sent = Instant::now();
    let real = real.await;
    let received = Instant::now();
    fake_server.set_now(Some(sent + (received - sent) / 2));
    let fake = fake().await;
    fake_server.set_now(None);
    (real, fake, sent, received)
}

/// The real server's clock (µs since the Unix epoch).
async fn server_time(conn: &mut MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1_000_000 + micros
}

/// What one sequence came to.
enum Outcome {
    Agreed {
        /// The commands compared by kind: how many, and how many answered other than 0
        /// (granted, released, held...).
        commands: std::collections::BTreeMap<String, (usize, usize)>,
        replies: usize,
        keys: usize,
        /// The widest tolerance on clock-derived values it needed (ms).
        tolerance_ms: u64,
    },
    Mismatch {
        report: String,
        /// Something changed with time alone within the step's uncertainty: the real
        /// server and the fake may each have seen a side of it.
        exposed: bool,
    },
    /// The round trips grew too long to compare closely.
    Slow,
}

async fn sequence(
    seed: u64,
    attempt: u32,
    give_up_slow: bool,
    conn: &MultiplexedConnection,
) -> Outcome {
    let mut kinds = std::collections::BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut real = Recorder {
        inner: conn.clone(),
        replies: Vec::new(),
    };
    let fake_server = FakeServer::default();
    let mut fake = Recorder {
        inner: fake_server.clone(),
        replies: Vec::new(),
    };
    let sent = Instant::now();
    let now_us = server_time(&mut real.inner).await;
    let received = Instant::now();
    fake_server.set_now(Some(sent + (received - sent) / 2));
    fake_server.set_wall_clock(now_us);
    fake_server.set_now(None);
    // How far off (at most) the instant the fake runs each command as is from when the
    // real server ran it: half the longest round trip so far, and the base.
    let mut slack = (received - sent) / 2 + BASE_SLACK;
    let space = Space::new(&mut rng, &format!("fid:{seed}:{attempt}"), now_us / 1000);
    let keys = space.keys();
    let length = rng.random_range(20..=40);
    let mut log = String::new();
    let (mut replies, mut compared_keys, mut widest) = (0, 0, 0);
    for n in 0..length {
        if rng.random_bool(0.25) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(1..30))).await;
        }
        let action = space.action(&mut rng, fake_server.clock_us());
        // A wide uncertainty (a slow sequence going on) would keep few instants clear.
        settle(&fake_server, space.step_us, slack.min(MAX_SLACK)).await;
        // The instants that may change a reply, as the fake reckons them before the
        // command and after (the look at the keys forgets those of the keys it finds
        // expired).
        let mut changes = fake_server.changes();
        real.replies.clear();
        fake.replies.clear();
        let (real_answer, fake_answer, sent, received) = {
            let (real, fake) = (&mut real, &mut fake);
            let space = &space;
            let action = &action;
            both(&fake_server, action.run(space, real), move || {
                Box::pin(action.run(space, fake))
            })
            .await
        };
        changes.extend(fake_server.changes());
        let (real_state, fake_state, snap_sent, snap_received) = {
            let (real, fake) = (&mut real.inner, &mut fake.inner);
            let keys = &keys;
            both(&fake_server, snapshot(keys, real), move || {
                Box::pin(snapshot(keys, fake))
            })
            .await
        };
        let half = ((received - sent) / 2).max((snap_received - snap_sent) / 2);
        slack = slack.max(half + BASE_SLACK);
        if slack > MAX_SLACK && give_up_slow {
            return Outcome::Slow;
        }
        let tolerance = Tolerance {
            ms: 2 * slack.as_millis() as u64 + 1,
            step_us: space.step_us,
        };
        widest = widest.max(tolerance.ms);
        let (from, to) = (
            sent.checked_sub(slack).unwrap_or(sent),
            snap_received + slack,
        );
        let exposed = changes.iter().any(|&at| from <= at && at <= to)
            || changes_within(&fake_server, space.step_us, from, to);
        let _ = writeln!(
            log,
            "  {n}: {action:?}\n     real {real_answer:?} {:?}\n     fake {fake_answer:?} {:?}",
            real.replies, fake.replies
        );
        let rule = action.rule();
        let mut differences = Vec::new();
        let answers_agree = match (&real_answer, &fake_answer) {
            (Some(Ok(a)), Some(Ok(b))) => numbers_agree(
                rule,
                tolerance,
                i64::try_from(*a).unwrap_or(i64::MAX),
                i64::try_from(*b).unwrap_or(i64::MAX),
            ),
            (a, b) => a == b,
        };
        if !answers_agree {
            differences.push("the answers differ".to_owned());
        }
        if real.replies.len() != fake.replies.len()
            || !real
                .replies
                .iter()
                .zip(&fake.replies)
                .all(|(a, b)| values_agree(rule, tolerance, a, b))
        {
            differences.push("the raw replies differ".to_owned());
        }
        differences.extend(snapshot_differences(
            &keys,
            tolerance,
            &real_state,
            &fake_state,
        ));
        if !differences.is_empty() {
            let report = format!(
                "seed {seed} (attempt {attempt}), command {n} (round trips {:?} and {:?}, tolerance {} ms, fencing step {} µs{}):\n{}\nthe sequence so far:\n{log}",
                received - sent,
                snap_received - snap_sent,
                tolerance.ms,
                space.step_us,
                if exposed {
                    ", an expiry within the uncertainty"
                } else {
                    ""
                },
                differences.join("\n"),
            );
            return Outcome::Mismatch { report, exposed };
        }
        replies += real.replies.len();
        compared_keys += keys.len();
        let kind = format!("{action:?}");
        let kind = kind.split([' ', '{']).next().unwrap_or_default().to_owned();
        let counts = kinds.entry(kind).or_insert((0, 0));
        counts.0 += 1;
        counts.1 += usize::from(matches!(real_answer, Some(Ok(n)) if n > 0));
    }
    Outcome::Agreed {
        commands: kinds,
        replies,
        keys: compared_keys,
        tolerance_ms: widest,
    }
}

/// Writes past the test harness's capture, so that every run's log shows it.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[tokio::test]
async fn the_fake_server_answers_as_a_real_one() {
    let server = redlock_testkit::RedisServer::start(redlock_testkit::Persistence::None).await;
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the server");
    let mut load = redis::pipe();
    crate::protocol::load_scripts(&mut load);
    load.exec_async(&mut conn).await.expect("load the scripts");
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap();
    let version = ["valkey_version", "redis_version"]
        .iter()
        .find_map(|field| crate::protocol::info_field(&info, field).map(|v| format!("{field} {v}")))
        .unwrap_or_default();
    let seeds: Vec<u64> = match std::env::var("REDLOCK_FIDELITY_SEED") {
        Ok(seed) => vec![seed.parse().expect("REDLOCK_FIDELITY_SEED: a number")],
        Err(_) => (0..SEQUENCES).collect(),
    };
    let started = std::time::Instant::now();
    let runs = seeds.iter().map(|&seed| {
        let conn = conn.clone();
        async move {
            let mut reruns = 0;
            let mut slow = 0;
            for attempt in 0..ATTEMPTS {
                match sequence(seed, attempt, slow < SLOW_RUNS, &conn).await {
                    Outcome::Mismatch { report, exposed } if exposed && attempt + 1 < ATTEMPTS => {
                        let what: Vec<&str> = report
                            .lines()
                            .take_while(|line| !line.starts_with("the sequence so far"))
                            .collect();
                        say(&format!(
                            "fidelity: an expiry within a step's uncertainty, run again: {}",
                            what.join("\n  ")
                        ));
                        reruns += 1;
                    }
                    Outcome::Slow => {
                        slow += 1;
                        reruns += 1;
                    }
                    outcome => return (outcome, reruns),
                }
            }
            unreachable!("the last attempt returns")
        }
    });
    let mut outcomes = futures_util::stream::iter(runs).buffer_unordered(AT_ONCE);
    let (mut replies, mut keys, mut reruns) = (0, 0, 0);
    let mut commands = std::collections::BTreeMap::new();
    let mut widest = 0;
    while let Some((outcome, again)) = outcomes.next().await {
        reruns += again;
        match outcome {
            Outcome::Agreed {
                commands: c,
                replies: r,
                keys: k,
                tolerance_ms,
            } => {
                for (kind, (n, yes)) in c {
                    let counts = commands.entry(kind).or_insert((0, 0));
                    counts.0 += n;
                    counts.1 += yes;
                }
                replies += r;
                keys += k;
                widest = widest.max(tolerance_ms);
            }
            Outcome::Mismatch { report, .. } => {
                panic!("the fake server and {version} disagree: {report}")
            }
            Outcome::Slow => unreachable!("a slow sequence goes on after SLOW_RUNS runs"),
        }
    }
    say(&format!(
        "fidelity ({version}): {} sequences, {} commands ({replies} replies) and {keys} key states compared, {reruns} sequences run again (an expiry within a step's uncertainty, or round trips past {MAX_SLACK:?}), clock-derived values within at most {widest} ms, in {:.1?}; the commands (compared, answered other than 0): {commands:?}",
        seeds.len(),
        commands.values().map(|c| c.0).sum::<usize>(),
        started.elapsed(),
    ));
}

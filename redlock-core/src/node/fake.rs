//! An in-memory server behind the node layer, for fast, deterministic unit tests of the
//! layers above it (quorum, validity, fencing, cleanup).
//!
//! It is a `ConnectionLike`: it answers the very commands `protocol::build` makes (`SET
//! NX PX`, and each script by its `EVALSHA` hash) the way the scripts do on a server, so
//! the code under test runs unchanged down to the connection. Faults are injected per
//! server: latency, error replies, replies lost after the command took effect, and
//! restarts without persistence. Keys expire on tokio's clock, so tests run with paused
//! time. The wait queue's scripts (hand-overs) are not modelled: a queued attempt gets an
//! error reply; queue behaviour is tested against real servers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Arg, Cmd, Pipeline, RedisError, RedisFuture, Value};
use tokio::time::Instant;

use crate::protocol::scripts;

/// One fake server; clones share it.
#[derive(Clone, Default)]
pub(crate) struct FakeServer(Arc<Mutex<State>>);

#[derive(Default)]
struct State {
    keys: HashMap<Vec<u8>, Entry>,
    latency: Duration,
    failing: bool,
    losing_replies: bool,
    commands: u64,
}

struct Entry {
    value: Vec<u8>,
    expires: Option<Instant>,
}

impl FakeServer {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
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
        self.state().keys.clear();
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

impl State {
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

    fn set(&mut self, key: &[u8], value: &[u8], ttl_ms: Option<u64>) {
        let expires = ttl_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
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
            "SET" => {
                let (key, value) = (args[1], args[2]);
                if self.live(key).is_some() {
                    Value::Nil
                } else {
                    self.set(key, value, Some(num(5)));
                    Value::Okay
                }
            }
            "PING" => Value::SimpleString("PONG".into()),
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
            let token = fences.iter().map(|k| self.number(k)).max().unwrap_or(0) + 1;
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
            let ours =
                |s: &mut Self, k: &[u8]| s.live(k).is_some_and(|e| e.value == arg(0).as_bytes());
            if !keys.iter().all(|k| ours(self, k)) {
                return Ok(int(0));
            }
            for key in keys {
                if let Some(entry) = self.keys.get_mut(*key) {
                    entry.expires = Some(Instant::now() + Duration::from_millis(ms(1)));
                }
            }
            int(1)
        } else if sha == scripts::RELEASE.get_hash() {
            // Lock keys, then their queues and deadlines (not modelled: no waiters).
            let locks = &keys[..keys.len() / 3];
            if arg(1) == "2" {
                return Ok(int(0));
            }
            let mut released = 0;
            for key in locks {
                if self.live(key).is_some_and(|e| e.value == arg(0).as_bytes()) {
                    self.keys.remove(*key);
                    released += 1;
                }
            }
            int(released)
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
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            int(now.as_millis() as u64)
        } else {
            return Err(unsupported());
        })
    }
}

/// A command the fake does not model (the wait queue's scripts).
fn unsupported() -> RedisError {
    RedisError::from((
        redis::ErrorKind::Client,
        "the fake server does not model this command (the wait queue's scripts)",
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

//! What deterministic simulations over redlock-core's in-memory lock nodes share
//! (feature `sim`): the simulated network between the replicas and the lock nodes
//! (latency, lost requests and replies, paused and crashed replicas), the nodes' faults,
//! and the trace every part of a simulation writes to, on simulated time.
//!
//! A simulation runs on a current-thread tokio runtime with paused time; see
//! `redlock_core::sim` for the nodes themselves.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redis::{Cmd, RedisError, Value};
use redlock_core::sim::{FakeServer, Fate, Network};
use tokio::time::Instant;

/// The trace: one line per event, stamped with the simulated time since the start.
/// Lines are kept only while tracing (the determinism and replay tests).
struct Trace {
    origin: Instant,
    lines: Option<Vec<String>>,
    live: bool,
}

/// The trace, shared by every part of a simulation (network, stores, observer, clients).
#[derive(Clone)]
pub struct Log(Arc<Mutex<Trace>>);

impl Log {
    /// A trace starting now: its lines kept (`keep`, for comparing two runs of a seed)
    /// and printed as they come (`live`, for a replay).
    pub fn new(keep: bool, live: bool) -> Self {
        Self(Arc::new(Mutex::new(Trace {
            origin: Instant::now(),
            lines: keep.then(Vec::new),
            live,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Trace> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a line, stamped with the simulated time.
    pub fn log(&self, line: impl FnOnce() -> String) {
        let mut trace = self.lock();
        if trace.lines.is_none() && !trace.live {
            return;
        }
        let line = format!("{:>10.3} ms  {}", ms(trace.origin, Instant::now()), line());
        if trace.live {
            println!("{line}");
        }
        if let Some(lines) = &mut trace.lines {
            lines.push(line);
        }
    }

    /// The lines kept.
    pub fn take(&self) -> Vec<String> {
        self.lock().lines.take().unwrap_or_default()
    }
}

/// Milliseconds from `origin` to `at`.
pub fn ms(origin: Instant, at: Instant) -> f64 {
    at.saturating_duration_since(origin).as_secs_f64() * 1000.0
}

/// A fault of a lock node, at its time.
#[derive(Clone, Debug)]
pub enum NodeFault {
    /// The node restarts without persistence: its locks are gone.
    Restart(usize),
    /// The node answers every command with an error, for `for_ms`.
    Failing {
        /// The node.
        node: usize,
        /// For how long, in ms.
        for_ms: u64,
    },
    /// The node's clock runs at `rate` from now on (keys expire early).
    ClockRate {
        /// The node.
        node: usize,
        /// Its clock's rate (1.0: true time).
        rate: f64,
    },
}

struct NetState {
    rng: StdRng,
    /// Per node: the base one-way latency.
    latency: Vec<Duration>,
    /// Probability that a request, or a reply, is lost.
    loss: f64,
    /// Per replica: paused until then (its requests leave late).
    frozen: Vec<Instant>,
    /// Per replica: crashed (nothing leaves it, nothing reaches it).
    crashed: Vec<bool>,
}

/// The network between the replicas (the nodes' clients) and the lock nodes.
#[derive(Clone)]
pub struct Net {
    state: Arc<Mutex<NetState>>,
    log: Log,
}

impl Net {
    /// A network between `replicas` clients and `nodes` nodes, its latencies and loss
    /// rate drawn from `rng`.
    pub fn new(rng: &mut StdRng, nodes: usize, replicas: usize, log: Log) -> Self {
        let latency = (0..nodes)
            .map(|_| Duration::from_micros(rng.random_range(200..2500)))
            .collect();
        let loss = if rng.random_bool(0.5) {
            rng.random_range(0.0..0.03)
        } else {
            0.0
        };
        let now = Instant::now();
        Self {
            state: Arc::new(Mutex::new(NetState {
                rng: StdRng::seed_from_u64(rng.random()),
                latency,
                loss,
                frozen: vec![now; replicas],
                crashed: vec![false; replicas],
            })),
            log,
        }
    }

    fn state(&self) -> MutexGuard<'_, NetState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replica `replica` pauses for `pause`: no request of it leaves before the pause
    /// ends (its watchdog's extensions included).
    pub fn freeze(&self, replica: usize, pause: Duration) {
        let until = Instant::now() + pause;
        let mut state = self.state();
        state.frozen[replica] = state.frozen[replica].max(until);
        drop(state);
        self.log
            .log(|| format!("r{replica} pauses for {} ms", pause.as_millis()));
    }

    /// From now on, requests and replies are lost with probability `loss` (0: none).
    pub fn set_loss(&self, loss: f64) {
        self.state().loss = loss;
    }

    /// Replica `replica` crashes: from now on its requests and their replies are lost.
    pub fn crash(&self, replica: usize) {
        self.state().crashed[replica] = true;
        self.log.log(|| format!("r{replica} crashes"));
    }

    /// Applies `fault` to `servers` now; one with a duration ends in a task of its own.
    pub fn apply(&self, fault: &NodeFault, servers: &[FakeServer]) {
        self.log.log(|| format!("fault {fault:?}"));
        match *fault {
            NodeFault::Restart(node) => servers[node].restart(),
            NodeFault::Failing { node, for_ms } => {
                servers[node].set_failing(true);
                let (server, log) = (servers[node].clone(), self.log.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(for_ms)).await;
                    server.set_failing(false);
                    log.log(|| format!("n{node} answers again"));
                });
            }
            NodeFault::ClockRate { node, rate } => servers[node].set_clock_rate(rate),
        }
    }
}

impl Network for Net {
    fn fate(&self, node: usize, client: usize, cmds: &[Cmd]) -> Fate {
        let mut state = self.state();
        let now = Instant::now();
        let frozen = state.frozen[client].saturating_duration_since(now);
        let crashed = state.crashed[client];
        let base = state.latency[node];
        let loss = state.loss;
        let rng = &mut state.rng;
        let mut delay =
            || base + Duration::from_micros(rng.random_range(0..=base.as_micros() as u64));
        let (request_delay, reply_delay) = (delay() + frozen, delay());
        let request_lost = crashed || rng.random_bool(loss);
        let reply_lost = crashed || rng.random_bool(loss);
        drop(state);
        self.log.log(|| {
            let words: Vec<String> = cmds
                .iter()
                .map(|cmd| {
                    let words: Vec<String> = cmd
                        .args_iter()
                        .filter_map(|a| match a {
                            redis::Arg::Simple(bytes) => {
                                Some(String::from_utf8_lossy(bytes).into_owned())
                            }
                            _ => None,
                        })
                        .map(|w| short(&w))
                        .collect();
                    words.join(" ")
                })
                .collect();
            let lost = if request_lost {
                "  [request lost]"
            } else if reply_lost {
                "  [reply will be lost]"
            } else {
                ""
            };
            format!("r{client} -> n{node}  {}{lost}", words.join(" | "))
        });
        Fate {
            request_delay,
            request_lost,
            reply_delay,
            reply_lost,
        }
    }

    fn applied(
        &self,
        node: usize,
        client: usize,
        _cmds: &[Cmd],
        replies: &Result<Vec<Value>, RedisError>,
    ) {
        self.log.log(|| match replies {
            Ok(values) => {
                let values: Vec<String> = values.iter().map(canonical).collect();
                format!("n{node} -> r{client}  {}", values.join(", "))
            }
            Err(err) => format!("n{node} -> r{client}  error: {err}"),
        });
    }
}

/// A reply as traced (a batch's answers, lock by lock, in the batch's order).
fn canonical(value: &Value) -> String {
    match value {
        Value::Array(values) => {
            let values: Vec<String> = values.iter().map(canonical).collect();
            format!("[{}]", values.join(", "))
        }
        other => format!("{other:?}"),
    }
}

/// A long word (a script's hash, a lock value) shortened for the trace; keys (hash-tagged,
/// with `{`) are kept whole.
fn short(word: &str) -> String {
    if word.len() > 24 && !word.contains('{') {
        format!("{}…", word.chars().take(12).collect::<String>())
    } else {
        word.to_owned()
    }
}

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

impl NodeFault {
    /// A fault of one of `nodes` drawn from `rng`: a restart, failing for a time drawn
    /// from `failing_ms`, or a clock running up to `fastest` times true time.
    pub fn draw(
        rng: &mut StdRng,
        nodes: usize,
        failing_ms: std::ops::Range<u64>,
        fastest: f64,
    ) -> Self {
        let node = rng.random_range(0..nodes);
        match rng.random_range(0..3) {
            0 => NodeFault::Restart(node),
            1 => NodeFault::Failing {
                node,
                for_ms: rng.random_range(failing_ms),
            },
            _ => NodeFault::ClockRate {
                node,
                rate: rng.random_range(1.0..fastest),
            },
        }
    }
}

/// `count` in-memory lock nodes on `net`, up for an hour, their wall clocks at `wall_us`
/// (µs since the Unix epoch) plus up to 5 ms each, drawn from `rng`.
pub fn nodes(rng: &mut StdRng, count: usize, wall_us: u64, net: &Net) -> Vec<FakeServer> {
    let servers: Vec<FakeServer> = (0..count).map(|_| FakeServer::default()).collect();
    for (i, server) in servers.iter().enumerate() {
        server.set_wall_clock(wall_us + rng.random_range(0..5_000));
        server.set_uptime(Duration::from_secs(3600));
        server.set_network(i, std::sync::Arc::new(net.clone()));
    }
    servers
}

/// Runs `simulation` on a current-thread runtime of its own with tokio's clock paused,
/// core's random choices seeded from `seed`; the thread's random source and wall clock
/// are core's defaults again afterwards.
pub fn run_paused<T>(seed: u64, simulation: impl std::future::Future<Output = T>) -> T {
    redlock_core::sim::seed_rng(Some(seed));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let outcome = runtime.block_on(simulation);
    drop(runtime);
    redlock_core::sim::seed_rng(None);
    redlock_core::sim::set_wall_clock(None);
    outcome
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

/// What one seed of a simulation did.
#[derive(Debug, Default)]
pub struct SeedOutcome {
    /// The promises it broke, one line each.
    pub violations: Vec<String>,
    /// Its trace (empty unless kept).
    pub trace: Vec<String>,
    /// What it counted, by name (summed over the seeds of a run).
    pub counts: std::collections::BTreeMap<&'static str, u64>,
}

/// A change that breaks a promise on purpose, which a simulation's checks must catch.
pub trait Control: Copy + std::fmt::Debug + PartialEq + 'static {
    /// Every control.
    const ALL: &'static [Self];

    /// Its name, as `REDLOCK_SIM_CONTROL` gives it.
    fn name(self) -> &'static str;

    /// The control named `name`.
    fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.name() == name)
    }
}

/// Runs a simulation's seeds the same way for every crate: many seeds, a seed twice,
/// one seed replayed from the environment, the negative controls. Each fails the
/// calling test with the seed and the one-line command that replays it.
pub struct Runner<C: Control> {
    /// What is simulated, for the summary line ("scheduler").
    pub what: &'static str,
    /// The package and test target, for the replay command.
    pub package: &'static str,
    /// Runs seed `seed` with a control (or none), keeping its trace (`trace`) and
    /// printing it as it happens (`live`).
    pub run: fn(seed: u64, control: Option<C>, trace: bool, live: bool) -> SeedOutcome,
}

/// The number in the environment variable `name`, if set.
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

impl<C: Control> Runner<C> {
    /// The one-line command that replays `seed` with its trace.
    pub fn replay_command(&self, seed: u64, control: Option<C>) -> String {
        let control = control.map_or(String::new(), |c| {
            format!("REDLOCK_SIM_CONTROL={} ", c.name())
        });
        format!(
            "{control}REDLOCK_SIM_SEED={seed} REDLOCK_SIM_TRACE=1 cargo test -p {} --test sim replay_seed -- --nocapture",
            self.package
        )
    }

    /// Runs `REDLOCK_SIM_SEEDS` seeds (default `default`) from `REDLOCK_SIM_FIRST`
    /// (default 0), prints their count, rate and counts, and panics on the first that
    /// broke a promise, listing every failing seed.
    pub fn seeds(&self, default: u64) {
        let first = env_u64("REDLOCK_SIM_FIRST").unwrap_or(0);
        let seeds = env_u64("REDLOCK_SIM_SEEDS").unwrap_or(default);
        let started = std::time::Instant::now();
        let mut failed = Vec::new();
        let mut totals: std::collections::BTreeMap<&'static str, u64> = Default::default();
        for seed in first..first.saturating_add(seeds) {
            let outcome = (self.run)(seed, None, false, false);
            for (what, n) in outcome.counts {
                *totals.entry(what).or_default() += n;
            }
            if !outcome.violations.is_empty() {
                failed.push((seed, outcome.violations));
            }
        }
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "{} simulation: {seeds} seeds from {first} in {secs:.1} s ({:.1} seeds/s); {totals:?}",
            self.what,
            seeds as f64 / secs
        );
        if let Some((seed, violations)) = failed.first() {
            let seeds_failed: Vec<u64> = failed.iter().map(|(s, _)| *s).collect();
            panic!(
                "{} of {seeds} seeds broke a promise; seed {seed}: {violations:#?}\nreplay: {}\nfailing seeds: {seeds_failed:?}",
                failed.len(),
                self.replay_command(*seed, None),
            );
        }
    }

    /// Runs the seeds that once broke a promise (each a regression test for what it
    /// found), and panics on the first that breaks one again.
    pub fn regressions(&self, seeds: &[u64]) {
        for &seed in seeds {
            let outcome = (self.run)(seed, None, false, false);
            assert!(
                outcome.violations.is_empty(),
                "seed {seed} broke a promise again: {:#?}\nreplay: {}",
                outcome.violations,
                self.replay_command(seed, None)
            );
        }
    }

    /// Runs `count` seeds from `REDLOCK_SIM_FIRST` twice each, traced, and panics on the
    /// first whose two traces differ, showing the first line that does.
    pub fn replays_bit_for_bit(&self, count: u64) {
        let first = env_u64("REDLOCK_SIM_FIRST").unwrap_or(0);
        for seed in first..first.saturating_add(count) {
            let a = (self.run)(seed, None, true, false);
            let b = (self.run)(seed, None, true, false);
            assert!(a.trace.len() > 10, "seed {seed} traced almost nothing");
            if a.trace != b.trace {
                let at = a.trace.iter().zip(&b.trace).position(|(x, y)| x != y);
                panic!(
                    "seed {seed} ran two histories; first difference at line {at:?}: {:?} against {:?}\nreplay: {}",
                    at.map(|i| &a.trace[i]),
                    at.map(|i| &b.trace[i]),
                    self.replay_command(seed, None)
                );
            }
        }
    }

    /// Replays `REDLOCK_SIM_SEED` (default 0), printing its trace as it happens with
    /// `REDLOCK_SIM_TRACE=1`, with the control `REDLOCK_SIM_CONTROL` names; panics if it
    /// broke a promise.
    pub fn replay_from_env(&self) {
        let seed = env_u64("REDLOCK_SIM_SEED").unwrap_or(0);
        let control = std::env::var("REDLOCK_SIM_CONTROL")
            .ok()
            .map(|name| C::parse(&name).unwrap_or_else(|| panic!("no control named {name}")));
        let live = std::env::var("REDLOCK_SIM_TRACE").is_ok_and(|v| v == "1");
        let outcome = (self.run)(seed, control, true, live);
        assert!(!outcome.trace.is_empty(), "seed {seed} traced nothing");
        assert!(
            outcome.violations.is_empty(),
            "seed {seed} broke a promise: {:#?}\nreplay: {}",
            outcome.violations,
            self.replay_command(seed, control)
        );
    }

    /// Each control must be caught within its bound of seeds (from seed 0), and its
    /// catching seed must replay to the same violations; prints where each was caught.
    pub fn controls_caught(&self, bounds: &[(C, u64)]) {
        for &(control, within) in bounds {
            let caught = (0..within).find_map(|seed| {
                let outcome = (self.run)(seed, Some(control), false, false);
                (!outcome.violations.is_empty()).then_some((seed, outcome.violations))
            });
            let Some((seed, violations)) = caught else {
                panic!(
                    "control {} not caught within {within} seeds",
                    control.name()
                );
            };
            let again = (self.run)(seed, Some(control), false, false);
            assert_eq!(again.violations, violations, "the catching seed replays");
            eprintln!(
                "control {} caught at seed {seed} ({} violations), first: {}\n  replay: {}",
                control.name(),
                violations.len(),
                violations[0],
                self.replay_command(seed, Some(control))
            );
        }
    }
}

//! The simulated world: the nodes (fake servers), the network between them and the
//! clients (latency, lost requests and replies, one-way cuts, frozen clients), the
//! faults a schedule drawn from the seed applies (node restarts, nodes answering
//! errors, node clocks running fast or slow, jumping forward or back, whole-process
//! pauses of a node), and the trace of every message on simulated time.
//!
//! A paused client (`World::freeze`) sends nothing until it resumes: every request of
//! it, its watchdog's extensions included (they go through the same links), leaves at
//! the pause's end. Its timers still run meanwhile, and a reply already on its way when
//! the pause began still reaches it: the pause is of its messages, not of its process.
//! A paused node (`Fault::Pause`) applies nothing meanwhile: requests that reach it wait
//! for its resumption (those sent before the pause began too: pauses are known to the
//! network from the start), and are applied then, in the order they came within tokio's
//! 1 ms timer granularity (each client's requests strictly in order); its replies leave
//! when the commands take effect, so none leaves during the pause.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redis::{Arg, Cmd, RedisError, Value};
use tokio::time::Instant;

use crate::node::fake::{FakeServer, Fate, Network};
use crate::protocol::scripts;

/// One fault of the schedule, applied at its time.
#[derive(Clone, Debug)]
pub(super) enum Fault {
    /// The node restarts without persistence.
    Restart(usize),
    /// Requests from `client` to `node` (`to_node`) or its replies (else) are lost,
    /// for `for_ms`.
    Cut {
        node: usize,
        client: usize,
        to_node: bool,
        for_ms: u64,
    },
    /// The node answers every command with an error, for `for_ms`.
    Failing { node: usize, for_ms: u64 },
    /// The node's clock runs at `rate` from now on.
    ClockRate { node: usize, rate: f64 },
    /// The node's clock jumps forward by `ms`.
    ClockJump { node: usize, ms: u64 },
    /// The node's clock jumps back by `ms`: its time reads earlier, its keys expire
    /// later.
    ClockJumpBack { node: usize, ms: u64 },
    /// The node's whole process stops for `for_ms` (`SIGSTOP`, then `SIGCONT`): it
    /// applies and answers nothing meanwhile; requests that reach it wait and are
    /// applied, in the order they came, when it resumes; its keys still expire on time.
    /// Known to the network from the start (see [`World::set_pauses`]), so that a request
    /// already on its way when the pause begins waits too.
    Pause { node: usize, for_ms: u64 },
}

/// The parts of the world the network reads and writes.
pub(super) struct WorldState {
    rng: StdRng,
    start: Instant,
    /// Every message and fault, on simulated time (only while tracing).
    pub(super) trace: Option<Vec<String>>,
    /// Print each trace line as it happens.
    pub(super) live: bool,
    /// Per node: base latency one way.
    latency: Vec<Duration>,
    /// Probability that a request or a reply is lost.
    loss: f64,
    /// One-way cuts in force: (node, client, to the node).
    cuts: HashSet<(usize, usize, bool)>,
    /// Per client: frozen (a pause) until then.
    frozen: Vec<Instant>,
    /// When the first fault struck or a client first paused, if one did.
    disturbed: Option<Instant>,
    /// Per node: its process pauses, [from, to).
    pauses: Vec<Vec<(Instant, Instant)>>,
    /// Lock keys released, with the value released, per node.
    released: HashSet<(usize, String, String)>,
    /// Invariant violations seen on the wire.
    pub(super) violations: Vec<String>,
}

/// The world's network, shared by every fake server.
#[derive(Clone)]
pub(super) struct World(pub(super) Arc<Mutex<WorldState>>);

impl World {
    pub(super) fn new(rng: &mut StdRng, nodes: usize, clients: usize, trace: bool) -> Self {
        let latency = (0..nodes)
            .map(|_| Duration::from_micros(rng.random_range(200..3000)))
            .collect();
        let loss = if rng.random_bool(0.5) {
            rng.random_range(0.0..0.05)
        } else {
            0.0
        };
        let now = Instant::now();
        Self(Arc::new(Mutex::new(WorldState {
            rng: StdRng::seed_from_u64(rng.random()),
            start: now,
            trace: trace.then(Vec::new),
            live: false,
            latency,
            loss,
            cuts: HashSet::new(),
            frozen: vec![now; clients],
            pauses: vec![Vec::new(); nodes],
            disturbed: None,
            released: HashSet::new(),
            violations: Vec::new(),
        })))
    }

    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, WorldState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a line to the trace (if tracing), stamped with the simulated time.
    pub(super) fn log(&self, line: impl FnOnce() -> String) {
        self.state().log(line);
    }

    /// The nodes' process pauses among `faults` (each at its time after `origin`).
    pub(super) fn set_pauses(&self, origin: Instant, faults: &[(Duration, Fault)]) {
        let mut state = self.state();
        for (at, fault) in faults {
            if let Fault::Pause { node, for_ms } = *fault {
                let from = origin + *at;
                state.pauses[node].push((from, from + Duration::from_millis(for_ms)));
            }
        }
    }

    /// Until when nothing disturbed the run: no fault struck, no client paused, and the
    /// network lost nothing (`None` if it may lose messages).
    pub(super) fn quiet_until(&self) -> Option<Instant> {
        let state = self.state();
        (state.loss == 0.0).then(|| {
            state
                .disturbed
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))
        })
    }

    /// The network loses nothing from now on.
    pub(super) fn set_lossless(&self) {
        self.state().loss = 0.0;
    }

    /// `client` stops (a pause: no request leaves it, no reply reaches it) for `pause`.
    pub(super) fn freeze(&self, client: usize, pause: Duration) {
        let mut state = self.state();
        let until = Instant::now() + pause;
        state.disturbed.get_or_insert(Instant::now());
        if let Some(frozen) = state.frozen.get_mut(client) {
            *frozen = (*frozen).max(until);
        }
        state.log(|| format!("c{client} paused for {} ms", pause.as_millis()));
    }

    /// Applies `fault` to `servers` now; a fault with a duration ends in a task of its
    /// own.
    pub(super) fn apply(&self, fault: &Fault, servers: &[FakeServer]) {
        self.log(|| format!("fault {fault:?}"));
        self.state().disturbed.get_or_insert(Instant::now());
        match *fault {
            Fault::Restart(node) => servers[node].restart(),
            Fault::Cut {
                node,
                client,
                to_node,
                for_ms,
            } => {
                self.state().cuts.insert((node, client, to_node));
                let world = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(for_ms)).await;
                    world.state().cuts.remove(&(node, client, to_node));
                    world.log(|| format!("cut n{node}/c{client} healed"));
                });
            }
            Fault::Failing { node, for_ms } => {
                servers[node].set_failing(true);
                let (server, world) = (servers[node].clone(), self.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(for_ms)).await;
                    server.set_failing(false);
                    world.log(|| format!("n{node} answers again"));
                });
            }
            Fault::ClockRate { node, rate } => servers[node].set_clock_rate(rate),
            Fault::ClockJump { node, ms } => servers[node].jump_clock(Duration::from_millis(ms)),
            Fault::ClockJumpBack { node, ms } => {
                servers[node].jump_clock_back(Duration::from_millis(ms));
            }
            // The network holds the node's requests (`fate`); here only the trace.
            Fault::Pause { node, for_ms } => {
                let world = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(for_ms)).await;
                    world.log(|| format!("n{node} resumes"));
                });
            }
        }
    }
}

impl WorldState {
    fn log(&mut self, line: impl FnOnce() -> String) {
        if self.trace.is_none() && !self.live {
            return;
        }
        let t = Instant::now().duration_since(self.start);
        let line = format!("{:>9.3} ms  {}", t.as_secs_f64() * 1000.0, line());
        if self.live {
            println!("{line}");
        }
        if let Some(trace) = &mut self.trace {
            trace.push(line);
        }
    }
}

impl Network for World {
    fn fate(&self, node: usize, client: usize, cmds: &[Cmd]) -> Fate {
        let mut state = self.state();
        let now = Instant::now();
        let frozen = state
            .frozen
            .get(client)
            .map_or(Duration::ZERO, |until| until.saturating_duration_since(now));
        let base = state.latency[node];
        let loss = state.loss;
        let rng = &mut state.rng;
        let mut delay =
            || base + Duration::from_micros(rng.random_range(0..=base.as_micros() as u64));
        let (mut request_delay, reply_delay) = (delay() + frozen, delay());
        let request_lost = rng.random_bool(loss);
        let reply_lost = rng.random_bool(loss);
        // A request reaching a paused node waits for it to resume; applied then, its
        // reply leaves then too (the reply's delay counts from the command's effect).
        let mut arrival = now + request_delay;
        let mut held = false;
        while let Some(&(_, to)) = state.pauses[node]
            .iter()
            .find(|(from, to)| *from <= arrival && arrival < *to)
        {
            arrival = to;
            held = true;
        }
        request_delay = arrival.duration_since(now);
        let start = state.start;
        let fate = Fate {
            request_delay,
            request_lost: request_lost || state.cuts.contains(&(node, client, true)),
            reply_delay,
            reply_lost: reply_lost || state.cuts.contains(&(node, client, false)),
        };
        state.log(|| {
            let lost = if fate.request_lost {
                "  [request lost]"
            } else if fate.reply_lost {
                "  [reply will be lost]"
            } else {
                ""
            };
            let at = |t: Instant| t.duration_since(start).as_secs_f64() * 1000.0;
            let waits = match (frozen > Duration::ZERO, held) {
                (_, true) => format!("  [n{node} paused: applied at {:.3} ms]", at(arrival)),
                (true, false) => {
                    format!("  [c{client} paused: leaves at {:.3} ms]", at(now + frozen))
                }
                _ => String::new(),
            };
            format!("c{client} -> n{node}  {}{lost}{waits}", describe(cmds))
        });
        fate
    }

    fn applied(
        &self,
        node: usize,
        client: usize,
        cmds: &[Cmd],
        replies: &Result<Vec<Value>, RedisError>,
    ) {
        let mut state = self.state();
        // No extension of a lock's key on a node after its release there (by key and
        // value: a downgrade moves a write lock's value to a reader's key, and then
        // releases the writer's key where it was not moved).
        for cmd in cmds.iter().filter(|_| replies.is_ok()) {
            let args = args(cmd);
            let Some(name) = script(&args) else { continue };
            let n = args
                .get(2)
                .and_then(|a| a.parse::<usize>().ok())
                .unwrap_or(0);
            let keys = args.get(3..3 + n).unwrap_or_default();
            let argv = args.get(3 + n..).unwrap_or_default();
            if name == "release" || name == "release_write" {
                if let Some(value) = argv.first() {
                    for key in keys {
                        state.released.insert((node, key.clone(), value.clone()));
                    }
                }
            } else if name == "extend" {
                // Per lock: its number of keys, its value, its TTL; its keys next.
                let mut keys = keys.iter();
                for lock in argv.chunks(3) {
                    let count = lock.first().and_then(|c| c.parse().ok()).unwrap_or(0);
                    let Some(value) = lock.get(1) else { continue };
                    for key in keys.by_ref().take(count) {
                        if state.released.contains(&(node, key.clone(), value.clone())) {
                            let line = format!(
                                "n{node} extended {key} = {value} of c{client} after its release there"
                            );
                            state.log(|| format!("VIOLATION: {line}"));
                            state.violations.push(line);
                        }
                    }
                }
            }
        }
        state.log(|| {
            let answer = match replies {
                Ok(values) => values
                    .iter()
                    .map(short_value)
                    .collect::<Vec<_>>()
                    .join(", "),
                Err(err) => format!("error: {err}"),
            };
            format!("n{node} -> c{client}  {answer}")
        });
    }
}

/// A command's arguments as text.
fn args(cmd: &Cmd) -> Vec<String> {
    cmd.args_iter()
        .filter_map(|a| match a {
            Arg::Simple(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        })
        .collect()
}

/// The name of the script an `EVALSHA` runs.
fn script(args: &[String]) -> Option<&'static str> {
    if !args.first()?.eq_ignore_ascii_case("EVALSHA") {
        return None;
    }
    let sha = args.get(1)?;
    let named = [
        (&scripts::RELEASE, "release"),
        (&scripts::EXTEND, "extend"),
        (&scripts::ACQUIRE_MANY, "acquire"),
        (&scripts::ACQUIRE_FENCED, "acquire_fenced"),
        (&scripts::RAISE_FENCE, "raise_fence"),
        (&scripts::ACQUIRE_QUEUED, "acquire_queued"),
        (&scripts::JOIN_QUEUE, "join_queue"),
        (&scripts::REMAINING, "remaining"),
        (&scripts::SERVER_TIME, "server_time"),
        (&scripts::MARK, "mark"),
        (&scripts::ACQUIRE_READ, "acquire_read"),
        (&scripts::ACQUIRE_WRITE, "acquire_write"),
        (&scripts::RELEASE_WRITE, "release_write"),
        (&scripts::DOWNGRADE, "downgrade"),
        (&scripts::LEAVE_WRITERS, "leave_writers"),
    ];
    named
        .iter()
        .find(|(s, _)| s.get_hash() == sha)
        .map(|(_, name)| *name)
        .or(Some("script?"))
}

/// One line for the commands of a request: the script's name, keys and arguments, long
/// random values shortened.
fn describe(cmds: &[Cmd]) -> String {
    cmds.iter()
        .map(|cmd| {
            let args = args(cmd);
            let words: Vec<String> = match script(&args) {
                Some(name) => std::iter::once(name.to_owned())
                    .chain(args.iter().skip(3).map(|a| short(a)))
                    .collect(),
                None => args.iter().map(|a| short(a)).collect(),
            };
            words.join(" ")
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

fn short(text: &str) -> String {
    match text.split_once('/') {
        Some((holder, random)) if random.len() > 8 => format!("{holder}/{}", &random[..6]),
        _ => text.to_owned(),
    }
}

fn short_value(value: &Value) -> String {
    match value {
        Value::Int(n) => n.to_string(),
        Value::Okay => "OK".to_owned(),
        Value::Nil => "nil".to_owned(),
        Value::BulkString(bytes) => short(&String::from_utf8_lossy(bytes)),
        Value::Array(values) => {
            format!(
                "[{}]",
                values
                    .iter()
                    .map(short_value)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
        Value::ServerError(err) => format!("error: {err:?}"),
        other => format!("{other:?}"),
    }
}

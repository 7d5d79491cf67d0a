//! A deterministic simulation of the idempotency engine: per seed, two to four replicas
//! (each an [`Idempotency`] with its own Redlock client) serve requests that carry the
//! same `Idempotency-Key`s, through the framework-free flow the web crates drive
//! (`admit` → `Reading` → `finish` → `Decision` → `Run::respond` → `Collect`), against
//! three or five of redlock-core's in-memory lock nodes (feature `sim`) and one shared
//! in-memory store, on tokio's paused clock, with faults drawn from the seed. An observer
//! outside the engine checks the crate's promises (see `sim/observer.rs` for each check
//! and the guarantee it stands for).
//!
//! Faults: lock nodes that restart without persistence, fail for a while, or run fast
//! clocks; lost requests and replies; a store that is slow, fails for a while, or takes
//! a write past the engine's store timeout (the write still lands); a replica that
//! pauses past the lock's TTL mid-handler (its lock traffic and handler frozen); a
//! replica that crashes mid-handler. Clients send the same key at once to different
//! replicas, retry after `409`/`503` (after `Retry-After`), after a `5xx` and after a
//! lost answer, and sometimes reuse a key for another body (`422` expected).
//!
//! Not modelled: a store that loses records (records are as durable as the store),
//! record expiry (`expire_after` outlasts every seed), a pause of a replica's other
//! requests (only the paused handler and the replica's lock traffic stop), bodies over
//! `max_body`, scopes.
//!
//! Seeds: `REDLOCK_SIM_SEEDS` (default 1,500) from `REDLOCK_SIM_FIRST` (default 0);
//! `REDLOCK_SIM_SEED=N REDLOCK_SIM_TRACE=1` replays one seed and prints its trace
//! (`REDLOCK_SIM_CONTROL=<name>` with a negative control on).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

#[path = "sim/observer.rs"]
mod observer;
#[path = "sim/store.rs"]
mod store;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redlock_core::Redlock;
use redlock_idempotency::middleware::{Admit, Decision, RequestHead};
use redlock_idempotency::{Fingerprint, Idempotency, IdempotencyKey, StoredResponse, record_id};
use tokio::sync::Notify;
use tokio::time::Instant;

use self::observer::Observer;
use self::store::{Broken, SimStore};
use redlock_testkit::sim::{self, Log, Net, NodeFault, Runner, SeedOutcome};

/// The keys' lock TTL.
const TTL: Duration = Duration::from_millis(300);
/// The clients' drift factor: the nodes' clocks run up to 4% fast.
const DRIFT_FACTOR: f64 = 0.05;
const FASTEST_CLOCK: f64 = 1.04;
/// How long one store operation may take.
const STORE_TIMEOUT: Duration = Duration::from_millis(150);

/// A change that breaks a promise on purpose: the observer must catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Control {
    /// The store's writes ignore the fencing token; a replica pauses past the TTL in
    /// every seed.
    UnfencedStore,
    /// Drift factor 0 with every node's clock 15% fast, and a pause in every seed.
    NoDriftAllowance,
    /// The store's `start` overwrites a completed record (the record of a run whose
    /// response is stored is taken by the next request, which runs).
    StartOverwrites,
    /// The store's `finish` says it wrote, and writes nothing (the record stays in
    /// flight: the next request, once the lock is free, runs again).
    FinishDropped,
}

impl sim::Control for Control {
    const ALL: &'static [Self] = &[
        Control::UnfencedStore,
        Control::NoDriftAllowance,
        Control::StartOverwrites,
        Control::FinishDropped,
    ];

    fn name(self) -> &'static str {
        match self {
            Control::UnfencedStore => "unfenced-store",
            Control::NoDriftAllowance => "no-drift-allowance",
            Control::StartOverwrites => "start-overwrites-completed",
            Control::FinishDropped => "finish-dropped",
        }
    }
}

/// One replica: its engine, and its crash.
struct Replica {
    idempotency: Idempotency,
    /// Crashed, and the requests it serves told so. (Not a `watch` channel: tokio's
    /// spreads its waiters by a random draw, which would change the history.)
    crashed: Cell<bool>,
    crash: Notify,
    /// Handler runs so far, and the run that pauses past the TTL or crashes, if any.
    runs: Cell<usize>,
    pause_at: Option<usize>,
    crash_at: Option<usize>,
}

/// What every client and handler shares.
struct Ctx {
    replicas: Vec<Replica>,
    net: Net,
    observer: Arc<Mutex<Observer>>,
    log: Log,
    /// Per key: its header value and record id.
    keys: Vec<(String, String)>,
}

impl Ctx {
    fn observer(&self) -> MutexGuard<'_, Observer> {
        self.observer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn crash(&self, replica: usize) {
        self.net.crash(replica);
        self.observer().crashed(replica);
        self.replicas[replica].crashed.set(true);
        self.replicas[replica].crash.notify_waiters();
    }

    /// Returns once replica `replica` crashed.
    async fn crashed(&self, replica: usize) {
        let replica = &self.replicas[replica];
        loop {
            let crash = replica.crash.notified();
            if replica.crashed.get() {
                return;
            }
            crash.await;
        }
    }
}

/// What a request got.
#[derive(Debug)]
enum Answer {
    /// The handler ran and answered this status.
    Ran(u16),
    Replayed(StoredResponse),
    Refused {
        status: u16,
        retry_after: Option<Duration>,
    },
    /// The replica crashed before answering: no answer.
    Silence,
}

/// How a handler behaves, drawn by its client.
struct Handler {
    steps: Vec<Duration>,
    status: u16,
}

fn handler(rng: &mut StdRng) -> Handler {
    let total = if rng.random_bool(0.12) {
        // Longer than the TTL: the lock is extended while it runs.
        rng.random_range(350..800)
    } else {
        rng.random_range(2..80)
    };
    let mut steps = Vec::new();
    let mut left: u64 = total;
    while left > 0 {
        let step = left.min(rng.random_range(10..40));
        steps.push(Duration::from_millis(step));
        left -= step;
    }
    let status = match rng.random_range(0..100) {
        0..12 => 500,
        12..15 => 503,
        15..25 => 200,
        _ => 201,
    };
    Handler { steps, status }
}

const ROUTE: &str = "/orders";

fn fingerprint(idempotency: &Idempotency, body: &[u8]) -> Fingerprint {
    idempotency.fingerprint("POST", ROUTE, |_: &str| Vec::<&[u8]>::new(), body)
}

/// One request of key `key` with `body` on replica `r`, through the middleware's flow.
async fn serve(ctx: &Ctx, r: usize, key: usize, body: &[u8], plan: Handler) -> Answer {
    let replica = &ctx.replicas[r];
    let (header, id) = &ctx.keys[key];
    let headers = |name: &str| -> Vec<&[u8]> {
        if name == "idempotency-key" {
            vec![header.as_bytes()]
        } else {
            Vec::new()
        }
    };
    let head = RequestHead::new("POST", ROUTE, headers);
    let Admit::Read(mut reading) = replica
        .idempotency
        .admit(&head, None::<fn() -> Option<String>>)
    else {
        unreachable!("a request with a key is read");
    };
    if let Err(refusal) = reading.push(body) {
        return Answer::Refused {
            status: refusal.problem.status,
            retry_after: refusal.problem.retry_after,
        };
    }
    let (read, decision) = reading.finish();
    assert_eq!(&read[..], body, "the body is handed to the handler whole");
    let run = match decision.await {
        Decision::Refuse(refusal) => {
            return Answer::Refused {
                status: refusal.problem.status,
                retry_after: refusal.problem.retry_after,
            };
        }
        Decision::Replay(response) => return Answer::Replayed(response),
        Decision::Run(run) => run,
        _ => unreachable!("a decision is a refusal, a replay or a run"),
    };
    assert_eq!(run.id(), id);
    let token = run.token();
    let handle = run.handle().expect("a run holds its lock");
    let fp = fingerprint(&replica.idempotency, body);
    let n = ctx.observer().run_started(id, r, token, fp, handle);
    let nth = replica.runs.get();
    replica.runs.set(nth + 1);
    for step in plan.steps {
        tokio::time::sleep(step).await;
        ctx.observer().sample(n);
    }
    if replica.pause_at == Some(nth) {
        // The replica stops (a pause of the process): its handler, and its watchdog's
        // extensions, which leave only once it resumes.
        let pause = Duration::from_millis(400 + (n as u64 * 37) % 500);
        ctx.observer().count("pauses past the TTL");
        ctx.net.freeze(r, pause);
        tokio::time::sleep(pause).await;
        ctx.observer().sample(n);
    }
    if replica.crash_at == Some(nth) {
        tokio::time::sleep(Duration::from_millis(3)).await;
        ctx.crash(r);
        std::future::pending::<()>().await;
    }
    let status = plan.status;
    let answer = Bytes::from(format!(
        "{id} run {n} on r{r} token {token} status {status}"
    ));
    let run_header = n.to_string();
    let headers: [(&str, &[u8]); 2] = [
        ("content-type", b"text/plain"),
        ("x-run", run_header.as_bytes()),
    ];
    ctx.observer().answered(
        n,
        StoredResponse {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Bytes::copy_from_slice(v)))
                .collect(),
            body: answer.clone(),
        },
    );
    let mut collect = run.respond(status, headers, Some(answer.len() as u64));
    if collect.wants() {
        collect.push(&answer);
    }
    let (sent, write) = collect.finish();
    let finished = write.await;
    if collect_wanted(status) {
        assert_eq!(sent, answer, "the body read is the body sent");
    }
    ctx.observer().finished(n, finished);
    Answer::Ran(status)
}

/// Whether the default `store_if` keeps a status (its body is then read whole).
fn collect_wanted(status: u16) -> bool {
    redlock_idempotency::default_store_if(status)
}

/// One client: a key, a body, requests until it has its answer (and sometimes once
/// more, as a client whose answer was lost).
async fn client(ctx: Rc<Ctx>, n: usize, key: usize, body: Bytes, mut rng: StdRng) {
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
    let id = ctx.keys[key].1.clone();
    let fp = fingerprint(&ctx.replicas[0].idempotency, &body);
    let mut again = rng.random_bool(0.5);
    for _ in 0..10 {
        let up: Vec<usize> = (0..ctx.replicas.len())
            .filter(|r| !ctx.replicas[*r].crashed.get())
            .collect();
        let r = up[rng.random_range(0..up.len())];
        let plan = handler(&mut rng);
        ctx.log.log(|| format!("c{n} sends {id} to r{r}"));
        let answer = tokio::select! {
            biased;
            () = ctx.crashed(r) => Answer::Silence,
            answer = serve(&ctx, r, key, &body, plan) => answer,
        };
        ctx.log.log(|| format!("c{n} got {answer:?}"));
        let wait = match answer {
            Answer::Ran(status) if status < 500 => None,
            Answer::Ran(_) => Some(Duration::from_millis(rng.random_range(10..100))),
            Answer::Replayed(response) => {
                ctx.observer().replayed(&id, fp, &response);
                None
            }
            Answer::Refused {
                status,
                retry_after,
            } => {
                ctx.observer().refused(&id, fp, status);
                if status == 422 {
                    return;
                }
                let after = retry_after.unwrap_or(Duration::from_millis(50));
                Some(
                    after.min(Duration::from_millis(600))
                        + Duration::from_millis(rng.random_range(0..20)),
                )
            }
            Answer::Silence => Some(Duration::from_millis(rng.random_range(50..150))),
        };
        match wait {
            Some(wait) => tokio::time::sleep(wait).await,
            None if again => {
                again = false;
                tokio::time::sleep(Duration::from_millis(rng.random_range(10..600))).await;
            }
            None => return,
        }
    }
}

/// Runs seed `seed` on a runtime of its own.
fn run_seed(seed: u64, control: Option<Control>, trace: bool, live: bool) -> SeedOutcome {
    sim::run_paused(
        seed ^ 0x1de0_1de0_1de0_1de0,
        simulate(seed, control, trace, live),
    )
}

async fn simulate(seed: u64, control: Option<Control>, trace: bool, live: bool) -> SeedOutcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let nodes = if rng.random_bool(0.7) { 3 } else { 5 };
    let replicas = rng.random_range(2..=4);
    let keys = rng.random_range(1..=3);
    let log = Log::new(trace, live);
    let net = Net::new(&mut rng, nodes, replicas, log.clone());
    let wall_us: u64 = 1_800_000_000_000_000 + rng.random_range(0..1_000_000_000_000);
    redlock_core::sim::set_wall_clock(Some(wall_us / 1000 + rng.random_range(0..2000)));
    let servers = sim::nodes(&mut rng, nodes, wall_us, &net);
    let crash = control.is_none() && rng.random_bool(0.2);
    // The controls that need a stale run pause one in every seed.
    let pause = matches!(
        control,
        Some(Control::UnfencedStore | Control::NoDriftAllowance)
    ) || rng.random_bool(0.2);
    let observer = Arc::new(Mutex::new(Observer::new(log.clone(), !crash && !pause)));
    let store = SimStore::new(
        &mut rng,
        Arc::clone(&observer),
        log.clone(),
        match control {
            Some(Control::UnfencedStore) => Broken::Unfenced,
            Some(Control::StartOverwrites) => Broken::StartOverwrites,
            Some(Control::FinishDropped) => Broken::FinishDropped,
            _ => Broken::Not,
        },
    );
    let mut faults: Vec<(Duration, NodeFault)> = (0..rng.random_range(0..=2))
        .map(|_| {
            let at = Duration::from_millis(rng.random_range(0..1500));
            (at, NodeFault::draw(&mut rng, nodes, 50..300, FASTEST_CLOCK))
        })
        .collect();
    if control == Some(Control::NoDriftAllowance) {
        faults.extend(
            (0..nodes).map(|node| (Duration::ZERO, NodeFault::ClockRate { node, rate: 1.15 })),
        );
    }
    faults.sort_by_key(|(at, _)| *at);
    let wait = rng
        .random_bool(0.3)
        .then(|| Duration::from_millis(rng.random_range(100..400)));
    let pause_at = pause.then(|| (rng.random_range(0..replicas), rng.random_range(0..2)));
    let crash_at = crash.then(|| (rng.random_range(0..replicas), rng.random_range(0..2)));
    log.log(|| {
        format!("seed {seed}: {nodes} nodes, {replicas} replicas, {keys} keys, wait {wait:?}, pause {pause_at:?}, crash {crash_at:?}, faults {faults:?}, control {control:?}")
    });
    let replicas: Vec<Replica> = (0..replicas)
        .map(|i| {
            let redlock = servers
                .iter()
                .fold(Redlock::builder(), |b, s| b.fake(s.for_client(i)))
                .holder(format!("r{i}"))
                .wake_on_release(false)
                .drift_factor(if control == Some(Control::NoDriftAllowance) {
                    0.0
                } else {
                    DRIFT_FACTOR
                })
                .node_timeout(Duration::from_millis(20))
                .build()
                .expect("a valid configuration");
            let mut idempotency = Idempotency::new(redlock, store.clone())
                .ttl(TTL)
                .store_timeout(STORE_TIMEOUT);
            if let Some(wait) = wait {
                idempotency = idempotency.wait(wait);
            }
            Replica {
                idempotency,
                crashed: Cell::new(false),
                crash: Notify::new(),
                runs: Cell::new(0),
                pause_at: pause_at.filter(|(r, _)| *r == i).map(|(_, n)| n),
                crash_at: crash_at.filter(|(r, _)| *r == i).map(|(_, n)| n),
            }
        })
        .collect();
    let keys: Vec<(String, String)> = (0..keys)
        .map(|k| {
            let header = format!("order-{k}");
            let key =
                IdempotencyKey::from_header("idempotency-key", [header.as_bytes()], true, 255)
                    .expect("a usable key")
                    .expect("a key");
            (header, record_id(None, &key))
        })
        .collect();
    let ctx = Rc::new(Ctx {
        replicas,
        net: net.clone(),
        observer: Arc::clone(&observer),
        log: log.clone(),
        keys,
    });
    let origin = Instant::now();
    {
        let (net, servers) = (net.clone(), servers.clone());
        tokio::spawn(async move {
            for (at, fault) in faults {
                tokio::time::sleep_until(origin + at).await;
                net.apply(&fault, &servers);
            }
        });
    }
    let local = tokio::task::LocalSet::new();
    let mut n = 0;
    for key in 0..ctx.keys.len() {
        for _ in 0..rng.random_range(2..=4) {
            let body = if rng.random_bool(0.15) {
                format!("{{\"order\":{key},\"amount\":2}}")
            } else {
                format!("{{\"order\":{key},\"amount\":1}}")
            };
            let client_rng = StdRng::seed_from_u64(rng.random());
            local.spawn_local(client(
                Rc::clone(&ctx),
                n,
                key,
                Bytes::from(body),
                client_rng,
            ));
            n += 1;
        }
    }
    local.await;
    drop(ctx);
    let mut observer = observer.lock().unwrap_or_else(PoisonError::into_inner);
    observer.check();
    SeedOutcome {
        violations: std::mem::take(&mut observer.violations),
        trace: log.take(),
        counts: std::mem::take(&mut observer.counts),
    }
}

/// How this crate's seeds are run.
const RUNNER: Runner<Control> = Runner {
    what: "idempotency",
    package: "redlock-idempotency",
    run: run_seed,
};

/// Many seeds (`REDLOCK_SIM_SEEDS`, from `REDLOCK_SIM_FIRST`), every check on each.
#[test]
fn seeds_keep_the_promises() {
    RUNNER.seeds(1500);
}

/// One seed gives one history, bit for bit: seeds run twice, traced.
#[test]
fn a_seed_replays_bit_for_bit() {
    RUNNER.replays_bit_for_bit(200);
}

/// `REDLOCK_SIM_SEED=N` (with `REDLOCK_SIM_TRACE=1` to print the trace as it happens,
/// `REDLOCK_SIM_CONTROL=<name>` with a control on): one seed, replayed. Without it, seed
/// 0.
#[test]
fn replay_seed() {
    RUNNER.replay_from_env();
}

/// The observer sees a broken promise: each control is caught within its bound of
/// seeds, and its catching seed replays to the same violations.
#[test]
fn controls_are_caught() {
    RUNNER.controls_caught(&[
        (Control::UnfencedStore, 50),
        (Control::NoDriftAllowance, 200),
        (Control::StartOverwrites, 10),
        (Control::FinishDropped, 10),
    ]);
}

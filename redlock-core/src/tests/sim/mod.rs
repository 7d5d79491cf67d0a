//! A deterministic simulator: the library's own code (acquisition of one resource or
//! several with `lock_many`, extension, the watchdog, release, the wait queue and its
//! hand-overs, fencing, the restart quarantine, semaphores, read-write locks) against simulated nodes
//! (`node::fake`) on tokio's paused clock, one current-thread runtime per seed, with
//! faults drawn from the seed (see `world.rs`) and invariants checked by an observer
//! outside the library (see `observer.rs`). One seed gives one history, bit for bit; a
//! failing seed prints the command that replays it with a trace, and its faults shrunk
//! by delta debugging to a 1-minimal list that still breaks an invariant, with the
//! command that replays only those (`REDLOCK_SIM_FAULTS`). See docs/DEVELOPMENT.md
//! ("Simulation").
//!
//! Each seed draws its world: 3 or 5 nodes, 2 or 3 clients, one lock `r` (with or
//! without fencing), or a semaphore of 2 permits, or (a quarter of the lock seeds) 1 to
//! 3 of three resources per acquisition; a third of the other lock seeds check the wait
//! queue's order (wake on release on), half of those without faults or lost messages;
//! a quarter of the rest take a read-write lock, reading or writing (writers sometimes
//! downgrading).
//! What was added after the first version (node pauses, clock jumps back, several
//! resources, the queue's order) is drawn from a stream of its own, so that a seed
//! drawing none of it keeps its earlier history.

mod observer;
mod world;

use std::cell::RefCell;
use std::io::Write as _;
use std::rc::Rc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::time::Instant;

use self::observer::{Call, Holding, Observer, Release};
use self::world::{Fault, World};
use crate::node::fake::FakeServer;
use crate::{Redlock, RetryPolicy};

/// A lock's TTL in the simulation.
const TTL: Duration = Duration::from_millis(300);
/// The drift factor of the simulated clients: the nodes' clocks run up to 4% fast.
const DRIFT_FACTOR: f64 = 0.05;
const FASTEST_CLOCK: f64 = 1.04;

/// A change that breaks a guarantee on purpose: the observer must catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Control {
    /// Restart quarantine off, nodes restarting without persistence.
    QuarantineOff,
    /// Drift factor 0, nodes' clocks running fast.
    NoDriftAllowance,
    /// Fencing tokens without the clock floor (counters lost in restarts).
    NoFenceFloor,
    /// Releases that delete whatever value the key holds.
    UncheckedRelease,
    /// A semaphore counted on each node alone and granted on a majority of nodes
    /// (clients of the simulator's own, not the library's slot-per-permit semaphore),
    /// three clients, with restarts.
    MajorityCounter,
    /// A read-write lock's clients with the restart quarantine off, nodes restarting
    /// without persistence: a restarted node forgets readers and writers alike.
    RwQuarantineOff,
    /// Every client but the first polls with `try_lock` (which does not queue, and
    /// takes a lock a release is handing over to a queued waiter) instead of waiting in
    /// the queue, in quiet seeds that check the queue's order: the queue is overtaken.
    TryLockPolling,
    /// Node clocks jumping forward by 50 to 250 ms, far beyond the drift allowance
    /// (15 ms at a TTL of 300 ms): a node forgets the holder's key early.
    ClockJumpBeyondAllowance,
}

impl Control {
    const ALL: [Control; 8] = [
        Control::QuarantineOff,
        Control::NoDriftAllowance,
        Control::NoFenceFloor,
        Control::UncheckedRelease,
        Control::MajorityCounter,
        Control::ClockJumpBeyondAllowance,
        Control::TryLockPolling,
        Control::RwQuarantineOff,
    ];

    fn name(self) -> &'static str {
        match self {
            Control::QuarantineOff => "quarantine-off",
            Control::NoDriftAllowance => "no-drift-allowance",
            Control::NoFenceFloor => "no-fence-floor",
            Control::UncheckedRelease => "unchecked-release",
            Control::MajorityCounter => "majority-counter",
            Control::ClockJumpBeyondAllowance => "clock-jump-beyond-allowance",
            Control::TryLockPolling => "try-lock-polling",
            Control::RwQuarantineOff => "rw-quarantine-off",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// What one seed did.
pub(super) struct Outcome {
    pub(super) violations: Vec<String>,
    pub(super) trace: Vec<String>,
    /// How many faults the seed's whole schedule has (the indices
    /// `REDLOCK_SIM_FAULTS` picks from).
    pub(super) schedule: usize,
    /// Releases after which the queue's order was checked.
    pub(super) hand_overs_checked: u64,
}

/// Runs seed `seed` (with `control`, if any) on a runtime of its own; its clients take
/// a round more with a control or `REDLOCK_SIM_MORE=1`.
pub(super) fn run_seed(seed: u64, control: Option<Control>, trace: bool, live: bool) -> Outcome {
    run_seed_with(seed, control, None, trace, live)
}

/// [`run_seed`] with only the faults of its schedule at the indices `faults` (all of
/// them if `None`); everything else (latency, losses, the clients' choices) drawn as
/// for the whole schedule.
pub(super) fn run_seed_with(
    seed: u64,
    control: Option<Control>,
    faults: Option<&[usize]>,
    trace: bool,
    live: bool,
) -> Outcome {
    let more = control.is_some() || std::env::var("REDLOCK_SIM_MORE").is_ok_and(|v| v == "1");
    run_world(seed, control, faults, more, trace, live)
}

fn run_world(
    seed: u64,
    control: Option<Control>,
    faults: Option<&[usize]>,
    more: bool,
    trace: bool,
    live: bool,
) -> Outcome {
    crate::value::seed_rng(Some(seed ^ 0x5eed_5eed_5eed_5eed));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let outcome = runtime.block_on(simulate(seed, control, faults, more, trace, live));
    crate::value::seed_rng(None);
    crate::clock::set_wall_clock(None);
    outcome
}

async fn simulate(
    seed: u64,
    control: Option<Control>,
    keep: Option<&[usize]>,
    more: bool,
    trace: bool,
    live: bool,
) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let nodes = if rng.random_bool(0.7) { 3 } else { 5 };
    let mut clients = rng.random_range(2..=3);
    if control == Some(Control::MajorityCounter) {
        // Two clients cannot exceed its 2 permits.
        clients = 3;
    }
    let semaphore = (rng.random_bool(0.25) || control == Some(Control::MajorityCounter))
        && !matches!(
            control,
            Some(Control::TryLockPolling | Control::RwQuarantineOff)
        );
    let fencing = !semaphore && (rng.random_bool(0.5) || control == Some(Control::NoFenceFloor));
    let world = World::new(&mut rng, nodes, clients, trace);
    world.state().live = live;
    let servers: Vec<FakeServer> = (0..nodes).map(|_| FakeServer::default()).collect();
    // The nodes' wall clocks: about the same simulated time, a few ms apart.
    let wall_us: u64 = 1_800_000_000_000_000 + rng.random_range(0..1_000_000_000_000);
    // The clients' wall clock (read only when no node tells its time), a second off.
    crate::clock::set_wall_clock(Some(wall_us / 1000 + rng.random_range(0..2000)));
    for (i, server) in servers.iter().enumerate() {
        server.set_wall_clock(wall_us + rng.random_range(0..5_000));
        server.set_uptime(Duration::from_secs(3600));
        server.set_network(i, std::sync::Arc::new(world.clone()));
        server.set_no_fence_floor(control == Some(Control::NoFenceFloor));
        server.set_unchecked_release(control == Some(Control::UncheckedRelease));
        server.set_counted_permits(control == Some(Control::MajorityCounter));
    }
    // Drawn whole even when only some of it is kept, so that every later draw is the
    // same as with the whole schedule.
    let mut extra = StdRng::seed_from_u64(seed ^ EXTRA_STREAM);
    let faults = schedule(&mut rng, &mut extra, nodes, clients, control);
    let schedule_len = faults.len();
    // Some lock seeds' clients take several resources at once (`lock_many`) or one of
    // them, from a small set, instead of the one resource `r`.
    let multi = !semaphore && control.is_none() && extra.random_bool(0.25);
    // Some seeds of one lock check the wait queue's order (see
    // `Observer::check_queue_order`), with wake on release on (which here only makes a
    // client that waited for the resource lately join the queue with its first attempt:
    // the simulated nodes publish nothing, so no waiter listens).
    let polling = control == Some(Control::TryLockPolling);
    let fair = polling || (!semaphore && control.is_none() && !multi && extra.random_bool(0.3));
    // Half of them quiet: no fault, no message lost (the schedule drawn all the same), so
    // that the order is checked over the whole run up to the first client pause.
    let quiet = polling || (fair && extra.random_bool(0.5));
    // A quarter of the remaining lock seeds take a read-write lock instead, each
    // acquisition reading or writing.
    let rw = control == Some(Control::RwQuarantineOff)
        || (!semaphore && control.is_none() && !multi && !fair && extra.random_bool(0.25));
    if quiet {
        world.set_lossless();
    }
    let faults: Vec<(Duration, Fault)> = match keep {
        Some(keep) => faults
            .into_iter()
            .enumerate()
            .filter(|(i, _)| keep.contains(i))
            .map(|(_, fault)| fault)
            .collect(),
        None => faults,
    };
    let faults = if quiet { Vec::new() } else { faults };
    world.log(|| {
        format!("seed {seed}: {nodes} nodes, {clients} clients, semaphore {semaphore}, fencing {fencing}, control {control:?}, faults kept {keep:?} of {schedule_len}")
    });
    let origin = Instant::now();
    world.set_pauses(origin, &faults);
    let observer = Rc::new(RefCell::new(Observer::new(origin)));
    {
        let (world, servers) = (world.clone(), servers.clone());
        tokio::spawn(async move {
            for (at, fault) in faults {
                tokio::time::sleep_until(origin + at).await;
                world.apply(&fault, &servers);
            }
        });
    }
    let local = tokio::task::LocalSet::new();
    for c in 0..clients {
        let redlock = servers
            .iter()
            .fold(Redlock::builder(), |b, s| b.fake(s.for_client(c)))
            .holder(format!("c{c}"))
            .restart_quarantine(!matches!(
                control,
                Some(Control::QuarantineOff | Control::RwQuarantineOff)
            ))
            .wake_on_release(fair)
            .fencing(fencing)
            .ttl(TTL)
            .drift_factor(if control == Some(Control::NoDriftAllowance) {
                0.0
            } else {
                DRIFT_FACTOR
            })
            .node_timeout(Duration::from_millis(20))
            .retry(
                RetryPolicy::deadline(Duration::from_millis(500))
                    .with_delay(Duration::from_millis(5), Duration::from_millis(10)),
            )
            .build()
            .expect("valid configuration");
        let client = Client {
            id: c,
            rng: StdRng::seed_from_u64(rng.random()),
            world: world.clone(),
            observer: Rc::clone(&observer),
            redlock,
            counted: (control == Some(Control::MajorityCounter))
                .then(|| servers.iter().map(|s| s.for_client(c)).collect()),
            multi: multi.then(|| StdRng::seed_from_u64(extra.random())),
            fair,
            polling: polling && c > 0,
            rw: rw.then(|| StdRng::seed_from_u64(extra.random())),
        };
        local.spawn_local(client.run(semaphore, more));
    }
    local.await;
    let mut observer = Rc::try_unwrap(observer)
        .map(RefCell::into_inner)
        .unwrap_or_default();
    observer.check();
    if fair && let Some(quiet_until) = world.quiet_until() {
        observer.check_queue_order(quiet_until);
    }
    let mut state = world.state();
    let mut violations = std::mem::take(&mut state.violations);
    violations.extend(observer.violations);
    Outcome {
        hand_overs_checked: observer.hand_overs_checked,
        violations,
        trace: state.trace.take().unwrap_or_default(),
        schedule: schedule_len,
    }
}

/// The seed of the generator of what was added to the simulation later (node pauses,
/// clock jumps back, ...): a stream of its own, so that a seed drawing none of it keeps
/// the history it had before.
const EXTRA_STREAM: u64 = 0xe7a0_e7a0_e7a0_e7a0;

/// The fault schedule: when each fault strikes, drawn from the seed (`rng`, and `extra`
/// for the faults added later).
fn schedule(
    rng: &mut StdRng,
    extra: &mut StdRng,
    nodes: usize,
    clients: usize,
    control: Option<Control>,
) -> Vec<(Duration, Fault)> {
    let mut faults = Vec::new();
    let count = rng.random_range(0..=6);
    for _ in 0..count {
        let at = Duration::from_millis(rng.random_range(0..2500));
        let node = rng.random_range(0..nodes);
        let fault = match rng.random_range(0..10) {
            0..=1 => Fault::Restart(node),
            2..=4 => Fault::Cut {
                node,
                client: rng.random_range(0..clients),
                to_node: rng.random_bool(0.5),
                for_ms: rng.random_range(10..600),
            },
            5..=6 => Fault::Failing {
                node,
                for_ms: rng.random_range(10..400),
            },
            7..=8 => Fault::ClockRate {
                node,
                rate: rng.random_range(0.96..FASTEST_CLOCK),
            },
            // Within the allowance (2 ms + the drift factor's part, 15 ms at 300 ms).
            _ => Fault::ClockJump {
                node,
                ms: rng.random_range(0..2),
            },
        };
        faults.push((at, fault));
    }
    // Whole-process pauses of a node, and clock jumps back (at most one a node, within
    // the fencing tokens' assumption: no clock steps back by half the TTL or more).
    let mut jumped_back = vec![false; nodes];
    for _ in 0..extra.random_range(0..=2) {
        let at = Duration::from_millis(extra.random_range(0..2500));
        let node = extra.random_range(0..nodes);
        if extra.random_bool(0.6) {
            let for_ms = extra.random_range(10..600);
            faults.push((at, Fault::Pause { node, for_ms }));
        } else if !jumped_back[node] {
            jumped_back[node] = true;
            let ms = extra.random_range(1..100);
            faults.push((at, Fault::ClockJumpBack { node, ms }));
        }
    }
    // The controls' faults, more often than the rest.
    match control {
        Some(
            Control::QuarantineOff
            | Control::NoFenceFloor
            | Control::MajorityCounter
            | Control::RwQuarantineOff,
        ) => {
            for _ in 0..rng.random_range(1..=3) {
                let at = Duration::from_millis(rng.random_range(0..2500));
                faults.push((at, Fault::Restart(rng.random_range(0..nodes))));
            }
        }
        Some(Control::NoDriftAllowance) => {
            for node in 0..nodes {
                let rate = rng.random_range(1.0..FASTEST_CLOCK);
                faults.push((Duration::ZERO, Fault::ClockRate { node, rate }));
            }
        }
        Some(Control::ClockJumpBeyondAllowance) => {
            for _ in 0..extra.random_range(2..=4) {
                let at = Duration::from_millis(extra.random_range(0..2500));
                let node = extra.random_range(0..nodes);
                let ms = extra.random_range(50..=250);
                faults.push((at, Fault::ClockJump { node, ms }));
            }
        }
        _ => {}
    }
    faults.sort_by_key(|(at, _)| *at);
    faults
}

/// One simulated client: takes the lock (or a permit) a few times, works while it holds,
/// sometimes pauses past its validity or crashes.
struct Client {
    id: usize,
    rng: StdRng,
    world: World,
    observer: Rc<RefCell<Observer>>,
    redlock: Redlock,
    /// Its own handles on the nodes, for the majority-counter control's permits (which
    /// then replace the library's semaphore).
    counted: Option<Vec<FakeServer>>,
    /// In a seed of several resources, what picks the resources of each acquisition.
    multi: Option<StdRng>,
    /// Tell the observer each `lock` call and each release, for the queue's order.
    fair: bool,
    /// Poll with `try_lock` instead of waiting in the queue (a negative control).
    polling: bool,
    /// In a seed of a read-write lock, what picks each acquisition's side.
    rw: Option<StdRng>,
}

/// The resources of a seed of several resources.
const RESOURCES: [&str; 3] = ["a", "b", "c"];

impl Client {
    /// With `more`, a round more (a control: more chances to meet its fault).
    async fn run(mut self, semaphore: bool, more: bool) {
        let rounds = self.rng.random_range(1..=3) + usize::from(more);
        for _ in 0..rounds {
            let wait = self.rng.random_range(0..200);
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let crashed = if self.counted.is_some() {
                self.counted_round().await
            } else if semaphore {
                self.permit_round().await
            } else if self.rw.is_some() {
                self.rw_round().await
            } else {
                self.lock_round().await
            };
            if crashed {
                return;
            }
        }
    }

    /// The resources of the next acquisition: `r`, or in a seed of several resources 1
    /// to 3 of [`RESOURCES`], in a random order.
    fn pick_resources(&mut self) -> Vec<String> {
        let Some(rng) = &mut self.multi else {
            return vec!["r".to_owned()];
        };
        let mut all: Vec<String> = RESOURCES.iter().map(|r| (*r).to_owned()).collect();
        for i in (1..all.len()).rev() {
            all.swap(i, rng.random_range(0..=i));
        }
        all.truncate(rng.random_range(1..=RESOURCES.len()));
        all
    }

    /// One acquisition of the lock (of one resource, or of several with `lock_many`);
    /// true if the client crashed. Its holding counts on each of its resources.
    async fn lock_round(&mut self) -> bool {
        let c = self.id;
        let resources = self.pick_resources();
        let called = Instant::now();
        let result = match resources.as_slice() {
            [one] if self.polling => self.poll(one).await,
            [one] => self.redlock.lock(one.clone()).await,
            many => self.redlock.lock_many(many.to_vec()).await,
        };
        if self.fair {
            self.observer.borrow_mut().call(Call {
                client: c,
                resource: resources.join("+"),
                start: called,
                end: Instant::now(),
                acquired: result.is_ok(),
                queues: !self.polling,
            });
        }
        let names = resources.join("+");
        let mut lock = match result {
            Ok(lock) => lock,
            Err(err) => {
                self.world.log(|| format!("c{c} lock {names}: {err}"));
                return false;
            }
        };
        let start = Instant::now();
        let token = lock.fencing_token();
        self.world.log(|| {
            format!(
                "c{c} holds {names} (token {token:?}) for {:?}",
                lock.validity()
            )
        });
        let mut holding = Holding {
            client: c,
            start,
            end: lock.valid_until(),
            token,
        };
        if self.rng.random_bool(0.3) {
            lock.auto_extend();
        }
        // Loss is reported by the end of the validity (within tokio's 1 ms timer
        // granularity), never after it.
        let watcher = {
            let (handle, observer) = (lock.handle(), Rc::clone(&self.observer));
            tokio::task::spawn_local(async move {
                handle.lost().await;
                let (now, until) = (Instant::now(), handle.valid_until());
                if now > until + Duration::from_millis(1) {
                    observer.borrow_mut().late_loss(c, now, until);
                }
            })
        };
        let steps = self.rng.random_range(1..=4);
        for _ in 0..steps {
            if lock.is_held() {
                holding.end = holding.end.max(lock.valid_until());
                if let Some(token) = token {
                    let mut observer = self.observer.borrow_mut();
                    for resource in &resources {
                        observer.fenced_write(resource, c, token, Instant::now());
                    }
                }
            }
            if self.rng.random_bool(0.15) && lock.is_held() {
                let result = lock.extend(TTL).await;
                self.world.log(|| format!("c{c} extend: {result:?}"));
                if result.is_ok() && lock.is_held() {
                    holding.end = holding.end.max(lock.valid_until());
                }
            }
            self.work().await;
        }
        if lock.is_held() {
            holding.end = holding.end.max(lock.valid_until());
        }
        watcher.abort();
        let ending = self.rng.random_range(0..20);
        holding.end = holding.end.min(Instant::now());
        for resource in &resources {
            self.observer
                .borrow_mut()
                .held(resource, 1, holding.clone());
        }
        match ending {
            0 => {
                self.world.log(|| format!("c{c} crashes holding {names}"));
                lock.detach();
                true
            }
            1 => {
                drop(lock);
                false
            }
            _ => {
                let (at, valid) = (Instant::now(), lock.is_held());
                let result = lock.release().await;
                self.world.log(|| format!("c{c} release: {result:?}"));
                if self.fair && valid && result.as_ref().is_ok_and(|r| r.was_held()) {
                    self.observer.borrow_mut().released(Release {
                        client: c,
                        resource: names,
                        at,
                    });
                }
                false
            }
        }
    }

    /// One acquisition of the read-write lock `rw`, reading or writing (a writer
    /// sometimes downgrades to a read lock half-way); true if the client crashed. A
    /// write holding ends when the downgrade is asked for, the read holding that follows
    /// begins when it returns.
    async fn rw_round(&mut self) -> bool {
        let c = self.id;
        let Some(side) = self.rw.as_mut() else {
            return false;
        };
        let write = side.random_bool(0.4);
        let downgrade = write && side.random_bool(0.3);
        let rw = self.redlock.rw_lock("rw").expect("a valid name").retry(
            RetryPolicy::deadline(Duration::from_millis(500))
                .with_delay(Duration::from_millis(5), Duration::from_millis(10)),
        );
        let result = if write {
            rw.write().await.map(|w| (Some(w), None))
        } else {
            rw.read().await.map(|r| (None, Some(r)))
        };
        let (mut writer, mut reader) = match result {
            Ok(guards) => guards,
            Err(err) => {
                let side = if write { "write" } else { "read" };
                self.world.log(|| format!("c{c} {side} rw: {err}"));
                return false;
            }
        };
        let held = |w: &Option<crate::rwlock::WriteLock>, r: &Option<crate::rwlock::ReadLock>| {
            w.as_ref()
                .map(|w| (w.is_held(), w.valid_until()))
                .or_else(|| r.as_ref().map(|r| (r.is_held(), r.valid_until())))
                .unwrap_or((false, Instant::now()))
        };
        let token = writer.as_ref().and_then(|w| w.fencing_token());
        self.world.log(|| {
            let side = if write { "writes" } else { "reads" };
            format!("c{c} {side} rw (token {token:?})")
        });
        let mut holding = Holding {
            client: c,
            start: Instant::now(),
            end: held(&writer, &reader).1,
            token,
        };
        if self.rng.random_bool(0.3) {
            if let Some(w) = &mut writer {
                w.auto_extend();
            } else if let Some(r) = &mut reader {
                r.auto_extend();
            }
        }
        let steps = self.rng.random_range(1..=4);
        for step in 0..steps {
            let (is_held, until) = held(&writer, &reader);
            if is_held {
                holding.end = holding.end.max(until);
                if let (Some(token), Some(_)) = (token, &writer) {
                    self.observer
                        .borrow_mut()
                        .fenced_write("rw", c, token, Instant::now());
                }
            }
            if downgrade && step == steps / 2 && writer.is_some() {
                let Some(w) = writer.take() else { break };
                let asked = Instant::now();
                holding.end = holding.end.min(asked);
                self.observer
                    .borrow_mut()
                    .rw_held(writer_kind(true), holding.clone());
                let result = w.downgrade().await;
                self.world
                    .log(|| format!("c{c} downgrade: {:?}", result.as_ref().map(|_| ())));
                match result {
                    Ok(r) => {
                        holding = Holding {
                            client: c,
                            start: Instant::now(),
                            end: r.valid_until(),
                            token: None,
                        };
                        reader = Some(r);
                    }
                    Err(_) => return false,
                }
            }
            self.work().await;
        }
        let (is_held, until) = held(&writer, &reader);
        if is_held {
            holding.end = holding.end.max(until);
        }
        holding.end = holding.end.min(Instant::now());
        self.observer
            .borrow_mut()
            .rw_held(writer_kind(writer.is_some()), holding);
        let ending = self.rng.random_range(0..20);
        let lock = match (writer, reader) {
            (Some(w), _) => w.into_lock(),
            (None, Some(r)) => r.into_lock(),
            (None, None) => return false,
        };
        match ending {
            0 => {
                self.world.log(|| format!("c{c} crashes holding rw"));
                lock.detach();
                true
            }
            1 => {
                drop(lock);
                false
            }
            _ => {
                let result = lock.release().await;
                self.world.log(|| format!("c{c} release rw: {result:?}"));
                false
            }
        }
    }

    /// `try_lock` every 5 to 10 ms for up to 500 ms (the retry policy's pace): polling,
    /// which the library says can overtake the queue.
    async fn poll(&mut self, resource: &str) -> Result<crate::Lock, crate::Error> {
        let deadline = Instant::now() + Duration::from_millis(500);
        loop {
            let result = self.redlock.try_lock(resource.to_owned()).await;
            if result.is_ok() || Instant::now() >= deadline {
                return result;
            }
            let ms = self.rng.random_range(5..=10);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }

    /// One permit of the semaphore (2 permits); true if the client crashed.
    async fn permit_round(&mut self) -> bool {
        const PERMITS: u32 = 2;
        let c = self.id;
        let semaphore = self
            .redlock
            .semaphore("s", PERMITS)
            .expect("a valid semaphore")
            .retry(
                RetryPolicy::deadline(Duration::from_millis(500))
                    .with_delay(Duration::from_millis(5), Duration::from_millis(10)),
            );
        let mut permit = match semaphore.acquire().await {
            Ok(permit) => permit,
            Err(err) => {
                self.world.log(|| format!("c{c} permit: {err}"));
                return false;
            }
        };
        let start = Instant::now();
        self.world
            .log(|| format!("c{c} holds permit {} of s", permit.slot()));
        let mut holding = Holding {
            client: c,
            start,
            end: permit.lock().valid_until(),
            token: None,
        };
        if self.rng.random_bool(0.3) {
            permit.auto_extend();
        }
        for _ in 0..self.rng.random_range(1..=3) {
            if permit.lock().is_held() {
                holding.end = holding.end.max(permit.lock().valid_until());
            }
            self.work().await;
        }
        if permit.lock().is_held() {
            holding.end = holding.end.max(permit.lock().valid_until());
        }
        holding.end = holding.end.min(Instant::now());
        self.observer.borrow_mut().held("s", PERMITS, holding);
        if self.rng.random_range(0..20) == 0 {
            self.world.log(|| format!("c{c} crashes holding a permit"));
            drop(permit);
            return true;
        }
        let result = permit.release().await;
        self.world
            .log(|| format!("c{c} release permit: {result:?}"));
        false
    }

    /// One permit of a semaphore of 2 permits counted on each node alone and granted on
    /// a majority of nodes (the majority-counter control: nodes that saw the contenders
    /// in different orders, missed a grant or forgot it in a restart let a third holder
    /// in); true if the client crashed. Validity as the library computes it: the TTL
    /// less the time the grants took and the drift allowance.
    async fn counted_round(&mut self) -> bool {
        const PERMITS: u64 = 2;
        let c = self.id;
        let nodes = self.counted.clone().unwrap_or_default();
        let quorum = nodes.len() / 2 + 1;
        let ttl_ms = TTL.as_millis() as u64;
        let drift = TTL.mul_f64(DRIFT_FACTOR) + Duration::from_millis(2);
        let deadline = Instant::now() + Duration::from_millis(500);
        let held = loop {
            let member = format!("c{c}/{:08x}", self.rng.random::<u32>());
            let asked = Instant::now();
            let grant = redis::cmd("COUNTED.GRANT")
                .arg("s")
                .arg(&member)
                .arg(PERMITS)
                .arg(ttl_ms)
                .clone();
            let granted = ask_all(&nodes, &grant).await;
            let until = asked + TTL - drift;
            if granted >= quorum && Instant::now() < until {
                break Some((member, until));
            }
            let release = redis::cmd("COUNTED.RELEASE").arg("s").arg(&member).clone();
            ask_all(&nodes, &release).await;
            if Instant::now() >= deadline {
                break None;
            }
            let ms = self.rng.random_range(5..=10);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        };
        let Some((member, until)) = held else {
            self.world.log(|| format!("c{c} counted permit: none"));
            return false;
        };
        self.world
            .log(|| format!("c{c} holds counted permit {member} of s"));
        let mut holding = Holding {
            client: c,
            start: Instant::now(),
            end: until,
            token: None,
        };
        for _ in 0..self.rng.random_range(1..=3) {
            self.work().await;
        }
        holding.end = holding.end.min(Instant::now());
        self.observer.borrow_mut().held("s", 2, holding);
        if self.rng.random_range(0..20) == 0 {
            self.world
                .log(|| format!("c{c} crashes holding a counted permit"));
            return true;
        }
        let release = redis::cmd("COUNTED.RELEASE").arg("s").arg(&member).clone();
        ask_all(&nodes, &release).await;
        false
    }

    /// A step of work; now and then a pause longer than the TTL, during which the
    /// client neither sends nor hears anything.
    async fn work(&mut self) {
        if self.rng.random_bool(0.06) {
            let pause = Duration::from_millis(self.rng.random_range(300..800));
            self.world.freeze(self.id, pause);
            tokio::time::sleep(pause).await;
        } else {
            let ms = self.rng.random_range(1..150);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}

/// The side of a read-write lock's holding.
fn writer_kind(write: bool) -> observer::Side {
    if write {
        observer::Side::Write
    } else {
        observer::Side::Read
    }
}

/// Sends `cmd` to every node at once, each answer awaited up to the clients' node
/// timeout; the number of nodes that answered 1.
async fn ask_all(nodes: &[FakeServer], cmd: &redis::Cmd) -> usize {
    let asks = nodes.iter().map(|node| {
        let mut node = node.clone();
        async move {
            let answer =
                tokio::time::timeout(Duration::from_millis(20), cmd.query_async::<i64>(&mut node))
                    .await;
            matches!(answer, Ok(Ok(1)))
        }
    });
    futures_util::future::join_all(asks)
        .await
        .into_iter()
        .filter(|granted| *granted)
        .count()
}

/// The seeds to run: `REDLOCK_SIM_SEEDS` (default 10,000) from `REDLOCK_SIM_FIRST`
/// (default 0).
fn seeds() -> std::ops::Range<u64> {
    let var = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.replace('_', "").parse().ok())
            .unwrap_or(default)
    };
    let first = var("REDLOCK_SIM_FIRST", 0);
    first..first.saturating_add(var("REDLOCK_SIM_SEEDS", 10_000))
}

/// The command that replays `seed`, with its trace (and only the faults at the indices
/// `faults` of its schedule, if given).
fn replay_command(seed: u64, control: Option<Control>, faults: Option<&[usize]>) -> String {
    let control = control.map_or(String::new(), |c| {
        format!("REDLOCK_SIM_CONTROL={} ", c.name())
    });
    let faults = faults.map_or(String::new(), |f| {
        format!("REDLOCK_SIM_FAULTS={} ", fault_list(f))
    });
    format!(
        "{control}{faults}REDLOCK_SIM_SEED={seed} REDLOCK_SIM_TRACE=1 cargo test -p redlock-core --lib tests::sim::replay -- --nocapture"
    )
}

/// Fault indices as `REDLOCK_SIM_FAULTS` takes them: `0,3` (`none` for no fault).
fn fault_list(faults: &[usize]) -> String {
    if faults.is_empty() {
        return "none".to_owned();
    }
    faults
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// `REDLOCK_SIM_FAULTS`: the indices of the schedule's faults to keep (`none`: no
/// fault); unset, the whole schedule.
fn faults_from_env() -> Option<Vec<usize>> {
    let list = std::env::var("REDLOCK_SIM_FAULTS").ok()?;
    let list = list.trim();
    if list.is_empty() || list == "none" {
        return Some(Vec::new());
    }
    Some(
        list.split(',')
            .map(|i| {
                i.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("REDLOCK_SIM_FAULTS: not an index: {i:?}"))
            })
            .collect(),
    )
}

/// How many faults `seed`'s schedule has (with `control`).
fn schedule_len(seed: u64, control: Option<Control>) -> usize {
    run_seed_with(seed, control, Some(&[]), false, false).schedule
}

/// A 1-minimal list of `seed`'s faults that still breaks an invariant (delta debugging,
/// Zeller's ddmin, over the indices of its schedule): taking any one fault out of it
/// breaks none. Each try runs the seed again with only those faults; the network's
/// latency and losses and the clients' choices stay drawn from the seed as before.
/// `None` if the seed breaks no invariant with its whole schedule.
pub(super) fn shrink(seed: u64, control: Option<Control>) -> Option<Vec<usize>> {
    let fails = |faults: &[usize]| {
        !run_seed_with(seed, control, Some(faults), false, false)
            .violations
            .is_empty()
    };
    let all: Vec<usize> = (0..schedule_len(seed, control)).collect();
    if !fails(&all) {
        return None;
    }
    Some(ddmin(all, fails))
}

/// Delta debugging: a 1-minimal sub-list of `items` on which `fails` holds (it holds on
/// `items`).
fn ddmin(items: Vec<usize>, mut fails: impl FnMut(&[usize]) -> bool) -> Vec<usize> {
    if fails(&[]) {
        return Vec::new();
    }
    let mut list = items;
    let mut parts = 2;
    while list.len() >= 2 {
        let size = list.len().div_ceil(parts);
        let chunks: Vec<Vec<usize>> = list.chunks(size).map(<[usize]>::to_vec).collect();
        let mut reduced = false;
        for chunk in &chunks {
            if fails(chunk) {
                list = chunk.clone();
                parts = 2;
                reduced = true;
                break;
            }
        }
        if !reduced && chunks.len() > 2 {
            for i in 0..chunks.len() {
                let rest: Vec<usize> = chunks
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .flat_map(|(_, c)| c.iter().copied())
                    .collect();
                if fails(&rest) {
                    list = rest;
                    parts = (parts - 1).max(2);
                    reduced = true;
                    break;
                }
            }
        }
        if !reduced {
            if parts >= list.len() {
                break;
            }
            parts = (parts * 2).min(list.len());
        }
    }
    list
}

/// The failure report of `seed`: its violations, its shrunk fault list and the replay
/// commands.
fn failure_report(
    seed: u64,
    control: Option<Control>,
    violations: &[String],
    minimal: Option<&[usize]>,
    schedule: usize,
) -> String {
    let mut report = format!(
        "seed {seed} broke an invariant:\n  {}\n  replay: {}",
        violations.join("\n  "),
        replay_command(seed, control, None)
    );
    if let Some(minimal) = minimal {
        report.push_str(&format!(
            "\n  minimal faults [{}] of {schedule}: {}",
            fault_list(minimal),
            replay_command(seed, control, Some(minimal))
        ));
    }
    report
}

/// Runs every `step`-th seed of [`seeds`] from `offset`: all invariants on every seed,
/// none may fail.
fn run_share(offset: u64, step: u64) {
    let started = std::time::Instant::now();
    let mut count = 0u64;
    let mut hand_overs = 0u64;
    for seed in seeds()
        .skip(usize::try_from(offset).unwrap_or(0))
        .step_by(usize::try_from(step).unwrap_or(1))
    {
        let outcome = run_seed(seed, None, false, false);
        count += 1;
        hand_overs += outcome.hand_overs_checked;
        assert!(
            outcome.violations.is_empty(),
            "simulation {}",
            failure_report(
                seed,
                None,
                &outcome.violations,
                shrink(seed, None).as_deref(),
                outcome.schedule
            )
        );
    }
    let secs = started.elapsed().as_secs_f64();
    // Past the harness's capture (it takes `print!`, not writes to the stream), so that
    // every run's log shows the count and the rate.
    let _ = writeln!(
        std::io::stderr(),
        "simulation: {count} seeds, 0 violations ({hand_overs} hand-overs checked for the queue's order), {secs:.1} s, {:.0} seeds/s",
        count as f64 / secs.max(1e-9)
    );
}

// The seeds in two halves, one test each: the test harness runs them on two threads.
#[test]
fn seeds_even() {
    run_share(0, 2);
}

#[test]
fn seeds_odd() {
    run_share(1, 2);
}

/// One seed gives one history, bit for bit: the same trace twice.
#[test]
fn a_seed_replays_bit_for_bit() {
    for seed in 0..200 {
        let first = run_seed(seed, None, true, false);
        let second = run_seed(seed, None, true, false);
        assert!(first.trace.len() > 5, "seed {seed}: too short a trace");
        if first.trace != second.trace {
            let at = first
                .trace
                .iter()
                .zip(&second.trace)
                .position(|(a, b)| a != b)
                .unwrap_or(first.trace.len().min(second.trace.len()));
            panic!(
                "seed {seed}: two runs differ at line {at}:\n  {:?}\n  {:?}",
                first.trace.get(at),
                second.trace.get(at)
            );
        }
    }
}

/// The most seeds each control may take to be caught.
const CONTROL_BUDGET: u64 = 500;

/// Every negative control is caught within [`CONTROL_BUDGET`] seeds: the observer has
/// the power to see each broken guarantee.
#[test]
fn every_negative_control_is_caught() {
    for control in Control::ALL {
        let caught = (0..CONTROL_BUDGET).find_map(|seed| {
            let outcome = run_seed(seed, Some(control), false, false);
            outcome.violations.first().cloned().map(|v| (seed, v))
        });
        let Some((seed, violation)) = caught else {
            panic!(
                "control {} not caught within {CONTROL_BUDGET} seeds: the simulator cannot see the guarantee it breaks",
                control.name()
            )
        };
        // The catching seed replays: the same trace twice, the violation again.
        let first = run_seed(seed, Some(control), true, false);
        let second = run_seed(seed, Some(control), true, false);
        assert!(
            first.trace == second.trace && !first.violations.is_empty(),
            "control {}: seed {seed} does not replay",
            control.name()
        );
        // Its faults shrunk to a 1-minimal list, which fails and replays too.
        let minimal = shrink(seed, Some(control)).unwrap_or_else(|| {
            panic!("control {}: seed {seed} shrinks to nothing", control.name())
        });
        let first = run_seed_with(seed, Some(control), Some(&minimal), true, false);
        let second = run_seed_with(seed, Some(control), Some(&minimal), true, false);
        assert!(
            first.trace == second.trace && !first.violations.is_empty(),
            "control {}: seed {seed} with faults [{}] does not fail and replay",
            control.name(),
            fault_list(&minimal)
        );
        println!(
            "control {}, caught within {} seeds: {}\n    with the minimal faults: {}",
            control.name(),
            seed + 1,
            failure_report(
                seed,
                Some(control),
                &[violation],
                Some(&minimal),
                first.schedule
            ),
            first.violations.first().map_or("", String::as_str),
        );
    }
}

/// Delta debugging finds the smallest failing list, whatever the order of its parts.
#[test]
fn ddmin_finds_a_one_minimal_list() {
    let mut tries = 0;
    let minimal = ddmin((0..9).collect(), |list| {
        tries += 1;
        list.contains(&2) && list.contains(&7)
    });
    assert_eq!(minimal, vec![2, 7]);
    assert!(tries < 40, "{tries} tries");
    assert_eq!(ddmin(vec![0, 1, 2], |_| true), Vec::<usize>::new());
    assert_eq!(ddmin(vec![0, 1, 2], |l| l.contains(&1)), vec![1]);
}

/// Replays `REDLOCK_SIM_SEED` (with `REDLOCK_SIM_CONTROL`, if set; only the faults
/// `REDLOCK_SIM_FAULTS` lists, if set), printing its trace with `REDLOCK_SIM_TRACE=1`.
#[test]
fn replay() {
    let Some(seed) = std::env::var("REDLOCK_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    else {
        return;
    };
    let control = std::env::var("REDLOCK_SIM_CONTROL")
        .ok()
        .and_then(|c| Control::parse(&c));
    let trace = std::env::var("REDLOCK_SIM_TRACE").is_ok_and(|v| v == "1");
    let faults = faults_from_env();
    let outcome = run_seed_with(seed, control, faults.as_deref(), false, trace);
    for violation in &outcome.violations {
        println!("VIOLATION: {violation}");
    }
    assert!(
        outcome.violations.is_empty(),
        "seed {seed} broke an invariant"
    );
}

/// Found by the simulator (docs/GUARANTEES.md, "The deterministic simulator"): an
/// extension issued before the release was applied after it on a node, both having
/// waited there for the acquisition's commands. The release now waits for the
/// extension's commands too. These seeds (with a round more per client, and their fault
/// schedules shrunk) broke it before; the observer fails any seed where a node extends
/// a key's value after its release there.
#[test]
fn an_extension_is_never_applied_after_the_release() {
    let cases: [(u64, &[usize]); 2] = [(49298, &[]), (37739, &[0])];
    for (seed, faults) in cases {
        let outcome = run_world(seed, None, Some(faults), true, false, false);
        assert!(
            outcome.violations.is_empty(),
            "seed {seed}: {:?}",
            outcome.violations
        );
    }
}

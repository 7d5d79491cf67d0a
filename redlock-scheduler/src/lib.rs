//! A leader-election cron scheduler: every replica declares the same jobs, and each tick
//! runs on exactly one of them.
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_core::{BoxError, Redlock};
//! use redlock_scheduler::{History, Job, JobContext, Scheduler};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), BoxError> {
//!     let redlock = Redlock::builder()
//!         .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
//!         .build()?;
//!     // Every replica runs this same code; each tick runs on one of them.
//!     let scheduler = Scheduler::builder(redlock)
//!         .name("billing")
//!         .history(History::connect("sqlite://history.db").await?)
//!         .job(Job::new("invoices", "0 */5 * * * *", |ctx: JobContext| async move {
//!             println!("invoices due at {} (token {})", ctx.tick(), ctx.fencing_token());
//!             Ok::<_, BoxError>(())
//!         }))
//!         .build()?;
//!     scheduler.wait_ready(Duration::from_secs(15)).await?; // a quorum out of quarantine
//!     scheduler.start();
//!     tokio::time::sleep(Duration::from_secs(3600)).await; // ... serve ...
//!     scheduler.shutdown(Duration::from_secs(30)).await; // hands over, lets runs finish
//!     Ok(())
//! }
//! ```
//!
//! # Feature flags
//!
//! None: the crate has no Cargo features. SQLite and PostgreSQL are both always built in
//! (through sqlx); the history URL picks one.
//!
//! # How it works
//!
//! - [`LeaderElector`](leader::LeaderElector) (usable on its own): one replica leads, with a fencing epoch; a
//!   follower takes over when the leader dies (within the leadership TTL plus one retry
//!   interval) or at once when it shuts down.
//! - [`Scheduler`]: the leader fires each [`Job`] at its ticks (cron with
//!   optional seconds, in a time zone, with a per-job DST policy: [`time::Schedule`],
//!   [`time::DstPolicy`]). Before running, it
//!   **claims** the tick under the job's name and the tick's scheduled time: a lock that
//!   outlives the run, and with a [`History`] a row under
//!   `UNIQUE (scheduler, job, tick_ms)`. A tick claimed once never runs again, even if
//!   leadership changes hands mid-tick or two replicas briefly both think they lead.
//! - Per job: a [`Misfire`](job::Misfire) policy for ticks missed while no one led, a timeout, and no
//!   overlap (a tick is skipped while the previous run goes on). Handlers get a
//!   [`JobContext`]: the scheduled tick, the fencing token, the instance, and a
//!   cancellation token that fires on lost leadership, a lost claim, timeout or shutdown.
//! - [`History`]: the run history through sqlx, SQLite (no server) or PostgreSQL; a
//!   job's writes can commit with its run's row ([`transaction`]).
//! - [`Scheduler::status`], [`Scheduler::trigger`], [`Scheduler::pause`] /
//!   [`Scheduler::resume`], [`Scheduler::cancel`], [`Scheduler::step_down`], and
//!   [`Scheduler::shutdown`] with a deadline.
//!
//! It never talks to Redis itself: every lock goes through [`redlock_core::Redlock`].
//!
//! # Where things are
//!
//! The crate root has what a scheduler starts with: [`Scheduler`], [`SchedulerBuilder`],
//! [`Job`], [`JobContext`], [`JobSpec`], [`History`] and [`Error`]. The rest lives in a
//! module per concern, each with its own constants:
//!
//! | module | what |
//! | --- | --- |
//! | [`job`] | [`Job`], [`JobContext`], [`JobSpec`] (a job's options as data), [`Misfire`](job::Misfire) |
//! | [`history`] | [`History`], [`HistoryBuilder`](history::HistoryBuilder), [`Run`](history::Run), [`RunFilter`](history::RunFilter), [`Outcome`](history::Outcome), the timeouts and limits |
//! | [`admin`] | [`SchedulerAdmin`](admin::SchedulerAdmin), [`JobInfo`](admin::JobInfo), [`LeaderInfo`](admin::LeaderInfo), requests ([`Request`](admin::Request)), what a control did ([`Dispatched`](admin::Dispatched)) |
//! | [`changes`] | jobs changed at run time: [`JobChange`](changes::JobChange), [`JobChangeAction`](changes::JobChangeAction), [`JOB_CHANGE_POLL`](changes::JOB_CHANGE_POLL) |
//! | [`error`] | [`Error`] and the error of each concern: [`BuildError`](error::BuildError), [`NotReady`](error::NotReady), [`HistoryError`](error::HistoryError) (with [`DatabaseError`](error::DatabaseError)), [`RequestError`](error::RequestError), [`TransactionError`](error::TransactionError) |
//! | [`leader`] | [`LeaderElector`](leader::LeaderElector), its builder, [`Leadership`](leader::Leadership), [`LeaderEvent`](leader::LeaderEvent), [`DEFAULT_TERM`](leader::DEFAULT_TERM) |
//! | [`transaction`] | [`RunTransaction`](transaction::RunTransaction): a job's writes committed with its run's row |
//! | [`status`] | [`SchedulerStatus`](status::SchedulerStatus), [`JobStatus`](status::JobStatus), [`LastRun`](status::LastRun), [`Health`](status::Health) |
//! | [`time`] | [`Schedule`](time::Schedule), [`DstPolicy`](time::DstPolicy) ([`Gap`](time::Gap), [`Fold`](time::Fold)), [`Clock`](time::Clock), [`ManualClock`](time::ManualClock) |
//! | [`telemetry`] | metric names, [`describe`](telemetry::describe) |
//! | [`keys`] | the lock keys made from the scheduler's and the jobs' names, and how long those names may be ([`max_job_name_len`](keys::max_job_name_len), [`max_scheduler_name_len`](keys::max_scheduler_name_len)) |
//!
//! Each call returns the error of its concern: building a
//! [`BuildError`](error::BuildError), [`Scheduler::wait_ready`] a
//! [`NotReady`](error::NotReady), a read of the history a
//! [`HistoryError`](error::HistoryError), an operator's control or a job change (on a
//! [`Scheduler`] or a [`SchedulerAdmin`](admin::SchedulerAdmin)) a
//! [`RequestError`](error::RequestError), a run's transaction a
//! [`TransactionError`](error::TransactionError). `?` converts each into [`Error`].
//!
//! Every control (`trigger`, `cancel`, `step_down`) answers a
//! [`Dispatched`](admin::Dispatched) on a [`Scheduler`] and a
//! [`SchedulerAdmin`](admin::SchedulerAdmin) alike: done here (with its result and tick),
//! or recorded as a request for the replica that can carry it out.
//!
//! # Dependencies in the API
//!
//! The API names few types of other crates, so that their new versions need not be new
//! versions of this one:
//!
//! - [`chrono`]'s `DateTime<Utc>` for every point in time (ticks, runs, requests, a
//!   [`Clock`](time::Clock)'s now): chrono is the time vocabulary of the crates this one
//!   works with (sqlx, serde, croner), and a tick is a calendar time in a zone, which a
//!   `SystemTime` cannot say. Time zones are named by their IANA names (strings), not
//!   by chrono-tz's types; croner's types do not appear at all.
//! - sqlx where a job's own writes meet the history: [`History::from_pool`] takes an
//!   `AnyPool`, [`History::pool`] lends it, and a
//!   [`RunTransaction`](transaction::RunTransaction) dereferences to sqlx's
//!   `AnyConnection`, so that a job writes its effects with sqlx's queries in the run's
//!   transaction. These follow the sqlx version this crate depends on. sqlx's errors
//!   are not in the API: a [`DatabaseError`](error::DatabaseError) carries one as its
//!   `source()`.
//! - The cancellation token of [`JobContext::cancellation_token`] and of a
//!   [`Leadership`](leader::Leadership) is tokio-util's `CancellationToken`, as
//!   [`redlock_core`] hands it out for its locks.
//!
//! # Admin API
//!
//! Operators' tools (an admin web service, a command line) need no job definitions and
//! run no scheduler: [`SchedulerAdmin::new`](admin::SchedulerAdmin::new)`(history, name)` works from the history
//! database alone. Every replica publishes its job definitions there when it starts,
//! and the leader records itself when elected (renewing the record while it leads, and
//! marking it ended when it steps down or shuts down), so the admin can list the jobs
//! with their next ticks (in each job's time zone), pause state, last run and the run going
//! ([`SchedulerAdmin::jobs`](admin::SchedulerAdmin::jobs)), show the leader and its epoch
//! ([`SchedulerAdmin::leader`](admin::SchedulerAdmin::leader)), read runs through a [`RunFilter`](history::RunFilter), and pause or resume
//! a job. What only a live replica can do is a *request*, a row with a random id:
//! [`SchedulerAdmin::trigger`](admin::SchedulerAdmin::trigger), [`SchedulerAdmin::cancel`](admin::SchedulerAdmin::cancel) (the run ends as
//! [`Outcome::Cancelled`](history::Outcome::Cancelled), `cancelled by an operator`) and [`SchedulerAdmin::step_down`](admin::SchedulerAdmin::step_down)
//! (the leader hands over and keeps out of the election for a while). The leader
//! takes pending requests about twice a second (a cancel: the replica running the job),
//! each atomically so only one replica acts on it, and writes the result;
//! [`SchedulerAdmin::wait`](admin::SchedulerAdmin::wait) follows one. A running [`Scheduler`] offers the same:
//! [`Scheduler::cancel`], [`Scheduler::step_down`] (done directly where possible, else
//! through a request) and [`Scheduler::admin`].
//!
//! ```no_run
//! # async fn admin() -> Result<(), redlock_scheduler::Error> {
//! use std::time::Duration;
//! use redlock_scheduler::History;
//! use redlock_scheduler::admin::SchedulerAdmin;
//! use redlock_scheduler::history::{Outcome, RunFilter};
//!
//! let history = History::connect("postgres://ops@db.internal/app").await?;
//! let admin = SchedulerAdmin::new(history, "billing").operator("alice");
//! let failed = admin
//!     .runs(&RunFilter::new().job("invoices").outcome(Outcome::Failed).limit(20))
//!     .await?;
//! println!("{} recent failures", failed.len());
//! // A control answers a `Dispatched`: for an admin, always a request to follow.
//! let trigger = admin.trigger("invoices").await?;
//! let id = trigger.request_id().unwrap_or_default();
//! let done = admin.wait(id, Duration::from_secs(10)).await?;
//! println!("{:?}: {}", done.state, done.result.unwrap_or_default()); // ok: tick ...
//! # Ok(())
//! # }
//! ```
//!
//! # Three replicas in one process, against real nodes
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let cluster = redlock_testkit::Cluster::start(3).await;
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::time::Duration;
//! use redlock_core::Redlock;
//! use redlock_scheduler::history::Outcome;
//! use redlock_scheduler::{History, Job, JobContext, Scheduler};
//!
//! let redlock = Redlock::builder()
//!     .nodes(cluster.urls())
//! #   .restart_quarantine(false) // the kit's nodes are seconds old
//!     .build()?;
//! let history = History::connect("sqlite:file:doc?mode=memory&cache=shared").await?;
//! let runs = Arc::new(AtomicUsize::new(0));
//! // Three replicas (in a real service: three processes) declare the same job.
//! let mut replicas = Vec::new();
//! for name in ["a", "b", "c"] {
//!     let runs = runs.clone();
//!     let scheduler = Scheduler::builder(redlock.clone())
//!         .instance(name)
//!         .history(history.clone())
//!         .job(Job::new("every-second", "* * * * * *", move |_ctx: JobContext| {
//!             let runs = runs.clone();
//!             async move {
//!                 runs.fetch_add(1, Ordering::SeqCst);
//!                 Ok::<_, std::convert::Infallible>(())
//!             }
//!         }))
//!         .build()?;
//!     scheduler.start();
//!     replicas.push(scheduler);
//! }
//! tokio::time::sleep(Duration::from_millis(3500)).await;
//! for replica in &replicas {
//!     replica.shutdown(Duration::from_secs(5)).await;
//! }
//! // Each tick ran once, on one replica, however many replicas there are (the leader
//! // hands runs to the replicas with the fewest going; a tick caught by the shutdowns
//! // may be recorded as skipped, saying why).
//! let rows = history.runs("scheduler", "every-second", 100).await?;
//! let succeeded = rows.iter().filter(|r| r.outcome == Outcome::Succeeded).count();
//! assert_eq!(succeeded, runs.load(Ordering::SeqCst));
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
// Examples in the docs compile without warnings, as the code does (a snippet may define
// what it does not call).
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

// The `mod` lines are alphabetical (as `cargo fmt` keeps them); docs/ARCHITECTURE.md
// gives the order in which the modules use one another, none using one that uses it.
pub mod changes;
mod control;
pub mod error;
pub mod history;
pub mod job;
pub mod keys;
pub mod leader;
mod plan;
mod record;
mod request;
mod scheduler;
mod spec;
pub mod status;
pub mod telemetry;
pub mod time;
pub mod transaction;

pub mod admin {
    //! Operators' tools over the history database alone: [`SchedulerAdmin`] (jobs,
    //! leader, runs, pauses, job changes), the requests it makes for the replicas
    //! ([`Request`]) and what a control did ([`Dispatched`]); why one was refused is a
    //! [`RequestError`](crate::error::RequestError). See [`SchedulerAdmin`] for the
    //! details.

    pub use crate::control::{DEFAULT_NEXT_TICKS, JobInfo, LeaderInfo, SchedulerAdmin};
    pub use crate::request::{Dispatched, Request, RequestAction, RequestState};
}

pub use error::Error;
pub use history::History;
pub use job::{Job, JobContext, JobSpec};
pub use scheduler::Scheduler;
pub use scheduler::builder::SchedulerBuilder;

#[doc = include_str!("../guides/SCHEDULER.md")]
pub mod _guide {}

// The README's examples, compiled (and run unless `no_run`) as doctests so that they
// stay true to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

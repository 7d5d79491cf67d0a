//! An admin service for redlock: what the locks and the scheduler are doing, and the
//! buttons to steer them, for the operators of a service that uses them.
//!
//! One implementation ([`Admin`]), mounted in axum or any tower stack
//! ([`AdminService`], feature `tower`, on by default) or in actix-web
//! ([`Admin::actix_scope`], feature `actix`). It serves:
//!
//! | route | method | what |
//! | --- | --- | --- |
//! | `/` | GET | the HTML dashboard: nodes, held locks, semaphores, read-write locks, leader, jobs, recent runs, with buttons; reloads itself (`?refresh=off` stops it) |
//! | `/api/overview` | GET | everything the dashboard shows, as JSON |
//! | `/api/nodes` | GET | node health ([`Redlock::node_health`](redlock_core::Redlock::node_health)) |
//! | `/api/locks?prefix=&limit=` | GET | held locks, semaphores (`semaphores`: permits used of their size, each slot's holder) and read-write locks (`rw_locks`: writer, readers, writer waiting) ([`Redlock::locks`](redlock_core::Redlock::locks)) |
//! | `/api/locks/release?resource=` | POST | force release ([`Redlock::force_release`](redlock_core::Redlock::force_release)) |
//! | `/api/semaphores/release?name=` | POST | force release of every permit of a semaphore ([`Redlock::force_release_semaphore`](redlock_core::Redlock::force_release_semaphore)) |
//! | `/api/rw-locks/release?name=` | POST | force release of a read-write lock, writer and readers ([`Redlock::force_release_rw`](redlock_core::Redlock::force_release_rw)) |
//! | `/api/jobs` | GET | jobs, next ticks, last runs ([`SchedulerAdmin::jobs`](redlock_scheduler::admin::SchedulerAdmin::jobs)) |
//! | `/api/jobs` | POST | add a job at run time: its definition as a JSON body (below); 201 with the [`JobChange`](redlock_scheduler::changes::JobChange) ([`SchedulerAdmin::add_job`](redlock_scheduler::admin::SchedulerAdmin::add_job)) |
//! | `/api/jobs/{job}/reschedule` | POST | put another definition in force: the fields given in a JSON body change, the others keep the definition in force; 200 with the `JobChange` ([`SchedulerAdmin::reschedule_job`](redlock_scheduler::admin::SchedulerAdmin::reschedule_job)) |
//! | `/api/jobs/{job}/remove` | POST | remove a job at run time (a run going on finishes); 200 with the `JobChange` ([`SchedulerAdmin::remove_job`](redlock_scheduler::admin::SchedulerAdmin::remove_job)) |
//! | `/api/job-changes?job=&limit=` | GET | the jobs' changes made at run time, newest first (`limit` 50 by default, at most 1,000): `seq`, `job`, `action` (`add`, `reschedule`, `remove`), `definition`, `previous`, `changed_by`, `changed` ([`SchedulerAdmin::job_changes`](redlock_scheduler::admin::SchedulerAdmin::job_changes)) |
//! | `/api/leader` | GET | the leader now and its epoch (`null` when none leads: the last one ended its leadership or stopped renewing its record) |
//! | `/api/runs?job=&outcome=&limit=` | GET | run history, newest first |
//! | `/api/jobs/{job}/pause`, `resume`, `trigger`, `cancel` | POST | steer a job (trigger, cancel: see below) |
//! | `/api/scheduler/step-down` | POST | ask the leader to hand over (see below) |
//! | `/api/requests/{id}` | GET | where a trigger, cancel or step-down request stands |
//! | `/api/idempotency?prefix=&limit=` | GET | idempotency records by id prefix, in id order: `{"records": [{"id", "state", "token", "started_ms", "status", "body_len", "expires_in_ms"}], "truncated"}` ([`AdminBuilder::idempotency`]; `limit` at most [`MAX_LIST_LIMIT`]) |
//!
//! The routes that change something (POST) are **off** unless the service is built with
//! [`AdminBuilder::allow_mutations`]`(token)`: then they need the token as
//! `Authorization: Bearer <token>` (or, from the dashboard's buttons, as the `token`
//! field of an `application/x-www-form-urlencoded` body). Never in the URL, which
//! access logs, proxies and browser histories keep: a `token` in the query string
//! answers 400. Off, they answer 403; without the right token, 401; either way nothing
//! changes.
//!
//! Trigger, cancel and step-down are requests that a running scheduler replica carries
//! out (the leader, for a cancel the replica running the job, claims them about twice a
//! second). The answer waits for that up to [`AdminBuilder::request_wait`] (2 s by
//! default) and says what happened: carried out, 200 with the request's `state`
//! (`succeeded`) and `result`; not carried out (a run still going, nothing to cancel),
//! 409; still under way, 202 Accepted with `state` `pending` (`"message": "queued: no
//! leader has claimed it yet"`; `leader` says whether one is recorded) or `executing`,
//! and the request's URL in `Location` and `poll` (`/api/requests/{id}`). The
//! dashboard's notice says the same: `done: ...` only for what was done.
//!
//! A job's definition, for `POST /api/jobs` and `POST /api/jobs/{job}/reschedule`, is
//! a JSON object (`Content-Type: application/json`; another type answers 415, a form
//! post a redirect to the dashboard saying so), the token in the `Authorization`
//! header:
//!
//! ```json
//! {"name": "export-eu", "schedule": "0 */5 * * * *", "handler": "export",
//!  "time_zone": "Europe/Paris", "misfire": "catch_up:3", "misfire_grace_ms": 5000,
//!  "timeout_ms": 60000, "dst": "skip/twice", "run_on_leader": true}
//! ```
//!
//! `name` and `schedule` (cron, 5 fields or 6 with seconds first) are needed to add a
//! job; the others default as in [`JobSpec`](redlock_scheduler::JobSpec): `handler` the
//! job's name, `time_zone` `UTC`, `misfire` `run_once`, `misfire_grace_ms` 60000 (one
//! minute), `timeout_ms` `null` (none), `dst` `run_at_end/once`, `run_on_leader`
//! `false`. `misfire` is `"skip"`, `"run_once"` or `"catch_up:<max>"` (or the object a
//! `JobChange` shows: `{"policy": "catch_up", "max": 3}`); `dst` is `<gap>/<fold>`
//! (gap `run_at_end` or `skip`, fold `once` or `twice`; or the object `/api/jobs`
//! shows). To reschedule, give only the fields to change (a `name`, if given, must be
//! the job's; `"timeout_ms": null` removes a timeout). A field not listed here is
//! refused. The handler must be registered
//! ([`SchedulerBuilder::handler`](redlock_scheduler::SchedulerBuilder::handler)) on a
//! replica alive in the last minute. The changes are recorded with the operator of the
//! [`SchedulerAdmin`](redlock_scheduler::admin::SchedulerAdmin) given to the builder
//! (its [`operator`](redlock_scheduler::admin::SchedulerAdmin::operator), `admin` by
//! default), and reach every replica within a second. A job's `name` may be at most
//! [`SchedulerAdmin::max_job_name_len`](redlock_scheduler::admin::SchedulerAdmin::max_job_name_len)
//! bytes, so that every lock key made from it fits under the replicas'
//! `max_resource_len` (477 bytes for the default scheduler name `scheduler` and the
//! default limit of 512; see [`redlock_scheduler::keys`]). Answers: 400 for a definition
//! that cannot work (schedule, time zone, an option), a name too long (the problem's
//! `max_len` gives the bound in bytes, `len` the name's length, `name_kind` `job` or
//! `scheduler`) or a body that cannot be read
//! (not JSON, a field unknown or of the wrong type, nothing to change); 404 for an
//! unknown job; 409 for a job added that is there already, a change that kept losing
//! the race with others, or replicas alive that run a version without job changes;
//! 422 for a handler no live replica registered; 503 when the history database fails.
//! The dashboard lists the latest changes (who, when, schedule before → after).
//!
//! Reads need no token: mount the service where only operators reach it, or behind
//! your own authentication layer. Errors are `application/problem+json`; a database
//! error's own text goes to the log, not to the caller.
//!
//! ```
//! use std::time::Duration;
//! use redlock_admin::{Admin, AdminService};
//! use redlock_core::Redlock;
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let cluster = redlock_testkit::Cluster::start(3).await;
//! let redlock = Redlock::builder()
//!     .nodes(cluster.urls())
//! #   .restart_quarantine(false) // the test nodes were started a moment ago
//!     .holder("orders-7")
//!     .build()?;
//! let admin = Admin::builder()
//!     .redlock(redlock.clone())
//!     .allow_mutations("a-long-random-admin-token") // from a secret store in real life
//!     .build()?;
//! // axum: Router::new().nest_service("/admin", AdminService::new(admin))
//! let service = AdminService::new(admin);
//!
//! let _lock = redlock.lock("order:42").ttl(Duration::from_secs(30)).await?;
//! let request = http::Request::get("/admin/api/locks").body(String::new())?;
//! let response = service.clone().oneshot(request).await?;
//! assert_eq!(response.status(), 200);
//!
//! // A mutation without the token changes nothing.
//! let request = http::Request::post("/admin/api/locks/release?resource=order:42").body(String::new())?;
//! assert_eq!(service.oneshot(request).await?.status(), 401);
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
// Examples in the docs compile without warnings, as the code does (a snippet may define
// what it does not call).
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

#[cfg(feature = "actix")]
mod actix;
mod admin;
mod definition;
mod handle;
mod html;
mod route;
#[cfg(feature = "tower")]
mod service;

pub use admin::{
    Admin, AdminBuilder, BuildError, DEFAULT_LIST_LIMIT, DEFAULT_MOUNT_PATH, DEFAULT_REFRESH,
    DEFAULT_REQUEST_WAIT, MAX_LIST_LIMIT, MIN_TOKEN_LEN,
};
pub use handle::{AdminRequest, MAX_BODY};
#[cfg(feature = "tower")]
pub use service::AdminService;

#[doc = include_str!("../guides/OPERATIONS.md")]
pub mod _operations {}

// The README's examples, compiled (and run unless `no_run`) as doctests so that they
// stay true to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

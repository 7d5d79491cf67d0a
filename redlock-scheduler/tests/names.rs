//! Names against the lock keys made from them, with real Redis nodes and a SQLite
//! history: the longest job name and the longest scheduler name accepted run their
//! ticks (claim, run lock, leadership and the run transaction's fence all taken), and
//! one byte more is refused where the name enters: `SchedulerBuilder::build`,
//! `Scheduler::add_job` / `reschedule_job`, `SchedulerAdmin::add_job` /
//! `reschedule_job`, with the bound in bytes, nothing recorded.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use redlock_core::BoxError;
use redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN;
use redlock_scheduler::admin::SchedulerAdmin;
use redlock_scheduler::changes::JobChange;
use redlock_scheduler::error::{BuildError, NameTooLong, RequestError};
use redlock_scheduler::history::Outcome;
use redlock_scheduler::keys::{NameKind, max_job_name_len, max_scheduler_name_len};
use redlock_scheduler::{History, Job, JobContext, Scheduler};
use redlock_testkit::Cluster;

mod common;
use common::*;

/// A run that opens its transaction and commits it: it succeeds only if the fence
/// under the scheduler's and the job's names took it.
async fn committing(ctx: JobContext) -> Result<(), BoxError> {
    let tx = ctx.transaction().await?;
    tx.commit().await?;
    Ok(())
}

/// Waits until a run of `job` of `scheduler` is recorded as succeeded.
async fn until_succeeded(history: &History, scheduler: &str, job: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let runs = history.runs(scheduler, job, 20).await.unwrap();
        if runs.iter().any(|run| run.outcome == Outcome::Succeeded) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no run of the {}-byte job of the {}-byte scheduler succeeded within {within:?}: {runs:?}",
            job.len(),
            scheduler.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `result` is the refusal of a `kind` name of `len` bytes above `max`.
fn assert_too_long(
    result: Result<JobChange, RequestError>,
    kind: NameKind,
    len: usize,
    max: usize,
    what: &str,
) {
    match result {
        Err(RequestError::NameTooLong(NameTooLong {
            kind: k,
            len: l,
            max: m,
            ..
        })) if k == kind && l == len && m == max => {}
        other => panic!("{what}: a {kind} of {len} bytes (at most {max}): {other:?}"),
    }
}

/// A job added at run time with the longest name its scheduler takes runs its ticks;
/// one byte more, and a name of a few hundred bytes more, are refused by the replica's
/// and the admin's `add_job` and `reschedule_job`, nothing recorded; an admin of a
/// scheduler whose name is itself too long refuses every job, naming the scheduler's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_job_name_runs_and_one_byte_more_is_refused_at_run_time() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let replica = Replica::start(&cluster, "a", Some(url.clone()), Vec::new(), |b| {
        b.handler("commit", committing)
    })
    .await;
    leader_of(std::slice::from_ref(&replica), Duration::from_secs(5)).await;
    // The replica's first beat names its handlers (an admin's change looks them up).
    tokio::time::sleep(Duration::from_millis(800)).await;
    let scheduler = &replica.scheduler;
    let admin = SchedulerAdmin::new(history.clone(), Scheduler::DEFAULT_NAME);
    let max = scheduler.max_job_name_len();
    assert_eq!(max, DEFAULT_MAX_RESOURCE_LEN - "scheduler".len() - 26);
    assert_eq!(admin.max_job_name_len(), max);

    for len in [max + 1, 600] {
        let spec =
            redlock_scheduler::JobSpec::new("j".repeat(len), "* * * * * *").handler("commit");
        assert_too_long(
            scheduler.add_job(spec.clone()).await,
            NameKind::Job,
            len,
            max,
            "Scheduler::add_job",
        );
        assert_too_long(
            admin.add_job(spec.clone()).await,
            NameKind::Job,
            len,
            max,
            "SchedulerAdmin::add_job",
        );
        assert_too_long(
            scheduler.reschedule_job(spec.clone()).await,
            NameKind::Job,
            len,
            max,
            "Scheduler::reschedule_job",
        );
        assert_too_long(
            admin.reschedule_job(spec).await,
            NameKind::Job,
            len,
            max,
            "SchedulerAdmin::reschedule_job",
        );
    }
    let too_long_scheduler = "s".repeat(max_scheduler_name_len(DEFAULT_MAX_RESOURCE_LEN) + 1);
    assert_too_long(
        SchedulerAdmin::new(history.clone(), too_long_scheduler.as_str())
            .add_job(redlock_scheduler::JobSpec::new("j", "* * * * * *").handler("commit"))
            .await,
        NameKind::Scheduler,
        too_long_scheduler.len(),
        too_long_scheduler.len() - 1,
        "the admin of a scheduler named too long",
    );
    assert!(admin.job_changes(None, 10).await.unwrap().is_empty());

    let longest = "j".repeat(max);
    scheduler
        .add_job(redlock_scheduler::JobSpec::new(longest.as_str(), "* * * * * *").handler("commit"))
        .await
        .unwrap();
    until_succeeded(
        &history,
        Scheduler::DEFAULT_NAME,
        &longest,
        Duration::from_secs(15),
    )
    .await;
    let runs = history
        .runs(Scheduler::DEFAULT_NAME, &longest, 20)
        .await
        .unwrap();
    // No claim of it was refused (a refused claim ends as a skipped tick saying so).
    assert!(
        !runs.iter().any(|run| run.outcome == Outcome::Skipped
            && run.error.as_deref().unwrap_or("").contains("claim")),
        "a tick of the longest job could not be claimed: {runs:?}"
    );
    replica.shutdown().await;
}

/// `SchedulerBuilder::build` refuses a scheduler name one byte over its bound and a job
/// declared in code one byte over its; the longest of each runs its ticks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_names_declared_in_code_run_and_one_byte_more_is_refused_by_build() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let longest_scheduler = "s".repeat(max_scheduler_name_len(DEFAULT_MAX_RESOURCE_LEN));
    assert_eq!(longest_scheduler.len(), 485);
    let longest_job = "j".repeat(max_job_name_len(
        Scheduler::DEFAULT_NAME,
        DEFAULT_MAX_RESOURCE_LEN,
    ));
    assert_eq!(longest_job.len(), 477);
    let redlock = || redlock_testkit::builder(&cluster).build().unwrap();

    let refused = Scheduler::builder(redlock())
        .name(format!("{longest_scheduler}s"))
        .build();
    match refused {
        Err(BuildError::NameTooLong(NameTooLong {
            kind: NameKind::Scheduler,
            len: 486,
            max: 485,
            ..
        })) => {}
        other => panic!("a scheduler name of 486 bytes: {:?}", other.err()),
    }
    let refused = Scheduler::builder(redlock())
        .job(Job::new(
            format!("{longest_job}j"),
            "* * * * * *",
            committing,
        ))
        .build();
    match refused {
        Err(BuildError::NameTooLong(NameTooLong {
            kind: NameKind::Job,
            len: 478,
            max: 477,
            ..
        })) => {}
        other => panic!("a job name of 478 bytes: {:?}", other.err()),
    }
    // Beside the longest scheduler name, a job name of two bytes is one too many.
    let refused = Scheduler::builder(redlock())
        .name(longest_scheduler.as_str())
        .job(Job::new("jj", "* * * * * *", committing))
        .build();
    match refused {
        Err(BuildError::NameTooLong(NameTooLong {
            kind: NameKind::Job,
            len: 2,
            max: 1,
            ..
        })) => {}
        other => panic!("a job name of 2 bytes: {:?}", other.err()),
    }

    // The longest of each, declared in code, runs.
    let name = longest_scheduler.clone();
    let long_scheduler = Replica::start(
        &cluster,
        "long-scheduler",
        Some(url.clone()),
        vec![Job::new("j", "* * * * * *", committing)],
        move |b| b.name(name),
    )
    .await;
    let long_job = Replica::start(
        &cluster,
        "long-job",
        Some(url.clone()),
        vec![Job::new(longest_job.as_str(), "* * * * * *", committing)],
        |b| b,
    )
    .await;
    until_succeeded(&history, &longest_scheduler, "j", Duration::from_secs(15)).await;
    until_succeeded(
        &history,
        Scheduler::DEFAULT_NAME,
        &longest_job,
        Duration::from_secs(15),
    )
    .await;
    long_scheduler.shutdown().await;
    long_job.shutdown().await;
}

/// The bounds follow the client's own `max_resource_len`: with a client that takes
/// names of at most 100 bytes, `build` refuses a job name that the default bound would
/// take, and the longest name under 100 bytes runs its ticks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bounds_follow_the_clients_resource_name_limit() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let redlock = || {
        redlock_testkit::builder(&cluster)
            .max_resource_len(100)
            .build()
            .unwrap()
    };
    let max = max_job_name_len(Scheduler::DEFAULT_NAME, 100);
    assert_eq!(max, 100 - "scheduler".len() - 26);
    let refused = Scheduler::builder(redlock())
        .job(Job::new("j".repeat(max + 1), "* * * * * *", committing))
        .build();
    match refused {
        Err(BuildError::NameTooLong(NameTooLong {
            kind: NameKind::Job,
            len,
            max: m,
            ..
        })) if len == max + 1 && m == max => {}
        other => panic!("a job name of {} bytes: {:?}", max + 1, other.err()),
    }
    let longest = "j".repeat(max);
    let scheduler = Scheduler::builder(redlock())
        .history(history.clone())
        .job(Job::new(longest.as_str(), "* * * * * *", committing))
        .build()
        .unwrap();
    assert_eq!(scheduler.max_job_name_len(), max);
    let spec = redlock_scheduler::JobSpec::new("k".repeat(max + 1), "* * * * * *");
    assert_too_long(
        scheduler.add_job(spec).await,
        NameKind::Job,
        max + 1,
        max,
        "Scheduler::add_job under a 100-byte client limit",
    );
    scheduler.start();
    until_succeeded(
        &history,
        Scheduler::DEFAULT_NAME,
        &longest,
        Duration::from_secs(15),
    )
    .await;
    scheduler.shutdown(Duration::from_secs(5)).await;
}

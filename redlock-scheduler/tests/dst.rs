//! Each job's DST policy, through the scheduler: a replica against real redis-server
//! nodes and a SQLite history, its clock moved by hand across the 2026 transitions of
//! Berlin, New York and Lord Howe (and the night Mexico City would have fallen back
//! under its old rule). Four fixed-time jobs, one per policy, and an every-15-minutes
//! job run side by side; the history must hold exactly the ticks the policy says.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use redlock_scheduler::History;
use redlock_scheduler::history::Outcome;
use redlock_scheduler::time::{DstPolicy, Fold, Gap, ManualClock};
use redlock_testkit::{Cluster, require};

mod common;
use common::*;

const POLICIES: [DstPolicy; 4] = [
    DstPolicy::new(),
    DstPolicy::new().gap(Gap::Skip),
    DstPolicy::new().fold(Fold::Twice),
    DstPolicy::new().gap(Gap::Skip).fold(Fold::Twice),
];

/// What the night does to the fixed-time job's wall time.
#[derive(Debug, Clone, Copy)]
enum Night {
    /// It is in the gap; the gap ends at this instant.
    Gap(DateTime<Utc>),
    /// It is in the fold: its first and second pass.
    Fold(DateTime<Utc>, DateTime<Utc>),
    /// It happens once, at this instant (no transition).
    Plain(DateTime<Utc>),
}

impl Night {
    /// The fixed-time job's ticks that night under `policy`.
    fn ticks(self, policy: DstPolicy) -> Vec<DateTime<Utc>> {
        match (self, policy.gap, policy.fold) {
            (Self::Gap(end), Gap::RunAtEnd, _) => vec![end],
            (Self::Gap(_), _, _) => vec![],
            (Self::Fold(first, _), _, Fold::Once) => vec![first],
            (Self::Fold(first, second), _, _) => vec![first, second],
            (Self::Plain(tick), _, _) => vec![tick],
        }
    }
}

struct Case {
    zone: &'static str,
    /// A fixed-time expression whose wall time the night affects.
    fixed: &'static str,
    /// The transition (or where the old rule would have put it).
    change: DateTime<Utc>,
    night: Night,
}

fn hm(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

/// The nights, hand-computed (see `time::schedule`'s tests for the rules).
fn cases() -> Vec<Case> {
    vec![
        // 02:00 CET → 03:00 CEST at 01:00Z: 02:30 does not exist.
        Case {
            zone: "Europe/Berlin",
            fixed: "30 2 * * *",
            change: hm(2026, 3, 29, 1, 0),
            night: Night::Gap(hm(2026, 3, 29, 1, 0)),
        },
        // 03:00 CEST → 02:00 CET at 01:00Z: 02:30 CEST (00:30Z), 02:30 CET (01:30Z).
        Case {
            zone: "Europe/Berlin",
            fixed: "30 2 * * *",
            change: hm(2026, 10, 25, 1, 0),
            night: Night::Fold(hm(2026, 10, 25, 0, 30), hm(2026, 10, 25, 1, 30)),
        },
        // 02:00 EST → 03:00 EDT at 07:00Z.
        Case {
            zone: "America/New_York",
            fixed: "30 2 * * *",
            change: hm(2026, 3, 8, 7, 0),
            night: Night::Gap(hm(2026, 3, 8, 7, 0)),
        },
        // 02:00 EDT → 01:00 EST at 06:00Z: 01:30 EDT (05:30Z), 01:30 EST (06:30Z).
        Case {
            zone: "America/New_York",
            fixed: "30 1 * * *",
            change: hm(2026, 11, 1, 6, 0),
            night: Night::Fold(hm(2026, 11, 1, 5, 30), hm(2026, 11, 1, 6, 30)),
        },
        // 02:00 +11 → 01:30 +10:30 at 15:00Z: 01:45 at 14:45Z and, 30 minutes later,
        // 15:15Z.
        Case {
            zone: "Australia/Lord_Howe",
            fixed: "45 1 * * *",
            change: hm(2026, 4, 4, 15, 0),
            night: Night::Fold(hm(2026, 4, 4, 14, 45), hm(2026, 4, 4, 15, 15)),
        },
        // 02:00 +10:30 → 02:30 +11 at 15:30Z: 02:15 does not exist.
        Case {
            zone: "Australia/Lord_Howe",
            fixed: "15 2 * * *",
            change: hm(2026, 10, 3, 15, 30),
            night: Night::Gap(hm(2026, 10, 3, 15, 30)),
        },
        // The old rule's fall back (last Sunday of October, 02:00 CDT → 01:00 CST) is
        // gone since 2022: 01:30 CST happens once, at 07:30Z.
        Case {
            zone: "America/Mexico_City",
            fixed: "30 1 * * *",
            change: hm(2026, 10, 25, 7, 0),
            night: Night::Plain(hm(2026, 10, 25, 7, 30)),
        },
    ]
}

fn job_name(prefix: &str, policy: DstPolicy) -> String {
    format!("{prefix}-{}-{}", policy.gap, policy.fold)
}

/// Runs one night: the clock from just after `change - 1h` to `change + 1h`, stopping
/// at every instant a job should run, waiting for those runs; then the history's rows.
async fn night(cluster: &Cluster, case: &Case, url: &str) {
    let history = History::connect(url).await.unwrap();
    let prefix = unique("dst");
    // A scheduler name of its own: the database may be shared with other tests.
    let scheduler = format!("{prefix}-scheduler");
    let interval = format!("{prefix}-every-15-min");
    let ticks = Arc::new(Ticks::default());
    let start = case.change - chrono::Duration::minutes(59);
    let end = case.change + chrono::Duration::hours(1);
    let clock = ManualClock::new(start);
    let mut expected: Vec<(String, Vec<DateTime<Utc>>)> = Vec::new();
    let mut jobs = Vec::new();
    for policy in POLICIES {
        let name = job_name(&prefix, policy);
        jobs.push(
            counting_job(&name, case.fixed, &ticks, Duration::ZERO)
                .time_zone(case.zone)
                .dst(policy),
        );
        expected.push((name, case.night.ticks(policy)));
    }
    // Every quarter hour of UTC (each zone's offset is whole quarter hours), 8 of them.
    jobs.push(
        counting_job(&interval, "*/15 * * * *", &ticks, Duration::ZERO)
            .time_zone(case.zone)
            .dst(DstPolicy::new().gap(Gap::Skip).fold(Fold::Twice)),
    );
    let quarter = chrono::Duration::minutes(15);
    expected.push((
        interval.clone(),
        (1..=8)
            .map(|i| case.change - chrono::Duration::hours(1) + quarter * i)
            .collect(),
    ));
    let replica = {
        let clock = clock.clone();
        let scheduler = scheduler.clone();
        Replica::start(cluster, "dst", Some(url.to_owned()), jobs, move |b| {
            b.clock(clock).name(scheduler)
        })
        .await
    };
    leader_of(std::slice::from_ref(&replica), Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Every instant some job should run at, in order: set the clock there and wait for
    // those runs (and for every run to be over, so the next tick is no overlap).
    let mut stops: Vec<DateTime<Utc>> = expected.iter().flat_map(|(_, t)| t.clone()).collect();
    stops.sort();
    stops.dedup();
    for stop in stops {
        clock.set(stop);
        let due = expected.iter().filter(|(_, t)| t.contains(&stop)).count();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ran = ticks
                .snapshot()
                .get(&stop.timestamp_millis())
                .map_or(0, Vec::len);
            let idle = replica
                .scheduler
                .status()
                .await
                .jobs
                .iter()
                .all(|j| !j.running);
            if ran >= due && idle {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} {}: {ran} of {due} runs at {stop}",
                case.zone,
                case.change
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    clock.set(end + chrono::Duration::minutes(1));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The history: exactly the expected ticks per job, each succeeded, none skipped.
    let deadline = Instant::now() + Duration::from_secs(10);
    for (job, want) in &expected {
        loop {
            let mut runs = history.runs(&scheduler, job, 20).await.unwrap();
            runs.sort_by_key(|r| r.tick);
            let got: Vec<_> = runs.iter().map(|r| r.tick).collect();
            let done = runs.iter().all(|r| r.outcome == Outcome::Succeeded);
            if got == *want && done {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} {} {job}: rows {runs:?}, expected ticks {want:?}",
                case.zone,
                case.change
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // And the handlers' own record: each tick ran once, no other tick ran.
    let record = ticks.snapshot();
    let all: usize = expected.iter().map(|(_, t)| t.len()).sum();
    assert_eq!(
        record.values().map(Vec::len).sum::<usize>(),
        all,
        "{} {}: {record:?}",
        case.zone,
        case.change
    );
    // The status and the published definitions carry each job's policy.
    let status = replica.scheduler.status().await;
    for policy in POLICIES {
        let name = job_name(&prefix, policy);
        let job = status.jobs.iter().find(|j| j.name == name).unwrap();
        assert_eq!(job.dst, policy);
    }
    let admin = replica.scheduler.admin().unwrap();
    let published = admin.jobs().await.unwrap();
    for policy in POLICIES {
        let name = job_name(&prefix, policy);
        let job = published.iter().find(|j| j.name == name).unwrap();
        assert_eq!(job.dst, Some(policy), "{name}");
    }
    replica.shutdown().await;
    eprintln!(
        "{} {}: every policy's ticks as expected",
        case.zone, case.change
    );
}

/// Each policy across a spring-forward and a fall-back night of Berlin, New York and
/// Lord Howe, and Mexico City's former fall-back night: exactly the policy's runs in the
/// history (two rows for `Fold::Twice`, none for `Gap::Skip` on a gap night: the tick
/// does not exist, so nothing is run nor skipped), and a steady 15-minute cadence for
/// the interval job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_policy_runs_its_ticks_through_the_scheduler() {
    let cluster = Cluster::start(3).await;
    for case in cases() {
        let (_dir, url) = sqlite_url();
        night(&cluster, &case, &url).await;
    }
}

/// The same on PostgreSQL (the definitions' `dst` column, and the rows), for New
/// York's fall-back night: two runs of the `Fold::Twice` jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_policy_runs_its_ticks_through_the_scheduler_with_postgres() {
    let Some(url) = require::database_url() else {
        return;
    };
    let cluster = Cluster::start(3).await;
    let case = cases()
        .into_iter()
        .find(|c| c.zone == "America/New_York" && matches!(c.night, Night::Fold(..)))
        .unwrap();
    night(&cluster, &case, &url).await;
}

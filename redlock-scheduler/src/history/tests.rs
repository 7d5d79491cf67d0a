//! The batched writes of the runs table, on an in-memory SQLite database (the same
//! statements run on PostgreSQL in the integration tests).

use chrono::{TimeZone, Utc};

use super::{Change, History, NewRun, Outcome, RunEnd};

fn claim<'a>(job: &'a str, tick_s: i64, instance: &'a str) -> Change<'a> {
    Change::Claim(NewRun {
        scheduler: "s",
        job,
        tick: Utc.timestamp_opt(tick_s, 0).unwrap(),
        instance,
        token: 7,
        outcome: Outcome::Running,
        note: None,
        manual: false,
        at: Utc.timestamp_opt(tick_s, 0).unwrap(),
    })
}

#[tokio::test]
async fn a_batch_reports_each_change_and_refuses_a_second_claim_of_a_tick() {
    let history = History::connect("sqlite::memory:").await.unwrap();
    let applied = history
        .apply(&[
            claim("a", 60, "r1"),
            claim("b", 60, "r1"),
            // Another replica's claim of a tick already recorded: not applied.
            claim("a", 60, "r2"),
            Change::Finish(RunEnd {
                scheduler: "s",
                job: "a",
                tick: Utc.timestamp_opt(60, 0).unwrap(),
                instance: "r1",
                outcome: Outcome::Succeeded,
                error: None,
                at: Utc.timestamp_opt(61, 0).unwrap(),
            }),
            // The end of a run this replica never claimed changes nothing.
            Change::Finish(RunEnd {
                scheduler: "s",
                job: "b",
                tick: Utc.timestamp_opt(60, 0).unwrap(),
                instance: "r2",
                outcome: Outcome::Failed,
                error: Some("no"),
                at: Utc.timestamp_opt(61, 0).unwrap(),
            }),
        ])
        .await
        .unwrap();
    assert_eq!(applied, [true, true, false, true, false]);
    let a = history.runs("s", "a", 10).await.unwrap();
    assert_eq!(a.len(), 1);
    assert_eq!(
        (a[0].instance.as_str(), a[0].outcome),
        ("r1", Outcome::Succeeded)
    );
    let b = history.runs("s", "b", 10).await.unwrap();
    assert_eq!(
        (b[0].instance.as_str(), b[0].outcome),
        ("r1", Outcome::Running)
    );
}

#[tokio::test]
async fn an_empty_batch_is_a_no_op() {
    let history = History::connect("sqlite::memory:").await.unwrap();
    assert!(history.apply(&[]).await.unwrap().is_empty());
}

/// A timeout too long to make a deadline of is a configuration error, named; not a
/// panic in the pool, nor a statement timeout PostgreSQL refuses.
#[tokio::test]
async fn a_timeout_beyond_a_day_is_refused() {
    use std::time::Duration;

    use super::HistoryError as Error;
    use super::MAX_TIMEOUT;

    type Setter = fn(super::HistoryBuilder, Duration) -> super::HistoryBuilder;
    let options: [(&str, Setter); 3] = [
        ("connect timeout", super::HistoryBuilder::connect_timeout),
        ("acquire timeout", super::HistoryBuilder::acquire_timeout),
        (
            "statement timeout",
            super::HistoryBuilder::statement_timeout,
        ),
    ];
    for (what, set) in options {
        for too_long in [Duration::MAX, MAX_TIMEOUT + Duration::from_millis(1)] {
            match set(History::builder("sqlite::memory:"), too_long)
                .connect()
                .await
            {
                Err(Error::Config(crate::error::BuildError::InvalidOption {
                    what: option,
                    ..
                })) => {
                    assert_eq!(option, what);
                }
                Err(other) => panic!("{what} {too_long:?}: {other}"),
                Ok(_) => panic!("{what} {too_long:?}: accepted"),
            }
        }
        set(History::builder("sqlite::memory:"), MAX_TIMEOUT)
            .connect()
            .await
            .unwrap();
    }
}

fn finish<'a>(job: &'a str, tick_s: i64, outcome: Outcome, error: Option<&'a str>) -> Change<'a> {
    Change::Finish(RunEnd {
        scheduler: "s",
        job,
        tick: Utc.timestamp_opt(tick_s, 0).unwrap(),
        instance: "r1",
        outcome,
        error,
        at: Utc.timestamp_opt(tick_s + 1, 0).unwrap(),
    })
}

/// A run's end does not overwrite a `succeeded` row (the run's own transaction committed
/// it), unless it says `succeeded` too (adding a note); any other row it closes.
#[tokio::test]
async fn a_runs_end_does_not_overwrite_a_succeeded_row() {
    let history = History::connect("sqlite::memory:").await.unwrap();
    history
        .apply(&[claim("a", 60, "r1"), claim("b", 60, "r1")])
        .await
        .unwrap();
    let applied = history
        .apply(&[
            finish("a", 60, Outcome::Succeeded, None),
            finish("a", 60, Outcome::Cancelled, Some("leadership lost")),
            finish("a", 60, Outcome::Succeeded, Some("a note")),
            finish("b", 60, Outcome::Abandoned, Some("gone")),
            finish("b", 60, Outcome::Failed, Some("no")),
        ])
        .await
        .unwrap();
    assert_eq!(applied, [true, false, true, true, true]);
    let a = history
        .run_at("s", "a", Utc.timestamp_opt(60, 0).unwrap())
        .await;
    let a = a.unwrap().unwrap();
    assert_eq!(
        (a.outcome, a.error.as_deref()),
        (Outcome::Succeeded, Some("a note"))
    );
    let b = history.runs("s", "b", 1).await.unwrap();
    assert_eq!(b[0].outcome, Outcome::Failed);
}

/// Pruning keeps each job's latest row and its latest scheduled row (where a new leader
/// catches up from), by count and by age, also when manual runs came after it.
#[tokio::test]
async fn pruning_keeps_the_latest_scheduled_row() {
    let manual = |job, tick_s: i64| {
        let Change::Claim(mut run) = claim(job, tick_s, "r1") else {
            unreachable!("a claim")
        };
        run.manual = true;
        Change::Claim(run)
    };
    let rows = |job| {
        [
            claim(job, 10, "r1"),
            claim(job, 20, "r1"),
            manual(job, 30),
            manual(job, 40),
            finish(job, 10, Outcome::Succeeded, None),
            finish(job, 20, Outcome::Succeeded, None),
            finish(job, 30, Outcome::Succeeded, None),
            finish(job, 40, Outcome::Succeeded, None),
        ]
    };
    let by_count = History::builder("sqlite::memory:")
        .keep_runs(1)
        .connect()
        .await
        .unwrap();
    let by_age = History::builder("sqlite::memory:")
        .keep_for(std::time::Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    for history in [by_count, by_age] {
        history.apply(&rows("a")).await.unwrap();
        assert_eq!(history.prune("s", Utc::now()).await.unwrap(), 2);
        let kept: Vec<(i64, bool)> = history
            .runs("s", "a", 10)
            .await
            .unwrap()
            .iter()
            .map(|r| (r.tick.timestamp(), r.manual))
            .collect();
        assert_eq!(kept, [(40, true), (20, false)]);
        let last = history.last_tick("s", "a").await.unwrap();
        assert_eq!(last, Some(Utc.timestamp_opt(20, 0).unwrap()));
    }
}

//! One replica of a service with cron jobs: start the same binary several times and each
//! tick runs on exactly one of them.
//!
//! ```text
//! export REDLOCK_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/test
//! cargo run -p redlock-examples --bin scheduler -- --instance a &
//! cargo run -p redlock-examples --bin scheduler -- --instance b &
//! cargo run -p redlock-examples --bin scheduler -- --instance c &
//! ```
//!
//! Options: `--instance NAME` (default: a random id), `--for SECONDS` (stop after that
//! long; default: run until Ctrl-C). `REDLOCK_NODES` defaults to `redis://127.0.0.1:6379`;
//! `DATABASE_URL` to a SQLite file `scheduler-history.db` in the working directory.
//!
//! Each replica prints the ticks it runs and the leadership changes it sees; kill the
//! leader (Ctrl-C: a graceful hand-over; `kill -9`: a take-over after the leadership
//! TTL) and watch another one carry on. On exit it prints the last rows of the history.

use std::time::Duration;

use redlock_core::Redlock;
use redlock_scheduler::job::Misfire;
use redlock_scheduler::leader::LeaderEvent;
use redlock_scheduler::{History, Job, JobContext, Scheduler};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    redlock_examples::init_tracing();
    let mut instance = None;
    let mut run_for = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--instance" => instance = args.next(),
            "--for" => run_for = args.next().and_then(|s| s.parse::<u64>().ok()),
            other => {
                return Err(format!(
                    "unknown argument `{other}` (use --instance NAME, --for SECONDS)"
                )
                .into());
            }
        }
    }
    let nodes: Vec<String> = std::env::var("REDLOCK_NODES")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    let database = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "sqlite://scheduler-history.db".to_owned());

    let redlock = Redlock::builder()
        .nodes(nodes.clone())
        .ttl(Duration::from_secs(5))
        .build()?;
    redlock_examples::wait_until_ready(&redlock).await;
    let history = History::connect(&database).await?;
    let mut builder = Scheduler::builder(redlock)
        .name("example")
        .history(history.clone());
    if let Some(instance) = instance {
        builder = builder.instance(instance);
    }
    let scheduler = builder
        .job(
            Job::new(
                "every-second",
                "* * * * * *",
                |ctx: JobContext| async move {
                    println!(
                        "[{}] every-second  tick {}  token {}",
                        ctx.instance(),
                        ctx.tick().format("%H:%M:%S"),
                        ctx.fencing_token()
                    );
                    Ok::<_, BoxError>(())
                },
            )
            .misfire(Misfire::CatchUp { max: 5 }),
        )
        .job(
            Job::new("report", "*/10 * * * * *", |ctx: JobContext| async move {
                println!(
                    "[{}] report        tick {}  (2 s of work)",
                    ctx.instance(),
                    ctx.tick().format("%H:%M:%S")
                );
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(2)) => Ok(()),
                    () = ctx.cancelled() => Err::<(), BoxError>("cancelled".into()),
                }
            })
            .timeout(Duration::from_secs(8)),
        )
        .build()?;
    println!(
        "replica {} of scheduler `example`: {} Redis node(s), history in {}",
        scheduler.instance(),
        nodes.len(),
        database.split('@').next_back().unwrap_or_default()
    );
    scheduler.start();

    // Leadership changes, as they happen.
    let watcher = scheduler.leader_events().map(|mut events| {
        let instance = scheduler.instance().to_owned();
        tokio::spawn(async move {
            while events.changed().await.is_ok() {
                match &*events.borrow_and_update() {
                    LeaderEvent::Elected(l) => {
                        println!("[{instance}] leads now (epoch {})", l.epoch())
                    }
                    _ => println!("[{instance}] follows now"),
                }
            }
        })
    });

    match run_for {
        Some(secs) => tokio::time::sleep(Duration::from_secs(secs)).await,
        None => tokio::signal::ctrl_c().await?,
    }
    println!(
        "[{}] shutting down: handing leadership over, letting runs finish",
        scheduler.instance()
    );
    scheduler.shutdown(Duration::from_secs(10)).await;
    if let Some(watcher) = watcher {
        watcher.abort();
    }
    println!("\nlast runs:");
    for job in ["every-second", "report"] {
        for run in history.runs("example", job, 5).await? {
            println!(
                "  {:<13} {}  {:<10} {}",
                run.job,
                run.tick.format("%H:%M:%S"),
                run.instance,
                run.outcome.as_str()
            );
        }
    }
    Ok(())
}

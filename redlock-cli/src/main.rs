//! `redlock`: the command line for operators of services that use `redlock-core` locks
//! and the `redlock-scheduler` scheduler.
//!
//! - On the Redis nodes (`--nodes` / `REDLOCK_NODES`): `nodes` (each node's health),
//!   `locks [PREFIX]` (the locks held, their holders, validity and fencing tokens; the
//!   semaphores' permits and the read-write locks' writers and readers),
//!   `release KEY --force` (a forced release that makes the holder's token stale;
//!   `release --semaphore NAME --force`, `release --rw NAME --force` for every permit
//!   of a semaphore, for a read-write lock's writer and readers).
//! - On the scheduler's history database (`--database` / `DATABASE_URL`, scheduler
//!   `--scheduler` / `REDLOCK_SCHEDULER`): `jobs`, `history JOB`, `leader`,
//!   `pause JOB`, `resume JOB`, the requests a running replica carries out:
//!   `trigger JOB`, `cancel JOB`, `step-down` (waited for, or `--no-wait`), read back
//!   with `request ID`; and the jobs changed at run time, for every replica:
//!   `jobs add NAME --cron EXPR [--handler H] [--zone Z] [--misfire P] [--grace D]
//!   [--run-timeout D] [--dst GAP/FOLD] [--on-leader]`, `jobs reschedule NAME [the same
//!   options; only those given change]`, `jobs remove NAME`, `jobs changes [--job NAME]
//!   [--limit N]` (recorded as made by `--operator` / `REDLOCK_OPERATOR`, else `$USER`).
//! - On an idempotency store (`--store URL`: Redis, PostgreSQL or SQLite):
//!   `idempotency list` (the records the services' idempotency middleware keeps, by id
//!   prefix).
//!
//! Every command prints a table, or the same data as JSON with `--json`. Exit codes: 0
//! done; 1 an error, one line on stderr saying what failed and what to do; 2 a usage
//! error (also `release` without `--force`, `jobs reschedule` with nothing to change);
//! 3 a partial answer (`nodes`, `locks`, `release`: some nodes did not answer but a
//! majority did; the data is printed and the nodes named on stderr).

mod cli;
mod format;
mod idempotency;
mod nodes;
mod outcome;
mod scheduler;

use std::io::Write as _;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};

use crate::cli::{Cli, Command, IdempotencyCommand, JobsCommand};
use crate::outcome::{CliError, EXIT_FAILED, Report};

/// Whether `--key-prefix` was written on the command line (before or after the
/// command's name).
fn key_prefix_given(matches: &ArgMatches) -> bool {
    let mut level = Some(matches);
    while let Some(m) = level {
        if m.value_source("key_prefix") == Some(ValueSource::CommandLine) {
            return true;
        }
        level = m.subcommand().map(|(_, sub)| sub);
    }
    false
}
use crate::scheduler::{Ask, HistoryQuery};

fn main() -> ExitCode {
    // Usage errors exit with 2 here (and --help, --version with 0).
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    if matches!(cli.command, Command::Idempotency { .. }) && key_prefix_given(&matches) {
        return finish(Err(CliError::usage(
            "--key-prefix is the lock keys' prefix: an idempotency store's Redis key prefix is --redis-prefix",
        )));
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            return finish(Err(CliError::failed(format!(
                "cannot start the async runtime: {err}"
            ))));
        }
    };
    let result = runtime.block_on(run(cli));
    // Connections' background tasks are not waited for.
    runtime.shutdown_background();
    finish(result)
}

/// Runs the command.
async fn run(cli: Cli) -> Result<Report, CliError> {
    let global = &cli.global;
    match &cli.command {
        Command::Nodes => nodes::nodes(global).await,
        Command::Locks { prefix, limit } => {
            nodes::locks(global, prefix.as_deref().unwrap_or_default(), *limit).await
        }
        Command::Release {
            key,
            semaphore,
            rw,
            force,
        } => match (key, semaphore, rw) {
            (_, Some(name), _) => nodes::release_semaphore(global, name, *force).await,
            (_, _, Some(name)) => nodes::release_rw(global, name, *force).await,
            (Some(key), None, None) => nodes::release(global, key, *force).await,
            (None, None, None) => Err(CliError::usage(
                "name what to release: a KEY, --semaphore NAME or --rw NAME",
            )),
        },
        Command::Jobs {
            ticks,
            command: None,
        } => scheduler::jobs(global, *ticks).await,
        Command::Jobs {
            command: Some(command),
            ..
        } => match command {
            JobsCommand::Add {
                name,
                cron,
                options,
            } => scheduler::add_job(global, name, cron, options).await,
            JobsCommand::Reschedule {
                name,
                cron,
                options,
                no_run_timeout,
            } => {
                scheduler::reschedule_job(global, name, cron.as_deref(), options, *no_run_timeout)
                    .await
            }
            JobsCommand::Remove { name } => scheduler::remove_job(global, name).await,
            JobsCommand::Changes { job, limit } => {
                scheduler::job_changes(global, job.as_deref(), *limit).await
            }
        },
        Command::History {
            job,
            outcome,
            limit,
            since,
            until,
        } => {
            scheduler::history(
                global,
                HistoryQuery {
                    job,
                    outcome: *outcome,
                    limit: *limit,
                    since: *since,
                    until: *until,
                },
            )
            .await
        }
        Command::Leader => scheduler::leader(global).await,
        Command::Trigger { job, wait } => scheduler::request(global, Ask::Trigger(job), wait).await,
        Command::Pause { job } => scheduler::pause(global, job, true).await,
        Command::Resume { job } => scheduler::pause(global, job, false).await,
        Command::Cancel { job, wait } => scheduler::request(global, Ask::Cancel(job), wait).await,
        Command::StepDown { wait } => scheduler::request(global, Ask::StepDown, wait).await,
        Command::Request { id, wait } => scheduler::read_request(global, id, *wait).await,
        Command::Idempotency {
            command: IdempotencyCommand::List(list),
        } => idempotency::list(global, list).await,
    }
}

/// Writes the output and messages; the exit code.
fn finish(result: Result<Report, CliError>) -> ExitCode {
    let mut stderr = std::io::stderr().lock();
    match result {
        Ok(report) => {
            let mut stdout = std::io::stdout().lock();
            // A closed stdout (`| head`) is not an error worth a message.
            let _ = stdout
                .write_all(report.output.as_bytes())
                .and_then(|()| stdout.flush());
            for warning in &report.warnings {
                let _ = writeln!(stderr, "warning: {warning}");
            }
            if let Some(error) = &report.error {
                let _ = writeln!(stderr, "error: {error}");
            }
            ExitCode::from(report.code)
        }
        Err(err) => {
            let _ = writeln!(stderr, "error: {}", err.message);
            ExitCode::from(if err.code == 0 { EXIT_FAILED } else { err.code })
        }
    }
}

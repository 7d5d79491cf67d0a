//! `redlock`: the command line for operators of services that use `redlock-core` locks
//! and the `redlock-scheduler` scheduler.
//!
//! - On the Redis nodes (`--nodes` / `REDLOCK_NODES`): `nodes` (each node's health),
//!   `locks [PREFIX]` (the locks held, their holders, validity and fencing tokens),
//!   `release KEY --force` (a forced release that makes the holder's token stale).
//! - On the scheduler's history database (`--database` / `DATABASE_URL`, scheduler
//!   `--scheduler` / `REDLOCK_SCHEDULER`): `jobs`, `history JOB`, `leader`,
//!   `pause JOB`, `resume JOB`, and the requests a running replica carries out:
//!   `trigger JOB`, `cancel JOB`, `step-down` (waited for, or `--no-wait`), read back
//!   with `request ID`.
//!
//! Every command prints a table, or the same data as JSON with `--json`. Exit codes: 0
//! done; 1 an error, one line on stderr saying what failed and what to do; 2 a usage
//! error (also `release` without `--force`); 3 a partial answer (`nodes`, `locks`,
//! `release`: some nodes did not answer but a majority did; the data is printed and the
//! nodes named on stderr).

mod cli;
mod format;
mod nodes;
mod outcome;
mod scheduler;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::outcome::{CliError, EXIT_FAILED, Report};
use crate::scheduler::{Ask, HistoryQuery};

fn main() -> ExitCode {
    // Usage errors exit with 2 here (and --help, --version with 0).
    let cli = Cli::parse();
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
        Command::Release { key, force } => nodes::release(global, key, *force).await,
        Command::Jobs { ticks } => scheduler::jobs(global, *ticks).await,
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

//! The command line's grammar (clap derive): global options, commands, and the
//! parsers of their values (durations, times, outcomes).

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use redlock_core::builder::DEFAULT_KEY_PREFIX;
use redlock_scheduler::Scheduler;
use redlock_scheduler::admin::DEFAULT_NEXT_TICKS;
use redlock_scheduler::history::{DEFAULT_RUN_LIMIT, Outcome};
use redlock_scheduler::job::Misfire;
use redlock_scheduler::time::DstPolicy;

/// The environment variable listing the Redis nodes, as the services and examples read
/// it.
pub(crate) const NODES_ENV: &str = "REDLOCK_NODES";
/// The environment variable naming the scheduler's history database, as the services
/// and examples read it.
pub(crate) const DATABASE_ENV: &str = "DATABASE_URL";

/// What `--help` says about exit codes.
const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  error: one line on stderr saying what failed and what to do
  2  usage error (including `release` without --force, `jobs reschedule` with nothing
     to change)
  3  partial answer: `nodes`, `locks` or `release` reached a majority of the nodes but
     not all of them; the data is printed and the nodes that failed are named on stderr

Configuration: flags override the environment (REDLOCK_NODES, REDLOCK_KEY_PREFIX,
DATABASE_URL, REDLOCK_SCHEDULER, ...), the same variables the services read.";

/// `redlock`: look at and steer the locks held on the Redis nodes and the scheduler
/// whose history is in a database.
#[derive(Debug, Parser)]
#[command(
    name = "redlock",
    version,
    about = "Held locks, node health, forced releases, and the scheduler's jobs, history and controls.",
    after_help = EXIT_CODES
)]
pub(crate) struct Cli {
    /// Options every command takes.
    #[command(flatten)]
    pub(crate) global: Global,
    /// The command.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options every command takes (before or after the command's name).
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub(crate) struct Global {
    /// The Redis nodes, comma-separated: `redis://[user:password@]host:port[/db]` or
    /// rediss://... (needed by `nodes`, `locks`, `release`).
    #[arg(
        long,
        env = NODES_ENV,
        value_delimiter = ',',
        global = true,
        value_name = "URLS",
        hide_env_values = true
    )]
    pub(crate) nodes: Vec<String>,

    /// The prefix of the lock keys, as the services' clients set it.
    #[arg(long, env = "REDLOCK_KEY_PREFIX", default_value = DEFAULT_KEY_PREFIX, global = true, hide_env_values = true)]
    pub(crate) key_prefix: String,

    /// The services' longest lock TTL (their `max_ttl`, by default their TTL): how long
    /// a node that restarted is reported in restart quarantine.
    #[arg(
        long,
        env = "REDLOCK_MAX_TTL",
        default_value = "10s",
        value_parser = parse_duration,
        global = true,
        value_name = "DURATION",
        hide_env_values = true
    )]
    pub(crate) max_ttl: Duration,

    /// The scheduler's history database: sqlite://PATH or postgres://USER@HOST/DB
    /// (needed by the scheduler commands).
    #[arg(
        long,
        env = DATABASE_ENV,
        global = true,
        value_name = "URL",
        hide_env_values = true
    )]
    pub(crate) database: Option<String>,

    /// The scheduler's name (its `SchedulerBuilder::name`).
    #[arg(long, env = "REDLOCK_SCHEDULER", default_value = Scheduler::DEFAULT_NAME, global = true, hide_env_values = true)]
    pub(crate) scheduler: String,

    /// Who makes the scheduler requests (recorded with them); default: $USER.
    #[arg(long, env = "REDLOCK_OPERATOR", global = true, hide_env_values = true)]
    pub(crate) operator: Option<String>,

    /// How long one round trip to a node (listing locks) or to the database may take;
    /// node health and forced releases give each node at least 5s.
    #[arg(
        long,
        env = "REDLOCK_TIMEOUT",
        default_value = "5s",
        value_parser = parse_duration,
        global = true,
        value_name = "DURATION",
        hide_env_values = true
    )]
    pub(crate) timeout: Duration,

    /// Print JSON (the same data) instead of tables.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Each node's health: reachable, latency, quarantine, settings, warnings.
    ///
    /// Per node: whether it answers and how fast, the restart quarantine left (for
    /// clients whose longest TTL is --max-ttl), version, role, uptime, memory limit and
    /// eviction policy, persistence, and what puts locks at risk. Exit code 3 when some
    /// node did not answer but a majority did; 1 when fewer than a majority answered
    /// (the table is printed in both cases).
    Nodes,

    /// The locks held: holder, agreement, validity, fencing token, waiters; and the
    /// semaphores and read-write locks in use.
    ///
    /// Lists the locks on resources starting with PREFIX (all by default), sorted by
    /// name: who holds each, how many nodes hold it and whether they agree, the
    /// validity a majority still holds, the fencing counter, the waiters queued. Then
    /// the semaphores whose names start with PREFIX (permits used of their size, and
    /// each held slot's holder, validity and fencing token) and the read-write locks
    /// (writer, readers, whether a writer waits); their keys are not listed as locks.
    /// Exit code 3 when some node did not answer but a majority did; 1 when fewer than
    /// a majority answered.
    Locks {
        /// Only resources whose name starts with this (default: all).
        prefix: Option<String>,
        /// List at most this many locks (the first by name).
        #[arg(long, default_value_t = redlock_core::inspect::DEFAULT_LIST_LIMIT)]
        limit: usize,
    },

    /// Releases the lock of KEY (or a semaphore's permits, or a read-write lock) by
    /// force, making its holder's token stale.
    ///
    /// Deletes the lock on every node whoever holds it and raises the resource's
    /// fencing counter above every token handed out, so that storage checking tokens
    /// rejects the old holder's writes. The holder is not told: it learns at its next
    /// extension. With --semaphore NAME, every permit of the semaphore is released so
    /// (each slot's counter raised); with --rw NAME, the read-write lock's writer and
    /// every reader, and the waiting writers' queue (the writer's counter raised).
    /// Refused (exit code 2) without --force. Exit code 3 when a majority but not every
    /// node was reached.
    Release {
        /// The resource (as `locks` lists it, without the key prefix).
        #[arg(
            required_unless_present_any = ["semaphore", "rw"],
            conflicts_with_all = ["semaphore", "rw"]
        )]
        key: Option<String>,
        /// Release every permit of the semaphore NAME instead (as `locks` lists it).
        #[arg(long, value_name = "NAME", conflicts_with = "rw")]
        semaphore: Option<String>,
        /// Release the read-write lock NAME instead: its writer and every reader.
        #[arg(long, value_name = "NAME")]
        rw: Option<String>,
        /// Do it.
        #[arg(long)]
        force: bool,
    },

    /// The scheduler's jobs: schedule, zone, pause, run going, next tick, last run;
    /// and jobs added, rescheduled and removed at run time (`jobs add`, ...).
    ///
    /// Without a subcommand: the jobs the scheduler's replicas published in the
    /// history database (those declared in code when they started, and those added or
    /// rescheduled since), with their next ticks (computed in each job's time zone),
    /// whether they are paused or running, and their latest run; and the leader now
    /// (or the last one, if none leads).
    #[command(args_conflicts_with_subcommands = true)]
    Jobs {
        /// How many next ticks to compute per job (the table shows the first).
        #[arg(long, default_value_t = DEFAULT_NEXT_TICKS, value_name = "N")]
        ticks: usize,
        /// Change the jobs at run time, or list the changes.
        #[command(subcommand)]
        command: Option<JobsCommand>,
    },

    /// The runs of JOB, newest first.
    History {
        /// The job.
        job: String,
        /// Only runs that ended so.
        #[arg(long, value_parser = outcome_parser())]
        outcome: Option<Outcome>,
        /// At most this many runs (at most 1000).
        #[arg(long, default_value_t = DEFAULT_RUN_LIMIT)]
        limit: u32,
        /// Only ticks at or after this time: RFC 3339 (2024-05-01T10:00:00Z) or a
        /// duration ago (90m, 2h, 1d).
        #[arg(long, value_parser = parse_time, value_name = "TIME")]
        since: Option<DateTime<Utc>>,
        /// Only ticks at or before this time (as --since).
        #[arg(long, value_parser = parse_time, value_name = "TIME")]
        until: Option<DateTime<Utc>>,
    },

    /// The leader now: replica, epoch, since when; or, if none leads, the last one and
    /// whether it ended its leadership (stepped down, shut down) or stopped renewing
    /// its record (crashed).
    Leader,

    /// Has the leader run JOB once now, and prints the result.
    ///
    /// A request row the leader takes within about half a second; the run is recorded
    /// as manual. Waits for the result (--wait) unless --no-wait. Exit code 1 if the
    /// request failed (a run still going, say) or was not carried out in time.
    Trigger {
        /// The job.
        job: String,
        /// How to wait for the result.
        #[command(flatten)]
        wait: Wait,
    },

    /// Pauses JOB for every replica: its ticks are skipped until `resume`.
    Pause {
        /// The job.
        job: String,
    },

    /// Fires JOB again after `pause`.
    Resume {
        /// The job.
        job: String,
    },

    /// Cancels the run of JOB going now, and prints the result.
    ///
    /// The replica running it cancels it; the run ends as cancelled by an operator.
    /// Exit code 1 if no run was going.
    Cancel {
        /// The job.
        job: String,
        /// How to wait for the result.
        #[command(flatten)]
        wait: Wait,
    },

    /// Has the leader give up leadership, so that another replica takes over.
    ///
    /// The leader hands its lock over and keeps out of the election for a while; runs
    /// going on it go on.
    StepDown {
        /// How to wait for the result.
        #[command(flatten)]
        wait: Wait,
    },

    /// Where a request made by `trigger`, `cancel` or `step-down` stands.
    Request {
        /// The request's id.
        id: String,
        /// Wait this long for it to be done (default: do not wait).
        #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
        wait: Option<Duration>,
    },

    /// The idempotency records the services' idempotency middleware keeps.
    Idempotency {
        /// What to do with them.
        #[command(subcommand)]
        command: IdempotencyCommand,
    },
}

/// The `jobs` subcommands: jobs changed at run time, for every replica of the
/// scheduler, recorded in its history with the operator's name.
#[derive(Debug, Subcommand)]
pub(crate) enum JobsCommand {
    /// Adds the job NAME at run time, for every replica: the cron --cron running the
    /// handler --handler.
    ///
    /// Recorded in the history, it reaches every replica within a second; the leader
    /// fires its ticks after the time of the change. The handler (the job's name
    /// unless --handler) must be registered (`SchedulerBuilder::handler`) on a replica
    /// alive in the last minute. Exit code 1 if a job of this name is there already,
    /// the schedule or an option cannot work, or no live replica has the handler.
    Add {
        /// The job's name.
        name: String,
        /// Its cron expression: 5 fields, or 6 with seconds first (`0 */5 * * * *`).
        #[arg(long, value_name = "EXPR")]
        cron: String,
        /// Its settings.
        #[command(flatten)]
        options: JobOptions,
    },

    /// Changes the schedule or settings of the job NAME at run time: only the options
    /// given change.
    ///
    /// The others keep the definition in force. The old schedule's ticks the leader fired before it saw the change stand; the
    /// new one fires its ticks after the time of the change, a tick both have runs
    /// once. Exit code 1 if there is no such job, or the new definition cannot work;
    /// 2 if no option is given.
    Reschedule {
        /// The job's name.
        name: String,
        /// Another cron expression.
        #[arg(long, value_name = "EXPR")]
        cron: Option<String>,
        /// Its settings to change.
        #[command(flatten)]
        options: JobOptions,
        /// No run timeout any more.
        #[arg(long, conflicts_with = "run_timeout")]
        no_run_timeout: bool,
    },

    /// Removes the job NAME at run time, from every replica.
    ///
    /// No tick of it fires once the leader sees the change; a run going on finishes
    /// (`redlock cancel NAME` first to stop it). A job declared in code stays removed when its replicas start again, until it is
    /// added again. Exit code 1 if there is no such job.
    Remove {
        /// The job's name.
        name: String,
    },

    /// The jobs' changes made at run time, newest first: who changed which job when,
    /// schedule before → after.
    Changes {
        /// Only the changes of this job.
        #[arg(long, value_name = "NAME")]
        job: Option<String>,
        /// At most this many changes (at most 1000).
        #[arg(long, default_value_t = DEFAULT_RUN_LIMIT, value_name = "N")]
        limit: u32,
    },
}

/// A job's settings for `jobs add` and `jobs reschedule` (not given: the default for
/// `add`, unchanged for `reschedule`).
#[derive(Debug, Args)]
pub(crate) struct JobOptions {
    /// The handler to run, by the name the replicas registered it under (`add`:
    /// default the job's name).
    #[arg(long, value_name = "NAME")]
    pub(crate) handler: Option<String>,
    /// The IANA time zone the cron expression is read in (`add`: default UTC).
    #[arg(long, value_name = "ZONE")]
    pub(crate) zone: Option<String>,
    /// What to do with missed ticks: skip, run_once (`add`: the default) or
    /// catch_up:N (run up to N of them).
    #[arg(long, value_parser = parse_misfire, value_name = "POLICY")]
    pub(crate) misfire: Option<Misfire>,
    /// How late a tick may still run (`add`: default 1m).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) grace: Option<Duration>,
    /// How long a run may take before it is cancelled (`add`: default none). Not
    /// `--timeout`: that one is the database's.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) run_timeout: Option<Duration>,
    /// The daylight saving policy of fixed-time ticks, `<gap>/<fold>`: gap run_at_end
    /// or skip, fold once or twice (`add`: default run_at_end/once).
    #[arg(long, value_parser = DstPolicy::from_str, value_name = "GAP/FOLD")]
    pub(crate) dst: Option<DstPolicy>,
    /// Run it on the leader only (`--on-leader=false`: on any replica, the default
    /// for `add`).
    #[arg(
        long,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub(crate) on_leader: Option<bool>,
}

/// The `idempotency` commands.
#[derive(Debug, Subcommand)]
pub(crate) enum IdempotencyCommand {
    /// The records whose id starts with --prefix, in id order: state, fencing token,
    /// start, status, body size, expiry.
    ///
    /// Reads the store the services write to (--store): a Redis (`redis://`,
    /// `rediss://`; keys `idempotency:<id>` unless --redis-prefix) or a SQL database
    /// (`postgres://`, `postgresql://`, `sqlite:`; the table `redlock_idempotency`
    /// unless --table). A record's id is its scope and its key. Expired records are
    /// not listed.
    List(IdempotencyList),
}

/// `idempotency list`'s options.
#[derive(Debug, Args)]
pub(crate) struct IdempotencyList {
    /// The idempotency store: redis://HOST:PORT/DB, rediss://...,
    /// postgres://USER@HOST/DB, postgresql://..., sqlite://PATH.
    #[arg(long, value_name = "URL")]
    pub(crate) store: String,
    /// Only records whose id starts with this (default: all).
    #[arg(long, value_name = "PREFIX")]
    pub(crate) prefix: Option<String>,
    /// List at most this many records (the first by id).
    #[arg(long, default_value_t = redlock_core::inspect::DEFAULT_LIST_LIMIT, value_name = "N")]
    pub(crate) limit: usize,
    /// A SQL store's table, as the services name it (default `redlock_idempotency`).
    #[arg(long, value_name = "TABLE")]
    pub(crate) table: Option<String>,
    /// A Redis store's key prefix, as the services set it (default `idempotency:`).
    /// Not `--key-prefix`: that one is the lock keys' prefix.
    #[arg(long, value_name = "PREFIX")]
    pub(crate) redis_prefix: Option<String>,
}

/// How a command that makes a request waits for its result.
#[derive(Debug, Args)]
pub(crate) struct Wait {
    /// Wait this long for a replica to carry the request out.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) wait: Duration,
    /// Print the request's id at once, without waiting (follow it with `redlock request
    /// ID`).
    #[arg(long, conflicts_with = "wait")]
    pub(crate) no_wait: bool,
}

/// The outcomes `--outcome` accepts.
fn outcome_parser() -> impl TypedValueParser<Value = Outcome> {
    PossibleValuesParser::new([
        "running",
        "succeeded",
        "failed",
        "timed_out",
        "cancelled",
        "skipped",
        "abandoned",
    ])
    .try_map(|s| Outcome::from_str(&s))
}

/// A misfire policy: `skip`, `run_once` or `catch_up:N`.
pub(crate) fn parse_misfire(text: &str) -> Result<Misfire, String> {
    match text.trim() {
        "skip" => Ok(Misfire::Skip),
        "run_once" => Ok(Misfire::RunOnce),
        other => other
            .strip_prefix("catch_up:")
            .and_then(|max| max.trim().parse().ok())
            .map(|max| Misfire::CatchUp { max })
            .ok_or_else(|| {
                format!("`{text}` is not a misfire policy: write skip, run_once or catch_up:N (N a whole number)")
            }),
    }
}

/// A duration: a number with a unit (`500ms`, `10s`, `5m`, `2h`, `1d`), several added
/// up (`1m30s`), or a plain number of seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let invalid = || format!("`{text}` is not a duration: write e.g. 500ms, 10s, 5m, 2h, 1d");
    if text.is_empty() {
        return Err(invalid());
    }
    if let Ok(seconds) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).map_err(|_| invalid());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let number: f64 = number.parse().map_err(|_| invalid())?;
        let scale = match unit.trim() {
            "ms" => 0.001,
            "s" | "sec" | "secs" => 1.0,
            "m" | "min" | "mins" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            _ => return Err(invalid()),
        };
        let part = Duration::try_from_secs_f64(number * scale).map_err(|_| invalid())?;
        total = total.checked_add(part).ok_or_else(invalid)?;
        rest = tail;
    }
    Ok(total)
}

/// A time: RFC 3339, or a duration before now.
pub(crate) fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(time) = DateTime::parse_from_rfc3339(text.trim()) {
        return Ok(time.to_utc());
    }
    let ago = parse_duration(text).map_err(|_| {
        format!("`{text}` is neither an RFC 3339 time (2024-05-01T10:00:00Z) nor a duration ago (90m, 2h, 1d)")
    })?;
    chrono::Duration::from_std(ago)
        .ok()
        .and_then(|ago| Utc::now().checked_sub_signed(ago))
        .ok_or_else(|| format!("`{text}` is too long ago"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("10").is_ok());
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("-1").is_err());
    }

    #[test]
    fn times() {
        let t = parse_time("2024-05-01T10:00:00+02:00").unwrap();
        assert_eq!(t.to_rfc3339(), "2024-05-01T08:00:00+00:00");
        let ago = parse_time("1h").unwrap();
        let diff = Utc::now() - ago;
        assert!((diff.num_seconds() - 3600).abs() <= 5);
        assert!(parse_time("yesterday").is_err());
    }

    #[test]
    fn misfire_policies() {
        assert_eq!(parse_misfire("skip"), Ok(Misfire::Skip));
        assert_eq!(parse_misfire("run_once"), Ok(Misfire::RunOnce));
        assert_eq!(parse_misfire("catch_up:3"), Ok(Misfire::CatchUp { max: 3 }));
        assert!(parse_misfire("catch_up").is_err());
        assert!(parse_misfire("catch_up:-1").is_err());
        assert!(parse_misfire("always").is_err());
    }

    #[test]
    fn job_options_parse() {
        let cli = Cli::try_parse_from([
            "redlock",
            "jobs",
            "add",
            "export",
            "--cron",
            "0 */5 * * * *",
            "--handler",
            "work",
            "--zone",
            "Europe/Paris",
            "--misfire",
            "catch_up:2",
            "--grace",
            "30s",
            "--run-timeout",
            "1m",
            "--dst",
            "skip/twice",
            "--on-leader",
        ])
        .unwrap();
        let Command::Jobs {
            command:
                Some(JobsCommand::Add {
                    name,
                    cron,
                    options,
                }),
            ..
        } = cli.command
        else {
            panic!("{cli:?}");
        };
        assert_eq!((name.as_str(), cron.as_str()), ("export", "0 */5 * * * *"));
        assert_eq!(options.misfire, Some(Misfire::CatchUp { max: 2 }));
        assert_eq!(options.grace, Some(Duration::from_secs(30)));
        assert_eq!(options.run_timeout, Some(Duration::from_secs(60)));
        assert_eq!(options.on_leader, Some(true));
        assert_eq!(
            options.dst.map(|d| d.to_string()).as_deref(),
            Some("skip/twice")
        );
        let cli = Cli::try_parse_from([
            "redlock",
            "jobs",
            "reschedule",
            "export",
            "--on-leader=false",
            "--no-run-timeout",
        ])
        .unwrap();
        let Command::Jobs {
            command:
                Some(JobsCommand::Reschedule {
                    options,
                    no_run_timeout,
                    cron,
                    ..
                }),
            ..
        } = cli.command
        else {
            panic!("{cli:?}");
        };
        assert_eq!(
            (options.on_leader, no_run_timeout, cron),
            (Some(false), true, None)
        );
        // `jobs` alone lists them; the list's option does not go with a subcommand.
        assert!(Cli::try_parse_from(["redlock", "jobs", "--ticks", "3"]).is_ok());
        assert!(Cli::try_parse_from(["redlock", "jobs", "--json"]).is_ok());
        assert!(
            Cli::try_parse_from(["redlock", "jobs", "changes", "--json", "--limit", "3"]).is_ok()
        );
        assert!(Cli::try_parse_from(["redlock", "jobs", "--ticks", "3", "remove", "x"]).is_err());
        assert!(Cli::try_parse_from(["redlock", "jobs", "add", "x"]).is_err());
        assert!(
            Cli::try_parse_from([
                "redlock",
                "jobs",
                "add",
                "x",
                "--cron",
                "* * * * *",
                "--misfire",
                "often"
            ])
            .is_err()
        );
        assert!(
            Cli::try_parse_from([
                "redlock",
                "jobs",
                "reschedule",
                "x",
                "--run-timeout",
                "1s",
                "--no-run-timeout"
            ])
            .is_err()
        );
    }

    #[test]
    fn grammar_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

//! The history's tables and their versioned migrations.
//!
//! Table names carry a configurable prefix (default `redlock_`) and, on PostgreSQL, an
//! optional schema. Migrations are numbered; each database records the ones it applied in
//! `<prefix>scheduler_migrations`. They run in one transaction that first takes a lock
//! every other replica waits on: `pg_advisory_xact_lock` on PostgreSQL (DDL is
//! transactional there, so a migration applies entirely or not at all), `BEGIN IMMEDIATE`
//! on SQLite. Many replicas starting at once on a fresh database therefore migrate it
//! exactly once, one after the other.

use redlock_fence::SqlFence;
use sqlx::AnyConnection;

use super::Db;
use super::HistoryError as Error;
use super::target::Backend;
use crate::error::history::DatabaseError;

/// The history's table names, prefix and schema applied.
#[derive(Debug, Clone)]
pub(crate) struct Tables {
    pub(crate) schema: Option<String>,
    pub(crate) runs: String,
    pub(crate) leaders: String,
    pub(crate) pauses: String,
    /// The job definitions replicas publish (for admin tools without them).
    pub(crate) jobs: String,
    /// Operators' requests (trigger, cancel, step down) and their results.
    pub(crate) requests: String,
    /// The highest run token that wrote through a run's transaction, per job.
    pub(crate) fences: String,
    /// The replicas alive, with their capacity for runs and the runs they have going.
    pub(crate) replicas: String,
    /// Ticks the leader handed to another replica to run, until that replica takes them.
    pub(crate) dispatch: String,
    /// Jobs added, rescheduled and removed at run time, in the order they were made.
    pub(crate) changes: String,
    pub(crate) migrations: String,
    /// The bare prefix (index and constraint names).
    prefix: String,
}

/// The fence over `table` (a name these tables made: a plain identifier, optionally
/// schema-qualified).
pub(crate) fn fence(table: &str) -> SqlFence {
    SqlFence::with_table(table).unwrap_or_default()
}

/// The default table prefix.
pub const DEFAULT_TABLE_PREFIX: &str = "redlock_";

/// Whether `name` is a plain SQL identifier (letters, digits, `_`; not starting with a
/// digit), safe to splice into statements.
pub(crate) fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 40
}

impl Tables {
    pub(crate) fn new(prefix: &str, schema: Option<&str>) -> Self {
        let qualify = |name: &str| match schema {
            Some(schema) => format!("{schema}.{prefix}{name}"),
            None => format!("{prefix}{name}"),
        };
        Self {
            schema: schema.map(str::to_owned),
            runs: qualify("job_runs"),
            leaders: qualify("scheduler_leaders"),
            pauses: qualify("job_pauses"),
            jobs: qualify("scheduler_jobs"),
            requests: qualify("scheduler_requests"),
            fences: qualify("job_fences"),
            replicas: qualify("scheduler_replicas"),
            dispatch: qualify("scheduler_dispatch"),
            changes: qualify("scheduler_job_changes"),
            migrations: qualify("scheduler_migrations"),
            prefix: prefix.to_owned(),
        }
    }

    /// A number every replica using these tables derives alike (the advisory lock key).
    fn lock_key(&self) -> i64 {
        // FNV-1a: stable across processes and builds (unlike std's hasher).
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.migrations.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        i64::from_ne_bytes(hash.to_ne_bytes())
    }

    /// The migrations, in order: (version, statements).
    fn migrations(&self) -> Vec<(i64, Vec<String>)> {
        let Self {
            runs,
            leaders,
            pauses,
            jobs,
            requests,
            fences,
            replicas,
            dispatch,
            changes,
            prefix,
            ..
        } = self;
        // The name a table gets back after a rebuild (no schema: same one).
        let runs_bare = format!("{prefix}job_runs");
        let runs_new = match &self.schema {
            Some(schema) => format!("{schema}.{prefix}job_runs_next"),
            None => format!("{prefix}job_runs_next"),
        };
        vec![
            (
                1,
                vec![format!(
                    "CREATE TABLE IF NOT EXISTS {runs} (
                        job TEXT NOT NULL,
                        tick_ms BIGINT NOT NULL,
                        instance TEXT NOT NULL,
                        fencing_token BIGINT,
                        started_ms BIGINT,
                        finished_ms BIGINT,
                        outcome TEXT NOT NULL,
                        error TEXT,
                        CONSTRAINT {prefix}job_runs_tick UNIQUE (job, tick_ms)
                    )"
                )],
            ),
            (
                2,
                vec![format!(
                    "CREATE TABLE IF NOT EXISTS {leaders} (
                        scheduler TEXT NOT NULL PRIMARY KEY,
                        instance TEXT NOT NULL,
                        epoch BIGINT NOT NULL,
                        since_ms BIGINT NOT NULL
                    )"
                )],
            ),
            (
                3,
                vec![format!(
                    "CREATE TABLE IF NOT EXISTS {pauses} (
                        scheduler TEXT NOT NULL,
                        job TEXT NOT NULL,
                        PRIMARY KEY (scheduler, job)
                    )"
                )],
            ),
            // Runs are keyed by scheduler name too (two schedulers with the same job names
            // share a database without blocking each other), say whether the schedule or
            // a manual trigger started them, and who closed a run its replica left
            // behind. Rows from before belong to the one scheduler that recorded a leader,
            // or to the default name.
            (
                4,
                vec![
                    format!(
                        "CREATE TABLE {runs_new} (
                            scheduler TEXT NOT NULL,
                            job TEXT NOT NULL,
                            tick_ms BIGINT NOT NULL,
                            instance TEXT NOT NULL,
                            fencing_token BIGINT,
                            started_ms BIGINT,
                            finished_ms BIGINT,
                            outcome TEXT NOT NULL,
                            error TEXT,
                            manual INTEGER NOT NULL DEFAULT 0,
                            closed_by TEXT,
                            CONSTRAINT {prefix}job_runs_key UNIQUE (scheduler, job, tick_ms)
                        )"
                    ),
                    format!(
                        "INSERT INTO {runs_new}
                            (scheduler, job, tick_ms, instance, fencing_token, started_ms,
                             finished_ms, outcome, error)
                         SELECT (SELECT CASE WHEN COUNT(*) = 1 THEN MAX(scheduler)
                                             ELSE 'scheduler' END FROM {leaders}),
                                job, tick_ms, instance, fencing_token, started_ms,
                                finished_ms, outcome, error
                         FROM {runs}"
                    ),
                    format!("DROP TABLE {runs}"),
                    format!("ALTER TABLE {runs_new} RENAME TO {runs_bare}"),
                    format!("CREATE INDEX {prefix}job_runs_outcome ON {runs} (scheduler, outcome)"),
                ],
            ),
            // What admin tools need without the jobs' code: each replica publishes its
            // job definitions; operators' requests wait for the replica that can carry
            // them out (ids are random, made by the caller: no auto-increment to differ
            // between databases).
            (
                5,
                vec![
                    format!(
                        "CREATE TABLE IF NOT EXISTS {jobs} (
                            scheduler TEXT NOT NULL,
                            job TEXT NOT NULL,
                            schedule TEXT NOT NULL,
                            time_zone TEXT NOT NULL,
                            misfire TEXT NOT NULL,
                            timeout_ms BIGINT,
                            updated_ms BIGINT NOT NULL,
                            updated_by TEXT NOT NULL,
                            PRIMARY KEY (scheduler, job)
                        )"
                    ),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {requests} (
                            id TEXT NOT NULL PRIMARY KEY,
                            scheduler TEXT NOT NULL,
                            job TEXT,
                            action TEXT NOT NULL,
                            requested_ms BIGINT NOT NULL,
                            requested_by TEXT NOT NULL,
                            done_ms BIGINT,
                            done_by TEXT,
                            result TEXT
                        )"
                    ),
                    format!(
                        "CREATE INDEX {prefix}scheduler_requests_pending
                         ON {requests} (scheduler, done_ms, requested_ms)"
                    ),
                ],
            ),
            // 6: the fence that runs' transactions check (see `JobContext::transaction`).
            (6, vec![fence(fences).create_table_statement()]),
            // 7: the leader's record says whether its leadership goes on: a lease it
            // renews while it leads (`expires_ms`) and when it ended (`ended_ms`), both
            // written for the epoch in `lease_epoch` (a replica that keeps no lease
            // rewrites the rest of the row and leaves them behind).
            (
                7,
                vec![
                    format!("ALTER TABLE {leaders} ADD COLUMN lease_epoch BIGINT"),
                    format!("ALTER TABLE {leaders} ADD COLUMN expires_ms BIGINT"),
                    format!("ALTER TABLE {leaders} ADD COLUMN ended_ms BIGINT"),
                ],
            ),
            // 8: each job's daylight saving policy (`DstPolicy`'s text), published with
            // its definition so that admin tools compute the same ticks. NULL in rows
            // written before, or by a replica that knows no policy: the default one.
            (8, vec![format!("ALTER TABLE {jobs} ADD COLUMN dst TEXT")]),
            // 9: runs spread over the replicas. Each replica says it is alive, how many
            // runs it takes at once (`capacity`, NULL: no limit), how many it has going
            // (those it picked up included), the newest hand-off it picked up
            // (`polled_ms`, the leader's clock) and which jobs it declares (a digest of
            // their names); the leader hands a claimed tick to one of them with a row in the
            // dispatch table, which the replica deletes when it takes the tick (or marks
            // `declined_by`), so a row is taken by one replica at most.
            (
                9,
                vec![
                    format!(
                        "CREATE TABLE IF NOT EXISTS {replicas} (
                            scheduler TEXT NOT NULL,
                            instance TEXT NOT NULL,
                            capacity BIGINT,
                            running BIGINT NOT NULL,
                            jobs_digest TEXT NOT NULL,
                            polled_ms BIGINT NOT NULL,
                            seen_ms BIGINT NOT NULL,
                            PRIMARY KEY (scheduler, instance)
                        )"
                    ),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {dispatch} (
                            scheduler TEXT NOT NULL,
                            job TEXT NOT NULL,
                            tick_ms BIGINT NOT NULL,
                            replica TEXT NOT NULL,
                            fencing_token BIGINT NOT NULL,
                            dispatched_ms BIGINT NOT NULL,
                            declined_by TEXT,
                            PRIMARY KEY (scheduler, job, tick_ms)
                        )"
                    ),
                    format!(
                        "CREATE INDEX {prefix}scheduler_dispatch_replica
                         ON {dispatch} (scheduler, replica)"
                    ),
                ],
            ),
            // 10: jobs changed at run time. Each change is a row numbered per scheduler
            // (`seq`, the next number taken by whoever writes it: two writers of one
            // number conflict, and the later one reads again and retries), with the
            // definition it puts in force and the one it replaced (JSON), who made it
            // and when; every replica applies them in order. The published definitions
            // gain what a change needs to restate a job: its handler's name, grace and
            // whether it runs on the leader; beside each replica's beat, the names of
            // the handlers registered on it (so that a change names one that exists;
            // NULL: a version without job changes, '': not said yet).
            (
                10,
                vec![
                    format!(
                        "CREATE TABLE IF NOT EXISTS {changes} (
                            scheduler TEXT NOT NULL,
                            seq BIGINT NOT NULL,
                            job TEXT NOT NULL,
                            action TEXT NOT NULL,
                            definition TEXT,
                            previous TEXT,
                            changed_by TEXT NOT NULL,
                            changed_ms BIGINT NOT NULL,
                            PRIMARY KEY (scheduler, seq)
                        )"
                    ),
                    format!("ALTER TABLE {jobs} ADD COLUMN handler TEXT"),
                    format!("ALTER TABLE {jobs} ADD COLUMN grace_ms BIGINT"),
                    format!("ALTER TABLE {jobs} ADD COLUMN on_leader BIGINT"),
                    format!("ALTER TABLE {replicas} ADD COLUMN handlers TEXT"),
                ],
            ),
        ]
    }
}

/// Brings the schema up to date on `conn`, under the migration lock.
pub(crate) async fn migrate(
    conn: &mut AnyConnection,
    backend: Backend,
    tables: &Tables,
    now_ms: i64,
) -> Result<(), Error> {
    use sqlx::Connection;

    let begin = match backend {
        Backend::Sqlite => "BEGIN IMMEDIATE",
        Backend::Postgres => "BEGIN",
    };
    let mut tx = conn.begin_with(begin).await.db()?;
    if backend == Backend::Postgres {
        sqlx::query("SELECT 1 FROM (SELECT pg_advisory_xact_lock($1)) AS migration_lock")
            .bind(tables.lock_key())
            .execute(&mut *tx)
            .await
            .db()?;
        if let Some(schema) = &tables.schema {
            sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
                .execute(&mut *tx)
                .await
                .db()?;
        }
    }
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {} (
            version BIGINT NOT NULL PRIMARY KEY,
            applied_ms BIGINT NOT NULL
        )",
        tables.migrations
    ))
    .execute(&mut *tx)
    .await
    .db()?;
    let applied: Vec<i64> =
        sqlx::query_scalar(&format!("SELECT version FROM {}", tables.migrations))
            .fetch_all(&mut *tx)
            .await
            .db()?;
    for (version, statements) in tables.migrations() {
        if applied.contains(&version) {
            continue;
        }
        for statement in statements {
            sqlx::query(&statement)
                .execute(&mut *tx)
                .await
                .map_err(|source| Error::Migration {
                    version,
                    source: DatabaseError::new(source),
                })?;
        }
        sqlx::query(&format!(
            "INSERT INTO {} (version, applied_ms) VALUES ($1, $2)",
            tables.migrations
        ))
        .bind(version)
        .bind(now_ms)
        .execute(&mut *tx)
        .await
        .db()?;
    }
    tx.commit().await.db()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(is_identifier("redlock_"));
        assert!(is_identifier("app2_jobs"));
        assert!(!is_identifier("2fast"));
        assert!(!is_identifier("x; DROP TABLE y"));
        assert!(!is_identifier(""));
    }

    #[test]
    fn names_and_lock_keys() {
        let plain = Tables::new("redlock_", None);
        assert_eq!(plain.runs, "redlock_job_runs");
        let scoped = Tables::new("ops_", Some("jobs"));
        assert_eq!(scoped.runs, "jobs.ops_job_runs");
        assert_eq!(scoped.requests, "jobs.ops_scheduler_requests");
        assert_eq!(plain.jobs, "redlock_scheduler_jobs");
        assert_ne!(plain.lock_key(), scoped.lock_key());
        assert_eq!(plain.lock_key(), Tables::new("redlock_", None).lock_key());
    }
}

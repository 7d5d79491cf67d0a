//! A leader-election cron scheduler: each job tick runs on exactly one replica.
//!
//! **Not built yet.** This crate will hold `Scheduler` and `LeaderElector`: every replica
//! declares the same cron jobs; one replica leads (an auto-extended lock taken through
//! [`redlock_core`]), claims each tick under a key made of the job and its scheduled time,
//! and records the run in SQL (sqlx: SQLite by default, PostgreSQL for clusters) under a
//! UNIQUE (job, tick) constraint, so a tick never runs twice.
//!
//! It never talks to Redis itself: every lock goes through [`redlock_core::Redlock`],
//! re-exported here; the scheduler will take one:
//!
//! ```
//! let redlock = redlock_scheduler::Redlock::builder()
//!     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
//!     .build()?;
//! assert_eq!(redlock.quorum(), 2);
//! # Ok::<(), redlock_core::ConfigError>(())
//! ```

pub use redlock_core::Redlock;

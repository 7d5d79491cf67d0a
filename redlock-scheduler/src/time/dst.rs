//! What a fixed-time job does when daylight saving time (or any change of a zone's UTC
//! offset) makes its wall time not exist, or exist twice, on a given day.
//!
//! A [`DstPolicy`] is two independent choices:
//!
//! - [`Gap`]: **spring forward**, a local hour (half hour on Lord Howe Island) is skipped.
//!   [`Gap::RunAtEnd`] (the default) runs the job at the first instant after the gap
//!   (02:30 → 03:00 in Berlin); [`Gap::Skip`] does not run it that day.
//! - [`Fold`]: **fall back**, a local hour repeats. [`Fold::Once`] (the default) runs the
//!   job at the first pass of its wall time only; [`Fold::Twice`] runs it at both
//!   instants, an hour apart.
//!
//! It applies to fixed-time jobs only: see [`DstPolicy`] for which jobs those are and
//! what the others (interval jobs) do.
//!
//! The default, `DstPolicy::default()`, is the behaviour of earlier versions.
//!
//! ```
//! use chrono::{TimeZone, Utc};
//! use redlock_scheduler::time::{DstPolicy, Fold, Gap, Schedule};
//!
//! // 2026-11-01 in New York: 01:00-02:00 happens twice (EDT, then EST).
//! let twice = Schedule::parse("30 1 * * *", "America/New_York")?
//!     .with_dst(DstPolicy::new().fold(Fold::Twice));
//! let ticks = twice.ticks_between(
//!     Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap(),
//!     Utc.with_ymd_and_hms(2026, 11, 1, 12, 0, 0).unwrap(),
//! );
//! assert_eq!(ticks, [
//!     Utc.with_ymd_and_hms(2026, 11, 1, 5, 30, 0).unwrap(), // 01:30 EDT
//!     Utc.with_ymd_and_hms(2026, 11, 1, 6, 30, 0).unwrap(), // 01:30 EST
//! ]);
//!
//! // 2026-03-08: 02:00-03:00 does not exist; with `Gap::Skip` a 02:30 job skips the day.
//! let skip = Schedule::parse("30 2 * * *", "America/New_York")?
//!     .with_dst(DstPolicy::new().gap(Gap::Skip));
//! let next = skip.next_after(Utc.with_ymd_and_hms(2026, 3, 8, 0, 0, 0).unwrap());
//! assert_eq!(next, Some(Utc.with_ymd_and_hms(2026, 3, 9, 6, 30, 0).unwrap())); // 02:30 EDT
//!
//! // As text (what the history stores and admin tools show).
//! assert_eq!(DstPolicy::new().gap(Gap::Skip).to_string(), "skip/once");
//! assert_eq!("run_at_end/twice".parse::<DstPolicy>()?, DstPolicy::new().fold(Fold::Twice));
//! # Ok::<(), String>(())
//! ```

use std::fmt;
use std::str::FromStr;

/// What a fixed-time job does on a day its wall time falls in a skipped stretch of local
/// time (spring forward). See [`DstPolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Gap {
    /// The default: run at the instant the gap ends, the first valid local time after
    /// it (a 02:30 job runs at 03:00 when 02:00 jumps to 03:00). The job runs every day.
    #[default]
    RunAtEnd,
    /// Do not run that day: the wall time does not exist. Nothing is run nor recorded
    /// for it; the next tick is the next day's.
    Skip,
}

/// What a fixed-time job does on a day its wall time happens twice (fall back). See
/// [`DstPolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Fold {
    /// The default: run once, at the first pass (01:30 summer time, not 01:30 winter
    /// time an hour later).
    #[default]
    Once,
    /// Run at both instants the wall time stands for, in time order (two ticks, two
    /// runs, two history rows, an hour apart, or 30 minutes on Lord Howe Island).
    Twice,
}

impl Gap {
    /// The name used in text and JSON: `run_at_end` or `skip`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RunAtEnd => "run_at_end",
            Self::Skip => "skip",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Self::RunAtEnd, Self::Skip]
            .into_iter()
            .find(|g| g.as_str() == name)
    }
}

impl Fold {
    /// The name used in text and JSON: `once` or `twice`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Once => "once",
            Self::Twice => "twice",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Self::Once, Self::Twice]
            .into_iter()
            .find(|f| f.as_str() == name)
    }
}

impl fmt::Display for Gap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Fold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job's daylight saving policy: what its fixed-time ticks do in a skipped stretch of
/// local time ([`Gap`]) and in a repeated one ([`Fold`]). The default
/// ([`DstPolicy::new`]) is `Gap::RunAtEnd` and `Fold::Once`, the behaviour of earlier
/// versions. Set it with [`Job::dst`](crate::Job::dst) or
/// [`Schedule::with_dst`](crate::time::Schedule::with_dst).
///
/// # Which jobs it applies to
///
/// Only *fixed-time* jobs: those whose expression names exactly one second, one minute
/// and one hour, none of them a wildcard or a step (croner's
/// [`JobType::FixedTime`](croner::JobType::FixedTime)): `0 30 2 * * *`,
/// `30 2 * * *` (five fields: second 0), `0 15 1 * * MON-FRI`, `0 0 3 1 * *`. The day
/// fields do not matter. [`Schedule::is_fixed_time`](crate::time::Schedule::is_fixed_time)
/// tells whether a schedule is one.
///
/// Every other job is an *interval* job and ignores the policy: `*/15 * * * *`,
/// `30 * * * *` (hourly), `0 0 */2 * * *`, and also a list or range of hours or minutes
/// such as `0 30 1,2 * * *` or `0 0,30 2 * * *`. Their ticks keep a steady cadence in
/// real time: in a repeated hour, each pass of a wall time is a distinct instant and runs
/// (an hourly job at `:30` runs at 01:30 EDT and again at 01:30 EST, an hour later, as it
/// does every hour); in a skipped hour, the wall times that do not exist are not run
/// (the hourly job's 02:30 is simply absent: 01:30 EST to 03:30 EDT is one hour). To
/// have a fold or a gap handled per this policy, declare the job with a single time.
///
/// As text ([`Display`](fmt::Display), [`FromStr`]): `<gap>/<fold>`, such as
/// `run_at_end/once` (the default) or `skip/twice`. In JSON: `{"gap": "skip", "fold":
/// "twice"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[non_exhaustive]
pub struct DstPolicy {
    /// What a fixed-time tick in a gap does.
    pub gap: Gap,
    /// What a fixed-time tick in a fold does.
    pub fold: Fold,
}

impl DstPolicy {
    /// The default policy: [`Gap::RunAtEnd`] and [`Fold::Once`].
    pub const fn new() -> Self {
        Self {
            gap: Gap::RunAtEnd,
            fold: Fold::Once,
        }
    }

    /// This policy with `gap` for skipped local times.
    #[must_use]
    pub const fn gap(mut self, gap: Gap) -> Self {
        self.gap = gap;
        self
    }

    /// This policy with `fold` for repeated local times.
    #[must_use]
    pub const fn fold(mut self, fold: Fold) -> Self {
        self.fold = fold;
        self
    }

    /// Whether this is the default policy.
    pub fn is_default(self) -> bool {
        self == Self::new()
    }
}

impl fmt::Display for DstPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.gap, self.fold)
    }
}

impl FromStr for DstPolicy {
    type Err = String;

    /// Reads `<gap>/<fold>` (`run_at_end/once`, `skip/twice`, ...).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || {
            format!(
                "invalid DST policy `{text}`: expected `<gap>/<fold>`, gap `run_at_end` or `skip`, fold `once` or `twice`"
            )
        };
        let (gap, fold) = text.trim().split_once('/').ok_or_else(invalid)?;
        Ok(Self {
            gap: Gap::from_name(gap.trim()).ok_or_else(invalid)?,
            fold: Fold::from_name(fold.trim()).ok_or_else(invalid)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [DstPolicy; 4] = [
        DstPolicy::new(),
        DstPolicy::new().gap(Gap::Skip),
        DstPolicy::new().fold(Fold::Twice),
        DstPolicy::new().gap(Gap::Skip).fold(Fold::Twice),
    ];

    #[test]
    fn the_default_is_the_rule_of_earlier_versions() {
        assert_eq!(DstPolicy::default(), DstPolicy::new());
        assert_eq!(DstPolicy::new().gap, Gap::RunAtEnd);
        assert_eq!(DstPolicy::new().fold, Fold::Once);
        assert!(DstPolicy::new().is_default());
        assert!(!ALL[3].is_default());
    }

    #[test]
    fn text_round_trips_and_rejects_the_unknown() {
        let texts: Vec<String> = ALL.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            [
                "run_at_end/once",
                "skip/once",
                "run_at_end/twice",
                "skip/twice"
            ]
        );
        for policy in ALL {
            assert_eq!(policy.to_string().parse::<DstPolicy>(), Ok(policy));
        }
        assert_eq!(" skip / twice ".parse::<DstPolicy>(), Ok(ALL[3]));
        for bad in [
            "",
            "skip",
            "skip/",
            "/once",
            "later/once",
            "skip/thrice",
            "skip/once/x",
        ] {
            let err = bad.parse::<DstPolicy>().unwrap_err();
            assert!(err.contains("invalid DST policy"), "{bad}: {err}");
        }
    }

    #[test]
    fn json_names_the_choices() {
        let json = serde_json::to_value(DstPolicy::new().gap(Gap::Skip)).unwrap();
        assert_eq!(json, serde_json::json!({"gap": "skip", "fold": "once"}));
        let json = serde_json::to_value(DstPolicy::new().fold(Fold::Twice)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"gap": "run_at_end", "fold": "twice"})
        );
    }
}

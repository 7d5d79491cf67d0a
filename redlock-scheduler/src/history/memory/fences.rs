//! The fences table in memory: each job's highest run token, checked and raised
//! as redlock-fence's `SqlFence` does in the SQL store.

use std::collections::BTreeMap;

/// What a fence check answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in super::super) enum FenceCheck {
    /// The token is the highest seen (now recorded).
    Admitted,
    /// A higher token was seen.
    Stale { highest: u64 },
    /// A token above `i64::MAX`, which the table cannot hold.
    OutOfRange,
}

/// The fences table: resource to the highest token seen.
#[derive(Debug, Default, Clone)]
pub(in super::super) struct FenceRows {
    rows: BTreeMap<String, i64>,
}

impl FenceRows {
    /// Admits `token` for `resource` if no higher one was seen, and records it as the
    /// highest (the same token any number of times, a lower one never again).
    pub(in super::super) fn check(&mut self, resource: &str, token: u64) -> FenceCheck {
        let Ok(token) = i64::try_from(token) else {
            return FenceCheck::OutOfRange;
        };
        let stored = self.rows.entry(resource.to_owned()).or_insert(token);
        *stored = (*stored).max(token);
        if *stored == token {
            FenceCheck::Admitted
        } else {
            FenceCheck::Stale {
                highest: u64::try_from(*stored).unwrap_or(0),
            }
        }
    }
}

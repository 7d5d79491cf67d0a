//! Names no other test uses: for tables, keys and jobs that tests running at once (in
//! one process or in several, against one database) must not share.

use std::sync::atomic::{AtomicU32, Ordering};

/// `prefix` followed by this process's id, the clock's nanoseconds and a count, joined
/// by `_` (a plain SQL identifier if `prefix` is one). The count tells apart two names
/// asked for at the same clock reading, which happens: two tests that create a table of
/// one name at once on PostgreSQL fail (`CREATE TABLE IF NOT EXISTS` is not atomic
/// across sessions).
///
/// ```
/// let (a, b) = (redlock_testkit::unique_name("fences"), redlock_testkit::unique_name("fences"));
/// assert!(a.starts_with("fences_"));
/// assert_ne!(a, b);
/// ```
pub fn unique_name(prefix: &str) -> String {
    static COUNT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() % 1_000_000_000);
    let count = COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{nanos}_{count}", std::process::id())
}

//! Waiting in tests for something that happens in the background.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every 50 ms until it gives a value, and returns it; panics, naming
/// `what`, when `within` passes first.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// let mut calls = 0;
/// let third = redlock_testkit::until("the third call", Duration::from_secs(1), || {
///     calls += 1;
///     let now = calls;
///     async move { (now == 3).then_some(now) }
/// })
/// .await;
/// assert_eq!(third, 3);
/// # }
/// ```
pub async fn until<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

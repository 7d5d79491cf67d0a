//! Captured logs: what a test binary's code logged through `tracing`, to check that a
//! message went to the log (and not, say, into a response body).
//!
//! ```
//! redlock_testkit::logs::capture("my_crate=debug");
//! tracing::warn!(target: "my_crate", request_id = "r-1", "refused");
//! assert!(redlock_testkit::logs::text().contains("r-1"));
//! ```

use std::io::Write;
use std::sync::{Mutex, OnceLock};

static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs a subscriber that captures every event matching `filter` (an `EnvFilter`
/// directive such as `"redlock_tower=debug,redlock_core=warn"`), once per test binary;
/// later calls keep the first filter.
pub fn capture(filter: &str) {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(|| Capture)
            .try_init();
    });
}

/// Everything captured so far, by every test of the binary.
pub fn text() -> String {
    String::from_utf8_lossy(
        &LOGS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
    .into_owned()
}

//! The restart quarantine: the client-side "delayed restart" of the Redlock paper.

use std::sync::Mutex;
use std::time::Duration;

use crate::clock::Instant;

/// The client-side "delayed restart": a node that has been up for less than the longest
/// lock TTL may have forgotten a live lock (restarted without persistence), so its
/// votes do not count until it has been up that long.
pub(super) struct Quarantine {
    /// The node's address, for the log.
    pub(super) node: String,
    pub(super) period: Duration,
    pub(super) state: Mutex<QuarantineState>,
}

#[derive(Default)]
pub(super) struct QuarantineState {
    pub(super) run_id: Option<String>,
    pub(super) until: Option<Instant>,
}

impl Quarantine {
    /// Learns the node's `run_id` and uptime from an `INFO server` reply, and starts a
    /// quarantine if it has been up for less than the period.
    pub(super) fn observe(&self, info: &str) {
        let field = |name: &str| crate::protocol::info_field(info, name);
        let run_id = field("run_id").map(str::to_owned);
        // Unknown uptime: assume the worst.
        let uptime = field("uptime_in_seconds")
            .and_then(|s| s.parse::<u64>().ok())
            .map_or(Duration::ZERO, Duration::from_secs);
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let restarted = state.run_id.is_some() && state.run_id != run_id;
        // Uptime is in whole seconds, rounded down: wait one second more to be sure.
        let period = self.period.saturating_add(Duration::from_secs(1));
        if uptime < period {
            let left = period.saturating_sub(uptime);
            let until = Instant::now() + left;
            if state.until.is_none_or(|current| current < until) {
                let quarantine_ms = left.as_millis() as u64;
                let uptime_s = uptime.as_secs();
                if restarted {
                    tracing::warn!(node = %self.node, uptime_s, quarantine_ms,
                        "node restarted: it may have forgotten live locks, so its votes do not count until it has been up for the longest lock TTL");
                } else {
                    tracing::info!(node = %self.node, uptime_s, quarantine_ms,
                        "node up for less than the longest lock TTL: its votes do not count until then");
                }
                state.until = Some(until);
            }
        } else if restarted {
            tracing::info!(node = %self.node, "node restarted long enough ago: no quarantine");
        }
        state.run_id = run_id;
    }
}

//! The layer's settings: what every service the layer makes shares.

use std::fmt;
use std::time::Duration;

use http::StatusCode;
use redlock_core::RetryPolicy;

use crate::response::OnRejection;

pub(crate) use redlock_http::Hold;

/// The layer's settings, shared by every service it makes.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) resource_prefix: String,
    pub(crate) ttl: Duration,
    pub(crate) retry: RetryPolicy,
    pub(crate) hold: Hold,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) fencing: Option<bool>,
    pub(crate) fail_open: bool,
    pub(crate) busy_status: StatusCode,
    pub(crate) abort_on_loss: bool,
    pub(crate) on_rejection: Option<OnRejection>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("resource_prefix", &self.resource_prefix)
            .field("ttl", &self.ttl)
            .field("retry", &self.retry)
            .field("hold", &self.hold)
            .field("max_hold", &self.max_hold)
            .field("fencing", &self.fencing)
            .field("fail_open", &self.fail_open)
            .field("busy_status", &self.busy_status)
            .field("abort_on_loss", &self.abort_on_loss)
            .field(
                "on_rejection",
                &self.on_rejection.as_ref().map(|_| "custom"),
            )
            .finish()
    }
}

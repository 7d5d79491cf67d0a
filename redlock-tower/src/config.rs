//! What every service a layer makes shares: the engine's options
//! ([`redlock_http::LockOptions`] or [`redlock_http::LimitOptions`]) and the refusal hook.

use std::fmt;

use redlock_core::Redlock;
use redlock_http::{Guard, KeyBoundError, KeyRoom, LimitOptions, LockOptions, Refusal};

use crate::guard::Held;
use crate::response::{OnRefusal, RefusalResponse};

/// The engine's options of a lock or of a concurrency limit.
#[derive(Clone, Debug)]
pub(crate) enum Options {
    Lock(LockOptions),
    Limit(LimitOptions),
}

/// The layer's settings, shared by every service it makes.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) options: Options,
    pub(crate) on_refusal: Option<OnRefusal>,
}

impl Config {
    pub(crate) fn new(options: Options) -> Self {
        Self {
            options,
            on_refusal: None,
        }
    }

    /// The engine's decision, for either kind of options.
    pub(crate) fn guard(&self) -> &dyn Guard {
        match &self.options {
            Options::Lock(o) => o,
            Options::Limit(o) => o,
        }
    }

    pub(crate) fn acquire(
        &self,
        redlock: &Redlock,
        resource: String,
    ) -> crate::lock::future::AcquireFuture {
        match &self.options {
            Options::Lock(o) => {
                let acquire = o.acquire(redlock, resource);
                Box::pin(async move { acquire.await.map(Held::Lock) })
            }
            Options::Limit(o) => {
                let acquire = o.acquire(redlock, resource);
                Box::pin(async move { acquire.await.map(Held::Permit) })
            }
        }
    }

    /// The longest key taken under the prefix (and a limit's slot suffix).
    pub(crate) fn room(&self, redlock: &Redlock) -> Result<KeyRoom, KeyBoundError> {
        match &self.options {
            Options::Lock(o) => KeyRoom::new(redlock, o.prefix(), 0),
            Options::Limit(o) => o.room(redlock),
        }
    }

    /// The response to `refusal`: the hook's, or the problem+json default.
    pub(crate) fn render(&self, refusal: &Refusal) -> RefusalResponse {
        match &self.on_refusal {
            Some(hook) => hook(refusal),
            None => crate::response::problem_response(&refusal.problem),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("options", &self.options)
            .field("on_refusal", &self.on_refusal.as_ref().map(|_| "custom"))
            .finish()
    }
}

/// The hook setter of a layer, written once for [`LockLayer`](crate::LockLayer) and
/// [`ClusterLimitLayer`](crate::ClusterLimitLayer).
pub(crate) fn with_hook<F>(config: &mut std::sync::Arc<Config>, hook: F)
where
    F: Fn(&Refusal) -> RefusalResponse + Send + Sync + 'static,
{
    let hook: OnRefusal = std::sync::Arc::new(hook);
    std::sync::Arc::make_mut(config).on_refusal = Some(hook);
}

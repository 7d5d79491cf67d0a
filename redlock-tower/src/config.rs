//! What every service a layer makes shares: the engine's options
//! ([`redlock_http::LockOptions`] or [`redlock_http::LimitOptions`]) and the refusal hook.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use redlock_core::{Error, Redlock};
use redlock_http::key::{KeyBoundError, KeyRoom};
use redlock_http::{Guard, LimitOptions, LockOptions, Refusal};

use crate::guard::Held;
use crate::response::{OnRefusal, RefusalResponse};

/// Takes what a request holds while it runs: a lock, or a semaphore permit.
pub(crate) type AcquireFuture = Pin<Box<dyn Future<Output = Result<Held, Error>> + Send>>;

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

    pub(crate) fn acquire(&self, redlock: &Redlock, resource: String) -> AcquireFuture {
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

/// What a lock's and a limit's services share: the inner service's accessors,
/// `Clone` and `Debug`.
macro_rules! guarded_service {
    ($name:ident) => {
        impl<S, E> $name<S, E> {
            /// The inner service.
            pub fn get_ref(&self) -> &S {
                &self.inner
            }

            /// The inner service, mutably.
            pub fn get_mut(&mut self) -> &mut S {
                &mut self.inner
            }

            /// The inner service, unwrapped.
            pub fn into_inner(self) -> S {
                self.inner
            }
        }

        impl<S: Clone, E> Clone for $name<S, E> {
            fn clone(&self) -> Self {
                Self {
                    inner: self.inner.clone(),
                    redlock: self.redlock.clone(),
                    extractor: std::sync::Arc::clone(&self.extractor),
                    config: std::sync::Arc::clone(&self.config),
                }
            }
        }

        impl<S: std::fmt::Debug, E: std::fmt::Debug> std::fmt::Debug for $name<S, E> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("inner", &self.inner)
                    .field("redlock", &self.redlock)
                    .field("extractor", &self.extractor)
                    .field("config", &self.config)
                    .finish()
            }
        }
    };
}

/// What a lock's and a limit's layers share: `Clone`, `Debug`, the refusal hook and
/// the accessors.
macro_rules! guarded_layer {
    ($name:ident) => {
        impl<E> Clone for $name<E> {
            fn clone(&self) -> Self {
                Self {
                    redlock: self.redlock.clone(),
                    extractor: std::sync::Arc::clone(&self.extractor),
                    config: std::sync::Arc::clone(&self.config),
                }
            }
        }

        impl<E: std::fmt::Debug> std::fmt::Debug for $name<E> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("redlock", &self.redlock)
                    .field("extractor", &self.extractor)
                    .field("config", &self.config)
                    .finish()
            }
        }

        impl<E> $name<E> {
            /// Build refusal responses yourself (default: an `application/problem+json`
            /// document, [`problem_response`](crate::response::problem_response) of the
            /// refusal's problem); called once per refused request. A gRPC service
            /// (tonic) wants this: its clients expect `200` with a `grpc-status` header
            /// (e.g. `10`, aborted, for [`RefusalKind::Busy`](crate::RefusalKind::Busy)),
            /// not an HTTP error status.
            #[must_use]
            pub fn on_refusal<F>(mut self, hook: F) -> Self
            where
                F: Fn(&redlock_http::Refusal) -> crate::response::RefusalResponse
                    + Send
                    + Sync
                    + 'static,
            {
                let hook: crate::response::OnRefusal = std::sync::Arc::new(hook);
                std::sync::Arc::make_mut(&mut self.config).on_refusal = Some(hook);
                self
            }

            /// The lock client.
            pub fn redlock(&self) -> &Redlock {
                &self.redlock
            }

            /// The key extractor.
            pub fn extractor(&self) -> &E {
                &self.extractor
            }
        }
    };
}

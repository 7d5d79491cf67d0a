//! [`Admin`]: what the service shows and may do, built by [`AdminBuilder`].

use std::sync::Arc;
use std::time::Duration;

use redlock_core::Redlock;
use redlock_idempotency::Store;
use redlock_scheduler::admin::SchedulerAdmin;

/// The shortest bearer token accepted for the mutating routes.
pub const MIN_TOKEN_LEN: usize = 16;
/// Where the service is mounted unless told otherwise.
pub const DEFAULT_MOUNT_PATH: &str = "/admin";
/// How many locks the dashboard and `/api/locks` list, and how many records
/// `/api/idempotency` lists, unless told otherwise.
pub const DEFAULT_LIST_LIMIT: usize = 200;
/// The most records `/api/idempotency` lists, whatever its `limit` asks (the listing
/// limit of `redlock-core`'s lock listing): a larger `limit` is lowered to it.
pub const MAX_LIST_LIMIT: usize = redlock_core::inspect::DEFAULT_LIST_LIMIT;
/// How often the dashboard reloads itself, by default.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(5);
/// How long a trigger, cancel or step-down waits for a replica to carry the request
/// out before answering that it is still under way (202), by default.
pub const DEFAULT_REQUEST_WAIT: Duration = Duration::from_secs(2);

/// The admin service: held locks and node health from a [`Redlock`], jobs, leader and
/// runs from a [`SchedulerAdmin`], idempotency records from a [`Store`], as JSON and
/// (locks, nodes, scheduler) as an HTML dashboard; mount it with
/// [`AdminService`](crate::AdminService) (tower: axum, hyper) or
/// [`Admin::actix_scope`] (actix-web, feature `actix`). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Admin {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) redlock: Option<Redlock>,
    pub(crate) scheduler: Option<SchedulerAdmin>,
    /// The idempotency records' store (`/api/idempotency`).
    pub(crate) idempotency: Option<Arc<dyn Store>>,
    /// The bearer token of the mutating routes; `None`: they are switched off.
    pub(crate) token: Option<String>,
    pub(crate) mount: String,
    pub(crate) resource_prefix: String,
    pub(crate) list_limit: usize,
    pub(crate) refresh: Duration,
    /// How long a request (trigger, cancel, step down) is waited for.
    pub(crate) request_wait: Duration,
    pub(crate) title: String,
}

impl Admin {
    /// A builder: give it a [`Redlock`], a [`SchedulerAdmin`], an idempotency [`Store`],
    /// or several of them.
    pub fn builder() -> AdminBuilder {
        AdminBuilder::default()
    }

    /// Whether the mutating routes (force release, pause, resume, trigger, cancel, step
    /// down, and adding, rescheduling and removing jobs) are switched on.
    pub fn mutations_allowed(&self) -> bool {
        self.inner.token.is_some()
    }
}

/// Builds an [`Admin`]; [`build`](Self::build) checks the options.
///
/// ```
/// use redlock_admin::{Admin, BuildError};
///
/// // Nothing to show.
/// assert!(matches!(Admin::builder().build(), Err(BuildError::NothingToShow)));
/// ```
#[derive(Debug, Default)]
#[must_use = "a builder does nothing until `build()`"]
pub struct AdminBuilder {
    redlock: Option<Redlock>,
    scheduler: Option<SchedulerAdmin>,
    idempotency: Option<Arc<dyn Store>>,
    token: Option<String>,
    mount: Option<String>,
    resource_prefix: String,
    list_limit: Option<usize>,
    refresh: Option<Duration>,
    request_wait: Option<Duration>,
    title: Option<String>,
}

impl AdminBuilder {
    /// Shows the locks and nodes of `redlock`, and allows forced releases through it.
    pub fn redlock(mut self, redlock: Redlock) -> Self {
        self.redlock = Some(redlock);
        self
    }

    /// Shows and steers the scheduler behind `scheduler` (its history database).
    pub fn scheduler(mut self, scheduler: SchedulerAdmin) -> Self {
        self.scheduler = Some(scheduler);
        self
    }

    /// Lists the idempotency records kept in `store` (`/api/idempotency?prefix=&limit=`,
    /// read only): the same store the services' idempotency middleware writes to
    /// (`redlock_idempotency::store::RedisStore`, `SqlStore`, or one of your own).
    pub fn idempotency(mut self, store: Arc<dyn Store>) -> Self {
        self.idempotency = Some(store);
        self
    }

    /// Switches the mutating routes on, for requests that carry `token` (an
    /// `Authorization: Bearer <token>` header, or a `token` field in the
    /// `application/x-www-form-urlencoded` body the dashboard's buttons post; never in
    /// the URL, which access logs, proxies and browser histories keep: a request with a
    /// `token` in its query string is refused with 400). Off by default: they answer
    /// 403. At least [`MIN_TOKEN_LEN`] characters; keep it out of the source (an
    /// environment variable, a secret store).
    pub fn allow_mutations(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Where the service is mounted (default [`DEFAULT_MOUNT_PATH`]): the dashboard's
    /// links and its buttons' redirects go there.
    pub fn mount_path(mut self, path: impl Into<String>) -> Self {
        self.mount = Some(path.into());
        self
    }

    /// Lists only the locks whose resource names start with `prefix` (default: all):
    /// a filter on resource names, as `locks` takes it (`/api/locks?prefix=`, `redlock
    /// locks <prefix>`), not the Redis key namespace (the `Redlock`'s `key_prefix`).
    pub fn resource_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.resource_prefix = prefix.into();
        self
    }

    /// Lists at most `limit` locks (default [`DEFAULT_LIST_LIMIT`]).
    pub fn list_limit(mut self, limit: usize) -> Self {
        self.list_limit = Some(limit);
        self
    }

    /// How often the dashboard reloads itself (default [`DEFAULT_REFRESH`]).
    pub fn refresh(mut self, every: Duration) -> Self {
        self.refresh = Some(every);
        self
    }

    /// How long a trigger, cancel or step-down waits for a replica to carry the request
    /// out (default [`DEFAULT_REQUEST_WAIT`]): done by then, it is answered with its
    /// result (200, or 409 if it could not be carried out); otherwise 202 Accepted,
    /// saying whether a replica took it, with the request's URL to poll
    /// (`/api/requests/{id}`). Zero answers at once.
    pub fn request_wait(mut self, wait: Duration) -> Self {
        self.request_wait = Some(wait);
        self
    }

    /// The dashboard's title (default `redlock`).
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// Checks the options and builds the service.
    ///
    /// # Errors
    ///
    /// [`BuildError`]: nothing to show, a token too short, a mount path that is not
    /// an absolute path, a limit or refresh of zero.
    pub fn build(self) -> Result<Admin, BuildError> {
        if self.redlock.is_none() && self.scheduler.is_none() && self.idempotency.is_none() {
            return Err(BuildError::NothingToShow);
        }
        if let Some(token) = &self.token
            && (token.chars().count() < MIN_TOKEN_LEN || token.chars().any(char::is_whitespace))
        {
            return Err(BuildError::WeakToken {
                len: token.chars().count(),
            });
        }
        let mount = self.mount.unwrap_or_else(|| DEFAULT_MOUNT_PATH.to_owned());
        let mount = mount.trim_end_matches('/').to_owned();
        if !(mount.is_empty() || mount.starts_with('/'))
            || mount
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '"' | '<' | '>' | '?' | '#'))
        {
            return Err(BuildError::BadMountPath { path: mount });
        }
        let list_limit = self.list_limit.unwrap_or(DEFAULT_LIST_LIMIT);
        let refresh = self.refresh.unwrap_or(DEFAULT_REFRESH);
        if list_limit == 0 || refresh.is_zero() {
            return Err(BuildError::Zero);
        }
        Ok(Admin {
            inner: Arc::new(Inner {
                redlock: self.redlock,
                scheduler: self.scheduler,
                idempotency: self.idempotency,
                token: self.token,
                mount,
                resource_prefix: self.resource_prefix,
                list_limit,
                refresh,
                request_wait: self.request_wait.unwrap_or(DEFAULT_REQUEST_WAIT),
                title: self.title.unwrap_or_else(|| "redlock".to_owned()),
            }),
        })
    }
}

/// A configuration the [`AdminBuilder`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// Neither a `Redlock`, a `SchedulerAdmin` nor an idempotency store was given.
    #[error(
        "the admin service has nothing to show: give it `.redlock(..)`, `.scheduler(..)`, `.idempotency(..)`, or several"
    )]
    NothingToShow,
    /// The mutations' token is too short (or has spaces).
    #[error(
        "the admin token has {len} characters: use at least {MIN_TOKEN_LEN}, without spaces (e.g. 32 random hex digits)"
    )]
    WeakToken {
        /// Its length.
        len: usize,
    },
    /// The mount path is not an absolute URL path.
    #[error("the mount path `{path}` must be an absolute path such as `/admin`")]
    BadMountPath {
        /// The path given.
        path: String,
    },
    /// A list limit or refresh period of zero.
    #[error("the list limit and the refresh period must be above zero")]
    Zero,
}

//! The admin routes: a request's method and path, read into what it asks for.

use percent_encoding::percent_decode_str;

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// The HTML dashboard.
    Dashboard,
    /// Everything the dashboard shows, as JSON.
    Overview,
    /// Node health.
    Nodes,
    /// Held locks (`?prefix=&limit=`).
    Locks,
    /// Force-release a lock (`resource` in the query or the form).
    ForceRelease,
    /// Force-release every permit of a semaphore (`name` in the query or the form).
    ForceReleaseSemaphore,
    /// Force-release a read-write lock: writer and readers (`name` in the query or the
    /// form).
    ForceReleaseRw,
    /// The scheduler's jobs.
    Jobs,
    /// The scheduler's leader.
    Leader,
    /// Run history (`?job=&outcome=&limit=`).
    Runs,
    /// Pause, resume, trigger or cancel a job.
    JobAction { job: String, action: JobAction },
    /// Ask the leader to step down.
    StepDown,
    /// A scheduler request's state.
    Request { id: String },
    /// Idempotency records (`?prefix=&limit=`).
    Idempotency,
}

/// What can be done to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobAction {
    Pause,
    Resume,
    Trigger,
    Cancel,
}

impl JobAction {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::Trigger => "trigger",
            Self::Cancel => "cancel",
        }
    }
}

/// Why a request has no route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoRoute {
    /// No such path: 404.
    NotFound,
    /// The path exists, not with this method: 405, with the method it takes.
    Method(&'static str),
}

impl Route {
    /// Whether it changes anything (needs the mutations switched on and the token).
    pub(crate) fn mutates(&self) -> bool {
        matches!(
            self,
            Self::ForceRelease
                | Self::ForceReleaseSemaphore
                | Self::ForceReleaseRw
                | Self::JobAction { .. }
                | Self::StepDown
        )
    }

    /// Reads `method` and `path` (below the mount point; `""` or `/` is the dashboard).
    pub(crate) fn parse(method: &str, path: &str) -> Result<Self, NoRoute> {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let decoded = |s: &str| {
            percent_decode_str(s)
                .decode_utf8()
                .ok()
                .map(|c| c.into_owned())
        };
        let (route, takes) = match segments.as_slice() {
            [] => (Self::Dashboard, "GET"),
            ["api"] | ["api", "overview"] => (Self::Overview, "GET"),
            ["api", "nodes"] => (Self::Nodes, "GET"),
            ["api", "locks"] => (Self::Locks, "GET"),
            ["api", "locks", "release"] => (Self::ForceRelease, "POST"),
            ["api", "semaphores", "release"] => (Self::ForceReleaseSemaphore, "POST"),
            ["api", "rw-locks", "release"] => (Self::ForceReleaseRw, "POST"),
            ["api", "jobs"] => (Self::Jobs, "GET"),
            ["api", "leader"] => (Self::Leader, "GET"),
            ["api", "runs"] => (Self::Runs, "GET"),
            ["api", "idempotency"] => (Self::Idempotency, "GET"),
            ["api", "scheduler", "step-down"] => (Self::StepDown, "POST"),
            ["api", "requests", id] => (
                Self::Request {
                    id: decoded(id).ok_or(NoRoute::NotFound)?,
                },
                "GET",
            ),
            ["api", "jobs", job, action] => {
                let action = match *action {
                    "pause" => JobAction::Pause,
                    "resume" => JobAction::Resume,
                    "trigger" => JobAction::Trigger,
                    "cancel" => JobAction::Cancel,
                    _ => return Err(NoRoute::NotFound),
                };
                let job = decoded(job).ok_or(NoRoute::NotFound)?;
                (Self::JobAction { job, action }, "POST")
            }
            _ => return Err(NoRoute::NotFound),
        };
        // HEAD reads as GET.
        let method = if method == "HEAD" { "GET" } else { method };
        if method == takes {
            Ok(route)
        } else {
            Err(NoRoute::Method(takes))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(Route::parse("GET", ""), Ok(Route::Dashboard));
        assert_eq!(Route::parse("GET", "/"), Ok(Route::Dashboard));
        assert_eq!(Route::parse("GET", "/api/locks"), Ok(Route::Locks));
        assert_eq!(
            Route::parse("POST", "/api/jobs/nightly%20report/pause"),
            Ok(Route::JobAction {
                job: "nightly report".into(),
                action: JobAction::Pause
            })
        );
        assert_eq!(
            Route::parse("GET", "/api/jobs/x/pause"),
            Err(NoRoute::Method("POST"))
        );
        assert_eq!(
            Route::parse("POST", "/api/locks"),
            Err(NoRoute::Method("GET"))
        );
        assert_eq!(Route::parse("GET", "/api/nope"), Err(NoRoute::NotFound));
        assert_eq!(
            Route::parse("POST", "/api/jobs/x/explode"),
            Err(NoRoute::NotFound)
        );
        assert!(
            Route::parse("POST", "/api/scheduler/step-down")
                .unwrap()
                .mutates()
        );
        assert!(!Route::parse("GET", "/api/runs").unwrap().mutates());
        for path in ["/api/semaphores/release", "/api/rw-locks/release"] {
            assert!(Route::parse("POST", path).unwrap().mutates());
            assert_eq!(Route::parse("GET", path), Err(NoRoute::Method("POST")));
        }
        assert_eq!(
            Route::parse("GET", "/api/idempotency"),
            Ok(Route::Idempotency)
        );
        assert_eq!(
            Route::parse("POST", "/api/idempotency"),
            Err(NoRoute::Method("GET"))
        );
    }
}

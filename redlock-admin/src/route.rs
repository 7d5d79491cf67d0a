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
    /// Add a job at run time (its definition in a JSON body).
    AddJob,
    /// Put another definition in force for a job (the fields given in a JSON body).
    RescheduleJob { job: String },
    /// Remove a job at run time.
    RemoveJob { job: String },
    /// The jobs' changes made at run time, newest first (`?job=&limit=`).
    JobChanges,
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
                | Self::AddJob
                | Self::RescheduleJob { .. }
                | Self::RemoveJob { .. }
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
            // GET lists the jobs, POST adds one.
            ["api", "jobs"] if method == "POST" => (Self::AddJob, "POST"),
            ["api", "jobs"] => (Self::Jobs, "GET, POST"),
            ["api", "job-changes"] => (Self::JobChanges, "GET"),
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
                let job = decoded(job).ok_or(NoRoute::NotFound)?;
                let action = match *action {
                    "pause" => JobAction::Pause,
                    "resume" => JobAction::Resume,
                    "trigger" => JobAction::Trigger,
                    "cancel" => JobAction::Cancel,
                    "reschedule" => return Self::only(method, Self::RescheduleJob { job }, "POST"),
                    "remove" => return Self::only(method, Self::RemoveJob { job }, "POST"),
                    _ => return Err(NoRoute::NotFound),
                };
                (Self::JobAction { job, action }, "POST")
            }
            _ => return Err(NoRoute::NotFound),
        };
        Self::only(method, route, takes)
    }

    /// `route` if `method` is one of those it `takes` (`GET`, `POST`, `GET, POST`: the
    /// `Allow` header's value); HEAD reads as GET.
    fn only(method: &str, route: Self, takes: &'static str) -> Result<Self, NoRoute> {
        let method = if method == "HEAD" { "GET" } else { method };
        if takes.split(", ").any(|t| t == method) {
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
        // Jobs changed at run time.
        assert_eq!(Route::parse("GET", "/api/jobs"), Ok(Route::Jobs));
        assert_eq!(Route::parse("HEAD", "/api/jobs"), Ok(Route::Jobs));
        assert_eq!(Route::parse("POST", "/api/jobs"), Ok(Route::AddJob));
        assert_eq!(
            Route::parse("DELETE", "/api/jobs"),
            Err(NoRoute::Method("GET, POST"))
        );
        assert_eq!(
            Route::parse("POST", "/api/jobs/nightly%20report/reschedule"),
            Ok(Route::RescheduleJob {
                job: "nightly report".into()
            })
        );
        assert_eq!(
            Route::parse("POST", "/api/jobs/x/remove"),
            Ok(Route::RemoveJob { job: "x".into() })
        );
        assert_eq!(
            Route::parse("GET", "/api/jobs/x/remove"),
            Err(NoRoute::Method("POST"))
        );
        assert_eq!(
            Route::parse("GET", "/api/job-changes"),
            Ok(Route::JobChanges)
        );
        assert_eq!(
            Route::parse("POST", "/api/job-changes"),
            Err(NoRoute::Method("GET"))
        );
        for path in ["/api/jobs", "/api/jobs/x/reschedule", "/api/jobs/x/remove"] {
            assert!(Route::parse("POST", path).unwrap().mutates(), "{path}");
        }
        assert!(!Route::parse("GET", "/api/jobs").unwrap().mutates());
        assert!(!Route::parse("GET", "/api/job-changes").unwrap().mutates());
        assert_eq!(
            Route::parse("POST", "/api/idempotency"),
            Err(NoRoute::Method("GET"))
        );
    }
}

//! Answering one request, whatever the framework: [`Admin::handle`].

use std::collections::HashMap;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use redlock_scheduler::admin::{Dispatched, Request, RequestAction, RequestState, SchedulerAdmin};
use redlock_scheduler::changes::{JobChange, JobChangeAction};
use redlock_scheduler::error::{HistoryError, RequestError};
use redlock_scheduler::history::{Outcome, RunFilter};
use serde::Serialize;
use serde_json::{Value, json};

use crate::admin::{Admin, MAX_LIST_LIMIT};
use crate::definition::Definition;
use crate::route::{JobAction, NoRoute, Route};

/// The largest request body read (a form post from the dashboard, or a job's
/// definition, is far smaller).
pub const MAX_BODY: usize = 16 * 1024;

/// How many job changes `/api/job-changes` lists unless its `limit` says otherwise (at
/// most 1,000).
const DEFAULT_CHANGE_LIMIT: u32 = 50;

/// How many job changes the dashboard shows.
const DASHBOARD_CHANGES: u32 = 10;

/// A request, as the framework adapters hand it over.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct AdminRequest<'a> {
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// The path below the mount point (`/api/locks`; `/` or `` for the dashboard).
    pub path: &'a str,
    /// The query string, without `?`.
    pub query: Option<&'a str>,
    /// The `Authorization` header.
    pub authorization: Option<&'a str>,
    /// The `Content-Type` header.
    pub content_type: Option<&'a str>,
    /// The body (at most [`MAX_BODY`] bytes).
    pub body: &'a [u8],
}

impl<'a> AdminRequest<'a> {
    /// A request with no query, headers or body.
    pub fn new(method: &'a str, path: &'a str) -> Self {
        Self {
            method,
            path,
            query: None,
            authorization: None,
            content_type: None,
            body: &[],
        }
    }

    /// Sets the query string.
    pub fn query(mut self, query: Option<&'a str>) -> Self {
        self.query = query;
        self
    }

    /// Sets the `Authorization` header.
    pub fn authorization(mut self, value: Option<&'a str>) -> Self {
        self.authorization = value;
        self
    }

    /// Sets the `Content-Type` header and the body.
    pub fn body(mut self, content_type: Option<&'a str>, body: &'a [u8]) -> Self {
        self.content_type = content_type;
        self.body = body;
        self
    }

    /// A form post (the dashboard's buttons): its body is read as a form, and it is
    /// answered with a redirect to the dashboard. Only a `Content-Type` of
    /// `application/x-www-form-urlencoded` (parameters aside, in any case) says so.
    fn is_form(&self) -> bool {
        self.content_type.is_some_and(|value| {
            value
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
    }

    /// A JSON body: a `Content-Type` of `application/json` or `application/<x>+json`
    /// (parameters aside, in any case), or none at all.
    fn is_json(&self) -> bool {
        self.content_type.is_none_or(|value| {
            let media = value
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase();
            media == "application/json"
                || (media.starts_with("application/") && media.ends_with("+json"))
        })
    }
}

/// A failed request: its status, what to tell the caller, and members of its own for
/// the problem document.
pub(crate) struct Failure {
    pub(crate) status: StatusCode,
    pub(crate) detail: String,
    members: serde_json::Map<String, Value>,
}

impl Failure {
    fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
            members: serde_json::Map::new(),
        }
    }

    /// Adds the member `name` to the problem document.
    fn with(mut self, name: &str, value: Value) -> Self {
        self.members.insert(name.to_owned(), value);
        self
    }
}

/// What a mutation did: the JSON answer's status and body, the dashboard's notice, and
/// where to follow a request still under way.
struct Mutated {
    status: StatusCode,
    body: Value,
    notice: String,
    location: Option<String>,
}

impl Mutated {
    /// Done at once: 200.
    fn done(body: Value) -> Self {
        Self {
            status: StatusCode::OK,
            notice: format!("done: {body}"),
            body,
            location: None,
        }
    }
}

impl Admin {
    /// Answers `request`: the dashboard (HTML), the JSON API, or a problem
    /// (`application/problem+json`: 400, 401, 403, 404, 405, 409, 415, 422, 503).
    ///
    /// The framework adapters call it; call it yourself to mount the service in
    /// another framework.
    pub async fn handle(&self, request: AdminRequest<'_>) -> Response<Bytes> {
        let route = match Route::parse(request.method, request.path) {
            Ok(route) => route,
            Err(NoRoute::NotFound) => {
                return problem(Failure::new(
                    StatusCode::NOT_FOUND,
                    "no such admin route; the routes are listed in the redlock-admin documentation",
                ));
            }
            Err(NoRoute::Method(takes)) => {
                let mut response = problem(Failure::new(
                    StatusCode::METHOD_NOT_ALLOWED,
                    format!("this route takes {takes}"),
                ));
                if let Ok(value) = header::HeaderValue::from_str(takes) {
                    response.headers_mut().insert(header::ALLOW, value);
                }
                return response;
            }
        };
        let mut params = parse_pairs(request.query.unwrap_or_default().as_bytes());
        // A body is read as a form only when its content type says it is one.
        let form = if request.is_form() {
            parse_pairs(request.body)
        } else {
            HashMap::new()
        };
        if route.mutates() {
            if let Err(failure) = self.authorize(&request, &params, &form) {
                let mut response = problem(failure);
                if response.status() == StatusCode::UNAUTHORIZED {
                    response.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        header::HeaderValue::from_static("Bearer realm=\"redlock-admin\""),
                    );
                }
                return response;
            }
            params.extend(form);
            let result = self.mutate(&route, &params, &request).await;
            if request.is_form() {
                return self.back_to_dashboard(&result);
            }
            return match result {
                Ok(mutated) => {
                    let mut response = json_response(mutated.status, &mutated.body);
                    if let Some(value) = mutated
                        .location
                        .and_then(|l| header::HeaderValue::from_str(&l).ok())
                    {
                        response.headers_mut().insert(header::LOCATION, value);
                    }
                    response
                }
                Err(failure) => problem(failure),
            };
        }
        match route {
            Route::Dashboard => {
                let overview = self.overview().await;
                let notice = params.get("notice").map(String::as_str);
                let error = params.get("error").map(String::as_str);
                let refresh = params.get("refresh").is_none_or(|r| r != "off");
                html_response(crate::html::render(self, &overview, notice, error, refresh))
            }
            route => match self.read(&route, &params).await {
                Ok(value) => json_response(StatusCode::OK, &value),
                Err(failure) => problem(failure),
            },
        }
    }

    /// 403 while mutations are off; 400 with the token in the URL; 401 without the
    /// right token. The token is taken from the `Authorization` header or from a form
    /// body (the dashboard's buttons), never from the URL: URLs end up in access logs,
    /// proxies and browser histories.
    fn authorize(
        &self,
        request: &AdminRequest<'_>,
        query: &HashMap<String, String>,
        form: &HashMap<String, String>,
    ) -> Result<(), Failure> {
        let Some(expected) = &self.inner.token else {
            return Err(Failure::new(
                StatusCode::FORBIDDEN,
                "mutating admin routes are switched off: the service must be built with AdminBuilder::allow_mutations(token)",
            ));
        };
        if query.contains_key("token") {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "the admin token is refused in the URL (URLs end up in access logs, proxies and browser histories): send it as `Authorization: Bearer <token>`; nothing was changed",
            ));
        }
        let given = request
            .authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .or_else(|| form.get("token").map(String::as_str));
        match given {
            Some(given) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => Ok(()),
            Some(_) => Err(Failure::new(
                StatusCode::UNAUTHORIZED,
                "the admin token is wrong",
            )),
            None => Err(Failure::new(
                StatusCode::UNAUTHORIZED,
                "this route changes things: send the admin token as `Authorization: Bearer <token>`",
            )),
        }
    }

    async fn read(
        &self,
        route: &Route,
        params: &HashMap<String, String>,
    ) -> Result<Value, Failure> {
        match route {
            Route::Overview => Ok(self.overview().await),
            Route::Nodes => Ok(to_value(&self.redlock()?.node_health().await)),
            Route::Locks => {
                let prefix = params
                    .get("prefix")
                    .cloned()
                    .unwrap_or_else(|| self.inner.resource_prefix.clone());
                let limit = match params.get("limit") {
                    Some(limit) => limit.parse::<usize>().map_err(|_| {
                        Failure::new(StatusCode::BAD_REQUEST, "`limit` must be a whole number")
                    })?,
                    None => self.inner.list_limit,
                };
                let listing = self.redlock()?.locks(prefix).limit(limit).await;
                listing.map(|l| to_value(&l)).map_err(lock_failure)
            }
            Route::Jobs => self
                .scheduler()?
                .jobs()
                .await
                .map(|jobs| to_value(&jobs))
                .map_err(scheduler_failure),
            Route::Leader => self
                .scheduler()?
                .leader()
                .await
                .map(|leader| to_value(&leader))
                .map_err(scheduler_failure),
            Route::Runs => {
                let filter = run_filter(params)?;
                self.scheduler()?
                    .runs(&filter)
                    .await
                    .map(|runs| to_value(&runs))
                    .map_err(scheduler_failure)
            }
            Route::Request { id } => self
                .scheduler()?
                .request(id)
                .await
                .map(|r| to_value(&r))
                .map_err(scheduler_failure),
            Route::Idempotency => self.idempotency_records(params).await,
            Route::JobChanges => {
                let job = params
                    .get("job")
                    .map(String::as_str)
                    .filter(|j| !j.is_empty());
                let limit = match params.get("limit") {
                    Some(limit) => limit.parse::<u32>().map_err(|_| {
                        Failure::new(StatusCode::BAD_REQUEST, "`limit` must be a whole number")
                    })?,
                    None => DEFAULT_CHANGE_LIMIT,
                };
                self.scheduler()?
                    .job_changes(job, limit)
                    .await
                    .map(|changes| to_value(&changes))
                    .map_err(scheduler_failure)
            }
            _ => Err(Failure::new(StatusCode::NOT_FOUND, "no such admin route")),
        }
    }

    async fn mutate(
        &self,
        route: &Route,
        params: &HashMap<String, String>,
        request: &AdminRequest<'_>,
    ) -> Result<Mutated, Failure> {
        match route {
            Route::ForceRelease => {
                let Some(resource) = params.get("resource").filter(|r| !r.is_empty()) else {
                    return Err(Failure::new(
                        StatusCode::BAD_REQUEST,
                        "name the lock to release: `resource=<name>` in the query or the form",
                    ));
                };
                let released = self.redlock()?.force_release(resource).await;
                tracing::warn!(resource = %resource, ok = released.is_ok(), "admin: lock released by force");
                released
                    .map(|r| Mutated::done(to_value(&r)))
                    .map_err(lock_failure)
            }
            Route::ForceReleaseSemaphore => {
                let name = group_name(params, "semaphore")?;
                let released = self.redlock()?.force_release_semaphore(name).await;
                tracing::warn!(semaphore = %name, ok = released.is_ok(), "admin: semaphore released by force");
                released
                    .map(|r| Mutated::done(to_value(&r)))
                    .map_err(lock_failure)
            }
            Route::ForceReleaseRw => {
                let name = group_name(params, "read-write lock")?;
                let released = self.redlock()?.force_release_rw(name).await;
                tracing::warn!(rw_lock = %name, ok = released.is_ok(), "admin: read-write lock released by force");
                released
                    .map(|r| Mutated::done(to_value(&r)))
                    .map_err(lock_failure)
            }
            Route::JobAction { job, action } => {
                let scheduler = self.scheduler()?;
                tracing::info!(job = %job, action = action.name(), "admin: job action");
                match action {
                    JobAction::Pause => scheduler
                        .pause(job)
                        .await
                        .map(|()| Mutated::done(json!({"job": job, "paused": true})))
                        .map_err(scheduler_failure),
                    JobAction::Resume => scheduler
                        .resume(job)
                        .await
                        .map(|()| Mutated::done(json!({"job": job, "paused": false})))
                        .map_err(scheduler_failure),
                    JobAction::Trigger => {
                        let dispatched = scheduler.trigger(job).await.map_err(scheduler_failure)?;
                        self.follow(scheduler, dispatched, Some(job)).await
                    }
                    JobAction::Cancel => {
                        let dispatched = scheduler.cancel(job).await.map_err(scheduler_failure)?;
                        self.follow(scheduler, dispatched, Some(job)).await
                    }
                }
            }
            Route::AddJob => {
                let scheduler = self.scheduler()?;
                let spec = definition(request)?
                    .into_spec()
                    .map_err(|detail| Failure::new(StatusCode::BAD_REQUEST, detail))?;
                tracing::info!(job = %spec.name(), schedule = %spec.expression(), "admin: job added");
                let change = scheduler.add_job(spec).await.map_err(scheduler_failure)?;
                Ok(changed(StatusCode::CREATED, &change))
            }
            Route::RescheduleJob { job } => {
                let scheduler = self.scheduler()?;
                let definition = definition(request)?;
                if definition.name.as_ref().is_some_and(|name| name != job) {
                    return Err(Failure::new(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "the body names another job than the path (`{job}`): a job is not renamed; add it under the new name and remove the old one"
                        ),
                    ));
                }
                if definition.changes_nothing() {
                    return Err(Failure::new(
                        StatusCode::BAD_REQUEST,
                        "nothing to change: give the fields to change (schedule, handler, time_zone, misfire, misfire_grace_ms, timeout_ms, dst, run_on_leader)",
                    ));
                }
                // The fields not given keep the definition in force.
                let current = scheduler
                    .job_spec(job)
                    .await
                    .map_err(scheduler_failure)?
                    .ok_or_else(|| {
                        scheduler_failure(RequestError::UnknownJob {
                            name: job.to_owned(),
                        })
                    })?;
                let spec = definition.apply(current);
                tracing::info!(job = %job, schedule = %spec.expression(), "admin: job rescheduled");
                let change = scheduler
                    .reschedule_job(spec)
                    .await
                    .map_err(scheduler_failure)?;
                Ok(changed(StatusCode::OK, &change))
            }
            Route::RemoveJob { job } => {
                let scheduler = self.scheduler()?;
                tracing::info!(job = %job, "admin: job removed");
                let change = scheduler.remove_job(job).await.map_err(scheduler_failure)?;
                Ok(changed(StatusCode::OK, &change))
            }
            Route::StepDown => {
                tracing::info!("admin: leader asked to step down");
                let scheduler = self.scheduler()?;
                let dispatched = scheduler.step_down().await.map_err(scheduler_failure)?;
                self.follow(scheduler, dispatched, None).await
            }
            _ => Err(Failure::new(StatusCode::NOT_FOUND, "no such admin route")),
        }
    }

    /// A control (trigger, cancel, step down) just dispatched (for an admin: recorded
    /// as a request): waits up to the request wait for a replica to carry it out, and
    /// says what happened. Done: 200 with its result; not carried out: 409; still under
    /// way (no replica took it yet, or it is being carried out): 202, with its URL to
    /// poll in `Location` and `poll`.
    async fn follow(
        &self,
        scheduler: &SchedulerAdmin,
        dispatched: Dispatched,
        job: Option<&str>,
    ) -> Result<Mutated, Failure> {
        let id = match dispatched {
            Dispatched::Requested { id } => id,
            // Done at once (an admin runs no replica, so it does not happen here).
            done => {
                let mut body = to_value(&done);
                if let Some(job) = job {
                    body["job"] = json!(job);
                }
                return Ok(Mutated {
                    status: StatusCode::OK,
                    notice: format!("done: {body}"),
                    body,
                    location: None,
                });
            }
        };
        let poll = format!("{}/api/requests/{id}", self.inner.mount);
        let request = scheduler.wait_up_to(&id, self.inner.request_wait).await;
        let mut body = json!({"request": id, "poll": poll});
        if let Some(job) = job {
            body["job"] = json!(job);
        }
        let request = match request {
            Ok(request) => request,
            Err(err) => {
                tracing::warn!(request = %id, error = %err, "admin: a request was recorded but could not be read back");
                body["state"] = Value::Null;
                body["message"] =
                    json!("recorded, but where it stands could not be read back: poll it");
                return Ok(Mutated {
                    status: StatusCode::ACCEPTED,
                    notice: format!(
                        "recorded, but where it stands could not be read back (request {id})"
                    ),
                    body,
                    location: Some(poll),
                });
            }
        };
        let what = what(&request);
        body["state"] = to_value(&request.state);
        body["result"] = to_value(&request.result);
        body["done_by"] = to_value(&request.done_by);
        let by = request.done_by.as_deref().unwrap_or("a replica");
        match request.state {
            RequestState::Succeeded => {
                let result = request.result.as_deref().unwrap_or("ok");
                Ok(Mutated {
                    status: StatusCode::OK,
                    notice: format!("done: {what} by {by}: {result}"),
                    body,
                    location: None,
                })
            }
            RequestState::Failed | RequestState::Expired => {
                let result = request.result.as_deref().unwrap_or("no reason recorded");
                Err(Failure::new(
                    StatusCode::CONFLICT,
                    format!("{what} was not carried out: {result}"),
                )
                .with("request", json!(id))
                .with("state", body["state"].clone())
                .with("result", json!(result))
                .with("poll", json!(poll)))
            }
            RequestState::Executing => {
                let message = format!("taken: {by} is carrying it out");
                body["message"] = json!(message);
                Ok(Mutated {
                    status: StatusCode::ACCEPTED,
                    notice: format!("{message}: {what} (request {id})"),
                    body,
                    location: Some(poll),
                })
            }
            _ => {
                let claimant = match request.action {
                    RequestAction::Cancel => "replica",
                    _ => "leader",
                };
                let message = format!("queued: no {claimant} has claimed it yet");
                body["message"] = json!(message);
                // Whether one is there to claim it.
                let leader = scheduler.leader().await.ok().flatten();
                body["leader"] = to_value(&leader.as_ref().map(|l| &l.instance));
                let outlook = match &leader {
                    Some(leader) => format!("{} leads and looks twice a second", leader.instance),
                    None => "no replica leads now: it is carried out if one starts leading within a minute of the request, else marked expired".to_owned(),
                };
                Ok(Mutated {
                    status: StatusCode::ACCEPTED,
                    notice: format!("{message}: {what} (request {id}); {outlook}"),
                    body,
                    location: Some(poll),
                })
            }
        }
    }

    /// Everything the dashboard shows; a part that failed carries its error instead.
    pub(crate) async fn overview(&self) -> Value {
        let inner = &self.inner;
        let nodes = async {
            match &inner.redlock {
                Some(redlock) => Some(to_value(&redlock.node_health().await)),
                None => None,
            }
        };
        let locks = async {
            match &inner.redlock {
                Some(redlock) => Some(
                    match redlock
                        .locks(inner.resource_prefix.clone())
                        .limit(inner.list_limit)
                        .await
                    {
                        Ok(listing) => to_value(&listing),
                        Err(err) => json!({"error": lock_failure(err).detail}),
                    },
                ),
                None => None,
            }
        };
        let scheduler = async {
            let scheduler = inner.scheduler.as_ref()?;
            let recent = RunFilter::new().limit(20);
            let (last_leader, jobs, runs, changes) = futures_util::join!(
                scheduler.last_leader(),
                scheduler.jobs(),
                scheduler.runs(&recent),
                scheduler.job_changes(None, DASHBOARD_CHANGES)
            );
            let part = |result: Result<Value, HistoryError>| match result {
                Ok(value) => value,
                Err(err) => json!({"error": scheduler_failure(err).detail}),
            };
            // The leader now, and the last one recorded (which may have stopped).
            let now = chrono::Utc::now();
            let (leader, last_leader) = match last_leader {
                Ok(last) => (
                    to_value(&last.as_ref().filter(|l| l.is_current_at(now))),
                    to_value(&last),
                ),
                Err(err) => {
                    let error = json!({"error": scheduler_failure(err).detail});
                    (error.clone(), error)
                }
            };
            Some(json!({
                "name": scheduler.scheduler(),
                "leader": leader,
                "last_leader": last_leader,
                "jobs": part(jobs.map(|j| to_value(&j))),
                "runs": part(runs.map(|r| to_value(&r))),
                "changes": part(changes.map(|c| to_value(&c))),
            }))
        };
        let (nodes, locks, scheduler) = futures_util::join!(nodes, locks, scheduler);
        json!({
            "nodes": nodes,
            "locks": locks,
            "scheduler": scheduler,
            "mutations": inner.token.is_some(),
        })
    }

    /// `/api/idempotency`: the records whose id starts with `prefix`, in id order, at
    /// most `limit` (default the list limit, at most [`MAX_LIST_LIMIT`]); `truncated`
    /// when more were there.
    async fn idempotency_records(
        &self,
        params: &HashMap<String, String>,
    ) -> Result<Value, Failure> {
        let store = self.inner.idempotency.as_ref().ok_or_else(|| {
            Failure::new(
                StatusCode::NOT_FOUND,
                "this admin service shows no idempotency records (built without an idempotency store)",
            )
        })?;
        let prefix = params.get("prefix").map(String::as_str).unwrap_or_default();
        let limit = match params.get("limit") {
            Some(limit) => limit.parse::<usize>().map_err(|_| {
                Failure::new(StatusCode::BAD_REQUEST, "`limit` must be a whole number")
            })?,
            None => self.inner.list_limit,
        }
        .clamp(1, MAX_LIST_LIMIT);
        // One more than asked: whether the listing was cut.
        let mut records = store.list(prefix, limit + 1).await.map_err(|err| {
            // The store's own message can carry addresses and statements: logged, not
            // sent.
            tracing::warn!(error = %err, "admin: the idempotency store failed");
            Failure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the idempotency store did not answer; the details are in the server's log",
            )
        })?;
        let truncated = records.len() > limit;
        records.truncate(limit);
        let records: Vec<Value> = records
            .iter()
            .map(|record| {
                json!({
                    "id": record.id,
                    "state": record.state.as_str(),
                    "token": record.token,
                    "started_ms": record.started_ms,
                    "status": record.status,
                    "body_len": record.body_len,
                    "expires_in_ms": record
                        .expires_in
                        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                })
            })
            .collect();
        Ok(json!({"prefix": prefix, "records": records, "truncated": truncated}))
    }

    fn redlock(&self) -> Result<&redlock_core::Redlock, Failure> {
        self.inner.redlock.as_ref().ok_or_else(|| {
            Failure::new(
                StatusCode::NOT_FOUND,
                "this admin service shows no locks (built without a Redlock)",
            )
        })
    }

    fn scheduler(&self) -> Result<&SchedulerAdmin, Failure> {
        self.inner.scheduler.as_ref().ok_or_else(|| {
            Failure::new(
                StatusCode::NOT_FOUND,
                "this admin service shows no scheduler (built without a SchedulerAdmin)",
            )
        })
    }

    /// After a dashboard button: back to the dashboard, saying how it went.
    fn back_to_dashboard(&self, result: &Result<Mutated, Failure>) -> Response<Bytes> {
        let (key, message) = match result {
            Ok(mutated) => ("notice", mutated.notice.clone()),
            Err(failure) => ("error", failure.detail.clone()),
        };
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair(key, &message)
            .finish();
        let location = format!("{}/?{query}", self.inner.mount);
        let mut response = Response::new(Bytes::new());
        *response.status_mut() = StatusCode::SEE_OTHER;
        if let Ok(value) = header::HeaderValue::from_str(&location) {
            response.headers_mut().insert(header::LOCATION, value);
        }
        response
    }
}

/// The run filter of a `/api/runs` query.
fn run_filter(params: &HashMap<String, String>) -> Result<RunFilter, Failure> {
    let mut filter = RunFilter::new();
    if let Some(job) = params.get("job").filter(|j| !j.is_empty()) {
        filter = filter.job(job.clone());
    }
    if let Some(outcome) = params.get("outcome").filter(|o| !o.is_empty()) {
        let outcome: Outcome = outcome.parse().map_err(|_| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                "`outcome` must be one of running, succeeded, failed, timed_out, skipped, abandoned, cancelled",
            )
        })?;
        filter = filter.outcome(outcome);
    }
    if let Some(limit) = params.get("limit") {
        let limit = limit
            .parse::<u32>()
            .map_err(|_| Failure::new(StatusCode::BAD_REQUEST, "`limit` must be a whole number"))?;
        filter = filter.limit(limit);
    }
    Ok(filter)
}

/// The job definition in the body of `request` (JSON): 415 for a body of another
/// type (a form, say: the definition is not read from one), 400 for one that cannot be
/// read.
fn definition(request: &AdminRequest<'_>) -> Result<Definition, Failure> {
    if !request.is_json() {
        return Err(Failure::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send the job's definition as a JSON object with `Content-Type: application/json` (and the token as `Authorization: Bearer <token>`)",
        ));
    }
    Definition::from_json(request.body)
        .map_err(|detail| Failure::new(StatusCode::BAD_REQUEST, detail))
}

/// A job change made: its status (201 for an addition) and JSON, and the dashboard's
/// notice.
fn changed(status: StatusCode, change: &JobChange) -> Mutated {
    let schedule = |spec: Option<&redlock_scheduler::JobSpec>| {
        spec.map_or_else(
            || "-".to_owned(),
            |spec| format!("`{}` ({})", spec.expression(), spec.zone()),
        )
    };
    let what = match change.action {
        JobChangeAction::Add => format!(
            "job `{}` added: {}, handler `{}`",
            change.job,
            schedule(change.definition.as_ref()),
            change
                .definition
                .as_ref()
                .map_or("?", |spec| spec.handler_name())
        ),
        JobChangeAction::Reschedule => format!(
            "job `{}` rescheduled: {} → {}",
            change.job,
            schedule(change.previous.as_ref()),
            schedule(change.definition.as_ref())
        ),
        JobChangeAction::Remove => format!("job `{}` removed", change.job),
        other => format!("job `{}`: {}", change.job, other.as_str()),
    };
    Mutated {
        status,
        notice: format!(
            "done: {what} (change {} by {})",
            change.seq, change.changed_by
        ),
        body: to_value(change),
        location: None,
    }
}

/// What a request asked, in words.
fn what(request: &Request) -> String {
    let job = request.job.as_deref().unwrap_or("?");
    match request.action {
        RequestAction::Trigger => format!("trigger `{job}`"),
        RequestAction::Cancel => format!("cancel the run of `{job}`"),
        RequestAction::StepDown => "step down".to_owned(),
        other => other.as_str().to_owned(),
    }
}

/// The `name` of the semaphore or read-write lock (`what`) to release: 400 without one.
fn group_name<'p>(params: &'p HashMap<String, String>, what: &str) -> Result<&'p str, Failure> {
    params
        .get("name")
        .map(String::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                format!("name the {what} to release: `name=<name>` in the query or the form"),
            )
        })
}

fn lock_failure(err: redlock_core::Error) -> Failure {
    match &err {
        redlock_core::Error::Argument(_) | redlock_core::Error::Config(_) => {
            Failure::new(StatusCode::BAD_REQUEST, err.to_string())
        }
        _ => Failure::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string()),
    }
}

fn scheduler_failure(err: impl Into<redlock_scheduler::Error>) -> Failure {
    use redlock_scheduler::Error as E;
    let err = err.into();
    match &err {
        E::Request(RequestError::UnknownJob { .. } | RequestError::UnknownRequest { .. }) => {
            Failure::new(StatusCode::NOT_FOUND, err.to_string())
        }
        E::Request(
            RequestError::NotLeader
            | RequestError::AlreadyRunning { .. }
            | RequestError::AlreadyClaimed { .. }
            | RequestError::NotRunning { .. }
            | RequestError::JobExists { .. }
            | RequestError::ChangeConflict { .. }
            // Replicas alive run a version that would not apply a job change.
            | RequestError::ReplicasOutdated { .. },
        ) => Failure::new(StatusCode::CONFLICT, err.to_string()),
        // A definition that cannot work: its schedule, time zone or an option.
        E::Request(RequestError::InvalidJob(_)) => {
            Failure::new(StatusCode::BAD_REQUEST, err.to_string())
        }
        // A name too long for the lock keys made from it: the bound, in bytes, with it.
        E::Request(RequestError::NameTooLong(name)) => {
            Failure::new(StatusCode::BAD_REQUEST, err.to_string())
                .with("name_kind", to_value(&name.kind))
                .with("len", json!(name.len))
                .with("max_len", json!(name.max))
        }
        // A definition that reads well, naming a handler no live replica registered.
        E::Request(RequestError::UnknownHandler { .. }) => {
            Failure::new(StatusCode::UNPROCESSABLE_ENTITY, err.to_string())
        }
        E::History(
            HistoryError::Database(_)
            | HistoryError::Timeout { .. }
            | HistoryError::Connect { .. }
            | HistoryError::Migration { .. },
        ) => {
            // The database's own message can carry statements and addresses: logged,
            // not sent.
            tracing::warn!(error = %err, "admin: the history database failed");
            Failure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the scheduler's history database did not answer; the details are in the server's log",
            )
        }
        _ => Failure::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string()),
    }
}

fn to_value<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or_else(|err| json!({"error": err.to_string()}))
}

fn parse_pairs(input: &[u8]) -> HashMap<String, String> {
    form_urlencoded::parse(input).into_owned().collect()
}

/// Compares without stopping at the first difference (the time taken tells nothing of
/// how much of a guessed token was right).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, byte) in b.iter().enumerate() {
        diff |= byte ^ a.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

fn json_response(status: StatusCode, value: &Value) -> Response<Bytes> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    no_store(response)
}

fn html_response(page: String) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(page));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    no_store(response)
}

fn problem(failure: Failure) -> Response<Bytes> {
    let mut body = json!({
        "type": "about:blank",
        "title": failure.status.canonical_reason().unwrap_or("error"),
        "status": failure.status.as_u16(),
        "detail": failure.detail,
    });
    if let Some(object) = body.as_object_mut() {
        for (name, value) in failure.members {
            object.entry(name).or_insert(value);
        }
    }
    let mut response = Response::new(Bytes::from(serde_json::to_vec(&body).unwrap_or_default()));
    *response.status_mut() = failure.status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/problem+json"),
    );
    no_store(response)
}

/// Admin pages change by the second, and may be behind authentication: never cached.
fn no_store(mut response: Response<Bytes>) -> Response<Bytes> {
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"0123456789abcdeX", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"0123456789abcde", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"0123456789abcdef0", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}

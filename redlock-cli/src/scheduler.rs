//! The commands that work on the scheduler's history database through a
//! [`SchedulerAdmin`]: `jobs`, `history`, `leader`, `pause`, `resume`, the requests a
//! running replica carries out (`trigger`, `cancel`, `step-down`, read back with
//! `request`), and the jobs changed at run time (`jobs add`, `jobs reschedule`,
//! `jobs remove`, `jobs changes`).

use std::time::Duration;

use chrono::{SubsecRound as _, Utc};
use redlock_scheduler::admin::{
    JobInfo, LeaderInfo, Request, RequestAction, RequestState, SchedulerAdmin,
};
use redlock_scheduler::changes::{JobChange, JobChangeAction};
use redlock_scheduler::error::{HistoryError, RequestError};
use redlock_scheduler::history::{Outcome, Run, RunFilter};
use redlock_scheduler::{Error, History, JobSpec};
use serde_json::Value;

use crate::cli::{DATABASE_ENV, Global, JobOptions, Wait};
use crate::format::{self, Table, line, or_dash, yes_no};
use crate::outcome::{CliError, EXIT_FAILED, Report};

/// Who the requests are recorded as made by: `--operator`, else `$USER`, else
/// `redlock-cli`.
fn operator(global: &Global) -> String {
    global
        .operator
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .filter(|name| !name.trim().is_empty())
        .unwrap_or_else(|| "redlock-cli".to_owned())
}

/// The file a SQLite URL names, unless it is in memory or says its own `mode`.
fn sqlite_file(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once(':')?;
    if !scheme.eq_ignore_ascii_case("sqlite") {
        return None;
    }
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    let has_mode = query.is_some_and(|q| q.split('&').any(|pair| pair.starts_with("mode=")));
    (!path.is_empty() && path != ":memory:" && !has_mode).then_some(path)
}

/// The admin of the scheduler `--scheduler` in the history `--database`.
async fn admin(global: &Global) -> Result<SchedulerAdmin, CliError> {
    let Some(url) = global
        .database
        .as_deref()
        .map(str::trim)
        .filter(|url| !url.is_empty())
    else {
        return Err(CliError::failed(format!(
            "no history database configured: pass --database URL or set {DATABASE_ENV} (sqlite://PATH or postgres://USER@HOST/DB), the scheduler's history as the services use it"
        )));
    };
    let mut url = url.to_owned();
    if let Some(path) = sqlite_file(&url) {
        // Opening would create a missing file: a mistyped path would show no jobs.
        if !std::path::Path::new(path).exists() {
            return Err(CliError::failed(format!(
                "the history database file `{path}` does not exist: check --database / {DATABASE_ENV} (the scheduler's replicas create it when they start)"
            )));
        }
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str("mode=rw");
    }
    let history = History::builder(url)
        .connect_timeout(global.timeout)
        .statement_timeout(global.timeout)
        .max_connections(2)
        .connect()
        .await
        .map_err(|err| match err {
            HistoryError::InvalidUrl { .. } | HistoryError::Config(_) => {
                CliError::failed(format!("{err} (--database / {DATABASE_ENV})"))
            }
            other => CliError::failed(format!(
                "{other}; check --database / {DATABASE_ENV} and that the database is up"
            )),
        })?;
    Ok(SchedulerAdmin::new(history, global.scheduler.clone()).operator(operator(global)))
}

/// An error of a query through `admin`, with what to do.
fn query_error(admin: &SchedulerAdmin, err: impl Into<Error>) -> CliError {
    let err = err.into();
    match err {
        Error::Request(RequestError::UnknownJob { .. }) => CliError::failed(format!(
            "{err} (scheduler `{}` in {}: `redlock jobs` lists them; --scheduler / REDLOCK_SCHEDULER names the scheduler)",
            admin.scheduler(),
            admin.history().place()
        )),
        Error::Request(
            RequestError::UnknownRequest { .. }
            | RequestError::NotDone { .. }
            | RequestError::JobExists { .. }
            | RequestError::UnknownHandler { .. }
            | RequestError::InvalidJob(_)
            | RequestError::NameTooLong(_)
            | RequestError::ReplicasOutdated { .. }
            | RequestError::ChangeConflict { .. },
        ) => CliError::failed(err.to_string()),
        other => CliError::failed(format!(
            "{other} ({}); check that the database is up",
            admin.history().place()
        )),
    }
}

/// `redlock jobs`.
pub(crate) async fn jobs(global: &Global, ticks: usize) -> Result<Report, CliError> {
    let admin = admin(global).await?.next_ticks(ticks);
    let jobs = admin.jobs().await.map_err(|e| query_error(&admin, e))?;
    if global.json {
        return Ok(Report::ok(format::json(&jobs)?));
    }
    let last = admin
        .last_leader()
        .await
        .map_err(|e| query_error(&admin, e))?;
    let now = Utc::now();
    let mut out = String::new();
    match (last.clone().filter(|l| l.is_current_at(now)), last) {
        (Some(leader), _) => line(
            &mut out,
            format!(
                "scheduler `{}`: leader {} (epoch {}, since {})\n",
                admin.scheduler(),
                leader.instance,
                leader.epoch,
                format::time_from(leader.since, now)
            ),
        ),
        (None, Some(last)) => line(
            &mut out,
            format!(
                "scheduler `{}`: no leader (the last, {}, {})\n",
                admin.scheduler(),
                last.instance,
                no_longer_leads(&last, now)
            ),
        ),
        (None, None) => line(
            &mut out,
            format!("scheduler `{}`: no leader recorded\n", admin.scheduler()),
        ),
    }
    let mut report = if jobs.is_empty() {
        line(&mut out, "no jobs published");
        let mut report = Report::ok(out);
        report.warnings.push(format!(
            "no replica of scheduler `{}` published jobs in {}: replicas publish theirs when they start; check --scheduler / REDLOCK_SCHEDULER",
            admin.scheduler(),
            admin.history().place()
        ));
        report
    } else {
        out.push_str(&render_jobs(&jobs, now));
        Report::ok(out)
    };
    for job in &jobs {
        if let Some(error) = &job.schedule_error {
            report.warnings.push(format!(
                "job `{}`: its schedule `{}` does not parse here: {error}",
                job.name, job.schedule
            ));
        }
    }
    Ok(report)
}

fn render_jobs(jobs: &[JobInfo], now: chrono::DateTime<Utc>) -> String {
    let mut table = Table::new(&[
        "JOB",
        "SCHEDULE",
        "ZONE",
        "DST",
        "PAUSED",
        "RUNNING",
        "NEXT TICK",
        "LAST RUN",
        "LAST TICK",
    ]);
    for job in jobs {
        table.row(vec![
            job.name.clone(),
            job.schedule.clone(),
            job.time_zone.clone(),
            // `<gap>/<fold>` (used by fixed-time schedules only); a policy this version
            // does not know is `?` (the warning below says its ticks are not computed).
            job.dst
                .map_or_else(|| "?".to_owned(), |dst| dst.to_string()),
            yes_no(job.paused),
            match (&job.running_on, job.running) {
                (Some(on), _) => format!("on {on}"),
                (None, true) => "yes".to_owned(),
                (None, false) => "no".to_owned(),
            },
            match (job.next_ticks.first(), &job.schedule_error) {
                (Some(next), _) => format::time_from(*next, now),
                (None, Some(_)) => "invalid schedule".to_owned(),
                (None, None) => "never".to_owned(),
            },
            job.last_run
                .as_ref()
                .map_or("-".to_owned(), |run| run.outcome.as_str().to_owned()),
            job.last_run
                .as_ref()
                .map_or("-".to_owned(), |run| format::time_from(run.tick, now)),
        ]);
    }
    table.render()
}

/// The filter of `redlock history`.
#[derive(Debug)]
pub(crate) struct HistoryQuery<'a> {
    /// The job.
    pub(crate) job: &'a str,
    /// Only runs that ended so.
    pub(crate) outcome: Option<Outcome>,
    /// At most this many.
    pub(crate) limit: u32,
    /// Ticks at or after.
    pub(crate) since: Option<chrono::DateTime<Utc>>,
    /// Ticks at or before.
    pub(crate) until: Option<chrono::DateTime<Utc>>,
}

/// `redlock history JOB`.
pub(crate) async fn history(global: &Global, query: HistoryQuery<'_>) -> Result<Report, CliError> {
    let admin = admin(global).await?;
    let mut filter = RunFilter::new().job(query.job).limit(query.limit);
    if let Some(outcome) = query.outcome {
        filter = filter.outcome(outcome);
    }
    if let Some(since) = query.since {
        filter = filter.since(since);
    }
    if let Some(until) = query.until {
        filter = filter.until(until);
    }
    let runs = admin
        .runs(&filter)
        .await
        .map_err(|e| query_error(&admin, e))?;
    if runs.is_empty() {
        // No rows: a job that exists but has none that match, or a name that is wrong.
        admin
            .job(query.job)
            .await
            .map_err(|e| query_error(&admin, e))?;
    }
    if global.json {
        return Ok(Report::ok(format::json(&runs)?));
    }
    if runs.is_empty() {
        return Ok(Report::ok(format!("no runs of `{}` match\n", query.job)));
    }
    Ok(Report::ok(render_runs(&runs)))
}

fn render_runs(runs: &[Run]) -> String {
    let now = Utc::now();
    let mut table = Table::new(&[
        "TICK",
        "OUTCOME",
        "INSTANCE",
        "DURATION",
        "MANUAL",
        "FENCING TOKEN",
        "ERROR",
    ]);
    for run in runs {
        let took = match (run.started, run.finished) {
            (Some(started), Some(finished)) => {
                format::duration((finished - started).to_std().unwrap_or_default())
            }
            (Some(started), None) => format!(
                "{} so far",
                format::duration((now - started).to_std().unwrap_or_default())
            ),
            _ => "-".to_owned(),
        };
        table.row(vec![
            format::time(run.tick),
            run.outcome.as_str().to_owned(),
            run.instance.clone(),
            took,
            yes_no(run.manual),
            or_dash(run.fencing_token),
            run.error.clone().unwrap_or_default(),
        ]);
    }
    table.render()
}

/// `redlock leader`: the leader now (JSON: `null` if none), or why there is none.
pub(crate) async fn leader(global: &Global) -> Result<Report, CliError> {
    let admin = admin(global).await?;
    let last = admin
        .last_leader()
        .await
        .map_err(|e| query_error(&admin, e))?;
    let now = Utc::now();
    let leader = last.clone().filter(|l| l.is_current_at(now));
    if global.json {
        return Ok(Report::ok(format::json(&leader)?));
    }
    Ok(Report::ok(match (leader, last) {
        (Some(leader), _) => format!(
            "{} leads scheduler `{}` (epoch {}, since {})\n",
            leader.instance,
            admin.scheduler(),
            leader.epoch,
            format::time_from(leader.since, now)
        ),
        (None, Some(last)) => format!(
            "no leader for scheduler `{}`: the last, {} (epoch {}), {}\n",
            admin.scheduler(),
            last.instance,
            last.epoch,
            no_longer_leads(&last, now)
        ),
        (None, None) => format!(
            "no leader recorded for scheduler `{}` (no replica ever led)\n",
            admin.scheduler()
        ),
    }))
}

/// Why the leader last recorded no longer leads.
fn no_longer_leads(last: &LeaderInfo, now: chrono::DateTime<Utc>) -> String {
    match (last.ended, last.expires) {
        (Some(ended), _) => format!(
            "ended its leadership at {} (stepped down or shut down; no other replica took over)",
            format::time_from(ended, now)
        ),
        (None, Some(expires)) => format!(
            "stopped renewing its record, which ran out at {} (it stopped without stepping down: crashed, or lost the database)",
            format::time_from(expires, now)
        ),
        (None, None) => "no longer leads".to_owned(),
    }
}

/// `redlock pause JOB` (`pause`) or `redlock resume JOB`.
pub(crate) async fn pause(global: &Global, job: &str, pause: bool) -> Result<Report, CliError> {
    let admin = admin(global).await?;
    let done = if pause {
        admin.pause(job).await
    } else {
        admin.resume(job).await
    };
    done.map_err(|e| query_error(&admin, e))?;
    let info = admin.job(job).await.map_err(|e| query_error(&admin, e))?;
    if global.json {
        return Ok(Report::ok(format::json(&info)?));
    }
    Ok(Report::ok(if pause {
        format!(
            "paused `{job}`: its ticks are skipped (recorded as skipped) from the leader's next look, within a second, until `redlock resume {job}`\n"
        )
    } else {
        format!(
            "resumed `{job}`: next tick {}\n",
            info.next_ticks
                .first()
                .map_or("-".to_owned(), |t| format::time_from(*t, Utc::now()))
        )
    }))
}

/// What a command asks of a running replica.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ask<'a> {
    /// Run the job once now.
    Trigger(&'a str),
    /// Cancel the job's run going now.
    Cancel(&'a str),
    /// The leader gives leadership up.
    StepDown,
}

/// `redlock trigger JOB`, `redlock cancel JOB`, `redlock step-down`: makes the request,
/// and waits for its result unless told not to.
pub(crate) async fn request(
    global: &Global,
    ask: Ask<'_>,
    wait: &Wait,
) -> Result<Report, CliError> {
    let admin = admin(global).await?;
    let dispatched = match ask {
        Ask::Trigger(job) => admin.trigger(job).await,
        Ask::Cancel(job) => admin.cancel(job).await,
        Ask::StepDown => admin.step_down().await,
    }
    .map_err(|e| query_error(&admin, e))?;
    // An admin runs no replica: every control it makes is a request to follow.
    let Some(id) = dispatched.request_id().map(str::to_owned) else {
        return Ok(Report::ok(format::json(&dispatched)?));
    };
    if wait.no_wait {
        let request = admin
            .request(&id)
            .await
            .map_err(|e| query_error(&admin, e))?;
        return show_request(global, &request);
    }
    let request = admin
        .wait(&id, wait.wait)
        .await
        .map_err(|e| query_error(&admin, e))?;
    show_request(global, &request)
}

/// `redlock request ID [--wait D]`.
pub(crate) async fn read_request(
    global: &Global,
    id: &str,
    wait: Option<Duration>,
) -> Result<Report, CliError> {
    let admin = admin(global).await?;
    let request = match wait {
        Some(wait) => admin.wait(id, wait).await,
        None => admin.request(id).await,
    }
    .map_err(|e| query_error(&admin, e))?;
    show_request(global, &request)
}

/// What a request asked, in words.
fn what(request: &Request) -> String {
    let job = request.job.as_deref().unwrap_or("?");
    match request.action {
        RequestAction::Trigger => format!("trigger `{job}`"),
        RequestAction::Cancel => format!("cancel `{job}`"),
        RequestAction::StepDown => "step down".to_owned(),
        _ => request.action.as_str().to_owned(),
    }
}

fn state(state: RequestState) -> &'static str {
    match state {
        RequestState::Pending => "pending",
        RequestState::Executing => "executing",
        RequestState::Succeeded => "succeeded",
        RequestState::Failed => "failed",
        RequestState::Expired => "expired",
        _ => "?",
    }
}

/// Prints a request; a failed or expired one also fails the command.
fn show_request(global: &Global, request: &Request) -> Result<Report, CliError> {
    let output = if global.json {
        format::json(request)?
    } else {
        let now = Utc::now();
        let mut out = String::new();
        let mut field = |name: &str, value: String| line(&mut out, format!("{name:<9} {value}"));
        field("request", request.id.clone());
        field("action", what(request));
        field("state", state(request.state).to_owned());
        if let Some(result) = &request.result {
            field("result", result.clone());
        }
        field(
            "asked",
            format!(
                "{} by {}",
                format::time_from(request.requested, now),
                request.requested_by
            ),
        );
        if let Some(done) = request.done {
            let after = (done - request.requested).to_std().unwrap_or_default();
            field(
                "taken",
                format!(
                    "{} by {} ({} after the request)",
                    format::time(done),
                    request.done_by.as_deref().unwrap_or("?"),
                    format::duration(after)
                ),
            );
        }
        if !request.is_done() {
            field(
                "follow",
                format!("redlock request {} --wait 10s", request.id),
            );
        }
        out
    };
    let mut report = Report::ok(output);
    if matches!(request.state, RequestState::Failed | RequestState::Expired) {
        report.error = Some(format!(
            "{} was not carried out: {}",
            what(request),
            request.result.as_deref().unwrap_or("no reason recorded")
        ));
        report.code = EXIT_FAILED;
    }
    Ok(report)
}

/// `redlock jobs add NAME --cron EXPR [options]`.
pub(crate) async fn add_job(
    global: &Global,
    name: &str,
    cron: &str,
    options: &JobOptions,
) -> Result<Report, CliError> {
    let admin = admin(global).await?;
    let spec = with_options(JobSpec::new(name, cron), options);
    let change = admin
        .add_job(spec)
        .await
        .map_err(|e| query_error(&admin, e))?;
    show_change(global, &change)
}

/// `redlock jobs reschedule NAME [options]`: the options given change, the others keep
/// the definition in force.
pub(crate) async fn reschedule_job(
    global: &Global,
    name: &str,
    cron: Option<&str>,
    options: &JobOptions,
    no_run_timeout: bool,
) -> Result<Report, CliError> {
    let JobOptions {
        handler,
        zone,
        misfire,
        grace,
        run_timeout,
        dst,
        on_leader,
    } = options;
    let nothing = cron.is_none()
        && handler.is_none()
        && zone.is_none()
        && misfire.is_none()
        && grace.is_none()
        && run_timeout.is_none()
        && dst.is_none()
        && on_leader.is_none()
        && !no_run_timeout;
    if nothing {
        return Err(CliError::usage(
            "nothing to change: give --cron, --handler, --zone, --misfire, --grace, --run-timeout, --no-run-timeout, --dst or --on-leader",
        ));
    }
    let admin = admin(global).await?;
    let Some(mut spec) = admin
        .job_spec(name)
        .await
        .map_err(|e| query_error(&admin, e))?
    else {
        let unknown = RequestError::UnknownJob {
            name: name.to_owned(),
        };
        return Err(query_error(&admin, unknown));
    };
    if let Some(cron) = cron {
        spec = spec.schedule(cron);
    }
    if no_run_timeout {
        spec = spec.timeout(None);
    }
    let change = admin
        .reschedule_job(with_options(spec, options))
        .await
        .map_err(|e| query_error(&admin, e))?;
    show_change(global, &change)
}

/// `redlock jobs remove NAME`.
pub(crate) async fn remove_job(global: &Global, name: &str) -> Result<Report, CliError> {
    let admin = admin(global).await?;
    let change = admin
        .remove_job(name)
        .await
        .map_err(|e| query_error(&admin, e))?;
    show_change(global, &change)
}

/// `redlock jobs changes [--job NAME] [--limit N]`.
pub(crate) async fn job_changes(
    global: &Global,
    job: Option<&str>,
    limit: u32,
) -> Result<Report, CliError> {
    let admin = admin(global).await?;
    let changes = admin
        .job_changes(job, limit)
        .await
        .map_err(|e| query_error(&admin, e))?;
    if global.json {
        return Ok(Report::ok(format::json(&changes)?));
    }
    if changes.is_empty() {
        return Ok(Report::ok(match job {
            Some(job) => format!(
                "no changes of `{job}` recorded for scheduler `{}`\n",
                admin.scheduler()
            ),
            None => format!(
                "no job changes recorded for scheduler `{}`\n",
                admin.scheduler()
            ),
        }));
    }
    let now = Utc::now();
    let mut table = Table::new(&["SEQ", "JOB", "ACTION", "BY", "WHEN", "SCHEDULE"]);
    for change in &changes {
        let schedule = |spec: Option<&JobSpec>| {
            spec.map_or_else(
                || "-".to_owned(),
                |spec| format!("{} ({})", spec.expression(), spec.zone()),
            )
        };
        table.row(vec![
            change.seq.to_string(),
            change.job.clone(),
            change.action.as_str().to_owned(),
            change.changed_by.clone(),
            format::time_from(change.changed, now),
            match change.action {
                JobChangeAction::Add => schedule(change.definition.as_ref()),
                JobChangeAction::Remove => format!("{} → -", schedule(change.previous.as_ref())),
                _ => format!(
                    "{} → {}",
                    schedule(change.previous.as_ref()),
                    schedule(change.definition.as_ref())
                ),
            },
        ]);
    }
    Ok(Report::ok(table.render()))
}

/// `spec` with the options given.
fn with_options(mut spec: JobSpec, options: &JobOptions) -> JobSpec {
    if let Some(handler) = &options.handler {
        spec = spec.handler(handler.clone());
    }
    if let Some(zone) = &options.zone {
        spec = spec.time_zone(zone.clone());
    }
    if let Some(misfire) = options.misfire {
        spec = spec.misfire(misfire);
    }
    if let Some(grace) = options.grace {
        spec = spec.misfire_grace(grace);
    }
    if let Some(timeout) = options.run_timeout {
        spec = spec.timeout(timeout);
    }
    if let Some(dst) = options.dst {
        spec = spec.dst(dst);
    }
    if let Some(on_leader) = options.on_leader {
        spec = spec.run_on_leader(on_leader);
    }
    spec
}

/// A job's settings as `jobs add` takes them, in order: (label, value).
fn settings(spec: &JobSpec) -> Vec<(&'static str, String)> {
    // The spec's own JSON gives the settings it has no getter for.
    let json = serde_json::to_value(spec).unwrap_or(Value::Null);
    let millis = |field: &str| {
        json.get(field).and_then(Value::as_u64).map_or_else(
            || "none".to_owned(),
            |ms| format::duration(Duration::from_millis(ms)),
        )
    };
    let misfire = match (
        json.pointer("/misfire/policy").and_then(Value::as_str),
        json.pointer("/misfire/max").and_then(Value::as_u64),
    ) {
        (Some(policy), Some(max)) => format!("{policy}:{max}"),
        (Some(policy), None) => policy.to_owned(),
        _ => "?".to_owned(),
    };
    vec![
        ("schedule", spec.expression().to_owned()),
        ("zone", spec.zone().to_owned()),
        ("handler", spec.handler_name().to_owned()),
        ("misfire", misfire),
        ("grace", millis("misfire_grace_ms")),
        ("timeout", millis("timeout_ms")),
        (
            "dst",
            json.get("dst")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_owned(),
        ),
        (
            "on leader",
            yes_no(json.get("run_on_leader").and_then(Value::as_bool) == Some(true)),
        ),
    ]
}

/// Prints a job change: what it did, by whom, and the settings (before → after where
/// they changed).
fn show_change(global: &Global, change: &JobChange) -> Result<Report, CliError> {
    if global.json {
        return Ok(Report::ok(format::json(change)?));
    }
    let what = match change.action {
        JobChangeAction::Add => "added",
        JobChangeAction::Reschedule => "rescheduled",
        JobChangeAction::Remove => "removed",
        _ => change.action.as_str(),
    };
    let mut out = String::new();
    line(
        &mut out,
        format!(
            "{what} job `{}` (change {} by {}, {})",
            change.job,
            change.seq,
            change.changed_by,
            // To the millisecond, as the history keeps it.
            format::time(change.changed.trunc_subsecs(3))
        ),
    );
    let before = change.previous.as_ref().map(settings);
    let after = change.definition.as_ref().map(settings);
    match (before, after) {
        (Some(before), Some(after)) => {
            for ((label, old), (_, new)) in before.into_iter().zip(after) {
                if old == new {
                    line(&mut out, format!("  {label:<9}  {new}"));
                } else {
                    line(&mut out, format!("  {label:<9}  {old} → {new}"));
                }
            }
        }
        (None, Some(settings)) => {
            for (label, value) in settings {
                line(&mut out, format!("  {label:<9}  {value}"));
            }
        }
        (Some(settings), None) => {
            line(&mut out, "  its last definition:");
            for (label, value) in settings {
                line(&mut out, format!("  {label:<9}  {value}"));
            }
        }
        (None, None) => {}
    }
    if matches!(
        change.action,
        JobChangeAction::Add | JobChangeAction::Reschedule
    ) {
        line(
            &mut out,
            "every replica applies it within a second; the leader fires its ticks after the time of the change",
        );
    }
    Ok(Report::ok(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_files_are_told_apart() {
        assert_eq!(sqlite_file("sqlite:///tmp/h.db"), Some("/tmp/h.db"));
        assert_eq!(sqlite_file("sqlite://h.db"), Some("h.db"));
        assert_eq!(sqlite_file("sqlite:h.db?cache=shared"), Some("h.db"));
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("sqlite:x?mode=memory&cache=shared"), None);
        assert_eq!(sqlite_file("postgres://u@h/db"), None);
    }
}

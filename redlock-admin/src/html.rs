//! The dashboard: one server-rendered page, no scripts, reloading itself.
//!
//! Every value shown is escaped. The buttons are one form (its password field holds
//! the admin token) whose buttons post to their own routes (`formaction`), the token in
//! the form's body, never in a URL; the answer is a redirect back here with a notice.
//! Pressing Enter in the token field submits nothing: the form's first submit button,
//! the one an implicit submission would press, is a hidden, disabled one.

use std::fmt::Write as _;

use serde_json::Value;

use crate::admin::Admin;

/// The page, from [`Admin::overview`]'s JSON.
pub(crate) fn render(
    admin: &Admin,
    overview: &Value,
    notice: Option<&str>,
    error: Option<&str>,
    refresh: bool,
) -> String {
    let inner = &admin.inner;
    let mount = &inner.mount;
    let mut page = String::with_capacity(16 * 1024);
    let _ = write!(
        page,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>",
        title = esc(&inner.title)
    );
    if refresh {
        let _ = write!(
            page,
            "<meta http-equiv=\"refresh\" content=\"{};url={}/\">",
            inner.refresh.as_secs().max(1),
            esc(mount)
        );
    }
    page.push_str(STYLE);
    let _ = write!(page, "</head><body><h1>{}</h1>", esc(&inner.title));
    if let Some(notice) = notice {
        let _ = write!(
            page,
            "<p class=\"notice\" id=\"notice\">{}</p>",
            esc(notice)
        );
    }
    if let Some(error) = error {
        let _ = write!(page, "<p class=\"error\" id=\"error\">{}</p>", esc(error));
    }
    let _ = write!(
        page,
        "<p class=\"meta\">{} · <a href=\"{m}/api/overview\">JSON</a> · {}</p>",
        if refresh {
            format!(
                "reloads every {} s (<a href=\"{m}/?refresh=off\">stop</a>)",
                inner.refresh.as_secs().max(1),
                m = esc(mount)
            )
        } else {
            format!(
                "not reloading (<a href=\"{}/\">reload and resume</a>)",
                esc(mount)
            )
        },
        chrono::Utc::now().format("%Y-%m-%d %H:%M:%S UTC"),
        m = esc(mount)
    );
    let mutations = inner.token.is_some();
    if mutations {
        page.push_str(
            "<form method=\"post\" enctype=\"application/x-www-form-urlencoded\" id=\"actions\"><button type=\"submit\" disabled hidden aria-hidden=\"true\"></button><p><label>Admin token <input type=\"password\" name=\"token\" id=\"token\" autocomplete=\"off\"></label> (needed by the buttons)</p>",
        );
    }
    if let Some(nodes) = overview.get("nodes").filter(|n| !n.is_null()) {
        nodes_section(&mut page, nodes);
    }
    if let Some(locks) = overview.get("locks").filter(|l| !l.is_null()) {
        locks_section(&mut page, locks, mount, mutations);
        if locks.get("error").is_none() {
            semaphores_section(&mut page, locks, mount, mutations);
            rw_locks_section(&mut page, locks, mount, mutations);
        }
    }
    if let Some(scheduler) = overview.get("scheduler").filter(|s| !s.is_null()) {
        scheduler_section(&mut page, scheduler, mount, mutations);
    }
    if mutations {
        page.push_str("</form>");
    } else {
        page.push_str("<p class=\"meta\">Actions are switched off (read-only dashboard).</p>");
    }
    page.push_str("</body></html>");
    page
}

fn nodes_section(page: &mut String, nodes: &Value) {
    page.push_str("<h2>Nodes</h2><table id=\"nodes\"><tr><th>node</th><th>state</th><th>latency</th><th>version</th><th>role</th><th>eviction</th><th>persistence</th><th>warnings</th></tr>");
    for node in nodes.as_array().into_iter().flatten() {
        let state = match (
            node.get("error").and_then(Value::as_str),
            node.get("quarantined_ms").and_then(Value::as_u64),
        ) {
            (Some(error), _) => format!("<span class=\"bad\">down: {}</span>", esc(error)),
            (None, Some(ms)) => format!(
                "<span class=\"warn\">quarantined, {} s left</span>",
                ms.div_ceil(1000)
            ),
            (None, None) => "<span class=\"good\">votes</span>".to_owned(),
        };
        let latency = node
            .get("latency_us")
            .and_then(Value::as_u64)
            .map_or_else(String::new, |us| format!("{:.2} ms", us as f64 / 1000.0));
        let persistence = match (
            node.get("appendonly").and_then(Value::as_bool),
            text(node, "appendfsync"),
        ) {
            (Some(true), fsync) => format!("aof, fsync {}", esc(&fsync)),
            (Some(false), _) => "no aof".to_owned(),
            _ => String::new(),
        };
        let warnings: Vec<String> = node
            .get("warnings")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(esc)
            .collect();
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{state}</td><td>{latency}</td><td>{}</td><td>{}</td><td>{}</td><td>{persistence}</td><td class=\"warn\">{}</td></tr>",
            esc(&text(node, "node")),
            esc(&text(node, "version")),
            esc(&text(node, "role")),
            esc(&text(node, "maxmemory_policy")),
            warnings.join("<br>")
        );
    }
    page.push_str("</table>");
}

fn locks_section(page: &mut String, locks: &Value, mount: &str, mutations: bool) {
    page.push_str("<h2>Held locks</h2>");
    if locks.get("error").is_some() {
        error_paragraph(page, locks);
        return;
    }
    let list = locks.get("locks").and_then(Value::as_array);
    if list.is_none_or(Vec::is_empty) {
        page.push_str("<p id=\"no-locks\">None.</p>");
        return;
    }
    page.push_str("<table id=\"locks\"><tr><th>resource</th><th>holder</th><th>agreement</th><th>nodes</th><th>validity</th><th>fencing token</th><th>waiters</th>");
    if mutations {
        page.push_str("<th></th>");
    }
    page.push_str("</tr>");
    let total = locks.get("nodes").and_then(Value::as_u64).unwrap_or(0);
    for lock in list.into_iter().flatten() {
        let resource = text(lock, "resource");
        let holder = if lock.get("handed_over").and_then(Value::as_bool) == Some(true) {
            "(handed over)".to_owned()
        } else {
            text(lock, "holder")
        };
        let validity = lock.get("validity_ms").and_then(Value::as_u64).map_or_else(
            || "-".to_owned(),
            |ms| format!("{:.1} s", ms as f64 / 1000.0),
        );
        let _ = write!(
            page,
            "<tr class=\"lock\"><td class=\"resource\">{}</td><td class=\"holder\">{}</td><td>{}</td><td>{}/{total}</td><td>{validity}</td><td>{}</td><td>{}</td>",
            esc(&resource),
            esc(&holder),
            esc(&text(lock, "agreement")),
            lock.get("holding").and_then(Value::as_u64).unwrap_or(0),
            lock.get("fencing_token")
                .and_then(Value::as_u64)
                .map_or_else(|| "-".to_owned(), |t| t.to_string()),
            lock.get("waiters").and_then(Value::as_u64).unwrap_or(0),
        );
        if mutations {
            let query: String = form_urlencoded::Serializer::new(String::new())
                .append_pair("resource", &resource)
                .finish();
            let _ = write!(
                page,
                "<td><button formaction=\"{}/api/locks/release?{}\">Force release</button></td>",
                esc(mount),
                esc(&query)
            );
        }
        page.push_str("</tr>");
    }
    page.push_str("</table>");
    if locks.get("truncated").and_then(Value::as_bool) == Some(true) {
        page.push_str("<p class=\"meta\">More locks are held than shown.</p>");
    }
}

/// The semaphores held (only when some are): permits used of their size, each slot's
/// holder, and a button releasing every permit.
fn semaphores_section(page: &mut String, locks: &Value, mount: &str, mutations: bool) {
    let Some(list) = locks
        .get("semaphores")
        .and_then(Value::as_array)
        .filter(|l| !l.is_empty())
    else {
        return;
    };
    page.push_str("<h2>Semaphores</h2><table id=\"semaphores\"><tr><th>semaphore</th><th>permits used</th><th>slots held (holder, validity, fencing token)</th>");
    if mutations {
        page.push_str("<th></th>");
    }
    page.push_str("</tr>");
    let quorum = locks.get("quorum").and_then(Value::as_u64).unwrap_or(1);
    for semaphore in list {
        let name = text(semaphore, "name");
        let total = semaphore
            .get("permits")
            .and_then(Value::as_u64)
            .map_or_else(|| "?".to_owned(), |p| p.to_string());
        let slots: Vec<String> = semaphore
            .get("slots")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|slot| {
                let held = slot.get("holding").and_then(Value::as_u64).unwrap_or(0) >= quorum;
                format!(
                    "<span class=\"slot{}\">#{}: {}, {}, {}{}</span>",
                    if held { "" } else { " warn" },
                    slot.get("slot").and_then(Value::as_u64).unwrap_or(0),
                    esc(&holder(slot)),
                    validity(slot),
                    fencing(slot),
                    if held { "" } else { " (not on a majority)" },
                )
            })
            .collect();
        let _ = write!(
            page,
            "<tr class=\"semaphore\"><td class=\"name\">{}</td><td class=\"used\">{}/{total}</td><td>{}</td>",
            esc(&name),
            semaphore.get("used").and_then(Value::as_u64).unwrap_or(0),
            slots.join("<br>"),
        );
        if mutations {
            release_button(
                page,
                mount,
                "semaphores",
                &name,
                "Force release all permits",
            );
        }
        page.push_str("</tr>");
    }
    page.push_str("</table>");
}

/// The read-write locks in use (only when some are): writer, readers, a waiting
/// writer, and a button releasing the writer and every reader.
fn rw_locks_section(page: &mut String, locks: &Value, mount: &str, mutations: bool) {
    let Some(list) = locks
        .get("rw_locks")
        .and_then(Value::as_array)
        .filter(|l| !l.is_empty())
    else {
        return;
    };
    page.push_str("<h2>Read-write locks</h2><table id=\"rw-locks\"><tr><th>lock</th><th>writer</th><th>readers (holder, validity)</th><th>writer waiting</th><th>fencing token</th>");
    if mutations {
        page.push_str("<th></th>");
    }
    page.push_str("</tr>");
    for lock in list {
        let name = text(lock, "name");
        let writer = match lock.get("writer") {
            Some(writer @ Value::Object(_)) => format!(
                "{} ({}, {})",
                esc(&holder(writer)),
                esc(&text(writer, "agreement")),
                validity(writer)
            ),
            _ => "-".to_owned(),
        };
        let readers: Vec<String> = lock
            .get("readers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|reader| format!("{}, {}", esc(&holder(reader)), validity(reader)))
            .collect();
        let waiting = lock.get("writer_waiting").and_then(Value::as_bool) == Some(true);
        let _ = write!(
            page,
            "<tr class=\"rw-lock\"><td class=\"name\">{}</td><td class=\"writer\">{writer}</td><td class=\"readers\">{}</td><td class=\"waiting\">{}</td><td>{}</td>",
            esc(&name),
            if readers.is_empty() {
                "-".to_owned()
            } else {
                readers.join("<br>")
            },
            if waiting {
                "<span class=\"warn\">yes</span>"
            } else {
                "no"
            },
            lock.get("fencing_token")
                .and_then(Value::as_u64)
                .map_or_else(|| "-".to_owned(), |t| t.to_string()),
        );
        if mutations {
            release_button(page, mount, "rw-locks", &name, "Force release");
        }
        page.push_str("</tr>");
    }
    page.push_str("</table>");
}

/// A cell with a button posting to `<mount>/api/<what>/release?name=<name>`.
fn release_button(page: &mut String, mount: &str, what: &str, name: &str, label: &str) {
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("name", name)
        .finish();
    let _ = write!(
        page,
        "<td><button formaction=\"{}/api/{what}/release?{}\">{label}</button></td>",
        esc(mount),
        esc(&query)
    );
}

/// The holder of a lock, slot or reader as the JSON has it.
fn holder(lock: &Value) -> String {
    if lock.get("handed_over").and_then(Value::as_bool) == Some(true) {
        "(handed over)".to_owned()
    } else {
        match text(lock, "holder") {
            h if h.is_empty() => "?".to_owned(),
            h => h,
        }
    }
}

/// The `validity_ms` of a lock, slot or reader, in seconds.
fn validity(lock: &Value) -> String {
    lock.get("validity_ms").and_then(Value::as_u64).map_or_else(
        || "-".to_owned(),
        |ms| format!("{:.1} s", ms as f64 / 1000.0),
    )
}

/// The `fencing_token` of a slot.
fn fencing(lock: &Value) -> String {
    lock.get("fencing_token")
        .and_then(Value::as_u64)
        .map_or_else(|| "-".to_owned(), |t| format!("token {t}"))
}

fn scheduler_section(page: &mut String, scheduler: &Value, mount: &str, mutations: bool) {
    let _ = write!(
        page,
        "<h2>Scheduler <code>{}</code></h2>",
        esc(&text(scheduler, "name"))
    );
    match scheduler.get("leader") {
        Some(leader @ Value::Object(map)) if map.contains_key("error") => {
            error_paragraph(page, leader);
        }
        Some(leader @ Value::Object(_)) => {
            let _ = write!(
                page,
                "<p id=\"leader\">Leader: <b>{}</b>, epoch {}, since {}",
                esc(&text(leader, "instance")),
                leader.get("epoch").and_then(Value::as_u64).unwrap_or(0),
                esc(&text(leader, "since"))
            );
            if mutations {
                let _ = write!(
                    page,
                    " <button formaction=\"{}/api/scheduler/step-down\">Step down</button>",
                    esc(mount)
                );
            }
            page.push_str("</p>");
        }
        _ => match scheduler.get("last_leader") {
            Some(last @ Value::Object(map)) if !map.contains_key("error") => {
                let how = match (text(last, "ended"), text(last, "expires")) {
                    (ended, _) if !ended.is_empty() => {
                        format!("its leadership ended at {}", esc(&ended))
                    }
                    (_, expires) if !expires.is_empty() => format!(
                        "it stopped renewing its record, which ran out at {}",
                        esc(&expires)
                    ),
                    _ => "it no longer leads".to_owned(),
                };
                let _ = write!(
                    page,
                    "<p id=\"leader\" class=\"warn\">No leader now: the last, <b>{}</b> (epoch {}), {how}.</p>",
                    esc(&text(last, "instance")),
                    last.get("epoch").and_then(Value::as_u64).unwrap_or(0),
                );
            }
            _ => page.push_str("<p id=\"leader\">No leader recorded.</p>"),
        },
    }
    page.push_str("<h3>Jobs</h3>");
    match scheduler.get("jobs") {
        Some(Value::Array(jobs)) => {
            page.push_str("<table id=\"jobs\"><tr><th>job</th><th>schedule</th><th>zone</th><th>state</th><th>next ticks</th><th>last run</th>");
            if mutations {
                page.push_str("<th></th>");
            }
            page.push_str("</tr>");
            for job in jobs {
                let name = text(job, "name");
                let state = match (
                    job.get("paused").and_then(Value::as_bool),
                    job.get("running").and_then(Value::as_bool),
                ) {
                    (Some(true), _) => "<span class=\"warn\">paused</span>".to_owned(),
                    (_, Some(true)) => format!("running on {}", esc(&text(job, "running_on"))),
                    _ => "idle".to_owned(),
                };
                let next: Vec<String> = job
                    .get("next_ticks")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .take(3)
                    .filter_map(Value::as_str)
                    .map(esc)
                    .collect();
                // The DST policy, when not the default (`<gap>/<fold>`).
                let dst = match job.get("dst").map(|d| (text(d, "gap"), text(d, "fold"))) {
                    Some((gap, fold))
                        if !gap.is_empty() && (gap != "run_at_end" || fold != "once") =>
                    {
                        format!(
                            "<br><span class=\"dst\">DST {}/{}</span>",
                            esc(&gap),
                            esc(&fold)
                        )
                    }
                    _ => String::new(),
                };
                let last = match job.get("last_run") {
                    Some(run @ Value::Object(_)) => format!(
                        "<span class=\"outcome {o}\">{o}</span> {} on {}{}",
                        esc(&text(run, "tick")),
                        esc(&text(run, "instance")),
                        run.get("error")
                            .and_then(Value::as_str)
                            .map_or_else(String::new, |e| format!(": {}", esc(e))),
                        o = esc(&text(run, "outcome"))
                    ),
                    _ => "never".to_owned(),
                };
                let _ = write!(
                    page,
                    "<tr class=\"job\" data-job=\"{n}\"><td>{n}</td><td><code>{}</code></td><td>{}{dst}</td><td class=\"state\">{state}</td><td>{}</td><td class=\"last-run\">{last}</td>",
                    esc(&text(job, "schedule")),
                    esc(&text(job, "time_zone")),
                    next.join("<br>"),
                    n = esc(&name)
                );
                if mutations {
                    let base = format!("{}/api/jobs/{}", esc(mount), esc(&segment(&name)));
                    let toggle = if job.get("paused").and_then(Value::as_bool) == Some(true) {
                        "resume"
                    } else {
                        "pause"
                    };
                    let _ = write!(
                        page,
                        "<td><button class=\"{toggle}\" formaction=\"{base}/{toggle}\">{}</button> <button class=\"trigger\" formaction=\"{base}/trigger\">Run now</button> <button class=\"cancel\" formaction=\"{base}/cancel\">Cancel run</button></td>",
                        if toggle == "pause" { "Pause" } else { "Resume" },
                    );
                }
                page.push_str("</tr>");
            }
            page.push_str("</table>");
        }
        Some(other) => error_paragraph(page, other),
        None => {}
    }
    page.push_str("<h3>Recent runs</h3>");
    match scheduler.get("runs") {
        Some(Value::Array(runs)) if runs.is_empty() => page.push_str("<p>None yet.</p>"),
        Some(Value::Array(runs)) => {
            page.push_str("<table id=\"runs\"><tr><th>job</th><th>tick</th><th>instance</th><th>outcome</th><th>fencing token</th><th>error</th></tr>");
            for run in runs {
                let _ = write!(
                    page,
                    "<tr class=\"run\"><td>{}</td><td>{}</td><td>{}</td><td class=\"outcome {o}\">{o}</td><td>{}</td><td>{}</td></tr>",
                    esc(&text(run, "job")),
                    esc(&text(run, "tick")),
                    esc(&text(run, "instance")),
                    run.get("fencing_token")
                        .and_then(Value::as_u64)
                        .map_or_else(String::new, |t| t.to_string()),
                    esc(&text(run, "error")),
                    o = esc(&text(run, "outcome"))
                );
            }
            page.push_str("</table>");
        }
        Some(other) => error_paragraph(page, other),
        None => {}
    }
    changes_section(page, scheduler);
}

/// The latest changes of the jobs made at run time (only when there are some): who
/// changed which job when, and its schedule before → after.
fn changes_section(page: &mut String, scheduler: &Value) {
    let changes = match scheduler.get("changes") {
        Some(Value::Array(changes)) if changes.is_empty() => return,
        Some(Value::Array(changes)) => changes,
        Some(other @ Value::Object(_)) => {
            page.push_str("<h3>Job changes</h3>");
            error_paragraph(page, other);
            return;
        }
        _ => return,
    };
    page.push_str("<h3>Job changes</h3><table id=\"job-changes\"><tr><th>#</th><th>job</th><th>action</th><th>by</th><th>when</th><th>schedule (before → after)</th></tr>");
    let schedule = |spec: Option<&Value>| match spec {
        Some(spec @ Value::Object(_)) => format!(
            "<code>{}</code> {}",
            esc(&text(spec, "schedule")),
            esc(&text(spec, "time_zone"))
        ),
        _ => "-".to_owned(),
    };
    for change in changes {
        let _ = write!(
            page,
            "<tr class=\"job-change\"><td>{}</td><td>{}</td><td class=\"action\">{}</td><td>{}</td><td>{}</td><td>{} → {}</td></tr>",
            esc(&text(change, "seq")),
            esc(&text(change, "job")),
            esc(&text(change, "action")),
            esc(&text(change, "changed_by")),
            esc(&text(change, "changed")),
            schedule(change.get("previous")),
            schedule(change.get("definition")),
        );
    }
    page.push_str("</table>");
}

/// The `error` of a part of the overview that failed.
fn error_paragraph(page: &mut String, part: &Value) {
    let _ = write!(page, "<p class=\"error\">{}</p>", esc(&text(part, "error")));
}

/// A string field of `value` (empty if absent; numbers as written).
fn text(value: &Value, field: &str) -> String {
    match value.get(field) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// `s` percent-encoded as one path segment.
fn segment(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// `s` escaped for HTML text and attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "<style>body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin-bottom:1em}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top;font-size:.9em}th{background:#f3f3f3}.good{color:#17692b}.warn{color:#9a6200}.bad,.error{color:#b00020}.notice{color:#17692b}.meta{color:#666;font-size:.85em}.outcome.succeeded{color:#17692b}.outcome.failed,.outcome.timed_out,.outcome.abandoned{color:#b00020}.outcome.skipped,.outcome.cancelled{color:#9a6200}button{font-size:.85em}</style>";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<script>\"x\" & 'y'</script>"),
            "&lt;script&gt;&quot;x&quot; &amp; &#39;y&#39;&lt;/script&gt;"
        );
        assert_eq!(segment("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn a_job_shows_its_dst_policy_unless_it_is_the_default() {
        let scheduler = serde_json::json!({
            "name": "s",
            "jobs": [
                {"name": "twice", "schedule": "30 1 * * *", "time_zone": "America/New_York",
                 "dst": {"gap": "skip", "fold": "twice"}},
                {"name": "plain", "schedule": "30 1 * * *", "time_zone": "UTC",
                 "dst": {"gap": "run_at_end", "fold": "once"}},
                {"name": "older", "schedule": "30 1 * * *", "time_zone": "UTC", "dst": null},
            ],
        });
        let mut page = String::new();
        scheduler_section(&mut page, &scheduler, "", false);
        assert!(
            page.contains("<td>America/New_York<br><span class=\"dst\">DST skip/twice</span></td>"),
            "{page}"
        );
        assert_eq!(page.matches("DST ").count(), 1, "{page}");
    }

    #[test]
    fn job_changes_show_before_and_after() {
        let spec = |schedule: &str| serde_json::json!({"name": "<x>", "handler": "h", "schedule": schedule, "time_zone": "UTC"});
        let scheduler = serde_json::json!({
            "name": "s",
            "changes": [
                {"seq": 2, "job": "<x>", "action": "reschedule", "definition": spec("*/5 * * * *"),
                 "previous": spec("* * * * *"), "changed_by": "alice", "changed": "2024-05-01T10:00:00Z"},
                {"seq": 1, "job": "<x>", "action": "add", "definition": spec("* * * * *"),
                 "previous": null, "changed_by": "alice", "changed": "2024-05-01T09:00:00Z"},
            ],
        });
        let mut page = String::new();
        changes_section(&mut page, &scheduler);
        assert!(page.contains("<table id=\"job-changes\">"), "{page}");
        assert!(
            page.contains("<td>2</td><td>&lt;x&gt;</td><td class=\"action\">reschedule</td><td>alice</td><td>2024-05-01T10:00:00Z</td><td><code>* * * * *</code> UTC → <code>*/5 * * * *</code> UTC</td>"),
            "{page}"
        );
        assert!(
            page.contains("<td>- → <code>* * * * *</code> UTC</td>"),
            "{page}"
        );
        // None: no section.
        let mut page = String::new();
        changes_section(&mut page, &serde_json::json!({"changes": []}));
        assert!(page.is_empty());
    }
}

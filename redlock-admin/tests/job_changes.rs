//! Jobs added, rescheduled and removed at run time through the admin service, against
//! real redis-server nodes, a SQLite history and a running scheduler replica with a
//! registered handler, mounted in axum and in actix-web (the same checks, over HTTP):
//! `POST /api/jobs` adds (201; 409 again), `POST /api/jobs/{job}/reschedule` changes
//! the fields given and keeps the others (200), `POST /api/jobs/{job}/remove` removes
//! (200); a bad schedule or body is 400, an unknown handler 422, an unknown job 404;
//! without the token 401, the token in the URL 400, nothing changed; a job name too
//! long for its lock keys 400 with the bound, the longest accepted added and run;
//! `GET /api/job-changes` lists the changes newest first, with who made them, and the
//! dashboard shows them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use redlock_admin::Admin;
use redlock_scheduler::admin::SchedulerAdmin;
use redlock_scheduler::history::{Outcome, RunFilter};
use redlock_scheduler::{History, JobContext, Scheduler};
use redlock_testkit::Cluster;
use serde_json::{Value, json};

const TOKEN: &str = "test-token-0123456789";

mod common;
use common::{redlock, serve_axum, until};

/// A started replica with no job in code and the handler `work`, its history in a
/// SQLite file in `dir`; the history's URL. Waits for its first beat (the handler of a
/// change is looked up among the replicas alive).
async fn replica(cluster: &Cluster, dir: &std::path::Path) -> (Scheduler, String) {
    let url = format!("sqlite://{}?mode=rwc", dir.join("history.db").display());
    let scheduler = Scheduler::builder(redlock(cluster, "replica-1"))
        .handler("work", |_ctx: JobContext| async {
            Ok::<_, std::convert::Infallible>(())
        })
        .history(History::connect(&url).await.unwrap())
        .instance("replica-1")
        .build()
        .unwrap();
    scheduler.wait_ready(Duration::from_secs(5)).await.unwrap();
    scheduler.start();
    tokio::time::sleep(Duration::from_millis(800)).await;
    (scheduler, url)
}

async fn json_of(response: reqwest::Response) -> Value {
    response.json().await.unwrap()
}

/// The names `/api/jobs` lists.
async fn listed(http: &reqwest::Client, base: &str) -> Vec<String> {
    let jobs = json_of(http.get(format!("{base}/api/jobs")).send().await.unwrap()).await;
    jobs.as_array()
        .unwrap()
        .iter()
        .map(|j| j["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The checks, on the service at `base` over `admin`'s history, whose changes are
/// recorded as made by `operator`.
async fn add_reschedule_remove(base: &str, admin: &SchedulerAdmin, operator: &str) {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let add = format!("{base}/api/jobs");
    let definition = json!({
        "name": "export",
        "schedule": "*/2 * * * * *",
        "handler": "work",
        "time_zone": "Europe/Paris",
        "misfire": "catch_up:3",
        "misfire_grace_ms": 5000,
        "timeout_ms": 60000,
        "dst": "skip/twice",
        "run_on_leader": true,
    });

    // Without the token, or with it in the URL: refused, nothing added.
    let denied = http.post(&add).json(&definition).send().await.unwrap();
    assert_eq!(denied.status(), 401);
    assert!(denied.headers().contains_key("www-authenticate"));
    let in_url = http
        .post(format!("{add}?token={TOKEN}"))
        .bearer_auth(TOKEN)
        .json(&definition)
        .send()
        .await
        .unwrap();
    assert_eq!(in_url.status(), 400);
    assert!(admin.job_spec("export").await.unwrap().is_none());

    // Definitions that cannot work: 400 (problem+json, saying why); an unknown
    // handler: 422; a body that is not JSON: 415.
    let post = |body: Value| http.post(&add).bearer_auth(TOKEN).json(&body).send();
    let bad_cron = post(json!({"name": "export", "schedule": "every minute", "handler": "work"}))
        .await
        .unwrap();
    assert_eq!(bad_cron.status(), 400);
    assert_eq!(
        bad_cron.headers()["content-type"],
        "application/problem+json"
    );
    let problem = json_of(bad_cron).await;
    assert!(
        problem["detail"].as_str().unwrap().contains("refused"),
        "{problem}"
    );
    for (body, status, says) in [
        (
            json!({"name": "export", "schedule": "* * * * *", "handler": "work", "time_zone": "Mars/Olympus"}),
            400,
            "refused",
        ),
        (
            json!({"name": "export", "cron": "* * * * *"}),
            400,
            "unknown field `cron`",
        ),
        (json!({"name": "export"}), 400, "`schedule`"),
        (
            json!({"name": "export", "schedule": "* * * * *", "misfire": "sometimes"}),
            400,
            "`misfire`",
        ),
        (
            json!({"name": "export", "schedule": "* * * * *", "handler": "nope"}),
            422,
            "no handler named `nope`",
        ),
    ] {
        let answer = post(body.clone()).await.unwrap();
        assert_eq!(answer.status(), status, "{body}");
        let problem = json_of(answer).await;
        assert!(
            problem["detail"].as_str().unwrap().contains(says),
            "{body}: {problem}"
        );
    }
    let form = http
        .post(&add)
        .bearer_auth(TOKEN)
        .form(&[("name", "export"), ("schedule", "* * * * *")])
        .send()
        .await
        .unwrap();
    assert_eq!(form.status(), 303, "a form post goes back to the dashboard");
    let location = form.headers()["location"].to_str().unwrap().to_owned();
    assert!(location.contains("error="), "{location}");
    let plain = http
        .post(&add)
        .bearer_auth(TOKEN)
        .header("content-type", "text/plain")
        .body(definition.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 415);
    assert!(admin.job_spec("export").await.unwrap().is_none());

    // Added: 201 with the change, and the replica lists it.
    let added = post(definition.clone()).await.unwrap();
    assert_eq!(added.status(), 201);
    let added = json_of(added).await;
    assert_eq!(added["action"], "add", "{added}");
    assert_eq!(added["job"], "export");
    assert_eq!(added["changed_by"], operator);
    assert!(added["previous"].is_null(), "{added}");
    let spec = &added["definition"];
    assert_eq!(spec["schedule"], "*/2 * * * * *", "{added}");
    assert_eq!(spec["handler"], "work");
    assert_eq!(spec["time_zone"], "Europe/Paris");
    assert_eq!(spec["misfire"], json!({"policy": "catch_up", "max": 3}));
    assert_eq!(spec["misfire_grace_ms"], 5000);
    assert_eq!(spec["timeout_ms"], 60000);
    assert_eq!(spec["dst"], "skip/twice");
    assert_eq!(spec["run_on_leader"], true);
    until("the added job listed", async || {
        listed(&http, base).await.contains(&"export".to_owned())
    })
    .await;

    // Added again: 409, nothing recorded.
    let again = post(definition.clone()).await.unwrap();
    assert_eq!(again.status(), 409);
    assert!(
        json_of(again).await["detail"]
            .as_str()
            .unwrap()
            .contains("there already")
    );

    // Rescheduled, only the schedule given: the other fields kept.
    let reschedule = format!("{base}/api/jobs/export/reschedule");
    let denied = http
        .post(&reschedule)
        .json(&json!({"schedule": "*/3 * * * * *"}))
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status(), 401);
    let rescheduled = http
        .post(&reschedule)
        .bearer_auth(TOKEN)
        .json(&json!({"schedule": "*/3 * * * * *"}))
        .send()
        .await
        .unwrap();
    assert_eq!(rescheduled.status(), 200);
    let rescheduled = json_of(rescheduled).await;
    assert_eq!(rescheduled["action"], "reschedule", "{rescheduled}");
    assert_eq!(rescheduled["previous"], added["definition"]);
    let mut expected = added["definition"].clone();
    expected["schedule"] = json!("*/3 * * * * *");
    assert_eq!(rescheduled["definition"], expected);
    assert_eq!(
        admin
            .job_spec("export")
            .await
            .unwrap()
            .unwrap()
            .expression(),
        "*/3 * * * * *"
    );
    until("the new schedule listed", async || {
        let jobs = json_of(http.get(format!("{base}/api/jobs")).send().await.unwrap()).await;
        jobs.as_array()
            .unwrap()
            .iter()
            .any(|j| j["name"] == "export" && j["schedule"] == "*/3 * * * * *")
    })
    .await;
    // Nothing to change, another name, a bad schedule, an unknown job.
    for (path, body, status) in [
        ("export", json!({}), 400),
        (
            "export",
            json!({"name": "other", "schedule": "* * * * *"}),
            400,
        ),
        ("export", json!({"schedule": "61 * * * *"}), 400),
        ("export", json!({"handler": "nope"}), 422),
        ("nope", json!({"schedule": "* * * * *"}), 404),
    ] {
        let answer = http
            .post(format!("{base}/api/jobs/{path}/reschedule"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), status, "{path}: {body}");
    }

    // Removed: 200, no longer listed; again: 404.
    let remove = format!("{base}/api/jobs/export/remove");
    let removed = http.post(&remove).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(removed.status(), 200);
    let removed = json_of(removed).await;
    assert_eq!(removed["action"], "remove", "{removed}");
    assert!(removed["definition"].is_null(), "{removed}");
    assert_eq!(removed["previous"], expected);
    until("the removed job no longer listed", async || {
        !listed(&http, base).await.contains(&"export".to_owned())
    })
    .await;
    let again = http.post(&remove).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(again.status(), 404);

    // The record: the three changes, newest first, by the admin's operator; no token
    // needed to read it.
    let changes = json_of(
        http.get(format!("{base}/api/job-changes?job=export"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let changes = changes.as_array().unwrap();
    let actions: Vec<&str> = changes
        .iter()
        .map(|c| c["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["remove", "reschedule", "add"], "{changes:?}");
    let seqs: Vec<u64> = changes.iter().map(|c| c["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] > w[1]), "{seqs:?}");
    assert!(changes.iter().all(|c| c["changed_by"] == operator));
    assert_eq!(changes[2]["seq"], added["seq"]);
    assert_eq!(changes[2]["definition"], added["definition"]);
    assert_eq!(changes[1]["definition"], expected);
    let two = json_of(
        http.get(format!("{base}/api/job-changes?limit=2"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(two.as_array().unwrap().len(), 2);
    let other = json_of(
        http.get(format!("{base}/api/job-changes?job=nope"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(other, json!([]));
    let bad = http
        .get(format!("{base}/api/job-changes?limit=many"))
        .send()
        .await;
    assert_eq!(bad.unwrap().status(), 400);

    // The dashboard's table of changes.
    let page = http
        .get(format!("{base}/?refresh=off"))
        .send()
        .await
        .unwrap();
    let page = page.text().await.unwrap();
    assert!(page.contains("<table id=\"job-changes\">"), "{page}");
    assert_eq!(page.matches("class=\"job-change\"").count(), 3, "{page}");
    assert!(
        page.contains(
            "<code>*/2 * * * * *</code> Europe/Paris → <code>*/3 * * * * *</code> Europe/Paris"
        ),
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_adds_reschedules_and_removes_jobs() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let (running, url) = replica(&cluster, dir.path()).await;
    // The operator by default.
    let history = SchedulerAdmin::new(
        History::connect(&url).await.unwrap(),
        Scheduler::DEFAULT_NAME,
    );
    let admin = Admin::builder()
        .scheduler(history.clone())
        .allow_mutations(TOKEN)
        .build()
        .unwrap();
    let base = serve_axum(admin).await;
    add_reschedule_remove(&base, &history, "admin").await;
    running.shutdown(Duration::from_secs(5)).await;
}

/// A job name too long for the lock keys made from it is refused with 400, the bound in
/// the problem, nothing recorded; the longest accepted is added (201) and runs; an
/// admin of a scheduler whose name is itself too long refuses every job, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_name_too_long_for_its_keys_is_refused_and_the_longest_runs() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let (running, url) = replica(&cluster, dir.path()).await;
    let history = SchedulerAdmin::new(
        History::connect(&url).await.unwrap(),
        Scheduler::DEFAULT_NAME,
    );
    let max = history.max_job_name_len();
    assert_eq!(max, 512 - "scheduler".len() - 26);
    let base = serve_axum(
        Admin::builder()
            .scheduler(history.clone())
            .allow_mutations(TOKEN)
            .build()
            .unwrap(),
    )
    .await;
    let http = reqwest::Client::new();
    let add = |base: &str, name: &str| {
        http.post(format!("{base}/api/jobs"))
            .bearer_auth(TOKEN)
            .json(&json!({"name": name, "schedule": "* * * * * *", "handler": "work"}))
            .send()
    };
    // One byte more, and a few hundred bytes more: 400, with the bound.
    for len in [max + 1, 600] {
        let answer = add(&base, &"j".repeat(len)).await.unwrap();
        assert_eq!(answer.status(), 400, "a job name of {len} bytes");
        assert_eq!(answer.headers()["content-type"], "application/problem+json");
        let problem = json_of(answer).await;
        assert_eq!(problem["max_len"], max, "{problem}");
        assert_eq!(problem["len"], len, "{problem}");
        assert_eq!(problem["name_kind"], "job", "{problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(&format!("at most {max} bytes")), "{detail}");
    }
    assert!(
        history.job_changes(None, 10).await.unwrap().is_empty(),
        "a refused name was recorded"
    );

    // The longest: 201, and its ticks run.
    let longest = "j".repeat(max);
    let added = add(&base, &longest).await.unwrap();
    assert_eq!(added.status(), 201);
    let succeeded = RunFilter::new().job(&longest).outcome(Outcome::Succeeded);
    until("a run of the longest job succeeded", async || {
        history.runs(&succeeded).await.is_ok_and(|r| !r.is_empty())
    })
    .await;

    // An admin of a scheduler whose name leaves no room for any job.
    let too_long = SchedulerAdmin::new(history.history().clone(), "s".repeat(486));
    let base = serve_axum(
        Admin::builder()
            .scheduler(too_long)
            .allow_mutations(TOKEN)
            .build()
            .unwrap(),
    )
    .await;
    let answer = add(&base, "j").await.unwrap();
    assert_eq!(answer.status(), 400);
    let problem = json_of(answer).await;
    assert_eq!(problem["name_kind"], "scheduler", "{problem}");
    assert_eq!(problem["max_len"], 485, "{problem}");
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_changes_are_off_unless_switched_on() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let (running, url) = replica(&cluster, dir.path()).await;
    let history = SchedulerAdmin::new(
        History::connect(&url).await.unwrap(),
        Scheduler::DEFAULT_NAME,
    );
    let base = serve_axum(Admin::builder().scheduler(history.clone()).build().unwrap()).await;
    let http = reqwest::Client::new();
    let refused = http
        .post(format!("{base}/api/jobs"))
        .bearer_auth(TOKEN)
        .json(&json!({"name": "export", "schedule": "* * * * *", "handler": "work"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    assert!(history.job_spec("export").await.unwrap().is_none());
    // Reads need no token: none recorded.
    let changes = http
        .get(format!("{base}/api/job-changes"))
        .send()
        .await
        .unwrap();
    assert_eq!(changes.status(), 200);
    assert_eq!(json_of(changes).await, json!([]));
    // Another method on the jobs' route: 405, saying which it takes.
    let delete = http
        .delete(format!("{base}/api/jobs"))
        .send()
        .await
        .unwrap();
    assert_eq!(delete.status(), 405);
    assert_eq!(delete.headers()["allow"], "GET, POST");
    running.shutdown(Duration::from_secs(5)).await;
}

/// Serves `admin` under its mount path with actix-web (one worker, on a thread of its
/// own) on a free port; its base URL.
#[cfg(feature = "actix")]
fn serve_actix(admin: Admin, mount: &str) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            actix_web::HttpServer::new(move || actix_web::App::new().service(admin.actix_scope()))
                .workers(1)
                .disable_signals()
                .listen(listener)
                .unwrap()
                .run()
                .await
        })
    });
    format!("http://{addr}{mount}")
}

#[cfg(feature = "actix")] // the workspace's tests build it (the examples enable it)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actix_adds_reschedules_and_removes_jobs() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let (running, url) = replica(&cluster, dir.path()).await;
    // An operator of its own.
    let history = SchedulerAdmin::new(
        History::connect(&url).await.unwrap(),
        Scheduler::DEFAULT_NAME,
    )
    .operator("ops-console");
    let admin = Admin::builder()
        .scheduler(history.clone())
        .allow_mutations(TOKEN)
        .mount_path("/ops")
        .build()
        .unwrap();
    let base = serve_actix(admin, "/ops");
    add_reschedule_remove(&base, &history, "ops-console").await;
    running.shutdown(Duration::from_secs(5)).await;
}

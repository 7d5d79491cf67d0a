//! The admin service against real redis-server nodes, a SQLite history and a running
//! scheduler, mounted in axum and in actix-web: the dashboard and the JSON show a held
//! lock and a job's last run; its buttons pause the job (the next tick is recorded as
//! skipped) and release a lock by force; mutations without the token, or with them
//! switched off, are refused (401, 403) and change nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use redlock_admin::Admin;
use redlock_scheduler::admin::SchedulerAdmin;
use redlock_scheduler::history::{Outcome, RunFilter};
use redlock_scheduler::{History, Scheduler};
use redlock_testkit::Cluster;

const TOKEN: &str = "test-token-0123456789";

mod common;
use common::{redlock, scheduler, serve_axum, until, until_skipped_as_paused};

async fn json(response: reqwest::Response) -> serde_json::Value {
    response.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_dashboard_shows_and_steers() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let (running, url) = scheduler(&cluster, dir.path(), Vec::new()).await;
    let history = SchedulerAdmin::new(
        History::connect(&url).await.unwrap(),
        Scheduler::DEFAULT_NAME,
    );
    let client = redlock(&cluster, "orders-api-7");
    let _lock = client
        .lock("order:<42>")
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    let admin = Admin::builder()
        .redlock(client.clone())
        .scheduler(history.clone())
        .allow_mutations(TOKEN)
        .build()
        .unwrap();
    let base = serve_axum(admin).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let succeeded = RunFilter::new().job("ticker").outcome(Outcome::Succeeded);
    until("a run of ticker", async || {
        history.runs(&succeeded).await.is_ok_and(|r| !r.is_empty())
    })
    .await;

    // The dashboard: the lock (escaped), its holder, the job and its last run.
    let page = http.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    assert!(
        page.contains("order:&lt;42&gt;") && !page.contains("order:<42>"),
        "{page}"
    );
    assert!(page.contains("orders-api-7"));
    assert!(page.contains("data-job=\"ticker\""));
    assert!(page.contains("succeeded"));
    assert!(page.contains("http-equiv=\"refresh\""));

    let locks = json(http.get(format!("{base}/api/locks")).send().await.unwrap()).await;
    assert_eq!(locks["locks"][0]["resource"], "order:<42>");
    assert_eq!(locks["locks"][0]["holder"], "orders-api-7");
    assert_eq!(locks["locks"][0]["agreement"], "majority");
    let jobs = json(http.get(format!("{base}/api/jobs")).send().await.unwrap()).await;
    assert_eq!(jobs[0]["name"], "ticker");
    assert_eq!(jobs[0]["next_ticks"].as_array().unwrap().len(), 5);
    let bad = http
        .get(format!("{base}/api/runs?outcome=bogus"))
        .send()
        .await;
    assert_eq!(bad.unwrap().status(), 400);
    let missing = http.get(format!("{base}/api/nope")).send().await;
    assert_eq!(missing.unwrap().status(), 404);

    // Mutations without the token, or with a wrong one: 401, nothing changes.
    let pause = format!("{base}/api/jobs/ticker/pause");
    let denied = http.post(&pause).send().await.unwrap();
    assert_eq!(denied.status(), 401);
    assert!(denied.headers().contains_key("www-authenticate"));
    let wrong = http
        .post(&pause)
        .bearer_auth("test-token-0123456780")
        .send()
        .await;
    assert_eq!(wrong.unwrap().status(), 401);
    let release = format!("{base}/api/locks/release?resource=order:%3C42%3E");
    let form = http.post(&release).form(&[("token", "nope")]).send().await;
    assert_eq!(form.unwrap().status(), 401);
    assert!(!history.job("ticker").await.unwrap().paused);
    assert_eq!(client.locks("order:").await.unwrap().locks.len(), 1);

    // The dashboard's pause button (a form post with the token): paused, and the next
    // tick is recorded as skipped.
    let paused_at = chrono::Utc::now();
    let pressed = http
        .post(&pause)
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(pressed.status(), 303);
    let location = pressed.headers()["location"].to_str().unwrap().to_owned();
    assert!(location.starts_with("/admin/?notice="), "{location}");
    assert!(history.job("ticker").await.unwrap().paused);
    until_skipped_as_paused(&history, paused_at).await;
    let page = http
        .get(format!("{base}/?refresh=off"))
        .send()
        .await
        .unwrap();
    let page = page.text().await.unwrap();
    assert!(page.contains("paused") && !page.contains("http-equiv=\"refresh\""));

    // Resume through the JSON API with a bearer token.
    let resume = format!("{base}/api/jobs/ticker/resume");
    let resumed = http.post(&resume).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(resumed.status(), 200);
    assert!(!history.job("ticker").await.unwrap().paused);

    // Force release from the dashboard's button.
    let released = http.post(&release).form(&[("token", TOKEN)]).send().await;
    assert_eq!(released.unwrap().status(), 303);
    assert!(client.locks("order:").await.unwrap().locks.is_empty());
    let unknown = format!("{base}/api/jobs/nope/pause");
    let unknown = http.post(&unknown).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
    running.shutdown(Duration::from_secs(5)).await;
}

/// The admin token is taken from the `Authorization` header or a form body, never
/// from the URL (access logs, proxies and browser histories keep URLs); a body is read
/// as a form only when its content type says so. The dashboard's form posts the token
/// in its body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_refused_in_the_url() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let (running, url) = scheduler(&cluster, dir.path(), Vec::new()).await;
    let history = SchedulerAdmin::new(
        History::connect(&url).await.unwrap(),
        Scheduler::DEFAULT_NAME,
    );
    until("ticker published", async || {
        history.job("ticker").await.is_ok()
    })
    .await;
    let admin = Admin::builder()
        .scheduler(history.clone())
        .allow_mutations(TOKEN)
        .build()
        .unwrap();
    let base = serve_axum(admin).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let pause = format!("{base}/api/jobs/ticker/pause");

    // In the query: refused, nothing changes, the answer says where the token goes.
    let in_url = http
        .post(format!("{pause}?token={TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(in_url.status(), 400);
    let problem = json(in_url).await;
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("Authorization"),
        "{problem}"
    );
    // Also beside a good header: the URL was given away all the same.
    let both = http
        .post(format!("{pause}?token={TOKEN}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(both.status(), 400);
    // A body that does not say it is a form is not read as one.
    for content_type in ["text/plain", "application/json", "application/x-www-form"] {
        let body = http
            .post(&pause)
            .header("content-type", content_type)
            .body(format!("token={TOKEN}"))
            .send()
            .await
            .unwrap();
        assert_eq!(body.status(), 401, "{content_type}");
    }
    assert!(!history.job("ticker").await.unwrap().paused);

    // A form body (its content type in any case, with parameters): taken.
    let form = http
        .post(&pause)
        .header(
            "content-type",
            "Application/X-WWW-Form-Urlencoded; charset=UTF-8",
        )
        .body(format!("token={TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(form.status(), 303);
    assert!(history.job("ticker").await.unwrap().paused);

    // The dashboard's form posts, its token in the body: no URL on the page carries it.
    let page = http.get(format!("{base}/")).send().await.unwrap();
    let page = page.text().await.unwrap();
    assert!(
        page.contains("<form method=\"post\" enctype=\"application/x-www-form-urlencoded\""),
        "{page}"
    );
    assert!(!page.contains("token="), "{page}");
    assert!(!page.to_ascii_lowercase().contains("formmethod"), "{page}");
    running.shutdown(Duration::from_secs(5)).await;
}

/// A trigger says what happened: carried out by the leader (200, its result), or, with
/// no replica running, queued and not claimed (202, the request's URL to poll), in the
/// JSON and in the dashboard's notice; the leader that shut down is not named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_says_whether_a_leader_claimed_it() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let (running, url) = scheduler(&cluster, dir.path(), Vec::new()).await;
    let history = SchedulerAdmin::new(
        History::connect(&url).await.unwrap(),
        Scheduler::DEFAULT_NAME,
    );
    until("ticker published and its leader recorded", async || {
        history.job("ticker").await.is_ok() && history.leader().await.is_ok_and(|l| l.is_some())
    })
    .await;
    let patient = Admin::builder()
        .scheduler(history.clone())
        .allow_mutations(TOKEN)
        .request_wait(Duration::from_secs(10))
        .build()
        .unwrap();
    let base = serve_axum(patient).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    // A leader runs: carried out, with its result.
    let trigger = format!("{base}/api/jobs/ticker/trigger");
    let done = http.post(&trigger).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(done.status(), 200);
    let done = json(done).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["done_by"], "replica-1", "{done}");
    assert!(
        done["result"].as_str().unwrap().starts_with("ok: tick "),
        "{done}"
    );

    // The only replica shuts down: no leader, and the dashboard says who led last.
    running.shutdown(Duration::from_secs(5)).await;
    let leader = json(http.get(format!("{base}/api/leader")).send().await.unwrap()).await;
    assert!(leader.is_null(), "{leader}");
    let page = http.get(format!("{base}/")).send().await.unwrap();
    let page = page.text().await.unwrap();
    assert!(
        page.contains("No leader now") && page.contains("replica-1"),
        "{page}"
    );

    // Queued, not done: 202, and where to follow it.
    let brief = Admin::builder()
        .scheduler(history.clone())
        .allow_mutations(TOKEN)
        .request_wait(Duration::from_millis(300))
        .build()
        .unwrap();
    let base = serve_axum(brief).await;
    let origin = base.trim_end_matches("/admin");
    let trigger = format!("{base}/api/jobs/ticker/trigger");
    let queued = http.post(&trigger).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(queued.status(), 202);
    let location = queued.headers()["location"].to_str().unwrap().to_owned();
    let queued = json(queued).await;
    let id = queued["request"].as_str().unwrap();
    assert_eq!(location, format!("/admin/api/requests/{id}"));
    assert_eq!(queued["poll"], location.as_str());
    assert_eq!(queued["state"], "pending", "{queued}");
    assert_eq!(
        queued["message"], "queued: no leader has claimed it yet",
        "{queued}"
    );
    assert!(queued["leader"].is_null(), "{queued}");
    let polled = http
        .get(format!("{origin}{location}"))
        .send()
        .await
        .unwrap();
    assert_eq!(polled.status(), 200);
    let polled = json(polled).await;
    assert_eq!(
        (polled["id"].as_str(), polled["state"].as_str()),
        (Some(id), Some("pending"))
    );

    // The dashboard's button: the notice says queued, not done.
    let pressed = http
        .post(&trigger)
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(pressed.status(), 303);
    let location = pressed.headers()["location"].to_str().unwrap().to_owned();
    let page = http
        .get(format!("{origin}{location}"))
        .send()
        .await
        .unwrap();
    let page = page.text().await.unwrap();
    let notice = page
        .split("<p class=\"notice\" id=\"notice\">")
        .nth(1)
        .and_then(|rest| rest.split("</p>").next())
        .unwrap_or_else(|| panic!("no notice: {page}"));
    assert!(
        notice.starts_with("queued: no leader has claimed it yet: trigger `ticker`"),
        "{notice}"
    );
    assert!(notice.contains("no replica leads now"), "{notice}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutations_are_off_unless_switched_on() {
    let cluster = Cluster::start(3).await;
    let client = redlock(&cluster, "svc");
    let _lock = client
        .lock("acct:1")
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    let base = serve_axum(Admin::builder().redlock(client.clone()).build().unwrap()).await;
    let http = reqwest::Client::new();
    let refused = http
        .post(format!("{base}/api/locks/release?resource=acct:1"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(client.locks("acct:").await.unwrap().locks.len(), 1);
    let page = http.get(format!("{base}/")).send().await.unwrap();
    let page = page.text().await.unwrap();
    assert!(page.contains("acct:1") && !page.contains("<button"));
    assert!(matches!(
        Admin::builder()
            .redlock(client)
            .allow_mutations("short")
            .build(),
        Err(redlock_admin::BuildError::WeakToken { .. })
    ));
}

#[cfg(feature = "actix")] // the workspace's tests build it (the examples enable it)
#[actix_web::test]
async fn actix_scope_serves_the_same() {
    use actix_web::test::{TestRequest, call_service, init_service, read_body, read_body_json};

    let cluster = Cluster::start(3).await;
    let client = redlock(&cluster, "actix-svc");
    let _lock = client
        .lock("cart:9")
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    // The lock returns at its quorum: wait for the last node's key before counting it.
    cluster.settle_keys(&client.key_for("cart:9"), 3).await;
    let admin = Admin::builder()
        .redlock(client.clone())
        .allow_mutations(TOKEN)
        .mount_path("/ops")
        .build()
        .unwrap();
    let app = init_service(actix_web::App::new().service(admin.actix_scope())).await;
    let page = call_service(&app, TestRequest::get().uri("/ops/").to_request()).await;
    assert_eq!(page.status(), 200);
    let body = read_body(page).await;
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("cart:9") && body.contains("actix-svc"));
    let release = "/ops/api/locks/release?resource=cart:9";
    let denied = call_service(&app, TestRequest::post().uri(release).to_request()).await;
    assert_eq!(denied.status(), 401);
    // The token in the URL is refused.
    let in_url = format!("{release}&token={TOKEN}");
    let in_url = call_service(&app, TestRequest::post().uri(&in_url).to_request()).await;
    assert_eq!(in_url.status(), 400);
    assert_eq!(client.locks("cart:").await.unwrap().locks.len(), 1);
    let released = call_service(
        &app,
        TestRequest::post()
            .uri(release)
            .insert_header(("authorization", format!("Bearer {TOKEN}")))
            .to_request(),
    )
    .await;
    assert_eq!(released.status(), 200);
    let body: serde_json::Value = read_body_json(released).await;
    assert_eq!(body["deleted"], 3);
    assert!(client.locks("cart:").await.unwrap().locks.is_empty());
}

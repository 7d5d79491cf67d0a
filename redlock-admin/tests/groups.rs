//! Semaphores and read-write locks in the admin service, against real redis-server
//! nodes, mounted in axum and in actix-web: the dashboard and `/api/locks` show a
//! semaphore's permits used of its size with their holders, and a read-write lock's
//! readers and waiting writer; the buttons and the JSON API release them by force,
//! with the token only (401 without, 403 with mutations off, nothing changed).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use redlock_admin::Admin;
use redlock_core::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;

const TOKEN: &str = "test-token-0123456789";

mod common;
use common::{redlock, serve_axum, until};

async fn json(response: reqwest::Response) -> serde_json::Value {
    response.json().await.unwrap()
}

/// Waits until the listing shows `name`'s size (recorded in the background by the
/// first acquisition).
async fn until_sized(client: &Redlock, name: &str) {
    until("the semaphore's size recorded", async || {
        client
            .locks(name)
            .await
            .is_ok_and(|l| l.semaphores.first().is_some_and(|s| s.permits.is_some()))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_shows_and_releases_semaphores_and_rw_locks() {
    let cluster = Cluster::start(3).await;
    let api = redlock(&cluster, "api-1");
    let worker = redlock(&cluster, "worker-2");
    let semaphore = api
        .semaphore("exports<x>", 3)
        .unwrap()
        .ttl(Duration::from_secs(30));
    let _a = semaphore.try_acquire().await.unwrap();
    let _b = worker
        .semaphore("exports<x>", 3)
        .unwrap()
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap();
    until_sized(&api, "exports").await;
    // A read-write lock with a reader, and a writer waiting for it.
    let feed = api.rw_lock("feed").unwrap().ttl(Duration::from_secs(30));
    let reader = feed.try_read().await.unwrap();
    let writing = worker.rw_lock("feed").unwrap().retry(
        RetryPolicy::deadline(Duration::from_secs(20))
            .with_delay(Duration::from_secs(3), Duration::ZERO),
    );
    let writer = tokio::spawn(async move { writing.write().await.unwrap() });
    until("the writer waits", async || {
        api.locks("feed")
            .await
            .is_ok_and(|l| l.rw_locks.first().is_some_and(|r| r.writer_waiting))
    })
    .await;

    let admin = Admin::builder()
        .redlock(api.clone())
        .allow_mutations(TOKEN)
        .build()
        .unwrap();
    let base = serve_axum(admin).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    // JSON: the semaphore (2 of 3, both holders) and the read-write lock.
    let locks = json(http.get(format!("{base}/api/locks")).send().await.unwrap()).await;
    assert_eq!(locks["locks"].as_array().unwrap().len(), 0, "{locks}");
    let sem = &locks["semaphores"][0];
    assert_eq!(sem["name"], "exports<x>");
    assert_eq!(
        (sem["used"].as_u64(), sem["permits"].as_u64()),
        (Some(2), Some(3))
    );
    let mut holders: Vec<&str> = sem["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["holder"].as_str().unwrap())
        .collect();
    holders.sort_unstable();
    assert_eq!(holders, ["api-1", "worker-2"]);
    let rw = &locks["rw_locks"][0];
    assert_eq!(rw["name"], "feed");
    assert_eq!(rw["writer_waiting"], true);
    assert!(rw["writer"].is_null());
    assert_eq!(rw["readers"][0]["holder"], "api-1");
    assert!(rw["readers"][0]["validity_ms"].as_u64().unwrap() > 20_000);

    // The dashboard: both sections (escaped), with their buttons.
    let page = http.get(format!("{base}/")).send().await.unwrap();
    let page = page.text().await.unwrap();
    let semaphores = page
        .split("<table id=\"semaphores\">")
        .nth(1)
        .unwrap_or_else(|| panic!("no semaphores: {page}"));
    let semaphores = semaphores.split("</table>").next().unwrap();
    assert!(
        semaphores.contains("<td class=\"used\">2/3</td>"),
        "{semaphores}"
    );
    assert!(semaphores.contains("api-1") && semaphores.contains("worker-2"));
    assert!(semaphores.contains("exports&lt;x&gt;") && !page.contains("exports<x>"));
    assert!(semaphores.contains("/admin/api/semaphores/release?name=exports%3Cx%3E"));
    let rw_locks = page
        .split("<table id=\"rw-locks\">")
        .nth(1)
        .unwrap_or_else(|| panic!("no read-write locks: {page}"));
    assert!(rw_locks.contains("<td class=\"waiting\"><span class=\"warn\">yes"));
    assert!(rw_locks.contains("/admin/api/rw-locks/release?name=feed"));

    // Without the token, or without a name: refused, nothing changes.
    let release_sem = format!("{base}/api/semaphores/release?name=exports%3Cx%3E");
    let release_rw = format!("{base}/api/rw-locks/release?name=feed");
    for url in [&release_sem, &release_rw] {
        assert_eq!(http.post(url).send().await.unwrap().status(), 401);
        let wrong = http.post(url).form(&[("token", "nope")]).send().await;
        assert_eq!(wrong.unwrap().status(), 401);
        let in_url = http.post(format!("{url}&token={TOKEN}")).send().await;
        assert_eq!(in_url.unwrap().status(), 400);
    }
    let nameless = format!("{base}/api/semaphores/release");
    let nameless = http
        .post(&nameless)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(nameless.status(), 400);
    let still = api.locks("").await.unwrap();
    assert_eq!(still.semaphores[0].used, 2);
    assert_eq!(still.rw_locks[0].readers.len(), 1);

    // The semaphore's button (a form post with the token): every permit freed.
    let pressed = http
        .post(&release_sem)
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(pressed.status(), 303);
    let location = pressed.headers()["location"].to_str().unwrap().to_owned();
    assert!(location.starts_with("/admin/?notice="), "{location}");
    assert!(api.locks("exports").await.unwrap().semaphores.is_empty());
    for _ in 0..3 {
        semaphore.try_acquire().await.unwrap();
    }

    // The read-write lock through the JSON API: the reader goes, the writer gets in.
    let released = http.post(&release_rw).bearer_auth(TOKEN).send().await;
    let released = released.unwrap();
    assert_eq!(released.status(), 200);
    let released = json(released).await;
    assert_eq!(released["name"], "feed");
    assert_eq!(released["readers_deleted"], 1);
    let writer = tokio::time::timeout(Duration::from_secs(2), writer)
        .await
        .expect("the waiting writer is woken")
        .unwrap();
    assert!(writer.fencing_token().unwrap() > released["fencing_token"].as_u64().unwrap());
    drop(reader);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_releases_are_off_unless_switched_on() {
    let cluster = Cluster::start(3).await;
    let client = redlock(&cluster, "svc");
    let _permit = client
        .semaphore("jobs", 2)
        .unwrap()
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap();
    let base = serve_axum(Admin::builder().redlock(client.clone()).build().unwrap()).await;
    let http = reqwest::Client::new();
    for route in ["semaphores", "rw-locks"] {
        let refused = http
            .post(format!("{base}/api/{route}/release?name=jobs"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 403);
    }
    assert_eq!(client.locks("").await.unwrap().semaphores[0].used, 1);
    let page = http.get(format!("{base}/")).send().await.unwrap();
    let page = page.text().await.unwrap();
    assert!(page.contains("<table id=\"semaphores\">") && !page.contains("<button"));
}

#[cfg(feature = "actix")] // the workspace's tests build it (the examples enable it)
#[actix_web::test]
async fn actix_scope_releases_semaphores_and_rw_locks() {
    use actix_web::test::{TestRequest, call_service, init_service, read_body, read_body_json};

    let cluster = Cluster::start(3).await;
    let client = redlock(&cluster, "actix-svc");
    let _permit = client
        .semaphore("carts", 2)
        .unwrap()
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap();
    let _reader = client
        .rw_lock("catalog")
        .unwrap()
        .ttl(Duration::from_secs(30))
        .try_read()
        .await
        .unwrap();
    until_sized(&client, "carts").await;
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
    assert!(body.contains("<td class=\"used\">1/2</td>"), "{body}");
    assert!(
        body.contains("/ops/api/rw-locks/release?name=catalog"),
        "{body}"
    );

    let denied = TestRequest::post()
        .uri("/ops/api/semaphores/release?name=carts")
        .to_request();
    assert_eq!(call_service(&app, denied).await.status(), 401);
    for (uri, field, expected) in [
        ("/ops/api/semaphores/release?name=carts", "permits", 2),
        (
            "/ops/api/rw-locks/release?name=catalog",
            "readers_deleted",
            1,
        ),
    ] {
        let released = call_service(
            &app,
            TestRequest::post()
                .uri(uri)
                .insert_header(("authorization", format!("Bearer {TOKEN}")))
                .to_request(),
        )
        .await;
        assert_eq!(released.status(), 200, "{uri}");
        let body: serde_json::Value = read_body_json(released).await;
        assert_eq!(body[field], expected, "{body}");
    }
    let after = client.locks("").await.unwrap();
    assert!(
        after.semaphores.is_empty() && after.rw_locks.is_empty(),
        "{after:?}"
    );
}

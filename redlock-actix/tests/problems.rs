//! What a refused request's client sees, through a real actix-web server: a generic
//! problem body with the request's id and nothing of the server's insides (node
//! addresses, Redis error text, the resource prefix), `Retry-After` from the holder's
//! remaining validity or the documented fallback, the same as redlock-tower's; the
//! details go to the server's log, with the same id.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};
use redlock_actix::LockOptions;
use redlock_actix::{DistributedLock, DistributedLockConfig};
use redlock_core::Redlock;
use redlock_testkit::Cluster;

async fn pay(order: DistributedLock<web::Path<String>>) -> HttpResponse {
    HttpResponse::Ok().body(format!("paid {}", *order))
}

async fn serve(redlock: Redlock) -> String {
    redlock_testkit::logs::capture("redlock_actix=debug,redlock_http=debug,redlock_core=warn");
    let config = DistributedLockConfig::new(redlock)
        .options(LockOptions::new().resource_prefix(redlock_testkit::refusals::PREFIX));
    let server = HttpServer::new(move || {
        App::new()
            .app_data(config.clone())
            .route("/pay/{order}", web::post().to(pay))
    })
    .workers(1)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    actix_rt::spawn(server.run());
    format!("http://{addr}/pay")
}

/// (status, Retry-After, body) of one `POST /pay/{order}` with request id `id`.
async fn post(url: String, order: String, id: String) -> (u16, Option<u64>, String) {
    let mut response = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish()
        .post(format!("{url}/{order}"))
        .insert_header(("x-request-id", id))
        .send()
        .await
        .unwrap();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let body = response.body().await.unwrap();
    (
        response.status().as_u16(),
        retry_after,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[actix_rt::test]
async fn refusals_carry_no_internals_and_the_holders_remaining_time() {
    let cluster = Cluster::start(3).await;
    // A node timeout that a loaded machine's live nodes answer well within: with one
    // node paused, the two others must both be heard for the answer to be "taken".
    let redlock = redlock_testkit::client(&cluster, Duration::from_millis(500));
    let url = serve(redlock.clone()).await;
    redlock_testkit::refusals::check(&cluster, &redlock, |order, id| post(url.clone(), order, id))
        .await;
}

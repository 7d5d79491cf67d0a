//! The `Idempotency` middleware against real redis-server nodes (three lock nodes, one
//! data Redis for the records): a request runs once per key and its retries get the
//! stored response byte for byte; concurrent requests, reused keys, missing keys,
//! server errors, oversized responses, scopes, waiting, and the fencing token.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use actix_web::dev::{Service, ServiceResponse};
use actix_web::http::header::HeaderMap;
use common::*;
use redlock_actix::{FencingToken, IdempotencyMiddleware};
use redlock_idempotency::Idempotency;
use redlock_idempotency::store::RedisStore;

/// Three lock nodes and a data Redis, kept alive for the test.
struct Backends {
    nodes: Cluster,
    data: Cluster,
}

impl Backends {
    async fn start() -> Self {
        let (nodes, data) = tokio::join!(Cluster::start(3), Cluster::start(1));
        Self { nodes, data }
    }

    /// The engine with default options over these backends.
    async fn core(&self) -> Idempotency {
        let redlock = redlock_testkit::builder(&self.nodes).build().unwrap();
        let store = RedisStore::open(&self.data.urls()[0]).await.unwrap();
        Idempotency::new(redlock, store)
    }

    /// A middleware with default options over these backends.
    async fn idempotency(&self) -> IdempotencyMiddleware {
        IdempotencyMiddleware::new(self.core().await)
    }
}

/// How many times the handlers ran.
type Calls = web::Data<AtomicUsize>;

fn calls() -> Calls {
    web::Data::new(AtomicUsize::new(0))
}

/// Counts the run, sleeps `?ms=`, and answers `201` with the request's body, a content
/// type, a custom header given twice and a hop-by-hop header.
async fn create(calls: Calls, query: web::Query<Ms>, body: web::Bytes) -> HttpResponse {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    actix_rt::time::sleep(Duration::from_millis(query.ms)).await;
    HttpResponse::Created()
        .content_type("application/json")
        .append_header(("x-custom", "a"))
        .append_header(("x-custom", "b"))
        .insert_header(("keep-alive", "timeout=5"))
        .body(format!(
            "{{\"run\":{n},\"body\":\"{}\"}}",
            String::from_utf8_lossy(&body)
        ))
}

/// `500` on its first run, `201` afterwards.
async fn flaky(calls: Calls) -> HttpResponse {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n == 1 {
        HttpResponse::InternalServerError().body("run 1 failed")
    } else {
        HttpResponse::Created().body(format!("run {n}"))
    }
}

/// 100 bytes in ten chunks.
async fn streamed(calls: Calls) -> HttpResponse {
    calls.fetch_add(1, Ordering::SeqCst);
    let chunks =
        (0..10u8).map(|i| Ok::<_, std::convert::Infallible>(web::Bytes::from(vec![b'0' + i; 10])));
    HttpResponse::Ok().body(BodyStream::new(futures_util::stream::iter(chunks)))
}

/// 100 bytes in one sized body.
async fn sized(calls: Calls) -> HttpResponse {
    calls.fetch_add(1, Ordering::SeqCst);
    HttpResponse::Ok().body(vec![b'x'; 100])
}

/// The run's fencing token: `500` on the first run, `200` afterwards.
async fn fenced(token: FencingToken, calls: Calls) -> HttpResponse {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    let status = if n == 1 { 500 } else { 200 };
    HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap())
        .body(format!("token {}", token.0))
}

/// What a request got.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: web::Bytes,
}

impl Answer {
    async fn of(response: ServiceResponse<impl actix_web::body::MessageBody>) -> Self {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = actix_test::read_body(response).await;
        Self {
            status,
            headers,
            body,
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    fn headers(&self, name: &str) -> Vec<&str> {
        self.headers
            .get_all(name)
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A problem document of `status` and type `kind`.
    fn is_problem(&self, status: u16, kind: &str) -> bool {
        self.status == status
            && self.header("content-type") == Some("application/problem+json")
            && self.text().contains(kind)
    }
}

/// `POST path` with `key` (if any), `body` and extra headers.
fn request(
    path: &str,
    key: Option<&str>,
    body: &'static str,
    headers: &[(&'static str, &'static str)],
) -> actix_test::TestRequest {
    let mut request = actix_test::TestRequest::post().uri(path).set_payload(body);
    if let Some(key) = key {
        request = request.insert_header(("idempotency-key", key.to_owned()));
    }
    for header in headers {
        request = request.insert_header(*header);
    }
    request
}

/// Sends `request` to `app`.
async fn send<S, R, B>(app: &S, request: R) -> Answer
where
    S: Service<R, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    Answer::of(actix_test::call_service(app, request).await).await
}

/// Sends the request `make` builds until it is not refused as in flight: after a run
/// whose response was not stored, its lock is released in the background, just after
/// the response (a retry at once may meet it, and be told to retry).
async fn send_once_free<S, R, B>(app: &S, make: impl Fn() -> R) -> Answer
where
    S: Service<R, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    for _ in 0..40 {
        let answer = send(app, make()).await;
        if !answer.is_problem(409, "urn:redlock:idempotency:in-flight") {
            return answer;
        }
        actix_rt::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("still in flight after a second");
}

/// The first request runs and is stored; its retry gets the same bytes, marked
/// replayed, without the handler running; the handler saw the request's body.
#[actix_rt::test]
async fn a_retry_replays_the_first_response_without_running_the_handler() {
    let backends = Backends::start().await;
    let idempotency = backends.idempotency().await;
    let calls = calls();
    let app = actix_test::init_service(
        App::new().app_data(calls.clone()).service(
            web::resource("/refunds")
                .wrap(idempotency)
                .route(web::post().to(create)),
        ),
    )
    .await;

    let first = send(
        &app,
        request("/refunds?ms=0", Some("k-1"), "order 7", &[]).to_request(),
    )
    .await;
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(first.text(), r#"{"run":1,"body":"order 7"}"#);
    assert!(!first.replayed());

    for _ in 0..2 {
        let retry = send(
            &app,
            request("/refunds?ms=0", Some("k-1"), "order 7", &[]).to_request(),
        )
        .await;
        assert_eq!(retry.status, 201, "{retry:?}");
        assert_eq!(retry.body, first.body);
        assert!(retry.replayed(), "{retry:?}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Another key runs.
    let other = send(
        &app,
        request("/refunds?ms=0", Some("k-2"), "order 7", &[]).to_request(),
    )
    .await;
    assert_eq!(other.text(), r#"{"run":2,"body":"order 7"}"#);
    assert!(!other.replayed());
}

/// The replay keeps the content type and the custom header (both values, in order),
/// and leaves out the hop-by-hop header the handler set.
#[actix_rt::test]
async fn a_replay_keeps_the_handlers_headers_but_not_hop_by_hop_ones() {
    let backends = Backends::start().await;
    let idempotency = backends.idempotency().await;
    let app = actix_test::init_service(
        App::new().app_data(calls()).service(
            web::resource("/refunds")
                .wrap(idempotency)
                .route(web::post().to(create)),
        ),
    )
    .await;

    let first = send(
        &app,
        request("/refunds?ms=0", Some("h-1"), "x", &[]).to_request(),
    )
    .await;
    assert_eq!(first.header("keep-alive"), Some("timeout=5"));
    let retry = send(
        &app,
        request("/refunds?ms=0", Some("h-1"), "x", &[]).to_request(),
    )
    .await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.header("content-type"), Some("application/json"));
    assert_eq!(retry.headers("x-custom"), ["a", "b"]);
    assert_eq!(retry.header("keep-alive"), None, "{retry:?}");
    assert_eq!(retry.body, first.body);
}

/// Requests with one key at once: the handler runs once; the others get `409` with
/// `Retry-After` (or, had it finished, the replay).
#[actix_rt::test]
async fn concurrent_requests_with_one_key_run_the_handler_once() {
    let backends = Backends::start().await;
    let idempotency = backends.idempotency().await;
    let calls = calls();
    let app = actix_test::init_service(
        App::new().app_data(calls.clone()).service(
            web::resource("/refunds")
                .wrap(idempotency)
                .route(web::post().to(create)),
        ),
    )
    .await;

    let answers = futures_util::future::join_all((0..5).map(|_| {
        send(
            &app,
            request("/refunds?ms=400", Some("c-1"), "same", &[]).to_request(),
        )
    }))
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "{answers:#?}");
    let ran: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == 201 && !a.replayed())
        .collect();
    assert_eq!(ran.len(), 1, "{answers:#?}");
    for answer in &answers {
        let in_flight = answer.is_problem(409, "urn:redlock:idempotency:in-flight")
            && answer.header("retry-after").is_some();
        let replay = answer.replayed() && answer.body == ran[0].body;
        let first = std::ptr::eq(answer, ran[0]);
        assert!(in_flight || replay || first, "{answer:?}");
    }
    assert!(
        answers.iter().any(|a| a.status == 409),
        "nobody met the run in flight: {answers:#?}"
    );
    let after = send(
        &app,
        // The same target: the query is part of the fingerprint.
        request("/refunds?ms=400", Some("c-1"), "same", &[]).to_request(),
    )
    .await;
    assert!(after.replayed() && after.body == ran[0].body, "{after:?}");
}

/// With `wait`, a request arriving while its key's first one runs waits for it and
/// gets its response replayed.
#[actix_rt::test]
async fn with_wait_a_concurrent_request_gets_the_replay() {
    let backends = Backends::start().await;
    let idempotency =
        IdempotencyMiddleware::new(backends.core().await.wait(Duration::from_secs(5)));
    let calls = calls();
    let app = actix_test::init_service(
        App::new().app_data(calls.clone()).service(
            web::resource("/refunds")
                .wrap(idempotency)
                .route(web::post().to(create)),
        ),
    )
    .await;

    let (first, second) = tokio::join!(
        send(
            &app,
            request("/refunds?ms=500", Some("w-1"), "w", &[]).to_request()
        ),
        async {
            actix_rt::time::sleep(Duration::from_millis(150)).await;
            send(
                &app,
                request("/refunds?ms=500", Some("w-1"), "w", &[]).to_request(),
            )
            .await
        }
    );
    assert_eq!((first.status, first.replayed()), (201, false), "{first:?}");
    assert_eq!(
        (second.status, second.replayed()),
        (201, true),
        "{second:?}"
    );
    assert_eq!(second.body, first.body);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A key reused with another body: `422`, and the handler does not run.
#[actix_rt::test]
async fn a_key_reused_for_another_request_is_refused_422() {
    let backends = Backends::start().await;
    let idempotency = backends.idempotency().await;
    let calls = calls();
    let app = actix_test::init_service(
        App::new().app_data(calls.clone()).service(
            web::resource("/refunds")
                .wrap(idempotency)
                .route(web::post().to(create)),
        ),
    )
    .await;

    let first = send(
        &app,
        request("/refunds?ms=0", Some("m-1"), "order 7", &[]).to_request(),
    )
    .await;
    assert_eq!(first.status, 201);
    let other = send(
        &app,
        request("/refunds?ms=0", Some("m-1"), "order 8", &[]).to_request(),
    )
    .await;
    assert!(
        other.is_problem(422, "urn:redlock:idempotency:mismatch"),
        "{other:?}"
    );
    // Another target with the same key too.
    let other = send(
        &app,
        request("/refunds?ms=1", Some("m-1"), "order 7", &[]).to_request(),
    )
    .await;
    assert!(other.is_problem(422, "mismatch"), "{other:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// No key: `400` where keys are required (the default); where optional, the request
/// runs unprotected, every time.
#[actix_rt::test]
async fn a_missing_key_is_refused_unless_keys_are_optional() {
    let backends = Backends::start().await;
    let idempotency = backends.idempotency().await;
    let calls = calls();
    let app = actix_test::init_service(
        App::new()
            .app_data(calls.clone())
            .service(
                web::resource("/required")
                    .wrap(idempotency.clone())
                    .route(web::post().to(create)),
            )
            .service(
                web::resource("/optional")
                    .wrap(IdempotencyMiddleware::new(
                        idempotency.core().clone().required(false),
                    ))
                    .route(web::post().to(create)),
            ),
    )
    .await;

    let missing = send(&app, request("/required?ms=0", None, "x", &[]).to_request()).await;
    assert!(missing.is_problem(400, "\"status\":400"), "{missing:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let empty = send(
        &app,
        request("/required?ms=0", Some("\"\""), "x", &[]).to_request(),
    )
    .await;
    assert_eq!(empty.status, 400, "{empty:?}");

    for n in 1..=2 {
        let passed = send(&app, request("/optional?ms=0", None, "x", &[]).to_request()).await;
        assert_eq!(passed.status, 201, "{passed:?}");
        assert!(!passed.replayed());
        assert_eq!(passed.text(), format!(r#"{{"run":{n},"body":"x"}}"#));
    }
    // Optional, but given: protected.
    let keyed = send(
        &app,
        request("/optional?ms=0", Some("o-1"), "x", &[]).to_request(),
    )
    .await;
    let retry = send(
        &app,
        request("/optional?ms=0", Some("o-1"), "x", &[]).to_request(),
    )
    .await;
    assert!(!keyed.replayed() && retry.replayed(), "{retry:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// A request body over `max_request_body`: `413`, the handler does not run.
#[actix_rt::test]
async fn a_request_body_over_the_limit_is_refused_413() {
    let backends = Backends::start().await;
    let idempotency = IdempotencyMiddleware::new(backends.core().await.max_request_body(8));
    let calls = calls();
    let app = actix_test::init_service(
        App::new().app_data(calls.clone()).service(
            web::resource("/refunds")
                .wrap(idempotency)
                .route(web::post().to(create)),
        ),
    )
    .await;
    let big = send(
        &app,
        request("/refunds?ms=0", Some("b-1"), "123456789", &[]).to_request(),
    )
    .await;
    assert!(
        big.is_problem(413, "urn:redlock:idempotency:body-too-large"),
        "{big:?}"
    );
    let small = send(
        &app,
        request("/refunds?ms=0", Some("b-1"), "12345678", &[]).to_request(),
    )
    .await;
    assert_eq!(small.text(), r#"{"run":1,"body":"12345678"}"#);
}

/// A `5xx` is not stored: the key's next request runs the handler again, and that
/// one's `201` is replayed afterwards.
#[actix_rt::test]
async fn a_server_error_is_not_replayed() {
    let backends = Backends::start().await;
    let idempotency = backends.idempotency().await;
    let calls = calls();
    let app = actix_test::init_service(
        App::new().app_data(calls.clone()).service(
            web::resource("/flaky")
                .wrap(idempotency)
                .route(web::post().to(flaky)),
        ),
    )
    .await;

    let failed = send(&app, request("/flaky", Some("e-1"), "", &[]).to_request()).await;
    assert_eq!(
        (failed.status, failed.text().as_str()),
        (500, "run 1 failed")
    );
    let again = send_once_free(&app, || {
        request("/flaky", Some("e-1"), "", &[]).to_request()
    })
    .await;
    assert_eq!((again.status, again.text().as_str()), (201, "run 2"));
    assert!(!again.replayed());
    let replay = send(&app, request("/flaky", Some("e-1"), "", &[]).to_request()).await;
    assert_eq!((replay.status, replay.text().as_str()), (201, "run 2"));
    assert!(replay.replayed());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A response larger than `max_body` is answered whole (streamed or sized), not
/// stored: its retry gets `409` "not replayable", and the handler ran once.
#[actix_rt::test]
async fn an_oversized_response_is_sent_whole_and_its_retry_gets_409() {
    let backends = Backends::start().await;
    let idempotency = IdempotencyMiddleware::new(backends.core().await.max_body(16));
    let calls = calls();
    let app = actix_test::init_service(
        App::new()
            .app_data(calls.clone())
            .service(
                web::resource("/streamed")
                    .wrap(idempotency.clone())
                    .route(web::post().to(streamed)),
            )
            .service(
                web::resource("/sized")
                    .wrap(idempotency)
                    .route(web::post().to(sized)),
            ),
    )
    .await;

    let expected: Vec<u8> = (0..10u8).flat_map(|i| vec![b'0' + i; 10]).collect();
    let first = send(
        &app,
        request("/streamed", Some("big-1"), "", &[]).to_request(),
    )
    .await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body.len(), 100);
    assert_eq!(&first.body[..], &expected[..]);
    let retry = send(
        &app,
        request("/streamed", Some("big-1"), "", &[]).to_request(),
    )
    .await;
    assert!(
        retry.is_problem(409, "urn:redlock:idempotency:not-replayable"),
        "{retry:?}"
    );
    assert_eq!(retry.header("retry-after"), None);

    let first = send(&app, request("/sized", Some("big-2"), "", &[]).to_request()).await;
    assert_eq!(&first.body[..], &[b'x'; 100][..]);
    let retry = send(&app, request("/sized", Some("big-2"), "", &[]).to_request()).await;
    assert!(retry.is_problem(409, "not-replayable"), "{retry:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// With `scope_header`, one key in two tenants is two requests; a request without the
/// tenant is refused `400`.
#[actix_rt::test]
async fn scopes_keep_one_key_of_two_tenants_apart() {
    let backends = Backends::start().await;
    let idempotency = backends.idempotency().await.scope_header("x-tenant");
    let calls = calls();
    let app = actix_test::init_service(
        App::new().app_data(calls.clone()).service(
            web::resource("/refunds")
                .wrap(idempotency)
                .route(web::post().to(create)),
        ),
    )
    .await;

    let acme = send(
        &app,
        request("/refunds?ms=0", Some("s-1"), "x", &[("x-tenant", "acme")]).to_request(),
    )
    .await;
    let globex = send(
        &app,
        request(
            "/refunds?ms=0",
            Some("s-1"),
            "x",
            &[("x-tenant", " globex ")],
        )
        .to_request(),
    )
    .await;
    assert_eq!(acme.text(), r#"{"run":1,"body":"x"}"#);
    assert_eq!(globex.text(), r#"{"run":2,"body":"x"}"#);
    assert!(!globex.replayed());
    let retry = send(
        &app,
        request("/refunds?ms=0", Some("s-1"), "x", &[("x-tenant", "acme")]).to_request(),
    )
    .await;
    assert!(retry.replayed() && retry.body == acme.body, "{retry:?}");

    let unscoped = send(
        &app,
        request("/refunds?ms=0", Some("s-1"), "x", &[]).to_request(),
    )
    .await;
    assert!(unscoped.is_problem(400, "scope"), "{unscoped:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// `FencingToken` (and `web::ReqData<LockHandle>`) work under the middleware: the run
/// after a failed one holds a greater token.
#[actix_rt::test]
async fn the_fencing_token_extractor_sees_the_runs_lock() {
    let backends = Backends::start().await;
    let idempotency = backends.idempotency().await;
    let app = actix_test::init_service(
        App::new()
            .app_data(calls())
            .service(
                web::resource("/fenced")
                    .wrap(idempotency.clone())
                    .route(web::post().to(fenced)),
            )
            .service(
                web::resource("/handle")
                    .wrap(idempotency)
                    .route(web::post().to(handle_resource)),
            ),
    )
    .await;

    let token = |answer: &Answer| -> u64 {
        let text = answer.text();
        text.strip_prefix("token ")
            .unwrap_or_else(|| panic!("{answer:?}"))
            .parse()
            .unwrap()
    };
    let first = send(&app, request("/fenced", Some("f-1"), "", &[]).to_request()).await;
    assert_eq!(first.status, 500, "{first:?}");
    let second = send_once_free(&app, || {
        request("/fenced", Some("f-1"), "", &[]).to_request()
    })
    .await;
    assert_eq!(second.status, 200, "{second:?}");
    assert!(token(&second) > token(&first), "{first:?} {second:?}");

    let handle = send(&app, request("/handle", Some("f:2"), "", &[]).to_request()).await;
    assert_eq!(handle.text(), "idempotency:f%3A2");
}

/// `POST url` with `key` over HTTP: status, whether replayed, body.
async fn post_keyed(client: &awc::Client, url: String, key: &str) -> (u16, bool, String) {
    let mut response = client
        .post(url)
        .insert_header(("idempotency-key", key))
        .send_body("x")
        .await
        .expect("send");
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let body = response.body().await.expect("body");
    (
        response.status().as_u16(),
        replayed,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// A two-worker server: concurrent requests with one key (over several connections,
/// on both workers) run the handler once; then the server stops (its workers' runtimes
/// end) and a new one with the same middleware replays the stored response and runs a
/// new key (its lock and store calls never ran on the old workers' runtimes).
#[actix_rt::test]
async fn a_real_server_runs_a_key_once_and_a_restarted_one_replays_it() {
    let backends = Backends::start().await;
    let idempotency = backends.idempotency().await;
    let calls = calls();
    let configure = {
        let calls = calls.clone();
        move |cfg: &mut web::ServiceConfig| {
            cfg.app_data(calls.clone()).service(
                web::resource("/refunds")
                    .wrap(idempotency.clone())
                    .route(web::post().to(create)),
            );
        }
    };
    let client = http();

    let first = Server::start(2, configure.clone()).await;
    let url = first.url("/refunds?ms=300");
    let replies =
        futures_util::future::join_all((0..6).map(|_| post_keyed(&client, url.clone(), "r-1")))
            .await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "{replies:#?}");
    let ran: Vec<_> = replies.iter().filter(|r| r.0 == 201 && !r.1).collect();
    assert_eq!(ran.len(), 1, "{replies:#?}");
    let stored = ran[0].2.clone();
    assert!(
        replies
            .iter()
            .all(|r| r.0 == 409 || (r.0 == 201 && r.2 == stored)),
        "{replies:#?}"
    );
    first.stop().await;

    let second = Server::start(2, configure).await;
    let replay = post_keyed(&client, second.url("/refunds?ms=300"), "r-1").await;
    assert_eq!(replay, (201, true, stored), "after the restart");
    let fresh = post_keyed(&client, second.url("/refunds?ms=0"), "r-2").await;
    assert_eq!(fresh, (201, false, r#"{"run":2,"body":"x"}"#.to_owned()));
    second.stop().await;
}

/// The key's grammar (a token, or a quoted string), the core's one parser, as
/// redlock-tower answers it: anything else is `400` and nothing runs.
#[actix_rt::test]
async fn keys_are_a_token_or_a_quoted_string() {
    let backends = Backends::start().await;
    let calls = calls();
    let app = actix_test::init_service(
        App::new().app_data(calls.clone()).service(
            web::resource("/orders")
                .wrap(backends.idempotency().await)
                .route(web::post().to(create)),
        ),
    )
    .await;

    for bad in [
        "a b",      // inner spaces in a token
        "\"abc",    // a lone leading quote
        "abc\"",    // a lone trailing quote
        "\"\"",     // an empty quoted string
        "a\tb",     // a control character
        "a\\b",     // a backslash
        "\"a\"b\"", // a quote inside
    ] {
        let answer = send(&app, request("/orders", Some(bad), "x", &[]).to_request()).await;
        assert!(
            answer.is_problem(400, "urn:redlock:bad-key"),
            "{bad:?}: {answer:?}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // A quoted string may hold spaces; its quotes are not part of the key.
    let first = send(
        &app,
        request("/orders?ms=0", Some("\"a b\""), "x", &[]).to_request(),
    )
    .await;
    assert_eq!(first.status, 201, "{first:?}");
    let retry = send(
        &app,
        request("/orders?ms=0", Some("\"a b\""), "x", &[]).to_request(),
    )
    .await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

//! The idempotency middleware against real redis-server nodes (three for the locks, one
//! for the records): axum routers driven with `oneshot`, and a real HTTP server where
//! the bytes on the wire matter.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::*;
use futures_util::future::join_all;
use http::HeaderMap;
use redlock_idempotency::Idempotency;
use redlock_idempotency::store::RedisStore;
use redlock_tower::idempotency::IdempotencyLayer;
use redlock_tower::{FencingToken, idempotency::REPLAYED_HEADER};
use tower::ServiceExt;

/// The lock nodes and the data Redis, alive as long as the test.
struct Servers {
    locks: Cluster,
    data: Cluster,
}

impl Servers {
    async fn start() -> Self {
        Self {
            locks: Cluster::start(3).await,
            data: Cluster::start(1).await,
        }
    }

    /// The engine with default options over these servers.
    async fn core(&self) -> Idempotency {
        let redlock = redlock_testkit::builder(&self.locks).build().unwrap();
        let store = RedisStore::open(&self.data.urls()[0]).await.unwrap();
        Idempotency::new(redlock, store)
    }

    /// A layer with default options over these servers.
    async fn layer(&self) -> IdempotencyLayer {
        IdempotencyLayer::new(self.core().await)
    }
}

/// `POST /orders`: counts its runs, waits `work`, answers `201` with `order {n}: {body}`.
fn orders(layer: IdempotencyLayer, runs: Arc<AtomicUsize>, work: Duration) -> Router {
    Router::new()
        .route(
            "/orders",
            post(move |body: Bytes| async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(work).await;
                (
                    StatusCode::CREATED,
                    format!("order {n}: {}", String::from_utf8_lossy(&body)),
                )
            }),
        )
        .layer(layer)
}

fn request(key: Option<&str>, body: &'static str) -> Request {
    let mut builder = http::Request::post("/orders");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(Body::from(body)).unwrap()
}

async fn send(app: &Router, request: Request) -> (StatusCode, HeaderMap, Bytes) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, headers, body)
}

fn problem_type(body: &Bytes) -> String {
    let text = String::from_utf8_lossy(body);
    let start = text.find(r#""type":""#).expect("a problem body") + 8;
    text[start..][..text[start..].find('"').unwrap()].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_run_is_stored_and_its_retry_replays_the_same_bytes() {
    let servers = Servers::start().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = orders(servers.layer().await, runs.clone(), Duration::ZERO);

    let (status, headers, body) = send(&app, request(Some("k-1"), "two apples")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body, "order 1: two apples");
    assert!(headers.get(REPLAYED_HEADER).is_none());

    let (status, headers, replay) = send(&app, request(Some("k-1"), "two apples")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(replay, body);
    assert_eq!(headers[REPLAYED_HEADER], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Another key runs.
    let (_, _, other) = send(&app, request(Some("k-2"), "a pear")).await;
    assert_eq!(other, "order 2: a pear");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_with_one_key_run_the_handler_once() {
    let servers = Servers::start().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = orders(
        servers.layer().await,
        runs.clone(),
        Duration::from_millis(300),
    );

    // Fail-fast acquisitions of one key at once may also split the nodes' votes so that
    // none of them wins: then every request is told to retry. Never does the handler run
    // twice.
    let answers = join_all((0..20).map(|_| send(&app, request(Some("same"), "one")))).await;
    assert!(runs.load(Ordering::SeqCst) <= 1);
    let mut first_runs = 0;
    for (status, headers, body) in &answers {
        match *status {
            StatusCode::CREATED if headers.get(REPLAYED_HEADER).is_none() => {
                first_runs += 1;
                assert_eq!(body, "order 1: one");
            }
            StatusCode::CREATED => assert_eq!(body, "order 1: one"),
            StatusCode::CONFLICT => {
                assert!(headers.contains_key("retry-after"), "{headers:?}");
                assert_eq!(problem_type(body), "urn:redlock:idempotency:in-flight");
            }
            // A node too slow to answer in time on a loaded machine: retry later too.
            StatusCode::SERVICE_UNAVAILABLE => {
                assert!(headers.contains_key("retry-after"), "{headers:?}");
            }
            other => panic!("unexpected {other}: {body:?}"),
        }
    }
    assert_eq!(first_runs, runs.load(Ordering::SeqCst));
    assert!(
        answers.iter().any(|(s, _, _)| *s != StatusCode::CREATED),
        "the others came while the first one held the key: refused"
    );

    // Retried until answered, as a client does (`409` and `503` say when): one run in
    // all, and its response.
    let mut answered = None;
    for _ in 0..50 {
        let answer = send(&app, request(Some("same"), "one")).await;
        if !matches!(
            answer.0,
            StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE
        ) {
            answered = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _, body) = answered.expect("an answer once the key is free");
    assert_eq!(
        (status, &body[..]),
        (StatusCode::CREATED, &b"order 1: one"[..])
    );
    let (status, headers, body) = send(&app, request(Some("same"), "one")).await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::CREATED, &b"order 1: one"[..])
    );
    assert_eq!(headers[REPLAYED_HEADER], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_for_another_request_is_refused_with_422() {
    let servers = Servers::start().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = orders(servers.layer().await, runs.clone(), Duration::ZERO);

    assert_eq!(
        send(&app, request(Some("k"), "one")).await.0,
        StatusCode::CREATED
    );
    let (status, headers, body) = send(&app, request(Some("k"), "another")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(headers.get(REPLAYED_HEADER).is_none());
    assert!(!String::from_utf8_lossy(&body).contains("order 1"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_is_refused_unless_keys_are_optional() {
    let servers = Servers::start().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let required = orders(servers.layer().await, runs.clone(), Duration::ZERO);
    let (status, headers, body) = send(
        &required,
        http::Request::post("/orders")
            .header("x-request-id", "req-42")
            .body(Body::from("one"))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(String::from_utf8_lossy(&body).contains("req-42"));
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    let optional = orders(
        IdempotencyLayer::new(servers.core().await.required(false)),
        runs.clone(),
        Duration::ZERO,
    );
    for n in 1..=2 {
        let (status, headers, body) = send(&optional, request(None, "free")).await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(body, format!("order {n}: free"));
        assert!(headers.get(REPLAYED_HEADER).is_none());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_over_the_limit_is_refused_with_413() {
    let servers = Servers::start().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = orders(
        IdempotencyLayer::new(servers.core().await.max_request_body(8)),
        runs.clone(),
        Duration::ZERO,
    );
    let (status, _, body) = send(&app, request(Some("k"), "more than eight bytes")).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        problem_type(&body),
        "urn:redlock:idempotency:body-too-large"
    );
    let (status, _, body) = send(&app, request(Some("k"), "eight!!!")).await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::CREATED, &b"order 1: eight!!!"[..])
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_is_not_replayed_and_the_retry_runs_again() {
    let servers = Servers::start().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/orders",
            post(move || async move {
                match counter.fetch_add(1, Ordering::SeqCst) {
                    0 => (StatusCode::INTERNAL_SERVER_ERROR, "broke"),
                    _ => (StatusCode::CREATED, "made"),
                }
            }),
        )
        // The first run's lock is released in the background once its response is
        // recorded: the retry waits for it rather than being told to retry.
        .layer(IdempotencyLayer::new(
            servers.core().await.wait(Duration::from_secs(5)),
        ));

    let (status, _, body) = send(&app, request(Some("k"), "x")).await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::INTERNAL_SERVER_ERROR, &b"broke"[..])
    );
    let (status, headers, body) = send(&app, request(Some("k"), "x")).await;
    assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"made"[..]));
    assert!(headers.get(REPLAYED_HEADER).is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // The success is stored.
    let (status, headers, body) = send(&app, request(Some("k"), "x")).await;
    assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"made"[..]));
    assert_eq!(headers[REPLAYED_HEADER], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Over a real server: the first response's 100 bytes all reach the client though only
/// 16 may be stored (streamed in chunks, so the layer reads part of it first), and the
/// retry is told that the response cannot be replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_max_body_is_answered_whole_and_not_replayed() {
    let servers = Servers::start().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/orders",
            post(move || async move {
                counter.fetch_add(1, Ordering::SeqCst);
                let chunks =
                    (0..10u8).map(|i| Ok::<_, std::io::Error>(Bytes::from(vec![b'a' + i; 10])));
                Body::from_stream(futures_util::stream::iter(chunks))
            }),
        )
        .layer(IdempotencyLayer::new(servers.core().await.max_body(16)));
    let base = serve(app).await;
    let client = http();
    let post = || {
        client
            .post(format!("{base}/orders"))
            .header("idempotency-key", "big")
            .body("x")
            .send()
    };

    let first = post().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let body = first.bytes().await.unwrap();
    let expected: Vec<u8> = (0..10u8).flat_map(|i| vec![b'a' + i; 10]).collect();
    assert_eq!(body.len(), 100);
    assert_eq!(&body[..], &expected[..]);

    let retry = post().await.unwrap();
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    assert!(retry.headers().get("retry-after").is_none());
    let body = retry.bytes().await.unwrap();
    assert_eq!(
        problem_type(&body),
        "urn:redlock:idempotency:not-replayable"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_keep_one_key_of_two_tenants_apart() {
    let servers = Servers::start().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/orders",
            post(move |headers: http::HeaderMap| async move {
                counter.fetch_add(1, Ordering::SeqCst);
                let tenant = headers["x-tenant"].to_str().unwrap().to_owned();
                format!("secret of {tenant}")
            }),
        )
        .layer(servers.layer().await.scope_header("x-tenant"));
    let as_tenant = |tenant: Option<&str>| {
        let mut builder = http::Request::post("/orders").header("idempotency-key", "shared");
        if let Some(tenant) = tenant {
            builder = builder.header("x-tenant", tenant);
        }
        builder.body(Body::from("same")).unwrap()
    };

    let (status, _, a) = send(&app, as_tenant(Some("acme"))).await;
    assert_eq!((status, &a[..]), (StatusCode::OK, &b"secret of acme"[..]));
    let (status, headers, b) = send(&app, as_tenant(Some("globex"))).await;
    assert_eq!((status, &b[..]), (StatusCode::OK, &b"secret of globex"[..]));
    assert!(headers.get(REPLAYED_HEADER).is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // Each tenant's retry gets its own response.
    for (tenant, expected) in [("acme", "secret of acme"), ("globex", "secret of globex")] {
        let (status, headers, body) = send(&app, as_tenant(Some(tenant))).await;
        assert_eq!((status, &body[..]), (StatusCode::OK, expected.as_bytes()));
        assert_eq!(headers[REPLAYED_HEADER], "true");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // No scope: refused.
    let (status, _, body) = send(&app, as_tenant(None)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("scope"));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_keeps_the_headers_but_the_hop_by_hop_ones() {
    let servers = Servers::start().await;
    let app = Router::new()
        .route(
            "/orders",
            post(|| async {
                (
                    StatusCode::ACCEPTED,
                    [
                        ("content-type", "application/json"),
                        ("x-custom", "kept"),
                        ("keep-alive", "timeout=5"),
                        ("connection", "x-private"),
                        ("x-private", "hop"),
                    ],
                    r#"{"ok":true}"#,
                )
            }),
        )
        .layer(servers.layer().await);

    let (status, first, _) = send(&app, request(Some("h"), "")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(first["keep-alive"], "timeout=5"); // the first response is the handler's

    let (status, headers, body) = send(&app, request(Some("h"), "")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(body, r#"{"ok":true}"#);
    assert_eq!(headers[REPLAYED_HEADER], "true");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["x-custom"], "kept");
    for hop in ["keep-alive", "connection", "x-private", "transfer-encoding"] {
        assert!(headers.get(hop).is_none(), "{hop} replayed: {headers:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_a_concurrent_request_gets_the_replay() {
    let servers = Servers::start().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = orders(
        IdempotencyLayer::new(servers.core().await.wait(Duration::from_secs(5))),
        runs.clone(),
        Duration::from_millis(500),
    );

    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, request(Some("w"), "one")).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (status, headers, body) = send(&app, request(Some("w"), "one")).await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::CREATED, &b"order 1: one"[..])
    );
    assert_eq!(headers[REPLAYED_HEADER], "true");
    let (status, headers, body) = first.await.unwrap();
    assert_eq!(
        (status, &body[..]),
        (StatusCode::CREATED, &b"order 1: one"[..])
    );
    assert!(headers.get(REPLAYED_HEADER).is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_takes_the_runs_fencing_token() {
    let servers = Servers::start().await;
    let app = Router::new()
        .route(
            "/orders",
            post(|FencingToken(token): FencingToken| async move { format!("token {token}") }),
        )
        .layer(servers.layer().await);

    let mut tokens = Vec::new();
    for key in ["t-1", "t-1", "t-2"] {
        let (status, _, body) = send(&app, request(Some(key), "")).await;
        assert_eq!(status, StatusCode::OK, "{body:?}");
        let text = String::from_utf8_lossy(&body).into_owned();
        let token: u64 = text.strip_prefix("token ").unwrap().parse().unwrap();
        tokens.push(token);
    }
    // The retry replays the first run's token; another key runs under its own lock.
    assert_eq!(tokens[0], tokens[1]);
    assert!(tokens[0] > 0 && tokens[2] > 0);
}

/// The key's grammar (a token, or a quoted string), the core's one parser, as
/// redlock-actix answers it: anything else is `400` and nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_a_token_or_a_quoted_string() {
    let servers = Servers::start().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = orders(servers.layer().await, runs.clone(), Duration::ZERO);

    for bad in [
        "a b",      // inner spaces in a token
        "\"abc",    // a lone leading quote
        "abc\"",    // a lone trailing quote
        "\"\"",     // an empty quoted string
        "a\tb",     // a control character
        "a\\b",     // a backslash
        "\"a\"b\"", // a quote inside
    ] {
        let (status, _, body) = send(&app, request(Some(bad), "x")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {body:?}");
        assert_eq!(problem_type(&body), "urn:redlock:bad-key", "{bad:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // A quoted string may hold spaces; its quotes are not part of the key.
    let (status, _, body) = send(&app, request(Some("\"a b\""), "x")).await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::CREATED, &b"order 1: x"[..])
    );
    let (status, headers, _) = send(&app, request(Some("\"a b\""), "x")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers[REPLAYED_HEADER], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A stored response keeps its trailers in the first answer; the middleware's bodies send
/// every byte they were given (in one piece, or what was read, then the rest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_response_keeps_its_trailers_and_no_byte_is_lost() {
    use http_body::Body as _;
    use http_body_util::{BodyExt, Empty, Full, StreamBody};
    use redlock_tower::idempotency::IdempotentBody;
    use std::convert::Infallible;

    let servers = Servers::start().await;
    let handler = tower::service_fn(|_: Request| async {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", http::HeaderValue::from_static("1"));
        let frames = [
            Ok::<_, Infallible>(http_body::Frame::data(Bytes::from("ab"))),
            Ok(http_body::Frame::trailers(trailers)),
        ];
        let body = StreamBody::new(futures_util::stream::iter(frames));
        Ok::<_, Infallible>(http::Response::new(body))
    });
    let service = tower::ServiceBuilder::new()
        .layer(servers.layer().await)
        .service(handler);
    let response = service.oneshot(request(Some("trailers-1"), "x")).await;
    let collected = response.unwrap().into_body().collect().await.unwrap();
    let checksum = collected
        .trailers()
        .and_then(|t| t.get("x-checksum"))
        .cloned();
    assert_eq!(
        (checksum.unwrap(), collected.to_bytes()),
        ("1".parse().unwrap(), "ab".into())
    );

    let full: IdempotentBody<Empty<Bytes>> = IdempotentBody::full(Bytes::from("abc"));
    assert_eq!(
        (full.size_hint().exact(), full.is_end_stream()),
        (Some(3), false)
    );
    assert_eq!(full.collect().await.unwrap().to_bytes(), "abc");
    let empty: IdempotentBody<Empty<Bytes>> = IdempotentBody::full(Bytes::new());
    assert_eq!(
        (empty.size_hint().exact(), empty.is_end_stream()),
        (Some(0), true)
    );
    let prefixed = IdempotentBody::with_prefix(Bytes::from("ab"), Full::new(Bytes::from("cd")));
    assert_eq!(prefixed.size_hint().exact(), Some(4));
    assert_eq!(prefixed.collect().await.unwrap().to_bytes(), "abcd");
    let inner = IdempotentBody::new(Full::new(Bytes::from("xyz")));
    assert_eq!(inner.size_hint().exact(), Some(3));
    assert_eq!(inner.collect().await.unwrap().to_bytes(), "xyz");
}

//! Idempotent requests across replicas of both web frameworks: two axum replicas
//! (`redlock_tower::IdempotencyLayer`) and two actix-web replicas
//! (`redlock_actix::IdempotencyMiddleware`), each with its own lock client and store connection,
//! over one lock cluster and one data Redis. A key's request runs once whichever replica
//! gets it; its retries get the stored bytes; a replica that dies mid-request lets a
//! retry run once on another, and the dead run's late fenced write is refused. The
//! records in Redis, and in SQL (a SQLite file).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use redlock_core::Redlock;
use redlock_fence::{FenceError, RedisFence};
use redlock_idempotency::Store;
use redlock_idempotency::store::{RedisStore, SqlStore};
use redlock_testkit::Cluster;

const TTL: Duration = Duration::from_millis(1500);

/// The handler's work: count the run in the data Redis (a counter outside every
/// replica), take a while, answer with a body unique to the run.
async fn work(data_url: String, key: String) -> (u64, String) {
    let client = redis::Client::open(data_url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let run: u64 = redis::cmd("INCR")
        .arg(format!("runs:{key}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let nonce: u64 = rand::random();
    (run, format!(r#"{{"refund":"{nonce:016x}","run":{run}}}"#))
}

/// Where the replicas keep their records: each replica opens its own connection.
#[derive(Clone)]
enum Records {
    Redis(String),
    Sqlite(String),
}

impl Records {
    async fn open(&self) -> Arc<dyn Store> {
        match self {
            Self::Redis(url) => Arc::new(RedisStore::open(url).await.unwrap()),
            Self::Sqlite(url) => {
                let store = SqlStore::connect(url).await.unwrap();
                store.migrate().await.unwrap();
                Arc::new(store)
            }
        }
    }
}

fn client(cluster: &Cluster) -> Redlock {
    redlock_testkit::builder(cluster).ttl(TTL).build().unwrap()
}

/// An axum replica on this runtime: its base URL.
async fn axum_replica(cluster: &Cluster, data_url: &str, records: &Records) -> String {
    let store = records.open().await;
    let data = data_url.to_owned();
    let app = Router::new().route(
        "/refunds",
        post(move |headers: http::HeaderMap| {
            let data = data.clone();
            async move {
                let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                let (run, body) = work(data, key).await;
                (
                    http::StatusCode::CREATED,
                    [
                        ("content-type", "application/json".to_owned()),
                        ("x-run", run.to_string()),
                    ],
                    body,
                )
            }
        })
        .route_layer(
            redlock_tower::IdempotencyLayer::new(redlock_idempotency::Idempotency::with_store(
                client(cluster),
                store,
            ))
            .scope_header("x-tenant-id"),
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

/// An actix-web replica in a thread of its own (its own actix system): its base URL.
fn actix_replica(cluster: &Cluster, data_url: &str, records: &Records) -> String {
    let redlock = client(cluster);
    let data_url = data_url.to_owned();
    let records = records.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let store = records.open().await;
            let idempotency = redlock_actix::IdempotencyMiddleware::new(
                redlock_idempotency::Idempotency::with_store(redlock, store),
            )
            .scope_header("x-tenant-id");
            let server = actix_web::HttpServer::new(move || {
                let data = data_url.clone();
                actix_web::App::new().service(
                    actix_web::web::resource("/refunds")
                        .wrap(idempotency.clone())
                        .route(actix_web::web::post().to(
                            move |request: actix_web::HttpRequest| {
                                let data = data.clone();
                                async move {
                                    let key = request
                                        .headers()
                                        .get("idempotency-key")
                                        .unwrap()
                                        .to_str()
                                        .unwrap()
                                        .to_owned();
                                    // The handler's work on a tokio runtime of its own
                                    // making is not needed: actix runs on tokio.
                                    let (run, body) = work(data, key).await;
                                    actix_web::HttpResponse::Created()
                                        .content_type("application/json")
                                        .insert_header(("x-run", run.to_string()))
                                        .body(body)
                                }
                            },
                        )),
                )
            })
            .workers(2)
            .disable_signals()
            .bind(("127.0.0.1", 0))
            .unwrap();
            tx.send(format!("http://{}", server.addrs()[0])).unwrap();
            server.run().await.unwrap();
        });
    });
    rx.recv_timeout(Duration::from_secs(20)).unwrap()
}

struct Answer {
    status: u16,
    replayed: bool,
    retry_after: bool,
    content_type: String,
    body: bytes::Bytes,
}

async fn send(http: &reqwest::Client, base: &str, key: &str, tenant: &str) -> Answer {
    let response = http
        .post(format!("{base}/refunds"))
        .header("idempotency-key", key)
        .header("x-tenant-id", tenant)
        .header("content-type", "application/json")
        .body(r#"{"order":42}"#)
        .send()
        .await
        .unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    Answer {
        status: response.status().as_u16(),
        replayed: header("idempotent-replayed").as_deref() == Some("true"),
        retry_after: header("retry-after").is_some(),
        content_type: header("content-type").unwrap_or_default(),
        body: response.bytes().await.unwrap(),
    }
}

async fn runs(data: &Cluster, key: &str) -> u64 {
    let count: Option<u64> = data
        .node(0)
        .query(redis::cmd("GET").arg(format!("runs:{key}")))
        .await
        .expect("the data Redis answers");
    count.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_runs_once_across_axum_and_actix_replicas() {
    let data = Cluster::start(1).await;
    let records = Records::Redis(data.urls()[0].clone());
    runs_once_across_replicas(&data, &records).await;
}

/// The same over records in SQL: one SQLite file, a connection pool per replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_runs_once_across_axum_and_actix_replicas_with_sql_records() {
    let data = Cluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("records.db").display()
    );
    // Created once before the replicas start (each would migrate it again).
    SqlStore::connect(&url)
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
    runs_once_across_replicas(&data, &Records::Sqlite(url)).await;
}

/// Two axum and two actix replicas over one lock cluster and `records`; the handlers
/// count their runs in `data`.
async fn runs_once_across_replicas(data: &Cluster, records: &Records) {
    let cluster = Cluster::start(3).await;
    let data_url = data.urls()[0].clone();
    let mut bases = vec![
        axum_replica(&cluster, &data_url, records).await,
        axum_replica(&cluster, &data_url, records).await,
    ];
    bases.push(actix_replica(&cluster, &data_url, records));
    bases.push(actix_replica(&cluster, &data_url, records));
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let key = format!("refund-{}", std::process::id());

    // 100 requests with the same key at once, spread over the four replicas. A 503 says
    // that the lock nodes did not answer in time (a loaded machine): the client sends
    // the request again, as its Retry-After says, a bounded number of times.
    let requests = (0..100).map(|i| {
        let http = http.clone();
        let base = bases[i % 4].clone();
        let key = key.clone();
        async move {
            let mut answer = send(&http, &base, &key, "tenant-1").await;
            for _ in 0..20 {
                if answer.status != 503 || !answer.retry_after {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                answer = send(&http, &base, &key, "tenant-1").await;
            }
            answer
        }
    });
    let answers = futures_util::future::join_all(requests).await;
    assert_eq!(runs(data, &key).await, 1, "the handler ran more than once");

    let created: Vec<&Answer> = answers.iter().filter(|a| a.status == 201).collect();
    let conflicts = answers.iter().filter(|a| a.status == 409).count();
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    assert_eq!(
        created.len() + conflicts,
        100,
        "every answer is the response or a 409: {statuses:?}"
    );
    for conflict in answers.iter().filter(|a| a.status == 409) {
        assert!(conflict.retry_after, "a 409 without Retry-After");
        assert_eq!(conflict.content_type, "application/problem+json");
    }
    let first: Vec<&&Answer> = created.iter().filter(|a| !a.replayed).collect();
    assert_eq!(first.len(), 1, "exactly one answer is the run's own");
    let stored = first[0].body.clone();
    for answer in &created {
        assert_eq!(answer.body, stored, "a replay differs from the response");
        assert_eq!(answer.content_type, "application/json");
    }

    // Afterwards, every replica replays the same bytes, and nothing runs again.
    for base in &bases {
        let answer = send(&http, base, &key, "tenant-1").await;
        assert_eq!((answer.status, answer.replayed), (201, true), "{base}");
        assert_eq!(answer.body, stored, "{base}");
    }
    // Another tenant with the same key runs its own request, and sees its own answer.
    let other = send(&http, &bases[3], &key, "tenant-2").await;
    assert_eq!((other.status, other.replayed), (201, false));
    assert_ne!(other.body, stored);
    assert_eq!(runs(data, &key).await, 2);
}

/// A replica's runtime dropped mid-handler: no release, no extension. The retry on
/// another replica waits out the lock's TTL (409 meanwhile), then runs once; the dead
/// run's fenced write, made after the takeover, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_dying_mid_request_lets_one_retry_run_and_fences_the_dead_run() {
    let cluster = Cluster::start(3).await;
    let data = Cluster::start(1).await;
    let data_url = data.urls()[0].clone();
    let runs = Arc::new(AtomicUsize::new(0));
    let dead_token: Arc<Mutex<Option<u64>>> = Arc::default();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started_tx = Arc::new(Mutex::new(Some(started_tx)));

    // Replica A, on a runtime of its own: its handler takes its token, then hangs.
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let a_base =
        {
            let runs = runs.clone();
            let dead_token = dead_token.clone();
            let redlock = client(&cluster);
            let data_url = data_url.clone();
            doomed
                .spawn(async move {
                    let store = RedisStore::open(&data_url).await.unwrap();
                    let app = Router::new().route(
                    "/refunds",
                    post(move |redlock_tower::FencingToken(token): redlock_tower::FencingToken| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        *dead_token.lock().unwrap() = Some(token);
                        if let Some(tx) = started_tx.lock().unwrap().take() {
                            let _ = tx.send(());
                        }
                        async move {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            "never"
                        }
                    })
                    .route_layer(redlock_tower::IdempotencyLayer::new(
                        redlock_idempotency::Idempotency::new(redlock, store),
                    )),
                );
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                    let base = format!("http://{}", listener.local_addr().unwrap());
                    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
                    base
                })
                .await
                .unwrap()
        };

    // Replica B: its handler writes through the fence with its token, then answers.
    let fence = RedisFence::new();
    let b_base = {
        let runs = runs.clone();
        let store = RedisStore::open(&data_url).await.unwrap();
        let data_url = data_url.clone();
        let fence = fence.clone();
        let app = Router::new().route(
            "/refunds",
            post(
                move |redlock_tower::FencingToken(token): redlock_tower::FencingToken| {
                    let data_url = data_url.clone();
                    let fence = fence.clone();
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    async move {
                        let client = redis::Client::open(data_url).unwrap();
                        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                        fence
                            .set(
                                &mut conn,
                                "refund:order-42",
                                token,
                                "refund:order-42:by",
                                "B",
                                None,
                            )
                            .await
                            .unwrap();
                        (
                            http::StatusCode::CREATED,
                            format!("refunded by B, run {run}"),
                        )
                    }
                },
            )
            .route_layer(redlock_tower::IdempotencyLayer::new(
                redlock_idempotency::Idempotency::new(client(&cluster), store),
            )),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        base
    };

    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let first = {
        let http = http.clone();
        let a_base = a_base.clone();
        tokio::spawn(async move { send(&http, &a_base, "k-1", "").await.status })
    };
    tokio::time::timeout(Duration::from_secs(10), started_rx)
        .await
        .unwrap()
        .unwrap();
    // A dies mid-handler: its tasks (the request, the watchdog) are gone at once.
    doomed.shutdown_background();
    let _ = first.await; // the connection was cut: no answer

    // Retries on B: 409 while A's lock lives out its TTL, then one run.
    let started = std::time::Instant::now();
    let answer = loop {
        let answer = send(&http, &b_base, "k-1", "").await;
        if answer.status != 409 {
            break answer;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the dead replica's lock never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((answer.status, answer.replayed), (201, false));
    assert_eq!(&answer.body[..], b"refunded by B, run 2");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // Retries from then on replay B's run.
    let again = send(&http, &b_base, "k-1", "").await;
    assert_eq!((again.status, again.replayed), (201, true));
    assert_eq!(again.body, answer.body);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // The dead run's write, had it come late (a paused process, a queued request), is
    // refused by the fence: B's token is higher.
    let token_a = dead_token.lock().unwrap().unwrap();
    let client = redis::Client::open(data_url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    match fence
        .set(
            &mut conn,
            "refund:order-42",
            token_a,
            "refund:order-42:by",
            "A",
            None,
        )
        .await
    {
        Err(FenceError::Stale { token, highest, .. }) => assert!(highest > token),
        other => panic!("the dead run's write was not refused: {other:?}"),
    }
    let by: String = redis::cmd("GET")
        .arg("refund:order-42:by")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(by, "B");
}

//! The layer as a plain tower service (no HTTP server): options, rejections, the body
//! guard, against real redis-server nodes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use redlock_core::{LockHandle, Redlock};
use redlock_http::Problem;
use redlock_testkit::Cluster;
use redlock_tower::LockOptions;
use redlock_tower::RefusalKind;
use redlock_tower::extract::{Global, Key, PathPrefix, from_fn};
use redlock_tower::{Hold, LockBody, LockLayer, body::LockLost};
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};

fn redlock(cluster: &Cluster) -> Redlock {
    redlock_testkit::builder(cluster)
        .node_timeout(Duration::from_millis(50))
        .ttl(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Answers with the lock's resource (or "none").
async fn echo(request: Request<()>) -> Result<Response<String>, Infallible> {
    let lock = request.extensions().get::<LockHandle>();
    Ok(Response::new(
        lock.map_or("none".to_owned(), |l| l.resource().to_owned()),
    ))
}

fn get(path: &str) -> Request<()> {
    Request::get(path).body(()).unwrap()
}

async fn text<B>(response: Response<LockBody<B>>) -> String
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<redlock_core::BoxError>,
{
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// A body made without a lock (a request that needed none) is the inner body as it is;
/// a refusal's is one frame.
#[tokio::test]
async fn bodies_without_a_lock() {
    let body = LockBody::unlocked(http_body_util::Full::new(Bytes::from("hello")));
    assert!(!body.holds_lock() && !body.is_rejection());
    assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
    let refusal = LockBody::<http_body_util::Empty<Bytes>>::full("no");
    assert!(refusal.is_rejection());
    assert_eq!(refusal.collect().await.unwrap().to_bytes(), "no");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_status_and_rejection_hook() {
    let cluster = Cluster::start(3).await;
    let redlock = redlock(&cluster);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let layer = LockLayer::new(redlock.clone(), Global::new("import"))
        .options(
            LockOptions::new()
                .resource_prefix("job:")
                .busy_status(StatusCode::LOCKED),
        )
        .on_refusal(move |rejection| {
            log.lock().unwrap().push((
                rejection.kind,
                rejection.resource().map(str::to_owned),
                rejection.error().is_some(),
                rejection.problem.retry_after,
            ));
            let mut response = redlock_tower::response::problem_response(&rejection.problem);
            response
                .headers_mut()
                .insert("x-hook", "1".parse().unwrap());
            response
        });
    let service = layer.layer(service_fn(echo));
    let held = redlock.lock("job:import").await.unwrap();
    let response = service.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::LOCKED);
    assert_eq!(response.headers()["x-hook"], "1");
    assert!(response.headers().contains_key("retry-after"));
    assert!(response.body().is_rejection());
    assert!(text(response).await.contains(r#""status":423"#));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let (kind, key, with_error, retry_after) = &seen[0];
    assert_eq!(*kind, RefusalKind::Busy);
    assert_eq!(key.as_deref(), Some("job:import"));
    assert!(with_error);
    // The holder's remaining TTL (5 s here), as the nodes reported it.
    let retry_after = retry_after.unwrap();
    assert!(retry_after > Duration::from_secs(3) && retry_after <= Duration::from_secs(5));
    held.release().await.unwrap();
    assert_eq!(
        text(service.oneshot(get("/")).await.unwrap()).await,
        "job:import"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_body_holds_the_lock_until_it_ends_unless_hold_until_head() {
    let cluster = Cluster::start(3).await;
    let redlock = redlock(&cluster);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let rx = Arc::new(tokio::sync::Mutex::new(Some(rx)));
    let streaming = service_fn(move |_request: Request<()>| {
        let rx = Arc::clone(&rx);
        async move {
            let rx = rx.lock().await.take().unwrap();
            let frames = futures_util::stream::unfold(rx, |mut rx| async move {
                let chunk = rx.recv().await?;
                Some((Ok::<_, Infallible>(http_body::Frame::data(chunk)), rx))
            });
            Ok::<_, Infallible>(Response::new(StreamBody::new(Box::pin(frames))))
        }
    });
    let service = LockLayer::new(redlock.clone(), Global::new("stream")).layer(streaming);
    let response = service.oneshot(get("/")).await.unwrap();
    assert!(response.body().holds_lock());
    // The handler is done; the body is not: the key is still locked.
    assert!(redlock.try_lock("stream").await.is_err());
    tx.send(Bytes::from("a")).await.unwrap();
    drop(tx);
    let mut body = response.into_body();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "a");
    assert!(body.holds_lock());
    assert!(body.frame().await.is_none()); // the end: released
    assert!(!body.holds_lock());
    let again = redlock.lock("stream").await.unwrap(); // released in the background
    again.release().await.unwrap();

    // Hold::UntilHead: released as soon as the response is ready.
    let head = LockLayer::new(redlock.clone(), Global::new("head"))
        .options(LockOptions::new().hold(Hold::UntilHead))
        .layer(service_fn(echo));
    let response = head.oneshot(get("/")).await.unwrap();
    assert!(!response.body().holds_lock());
    let free = redlock.lock("head").await.unwrap(); // while the body is unread
    free.release().await.unwrap();
    assert_eq!(text(response).await, "head");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inner_errors_pass_through_and_release_the_lock() {
    #[derive(Debug, PartialEq)]
    struct Oops;
    let cluster = Cluster::start(3).await;
    let redlock = redlock(&cluster);
    let failing = service_fn(|_: Request<()>| async { Err::<Response<String>, _>(Oops) });
    let service = LockLayer::new(redlock.clone(), Global::new("err")).layer(failing);
    assert_eq!(service.oneshot(get("/")).await.unwrap_err(), Oops);
    let lock = redlock.lock("err").await.unwrap();
    lock.release().await.unwrap();
}

/// `poll_ready` is the inner service's; `call` uses the instance that was ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_ready_is_forwarded() {
    #[derive(Clone)]
    struct NotReady(Arc<AtomicUsize>);
    impl Service<Request<()>> for NotReady {
        type Response = Response<String>;
        type Error = &'static str;
        type Future = Ready<Result<Response<String>, &'static str>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Poll::Ready(Err("overloaded"))
        }
        fn call(&mut self, _: Request<()>) -> Self::Future {
            ready(Ok(Response::new(String::new())))
        }
    }
    let cluster = Cluster::start(1).await;
    let polls = Arc::new(AtomicUsize::new(0));
    let mut service =
        LockLayer::new(redlock(&cluster), Global::new("x")).layer(NotReady(Arc::clone(&polls)));
    let ready = std::future::poll_fn(|cx| service.poll_ready(cx)).await;
    assert_eq!(ready.unwrap_err(), "overloaded");
    assert_eq!(polls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_nodes_fail_closed_or_open() {
    // Nothing listens on these ports: every connection is refused at once.
    let redlock = redlock_testkit::builder_for([
        "redis://127.0.0.1:1",
        "redis://127.0.0.1:2",
        "redis://127.0.0.1:3",
    ])
    .node_timeout(Duration::from_millis(100))
    .build()
    .unwrap();
    let closed = LockLayer::new(redlock.clone(), Global::new("g")).layer(service_fn(echo));
    let started = Instant::now();
    let response = closed.oneshot(get("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(text(response).await.contains("urn:redlock:unavailable"));

    let open = LockLayer::new(redlock, Global::new("g"))
        .options(LockOptions::new().fail_open(true))
        .layer(service_fn(echo));
    let response = open.oneshot(get("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(text(response).await, "none"); // served, without a lock
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_and_bad_configuration() {
    let cluster = Cluster::start(1).await;
    let redlock = redlock(&cluster);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = {
        let calls = Arc::clone(&calls);
        service_fn(move |r: Request<()>| {
            calls.fetch_add(1, Ordering::SeqCst);
            echo(r)
        })
    };
    // A closure naming an empty key: 400, the service is not called.
    let empty = LockLayer::new(redlock.clone(), |_: &Request<()>| {
        Ok::<_, redlock_tower::extract::BadKey>(Some(String::new()))
    })
    .layer(counted.clone());
    let response = empty.oneshot(get("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    // An extractor's own rejection, any status.
    let teapot = from_fn(|_: &Request<()>| {
        let mut p = Problem::bad_key("no".into());
        p.status = 418;
        Key::Reject(p)
    });
    let response = LockLayer::new(redlock.clone(), teapot)
        .layer(counted.clone())
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::IM_A_TEAPOT);
    // A TTL the client refuses (not above the drift allowance): 500, not a panic.
    let response = LockLayer::new(redlock.clone(), Global::new("g"))
        .options(LockOptions::new().ttl(Duration::from_millis(1)))
        .layer(counted.clone())
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(text(response).await.contains("urn:redlock:misconfigured"));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // Paths outside the prefix pass through unlocked.
    let service = ServiceBuilder::new()
        .layer(
            LockLayer::new(redlock, PathPrefix::new("/orders"))
                .options(LockOptions::new().resource_prefix("p:")),
        )
        .service(counted);
    let response = service.clone().oneshot(get("/health")).await.unwrap();
    assert_eq!(text(response).await, "none");
    let response = service.oneshot(get("/orders/9/pay")).await.unwrap();
    assert_eq!(text(response).await, "p:/orders/9");
}

/// `max_hold` bounds the hold: the lock is no longer extended, lapses, and the handler
/// is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_ends_the_lock() {
    let cluster = Cluster::start(3).await;
    let redlock = redlock(&cluster);
    let ttl = Duration::from_millis(300);
    let long = service_fn(|request: Request<()>| async move {
        let lock = request.extensions().get::<LockHandle>().cloned().unwrap();
        let started = Instant::now();
        tokio::select! {
            () = lock.lost() => {}
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        Ok::<_, Infallible>(Response::new(format!("{}", started.elapsed().as_millis())))
    });
    let service = LockLayer::new(redlock, Global::new("bounded"))
        .options(
            LockOptions::new()
                .ttl(ttl)
                .max_hold(Duration::from_millis(600)),
        )
        .layer(long);
    let ms: u64 = text(service.oneshot(get("/")).await.unwrap())
        .await
        .parse()
        .unwrap();
    // Extended until 600 ms, then lapses within one TTL.
    assert!((500..=1500).contains(&ms), "lost after {ms} ms");
}

/// With `abort_on_loss`, a body still streaming when the lock is lost ends with
/// `LockLost` instead of completing without the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_on_loss_cuts_a_streaming_body_off() {
    let cluster = Cluster::start(3).await;
    let redlock = redlock(&cluster);
    let ttl = Duration::from_millis(400);
    let endless = service_fn(|_: Request<()>| async {
        let ticks = futures_util::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Some((
                Ok::<_, Infallible>(http_body::Frame::data(Bytes::from("."))),
                (),
            ))
        });
        Ok::<_, Infallible>(Response::new(StreamBody::new(Box::pin(ticks))))
    });
    let service = LockLayer::new(redlock, Global::new("cut"))
        .options(LockOptions::new().ttl(ttl).abort_on_loss(true))
        .layer(endless);
    let mut body = service.oneshot(get("/")).await.unwrap().into_body();
    body.frame().await.unwrap().unwrap();
    cluster.node(0).pause();
    cluster.node(1).pause();
    let paused = Instant::now();
    let error = loop {
        match tokio::time::timeout(Duration::from_secs(3), body.frame()).await {
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(error))) => break error,
            other => panic!("the body went on or ended cleanly: {other:?}"),
        }
    };
    let after = paused.elapsed();
    cluster.node(0).resume();
    cluster.node(1).resume();
    assert!(error.downcast_ref::<LockLost>().is_some(), "{error}");
    assert!(after < ttl * 3, "cut off after {after:?}");
    assert!(body.frame().await.is_none());
}

//! One contract for both web crates: the same requests sent to an actix-web server
//! (`LockMiddleware`, the `DistributedLock` extractor, `ClusterLimitMiddleware`) and to
//! an axum server (redlock-tower's `LockLayer`, `ClusterLimitLayer`) over the same
//! redis-server nodes lock the same keys on the nodes and get the same status, headers
//! and body. (Idempotency's: `examples/tests/idempotency.rs`.)
//!
//! It lives with redlock-actix, whose tests take redlock-tower and axum as
//! dev-dependencies; redlock-tower's own tests stay free of actix.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};
use redlock_actix::LockOptions;
use redlock_actix::{
    ClusterLimitMiddleware, DistributedLock, DistributedLockConfig, LimitOptions, LockMiddleware,
};
use redlock_core::Redlock;
use redlock_testkit::Cluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PREFIX: &str = "parity:";

/// The lock keys (not fencing counters) on each node, one line per node: what the
/// handlers answer while they hold their lock. An acquisition returns once a majority
/// granted it, so the last node's `SET` may still be in flight: the nodes are read
/// again (for up to 2 s) until they all hold the same keys.
async fn lock_keys(cluster: &Cluster) -> String {
    let mut lines = Vec::new();
    for _ in 0..400 {
        let per_node: Vec<Vec<String>> = cluster
            .keys("redlock:{parity:*")
            .await
            .into_iter()
            .map(|keys| {
                let mut keys: Vec<String> = keys
                    .into_iter()
                    .filter(|k| !k.ends_with(":fence") && !k.ends_with(":size"))
                    .collect();
                keys.sort();
                keys
            })
            .collect();
        lines = per_node
            .iter()
            .enumerate()
            .map(|(i, keys)| format!("node {i}: {}", keys.join(" ")))
            .collect();
        if per_node.windows(2).all(|pair| pair[0] == pair[1]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    lines.join("\n")
}

/// Waits until no lock of a previous request is left on the nodes (a lock is released
/// in the background once its response has been sent).
async fn settle(cluster: &Cluster) {
    for _ in 0..2000 {
        let keys = cluster.keys("redlock:{parity:*").await;
        if keys
            .iter()
            .flatten()
            .all(|k| k.ends_with(":fence") || k.ends_with(":size"))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("locks left on the nodes: {:?}", cluster.keys("*").await);
}

fn client(cluster: &Cluster) -> Redlock {
    redlock_testkit::builder(cluster)
        .node_timeout(Duration::from_millis(250))
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// The axum server: redlock-tower's layer on each route.
async fn start_axum(redlock: Redlock, cluster: Arc<Cluster>) -> SocketAddr {
    use axum::Router;
    use axum::routing::post;
    use redlock_tower::extract::{Header, PathParam};
    use redlock_tower::{ClusterLimitLayer, FencingToken, LimitOptions, LockLayer};

    fn with<E>(redlock: &Redlock, extractor: E, options: LockOptions) -> LockLayer<E> {
        LockLayer::new(redlock.clone(), extractor).options(options)
    }
    let options = LockOptions::new().resource_prefix(PREFIX);
    let layer = |extractor, options| with(&redlock, extractor, options);
    let header = with(
        &redlock,
        Header::new("idempotency-key").required(),
        options.clone(),
    );
    let show = |cluster: Arc<Cluster>| {
        move || {
            let cluster = Arc::clone(&cluster);
            async move { lock_keys(&cluster).await }
        }
    };
    let limit = ClusterLimitLayer::new(
        redlock.clone(),
        Header::new("x-tenant").required(),
        LimitOptions::new(1).resource_prefix(PREFIX),
    );
    let app = Router::new()
        .route("/h", post(show(Arc::clone(&cluster))).route_layer(header))
        .route(
            "/o/{id}",
            post(show(Arc::clone(&cluster)))
                .route_layer(layer(PathParam::new("id"), options.clone())),
        )
        .route(
            "/e/{id}",
            post(show(Arc::clone(&cluster)))
                .route_layer(layer(PathParam::new("id"), options.clone())),
        )
        .route(
            "/f/{id}",
            post(|FencingToken(token): FencingToken| async move {
                ([("fencing-token", token.to_string())], "fenced")
            })
            .route_layer(layer(PathParam::new("id"), options.clone().fencing(true))),
        )
        .route(
            "/nolock",
            post(|FencingToken(token): FencingToken| async move { token.to_string() }),
        )
        // Options beyond the defaults, set alike on both servers.
        .route(
            "/open/{id}",
            post(
                |lock: Option<axum::Extension<redlock_core::LockHandle>>| async move {
                    if lock.is_some() { "locked" } else { "unlocked" }
                },
            )
            .route_layer(layer(
                PathParam::new("id"),
                options
                    .clone()
                    .fail_open(true)
                    .busy_status(axum::http::StatusCode::LOCKED),
            )),
        )
        .route(
            "/fo/{id}",
            post(|FencingToken(token): FencingToken| async move { token.to_string() }).route_layer(
                layer(
                    PathParam::new("id"),
                    options.clone().fencing(true).fail_open(true),
                ),
            ),
        )
        .route("/l", post(show(Arc::clone(&cluster))).route_layer(limit));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// The actix server: the middleware on scopes, the extractor on `/e/{id}`.
fn start_actix(
    redlock: Redlock,
    cluster: Arc<Cluster>,
) -> (SocketAddr, actix_web::dev::ServerHandle) {
    use redlock_actix::FencingToken;
    use redlock_actix::extract::Header;

    async fn show(cluster: web::Data<Arc<Cluster>>) -> HttpResponse {
        HttpResponse::Ok()
            .content_type("text/plain; charset=utf-8")
            .body(lock_keys(&cluster).await)
    }
    async fn extracted(
        _lock: DistributedLock<web::Path<String>>,
        cluster: web::Data<Arc<Cluster>>,
    ) -> HttpResponse {
        show(cluster).await
    }
    async fn open(lock: Option<web::ReqData<redlock_core::LockHandle>>) -> HttpResponse {
        HttpResponse::Ok()
            .content_type("text/plain; charset=utf-8")
            .body(if lock.is_some() { "locked" } else { "unlocked" })
    }
    async fn fenced(token: FencingToken) -> HttpResponse {
        HttpResponse::Ok()
            .content_type("text/plain; charset=utf-8")
            .insert_header(("fencing-token", token.0.to_string()))
            .body("fenced")
    }

    let options = LockOptions::new().resource_prefix(PREFIX);
    let config = DistributedLockConfig::new(redlock.clone()).options(options.clone());
    let with = move |options: LockOptions| config.clone().options(options);
    let server = HttpServer::new(move || {
        let fenced_options = options.clone().fencing(true);
        let limit = ClusterLimitMiddleware::new(
            redlock.clone(),
            Header::new("x-tenant").required(),
            LimitOptions::new(1).resource_prefix(PREFIX),
        );
        App::new()
            .app_data(with(options.clone()))
            .app_data(web::Data::new(Arc::clone(&cluster)))
            .service(
                web::scope("/h")
                    .wrap(LockMiddleware::new(
                        with(options.clone()),
                        Header::new("idempotency-key").required(),
                    ))
                    .route("", web::post().to(show)),
            )
            .service(
                web::scope("/o/{id}")
                    .wrap(LockMiddleware::path_param(with(options.clone()), "id"))
                    .route("", web::post().to(show)),
            )
            .route("/e/{id}", web::post().to(extracted))
            .service(
                web::scope("/f/{id}")
                    .app_data(with(fenced_options.clone()))
                    .wrap(LockMiddleware::path_param(
                        with(fenced_options.clone()),
                        "id",
                    ))
                    .route("", web::post().to(fenced)),
            )
            .route("/nolock", web::post().to(fenced))
            .service(
                web::scope("/open/{id}")
                    .wrap(LockMiddleware::path_param(
                        with(
                            options
                                .clone()
                                .fail_open(true)
                                .busy_status(actix_web::http::StatusCode::LOCKED),
                        ),
                        "id",
                    ))
                    .route("", web::post().to(open)),
            )
            .service(
                web::scope("/fo/{id}")
                    .app_data(with(fenced_options.clone().fail_open(true)))
                    .wrap(LockMiddleware::path_param(
                        with(fenced_options.clone().fail_open(true)),
                        "id",
                    ))
                    .route("", web::post().to(fenced)),
            )
            .service(web::scope("/l").wrap(limit).route("", web::post().to(show)))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    (addr, handle)
}

/// A response, as the parity checks compare it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reply {
    status: u16,
    content_type: Option<String>,
    retry_after: Option<u64>,
    fencing_token: Option<u64>,
    body: String,
}

/// One HTTP/1.1 request on a fresh connection, written byte for byte (repeated and
/// non-ASCII headers included), and its response.
async fn send(addr: SocketAddr, path: &str, headers: &[(&str, &[u8])]) -> Reply {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: parity\r\ncontent-length: 0\r\nconnection: close\r\n"
    )
    .into_bytes();
    for (name, value) in headers {
        request.extend_from_slice(name.as_bytes());
        request.extend_from_slice(b": ");
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"\r\n");
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(&request).await.unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        raw
    };
    let raw = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .expect("no response within 30 s");
    parse(&raw)
}

fn parse(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut body = raw[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let mut reply = Reply {
        status,
        content_type: None,
        retry_after: None,
        fencing_token: None,
        body: String::new(),
    };
    let mut chunked = false;
    for line in lines {
        let (name, value) = line.split_once(':').unwrap();
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-type" => reply.content_type = Some(value.to_owned()),
            "retry-after" => reply.retry_after = Some(value.parse().unwrap()),
            "fencing-token" => reply.fencing_token = Some(value.parse().unwrap()),
            "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
            _ => {}
        }
    }
    if chunked {
        let mut decoded = Vec::new();
        let mut rest = &body[..];
        loop {
            let end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size = usize::from_str_radix(std::str::from_utf8(&rest[..end]).unwrap().trim(), 16)
                .unwrap();
            if size == 0 {
                break;
            }
            decoded.extend_from_slice(&rest[end + 2..end + 2 + size]);
            rest = &rest[end + 2 + size + 2..];
        }
        body = decoded;
    }
    reply.body = String::from_utf8(body).unwrap();
    reply
}

/// Sends one request to both servers and checks that they answer alike; returns the
/// (equal) reply.
async fn both(
    servers: (SocketAddr, SocketAddr),
    cluster: &Cluster,
    path: &str,
    headers: &[(&str, &[u8])],
) -> Reply {
    let tower = send(servers.0, path, headers).await;
    settle(cluster).await;
    let actix = send(servers.1, path, headers).await;
    settle(cluster).await;
    assert_eq!(
        tower, actix,
        "{path} {headers:?}: tower (left) and actix (right) differ"
    );
    tower
}

#[actix_rt::test]
async fn tower_and_actix_lock_the_same_keys_and_answer_alike() {
    let cluster = Arc::new(Cluster::start_proxied(3).await);
    let tower = start_axum(client(&cluster), Arc::clone(&cluster)).await;
    let (actix, handle) = start_actix(client(&cluster), Arc::clone(&cluster));
    let servers = (tower, actix);
    let on_every_node = |key: &str| {
        (0..3)
            .map(|i| format!("node {i}: redlock:{{{PREFIX}{key}}}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let problem = Some("application/problem+json".to_owned());

    // Header keys: the trimmed value, `%` and `:` escaped, locked on every node. Node 0
    // answers 30 ms late, so a lock is granted before its `SET` lands there.
    cluster.proxy(0).delay(Duration::from_millis(30));
    for (value, key) in [
        (&b"k-1"[..], "k-1"),
        (b" a:b ", "a%3Ab"),
        (b"100%", "100%25"),
        (b"a%3Ab", "a%253Ab"),
    ] {
        let reply = both(servers, &cluster, "/h", &[("Idempotency-Key", value)]).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.body, on_every_node(key), "{value:?}");
    }
    cluster.proxy(0).restore();
    // Unusable headers: missing, repeated, empty, not ASCII: 400 problems, alike.
    let missing = both(servers, &cluster, "/h", &[]).await;
    assert_eq!((missing.status, &missing.content_type), (400, &problem));
    assert!(missing.body.contains("idempotency-key"), "{missing:?}");
    for headers in [
        &[("idempotency-key", &b"a"[..]), ("idempotency-key", b"b")][..],
        &[("idempotency-key", b"   ")],
        &[("idempotency-key", "café".as_bytes())],
    ] {
        let reply = both(servers, &cluster, "/h", headers).await;
        assert_eq!(
            (reply.status, &reply.content_type),
            (400, &problem),
            "{headers:?}"
        );
    }

    // Path parameters: percent-decoded, then escaped; the middleware and the extractor
    // alike.
    for (segment, key) in [
        ("42", "42"),
        ("a:b", "a%3Ab"),
        ("a%3Ab", "a%3Ab"),
        ("100%25", "100%25"),
        ("%E2%82%AC", "€"),
        ("caf%C3%A9", "café"),
    ] {
        for route in ["/o/", "/e/"] {
            let reply = both(servers, &cluster, &format!("{route}{segment}"), &[]).await;
            assert_eq!(reply.status, 200, "{route}{segment}: {reply:?}");
            assert_eq!(reply.body, on_every_node(key), "{route}{segment}");
        }
    }
    let not_utf8 = both(servers, &cluster, "/o/%FF", &[]).await;
    assert_eq!((not_utf8.status, &not_utf8.content_type), (400, &problem));

    // Busy: another client holds the lock. 409, Retry-After the holder's remaining
    // validity (the two answers may straddle a second), the same problem body.
    let holder = client(&cluster);
    let held = holder
        .lock(format!("{PREFIX}busy"))
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    let id = [
        ("idempotency-key", &b"busy"[..]),
        ("x-request-id", b"req-42"),
    ];
    let tower_busy = send(servers.0, "/h", &id).await;
    let actix_busy = send(servers.1, "/h", &id).await;
    for reply in [&tower_busy, &actix_busy] {
        assert_eq!(
            (reply.status, &reply.content_type),
            (409, &problem),
            "{reply:?}"
        );
        let after = reply.retry_after.unwrap();
        assert!((1..=30).contains(&after), "{reply:?}");
        assert!(reply.body.contains(r#""request_id":"req-42""#), "{reply:?}");
    }
    let (a, b) = (
        tower_busy.retry_after.unwrap(),
        actix_busy.retry_after.unwrap(),
    );
    assert!(a.abs_diff(b) <= 1, "Retry-After {a} and {b}");
    let normalize = |reply: &Reply| {
        let after = reply.retry_after.unwrap();
        reply
            .body
            .replace(&format!(r#""retry_after":{after}"#), r#""retry_after":N"#)
    };
    assert_eq!(normalize(&tower_busy), normalize(&actix_busy));
    held.release().await.unwrap();
    settle(&cluster).await;
    // `busy_status`, set alike: 423 instead of 409.
    let held = holder
        .lock(format!("{PREFIX}b"))
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    let tower_locked = send(servers.0, "/open/b", &[]).await;
    let actix_locked = send(servers.1, "/open/b", &[]).await;
    assert_eq!((tower_locked.status, actix_locked.status), (423, 423));
    assert_eq!(normalize(&tower_locked), normalize(&actix_locked));
    held.release().await.unwrap();
    settle(&cluster).await;
    let open = both(servers, &cluster, "/open/b", &[]).await;
    assert_eq!(open.body, "locked");

    // The cluster-wide limit (one permit per tenant): the same slot key on the nodes, the
    // same 400 without a tenant, the same 429 while another client holds the permit.
    let limited = both(servers, &cluster, "/l", &[("x-tenant", b"a:b")]).await;
    assert_eq!(limited.status, 200, "{limited:?}");
    // The permit's slot lock, on every node (the same key from both, by `both`).
    assert_eq!(limited.body.lines().count(), 3, "{limited:?}");
    assert!(
        limited
            .body
            .lines()
            .all(|line| line.contains("{parity:a%3Ab/permit")),
        "{limited:?}"
    );
    let no_tenant = both(servers, &cluster, "/l", &[]).await;
    assert_eq!((no_tenant.status, &no_tenant.content_type), (400, &problem));
    let permits = holder.semaphore(format!("{PREFIX}full"), 1).unwrap();
    let permit = permits.acquire().await.unwrap();
    let tower_full = send(servers.0, "/l", &[("x-tenant", b"full")]).await;
    let actix_full = send(servers.1, "/l", &[("x-tenant", b"full")]).await;
    assert_eq!((tower_full.status, actix_full.status), (429, 429));
    assert_eq!(normalize(&tower_full), normalize(&actix_full));
    permit.release().await.unwrap();
    settle(&cluster).await;

    // Fencing tokens: a header from the handler, strictly greater for each new holder.
    let tower_fenced = send(servers.0, "/f/7", &[]).await;
    settle(&cluster).await;
    let actix_fenced = send(servers.1, "/f/7", &[]).await;
    settle(&cluster).await;
    assert_eq!((tower_fenced.status, actix_fenced.status), (200, 200));
    let (first, second) = (
        tower_fenced.fencing_token.unwrap(),
        actix_fenced.fencing_token.unwrap(),
    );
    assert!(second > first, "tokens {first} then {second}");
    assert_eq!(
        Reply {
            fencing_token: None,
            ..tower_fenced
        },
        Reply {
            fencing_token: None,
            ..actix_fenced
        }
    );
    // A handler asking for a token where no lock is taken: the same 500 problem.
    let no_lock = both(servers, &cluster, "/nolock", &[("x-request-id", b"req-7")]).await;
    assert_eq!((no_lock.status, &no_lock.content_type), (500, &problem));
    assert!(
        no_lock.body.contains(r#""request_id":"req-7""#),
        "{no_lock:?}"
    );

    // No quorum: two of three nodes cut off. 503, Retry-After: 1, the same body.
    cluster.proxy(1).cut();
    cluster.proxy(2).cut();
    let down = both(servers, &cluster, "/h", &[("idempotency-key", b"down")]).await;
    assert_eq!(
        (down.status, &down.content_type),
        (503, &problem),
        "{down:?}"
    );
    assert_eq!(down.retry_after, Some(1));
    let down = both(servers, &cluster, "/o/down", &[]).await;
    assert_eq!(down.status, 503, "{down:?}");
    // `fail_open`, set alike: served without a lock; a handler that needs the lock's
    // fencing token is answered 503 instead.
    let open = both(servers, &cluster, "/open/down", &[]).await;
    assert_eq!((open.status, open.body.as_str()), (200, "unlocked"));
    let fenced = both(servers, &cluster, "/fo/down", &[]).await;
    assert_eq!(
        (fenced.status, &fenced.content_type),
        (503, &problem),
        "{fenced:?}"
    );
    assert_eq!(fenced.retry_after, Some(1));
    cluster.proxy(1).restore();
    cluster.proxy(2).restore();

    handle.stop(true).await;
}

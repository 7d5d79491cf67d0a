//! What the actix integration tests share: servers on loopback ports, an HTTP client,
//! one lock client per replica, and the handlers they route to.

#![allow(dead_code, unused_imports, unreachable_pub)] // each test file uses some of it

pub use std::sync::Arc;
pub use std::time::{Duration, Instant};

pub use actix_web::body::BodyStream;
pub use actix_web::dev::{ServerHandle, ServiceRequest};
pub use actix_web::{App, HttpResponse, HttpServer, test as actix_test, web};
pub use redlock_actix::extract::Header;
pub use redlock_actix::{
    DistributedLock, DistributedLockConfig, LockMiddleware,
    key::{BadKey, LockHeader, LockHeaderName},
};
pub use redlock_core::{LockHandle, Redlock};
pub use redlock_testkit::Cluster;
pub use redlock_testkit::Intervals;

/// An actix-web server on a free loopback port, running in the test's actix system.
pub struct Server {
    pub base: String,
    pub handle: ServerHandle,
}

impl Server {
    pub async fn start<F>(workers: usize, configure: F) -> Self
    where
        F: Fn(&mut web::ServiceConfig) + Send + Clone + 'static,
    {
        let server = HttpServer::new(move || App::new().configure(configure.clone()))
            .workers(workers)
            .disable_signals()
            .shutdown_timeout(1)
            .bind(("127.0.0.1", 0))
            .unwrap();
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Self {
            base: format!("http://{addr}"),
            handle,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn stop(self) {
        self.handle.stop(true).await;
    }
}

/// What a request got.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub retry_after: Option<u64>,
    pub content_type: String,
    pub body: String,
    /// When the whole reply had arrived.
    pub at: Instant,
}

impl Reply {
    pub fn is_problem(&self, status: u16) -> bool {
        self.status == status
            && self.content_type == "application/problem+json"
            && self.body.contains(&format!("\"status\":{status}"))
    }
}

pub fn http() -> awc::Client {
    awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish()
}

pub async fn send(client: &awc::Client, method: &str, url: String) -> Reply {
    let request = match method {
        "POST" => client.post(url),
        _ => client.get(url),
    };
    let mut response = request.send().await.expect("send");
    let text = |name| {
        response
            .headers()
            .get(name)
            .map(|v: &actix_web::http::header::HeaderValue| v.to_str().unwrap().to_owned())
    };
    let retry_after = text("retry-after").map(|v| v.parse().unwrap());
    let content_type = text("content-type").unwrap_or_default();
    let status = response.status().as_u16();
    let body = response.body().limit(1 << 20).await.expect("body");
    Reply {
        status,
        retry_after,
        content_type,
        body: String::from_utf8_lossy(&body).into_owned(),
        at: Instant::now(),
    }
}

pub async fn get(client: &awc::Client, url: String) -> Reply {
    send(client, "GET", url).await
}

/// Runs `f` for every item at once (on this thread) and collects the replies.
pub async fn all<I, F, Fut>(items: I, f: F) -> Vec<Reply>
where
    I: IntoIterator,
    F: Fn(I::Item) -> Fut,
    Fut: std::future::Future<Output = Reply>,
{
    futures_util::future::join_all(items.into_iter().map(f)).await
}

pub fn redlock(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    redlock_testkit::client(cluster, node_timeout)
}

#[derive(serde::Deserialize)]
pub struct Ms {
    pub ms: u64,
}

/// Which server a reply came from.
#[derive(Clone, Copy)]
pub struct Instance(pub usize);

/// Holds the order's lock for `ms`, recording the interval.
pub async fn hold(
    order: DistributedLock<web::Path<String>>,
    ms: web::Query<Ms>,
    log: web::Data<Intervals>,
    instance: web::Data<Instance>,
) -> HttpResponse {
    let start = Instant::now();
    actix_rt::time::sleep(Duration::from_millis(ms.ms)).await;
    let held = order.guard().is_held();
    let end = Instant::now();
    log.record(start, end, instance.0);
    HttpResponse::Ok().body(format!(
        "{} held={held} on {}",
        order.guard().resource(),
        std::thread::current().name().unwrap_or("?")
    ))
}

/// Runs for `ms`, checking every 20 ms that the lock is still held.
pub async fn long(order: DistributedLock<web::Path<String>>, ms: web::Query<Ms>) -> HttpResponse {
    let started = Instant::now();
    let mut checks = 0;
    while started.elapsed() < Duration::from_millis(ms.ms) {
        if !order.guard().is_held() {
            return HttpResponse::Ok().body(format!("lost after {:?}", started.elapsed()));
        }
        checks += 1;
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    HttpResponse::Ok().body(format!(
        "held throughout: {checks} checks, validity left {:?}",
        order.guard().validity()
    ))
}

/// Waits (up to 10 s) for the lock to be lost, and says what the guard shows then.
pub async fn until_lost(order: DistributedLock<web::Path<String>>) -> HttpResponse {
    let lost = tokio::time::timeout(Duration::from_secs(10), order.guard().lost())
        .await
        .is_ok();
    HttpResponse::Ok().body(format!(
        "lost={lost} held={} token_cancelled={}",
        order.guard().is_held(),
        order.guard().cancellation_token().is_cancelled()
    ))
}

/// The resource the middleware locked.
pub async fn handle_resource(lock: web::ReqData<LockHandle>) -> HttpResponse {
    HttpResponse::Ok().body(lock.resource().to_owned())
}

/// The resource the extractor locked.
pub async fn resource(order: DistributedLock<web::Path<String>>) -> HttpResponse {
    HttpResponse::Ok().body(order.guard().resource().to_owned())
}

pub fn holding_routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/orders/{id}/hold", web::post().to(hold))
        .route("/orders/{id}/long", web::post().to(long))
        .route("/orders/{id}/until-lost", web::post().to(until_lost));
}

/// A server with the hold routes, `config`, `log`, and `instance`.
pub async fn holding_server(
    workers: usize,
    config: DistributedLockConfig,
    log: &Arc<Intervals>,
    instance: usize,
) -> Server {
    let log = web::Data::from(Arc::clone(log));
    Server::start(workers, move |cfg| {
        cfg.app_data(config.clone())
            .app_data(log.clone())
            .app_data(web::Data::new(Instance(instance)))
            .configure(holding_routes);
    })
    .await
}

pub async fn post(client: &awc::Client, url: String) -> Reply {
    send(client, "POST", url).await
}

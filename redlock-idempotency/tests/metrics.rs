//! The metrics, as a Prometheus scrape renders them: requests by outcome and the bytes
//! stored, counted by real decisions over a lock cluster and a data Redis. A test binary
//! of its own: the recorder is the process's global one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use bytes::Bytes;
use metrics_exporter_prometheus::PrometheusBuilder;
use redlock_idempotency::store::RedisStore;
use redlock_idempotency::{Begin, Fingerprint, Idempotency};
use redlock_testkit::Cluster;
use redlock_testkit::metrics::sample;

fn fp(body: &str) -> Fingerprint {
    Fingerprint::builder("POST", "/refunds")
        .body(body.as_bytes())
        .finish()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_and_stored_bytes_are_counted() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).unwrap();

    let cluster = Cluster::start(1).await;
    let data = Cluster::start(1).await;
    let store = RedisStore::open(&data.urls()[0]).await.unwrap();
    let idempotency = Idempotency::new(redlock_testkit::builder(&cluster).build().unwrap(), store)
        .required(false)
        .max_body(4);
    let key = |k: &str| idempotency.key([k.as_bytes()]).unwrap().unwrap();

    // No key (optional): passed through.
    assert!(idempotency.key([]).unwrap().is_none());
    // A first run, stored (3 bytes); its retry replayed; the same key for another body:
    // a mismatch; while it runs, a conflict.
    let k = key("k-1");
    let Begin::Run(run) = idempotency.begin(None, &k, fp("a")).await.unwrap() else {
        panic!()
    };
    assert!(idempotency.begin(None, &k, fp("a")).await.is_err()); // in flight: conflict
    run.finish(200, vec![], Some(Bytes::from_static(b"abc")))
        .await;
    assert!(matches!(
        idempotency.begin(None, &k, fp("a")).await,
        Ok(Begin::Replay(_))
    ));
    assert!(idempotency.begin(None, &k, fp("b")).await.is_err()); // mismatch
    // A 5xx and a body over max_body: not stored.
    for (n, status, body) in [(2, 503, &b"x"[..]), (3, 200, &b"too large"[..])] {
        let Begin::Run(run) = idempotency
            .begin(None, &key(&format!("k-{n}")), fp("a"))
            .await
            .unwrap()
        else {
            panic!()
        };
        run.finish(status, vec![], Some(Bytes::copy_from_slice(body)))
            .await;
    }
    // A key that is not visible ASCII: rejected.
    assert!(idempotency.key([&b"caf\xc3\xa9"[..]]).is_err());

    let page = handle.render();
    let count = |outcome: &str| {
        sample(
            &page,
            "redlock_idempotency_requests_total",
            &format!("outcome=\"{outcome}\""),
        )
    };
    assert_eq!(count("no_key"), Some(1.0), "{page}");
    assert_eq!(count("first_run"), Some(1.0), "{page}");
    assert_eq!(count("replayed"), Some(1.0), "{page}");
    assert_eq!(count("conflict"), Some(1.0), "{page}");
    assert_eq!(count("mismatch"), Some(1.0), "{page}");
    assert_eq!(count("not_stored"), Some(2.0), "{page}");
    assert_eq!(count("rejected"), Some(1.0), "{page}");
    assert_eq!(
        sample(&page, "redlock_idempotency_stored_bytes_total", ""),
        Some(3.0),
        "{page}"
    );
}

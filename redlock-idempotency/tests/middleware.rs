//! The middleware's flow as the web crates drive it, over a real lock cluster and a real
//! store: a request's head admitted or refused, its body read within its bound, the
//! decision, the handler's response read and stored, the replay marked.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use redlock_idempotency::middleware::{Admit, Decision, Reading, RequestHead};
use redlock_idempotency::store::RedisStore;
use redlock_idempotency::{Finished, Idempotency, REPLAYED_HEADER, RefusalKind};
use redlock_testkit::Cluster;

type Headers<'a> = [(&'a str, &'a [u8])];

/// The first step of a request with these headers.
fn admit(core: &Idempotency, headers: &Headers<'_>, scope: Option<Option<&str>>) -> Admit {
    let lookup = |name: &str| {
        let values = headers.iter().filter(|(n, _)| *n == name);
        values.map(|(_, v)| *v).collect()
    };
    let head = RequestHead::new("POST", "/v1/refunds?page=2", lookup);
    core.admit(&head, scope.map(|s| move || s.map(str::to_owned)))
}

fn read(admitted: Admit) -> Reading {
    match admitted {
        Admit::Read(reading) => reading,
        other => panic!("the body is read: {other:?}"),
    }
}

fn refused(admitted: Admit) -> (u16, Option<String>) {
    match admitted {
        Admit::Refuse(refusal) => (refusal.problem.status, refusal.problem.request_id),
        other => panic!("refused: {other:?}"),
    }
}

#[tokio::test]
async fn a_request_through_the_flow() {
    let (cluster, data) = (Cluster::start(1).await, Cluster::start(1).await);
    let redlock = redlock_testkit::builder(&cluster).build().unwrap();
    let store = RedisStore::open(&data.urls()[0]).await.unwrap();
    let core = Idempotency::new(redlock, store)
        .max_request_body(8)
        .max_body(4);
    let key = format!("k-{}", std::process::id());
    let id = ("x-request-id", &b"req-1"[..]);
    let keyed = [("idempotency-key", key.as_bytes()), id];

    // Without a key: 400 naming the request's id, or through where keys are optional.
    assert_eq!(
        refused(admit(&core, &[id], None)),
        (400, Some("req-1".into()))
    );
    let optional = core.clone().required(false);
    assert!(matches!(admit(&optional, &[id], None), Admit::PassThrough));
    // A scope hook that names none: 400; a body announced too large: 413.
    assert_eq!(refused(admit(&core, &keyed, Some(None))).0, 400);
    let announced = [keyed[0], ("content-length", &b"9"[..])];
    assert_eq!(refused(admit(&core, &announced, None)).0, 413);
    // A body read past the bound: 413, with the request's id.
    let mut reading = read(admit(&core, &keyed, Some(Some("t"))));
    reading.push(b"12345").unwrap();
    let over = reading.push(b"6789").unwrap_err();
    assert_eq!(
        (over.problem.status, over.problem.request_id.as_deref()),
        (413, Some("req-1"))
    );

    // The first request runs; its response is read and stored.
    let mut reading = read(admit(&core, &keyed, Some(Some("t"))));
    reading.push(b"body").unwrap();
    let (body, decision) = reading.finish();
    assert_eq!(body, "body");
    let Decision::Run(run) = decision.await else {
        panic!("the first request runs");
    };
    let headers = [
        ("Content-Type", &b"text/plain"[..]),
        (REPLAYED_HEADER, b"no"),
    ];
    let mut collect = run.respond(201, headers, None);
    assert!(collect.push(b"ok") && collect.wants());
    let (sent, write) = collect.finish();
    assert_eq!((sent, write.await), ("ok".into(), Finished::Stored));

    // Its retry is replayed, marked once; another body under the key: 422.
    let mut retry = read(admit(&core, &keyed, Some(Some("t"))));
    retry.push(b"body").unwrap();
    let (_, decision) = retry.finish();
    let Decision::Replay(replay) = decision.await else {
        panic!("the retry is replayed");
    };
    let marker = (REPLAYED_HEADER.to_owned(), "true".into());
    let stored = ("content-type".to_owned(), "text/plain".into());
    assert_eq!(
        (replay.status, replay.headers, replay.body),
        (201, vec![stored, marker], "ok".into())
    );
    let mut other = read(admit(&core, &keyed, Some(Some("t"))));
    other.push(b"other").unwrap();
    let Decision::Refuse(refusal) = other.finish().1.await else {
        panic!("another request under the key is refused");
    };
    assert_eq!(
        (refusal.kind, refusal.problem.request_id),
        (RefusalKind::Mismatch, Some("req-1".into()))
    );

    // A response larger than `max_body`: what was read is sent, nothing stored; a
    // response announced larger is not read at all.
    let elsewhere = read(admit(&core, &keyed, Some(Some("u"))));
    let Decision::Run(run) = elsewhere.finish().1.await else {
        panic!("another scope runs");
    };
    let mut collect = run.respond(200, [], None);
    assert!(!collect.push(b"12345") && !collect.wants());
    let (sent, write) = collect.finish();
    assert_eq!((sent, write.await), ("12345".into(), Finished::TooLarge));
    let third = read(admit(&core, &keyed, Some(Some("v"))));
    let Decision::Run(run) = third.finish().1.await else {
        panic!("a third scope runs");
    };
    let collect = run.respond(200, [], Some(5));
    assert!(!collect.wants());
    assert_eq!(collect.finish().1.await, Finished::TooLarge);
}

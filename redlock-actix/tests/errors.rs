//! A refusal's answer without a server (status, `Retry-After`, problem body), and the
//! keys of the provided [`LockKey`] values.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use actix_web::ResponseError;
use actix_web::body::MessageBody;
use actix_web::http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use actix_web::web;
use redlock_actix::LockKey;
use redlock_actix::error::DistributedLockError;
use redlock_actix::key::BadKey;

fn parts(err: &DistributedLockError) -> (u16, Option<String>, String, String) {
    let response = err.error_response();
    let header = |name| {
        response
            .headers()
            .get(name)
            .map(|v: &HeaderValue| v.to_str().unwrap_or_default().to_owned())
    };
    let (retry_after, content_type) = (header(RETRY_AFTER), header(CONTENT_TYPE));
    let status = response.status().as_u16();
    let body = response.into_body().try_into_bytes().unwrap_or_default();
    (
        status,
        retry_after,
        content_type.unwrap_or_default(),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[test]
fn busy_is_409_with_the_holders_remaining_time() {
    let err = DistributedLockError::from(redlock_core::Error::Taken {
        resource: "order:42".into(),
        nodes: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
        total: 3,
        attempts: 1,
        retry_after: Some(Duration::from_millis(1200)),
    });
    assert!(matches!(err, DistributedLockError::Busy(_)));
    let (status, retry_after, content_type, body) = parts(&err);
    assert_eq!(status, 409);
    assert_eq!(retry_after.as_deref(), Some("2"));
    assert_eq!(content_type, "application/problem+json");
    assert!(body.contains(r#""status":409"#), "{body}");
    assert!(!body.contains("order:42"), "{body}");
    assert!(!body.contains("127.0.0.1"), "{body}");
}

#[test]
fn no_quorum_is_503_with_a_retry_after() {
    let err = DistributedLockError::from(redlock_core::Error::NoQuorum {
        resource: "order:42".into(),
        needed: 2,
        total: 3,
        failures: Vec::new(),
    });
    assert!(matches!(err, DistributedLockError::Unavailable(_)));
    let (status, retry_after, _, body) = parts(&err);
    assert_eq!(status, 503);
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(body.contains(r#""status":503"#), "{body}");
}

#[test]
fn missing_config_is_500_with_a_generic_body() {
    let (status, retry_after, content_type, body) = parts(&DistributedLockError::MissingConfig);
    assert_eq!(status, 500);
    assert_eq!(retry_after, None);
    assert_eq!(content_type, "application/problem+json");
    assert!(!body.contains("DistributedLockConfig"), "{body}");
    assert!(
        DistributedLockError::MissingConfig
            .to_string()
            .contains("DistributedLockConfig")
    );
}

#[test]
fn bad_key_is_400() {
    let (status, retry_after, _, body) = parts(&DistributedLockError::BadKey(BadKey::new(
        "the id is empty",
    )));
    assert_eq!(status, 400);
    assert_eq!(retry_after, None);
    assert!(body.contains("the id is empty"), "{body}");
}

#[test]
fn strings_are_escaped_so_tuples_stay_unambiguous() {
    assert_eq!("order-42".lock_key().unwrap(), "order-42");
    assert_eq!("a:b".lock_key().unwrap(), "a%3Ab");
    assert_eq!("100%".lock_key().unwrap(), "100%25");
    assert_ne!(
        ("a:b", "c").lock_key().unwrap(),
        ("a", "b:c").lock_key().unwrap()
    );
    assert_eq!(("a:b", "c").lock_key().unwrap(), "a%3Ab:c");
}

#[test]
fn integers_and_tuples() {
    assert_eq!(42u64.lock_key().unwrap(), "42");
    assert_eq!((-7i32).lock_key().unwrap(), "-7");
    assert_eq!((1u8, 2u16, "x".to_owned()).lock_key().unwrap(), "1:2:x");
    assert_eq!((5usize,).lock_key().unwrap(), "5");
}

#[test]
fn empty_strings_are_bad_keys_also_inside_tuples() {
    assert!(String::new().lock_key().is_err());
    assert!((1u8, "").lock_key().is_err());
}

#[test]
fn extractors_forward_to_their_value() {
    let path = web::Path::from((String::from("tenant"), 9u32));
    assert_eq!(path.lock_key().unwrap(), "tenant:9");
    let query = web::Query(String::from("q"));
    assert_eq!(query.lock_key().unwrap(), "q");
}

//! [`LockKey`]: how an extracted value names the resource to lock.

use std::borrow::Cow;
use std::future::{Ready, ready};
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, web};

use crate::config::DistributedLockConfig;
pub use redlock_http::key::BadKey;

use crate::error::DistributedLockError;

/// A value that names a lock: the key an extracted value (a path, a query, a header…)
/// is locked by. The lock's resource is the configured
/// [`resource_prefix`](crate::LockOptions::resource_prefix) followed by this key.
///
/// Provided for strings (`%` and `:` percent-encoded by [`redlock_http::key::lock_key`], the
/// rule `redlock-tower` follows too, so the key of a string never contains `:`), integers (decimal), tuples of keys (joined by `:`), and the actix
/// extractors that wrap such a value: [`web::Path`], [`web::Query`], [`web::Json`],
/// [`web::Form`], [`web::Header`], [`web::ReqData`], plus [`LockHeader`] for a raw
/// header. An empty string is a [`BadKey`] (400).
///
/// For a type of your own, derive the key from its fields; no derive macro needed:
///
/// ```
/// use redlock_actix::{LockKey, key::BadKey};
///
/// #[derive(serde::Deserialize)]
/// struct Transfer { from: u64, to: u64 }
///
/// impl LockKey for Transfer {
///     fn lock_key(&self) -> Result<String, BadKey> {
///         (self.from, self.to).lock_key() // "7:9"
///     }
/// }
///
/// assert_eq!(Transfer { from: 7, to: 9 }.lock_key().unwrap(), "7:9");
/// assert_eq!(("a:b", 3u8).lock_key().unwrap(), "a%3Ab:3");
/// assert_eq!("6f1c0d2e-8b4a-4f4e-9a57-2d6c3c1b7e10".lock_key().unwrap(),
///            "6f1c0d2e-8b4a-4f4e-9a57-2d6c3c1b7e10");
/// assert!("".lock_key().is_err());
/// ```
///
/// Keep `:` out of the key of a type that is to be part of a tuple (the provided string
/// key never has one), so that different tuples never name the same lock.
pub trait LockKey {
    /// The key, or why the request names no usable one (answered with 400).
    ///
    /// # Errors
    ///
    /// [`BadKey`] when the value cannot name a lock (e.g. it is empty).
    fn lock_key(&self) -> Result<String, BadKey>;
}

/// The key of a string: [`redlock_http::key::lock_key`], the rule of both web crates.
fn escape(s: &str) -> Result<String, BadKey> {
    redlock_http::key::lock_key(s)
}

impl LockKey for str {
    fn lock_key(&self) -> Result<String, BadKey> {
        escape(self)
    }
}

impl LockKey for String {
    fn lock_key(&self) -> Result<String, BadKey> {
        escape(self)
    }
}

impl LockKey for Cow<'_, str> {
    fn lock_key(&self) -> Result<String, BadKey> {
        escape(self)
    }
}

impl<T: LockKey + ?Sized> LockKey for &T {
    fn lock_key(&self) -> Result<String, BadKey> {
        (**self).lock_key()
    }
}

impl<T: LockKey + ?Sized> LockKey for Box<T> {
    fn lock_key(&self) -> Result<String, BadKey> {
        (**self).lock_key()
    }
}

impl<T: LockKey + ?Sized> LockKey for Rc<T> {
    fn lock_key(&self) -> Result<String, BadKey> {
        (**self).lock_key()
    }
}

impl<T: LockKey + ?Sized> LockKey for Arc<T> {
    fn lock_key(&self) -> Result<String, BadKey> {
        (**self).lock_key()
    }
}

macro_rules! integer_keys {
    ($($t:ty),*) => {$(
        impl LockKey for $t {
            fn lock_key(&self) -> Result<String, BadKey> {
                Ok(self.to_string())
            }
        }
    )*};
}
integer_keys!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);

macro_rules! tuple_keys {
    ($(($($name:ident),+)),*) => {$(
        impl<$($name: LockKey),+> LockKey for ($($name,)+) {
            #[allow(non_snake_case)]
            fn lock_key(&self) -> Result<String, BadKey> {
                let ($($name,)+) = self;
                let parts = [$($name.lock_key()?),+];
                Ok(parts.join(&redlock_http::key::KEY_SEPARATOR.to_string()))
            }
        }
    )*};
}
tuple_keys!(
    (A),
    (A, B),
    (A, B, C),
    (A, B, C, D),
    (A, B, C, D, E),
    (A, B, C, D, E, F)
);

macro_rules! extractor_keys {
    ($($extractor:ident),*) => {$(
        impl<T: LockKey> LockKey for web::$extractor<T> {
            fn lock_key(&self) -> Result<String, BadKey> {
                (**self).lock_key()
            }
        }
    )*};
}
extractor_keys!(Path, Query, Json, Form);

impl<T: LockKey + actix_web::http::header::Header> LockKey for web::Header<T> {
    fn lock_key(&self) -> Result<String, BadKey> {
        (**self).lock_key()
    }
}

impl<T: LockKey + Clone + 'static> LockKey for web::ReqData<T> {
    fn lock_key(&self) -> Result<String, BadKey> {
        (**self).lock_key()
    }
}

/// Names the header a [`LockHeader`] reads.
///
/// ```
/// struct IdempotencyKey;
/// impl redlock_actix::key::LockHeaderName for IdempotencyKey {
///     const NAME: &'static str = "idempotency-key";
/// }
/// ```
pub trait LockHeaderName {
    /// The header's name (case-insensitive, as HTTP header names are).
    const NAME: &'static str;
}

/// An extractor for a raw header value as a lock key: `DistributedLock<LockHeader<N>>`
/// locks by the value of the header named by `N` (see [`LockHeaderName`]).
///
/// A missing, repeated, empty or not visible ASCII header is a [`BadKey`] (400,
/// `application/problem+json`, through the configuration's `on_refusal` hook when one is
/// registered): the rule of [`redlock_http::key::header_key`], as in redlock-tower.
///
/// ```
/// use actix_web::{web, App, HttpResponse};
/// use redlock_actix::{DistributedLock, key::{LockHeader, LockHeaderName}};
///
/// struct IdempotencyKey;
/// impl LockHeaderName for IdempotencyKey {
///     const NAME: &'static str = "idempotency-key";
/// }
///
/// async fn create(request: DistributedLock<LockHeader<IdempotencyKey>>) -> HttpResponse {
///     HttpResponse::Ok().body(format!("created once for {}", request.as_str()))
/// }
///
/// let app = App::new().route("/payments", web::post().to(create));
/// # let _ = app;
/// ```
pub struct LockHeader<N> {
    value: String,
    name: PhantomData<fn() -> N>,
}

impl<N> LockHeader<N> {
    /// The header's value.
    pub fn as_str(&self) -> &str {
        &self.value
    }

    /// The header's value, owned.
    pub fn into_inner(self) -> String {
        self.value
    }
}

impl<N> std::ops::Deref for LockHeader<N> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.value
    }
}

impl<N: LockHeaderName> std::fmt::Debug for LockHeader<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockHeader")
            .field("name", &N::NAME)
            .field("value", &self.value)
            .finish()
    }
}

impl<N> LockKey for LockHeader<N> {
    fn lock_key(&self) -> Result<String, BadKey> {
        escape(&self.value)
    }
}

impl<N: LockHeaderName> FromRequest for LockHeader<N> {
    type Error = actix_web::Error;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        // The rule both web crates follow; the extractor needs a key, so it is required.
        let values = req
            .headers()
            .get_all(N::NAME)
            .map(actix_web::http::header::HeaderValue::as_bytes);
        let value = match redlock_http::key::header_key(N::NAME, values, true) {
            Ok(Some(value)) => Ok(value.to_owned()),
            Ok(None) => Err(BadKey::new(format!("the `{}` header is required", N::NAME))),
            Err(bad) => Err(bad),
        };
        ready(match value {
            Ok(value) => Ok(Self {
                value,
                name: PhantomData,
            }),
            Err(bad) => {
                let err = DistributedLockError::BadKey(bad);
                Err(match DistributedLockConfig::from_req(req) {
                    Some(config) => config.reject(err, None, req),
                    None => err.respond(req),
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

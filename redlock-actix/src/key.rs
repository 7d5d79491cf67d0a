//! [`LockKey`]: how an extracted value names the resource to lock.

use std::borrow::Cow;
use std::future::{Ready, ready};
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, web};

pub use redlock_http::key::BadKey;

use crate::error::DistributedLockError;

/// A value that names a lock: the key (after the
/// [`resource_prefix`](crate::LockOptions::resource_prefix)) an extracted value locks by.
/// Provided for strings (escaped by [`redlock_http::key::lock_key`], as in
/// `redlock-tower`), integers, tuples (joined by `:`), `web::{Path, Query, Json, Form,
/// Header, ReqData}` of those and [`LockHeader`]. Keep `:` out of your own keys.
///
/// ```
/// use redlock_actix::{LockKey, key::BadKey};
///
/// struct Transfer { from: u64, to: u64 }
///
/// impl LockKey for Transfer {
///     fn lock_key(&self) -> Result<String, BadKey> {
///         (self.from, self.to).lock_key() // "7:9"
///     }
/// }
///
/// assert_eq!(("a:b", 3u8).lock_key().unwrap(), "a%3Ab:3");
/// ```
pub trait LockKey {
    /// The key, or why the request names no usable one (400).
    ///
    /// # Errors
    ///
    /// [`BadKey`] when the value cannot name a lock (e.g. it is empty).
    fn lock_key(&self) -> Result<String, BadKey>;
}

use redlock_http::key::lock_key as escape;

macro_rules! string_keys {
    ($($t:ty),*) => {$(
        impl LockKey for $t {
            fn lock_key(&self) -> Result<String, BadKey> {
                escape(self)
            }
        }
    )*};
}
string_keys!(str, String, Cow<'_, str>);

/// Wrappers whose key is their value's.
macro_rules! forward_keys {
    ($([$($bound:tt)*] $t:ty),* $(,)?) => {$(
        impl<T: LockKey $($bound)*> LockKey for $t {
            fn lock_key(&self) -> Result<String, BadKey> {
                (**self).lock_key()
            }
        }
    )*};
}
forward_keys!(
    [+ ?Sized] &T,
    [+ ?Sized] Box<T>,
    [+ ?Sized] Rc<T>,
    [+ ?Sized] Arc<T>,
    [] web::Path<T>,
    [] web::Query<T>,
    [] web::Json<T>,
    [] web::Form<T>,
    [+ actix_web::http::header::Header] web::Header<T>,
    [+ Clone + 'static] web::ReqData<T>,
);

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

/// Names the header a [`LockHeader`] reads.
pub trait LockHeaderName {
    /// The header's name (case-insensitive, as HTTP header names are).
    const NAME: &'static str;
}

/// An extractor for the value of the header named by `N` as a lock key; a missing,
/// repeated, empty or not visible ASCII header is a [`BadKey`] (400), by
/// [`redlock_http::key::header_key`].
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
            Err(bad) => Err(DistributedLockError::BadKey(bad).reject(req, None)),
        })
    }
}

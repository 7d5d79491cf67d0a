//! The value that identifies one acquisition: `<holder>/<random>`.
//!
//! The random part makes it unique, so only the holder can release or extend; the
//! holder part says who holds a lock when an operator lists them (see `inspect`). A
//! value starting with `~` is a hand-over placeholder, never a lock's value: holder
//! names cannot start with it.

use rand::RngExt;

use crate::error::ConfigError;

/// 160 bits from the thread-local CSPRNG (ChaCha, seeded and periodically reseeded from
/// the OS), hex-encoded.
pub(crate) fn random_value() -> String {
    let bytes: [u8; 20] = rng().random();
    let mut out = String::with_capacity(40);
    push_hex(&mut out, &bytes);
    out
}

/// A new lock value for `holder`: `<holder>/<160 random bits, hex>`.
pub(crate) fn lock_value(holder: &str) -> String {
    let bytes: [u8; 20] = rng().random();
    let mut out = String::with_capacity(holder.len() + 41);
    out.push_str(holder);
    out.push('/');
    push_hex(&mut out, &bytes);
    out
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    for byte in bytes {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The random source every random choice of core draws from: the thread-local CSPRNG.
#[cfg(not(any(test, feature = "sim")))]
pub(crate) fn rng() -> rand::rngs::ThreadRng {
    rand::rng()
}

/// The random source every random choice of core draws from: under unit tests (and
/// feature `sim`), the generator [`seed_rng`] set on this thread (the simulator's, one history per seed),
/// else the thread-local CSPRNG.
#[cfg(any(test, feature = "sim"))]
pub(crate) fn rng() -> TestRng {
    TestRng(rand::rng())
}

#[cfg(any(test, feature = "sim"))]
thread_local! {
    static SEEDED: std::cell::RefCell<Option<rand::rngs::StdRng>> =
        const { std::cell::RefCell::new(None) };
}

/// Seeds this thread's [`rng`] (`None`: back to the CSPRNG).
#[cfg(any(test, feature = "sim"))]
pub(crate) fn seed_rng(seed: Option<u64>) {
    use rand::SeedableRng;
    SEEDED.with_borrow_mut(|rng| *rng = seed.map(rand::rngs::StdRng::seed_from_u64));
}

/// [`rng`] under unit tests and feature `sim`: the seeded generator of this thread if any.
#[cfg(any(test, feature = "sim"))]
pub(crate) struct TestRng(rand::rngs::ThreadRng);

#[cfg(any(test, feature = "sim"))]
impl rand::TryRng for TestRng {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let seeded = SEEDED.with_borrow_mut(|rng| rng.as_mut().map(rand::Rng::next_u32));
        Ok(seeded.unwrap_or_else(|| rand::Rng::next_u32(&mut self.0)))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let seeded = SEEDED.with_borrow_mut(|rng| rng.as_mut().map(rand::Rng::next_u64));
        Ok(seeded.unwrap_or_else(|| rand::Rng::next_u64(&mut self.0)))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        let seeded = SEEDED.with_borrow_mut(|rng| {
            rng.as_mut()
                .map(|rng| rand::Rng::fill_bytes(rng, dst))
                .is_some()
        });
        if !seeded {
            rand::Rng::fill_bytes(&mut self.0, dst);
        }
        Ok(())
    }
}

/// The longest holder name, in bytes.
const MAX_HOLDER_LEN: usize = 64;

fn holder_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '@')
}

/// Checks a holder name given to the builder.
pub(crate) fn check_holder(holder: String) -> Result<String, ConfigError> {
    if holder.is_empty() || holder.len() > MAX_HOLDER_LEN || !holder.chars().all(holder_char) {
        let mut shown = holder;
        let mut end = shown.len().min(MAX_HOLDER_LEN);
        while !shown.is_char_boundary(end) {
            end -= 1;
        }
        shown.truncate(end);
        return Err(ConfigError::InvalidHolder { holder: shown });
    }
    Ok(holder)
}

/// `<host name>:<process id>`, the host name cut to what a holder name allows.
pub(crate) fn default_holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let pid = std::process::id();
    let mut name: String = host.trim().chars().filter(|c| holder_char(*c)).collect();
    name.truncate(MAX_HOLDER_LEN - 11);
    if name.is_empty() {
        name.push_str("host");
    }
    format!("{name}:{pid}")
}

/// A lock key's value without the mark waiters add to it (a trailing `+`: see
/// `protocol::scripts`): the value its holder set.
pub(crate) fn unmarked(value: &str) -> &str {
    value.strip_suffix('+').unwrap_or(value)
}

/// What a value stored in a lock key says about its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ValueInfo {
    /// The holder's name (`None` for a value of another form).
    pub(crate) holder: Option<String>,
    /// A short, stable id of the acquisition (a hash of the value, not part of it: the
    /// value itself is what lets a holder release its lock).
    pub(crate) acquisition: String,
    /// A hand-over placeholder: a release reserved the lock for a queued waiter.
    pub(crate) handed_over: bool,
}

/// Reads a lock key's value.
pub(crate) fn describe(value: &str) -> ValueInfo {
    let handed_over = value.starts_with('~');
    let holder = if handed_over {
        None
    } else {
        value
            .rsplit_once('/')
            .map(|(holder, _)| holder.to_owned())
            .filter(|h| !h.is_empty())
    };
    ValueInfo {
        holder,
        acquisition: short_id(value),
        handed_over,
    }
}

/// 32 bits of FNV-1a over `value`, hex: tells acquisitions apart in a listing.
fn short_id(value: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in value.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:08x}", (hash >> 32) ^ (hash & 0xffff_ffff))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waiters_mark_is_not_part_of_the_value() {
        let value = lock_value("orders-api-7");
        assert_eq!(unmarked(&format!("{value}+")), value);
        assert_eq!(unmarked(&value), value);
        assert_eq!(
            describe(unmarked(&format!("{value}+"))),
            describe(&value),
            "one acquisition, marked or not"
        );
    }

    #[test]
    fn values_are_long_hex_and_distinct() {
        let a = random_value();
        let b = random_value();
        assert_eq!(a.len(), 40);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn lock_values_name_their_holder() {
        let a = lock_value("orders-api-7");
        let b = lock_value("orders-api-7");
        assert_ne!(a, b);
        let info = describe(&a);
        assert_eq!(info.holder.as_deref(), Some("orders-api-7"));
        assert!(!info.handed_over);
        assert_eq!(info.acquisition.len(), 8);
        assert!(
            !a.contains(&info.acquisition),
            "a hash, not a piece of the value"
        );
        assert_ne!(info.acquisition, describe(&b).acquisition);
        let placeholder = describe("~abcdef.0123:500");
        assert!(placeholder.handed_over && placeholder.holder.is_none());
        assert_eq!(describe(&random_value()).holder, None);
    }

    #[test]
    fn holder_names_are_checked() {
        assert!(check_holder("api-7.eu@host:1_x".into()).is_ok());
        for bad in ["", "~x", "a b", "a/b", &"x".repeat(65), "é"] {
            assert!(
                matches!(
                    check_holder(bad.to_owned()),
                    Err(ConfigError::InvalidHolder { .. })
                ),
                "{bad:?}"
            );
        }
        let default = default_holder();
        assert!(check_holder(default.clone()).is_ok(), "{default}");
        assert!(default.ends_with(&format!(":{}", std::process::id())));
    }
}

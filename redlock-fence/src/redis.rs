//! [`RedisFence`]: fenced writes to a data Redis, each checked and applied by one script.

use std::sync::LazyLock;
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::{Script, ScriptInvocation, ToSingleRedisArg};
use redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN;
use redlock_core::check_resource_name;

use crate::FenceError;

/// The prefix of fence keys unless told otherwise: the fence key of `resource` is
/// `fence:<resource>`.
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub const DEFAULT_FENCE_PREFIX: &str = "fence:";

/// Compares, writes and raises in one go. Tokens are compared as decimal strings (a
/// shorter one is smaller; of equal length, digit by digit), because Lua numbers are
/// doubles and lose `u64`s above 2^53. The write comes before the raise: a write Redis
/// rejects (an invalid TTL) aborts the script before anything changed.
const SCRIPT_SOURCE: &str = r"
-- KEYS[1]: the fence key; KEYS[2]: the data key (set, del).
-- ARGV[1]: the token (decimal); ARGV[2]: 'check', 'set' or 'del';
-- ARGV[3]: the value (set); ARGV[4]: the TTL in milliseconds, or '' (set).
-- Answers {1, token, deleted} when admitted, {0, highest} when stale,
-- {2, stored} when the fence key holds no token.
local MAX = '18446744073709551615'
local function less(a, b)
  if #a ~= #b then return #a < #b end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return false
end
local function is_token(s)
  return (s == '0' or string.find(s, '^[1-9][0-9]*$') ~= nil) and not less(MAX, s)
end
local token = ARGV[1]
if not is_token(token) then
  return redis.error_reply('ERR not a fencing token: ' .. token)
end
local stored = redis.call('GET', KEYS[1])
if stored then
  if not is_token(stored) then return {2, stored, 0} end
  if less(token, stored) then return {0, stored, 0} end
end
local deleted = 0
if ARGV[2] == 'set' then
  if ARGV[4] == '' then
    redis.call('SET', KEYS[2], ARGV[3])
  else
    redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
  end
elseif ARGV[2] == 'del' then
  deleted = redis.call('DEL', KEYS[2])
end
if not stored or less(stored, token) then
  redis.call('SET', KEYS[1], token)
end
return {1, token, deleted}
";

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SCRIPT_SOURCE));

/// Fenced writes to a data Redis: each compares the writer's fencing token with the
/// highest seen for the resource, applies the write and raises the stored token, in
/// one Lua script (`EVALSHA`, loading the script when the server lacks it).
///
/// The data Redis is the one the protected work writes to, not one of the lock's
/// nodes. Per resource it keeps the highest token seen in a fence key
/// (`<prefix><resource>`, [`DEFAULT_FENCE_PREFIX`] unless told otherwise), as the
/// token's decimal digits and without expiry. [`set`](Self::set) and
/// [`del`](Self::del) compare the writer's token with it, apply the write and raise the
/// fence with no other command in between; a lower token is refused with
/// [`FenceError::Stale`] and nothing is written. The same token may write any number
/// of times; once a higher one was seen, a lower one never again. Every `u64` is
/// compared exactly (as digits: Lua's numbers are doubles, which stop telling tokens
/// apart above 2^53).
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use redlock_fence::{FenceError, RedisFence};
///
/// let data = redis::Client::open("redis://127.0.0.1:6379")?;
/// let mut conn = data.get_multiplexed_async_connection().await?;
/// let fence = RedisFence::new();
///
/// // The holder of `report` with token 12 writes, to expire in a day.
/// let day = Some(Duration::from_secs(86_400));
/// fence.set(&mut conn, "report", 12, "report:latest", "v12", day).await?;
///
/// // A stale holder (token 11, paused past its lock) is refused; the value stays "v12".
/// match fence.set(&mut conn, "report", 11, "report:latest", "v11", day).await {
///     Err(FenceError::Stale { token: 11, highest: 12, .. }) => {}
///     other => panic!("expected a stale token, got {other:?}"),
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Redis Cluster
///
/// The script touches the fence key and the data key, and a cluster runs a script only
/// if all its keys are in one hash slot. Put a hash tag in the resource and the same
/// tag in the data key: resource `{account:7}`, data key `{account:7}:balance`, fence
/// key `fence:{account:7}`. Otherwise the cluster refuses the script (`CROSSSLOT`, a
/// [`FenceError::Redis`]) and nothing is written.
///
/// # Persistence
///
/// The fence is only as durable as the data Redis: run it with `appendonly yes` and
/// `appendfsync always` (`everysec` may lose the last second's raises in a crash). A
/// restart without persistence forgets the highest token along with the data; the
/// fence then admits whatever token comes first, even a stale holder's, and refuses
/// lower ones from there on. Likewise, a replica promoted after an asynchronous
/// failover may lack the latest raises.
///
/// # Resource names
///
/// Resource names follow redlock-core's rule for lock names: not empty, at most
/// [`DEFAULT_MAX_RESOURCE_LEN`] (512) bytes unless
/// [`max_resource_len`](Self::max_resource_len) says otherwise. Another name is refused
/// with [`FenceError::InvalidResource`] before anything is sent.
///
/// # Other writers
///
/// Only writes made through the fence are fenced: a client that writes the data key
/// directly bypasses it.
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[derive(Debug, Clone)]
pub struct RedisFence {
    prefix: String,
    max_resource_len: usize,
}

impl Default for RedisFence {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisFence {
    /// A fence with keys `fence:<resource>` ([`DEFAULT_FENCE_PREFIX`]).
    pub fn new() -> Self {
        Self::with_prefix(DEFAULT_FENCE_PREFIX)
    }

    /// A fence with keys `<prefix><resource>`.
    pub fn with_prefix(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            max_resource_len: DEFAULT_MAX_RESOURCE_LEN,
        }
    }

    /// The longest resource name taken, in bytes (default [`DEFAULT_MAX_RESOURCE_LEN`],
    /// 512, as redlock-core's locks): set it to the lock client's
    /// [`max_resource_len`](redlock_core::RedlockBuilder::max_resource_len) if that was
    /// raised.
    #[must_use]
    pub fn max_resource_len(mut self, max: usize) -> Self {
        self.max_resource_len = max;
        self
    }

    /// The fence key of a resource name the fence takes.
    fn checked_key(&self, resource: &str) -> Result<String, FenceError> {
        check_resource_name(resource, self.max_resource_len)
            .map_err(FenceError::InvalidResource)?;
        Ok(self.fence_key(resource))
    }

    /// The prefix of the fence keys.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The fence key of `resource`: `<prefix><resource>`.
    pub fn fence_key(&self, resource: &str) -> String {
        format!("{}{resource}", self.prefix)
    }

    /// Admits `token` for `resource` if no higher token was seen, and raises the stored
    /// token to it; writes no data.
    ///
    /// Use it to claim the resource as soon as the lock is taken, so that older
    /// holders are refused from then on, before this holder's first write. It does not
    /// protect a write sent afterwards in another command: a newer holder may raise the
    /// fence in between. Write with [`set`](Self::set) or [`del`](Self::del).
    ///
    /// # Errors
    ///
    /// [`FenceError::Stale`] when a higher token was seen; [`FenceError::NotAToken`];
    /// [`FenceError::InvalidResource`]; [`FenceError::Redis`].
    pub async fn check<C: ConnectionLike>(
        &self,
        conn: &mut C,
        resource: &str,
        token: u64,
    ) -> Result<(), FenceError> {
        let fence_key = self.checked_key(resource)?;
        let mut invocation = SCRIPT.key(&fence_key);
        invocation.arg(token.to_string()).arg("check");
        finish(conn, &invocation, resource, token, fence_key)
            .await
            .map(|_| ())
    }

    /// Sets `key` to `value` (with `PX ttl`, rounded up to whole milliseconds, when
    /// `ttl` is given) if no token higher than `token` was seen for `resource`, and
    /// raises the stored token to `token`, atomically.
    ///
    /// # Errors
    ///
    /// [`FenceError::Stale`] when a higher token was seen (nothing was written; acquire
    /// the lock again for a new token); [`FenceError::NotAToken`];
    /// [`FenceError::InvalidResource`]; [`FenceError::Redis`], also for a zero TTL
    /// (nothing was written).
    pub async fn set<C, V>(
        &self,
        conn: &mut C,
        resource: &str,
        token: u64,
        key: &str,
        value: V,
        ttl: Option<Duration>,
    ) -> Result<(), FenceError>
    where
        C: ConnectionLike,
        V: ToSingleRedisArg,
    {
        let ttl_ms = ttl.map(|ttl| ttl.as_nanos().div_ceil(1_000_000).to_string());
        let fence_key = self.checked_key(resource)?;
        let mut invocation = SCRIPT.key(&fence_key);
        invocation
            .key(key)
            .arg(token.to_string())
            .arg("set")
            .arg(value)
            .arg(ttl_ms.unwrap_or_default());
        finish(conn, &invocation, resource, token, fence_key)
            .await
            .map(|_| ())
    }

    /// Deletes `key` if no token higher than `token` was seen for `resource`, and raises
    /// the stored token to `token`, atomically; whether the key existed.
    ///
    /// # Errors
    ///
    /// [`FenceError::Stale`] when a higher token was seen (nothing was deleted);
    /// [`FenceError::NotAToken`]; [`FenceError::InvalidResource`]; [`FenceError::Redis`].
    pub async fn del<C: ConnectionLike>(
        &self,
        conn: &mut C,
        resource: &str,
        token: u64,
        key: &str,
    ) -> Result<bool, FenceError> {
        let fence_key = self.checked_key(resource)?;
        let mut invocation = SCRIPT.key(&fence_key);
        invocation.key(key).arg(token.to_string()).arg("del");
        finish(conn, &invocation, resource, token, fence_key)
            .await
            .map(|deleted| deleted > 0)
    }

    /// The highest token seen for `resource`; `None` if none was (or the data Redis
    /// forgot it).
    ///
    /// # Errors
    ///
    /// [`FenceError::NotAToken`]; [`FenceError::InvalidResource`]; [`FenceError::Redis`].
    pub async fn highest<C: ConnectionLike>(
        &self,
        conn: &mut C,
        resource: &str,
    ) -> Result<Option<u64>, FenceError> {
        let key = self.checked_key(resource)?;
        let stored: Option<Vec<u8>> = ::redis::cmd("GET").arg(&key).query_async(conn).await?;
        stored
            .map(|raw| parse_token(&raw).ok_or_else(|| not_a_token(key, &raw)))
            .transpose()
    }
}

/// Runs the script; the number of keys deleted when admitted.
async fn finish<C: ConnectionLike>(
    conn: &mut C,
    invocation: &ScriptInvocation<'_>,
    resource: &str,
    token: u64,
    fence_key: String,
) -> Result<i64, FenceError> {
    let (status, stored, deleted): (i64, Vec<u8>, i64) = invocation.invoke_async(conn).await?;
    match status {
        1 => Ok(deleted),
        0 => match parse_token(&stored) {
            Some(highest) => Err(FenceError::Stale {
                resource: resource.to_owned(),
                token,
                highest,
            }),
            None => Err(not_a_token(fence_key, &stored)),
        },
        _ => Err(not_a_token(fence_key, &stored)),
    }
}

/// The token stored as `raw`, if it is the canonical decimal form of a `u64`.
fn parse_token(raw: &[u8]) -> Option<u64> {
    let canonical =
        !raw.is_empty() && raw.iter().all(u8::is_ascii_digit) && (raw.len() == 1 || raw[0] != b'0');
    if !canonical {
        return None;
    }
    std::str::from_utf8(raw).ok()?.parse().ok()
}

fn not_a_token(key: String, raw: &[u8]) -> FenceError {
    FenceError::NotAToken {
        key,
        value: String::from_utf8_lossy(raw).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_tokens() {
        assert_eq!(parse_token(b"0"), Some(0));
        assert_eq!(parse_token(b"42"), Some(42));
        assert_eq!(parse_token(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"007",
            b"+5",
            b"-1",
            b"1.5",
            b"18446744073709551616",
        ] {
            assert_eq!(parse_token(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn keys() {
        assert_eq!(RedisFence::new().fence_key("a"), "fence:a");
        assert_eq!(RedisFence::with_prefix("f/").fence_key("{a}"), "f/{a}");
    }
}

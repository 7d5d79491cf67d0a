//! The Lua scripts run on each node.
//!
//! All of them compare the stored value with ours before touching a key, so a client can
//! only ever release or extend its own lock. Every new connection loads them first (one
//! pipelined round trip); they then run with `EVALSHA`, falling back to loading them
//! when a node answers `NOSCRIPT` (its script cache was flushed); see [`redis::Script`].

use std::sync::LazyLock;

use redis::Script;

/// Deletes every key of `KEYS` that still holds `ARGV[1]`; with `ARGV[2] == '1'` (a
/// lock's release, or the cleanup of a failed attempt that had set keys) publishes on
/// the key's channel for waiters (see `wake.rs`). Returns how many it deleted.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_SOURCE));
const RELEASE_SOURCE: &str = r"
local n = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('DEL', key)
    if ARGV[2] == '1' then
      redis.call('PUBLISH', key, '')
    end
    n = n + 1
  end
end
return n
";

/// Sets a new TTL (`ARGV[2]` ms) on all of `KEYS` if every one still holds `ARGV[1]`;
/// all or nothing. `PEXPIRE` on a missing key is a no-op, so an expired lock is never
/// re-created. Returns 1 if extended, 0 if not.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_SOURCE));
const EXTEND_SOURCE: &str = r"
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) ~= ARGV[1] then
    return 0
  end
end
for _, key in ipairs(KEYS) do
  redis.call('PEXPIRE', key, ARGV[2])
end
return 1
";

/// Sets all of `KEYS` to `ARGV[1]` with a TTL of `ARGV[2]` ms if none of them exists;
/// all or nothing on this node. Returns 1 if set, 0 if any key was taken.
pub(crate) static ACQUIRE_MANY: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_MANY_SOURCE));
const ACQUIRE_MANY_SOURCE: &str = r"
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    return 0
  end
end
for _, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
end
return 1
";

/// Fencing acquire. `KEYS` holds the lock keys, then as many counter keys. If no lock
/// key exists: increments every counter, sets every lock key to `ARGV[1]` with a TTL of
/// `ARGV[2]` ms, and returns the highest counter (a token >= 1). Otherwise changes
/// nothing and returns 0.
pub(crate) static ACQUIRE_FENCED: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_FENCED_SOURCE));
const ACQUIRE_FENCED_SOURCE: &str = r"
local n = #KEYS / 2
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    return 0
  end
end
local token = 0
for i = 1, n do
  local t = redis.call('INCR', KEYS[n + i])
  if t > token then
    token = t
  end
end
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return token
";

/// Raises every counter of `KEYS` to at least `ARGV[1]` (never lowers one). Returns 1.
pub(crate) static RAISE_FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_FENCE_SOURCE));
const RAISE_FENCE_SOURCE: &str = r"
local token = tonumber(ARGV[1])
for _, key in ipairs(KEYS) do
  local current = tonumber(redis.call('GET', key) or '0')
  if current < token then
    redis.call('SET', key, ARGV[1])
  end
end
return 1
";

/// The longest remaining TTL in ms among `KEYS` (0 when none exists).
pub(crate) static REMAINING: LazyLock<Script> = LazyLock::new(|| Script::new(REMAINING_SOURCE));
const REMAINING_SOURCE: &str = r"
local longest = 0
for _, key in ipairs(KEYS) do
  local t = redis.call('PTTL', key)
  if t > longest then
    longest = t
  end
end
return longest
";

/// Every script's source, to load on a new connection.
pub(crate) const ALL_SOURCES: [&str; 6] = [
    REMAINING_SOURCE,
    RELEASE_SOURCE,
    EXTEND_SOURCE,
    ACQUIRE_MANY_SOURCE,
    ACQUIRE_FENCED_SOURCE,
    RAISE_FENCE_SOURCE,
];

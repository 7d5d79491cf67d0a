//! The Lua scripts run on each node.
//!
//! All of them compare the stored value with ours before touching a key, so a client can
//! only ever release or extend its own lock. Every new connection loads them first (one
//! pipelined round trip); they then run with `EVALSHA`, falling back to loading them
//! when a node answers `NOSCRIPT` (its script cache was flushed); see [`redis::Script`].
//!
//! A lock key holds its holder's value, or `~<waiter>` while a release hands it over to
//! a queued waiter. A waiter that joins a key's queue while someone holds the key marks
//! the key: it appends `+` to the holder's value (keeping its TTL). So the release of an
//! unmarked key knows without looking further that nobody waits: it deletes the key and
//! is done, as cheap as a bare compare-and-delete. Everything that compares a holder's
//! value takes the value with or without the mark.

use std::sync::LazyLock;

use redis::Script;

/// Releases: for each lock key of `KEYS` (the first half; then as many wait queues; a
/// queue's deadlines are the sorted set named after it, `<queue>:until`) that still
/// holds `ARGV[1]`:
///
/// - with `ARGV[2] == '1'` or no `ARGV[2]` (a lock's release, or a waiter passing on a
///   hand-over it did not take), hands the lock over to the first live waiter of its
///   queue, or deletes it; if it had a queue (whose waiters all left or died), it also
///   publishes an empty message on the key's channel (see `wake.rs`), as it does for a
///   key marked by a waiter with no queue (a semaphore's waiter marks every slot: see
///   [`MARK`]). With no mark, nobody waits for the key on this node (every waiter
///   queues or marks), and the release is a compare-and-delete that looks at one more
///   key. A hand-over stores `~<waiter>` in
///   the key for the time the waiter's id ends with (`<random>:<ms>`; `ARGV[3]` ms if
///   none): only that waiter may take it, nobody else's SET NX succeeds; and publishes
///   the waiter's id on its client's channel (`redlock-wake:<client>`, the part of the
///   id before the `.`);
/// - with `ARGV[2] == '0'` (the cleanup of an attempt that lost), deletes it and tells
///   nobody: a lost attempt must not make anyone retry before their retry delay;
/// - with `ARGV[2] == '2'` (a follow-up to a hand-over, see `queue.rs`), touches no key
///   that holds a value: a key that is gone (its hand-over expired untaken: the heir is
///   dead) is handed over to the next live waiter, as a release would.
///
/// With `ARGV[4]` given and not empty, first removes that waiter from the queues (a
/// waiter leaving: with `ARGV[1] = '~' .. ARGV[4]` it also passes on a hand-over it did
/// not take). Returns how many keys it released (in follow-up mode, how many it found
/// gone: their heir did not take them), plus 65536 times the longest hand-over it left
/// pending (ms: one it made, or, in follow-up mode, one it found).
///
/// A lock's release, the common case, passes the value alone: every argument and every
/// key costs the node time, and the deadlines are needed only when there is a queue.
/// Such a release of one key that no waiter marked (see the module's doc), the most
/// common of all, comes first: a compare-and-delete, looking at nothing else. (A queue
/// whose waiters did not mark the key, because it was taken by someone who did not
/// queue, is then not handed the lock: its waiters take it at their next attempt,
/// which marks a key it finds held.)
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_SOURCE));
const RELEASE_SOURCE: &str = r"
if #KEYS == 2 and not ARGV[2] then
  local current = redis.call('GET', KEYS[1])
  if current == ARGV[1] then
    redis.call('DEL', KEYS[1])
    return 1
  elseif current ~= ARGV[1] .. '+' then
    return 0
  end
end
local n = #KEYS / 2
local mode = ARGV[2] or '1'
local released = 0
local pending = 0
local now = nil
local dequeue = ARGV[4]
if dequeue == '' then
  dequeue = nil
end
for i = 1, n do
  local key, queue = KEYS[i], KEYS[n + i]
  local deadlines = queue .. ':until'
  if dequeue then
    redis.call('ZREM', queue, dequeue)
    redis.call('ZREM', deadlines, dequeue)
  end
  local current = redis.call('GET', key)
  local free = false
  if mode == '2' then
    if not current then
      released = released + 1
      free = true
    elseif string.sub(current, 1, 1) == '~' then
      local left = redis.call('PTTL', key)
      if left > pending then
        pending = left
      end
    end
  elseif current == ARGV[1] or current == ARGV[1] .. '+' then
    released = released + 1
    free = true
  end
  if free then
    local heir = nil
    local queued = false
    if mode ~= '0' and redis.call('EXISTS', queue) == 1 then
      queued = true
      if now == nil then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      while heir == nil do
        local head = redis.call('ZRANGE', queue, 0, 0)[1]
        if not head then
          break
        end
        local deadline = tonumber(redis.call('ZSCORE', deadlines, head) or '0')
        redis.call('ZREM', queue, head)
        redis.call('ZREM', deadlines, head)
        if deadline > now then
          heir = head
        end
      end
    end
    if heir then
      local hold = tonumber(string.match(heir, ':(%d+)$') or ARGV[3] or '25')
      redis.call('SET', key, '~' .. heir, 'PX', hold)
      if hold > pending then
        pending = hold
      end
      local client = string.match(heir, '^(%x+)%.')
      if client then
        redis.call('PUBLISH', 'redlock-wake:' .. client, heir)
      else
        redis.call('PUBLISH', key, heir)
      end
    elseif current then
      redis.call('DEL', key)
      if mode == '1' and (queued or string.sub(current, -1) == '+') then
        redis.call('PUBLISH', key, '')
      end
    end
  end
end
return released + 65536 * pending
";

/// Lua defining `clock_floor(step)`: the node's clock in microseconds since the Unix
/// epoch (`TIME`), rounded down to a multiple of `step` µs (1 if missing). A fencing
/// token is never below it (see [`ACQUIRE_FENCED`]): a node that restarted and lost its
/// counters votes again only after the restart quarantine (the maximum TTL, twice the
/// step), so its clock has passed every token handed out before the restart by more
/// than a step, as long as the nodes' clocks agree to within a step and none steps back
/// by more. Rounding keeps the nodes of one acquisition agreeing on the token (no
/// write-back needed) unless their clocks straddle a step. Microseconds: one resource's
/// acquisitions, each a script run and a round trip, cannot outpace the clock, and the
/// values stay exact in Lua's numbers (doubles) until the year 2255.
macro_rules! clock_floor {
    () => {
        r"
local function clock_floor(step)
  if not step or step < 1 then
    step = 1
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return now - now % step
end
"
    };
}

/// Lua that puts waiter `id` (waiting `since`, a number) in the wait queues of the `n`
/// lock keys of `KEYS` (then their queues, then the queues' deadlines), its place kept
/// `keep` ms past now; the queues live at least that long. A key held by a value without
/// the waiters' mark gets it (`+` appended: see the module's doc). Shared by the scripts
/// that queue a waiter.
macro_rules! take_places {
    () => {
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, n do
  local held = redis.call('GET', KEYS[i])
  if held and string.sub(held, 1, 1) ~= '~' and string.sub(held, -1) ~= '+' then
    redis.call('APPEND', KEYS[i], '+')
  end
  redis.call('ZADD', KEYS[n + i], since, id)
  redis.call('ZADD', KEYS[2 * n + i], now + keep, id)
  for _, key in ipairs({KEYS[n + i], KEYS[2 * n + i]}) do
    if redis.call('PTTL', key) < keep then
      redis.call('PEXPIRE', key, keep)
    end
  end
end
"
    };
}

/// A queued waiter's attempt. `KEYS`: the n lock keys, then their wait queues, then the
/// queues' deadlines, then (with fencing) their counters. `ARGV`: value, TTL ms, waiter
/// id, the time it began waiting (its place in the queues), how long its places are kept
/// (ms), n. If every lock key is free or handed over to this waiter: takes them all,
/// sets every counter to the token, one above the highest of them but not below the
/// node's clock floor (`clock_floor!`, its step `ARGV[7]`; so every resource's counter
/// reaches every token issued for it, also through a multi-resource lock),
/// leaves the queues (a key whose queue still has waiters gets their mark), and returns
/// the token (1 without fencing). Otherwise joins or refreshes its places (marking the
/// keys it finds held) and returns 0.
pub(crate) static ACQUIRE_QUEUED: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_QUEUED_SOURCE));
const ACQUIRE_QUEUED_SOURCE: &str = concat!(
    clock_floor!(),
    r"
local n = tonumber(ARGV[6])
local mine = '~' .. ARGV[3]
local free = true
for i = 1, n do
  local current = redis.call('GET', KEYS[i])
  if current and current ~= mine then
    free = false
    break
  end
end
if free then
  local token = 1
  if #KEYS == 4 * n then
    local highest = 0
    for i = 1, n do
      local t = tonumber(redis.call('GET', KEYS[3 * n + i]) or '0')
      if t > highest then
        highest = t
      end
    end
    token = math.max(highest + 1, clock_floor(tonumber(ARGV[7])))
    for i = 1, n do
      redis.call('SET', KEYS[3 * n + i], string.format('%d', token))
    end
  end
  for i = 1, n do
    redis.call('ZREM', KEYS[n + i], ARGV[3])
    redis.call('ZREM', KEYS[2 * n + i], ARGV[3])
    local value = ARGV[1]
    if redis.call('EXISTS', KEYS[n + i]) == 1 then
      value = value .. '+'
    end
    redis.call('SET', KEYS[i], value, 'PX', ARGV[2])
  end
  return token
end
local id, since, keep = ARGV[3], ARGV[4], tonumber(ARGV[5])
",
    take_places!(),
    r"
return 0
"
);

/// A waiter joins (or refreshes its place in) the wait queues of the lock keys without
/// trying to take them. `KEYS`: the n lock keys, their queues, their queues' deadlines.
/// `ARGV`: waiter id, the time it began waiting (its place), how long its places are kept
/// (ms). Returns the longest remaining TTL (ms) among the lock keys: 0 when they are all
/// free (a hand-over to someone else counts as taken).
pub(crate) static JOIN_QUEUE: LazyLock<Script> = LazyLock::new(|| Script::new(JOIN_QUEUE_SOURCE));
const JOIN_QUEUE_SOURCE: &str = concat!(
    r"
local n = #KEYS / 3
local id, since, keep = ARGV[1], ARGV[2], tonumber(ARGV[3])
",
    take_places!(),
    r"
local longest = 0
for i = 1, n do
  local ttl = redis.call('PTTL', KEYS[i])
  if ttl > longest then
    longest = ttl
  end
end
return longest
"
);

/// Marks every held key of `KEYS` as waited for (`+` appended to its holder's value,
/// as a queued waiter does), without queueing: its release then publishes on its
/// channel. A semaphore's waiter marks every slot, so that the release of any of them
/// wakes it. Returns how many keys are held (marked now or before).
pub(crate) static MARK: LazyLock<Script> = LazyLock::new(|| Script::new(MARK_SOURCE));
const MARK_SOURCE: &str = r"
local held = 0
for _, key in ipairs(KEYS) do
  local current = redis.call('GET', key)
  if current then
    held = held + 1
    if string.sub(current, 1, 1) ~= '~' and string.sub(current, -1) ~= '+' then
      redis.call('APPEND', key, '+')
    end
  end
end
return held
";

/// The node's clock: milliseconds since the Unix epoch (`TIME`, as one number).
pub(crate) static SERVER_TIME: LazyLock<Script> = LazyLock::new(|| Script::new(SERVER_TIME_SOURCE));
const SERVER_TIME_SOURCE: &str = r"
local t = redis.call('TIME')
return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
";

/// Extends locks: `ARGV` holds, for each lock in turn, how many keys it has (the next
/// ones of `KEYS`), its value and its new TTL (ms). A lock is extended only if every one
/// of its keys still holds its value (marked by waiters or not), all or nothing; its
/// answer is 1 if extended, 0 if not, in an array in `ARGV`'s order. `PEXPIRE` on a
/// missing key is a no-op, so an expired lock is never re-created. One lock's
/// extension, or a whole watchdog round's in a few commands (see `extensions.rs`).
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_SOURCE));
const EXTEND_SOURCE: &str = r"
local answers = {}
local k = 0
for i = 1, #ARGV, 3 do
  local n, value = tonumber(ARGV[i]), ARGV[i + 1]
  local held = 1
  for j = k + 1, k + n do
    local current = redis.call('GET', KEYS[j])
    if current ~= value and current ~= value .. '+' then
      held = 0
      break
    end
  end
  if held == 1 then
    for j = k + 1, k + n do
      redis.call('PEXPIRE', KEYS[j], ARGV[i + 2])
    end
  end
  answers[#answers + 1] = held
  k = k + n
end
return answers
";

/// Sets all of `KEYS` to `ARGV[1]` with a TTL of `ARGV[2]` ms if none of them is held
/// (with `ARGV[3] == '1'`, a key being handed over to a queued waiter, `~<waiter>`,
/// counts as free); all or nothing on this node. Returns 1 if set, 0 if any key was
/// taken.
pub(crate) static ACQUIRE_MANY: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_MANY_SOURCE));
const ACQUIRE_MANY_SOURCE: &str = r"
for _, key in ipairs(KEYS) do
  local current = redis.call('GET', key)
  if current and not (ARGV[3] == '1' and string.sub(current, 1, 1) == '~') then
    return 0
  end
end
for _, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
end
return 1
";

/// Fencing acquire. `KEYS` holds the lock keys, then as many counter keys. If no lock
/// key is held (with `ARGV[3] == '1'`, one being handed over, `~<waiter>`, counts as
/// free): sets every counter to the token, the greater of one above the highest of
/// them and the node's clock floor (`clock_floor!`, its step `ARGV[4]`), sets every lock key to
/// `ARGV[1]` with a TTL of `ARGV[2]` ms, and returns the token (>= 1). Every resource's
/// counter thus reaches the token, so a later lock of any one of them counts past it;
/// and a node that forgot its counters still counts past every earlier token by its
/// clock. Otherwise changes nothing and returns 0.
pub(crate) static ACQUIRE_FENCED: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_FENCED_SOURCE));
const ACQUIRE_FENCED_SOURCE: &str = concat!(
    clock_floor!(),
    r"
local n = #KEYS / 2
for i = 1, n do
  local current = redis.call('GET', KEYS[i])
  if current and not (ARGV[3] == '1' and string.sub(current, 1, 1) == '~') then
    return 0
  end
end
local token = 0
for i = 1, n do
  local t = tonumber(redis.call('GET', KEYS[n + i]) or '0')
  if t > token then
    token = t
  end
end
token = math.max(token + 1, clock_floor(tonumber(ARGV[4])))
for i = 1, n do
  redis.call('SET', KEYS[n + i], string.format('%d', token))
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return token
"
);

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

/// Lua defining `now_ms()`: the node's clock in ms since the Unix epoch.
macro_rules! now_ms {
    () => {
        r"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"
    };
}

/// A read lock of a read-write lock. `KEYS`: the writer's key alone. `ARGV`: value,
/// TTL (ms). Unless the writer's key is held or a writer waits (a live deadline in the
/// writers' queue: a waiting writer stops new readers, so writers are not starved),
/// sets the reader's key to the value with the TTL and adds its name to the readers'
/// set. Returns 1 if set, 0 if refused.
///
/// Half of every read cycle, so the common case (no writer, none waiting) costs three
/// commands: one `EXISTS` of both the writer's key and the queue's deadlines (the clock
/// and the deadlines are read only when the deadlines exist: a writer waits, or
/// waited), the `SET` and the `SADD`. The other keys' names are built here from the
/// writer's key, as `RwKeys` names them (`:writer-waiting:until`, `:readers`,
/// `:reader:<value>`; one hash tag): every key and argument sent costs the node time.
/// Readers that died leave their names in the set: past 64 names, one acquisition in
/// 16 (the last character of its random value decides, with no command) drops the dead
/// ones among 32 names picked at random, so the set stays about as large as the readers
/// alive, with no writer to prune it, at no cost to the other acquisitions.
pub(crate) static ACQUIRE_READ: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_READ_SOURCE));
pub(crate) const ACQUIRE_READ_SOURCE: &str = r"
local writer = KEYS[1]
local deadlines = writer .. ':writer-waiting:until'
if redis.call('EXISTS', writer, deadlines) > 0 then
  if redis.call('EXISTS', writer) == 1 then
    return 0
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if redis.call('ZCOUNT', deadlines, '(' .. now, '+inf') > 0 then
    return 0
  end
end
local readers = writer .. ':readers'
local reader = writer .. ':reader:' .. ARGV[1]
redis.call('SET', reader, ARGV[1], 'PX', ARGV[2])
redis.call('SADD', readers, reader)
if (string.byte(ARGV[1], -1) or 0) % 16 == 0 and redis.call('SCARD', readers) > 64 then
  for _, other in ipairs(redis.call('SRANDMEMBER', readers, 32)) do
    if redis.call('EXISTS', other) == 0 then
      redis.call('SREM', readers, other)
    end
  end
end
return 1
";

/// The write lock of a read-write lock. `KEYS`: the writer's key, the set of reader
/// keys, the writers' queue and its deadlines, then (with fencing) the counter. `ARGV`:
/// value, TTL (ms), writer id, the time it began waiting (its place), how long its
/// place is kept (ms), the fencing clock floor's step (µs). Drops expired writers from
/// the queue and dead readers from the set; then, if the writer's key is free, no
/// reader's key is alive and no older writer waits: leaves the queue, sets the counter
/// to the token (as [`ACQUIRE_FENCED`]) and the writer's key to the value with the TTL,
/// and returns the token (1 without fencing). Otherwise takes (or refreshes) its place
/// in the queue, which refuses new readers, and returns 0; a keep of 0 (the request's
/// last attempt: no retry follows) takes no place.
pub(crate) static ACQUIRE_WRITE: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_WRITE_SOURCE));
const ACQUIRE_WRITE_SOURCE: &str = concat!(
    clock_floor!(),
    now_ms!(),
    r"
local now = nil
local id = ARGV[3]
local queued = redis.call('EXISTS', KEYS[4]) == 1
if queued then
  now = now_ms()
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)) do
    redis.call('ZREM', KEYS[3], gone)
    redis.call('ZREM', KEYS[4], gone)
  end
end
local free = redis.call('EXISTS', KEYS[1]) == 0
if free then
  for _, reader in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    if redis.call('EXISTS', reader) == 1 then
      free = false
    else
      redis.call('SREM', KEYS[2], reader)
    end
  end
end
if free and queued then
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if head and head ~= id then
    free = false
  end
end
if not free then
  local keep = tonumber(ARGV[5])
  if keep <= 0 then
    return 0
  end
  if not now then
    now = now_ms()
  end
  redis.call('ZADD', KEYS[3], ARGV[4], id)
  redis.call('ZADD', KEYS[4], now + keep, id)
  for i = 3, 4 do
    if redis.call('PTTL', KEYS[i]) < keep then
      redis.call('PEXPIRE', KEYS[i], keep)
    end
  end
  return 0
end
if queued then
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
end
local token = 1
if #KEYS == 5 then
  local highest = tonumber(redis.call('GET', KEYS[5]) or '0')
  token = math.max(highest + 1, clock_floor(tonumber(ARGV[6])))
  redis.call('SET', KEYS[5], string.format('%d', token))
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return token
"
);

/// Releases a write lock. `KEYS`: the writer's key. `ARGV`: value, `'1'` to wake. If
/// the key holds the value: deletes it and with `ARGV[2] == '1'` publishes an empty
/// message on its channel (waiting readers and writers retry). Returns 1 if released.
pub(crate) static RELEASE_WRITE: LazyLock<Script> =
    LazyLock::new(|| Script::new(RELEASE_WRITE_SOURCE));
const RELEASE_WRITE_SOURCE: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[2] == '1' then
  redis.call('PUBLISH', KEYS[1], '')
end
return 1
";

/// Turns a write lock into a read lock of the same value. `KEYS`: the writer's key, the
/// set of reader keys, the reader's key. `ARGV`: value. If the writer's key holds the
/// value: moves it to the reader's key with the TTL it had left, joins the set, and
/// publishes an empty message on the writer's channel (waiting readers may come in).
/// Returns 1 if done, 0 if not.
pub(crate) static DOWNGRADE: LazyLock<Script> = LazyLock::new(|| Script::new(DOWNGRADE_SOURCE));
const DOWNGRADE_SOURCE: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[3], ARGV[1], 'PX', ttl)
redis.call('SADD', KEYS[2], KEYS[3])
redis.call('PUBLISH', KEYS[1], '')
return 1
";

/// A writer leaves the writers' queue. `KEYS`: the queue, its deadlines, the writer's
/// key (its channel). `ARGV`: writer id. If that empties the queue, publishes an empty
/// message on the writer's channel: readers it held back may come in. Returns 1.
pub(crate) static LEAVE_WRITERS: LazyLock<Script> =
    LazyLock::new(|| Script::new(LEAVE_WRITERS_SOURCE));
const LEAVE_WRITERS_SOURCE: &str = r"
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if removed == 1 and redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('PUBLISH', KEYS[3], '')
end
return 1
";

/// Every script's source, to load on a new connection.
pub(crate) const ALL_SOURCES: [&str; 15] = [
    ACQUIRE_QUEUED_SOURCE,
    SERVER_TIME_SOURCE,
    JOIN_QUEUE_SOURCE,
    REMAINING_SOURCE,
    RELEASE_SOURCE,
    EXTEND_SOURCE,
    ACQUIRE_MANY_SOURCE,
    ACQUIRE_FENCED_SOURCE,
    RAISE_FENCE_SOURCE,
    ACQUIRE_READ_SOURCE,
    ACQUIRE_WRITE_SOURCE,
    RELEASE_WRITE_SOURCE,
    DOWNGRADE_SOURCE,
    LEAVE_WRITERS_SOURCE,
    MARK_SOURCE,
];

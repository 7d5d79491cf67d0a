//! [`RedisStore`]: records in a data Redis, each write fenced by one script.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Script, Value};

use super::{RecordSummary, Started, Store, StoreError, StoreFuture};
use crate::record::{HEAD_LEN, Record};

/// The prefix of record keys unless told otherwise: the record of id `t%3A7:k-1` is
/// `idempotency:t%3A7:k-1`.
pub const DEFAULT_REDIS_PREFIX: &str = "idempotency:";

/// Compares two 8-byte big-endian tokens byte by byte (Lua's string `<` follows the
/// server's locale, not bytes).
const LESS: &str = r"
local function less(a, b)
  for i = 1, 8 do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return false
end
";

/// `start`: KEYS[1] the record; ARGV[1] the in-flight record; ARGV[2] its TTL (ms).
/// Answers {0, stored token} when stale, {1, stored record} when the stored one stays,
/// {2} when written. Bytes 2..9 (1-based 3..10) of a record are its token, 11..42 its
/// fingerprint, byte 2 its state.
static START: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{LESS}
local new = ARGV[1]
local cur = redis.call('GET', KEYS[1])
if cur and #cur >= {HEAD_LEN} then
  local token = string.sub(cur, 3, 10)
  if less(string.sub(new, 3, 10), token) then return {{0, token}} end
  local state = string.sub(cur, 2, 2)
  if state == 'C' or state == 'N' then return {{1, cur}} end
  if state == 'I' and string.sub(cur, 11, 42) ~= string.sub(new, 11, 42) then
    return {{1, cur}}
  end
end
redis.call('SET', KEYS[1], new, 'PX', ARGV[2])
return {{2}}
"
    ))
});

/// `finish`: KEYS[1] the record; ARGV[1] the record; ARGV[2] its TTL (ms). Answers
/// {0, stored token} when stale, {1} when written.
static FINISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{LESS}
local new = ARGV[1]
local cur = redis.call('GET', KEYS[1])
if cur and #cur >= {HEAD_LEN} then
  local token = string.sub(cur, 3, 10)
  if less(string.sub(new, 3, 10), token) then return {{0, token}} end
end
redis.call('SET', KEYS[1], new, 'PX', ARGV[2])
return {{1}}
"
    ))
});

/// Records in a data Redis (not one of the lock's nodes), one string key per record
/// (`<prefix><id>`, [`DEFAULT_REDIS_PREFIX`] unless told otherwise) that expires with
/// the record (`PX`).
///
/// A replay is one `GET`. A run's two writes (in flight, then its end) are each one
/// script that compares the writer's fencing token with the one in the stored record
/// and writes only if it is not lower: a run whose lock went stale cannot overwrite the
/// record of the run that took over. The connection is a
/// [`ConnectionManager`](redis::aio::ConnectionManager): it reconnects after the server
/// restarts or the connection drops.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use redlock_idempotency::store::RedisStore;
///
/// let store = RedisStore::open("redis://127.0.0.1:6379").await?;
/// # Ok(())
/// # }
/// ```
///
/// # Durability
///
/// A record is as durable as the data Redis: with `appendonly yes` (and
/// `appendfsync always` to lose nothing in a crash). A Redis that restarts without its
/// data forgets the records: retries of finished requests then run again.
///
/// # Redis Cluster
///
/// Each operation touches one key, so a cluster is fine (connect with a cluster
/// client of your own through [`Store`] if you need one: this type takes a single node).
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store on the Redis at `url`, with keys `idempotency:<id>`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] for an invalid URL or a server that cannot be reached.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(backend)?;
        let conn = ConnectionManager::new(client).await.map_err(backend)?;
        Ok(Self::new(conn))
    }

    /// A store on this connection, with keys `idempotency:<id>`.
    pub fn new(conn: ConnectionManager) -> Self {
        Self {
            conn,
            prefix: DEFAULT_REDIS_PREFIX.to_owned(),
        }
    }

    /// Keys `<prefix><id>` instead.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    fn key(&self, id: &str) -> String {
        format!("{}{id}", self.prefix)
    }

    /// Runs a fenced write script (`start`, `finish`) on `record`: its answer's parts,
    /// or [`StoreError::Stale`] when the script refused a lower token (`{0, token}`).
    async fn write(
        &self,
        script: &Script,
        what: &str,
        id: &str,
        record: &Record,
        ttl: Duration,
    ) -> Result<Vec<Value>, StoreError> {
        let mut conn = self.conn.clone();
        let answer: Value = script
            .key(self.key(id))
            .arg(record.encode())
            .arg(ttl_ms(ttl))
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        match answer {
            Value::Array(parts) if matches!(parts.first(), Some(Value::Int(0))) => {
                Err(StoreError::Stale {
                    token: record.token,
                    highest: token_of(parts.get(1)),
                })
            }
            Value::Array(parts) => Ok(parts),
            other => Err(unexpected(what, &other)),
        }
    }
}

fn backend(error: redis::RedisError) -> StoreError {
    StoreError::Backend(Box::new(error))
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The token in a script's answer (8 big-endian bytes).
fn token_of(value: Option<&Value>) -> u64 {
    match value {
        Some(Value::BulkString(bytes)) => bytes.as_slice().try_into().map_or(0, u64::from_be_bytes),
        _ => 0,
    }
}

fn unexpected(what: &str, value: &Value) -> StoreError {
    StoreError::Backend(format!("unexpected answer to `{what}`: {value:?}").into())
}

impl Store for RedisStore {
    fn load<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let bytes: Option<Vec<u8>> = redis::cmd("GET")
                .arg(self.key(id))
                .query_async(&mut conn)
                .await
                .map_err(backend)?;
            Ok(bytes.map(|b| Record::decode(&b)).transpose()?)
        })
    }

    fn start<'a>(
        &'a self,
        id: &'a str,
        record: &'a Record,
        ttl: Duration,
    ) -> StoreFuture<'a, Started> {
        Box::pin(async move {
            let parts = self.write(&START, "start", id, record, ttl).await?;
            match parts.as_slice() {
                [Value::Int(2)] => Ok(Started::Started),
                [Value::Int(1), Value::BulkString(bytes)] => {
                    Ok(Started::Found(Record::decode(bytes)?))
                }
                _ => Err(unexpected("start", &Value::Array(parts))),
            }
        })
    }

    fn finish<'a>(&'a self, id: &'a str, record: &'a Record, ttl: Duration) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let parts = self.write(&FINISH, "finish", id, record, ttl).await?;
            match parts.as_slice() {
                [Value::Int(1)] => Ok(()),
                _ => Err(unexpected("finish", &Value::Array(parts))),
            }
        })
    }

    fn list<'a>(&'a self, prefix: &'a str, limit: usize) -> StoreFuture<'a, Vec<RecordSummary>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let pattern = format!("{}*", glob_escape(&self.key(prefix)));
            let mut keys: Vec<Vec<u8>> = Vec::new();
            let mut cursor: u64 = 0;
            // SCAN visits every key present for the whole scan; its pages are bounded
            // (COUNT) and so is the listing: it stops once it has collected the keys
            // of `limit` records... in SCAN's order, so it sorts what it found.
            loop {
                let (next, page): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await
                    .map_err(backend)?;
                keys.extend(page);
                cursor = next;
                if cursor == 0 || keys.len() >= limit.saturating_mul(4).max(1000) {
                    break;
                }
            }
            keys.sort();
            keys.dedup();
            keys.truncate(limit);
            let mut out = Vec::with_capacity(keys.len());
            for key in keys {
                let (bytes, pttl): (Option<Vec<u8>>, i64) = redis::pipe()
                    .cmd("GET")
                    .arg(&key)
                    .cmd("PTTL")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .map_err(backend)?;
                let Some(bytes) = bytes else { continue };
                let Ok(record) = Record::decode(&bytes) else {
                    continue;
                };
                let id =
                    String::from_utf8_lossy(&key[self.prefix.len().min(key.len())..]).into_owned();
                let expires_in = u64::try_from(pttl).ok().map(Duration::from_millis);
                out.push(RecordSummary::new(id, &record, expires_in));
            }
            Ok(out)
        })
    }
}

/// `text` with Redis glob specials (`* ? [ ] \`) escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

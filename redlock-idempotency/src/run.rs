//! [`Begin`], [`Run`] and [`Replay`]: what [`Idempotency::begin`](crate::Idempotency::begin)
//! decides for a request, and a run's end.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use redlock_core::{Lock, LockHandle};

use crate::Inner;
use crate::fingerprint::Fingerprint;
use crate::record::{Record, RecordState, StoredResponse};
use crate::response::is_hop_by_hop;
use crate::store::StoreError;
use crate::telemetry::{Outcome, record_outcome, record_stored_bytes};

/// The response header that marks a replayed response, with the value `true`:
/// `Idempotent-Replayed: true` (the name Stripe's API and most clients use).
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// What to do with a request that carries a key.
#[derive(Debug)]
#[non_exhaustive]
pub enum Begin {
    /// The request ran before: answer with its stored response, marked with
    /// [`REPLAYED_HEADER`]; the handler is not called.
    Replay(Replay),
    /// Run the handler under the key's lock, then hand its response to
    /// [`Run::finish`].
    Run(Run),
}

/// A stored response to replay.
#[derive(Debug, Clone)]
pub struct Replay {
    pub(crate) response: StoredResponse,
}

impl Replay {
    /// The response's status.
    pub fn status(&self) -> u16 {
        self.response.status
    }

    /// Its headers (names in lower case), in the handler's order, without hop-by-hop
    /// ones and `content-length` (the framework sets it for the body).
    pub fn headers(&self) -> &[(String, Bytes)] {
        &self.response.headers
    }

    /// Its body, byte for byte.
    pub fn body(&self) -> &Bytes {
        &self.response.body
    }

    /// The response.
    pub fn into_response(self) -> StoredResponse {
        self.response
    }
}

/// A request that runs: it holds the key's lock (extended while it runs), and its
/// record says "in flight" under the lock's fencing token.
///
/// Hand the handler's response to [`finish`](Self::finish) before answering. Dropped
/// without it (the handler failed or was cancelled), the lock is released in the
/// background and the record stays in flight: the next request with the key runs
/// again.
pub struct Run {
    pub(crate) inner: Arc<Inner>,
    pub(crate) id: String,
    pub(crate) lock: Option<Lock>,
    pub(crate) token: u64,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) started_ms: u64,
    pub(crate) started: Instant,
    pub(crate) runtime: Option<tokio::runtime::Handle>,
    /// The request's id, for the problem of a response that fails
    /// ([`Collect::failed`](crate::middleware::Collect::failed)).
    pub(crate) request_id: Option<String>,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("id", &self.id)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// What [`Run::finish`] did with the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finished {
    /// Stored: retries replay it.
    Stored,
    /// Not stored, by its status ([`store_if`](crate::Idempotency::store_if); by
    /// default a `5xx`): the next request with the key runs again.
    StatusNotStored,
    /// Not stored: its body was larger than `max_body`. Retries are refused with `409`.
    TooLarge,
    /// Not stored: the store failed, or refused the write because a newer run of the key
    /// took over (this run's lock went stale). The record says in flight, or what the
    /// newer run wrote.
    Failed,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Run {
    /// The lock's fencing token: pass it with the handler's writes to a fenced store
    /// (`redlock-fence`) so that a run whose lock went stale cannot write.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// A handle on the lock (its token, whether it was lost), for the handler.
    pub fn handle(&self) -> Option<LockHandle> {
        self.lock.as_ref().map(Lock::handle)
    }

    /// The record's id (scope and key).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether a response with this status is to be stored: if not, there is no need
    /// to collect its body.
    pub fn stores(&self, status: u16) -> bool {
        (self.inner.options.store_if)(status)
    }

    /// The largest body stored, in bytes (`max_body`).
    pub fn max_body(&self) -> usize {
        self.inner.options.max_body
    }

    /// Records the handler's response, then releases the lock: in the background, or,
    /// for a response not stored by its status (the next request runs again), before
    /// it returns.
    /// `body` is `None` when it was larger than [`max_body`](Self::max_body) (not
    /// collected). Headers are stored without hop-by-hop ones (see
    /// [`is_hop_by_hop`]) and `content-length`.
    ///
    /// Never fails: a response that could not be stored is still the client's answer;
    /// the failure is logged and counted ([`Finished::Failed`]).
    pub async fn finish(
        mut self,
        status: u16,
        headers: Vec<(String, Bytes)>,
        body: Option<Bytes>,
    ) -> Finished {
        let inner = self.inner.clone();
        let options = &inner.options;
        let stored = match body {
            _ if !(options.store_if)(status) => None,
            Some(body) if body.len() <= options.max_body => Some(body),
            _ => None,
        };
        let (state, finished) = match &stored {
            Some(_) => (RecordState::Completed, Finished::Stored),
            None if (options.store_if)(status) => (RecordState::NotStored, Finished::TooLarge),
            None => (RecordState::Abandoned, Finished::StatusNotStored),
        };
        let body_len = stored.as_ref().map_or(0, Bytes::len);
        let record = Record {
            state,
            token: self.token,
            fingerprint: self.fingerprint,
            started_ms: self.started_ms,
            status: Some(status),
            response: stored.map(|body| StoredResponse {
                status,
                headers: kept_headers(headers),
                body,
            }),
        };
        let ttl = options.expire_after;
        let written = inner
            .timed(inner.store.finish(&self.id, &record, ttl))
            .await;
        let finished = match written {
            Ok(()) => finished,
            Err(error) => {
                match &error {
                    StoreError::Stale { .. } => tracing::warn!(
                        id = %self.id,
                        token = self.token,
                        %error,
                        "the run's lock went stale and a newer run took the key: its response is answered but not stored"
                    ),
                    _ => tracing::error!(
                        id = %self.id,
                        token = self.token,
                        %error,
                        "storing the response failed: it is answered, and the record stays in flight (a retry runs again once the lock is free)"
                    ),
                }
                Finished::Failed
            }
        };
        match finished {
            Finished::Stored => {
                record_outcome(Outcome::FirstRun);
                record_stored_bytes(body_len);
            }
            _ => record_outcome(Outcome::NotStored),
        }
        tracing::debug!(
            id = %self.id,
            token = self.token,
            status,
            outcome = ?finished,
            ran_ms = self.started.elapsed().as_millis() as u64,
            "idempotent request finished"
        );
        if finished == Finished::StatusNotStored {
            // The next request runs again: let it find the key free, not `409` for the
            // moment a background release takes.
            self.release_now().await;
        } else {
            self.release();
        }
        finished
    }

    /// Releases the lock and waits for it (bounded by the client's node timeout).
    async fn release_now(&mut self) {
        if let Some(lock) = self.lock.take() {
            let key = lock.resource().to_owned();
            if let Err(error) = lock.release().await {
                tracing::warn!(key = %key, %error, "idempotency lock release failed: it ends at its TTL");
            }
        }
    }

    /// Releases the lock in the background (on the runtime the run began on).
    fn release(&mut self) {
        let Some(lock) = self.lock.take() else {
            return;
        };
        let runtime = self
            .runtime
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        let Some(runtime) = runtime else {
            // Dropping it lets redlock-core say that it expires at its TTL.
            drop(lock);
            return;
        };
        runtime.spawn(async move {
            let key = lock.resource().to_owned();
            if let Err(error) = lock.release().await {
                tracing::warn!(key = %key, %error, "idempotency lock release failed: it ends at its TTL");
            }
        });
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if self.lock.is_some() {
            tracing::debug!(
                id = %self.id,
                token = self.token,
                "idempotent request ended without a response (failed or cancelled): its record stays in flight, and a retry runs again"
            );
            self.release();
        }
    }
}

/// The headers a stored response keeps, names lower-cased.
fn kept_headers(headers: Vec<(String, Bytes)>) -> Vec<(String, Bytes)> {
    // Headers the `Connection` header names are hop-by-hop too (RFC 9110, 7.6.1).
    let named: Vec<String> = headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, value)| {
            String::from_utf8_lossy(value)
                .split(',')
                .map(|token| token.trim().to_ascii_lowercase())
                .filter(|token| !token.is_empty())
                .collect::<Vec<_>>()
        })
        .collect();
    headers
        .into_iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), value))
        .filter(|(name, _)| {
            !is_hop_by_hop(name) && name != "content-length" && !named.contains(name)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_not_kept() {
        let h = |n: &str, v: &'static str| (n.to_owned(), Bytes::from_static(v.as_bytes()));
        let kept = kept_headers(vec![
            h("Content-Type", "application/json"),
            h("Connection", "close, X-Hop"),
            h("x-hop", "1"),
            h("transfer-encoding", "chunked"),
            h("keep-alive", "timeout=5"),
            h("content-length", "12"),
            h("x-custom", "a"),
            h("x-custom", "b"),
            h("set-cookie", "s=1"),
        ]);
        assert_eq!(
            kept,
            vec![
                h("content-type", "application/json"),
                h("x-custom", "a"),
                h("x-custom", "b"),
                h("set-cookie", "s=1"),
            ]
        );
    }
}

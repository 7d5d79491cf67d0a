//! [`Record`]: what a store keeps per idempotency key, and its byte encoding.
//!
//! Every store keeps a record as one byte string in this encoding, whose fixed head lets
//! a store compare fencing tokens and fingerprints without decoding the rest (the Redis
//! store's scripts do):
//!
//! | bytes | field |
//! | --- | --- |
//! | 0 | format version (1) |
//! | 1 | state: `I` in flight, `C` completed, `N` completed but not stored, `A` abandoned |
//! | 2..10 | the fencing token of the run that wrote it, big-endian |
//! | 10..42 | the request's fingerprint (SHA-256) |
//! | 42..50 | when the run began, Unix milliseconds, big-endian |
//! | 50..52 | the response's status, big-endian (0 while in flight) |
//! | 52.. | completed only: the header count (`u16`), each header's name and value, the body (each a `u32` length and its bytes) |

use std::fmt;

use bytes::Bytes;

use crate::fingerprint::Fingerprint;

/// The encoding's version byte.
const VERSION: u8 = 1;
/// The length of the fixed head (version, state, token, fingerprint, start time).
pub(crate) const HEAD_LEN: usize = 50;

/// Where a key's request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecordState {
    /// A run holds (or held, if its replica died) the key's lock and has not finished.
    InFlight,
    /// The run finished and its response is stored: retries replay it.
    Completed,
    /// The run finished but its response was not stored (its body was larger than
    /// `max_body`): retries are refused, since the request ran and its answer is gone.
    NotStored,
    /// The run finished with a response not to be stored (by default a `5xx`): the next
    /// request with the key runs again.
    Abandoned,
}

impl RecordState {
    fn byte(self) -> u8 {
        match self {
            Self::InFlight => b'I',
            Self::Completed => b'C',
            Self::NotStored => b'N',
            Self::Abandoned => b'A',
        }
    }

    fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            b'I' => Self::InFlight,
            b'C' => Self::Completed,
            b'N' => Self::NotStored,
            b'A' => Self::Abandoned,
            _ => return None,
        })
    }

    /// The state's name, as listings and metrics show it: `in_flight`, `completed`,
    /// `not_stored`, `abandoned`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Completed => "completed",
            Self::NotStored => "not_stored",
            Self::Abandoned => "abandoned",
        }
    }
}

impl fmt::Display for RecordState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A response as stored, and replayed byte for byte: status, headers (hop-by-hop ones
/// left out, see [`is_hop_by_hop`](crate::is_hop_by_hop)) in their order, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The status code.
    pub status: u16,
    /// The headers, names in lower case, in the order the handler gave them.
    pub headers: Vec<(String, Bytes)>,
    /// The body.
    pub body: Bytes,
}

/// What a store keeps for one idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Where the key's request stands.
    pub state: RecordState,
    /// The fencing token of the lock under which the record was written: a store
    /// refuses a write under a lower token than the record's.
    pub token: u64,
    /// The fingerprint of the request that ran.
    pub fingerprint: Fingerprint,
    /// When the run began, Unix milliseconds.
    pub started_ms: u64,
    /// The status of the response (completed, not stored, abandoned).
    pub status: Option<u16>,
    /// The stored response (completed only).
    pub response: Option<StoredResponse>,
}

/// A stored record that could not be decoded (written by an incompatible version, or
/// not by this crate).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the stored idempotency record is not readable ({0}); delete it or let it expire")]
pub struct Corrupt(pub(crate) &'static str);

impl Record {
    /// A record of a run that begins now.
    pub(crate) fn in_flight(token: u64, fingerprint: Fingerprint, started_ms: u64) -> Self {
        Self {
            state: RecordState::InFlight,
            token,
            fingerprint,
            started_ms,
            status: None,
            response: None,
        }
    }

    /// The record's byte encoding (see the module's table).
    pub fn encode(&self) -> Vec<u8> {
        let response_len = self.response.as_ref().map_or(0, |r| {
            r.body.len()
                + r.headers
                    .iter()
                    .map(|(n, v)| n.len() + v.len() + 6)
                    .sum::<usize>()
        });
        let mut out = Vec::with_capacity(HEAD_LEN + 8 + response_len);
        out.push(VERSION);
        out.push(self.state.byte());
        out.extend_from_slice(&self.token.to_be_bytes());
        out.extend_from_slice(self.fingerprint.as_bytes());
        out.extend_from_slice(&self.started_ms.to_be_bytes());
        out.extend_from_slice(&self.status.unwrap_or(0).to_be_bytes());
        if let Some(response) = &self.response {
            // Lengths are bounded by the options (max_body, header sizes a server
            // accepts); `u32` is far above them.
            let count = u16::try_from(response.headers.len()).unwrap_or(u16::MAX);
            out.extend_from_slice(&count.to_be_bytes());
            for (name, value) in response.headers.iter().take(usize::from(count)) {
                push_chunk(&mut out, name.as_bytes());
                push_chunk(&mut out, value);
            }
            push_chunk(&mut out, &response.body);
        }
        out
    }

    /// Decodes a record.
    ///
    /// # Errors
    ///
    /// [`Corrupt`] when `bytes` is not a record of this encoding.
    pub fn decode(bytes: &[u8]) -> Result<Self, Corrupt> {
        let mut input = Reader(bytes);
        if input.take(1)?[0] != VERSION {
            return Err(Corrupt("unknown version"));
        }
        let state = RecordState::from_byte(input.take(1)?[0]).ok_or(Corrupt("unknown state"))?;
        let token = input.u64()?;
        let fingerprint = Fingerprint::from_bytes(input.take(32)?).ok_or(Corrupt("fingerprint"))?;
        let started_ms = input.u64()?;
        let status = match u16::from_be_bytes(input.array()?) {
            0 => None,
            status => Some(status),
        };
        let response = match state {
            RecordState::Completed => {
                let count = u16::from_be_bytes(input.array()?);
                let mut headers = Vec::with_capacity(usize::from(count).min(64));
                for _ in 0..count {
                    let name = std::str::from_utf8(input.chunk()?)
                        .map_err(|_| Corrupt("header name"))?
                        .to_owned();
                    let value = Bytes::copy_from_slice(input.chunk()?);
                    headers.push((name, value));
                }
                let body = Bytes::copy_from_slice(input.chunk()?);
                Some(StoredResponse {
                    status: status.ok_or(Corrupt("status"))?,
                    headers,
                    body,
                })
            }
            _ => None,
        };
        if !input.0.is_empty() {
            return Err(Corrupt("trailing bytes"));
        }
        Ok(Self {
            state,
            token,
            fingerprint,
            started_ms,
            status,
            response,
        })
    }
}

fn push_chunk(out: &mut Vec<u8>, chunk: &[u8]) {
    let len = u32::try_from(chunk.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&chunk[..len as usize]);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Corrupt> {
        if self.0.len() < n {
            return Err(Corrupt("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Corrupt> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u64(&mut self) -> Result<u64, Corrupt> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn chunk(&mut self) -> Result<&'a [u8], Corrupt> {
        let len = u32::from_be_bytes(self.array()?) as usize;
        self.take(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint() -> Fingerprint {
        Fingerprint::builder("POST", "/refunds")
            .body(b"{}")
            .finish()
    }

    #[test]
    fn round_trip() {
        let completed = Record {
            state: RecordState::Completed,
            token: u64::MAX - 3,
            fingerprint: fingerprint(),
            started_ms: 1_700_000_000_000,
            status: Some(201),
            response: Some(StoredResponse {
                status: 201,
                headers: vec![
                    (
                        "content-type".into(),
                        Bytes::from_static(b"application/json"),
                    ),
                    ("x-a".into(), Bytes::from_static(b"\x80\xff binary")),
                    ("x-a".into(), Bytes::new()),
                ],
                body: Bytes::from_static(b"{\"id\":7}\0\xff"),
            }),
        };
        let bytes = completed.encode();
        assert_eq!(bytes[1], b'C');
        assert_eq!(&bytes[2..10], &(u64::MAX - 3).to_be_bytes());
        assert_eq!(Record::decode(&bytes), Ok(completed));

        let not_stored = Record {
            state: RecordState::NotStored,
            status: Some(200),
            ..Record::in_flight(9, fingerprint(), 5)
        };
        assert_eq!(Record::decode(&not_stored.encode()), Ok(not_stored));
        let in_flight = Record::in_flight(1, fingerprint(), 5);
        assert_eq!(in_flight.encode().len(), HEAD_LEN + 2);
        assert_eq!(Record::decode(&in_flight.encode()), Ok(in_flight));
    }

    #[test]
    fn garbage_is_refused_not_panicked_on() {
        let good = Record {
            state: RecordState::Completed,
            token: 4,
            fingerprint: fingerprint(),
            started_ms: 0,
            status: Some(200),
            response: Some(StoredResponse {
                status: 200,
                headers: vec![("a".into(), Bytes::from_static(b"b"))],
                body: Bytes::from_static(b"body"),
            }),
        }
        .encode();
        for cut in 0..good.len() {
            assert!(Record::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(Record::decode(&longer).is_err());
        assert!(Record::decode(b"hello world").is_err());
    }
}

//! Telling a TLS failure for what it is. A `rediss://` URL pointing at a plain Redis
//! port makes the handshake stall (the server waits for the end of a command line that
//! never comes) or fail with a corrupt record; either way the caller would only see a
//! timeout. When the handshake fails, or has not finished after [`PROBE_AFTER`], the
//! port is asked a plain `PING`: a Redis reply means the URL's scheme is wrong, and the
//! error says so at once.

use std::future::Future;
use std::time::Duration;

use redis::RedisError;
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::NodeError;

/// How long a TLS handshake may run before the port is probed (a handshake on a local
/// network takes a few milliseconds).
const PROBE_AFTER: Duration = Duration::from_millis(20);

/// How long the plain probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Opens a TLS connection with `connect` to `host:port`, naming TLS as the cause when
/// the handshake fails or the port speaks plain Redis.
pub(super) async fn connect(
    connect: impl Future<Output = Result<MultiplexedConnection, RedisError>>,
    host: &str,
    port: u16,
    refused: impl Fn(RedisError) -> NodeError,
) -> Result<MultiplexedConnection, NodeError> {
    let mut connect = std::pin::pin!(connect);
    let result = match tokio::time::timeout(PROBE_AFTER, &mut connect).await {
        Ok(result) => result,
        Err(_) => {
            tokio::select! {
                result = &mut connect => result,
                plain = speaks_plain_redis(host, port) => {
                    if plain {
                        return Err(plain_port(host, port));
                    }
                    connect.await
                }
            }
        }
    };
    match result {
        Ok(conn) => Ok(conn),
        Err(err) if speaks_plain_redis(host, port).await => {
            tracing::debug!(error = %err, "TLS handshake failed");
            Err(plain_port(host, port))
        }
        Err(err) if is_tls_error(&err) => Err(NodeError::Tls(err.to_string())),
        Err(err) => Err(refused(err)),
    }
}

fn plain_port(host: &str, port: u16) -> NodeError {
    NodeError::Tls(format!(
        "{host}:{port} answers plain (unencrypted) Redis, but the URL asks for TLS (rediss://): use redis:// for this port, or the node's TLS port"
    ))
}

/// Whether `host:port` answers a plain `PING` as Redis does (`+PONG`, or an error
/// reply such as `-NOAUTH`).
async fn speaks_plain_redis(host: &str, port: u16) -> bool {
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut first = [0_u8; 1];
        let n = stream.read(&mut first).await.ok()?;
        Some(n == 1 && matches!(first[0], b'+' | b'-'))
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, probe).await,
        Ok(Some(true))
    )
}

/// Whether `err` comes from TLS (a certificate not trusted, a corrupt record).
fn is_tls_error(err: &RedisError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(current) = source {
        if current.is::<rustls::Error>() {
            return true;
        }
        if let Some(io) = current.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
        {
            return true;
        }
        source = current.source();
    }
    let text = err.to_string().to_lowercase();
    text.contains("certificate") || text.contains("tls") || text.contains("handshake")
}

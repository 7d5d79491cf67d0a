//! What a new connection checks, against real redis-server nodes: a user without the
//! permissions the lock needs is refused at once with the permission named (no retry
//! loop), and a node that can evict lock keys or forget them in a crash is warned about,
//! once per node however often the client reconnects.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::error::NodeError;
use redlock_core::{Error, RetryPolicy};
use redlock_testkit::{Persistence, RedisServer};

/// Collects everything logged, for the assertions.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

async fn config_set(server: &RedisServer, parameter: &str, value: &str) {
    let () = server
        .query(redis::cmd("CONFIG").arg("SET").arg(parameter).arg(value))
        .await
        .unwrap();
}

/// Drops every client connection of `server` (not the one asking).
async fn kill_clients(server: &RedisServer) {
    let _: Option<u64> = server
        .query(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal"))
        .await;
}

/// Three reconnections to each node: the eviction and the persistence warnings come once
/// per node, each naming its node and the fix; a node configured right gets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warnings_come_once_per_node() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    // Global: warnings are logged from the connections' own tasks, on any thread.
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let evicting = RedisServer::start(Persistence::AofAlways).await;
    config_set(&evicting, "maxmemory", "100mb").await;
    config_set(&evicting, "maxmemory-policy", "allkeys-lru").await;
    let volatile = RedisServer::start(Persistence::None).await;
    let durable = RedisServer::start(Persistence::AofAlways).await;
    let servers = [&evicting, &volatile, &durable];
    let redlock = redlock_testkit::builder_for(servers.map(RedisServer::url))
        .build()
        .unwrap();
    for _ in 0..3 {
        assert!(redlock.ready().await);
        redlock
            .try_lock("checked")
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        for server in servers {
            kill_clients(server).await;
        }
    }
    assert!(redlock.ready().await);

    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let count = |port: u16, text: &str| {
        log.lines()
            .filter(|l| l.contains(text) && l.contains(&format!(":{port}")))
            .count()
    };
    let (evicts, forgets) = ("may evict lock keys", "does not persist every write");
    assert_eq!(count(evicting.port(), evicts), 1, "{log}");
    assert!(log.contains("maxmemory-policy noeviction"), "{log}");
    assert_eq!(count(volatile.port(), forgets), 1, "{log}");
    for (server, text) in [
        (&evicting, forgets),
        (&volatile, evicts),
        (&durable, evicts),
        (&durable, forgets),
    ] {
        assert_eq!(count(server.port(), text), 0, "{text}: {log}");
    }
}

/// An ACL user allowed `SET` but not `EVALSHA` could take locks it can never release.
/// Such nodes are refused at connect with the missing permission named, the request
/// fails at once (not after its retry deadline), and no node is reconnected to in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_evalsha_is_refused_at_connect() {
    let mut servers = Vec::new();
    for _ in 0..3 {
        let server = RedisServer::start(Persistence::None).await;
        let () = server
            .query(
                redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg("locker")
                    .arg("on")
                    .arg(">secret")
                    .arg("~*")
                    .arg("&*")
                    .arg("+@all")
                    .arg("-evalsha")
                    .arg("-eval"),
            )
            .await
            .unwrap();
        servers.push(server);
    }
    let urls: Vec<String> = servers
        .iter()
        .map(|s| format!("redis://locker:secret@127.0.0.1:{}", s.port()))
        .collect();
    let redlock = redlock_testkit::builder_for(urls)
        .retry(RetryPolicy::deadline(Duration::from_secs(3)))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = redlock.lock("perm").await.unwrap_err();
    let took = started.elapsed();
    let Error::NoQuorum { failures, .. } = &err else {
        panic!("expected NoQuorum, got {err:?}");
    };
    // Decided once a majority failed.
    assert!(failures.len() >= 2, "{err}");
    for failure in failures {
        assert!(
            matches!(&failure.cause, NodeError::Permission(text) if text.contains("EVALSHA")),
            "{failure}"
        );
    }
    assert!(took < Duration::from_secs(1), "gave up after {took:?}");

    // Asked again: refused at once, without connecting again.
    let connections = |server: &RedisServer| {
        let server = server.client();
        async move {
            let mut conn = server.get_multiplexed_async_connection().await.unwrap();
            let info: String = redis::cmd("INFO")
                .arg("stats")
                .query_async(&mut conn)
                .await
                .unwrap();
            info.lines()
                .find_map(|l| l.strip_prefix("total_connections_received:"))
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap()
        }
    };
    let before = connections(&servers[0]).await;
    for _ in 0..5 {
        assert!(redlock.try_lock("perm").await.is_err());
    }
    let after = connections(&servers[0]).await;
    // The two counted are this check's own connections.
    assert!(after - before <= 1, "{} connections", after - before);
}

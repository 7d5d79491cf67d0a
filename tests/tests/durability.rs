//! With the restart quarantine off, the client warns on first contact about every node
//! that cannot keep a lock across a crash, and about none that can.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::io::Write;
use std::sync::{Arc, Mutex};

use redlock_core::Redlock;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_off_warns_about_nodes_without_durable_persistence() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    // Global: the warning is logged from the connection's own task, on any thread.
    // (This file is its own test binary, with this one test.)
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let volatile = RedisServer::start(Persistence::None).await;
    let durable = RedisServer::start(Persistence::AofAlways).await;
    let third = RedisServer::start(Persistence::AofAlways).await;
    let redlock = Redlock::builder()
        .nodes([volatile.url(), durable.url(), third.url()])
        .restart_quarantine(false)
        .build()
        .unwrap();
    assert!(redlock.ready().await);

    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let warned = |port: u16| {
        log.lines()
            .any(|l| l.contains("does not persist every write") && l.contains(&format!(":{port}")))
    };
    assert!(
        warned(volatile.port()),
        "no warning for the volatile node:\n{log}"
    );
    assert!(
        !warned(durable.port()),
        "warned about a durable node:\n{log}"
    );
    assert!(!warned(third.port()), "warned about a durable node:\n{log}");
}

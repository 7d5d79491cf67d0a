//! One server listed under two names: the second name's connection must be identified
//! before a majority that counts the first one's vote is taken as won, however late in
//! the client's life that connection opens (first contact, the first connection after
//! being unreachable, a reconnect to an address that moved). Real servers; the second
//! name is slowed down by a proxy, so that the first name and the third node always
//! answer before it is identified. And a node that does not answer holds up nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use redlock_core::{ConfigError, Error, Redlock};
use redlock_testkit::{Cluster, Proxy};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Long enough that no node times out in these tests: what they see is the wait for a
/// connection's identity, which is much shorter.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);

/// Added to each chunk each way on the second name's link: opening a connection takes
/// two round trips before the identity is known (the handshake, then the scripts with
/// `INFO`), so at least 20 ms here, while the other nodes answer within a millisecond or
/// two. A connection's identity is waited for until it has been opening for 100 ms
/// (`IDENTITY_WAIT`), which leaves room for a loaded machine.
const ALIAS_DELAY: Duration = Duration::from_millis(5);

fn client(urls: Vec<String>) -> Redlock {
    redlock_testkit::builder_for(urls)
        .node_timeout(NODE_TIMEOUT)
        .build()
        .unwrap()
}

/// The error is the configuration refused for one server under two names.
fn assert_same_server(result: Result<redlock_core::Lock, Error>, second: &str) {
    match result {
        Err(Error::Config(ConfigError::SameServer {
            first,
            second: other,
            run_id,
        })) => {
            assert!(
                first == second || other == second,
                "{first} / {other} is not {second}"
            );
            assert!(!run_id.is_empty());
        }
        Err(other) => panic!("expected ConfigError::SameServer, got {other:?}"),
        Ok(lock) => panic!(
            "granted on one server under two names (valid for {:?})",
            lock.validity()
        ),
    }
}

/// Nothing the refused attempts set (keys matching `pattern`) is left on the servers.
async fn no_keys_left(cluster: &Cluster, pattern: &str) {
    redlock_testkit::until(
        "the refused attempts' keys released",
        Duration::from_secs(5),
        || async { (cluster.count_keys(pattern).await == 0).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_name_slower_to_connect_is_refused_before_the_first_grant() {
    let cluster = Cluster::start(2).await;
    let alias = Proxy::start(cluster.node(0).addr()).await;
    alias.delay(ALIAS_DELAY);
    // Fresh clients: each one's first lock races the second name's first connection.
    for round in 0..10 {
        let redlock = client(vec![
            cluster.node(0).url(),
            alias.url(),
            cluster.node(1).url(),
        ]);
        let started = Instant::now();
        let result = redlock.try_lock(format!("alias-{round}")).await;
        let took = started.elapsed();
        assert_same_server(result, &alias.addr().to_string());
        assert!(took < NODE_TIMEOUT / 2, "round {round}: took {took:?}");
        // Refused from then on, at once.
        assert_same_server(redlock.try_lock("again").await, &alias.addr().to_string());
    }
    no_keys_left(&cluster, "redlock:*").await;
}

/// The plain case, without a proxy: `localhost` and `127.0.0.1`. The two names race
/// each other; neither may ever make a majority with the third node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localhost_and_loopback_never_grant() {
    let cluster = Cluster::start(2).await;
    let (a, b) = (cluster.node(0).port(), cluster.node(1).port());
    for round in 0..20 {
        let redlock = client(vec![
            format!("redis://localhost:{a}"),
            format!("redis://127.0.0.1:{a}"),
            format!("redis://127.0.0.1:{b}"),
        ]);
        match redlock.try_lock(format!("loopback-{round}")).await {
            Err(Error::Config(ConfigError::SameServer { .. })) => {}
            Err(other) => panic!("round {round}: expected ConfigError::SameServer, got {other:?}"),
            Ok(_) => panic!("round {round}: granted on one server under two names"),
        }
    }
    no_keys_left(&cluster, "redlock:*").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_name_unreachable_at_first_is_refused_on_its_first_connection() {
    let cluster = Cluster::start(2).await;
    let alias = Proxy::start(cluster.node(0).addr()).await;
    alias.cut();
    let redlock = client(vec![
        cluster.node(0).url(),
        alias.url(),
        cluster.node(1).url(),
    ]);
    // The second name does not answer: it does not vote, and the two others grant.
    let lock = redlock
        .try_lock("first")
        .await
        .expect("granted by the two others");
    assert!(lock.release().await.unwrap().was_held());

    // Its last failed connection attempt is over (a status waits for it).
    let status = redlock.node_status().await;
    assert!(status[1].reachable.is_err(), "{status:?}");
    // It comes up, slowly: its first connection is identified before a grant.
    alias.delay(ALIAS_DELAY);
    assert_same_server(redlock.try_lock("second").await, &alias.addr().to_string());
    no_keys_left(&cluster, "redlock:{second}*").await;
}

/// A TCP relay to one upstream at a time; switching it drops the connections open.
struct Switch {
    addr: SocketAddr,
    upstream: watch::Sender<SocketAddr>,
    accept: tokio::task::JoinHandle<()>,
}

impl Switch {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = watch::channel(upstream);
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut switched = rx.clone();
                let to = *switched.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(to).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = switched.changed() => {}
                    }
                });
            }
        });
        Self {
            addr,
            upstream: tx,
            accept,
        }
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    fn switch(&self, to: SocketAddr) {
        self.upstream.send_replace(to);
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_reconnecting_to_another_names_server_is_refused_before_a_grant() {
    let cluster = Cluster::start(3).await;
    // The second node's address leads to server 2, then (an address moved) to server 0,
    // slowly.
    let moving = Switch::start(cluster.node(2).addr()).await;
    let slow_to_zero = Proxy::start(cluster.node(0).addr()).await;
    slow_to_zero.delay(ALIAS_DELAY);
    let redlock = client(vec![
        cluster.node(0).url(),
        moving.url(),
        cluster.node(1).url(),
    ]);
    for _ in 0..3 {
        redlock_testkit::cycle(&redlock, "moving").await;
    }

    // The address goes nowhere for a moment: the second node's connection breaks, and
    // a status sees it (and fails to open a new one).
    let nowhere = Proxy::start(cluster.node(2).addr()).await;
    nowhere.cut();
    moving.switch(nowhere.addr());
    redlock_testkit::until(
        "the second node unreachable",
        Duration::from_secs(5),
        || async {
            redlock.node_status().await[1]
                .reachable
                .is_err()
                .then_some(())
        },
    )
    .await;
    // Then it leads to server 0: the second node's new connection is identified before
    // a grant.
    moving.switch(slow_to_zero.addr());
    assert_same_server(redlock.try_lock("moved").await, &moving.addr.to_string());
    no_keys_left(&cluster, "redlock:{moved}*").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_node_holds_up_no_decision() {
    let cluster = Cluster::start_proxied(3).await;
    // Connections to it open (the proxy accepts them) but never answer.
    cluster.proxy(2).blackhole();
    let redlock = client(cluster.urls());
    // Its first connection is waited for (100 ms), not for the node timeout.
    let started = Instant::now();
    redlock_testkit::cycle(&redlock, "one-down").await;
    let first = started.elapsed();
    assert!(first < NODE_TIMEOUT / 2, "first cycle took {first:?}");
    // Once that connection is older, nothing waits for it.
    let started = Instant::now();
    for _ in 0..10 {
        redlock_testkit::cycle(&redlock, "one-down").await;
    }
    let ten = started.elapsed();
    assert!(ten < NODE_TIMEOUT / 2, "ten cycles took {ten:?}");
    cluster.proxy(2).restore();
}

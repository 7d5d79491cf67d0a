//! The built `redlock` binary, run as a process against real `redis-server` nodes: the
//! lock listing, forced release, node health, unreachable nodes, configuration errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use redlock_testkit::Cluster;

mod common;
use common::{holder_client, nodes_of, run_cli};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_listed_and_released_by_force() {
    let cluster = Cluster::start(3).await;
    let nodes = nodes_of(&cluster);
    let redlock = holder_client(&cluster);
    let lock = redlock
        .lock("invoice:7")
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    let token = lock.fencing_token().expect("fencing is on");
    // The lock returns at its quorum: wait for the last node's key before counting it.
    cluster.settle_keys(&redlock.key_for("invoice:7"), 3).await;
    // As the nodes hold it (the counter may be above the token: an attempt that lost
    // counts too).
    let before = redlock.locks("invoice:").await.unwrap().locks.remove(0);

    // Human output: the resource, its holder, 3 of 3 nodes.
    let out = run_cli(&["locks", "--nodes", &nodes], &[]).await.expect(0);
    let row = out
        .stdout
        .lines()
        .find(|l| l.starts_with("invoice:7"))
        .unwrap_or_else(|| panic!("no row for the lock: {out:?}"));
    assert!(row.contains("billing-1"), "{row}");
    assert!(row.contains("majority") && row.contains("3/3"), "{row}");
    assert!(out.stdout.lines().next().unwrap().starts_with("RESOURCE"));

    // JSON, configured through REDLOCK_NODES as the services are.
    let listing = run_cli(
        &["locks", "invoice:", "--json"],
        &[("REDLOCK_NODES", &nodes)],
    )
    .await
    .expect(0)
    .json();
    let held = &listing["locks"][0];
    assert_eq!(listing["locks"].as_array().unwrap().len(), 1);
    assert_eq!(held["resource"], "invoice:7");
    assert_eq!(held["holder"], "billing-1");
    assert_eq!(held["agreement"], "majority");
    assert_eq!(held["holding"], 3);
    assert!(held["fencing_token"].as_u64().unwrap() >= token);
    let validity = held["validity_ms"].as_u64().unwrap();
    assert!(validity > 20_000 && validity <= 30_000, "{validity}");
    // The flag wins over the variable.
    let flagged = run_cli(
        &["locks", "--json", "--nodes", &nodes],
        &[("REDLOCK_NODES", "redis://127.0.0.1:1")],
    )
    .await
    .expect(0)
    .json();
    assert_eq!(flagged["locks"][0]["resource"], "invoice:7");
    // Another key prefix sees none of them.
    let other = run_cli(&["locks", "--nodes", &nodes, "--key-prefix", "other:"], &[])
        .await
        .expect(0);
    assert!(other.stdout.contains("no locks held"), "{other:?}");

    // Without --force: refused with what it would do, nothing changed.
    let refused = run_cli(&["release", "invoice:7", "--nodes", &nodes], &[])
        .await
        .expect(2);
    assert!(refused.stderr.starts_with("error: "), "{refused:?}");
    assert!(refused.stderr.contains("--force"), "{refused:?}");
    assert!(refused.stderr.contains("fencing"), "{refused:?}");
    assert!(refused.stdout.is_empty());
    let still = redlock.locks("invoice:").await.unwrap();
    assert_eq!(still.locks.len(), 1, "a refused release changes nothing");
    assert_eq!(still.locks[0].fencing_token, before.fencing_token);
    assert_eq!(still.locks[0].acquisition, before.acquisition);
    assert_eq!(still.locks[0].holding, 3);

    // With --force: gone on every node, and the token above the holder's.
    let released = run_cli(
        &[
            "release",
            "invoice:7",
            "--force",
            "--json",
            "--nodes",
            &nodes,
        ],
        &[],
    )
    .await
    .expect(0)
    .json();
    assert_eq!(released["resource"], "invoice:7");
    assert_eq!(released["deleted"], 3);
    let new_token = released["fencing_token"].as_u64().unwrap();
    assert!(new_token > token, "{new_token} > {token}");
    assert!(new_token > before.fencing_token.unwrap());
    assert!(redlock.locks("invoice:").await.unwrap().locks.is_empty());
    let listed = run_cli(&["locks", "--json", "--nodes", &nodes], &[])
        .await
        .expect(0)
        .json();
    assert!(listed["locks"].as_array().unwrap().is_empty());
    // The next holder's token is above the forced one.
    let next = redlock.lock("invoice:7").await.unwrap();
    assert!(next.fencing_token().unwrap() > new_token);
    cluster.settle_keys(&redlock.key_for("invoice:7"), 3).await;
    // Human output of a forced release: the count and the token.
    let human = run_cli(&["release", "invoice:7", "--force", "--nodes", &nodes], &[])
        .await
        .expect(0);
    assert!(
        human.stdout.contains("deleted on 3 of 3 nodes"),
        "{human:?}"
    );
    assert!(human.stdout.contains("fencing token now"), "{human:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_health_and_failures() {
    let started = Instant::now();
    let mut cluster = Cluster::start(3).await;
    let nodes = nodes_of(&cluster);
    let redlock = holder_client(&cluster);
    let _lock = redlock.lock("report").await.unwrap();
    // On every node before one is killed (the lock returns at its quorum).
    cluster.settle_keys(&redlock.key_for("report"), 3).await;

    let health = run_cli(&["nodes", "--json", "--nodes", &nodes], &[])
        .await
        .expect(0)
        .json();
    let health = health.as_array().unwrap();
    assert_eq!(health.len(), 3);
    for (node, port) in health.iter().zip((0..3).map(|i| cluster.node(i).port())) {
        assert_eq!(node["reachable"], true, "{node}");
        assert!(
            node["node"]
                .as_str()
                .unwrap()
                .ends_with(&format!(":{port}"))
        );
        assert!(node["latency_us"].as_u64().is_some(), "{node}");
        assert_eq!(node["role"], "master");
        assert!(node["version"].as_str().is_some_and(|v| !v.is_empty()));
        // Seconds-old nodes: in quarantine for clients whose longest TTL is 10 s.
        assert!(node["quarantined_ms"].as_u64().is_some(), "{node}");
    }
    let human = run_cli(&["nodes", "--nodes", &nodes], &[]).await.expect(0);
    assert!(human.stdout.starts_with("NODE"), "{human:?}");
    assert_eq!(
        human.stdout.lines().filter(|l| l.contains(" ok ")).count(),
        3,
        "{human:?}"
    );
    // With --max-ttl 1s, nodes up for 2 s (uptime is in whole seconds, and the
    // quarantine adds one) are out of quarantine.
    tokio::time::sleep_until((started + Duration::from_millis(2100)).into()).await;
    let short = run_cli(
        &["nodes", "--json", "--max-ttl", "1s", "--nodes", &nodes],
        &[],
    )
    .await
    .expect(0)
    .json();
    assert!(
        short
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["quarantined_ms"].is_null() && n["votes"] == true)
    );

    // One node down: the data, a warning naming it, exit code 3.
    let dead = cluster.node(2).port();
    cluster.node_mut(2).kill();
    let partial = run_cli(&["nodes", "--nodes", &nodes], &[]).await.expect(3);
    assert!(partial.stderr.starts_with("warning: "), "{partial:?}");
    assert!(partial.stderr.contains(&format!(":{dead}")), "{partial:?}");
    let row = partial
        .stdout
        .lines()
        .find(|l| l.contains(&format!(":{dead}")))
        .unwrap();
    assert!(row.contains("unreachable"), "{row}");
    let listing = run_cli(&["locks", "--json", "--nodes", &nodes], &[])
        .await
        .expect(3);
    assert!(listing.stderr.contains(&format!(":{dead}")), "{listing:?}");
    assert_eq!(listing.json()["locks"][0]["resource"], "report");

    // Every node down: exit code 1 and one line naming them all.
    let ports: Vec<u16> = (0..3).map(|i| cluster.node(i).port()).collect();
    cluster.node_mut(0).kill();
    cluster.node_mut(1).kill();
    let failed = run_cli(&["locks", "--nodes", &nodes], &[]).await.expect(1);
    assert!(failed.stdout.is_empty(), "{failed:?}");
    assert!(failed.stderr.starts_with("error: "), "{failed:?}");
    assert_eq!(failed.stderr.lines().count(), 1, "{failed:?}");
    for port in &ports {
        assert!(failed.stderr.contains(&format!(":{port}")), "{failed:?}");
    }
    let health = run_cli(&["nodes", "--json", "--nodes", &nodes], &[])
        .await
        .expect(1);
    assert!(
        health
            .json()
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["reachable"] == false)
    );
    let release = run_cli(&["release", "report", "--force", "--nodes", &nodes], &[])
        .await
        .expect(1);
    assert!(
        release.stderr.contains(&format!(":{}", ports[0])),
        "{release:?}"
    );
}

#[tokio::test]
async fn configuration_errors_name_the_flag_and_variable() {
    let nodes = run_cli(&["locks"], &[]).await.expect(1);
    assert!(nodes.stderr.contains("--nodes") && nodes.stderr.contains("REDLOCK_NODES"));
    let database = run_cli(&["jobs"], &[]).await.expect(1);
    assert!(database.stderr.contains("--database") && database.stderr.contains("DATABASE_URL"));

    // A database that cannot be opened: its place, not its password.
    let unreachable = run_cli(
        &[
            "jobs",
            "--database",
            "postgres://nobody:s3cret@127.0.0.1:1/x",
        ],
        &[],
    )
    .await
    .expect(1);
    assert!(unreachable.stderr.starts_with("error: "), "{unreachable:?}");
    assert!(
        unreachable.stderr.contains("127.0.0.1:1"),
        "{unreachable:?}"
    );
    assert!(!unreachable.stderr.contains("s3cret"), "{unreachable:?}");
    assert_eq!(unreachable.stderr.lines().count(), 1);
    let via_env = run_cli(
        &["jobs"],
        &[("DATABASE_URL", "postgres://nobody@127.0.0.1:1/x")],
    )
    .await
    .expect(1);
    assert!(via_env.stderr.contains("127.0.0.1:1"), "{via_env:?}");

    // A SQLite file that does not exist is not created.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    let url = format!("sqlite://{}", missing.display());
    let out = run_cli(&["jobs", "--database", &url], &[]).await.expect(1);
    assert!(out.stderr.contains("does not exist"), "{out:?}");
    assert!(!missing.exists());

    // Usage errors are clap's: exit code 2.
    run_cli(&["history"], &[]).await.expect(2);
    run_cli(&["history", "job", "--outcome", "great"], &[])
        .await
        .expect(2);
    run_cli(&["trigger", "job", "--wait", "soon"], &[])
        .await
        .expect(2);
    let help = run_cli(&["--help"], &[]).await.expect(0);
    assert!(help.stdout.contains("Exit codes:") && help.stdout.contains("3  partial"));
}

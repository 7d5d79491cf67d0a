//! A test process's servers end with it, also when it ends without running a
//! destructor: killed with `SIGKILL`, or by `std::process::exit`. Each test runs itself
//! again as a child process (with `REDLOCK_TESTKIT_ORPHAN` set) that starts servers of
//! every kind the kit starts, says where they are, and ends the way the test asks.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redlock_testkit::{Cluster, Persistence, RedisServer};

/// Set in the child: how it ends (`kill`: it waits to be killed; `exit`: it calls
/// `std::process::exit`).
const CHILD: &str = "REDLOCK_TESTKIT_ORPHAN";

/// The child: plain servers, a proxied one, and an AOF server started on a thread (with
/// a runtime of its own) that ends right after, which must live on all the same. Once
/// all answer, it prints their ports and pids, then ends as asked.
async fn child(end: &str) {
    let plain = Cluster::start(2).await;
    let proxied = Cluster::start_proxied(1).await;
    let from_thread = std::thread::spawn(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(RedisServer::start(Persistence::AofAlways))
    })
    .join()
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let servers = [plain.node(0), plain.node(1), proxied.node(0), &from_thread];
    for server in servers {
        let pong: Option<String> = server.query(&redis::cmd("PING")).await;
        assert_eq!(pong.as_deref(), Some("PONG"), "{server:?} answers");
    }
    let mut ports: Vec<u16> = servers.iter().map(|s| s.port()).collect();
    ports.push(proxied.proxy(0).addr().port());
    let pids: Vec<u32> = servers.iter().map(|s| s.pid().unwrap()).collect();
    let list = |items: &[String]| items.join(",");
    println!(
        "NODES ports={} pids={}",
        list(&ports.iter().map(u16::to_string).collect::<Vec<_>>()),
        list(&pids.iter().map(u32::to_string).collect::<Vec<_>>())
    );
    match end {
        "exit" => std::process::exit(3),
        _ => std::future::pending::<()>().await,
    }
}

/// Runs `test` of this binary as the child ending by `end`; returns it once it listed
/// its servers, with their ports and pids.
fn spawn_child(test: &str, end: &str) -> (Child, Vec<u16>, Vec<u32>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(CHILD, end)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(nodes) = line.strip_prefix("NODES ") {
                let _ = tx.send(nodes.to_owned());
            }
        }
    });
    let nodes = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the child started its servers");
    let field = |name: &str| -> Vec<String> {
        let value = nodes.split(' ').find_map(|f| f.strip_prefix(name)).unwrap();
        value.split(',').map(str::to_owned).collect()
    };
    let ports = field("ports=").iter().map(|p| p.parse().unwrap()).collect();
    let pids = field("pids=").iter().map(|p| p.parse().unwrap()).collect();
    (child, ports, pids)
}

fn answers(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Whether process `pid` still runs (a zombie, or no process, does not).
fn runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name, which is in parentheses.
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
    })
}

/// Every port stops answering and every process stops running, within 5 s.
fn assert_all_gone(ports: &[u16], pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let open: Vec<u16> = ports.iter().copied().filter(|&p| answers(p)).collect();
        let running: Vec<u32> = pids.iter().copied().filter(|&p| runs(p)).collect();
        if open.is_empty() && running.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            // Leave nothing behind, then fail.
            for pid in &running {
                let _ = Command::new("kill")
                    .arg("-KILL")
                    .arg(pid.to_string())
                    .status();
            }
            panic!(
                "5 s after the test process ended: ports {open:?} still answer, processes {running:?} still run"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Killed with `SIGKILL` (a CI job's timeout, an OOM kill): no destructor runs, the
/// servers end all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_end_with_a_killed_test_process() {
    if let Ok(end) = std::env::var(CHILD) {
        return child(&end).await;
    }
    let (mut child, ports, pids) = spawn_child("servers_end_with_a_killed_test_process", "kill");
    // Alive while the child is, the one started on a thread that ended included.
    for &port in &ports {
        assert!(answers(port), "port {port} answers while the child runs");
    }
    assert!(pids.iter().all(|&pid| runs(pid)), "{pids:?}");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_all_gone(&ports, &pids);
}

/// `std::process::exit` runs no destructor either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_end_with_a_test_process_that_exits() {
    if let Ok(end) = std::env::var(CHILD) {
        return child(&end).await;
    }
    let (mut child, ports, pids) =
        spawn_child("servers_end_with_a_test_process_that_exits", "exit");
    assert_eq!(child.wait().unwrap().code(), Some(3));
    assert_all_gone(&ports, &pids);
}

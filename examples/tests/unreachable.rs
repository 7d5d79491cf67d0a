//! Every example program, pointed at nodes that do not answer, exits non-zero within the
//! connect timeout and names the nodes as they were configured, instead of waiting
//! forever.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Runs `program` with `REDLOCK_NODES` naming unreachable nodes; its exit status, its
/// stderr and how long it ran.
fn run(program: &str, nodes: &str) -> (Option<i32>, String, Duration) {
    let started = Instant::now();
    let mut child = Command::new(program)
        .env("REDLOCK_NODES", nodes)
        .env("BENCH_SECS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a program that hangs is killed and reported.
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        started.elapsed(),
    )
}

#[test]
fn every_example_exits_non_zero_naming_unreachable_nodes() {
    let programs: [&'static str; 8] = [
        env!("CARGO_BIN_EXE_demo"),
        env!("CARGO_BIN_EXE_locks"),
        env!("CARGO_BIN_EXE_scheduler"),
        env!("CARGO_BIN_EXE_tower_axum"),
        env!("CARGO_BIN_EXE_actix"),
        env!("CARGO_BIN_EXE_bench"),
        env!("CARGO_BIN_EXE_bench_tower"),
        env!("CARGO_BIN_EXE_scheduler_bench"),
    ];
    let (a, b, c) = (closed_port(), closed_port(), closed_port());
    let nodes = format!("redis://127.0.0.1:{a},redis://localhost:{b},redis://127.0.0.1:{c}");
    let runs: Vec<_> = programs
        .into_iter()
        .map(|program| {
            let nodes = nodes.clone();
            std::thread::spawn(move || (program, run(program, &nodes)))
        })
        .collect();
    for handle in runs {
        let (program, (code, stderr, took)) = handle.join().unwrap();
        let name = program.rsplit('/').next().unwrap();
        assert!(
            code.is_some_and(|c| c != 0),
            "{name} exited with {code:?} after {took:?}: {stderr}"
        );
        // The connect timeout (5 s), and the program's start-up.
        assert!(took < Duration::from_secs(15), "{name} took {took:?}");
        for node in [format!("127.0.0.1:{a}"), format!("localhost:{b}")] {
            assert!(
                stderr.contains(&node),
                "{name} does not name {node}: {stderr}"
            );
        }
    }
}

//! The demo serves its metrics in Prometheus text format while it runs: scraped over
//! HTTP, the page has the scheduler's runs and the core's lock requests.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the demo when the test ends, however it ends.
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET http://{addr}{path}` over HTTP/1.0: the status line and the body.
fn get(addr: &str, path: &str) -> Option<(String, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_owned(), body.to_owned()))
}

#[test]
fn the_demo_serves_prometheus_metrics() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_demo"))
        .env("DEMO_METRICS_ADDR", "127.0.0.1:0")
        .env_remove("REDLOCK_NODES")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _demo = Demo(child);
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().unwrap().unwrap();
    let url = first
        .strip_prefix("metrics: http://")
        .unwrap_or_else(|| panic!("first line: {first}"));
    let (addr, path) = url.split_once('/').unwrap();
    let path = format!("/{path}");
    // Keep reading its output, so that it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((status, body)) = get(addr, &path) {
            assert!(status.contains(" 200 "), "{status}");
            let runs = body
                .lines()
                .any(|l| l.starts_with("redlock_scheduler_runs_total{") && !l.ends_with(" 0"));
            if runs {
                assert!(body.contains("# TYPE redlock_scheduler_runs_total counter"));
                assert!(body.contains("redlock_acquisitions_total{"), "{body}");
                assert!(body.contains("redlock_scheduler_leader "), "{body}");
                // The dashboard beside it shows the demo's jobs and nodes.
                let (status, page) = get(addr, "/admin/").expect("the dashboard answers");
                assert!(status.contains(" 200 "), "{status}");
                assert!(
                    page.contains("redlock demo") && page.contains("id=\"jobs\""),
                    "{page}"
                );
                assert!(page.contains("id=\"nodes\""), "{page}");
                return;
            }
        }
        assert!(Instant::now() < deadline, "no runs counted within 30 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

//! The `fencing` example, run as its README shows: a holder frozen with `SIGSTOP` past
//! its lock's validity is refused by every fenced store when it resumes, and its
//! unfenced control write goes through.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::process::Command;

#[test]
fn a_frozen_holder_is_refused_by_every_fenced_store() {
    let output = Command::new(env!("CARGO_BIN_EXE_fencing"))
        .env("RUST_LOG", "error")
        .env_remove("REDLOCK_NODES")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let stores = if std::env::var("DATABASE_URL").is_ok_and(|u| !u.is_empty()) {
        3
    } else {
        2
    };
    let counts = format!("stale fenced writes: {stores} attempted, 0 accepted, {stores} refused");
    assert!(stdout.contains(&counts), "{stdout}");
    let refused = stdout
        .lines()
        .filter(|l| {
            l.trim_start().starts_with("WRITE holder ")
                && l.contains(" fenced ")
                && l.contains(" refused: stale fencing token ")
        })
        .count();
    assert_eq!(refused, stores, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "stale unfenced writes: {stores} of {stores} accepted"
        )),
        "the control: {stdout}"
    );
}

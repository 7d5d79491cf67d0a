//! What the CLI's tests share: running the built binary with a clean environment, and
//! a lock client.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::time::Duration;

use redlock_core::Redlock;
use redlock_testkit::Cluster;
use serde_json::Value;

/// The variables the binary reads: cleared for every run, so that the environment the
/// tests run in (a `DATABASE_URL` for the PostgreSQL tests, say) does not leak in.
const VARIABLES: [&str; 7] = [
    "REDLOCK_NODES",
    "REDLOCK_KEY_PREFIX",
    "REDLOCK_MAX_TTL",
    "DATABASE_URL",
    "REDLOCK_SCHEDULER",
    "REDLOCK_OPERATOR",
    "REDLOCK_TIMEOUT",
];

/// What a run of the binary printed, and its exit code.
#[derive(Debug)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|err| panic!("stdout is not JSON ({err}): {self:?}"))
    }

    pub fn expect(self, code: i32) -> Self {
        assert_eq!(self.code, code, "exit code of {self:#?}");
        self
    }
}

/// Runs `redlock ARGS` with only the variables in `env` set.
pub async fn run_cli(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_redlock"));
    for variable in VARIABLES {
        command.env_remove(variable);
    }
    command
        .args(args)
        .envs(env.iter().copied())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .unwrap_or_else(|_| panic!("redlock {args:?} did not end within 30s"))
        .expect("the binary runs");
    Output {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

/// `--nodes URLS` for `cluster`.
pub fn nodes_of(cluster: &Cluster) -> String {
    cluster.urls().join(",")
}

/// A fenced client named `billing-1` over `cluster`.
pub fn holder_client(cluster: &Cluster) -> Redlock {
    redlock_testkit::builder(cluster)
        .holder("billing-1")
        .fencing(true)
        .build()
        .unwrap()
}

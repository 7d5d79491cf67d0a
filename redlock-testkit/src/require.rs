//! What a test needs besides `redis-server`, checked when the test runs.
//!
//! A few tests need a program (`faketime`, `openssl`, a browser and its WebDriver) or a
//! PostgreSQL database (`DATABASE_URL`). Each asks for it first thing, and gets its path
//! or URL, or `None` when it is missing:
//!
//! ```
//! use redlock_testkit::require;
//!
//! // In an integration test, under `#[test]`:
//! fn a_skewed_clock() {
//!     let Some(faketime) = require::program("faketime", "faketime") else {
//!         return;
//!     };
//!     let _child = std::process::Command::new(faketime).arg("-f").arg("-60s");
//!     // ...
//! }
//! ```
//!
//! When it is missing, the test:
//!
//! - returns early, after a line on the process's standard error (written past the
//!   test harness's capture, so that `cargo test` shows it):
//!
//!   ```text
//!   SKIPPED a_skewed_clock: faketime is not on PATH (Debian: apt-get install faketime)
//!   ```
//!
//!   It is reported as passed: the `SKIPPED` line is the only trace;
//! - or, with `REDLOCK_REQUIRE_ALL_TESTS` set (to anything but empty or `0`, as CI
//!   does), fails, with a message that names what is missing and how to install it.
//!
//! The check runs in the test, not at build time: the crates themselves have no build
//! script, and installing a program (or setting `DATABASE_URL`) needs no rebuild.
//! A program is looked for in each folder of `PATH`, once per call.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The variable that turns a missing prerequisite into a failed test.
pub const REQUIRE_ALL_VAR: &str = "REDLOCK_REQUIRE_ALL_TESTS";

/// The variable that holds the URL of the PostgreSQL database the tests may use.
const DATABASE_URL_VAR: &str = "DATABASE_URL";

/// The start of the line a skipped test writes to standard error (CI fails on it).
pub const SKIPPED: &str = "SKIPPED";

/// `program`'s path in a folder of `PATH`, or `None` (after a `SKIPPED` line) when it
/// is not there. `package` is the Debian package that installs it, for the message.
///
/// # Panics
///
/// When the program is missing and `REDLOCK_REQUIRE_ALL_TESTS` is set.
#[must_use]
#[track_caller]
pub fn program(program: &str, package: &str) -> Option<PathBuf> {
    let found = find(program);
    if found.is_none() {
        missing(&format!(
            "{program} is not on PATH (Debian: apt-get install {package})"
        ));
    }
    found
}

/// The path of the first of `programs` found in `PATH`'s folders, or `None` (after a
/// `SKIPPED` line) when none is there: for a test that can use any one of them (e.g.
/// a browser: `chromium`, `google-chrome`, ...). `package` is the Debian package that
/// installs one, for the message.
///
/// # Panics
///
/// When none is found and `REDLOCK_REQUIRE_ALL_TESTS` is set.
#[must_use]
#[track_caller]
pub fn programs_any(programs: &[&str], package: &str) -> Option<PathBuf> {
    let found = programs.iter().find_map(|program| find(program));
    if found.is_none() {
        missing(&format!(
            "none of {} is on PATH (Debian: apt-get install {package})",
            programs.join(", ")
        ));
    }
    found
}

/// `DATABASE_URL`, the PostgreSQL database the tests may create tables in, or `None`
/// (after a `SKIPPED` line) when it is unset or empty.
///
/// # Panics
///
/// When it is unset and `REDLOCK_REQUIRE_ALL_TESTS` is set.
#[must_use]
#[track_caller]
pub fn database_url() -> Option<String> {
    match std::env::var(DATABASE_URL_VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            missing(
                "DATABASE_URL is not set (a PostgreSQL database the test may create \
                 tables in; Debian: apt-get install postgresql, then e.g. \
                 DATABASE_URL=postgres://postgres@127.0.0.1:5432/test)",
            );
            None
        }
    }
}

/// Whether `REDLOCK_REQUIRE_ALL_TESTS` asks for every test to run: set, and neither
/// empty nor `0`.
#[must_use]
pub fn all_required() -> bool {
    std::env::var_os(REQUIRE_ALL_VAR).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Fails the test when every test must run, else says that it is skipped.
#[allow(clippy::panic)] // a test that must run and cannot fails
#[track_caller]
fn missing(what: &str) {
    let test = current_test();
    if all_required() {
        panic!("{REQUIRE_ALL_VAR} is set but {test} cannot run: {what}");
    }
    // Straight to the process's stderr: the harness captures `eprintln!`, and shows a
    // passed test's output only with `--nocapture`.
    let _ = writeln!(std::io::stderr().lock(), "{SKIPPED} {test}: {what}");
}

/// The running test's name: the test harness names each test's thread after it.
fn current_test() -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => name.to_owned(),
        _ => "a test".to_owned(),
    }
}

/// `program`'s path in `PATH`'s folders, if it is there and executable.
fn find(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(OsStr::new(program)))
        .find(|candidate| is_executable(candidate))
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file() || path.with_extension("exe").is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_program_on_path() {
        // `sh` is on every unix machine the kit runs on.
        #[cfg(unix)]
        assert!(find("sh").is_some());
        assert!(find("redlock-no-such-program").is_none());
    }
}

//! Tells the tests whether a browser they can drive is on `PATH`: without `chromedriver`
//! and chromium (or Chrome), the dashboard's browser test (`tests/browser.rs`) is marked
//! ignored, with the reason and the Debian packages, instead of failing.
//!
//! The check reruns when `PATH` changes, when a program found is removed, and when a
//! program appears in one of `PATH`'s folders while one is missing. With
//! `REDLOCK_REQUIRE_ALL_TESTS=1` (CI sets it) a missing program fails the build instead.

use std::path::{Path, PathBuf};

/// The WebDriver server, and the browsers it can start (any one will do).
const DRIVER: &str = "chromedriver";
const BROWSERS: &[&str] = &[
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-env-changed=REDLOCK_REQUIRE_ALL_TESTS");
    println!("cargo::rustc-check-cfg=cfg(has_chromium)");
    let driver = find(DRIVER);
    let browser = BROWSERS.iter().find_map(|browser| find(browser));
    for path in driver.iter().chain(&browser) {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    if driver.is_some() && browser.is_some() {
        println!("cargo::rustc-cfg=has_chromium");
        return;
    }
    if required() {
        eprintln!(
            "REDLOCK_REQUIRE_ALL_TESTS is set but {} is not on PATH (the browser test \
             would be ignored). Debian: apt-get install chromium chromium-driver",
            if driver.is_none() { DRIVER } else { "chromium" },
        );
        std::process::exit(1);
    }
    watch_path_folders();
}

/// Whether `REDLOCK_REQUIRE_ALL_TESTS` asks for every test to run.
fn required() -> bool {
    std::env::var_os("REDLOCK_REQUIRE_ALL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// `program`'s path in `PATH`'s folders, if it is there and executable.
fn find(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
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

/// Reruns the check when a file is added to one of `PATH`'s folders (installing a
/// program changes its folder's modification time). Only in a checkout: a packaged copy
/// (crates.io's, with its `Cargo.toml.orig`) is built as a dependency, whose tests do not
/// run, and its users' installs should not rebuild it.
fn watch_path_folders() {
    if Path::new("Cargo.toml.orig").exists() {
        return;
    }
    let Some(path) = std::env::var_os("PATH") else {
        return;
    };
    for dir in std::env::split_paths(&path) {
        // A folder that does not exist would rerun the check on every build.
        if dir.is_absolute() && dir.is_dir() {
            println!("cargo::rerun-if-changed={}", dir.display());
        }
    }
}

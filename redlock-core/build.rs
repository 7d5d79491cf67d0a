//! Tells the tests which of the programs they run are on `PATH`: without `faketime` (the
//! skewed-clock queue test) or `openssl` (the TLS test's certificates), those tests are
//! marked ignored, with the reason and the Debian package, instead of failing.
//!
//! The check reruns when `PATH` changes, when a program found is removed, and when a
//! program appears in one of `PATH`'s folders while one is missing. With
//! `REDLOCK_REQUIRE_ALL_TESTS=1` (CI sets it) a missing program fails the build instead.

use std::path::{Path, PathBuf};

/// The cfg set when the program is found, the program, and its Debian package.
const TOOLS: &[(&str, &str, &str)] = &[
    ("has_faketime", "faketime", "faketime"),
    ("has_openssl", "openssl", "openssl"),
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-env-changed=REDLOCK_REQUIRE_ALL_TESTS");
    let mut missing = Vec::new();
    for &(cfg, program, package) in TOOLS {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        match find(program) {
            Some(path) => {
                println!("cargo::rustc-cfg={cfg}");
                println!("cargo::rerun-if-changed={}", path.display());
            }
            None => missing.push((program, package)),
        }
    }
    if missing.is_empty() {
        return;
    }
    if required() {
        let packages: Vec<&str> = missing.iter().map(|&(_, package)| package).collect();
        let programs: Vec<&str> = missing.iter().map(|&(program, _)| program).collect();
        eprintln!(
            "REDLOCK_REQUIRE_ALL_TESTS is set but these programs are not on PATH: {} \
             (their tests would be ignored). Debian: apt-get install {}",
            programs.join(", "),
            packages.join(" "),
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

//! Tells the tests whether a PostgreSQL server is configured: with `DATABASE_URL` unset
//! at build time, the PostgreSQL tests are marked ignored (and say why) instead of
//! passing without running. With `REDLOCK_REQUIRE_ALL_TESTS=1` (CI sets it) an unset
//! `DATABASE_URL` fails the build instead.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=DATABASE_URL");
    println!("cargo::rerun-if-env-changed=REDLOCK_REQUIRE_ALL_TESTS");
    println!("cargo::rustc-check-cfg=cfg(database_url)");
    if std::env::var_os("DATABASE_URL").is_some_and(|url| !url.is_empty()) {
        println!("cargo::rustc-cfg=database_url");
    } else if std::env::var_os("REDLOCK_REQUIRE_ALL_TESTS")
        .is_some_and(|v| !v.is_empty() && v != "0")
    {
        eprintln!(
            "REDLOCK_REQUIRE_ALL_TESTS is set and DATABASE_URL is not: the PostgreSQL tests \
             would be ignored. Debian: apt-get install postgresql, then e.g. \
             DATABASE_URL=postgres://postgres@127.0.0.1:5432/test"
        );
        std::process::exit(1);
    }
}

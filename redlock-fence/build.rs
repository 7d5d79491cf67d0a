//! Tells the tests whether a PostgreSQL server is configured: with `DATABASE_URL` unset
//! at build time, the PostgreSQL tests are marked ignored (and say why) instead of
//! passing without running.

fn main() {
    println!("cargo::rerun-if-env-changed=DATABASE_URL");
    println!("cargo::rustc-check-cfg=cfg(database_url)");
    if std::env::var_os("DATABASE_URL").is_some_and(|url| !url.is_empty()) {
        println!("cargo::rustc-cfg=database_url");
    }
}

//! The dashboard in a real browser: headless chromium, driven through chromedriver
//! (WebDriver), against real redis-server nodes, a SQLite history and a running
//! scheduler. The page shows a held lock and a job's last run; Enter in the token field
//! submits nothing; its pause button, with the admin token typed in, pauses the job (the
//! token posted in the form's body), and the next tick is recorded as skipped.
//!
//! Needs `chromedriver` and chromium (or Chrome) on `PATH` (Debian: `apt-get install
//! chromium chromium-driver`; `.ci/run` installs them): where they are missing the test
//! says so and returns (`redlock_testkit::require`), or fails under
//! `REDLOCK_REQUIRE_ALL_TESTS=1`. With
//! `REDLOCK_SCREENSHOT=<path>` it saves a screenshot of the dashboard there (the one in
//! `docs/` comes from it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::key::Key;
use fantoccini::{ClientBuilder, Locator};
use redlock_admin::Admin;
use redlock_scheduler::admin::SchedulerAdmin;
use redlock_scheduler::history::{Outcome, RunFilter};
use redlock_scheduler::{History, Job, JobContext, Scheduler};
use redlock_testkit::{Cluster, require};

const TOKEN: &str = "browser-token-0123456789";

/// The browsers chromedriver can start; any one will do.
const BROWSERS: &[&str] = &[
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
];

mod common;
use common::{redlock, scheduler, serve_axum, until, until_skipped_as_paused};

/// chromedriver, stopped when dropped.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start_driver(chromedriver: &Path) -> (Driver, String) {
    let port = free_port();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run chromedriver (Debian: apt-get install chromium chromium-driver)");
    let driver = Driver(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "chromedriver did not listen within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (driver, format!("http://127.0.0.1:{port}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_locks_and_runs_and_its_pause_button_pauses() {
    let Some(chromedriver) = require::program("chromedriver", "chromium-driver") else {
        return;
    };
    let Some(_) = require::programs_any(BROWSERS, "chromium") else {
        return;
    };
    let (_driver, webdriver) = start_driver(&chromedriver).await;
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let nightly = Job::new("nightly-report", "0 0 3 * * *", |_ctx: JobContext| async {
        Ok::<_, std::convert::Infallible>(())
    })
    .time_zone("Europe/Paris");
    let (scheduler, url) = scheduler(&cluster, dir.path(), vec![nightly]).await;
    let history = SchedulerAdmin::new(
        History::connect(&url).await.unwrap(),
        Scheduler::DEFAULT_NAME,
    );
    let payments = redlock(&cluster, "payments-api-3");
    let _lock = payments
        .lock("invoice:2026-0042")
        .ttl(Duration::from_secs(60))
        .await
        .unwrap();
    let admin = Admin::builder()
        .redlock(payments.clone())
        .scheduler(history.clone())
        .allow_mutations(TOKEN)
        .title("redlock — payments")
        .build()
        .unwrap();
    let base = serve_axum(admin).await;
    let succeeded = RunFilter::new().job("ticker").outcome(Outcome::Succeeded);
    until("a run of ticker", async || {
        history.runs(&succeeded).await.is_ok_and(|r| r.len() >= 2)
    })
    .await;

    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_owned(),
        serde_json::json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1100"]}),
    );
    let browser = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&webdriver)
        .await
        .expect("a chromium session through chromedriver");
    // Not reloading while the test types into the page.
    let dashboard = format!("{base}/?refresh=off");
    browser.goto(&dashboard).await.unwrap();
    assert_eq!(browser.title().await.unwrap(), "redlock — payments");

    // The held lock and its holder.
    let resource = browser
        .find(Locator::Css("#locks tr.lock td.resource"))
        .await
        .unwrap();
    assert_eq!(resource.text().await.unwrap(), "invoice:2026-0042");
    let holder = browser
        .find(Locator::Css("#locks tr.lock td.holder"))
        .await
        .unwrap();
    assert_eq!(holder.text().await.unwrap(), "payments-api-3");
    // The job's last run (reloading while the latest tick is still running).
    until(
        "the page showing ticker's last run as succeeded",
        async || {
            browser.goto(&dashboard).await.unwrap();
            let last = browser
                .find(Locator::Css("tr[data-job='ticker'] td.last-run"))
                .await;
            let last = last.unwrap().text().await.unwrap();
            last.starts_with("succeeded")
        },
    )
    .await;
    assert!(
        browser
            .find(Locator::Css("#leader"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
            .contains("replica-1")
    );

    if let Some(path) = std::env::var_os("REDLOCK_SCREENSHOT") {
        let png = browser.screenshot().await.unwrap();
        std::fs::write(&path, png).unwrap();
    }

    // Type the token and press Enter: no button is pressed for it (the first one on
    // the page releases a lock).
    let token = browser.find(Locator::Id("token")).await.unwrap();
    token.send_keys(&(TOKEN + &Key::Enter)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(browser.current_url().await.unwrap().as_str(), dashboard);
    assert_eq!(payments.locks("invoice:").await.unwrap().locks.len(), 1);
    assert!(!history.job("ticker").await.unwrap().paused);

    // Press the job's pause button.
    let paused_at = chrono::Utc::now();
    browser
        .find(Locator::Css("tr[data-job='ticker'] button.pause"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // The button's form post answers with a redirect back to the dashboard: wait for
    // that page, not the one the click left.
    let notice = browser
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Id("notice"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(notice.starts_with("done"), "{notice}");
    // The token went in the body: the page the redirect led to does not carry it.
    let url = browser.current_url().await.unwrap();
    assert!(!url.as_str().contains(TOKEN), "{url}");
    let state = browser
        .find(Locator::Css("tr[data-job='ticker'] td.state"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(state, "paused");
    assert!(history.job("ticker").await.unwrap().paused);
    until_skipped_as_paused(&history, paused_at).await;
    // The skipped tick shows in the recent runs.
    browser.goto(&dashboard).await.unwrap();
    let runs = browser
        .find(Locator::Id("runs"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(runs.contains("skipped"), "{runs}");
    browser.close().await.unwrap();
    scheduler.shutdown(Duration::from_secs(5)).await;
}

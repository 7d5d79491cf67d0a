//! Fencing shown: a lock holder frozen with `SIGSTOP` past its lock's validity wakes up
//! and writes, and the storage refuses it.
//!
//! ```text
//! cargo run -p redlock-examples --bin fencing
//! ```
//!
//! Starts 3 local lock nodes (unless `REDLOCK_NODES` lists some) and a separate data
//! Redis, and uses a SQLite file (and the PostgreSQL at `DATABASE_URL`, if set) as
//! stores. Then:
//!
//! 1. a holder process (this program again, as a child) takes the lock `account-<pid>`
//!    (1 s TTL, fencing on) and sets out to write the account's balance;
//! 2. it is frozen with `SIGSTOP` before it writes, for 3 s: its lock expires;
//! 3. another client takes the lock (a higher token) and writes the balance to every
//!    store, through the fence;
//! 4. the holder is resumed with `SIGCONT` and writes, unaware of the pause: through the
//!    fence to every store, and once without the fence (the control).
//!
//! It prints each write and the counts, and exits non-zero unless every stale fenced
//! write was refused and the unfenced one went through (the danger fencing removes).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redis::AsyncCommands;
use redlock_core::{Redlock, RetryPolicy};
use redlock_examples::Nodes;
use redlock_fence::{FenceError, RedisFence, SqlFence};
use redlock_testkit::{Persistence, RedisServer};
use sqlx::{AnyPool, Connection};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The holder's lock TTL, and how long it stays frozen.
const TTL: Duration = Duration::from_secs(1);
const FROZEN: Duration = Duration::from_secs(3);

/// Where the stores are, handed to the holder process through its environment.
struct Stores {
    resource: String,
    data_redis: String,
    sql: Vec<(String, String)>,
}

impl Stores {
    fn from_env() -> Result<Self, BoxError> {
        let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
        let sql = var("FENCING_SQL")?
            .split('|')
            .filter_map(|pair| pair.split_once('='))
            .map(|(name, url)| (name.to_owned(), url.to_owned()))
            .collect();
        Ok(Self {
            resource: var("FENCING_RESOURCE")?,
            data_redis: var("FENCING_DATA_REDIS")?,
            sql,
        })
    }

    fn to_env(&self) -> Vec<(&'static str, String)> {
        let sql = self
            .sql
            .iter()
            .map(|(name, url)| format!("{name}={url}"))
            .collect::<Vec<_>>()
            .join("|");
        vec![
            ("FENCING_RESOURCE", self.resource.clone()),
            ("FENCING_DATA_REDIS", self.data_redis.clone()),
            ("FENCING_SQL", sql),
        ]
    }
}

fn client(nodes: Vec<String>) -> Result<Redlock, BoxError> {
    Ok(Redlock::builder()
        .nodes(nodes)
        .ttl(TTL)
        .fencing(true)
        .restart_quarantine(false) // nodes started for this run
        .retry(RetryPolicy::deadline(Duration::from_secs(10)))
        .build()?)
}

/// One write's answer, as a line the driver reads.
fn report(who: &str, store: &str, fenced: bool, token: u64, answer: &Result<(), FenceError>) {
    let kind = if fenced { "fenced" } else { "plain" };
    match answer {
        Ok(()) => println!("WRITE {who} {store} {kind} {token} accepted"),
        Err(err) => println!("WRITE {who} {store} {kind} {token} refused: {err}"),
    }
}

/// Writes `balance` under `token` to every store (through the fence if `fenced`).
async fn write_all(
    who: &str,
    stores: &Stores,
    token: u64,
    balance: i64,
    fenced: bool,
) -> Result<(), BoxError> {
    let resource = &stores.resource;
    for (name, url) in &stores.sql {
        let pool = AnyPool::connect(url).await?;
        let mut tx = pool.begin().await?;
        let checked = if fenced {
            SqlFence::new().check(&mut *tx, resource, token).await
        } else {
            Ok(())
        };
        if checked.is_ok() {
            sqlx::query("UPDATE fencing_accounts SET balance = $1, written_by = $2 WHERE id = $3")
                .bind(balance)
                .bind(who)
                .bind(resource.as_str())
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        report(who, name, fenced, token, &checked);
    }
    let mut redis = redis::Client::open(stores.data_redis.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let key = format!("{{{resource}}}:balance");
    let answer = if fenced {
        RedisFence::new()
            .set(
                &mut redis,
                resource,
                token,
                &key,
                format!("{balance} by {who}"),
                None,
            )
            .await
    } else {
        let () = redis.set(&key, format!("{balance} by {who}")).await?;
        Ok(())
    };
    report(who, "redis", fenced, token, &answer);
    Ok(())
}

/// The holder process: takes the lock, says so, "works" for a moment (it is frozen
/// then), and writes without looking at the clock.
async fn holder() -> Result<(), BoxError> {
    let stores = Stores::from_env()?;
    let nodes: Vec<String> = std::env::var("FENCING_NODES")?
        .split(',')
        .map(str::to_owned)
        .collect();
    let redlock = client(nodes)?;
    let lock = redlock.lock(&stores.resource).await?;
    let token = lock.fencing_token().ok_or("no fencing token")?;
    println!("ACQUIRED {token}");
    tokio::time::sleep(Duration::from_millis(500)).await; // frozen in here
    write_all("holder", &stores, token, 100, true).await?;
    write_all("holder", &stores, token, 100, false).await?;
    println!("DONE");
    Ok(())
}

async fn prepare(url: &str, resource: &str) -> Result<(), BoxError> {
    let mut db = sqlx::AnyConnection::connect(url).await?;
    SqlFence::new().migrate(&mut db).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS fencing_accounts
         (id TEXT PRIMARY KEY, balance BIGINT NOT NULL, written_by TEXT NOT NULL)",
    )
    .execute(&mut db)
    .await?;
    sqlx::query("INSERT INTO fencing_accounts (id, balance, written_by) VALUES ($1, 0, 'nobody')")
        .bind(resource)
        .execute(&mut db)
        .await?;
    Ok(())
}

async fn balance(url: &str, resource: &str) -> Result<(i64, String), BoxError> {
    let mut db = sqlx::AnyConnection::connect(url).await?;
    Ok(
        sqlx::query_as("SELECT balance, written_by FROM fencing_accounts WHERE id = $1")
            .bind(resource)
            .fetch_one(&mut db)
            .await?,
    )
}

async fn driver() -> Result<bool, BoxError> {
    let nodes = Nodes::from_env_or_start(3).await;
    let data = RedisServer::start(Persistence::AofAlways).await;
    let dir = tempfile::tempdir()?;
    let resource = format!("account-{}", std::process::id());
    let mut sql = vec![(
        "sqlite".to_owned(),
        format!("sqlite://{}?mode=rwc", dir.path().join("bank.db").display()),
    )];
    if let Ok(url) = std::env::var("DATABASE_URL")
        && !url.is_empty()
    {
        sql.push(("postgres".to_owned(), url));
    }
    let stores = Stores {
        resource: resource.clone(),
        data_redis: data.url(),
        sql,
    };
    for (_, url) in &stores.sql {
        prepare(url, &resource).await?;
    }
    println!(
        "lock nodes: {}; data Redis {}; SQL: {}",
        nodes.describe(),
        data.addr(),
        stores
            .sql
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );

    let mut child = Command::new(std::env::current_exe()?)
        .arg("--holder")
        .env("FENCING_NODES", nodes.urls().join(","))
        .envs(stores.to_env())
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let first = tokio::time::timeout(Duration::from_secs(15), lines.recv())
        .await?
        .ok_or("the holder exited before taking the lock")?;
    let holder_token: u64 = first
        .strip_prefix("ACQUIRED ")
        .ok_or_else(|| format!("the holder said `{first}`"))?
        .parse()?;
    let pid = Pid::from_raw(i32::try_from(child.id())?);
    kill(pid, Signal::SIGSTOP)?;
    println!("holder took the lock (token {holder_token}) and was frozen (SIGSTOP) for {FROZEN:?}");

    // Meanwhile: the lock expires, another client takes it and writes.
    let redlock = client(nodes.urls())?;
    let lock = redlock.lock(&resource).await?;
    let token = lock.fencing_token().ok_or("no fencing token")?;
    println!("another client took the lock after it expired (token {token}) and writes:");
    write_all("other", &stores, token, 200, true).await?;
    let _ = lock.release().await;
    tokio::time::sleep(FROZEN.saturating_sub(TTL)).await;

    kill(pid, Signal::SIGCONT)?;
    println!("holder resumed (SIGCONT); it writes, unaware of the pause:");
    let mut writes = Vec::new();
    while let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(15), lines.recv()).await {
        if line == "DONE" {
            break;
        }
        println!("  {line}");
        writes.push(line);
    }
    let status = child.wait()?;
    let stale_fenced: Vec<_> = writes.iter().filter(|w| w.contains(" fenced ")).collect();
    let accepted = stale_fenced
        .iter()
        .filter(|w| w.ends_with("accepted"))
        .count();
    let refused = stale_fenced
        .iter()
        .filter(|w| w.contains("refused"))
        .count();
    let plain_accepted = writes
        .iter()
        .filter(|w| w.contains(" plain ") && w.ends_with("accepted"))
        .count();
    println!(
        "stale fenced writes: {} attempted, {accepted} accepted, {refused} refused; \
         stale unfenced writes: {plain_accepted} of {} accepted (they overwrote the newer holder's balance)",
        stale_fenced.len(),
        writes.len() - stale_fenced.len()
    );
    println!("balances now (the unfenced control's stale writes came last):");
    for (name, url) in &stores.sql {
        let (balance, by) = balance(url, &resource).await?;
        println!("  {name}: {balance}, written by {by}");
    }
    let stores_n = stores.sql.len() + 1;
    Ok(status.success()
        && stale_fenced.len() == stores_n
        && accepted == 0
        && refused == stores_n
        && plain_accepted == stores_n)
}

#[tokio::main]
async fn main() {
    sqlx::any::install_default_drivers();
    let holder_mode = std::env::args().nth(1).as_deref() == Some("--holder");
    if !holder_mode {
        // The holder's stdout is for the lines the driver reads.
        redlock_examples::init_tracing();
    }
    let result = if holder_mode {
        holder().await.map(|()| true)
    } else {
        driver().await
    };
    match result {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("FAILED: a stale fenced write went through, or the control did not");
            std::process::exit(1);
        }
        Err(err) => {
            eprintln!("error: {err}");
            std::process::exit(1);
        }
    }
}

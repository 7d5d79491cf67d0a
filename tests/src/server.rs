//! One real `redis-server` process.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a server keeps on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// Nothing: a restart forgets every key (the default for lock tests).
    None,
    /// Append-only file with `appendfsync always`: a restart keeps every acknowledged write.
    AofAlways,
}

/// A `redis-server` on a free loopback port, killed when dropped.
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    persistence: Persistence,
    child: Option<Child>,
    paused: AtomicBool,
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("running", &self.child.is_some())
            .finish()
    }
}

fn redis_server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port");
    listener.local_addr().expect("local addr").port()
}

impl RedisServer {
    /// Starts a server and waits until it answers `PING`.
    pub async fn start(persistence: Persistence) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("redlock-test-")
            .tempdir()
            .expect("create a temporary directory");
        let mut server = Self {
            port: 0,
            dir,
            persistence,
            child: None,
            paused: AtomicBool::new(false),
        };
        // Another process may grab the port between our probe and redis' bind: retry.
        for _ in 0..10 {
            server.port = free_port();
            if server.spawn_and_wait().await {
                return server;
            }
        }
        panic!(
            "redis-server did not start; is it installed? log:\n{}",
            server.log_tail(40)
        );
    }

    /// Spawns the process on `self.port`; true once it answers.
    async fn spawn_and_wait(&mut self) -> bool {
        let mut cmd = Command::new(redis_server_binary());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--protected-mode")
            .arg("no")
            .arg("--daemonize")
            .arg("no")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .arg("--save")
            .arg("");
        match self.persistence {
            Persistence::None => {
                cmd.arg("--appendonly").arg("no");
            }
            Persistence::AofAlways => {
                cmd.arg("--appendonly")
                    .arg("yes")
                    .arg("--appendfsync")
                    .arg("always");
            }
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = match cmd.spawn() {
            Ok(child) => child,
            Err(err) => panic!(
                "cannot run `{}` ({err}): install redis-server (Debian: apt-get install redis-server) or set REDIS_SERVER",
                redis_server_binary()
            ),
        };
        self.child = Some(child);
        self.paused.store(false, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_status)) = child.try_wait()
            {
                self.child = None;
                return false; // exited: most likely the port was taken
            }
            if ping(self.addr()).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.stop_process();
        false
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process runs (paused counts as running).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn signal(&self, signal: Signal) {
        if let Some(pid) = self.pid() {
            let pid = Pid::from_raw(i32::try_from(pid).expect("pid fits in i32"));
            kill(pid, signal).expect("signal redis-server");
        }
    }

    /// Freezes the process (`SIGSTOP`): connections stay open, nothing is answered.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
        self.paused.store(true, Ordering::SeqCst);
    }

    /// Lets a paused process run again (`SIGCONT`).
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Kills the process (`SIGKILL`, no shutdown, no final save).
    pub fn kill(&mut self) {
        self.stop_process();
    }

    fn stop_process(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Kills the process if it runs, then starts it again on the same port and
    /// directory. With [`Persistence::None`] it comes back empty; with
    /// [`Persistence::AofAlways`] it reloads every acknowledged write.
    pub async fn restart(&mut self) {
        self.stop_process();
        for _ in 0..50 {
            if self.spawn_and_wait().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "redis-server did not restart on port {}; log:\n{}",
            self.port,
            self.log_tail(40)
        );
    }

    /// A client for inspecting the server directly.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid URL")
    }

    /// Every key matching `pattern`; `None` if the server does not answer within 1 s.
    pub async fn keys(&self, pattern: &str) -> Option<Vec<String>> {
        self.query(redis::cmd("KEYS").arg(pattern)).await
    }

    /// Runs one command with a 1 s bound; `None` if the server does not answer in time
    /// or answers with an error.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Option<T> {
        let client = self.client();
        let run = async {
            let mut conn = client.get_multiplexed_async_connection().await.ok()?;
            cmd.query_async::<T>(&mut conn).await.ok()
        };
        tokio::time::timeout(Duration::from_secs(1), run)
            .await
            .ok()
            .flatten()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// The last `lines` lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let Ok(file) = std::fs::File::open(self.log_path()) else {
            return String::from("(no log)");
        };
        let all: Vec<String> = BufReader::new(file).lines().map_while(Result::ok).collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- redis-server :{} log (test failed) ---\n{}\n---",
                self.port,
                self.log_tail(30)
            );
        }
        self.stop_process();
    }
}

/// True if a Redis server at `addr` answers `PING` with `PONG` within 200 ms.
async fn ping(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf).await.ok()?;
        Some(buf[..n].starts_with(b"+PONG"))
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(200), attempt).await,
        Ok(Some(true))
    )
}

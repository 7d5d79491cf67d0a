//! One real `redis-server` process.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a server keeps on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Persistence {
    /// Nothing: a restart forgets every key (the default for lock tests).
    #[default]
    None,
    /// Append-only file with `appendfsync always`: a restart keeps every acknowledged write.
    AofAlways,
}

/// How to start a server.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// What the server keeps on disk.
    pub persistence: Persistence,
    /// `requirepass`: the default user needs this password.
    pub password: Option<String>,
    /// An ACL user `(name, password)` allowed every command and key.
    pub acl_user: Option<(String, String)>,
    /// Serve TLS (certificates made with the `openssl` command, signed by a CA of the
    /// server's own; see [`RedisServer::tls_ca_pem`]).
    pub tls: bool,
}

/// A `redis-server` on a free loopback port, killed when dropped.
pub struct RedisServer {
    port: u16,
    /// The TLS port, when serving TLS (`port` then stays plain, for the kit's own checks).
    tls_port: Option<u16>,
    dir: tempfile::TempDir,
    options: ServerOptions,
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

/// The server binary: `REDIS_SERVER` if set (a `valkey-server` works as well),
/// else `redis-server` on `PATH`.
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
        Self::start_with(ServerOptions {
            persistence,
            ..ServerOptions::default()
        })
        .await
    }

    /// Starts a server with `options` and waits until it answers.
    pub async fn start_with(options: ServerOptions) -> Self {
        // A persistent server writes its AOF to memory (tmpfs) when there is one: a
        // killed process loses nothing the kernel has, which is what `appendfsync
        // always` guarantees, and fsync costs nothing there.
        let mut builder = tempfile::Builder::new();
        builder.prefix("redlock-test-");
        let shm = std::path::Path::new("/dev/shm");
        let dir = if options.persistence == Persistence::AofAlways && shm.is_dir() {
            builder.tempdir_in(shm)
        } else {
            builder.tempdir()
        }
        .expect("create a temporary directory");
        if options.tls {
            make_certificates(dir.path());
        }
        let mut server = Self {
            port: 0,
            tls_port: None,
            dir,
            options,
            child: None,
            paused: AtomicBool::new(false),
        };
        // Another process may grab the port between our probe and redis' bind: retry.
        for _ in 0..10 {
            server.port = free_port();
            if server.options.tls {
                server.tls_port = Some(free_port());
            }
            if server.spawn_and_wait().await {
                return server;
            }
        }
        panic!(
            "`{}` did not start; is it installed (or REDIS_SERVER set)? log:\n{}",
            redis_server_binary(),
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
        if let Some(password) = &self.options.password {
            cmd.arg("--requirepass").arg(password);
        }
        if let Some((user, password)) = &self.options.acl_user {
            cmd.arg("--user")
                .arg(user)
                .arg("on")
                .arg(format!(">{password}"))
                .arg("~*")
                .arg("&*")
                .arg("+@all");
        }
        if let Some(tls_port) = self.tls_port {
            let dir = self.dir.path();
            cmd.arg("--tls-port")
                .arg(tls_port.to_string())
                .arg("--tls-cert-file")
                .arg(dir.join("server.crt"))
                .arg("--tls-key-file")
                .arg(dir.join("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(dir.join("ca.crt"))
                .arg("--tls-auth-clients")
                .arg("no");
        }
        match self.options.persistence {
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
            .stderr(Stdio::null())
            // Ends with this process even if no destructor runs (see `reaper`).
            .process_group(crate::reaper::group());
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

    /// `redis://[credentials@]127.0.0.1:<port>`, or `rediss://…` on the TLS port when
    /// serving TLS (verified against [`tls_ca_pem`](Self::tls_ca_pem)).
    pub fn url(&self) -> String {
        let credentials = match (&self.options.acl_user, &self.options.password) {
            (Some((user, password)), _) => format!("{user}:{password}@"),
            (None, Some(password)) => format!(":{password}@"),
            (None, None) => String::new(),
        };
        match self.tls_port {
            Some(tls_port) => format!("rediss://{credentials}127.0.0.1:{tls_port}"),
            None => format!("redis://{credentials}127.0.0.1:{}", self.port),
        }
    }

    /// The PEM of the CA that signed a TLS server's certificate.
    pub fn tls_ca_pem(&self) -> Option<Vec<u8>> {
        self.tls_port
            .and_then(|_| std::fs::read(self.dir.path().join("ca.crt")).ok())
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

    /// A client for inspecting the server directly (plain port, with credentials).
    pub fn client(&self) -> redis::Client {
        let url = match (&self.options.acl_user, &self.options.password) {
            (Some((user, password)), _) => format!("redis://{user}:{password}@{}", self.addr()),
            (None, Some(password)) => format!("redis://:{password}@{}", self.addr()),
            (None, None) => format!("redis://{}", self.addr()),
        };
        redis::Client::open(url).expect("valid URL")
    }

    /// The server's `MONITOR` stream: each command it runs, one line each, in the order
    /// it ran them, from now on (a task forwards them until the receiver is dropped).
    ///
    /// # Panics
    ///
    /// If the server does not accept a monitor connection.
    pub async fn monitor(&self) -> tokio::sync::mpsc::UnboundedReceiver<String> {
        use futures_util::StreamExt as _;

        let monitor = self
            .client()
            .get_async_monitor()
            .await
            .expect("a MONITOR connection");
        let mut lines = monitor.into_on_message::<String>();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(line) = lines.next().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        rx
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

    /// How many times the server ran each command since it started or since
    /// [`reset_stats`](Self::reset_stats), by name as `INFO commandstats` names them
    /// (`set`, `evalsha`, `config|get`; the commands scripts call count too, under their
    /// own names); empty if the server does not answer.
    pub async fn command_calls(&self) -> std::collections::BTreeMap<String, u64> {
        let info: String = self
            .query(redis::cmd("INFO").arg("commandstats"))
            .await
            .unwrap_or_default();
        info.lines()
            .filter_map(|line| {
                let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest
                    .split(',')
                    .find_map(|field| field.strip_prefix("calls="))?
                    .parse::<u64>()
                    .ok()?;
                Some((name.to_owned(), calls))
            })
            .collect()
    }

    /// Resets the server's statistics (`CONFIG RESETSTAT`): the command counts of
    /// [`command_calls`](Self::command_calls) start again from zero. False if the
    /// server did not answer.
    pub async fn reset_stats(&self) -> bool {
        self.query::<()>(redis::cmd("CONFIG").arg("RESETSTAT"))
            .await
            .is_some()
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

/// A CA and a server certificate for 127.0.0.1 signed by it, in `dir`, by the `openssl`
/// command.
fn make_certificates(dir: &std::path::Path) {
    let openssl = |args: &[&str]| {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run openssl (Debian: apt-get install openssl)");
        assert!(status.success(), "openssl {args:?} failed");
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=redlock test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .expect("write the certificate extensions");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "server.crt",
    ]);
}

/// True if a Redis server at `addr` answers `PING` (with `PONG`, or by asking for
/// authentication) within 200 ms.
async fn ping(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf).await.ok()?;
        Some(buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"))
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(200), attempt).await,
        Ok(Some(true))
    )
}

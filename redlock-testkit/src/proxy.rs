//! A TCP proxy whose link can be cut, black-holed or delayed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The state of a proxied link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Bytes flow, each chunk after `delay` (zero: at once).
    Up {
        /// Added latency per chunk, each way.
        delay: Duration,
    },
    /// Connections stay open but nothing goes through (like a network partition
    /// dropping packets); what was sent is delivered once the link is up again.
    Blackhole,
    /// Open connections are closed and new ones are closed at once (like a node whose
    /// port is unreachable).
    Cut,
}

/// A TCP proxy on a free loopback port in front of `upstream`.
pub struct Proxy {
    addr: SocketAddr,
    state: watch::Sender<LinkState>,
    accept: JoinHandle<()>,
    /// Client connections the client has not closed yet.
    open: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl Proxy {
    /// Starts a proxy to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy's port");
        let addr = listener.local_addr().expect("proxy address");
        let (state, _) = watch::channel(LinkState::Up {
            delay: Duration::ZERO,
        });
        let states = state.clone();
        let open = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&open);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let rx = states.subscribe();
                if *rx.borrow() == LinkState::Cut {
                    drop(client);
                    continue;
                }
                counter.fetch_add(1, Ordering::AcqRel);
                let open = Open(Arc::clone(&counter));
                tokio::spawn(relay(client, upstream, rx, open));
            }
        });
        Self {
            addr,
            state,
            accept,
            open,
        }
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Sets the link state.
    pub fn set(&self, state: LinkState) {
        self.state.send_replace(state);
    }

    /// Closes every connection and refuses new ones.
    pub fn cut(&self) {
        self.set(LinkState::Cut);
    }

    /// Holds every byte until the link is up again.
    pub fn blackhole(&self) {
        self.set(LinkState::Blackhole);
    }

    /// Adds `delay` to every chunk each way.
    pub fn delay(&self, delay: Duration) {
        self.set(LinkState::Up { delay });
    }

    /// Client connections open through the proxy: accepted, and not closed by the
    /// client yet (whatever the link state: a black-holed link still notices its
    /// client hanging up). For tests that connections do not pile up.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Back to a plain, undelayed link.
    pub fn restore(&self) {
        self.set(LinkState::Up {
            delay: Duration::ZERO,
        });
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.send_replace(LinkState::Cut);
        self.accept.abort();
    }
}

/// Counts one open client connection until dropped.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    state: watch::Receiver<LinkState>,
    open: Open,
) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pipe(client_read, server_write, state.clone(), Some(open));
    let down = pipe(server_read, client_write, state, None);
    // When either direction ends (closed, or the link is cut), drop both.
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// Copies `from` to `to` under the link state: each chunk is delivered `delay` after it
/// was read (pure latency: chunks in flight overlap, as on a real link), held while the
/// link is black-holed, and the copy ends when the link is cut. `open` is dropped when
/// reading ends (the reading side closed).
async fn pipe<R, W>(mut from: R, mut to: W, state: watch::Receiver<LinkState>, open: Option<Open>)
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let (chunks, mut in_flight) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut read_state = state.clone();
    let reader = async move {
        let _open = open;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            tokio::select! {
                read = from.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let deliver_at = match *read_state.borrow() {
                            LinkState::Up { delay } => Instant::now() + delay,
                            _ => Instant::now(),
                        };
                        if chunks.send((deliver_at, buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                },
                changed = read_state.changed() => {
                    if changed.is_err() || *read_state.borrow() == LinkState::Cut {
                        return;
                    }
                }
            }
        }
    };
    let mut write_state = state;
    let writer = async move {
        while let Some((deliver_at, chunk)) = in_flight.recv().await {
            // (Even an elapsed sleep waits for the timer's next 1 ms tick: skip it.)
            if deliver_at > Instant::now() {
                tokio::time::sleep_until(deliver_at).await;
            }
            loop {
                let current = *write_state.borrow_and_update();
                match current {
                    LinkState::Cut => return,
                    LinkState::Blackhole => {
                        if write_state.changed().await.is_err() {
                            return;
                        }
                    }
                    LinkState::Up { .. } => break,
                }
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    // The reader ending (EOF, cut) drops the sender: the writer delivers what is in
    // flight, then ends too, unless the link is cut.
    tokio::join!(reader, writer);
}

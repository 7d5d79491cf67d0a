//! Servers that end with the process that started them, however it ends.
//!
//! Dropping a [`RedisServer`](crate::RedisServer) kills it, also when a test panics. A
//! process can end without running any destructor, though: killed (`kill -9`, a CI
//! job's timeout), aborted, or by `std::process::exit`. Its servers would then run on,
//! orphaned, holding their ports and memory.
//!
//! So every server the kit starts joins one process group, led by a watcher: a small
//! `sh` that blocks reading a pipe whose only writing end this process holds (opened
//! close-on-exec: no other child inherits it) and never writes to. However this
//! process ends, the kernel closes that end; the watcher reads the end of its input and
//! kills its whole group (`kill -KILL 0`): every server, whatever it forked, and
//! itself. It does not depend on which thread started a server (unlike
//! `PR_SET_PDEATHSIG`, which fires when the starting *thread* ends, as a test's or a
//! runtime's threads do while the servers must live on), and needs no `unsafe`.
//!
//! The watcher is started with the first server of the process, and again if it has
//! gone (killed by someone): the servers started after that join the new one's group.

use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, PoisonError};

/// What the watcher runs: it ignores a hang-up (the kernel sends one to a process group
/// left orphaned with a stopped member, as a paused server is, when this process
/// ends), waits for the end of its input, then kills its group.
const WATCH: &str = "trap '' HUP; while read -r _; do :; done; kill -KILL 0";

struct Watcher {
    child: Child,
    /// The writing end of the watcher's input, held open for as long as this process
    /// lives (the static holding it is never dropped).
    _input: ChildStdin,
}

static WATCHER: Mutex<Option<Watcher>> = Mutex::new(None);

/// The process group a server must join to end with this process: the watcher's,
/// started on first use, or again if it is gone.
pub(crate) fn group() -> i32 {
    let mut watcher = WATCHER.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(running) = watcher.as_mut()
        && matches!(running.child.try_wait(), Ok(None))
    {
        return pid(&running.child);
    }
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(WATCH)
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start `sh`, the watcher that ends the servers with this process");
    let input = child.stdin.take().expect("the watcher's input is piped");
    let group = pid(&child);
    *watcher = Some(Watcher {
        child,
        _input: input,
    });
    group
}

fn pid(child: &Child) -> i32 {
    i32::try_from(child.id()).expect("pid fits in i32")
}

//! One operation as a Redis command, sent on a connection and its answer read.

use std::future::Future;
use std::sync::Arc;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{RedisError, Script, Value};

use super::op::{Op, QueueKey, ReleaseMode, Waiter, waiter_keys, with_queues};
use super::scripts;
use crate::error::NodeError;

/// One operation, ready to send: built once per fan-out and shared by the calls to every
/// node, which then only pack and send it.
pub(crate) struct Command {
    cmd: redis::Cmd,
    /// Plain commands sent instead of `cmd`, in one write (a read lock's release: see
    /// [`release_read`]); the first one's answer is the command's, the others' are only
    /// looked at for errors.
    pipeline: Option<redis::Pipeline>,
    /// The script behind an `EVALSHA`: loaded again if a node answers NOSCRIPT.
    script: Option<&'static Script>,
    /// For a `SET .. NX GET` (see [`set_nx_get`]): the script to run instead when the
    /// key is being handed over, or when the node does not know `NX` with `GET`.
    /// Built from this command's own arguments the first time it is needed: most
    /// `SET .. NX GET` never need it.
    fallback: Option<std::sync::OnceLock<Box<Command>>>,
    /// The answer is a vote.
    pub(crate) votes: bool,
    /// The keys it works on, for error messages.
    keys: Box<str>,
    /// The operation's name, for the metrics.
    pub(crate) name: &'static str,
}

impl Command {
    pub(crate) fn new(op: Op<'_>) -> Self {
        let pipeline = release_read(op);
        let (cmd, script, fallback) = match (&pipeline, set_nx_get(op)) {
            (Some(_), _) => (redis::Cmd::new(), None, None),
            (None, Some(cmd)) => (cmd, None, Some(std::sync::OnceLock::new())),
            (None, None) => {
                let (cmd, script) = build(op);
                (cmd, script, None)
            }
        };
        Self {
            cmd,
            pipeline,
            script,
            fallback,
            votes: op.votes(),
            keys: op.keys().join(", ").into_boxed_str(),
            name: op.name(),
        }
    }

    /// The script to run instead of a `SET .. NX GET` (see [`set_nx_get`]): the
    /// all-or-nothing acquisition of [`scripts::ACQUIRE_MANY`], taking a key being handed
    /// over, made from the `SET`'s own key, value and TTL.
    fn fallback(&self) -> Option<&Command> {
        let cell = self.fallback.as_ref()?;
        Some(cell.get_or_init(|| {
            let args: Vec<&[u8]> = self
                .cmd
                .args_iter()
                .filter_map(|arg| match arg {
                    redis::Arg::Simple(bytes) => Some(bytes),
                    _ => None,
                })
                .collect();
            // SET key value NX PX ttl GET
            let arg = |i: usize| args.get(i).copied().unwrap_or_default();
            let mut cmd = redis::Cmd::new();
            cmd.arg("EVALSHA")
                .arg(scripts::ACQUIRE_MANY.get_hash())
                .arg(1)
                .arg(arg(1))
                .arg(arg(2))
                .arg(arg(5))
                .arg(1)
                .arg(0);
            Box::new(Self {
                cmd,
                pipeline: None,
                script: Some(&*scripts::ACQUIRE_MANY),
                fallback: None,
                votes: self.votes,
                keys: self.keys.clone(),
                name: self.name,
            })
        }))
    }

    /// The node's error for this command: [`redis_error`], naming the command's keys
    /// where a key is the cause (`WRONGTYPE`).
    pub(crate) fn error(&self, err: RedisError) -> NodeError {
        if err.code() == Some("WRONGTYPE") {
            return NodeError::WrongType {
                keys: self.keys.to_string(),
            };
        }
        redis_error(err)
    }

    /// Sends the command on `conn` and reads the answer: `SET`'s OK or nil as 1 or 0,
    /// a script's number as it is (a negative or unexpected answer is 0, a no). A node
    /// that lost its scripts (`SCRIPT FLUSH`) gets the script loaded again, then the
    /// command once more. A `SET .. NX GET` that needs its script (see
    /// [`first_step`](Self::first_step)) runs it next.
    pub(crate) async fn execute<C: Send1>(&self, conn: &mut C) -> Result<u64, RedisError> {
        match self.first_step(conn).await? {
            Step::Answer(answer) => Ok(answer),
            // Boxed: rare, and it would make every call's future bigger.
            Step::Fallback(fallback) => Box::pin(fallback.execute(conn)).await,
        }
    }

    /// [`execute`](Self::execute), except that a `SET .. NX GET` whose key is being
    /// handed over (`~<waiter>`), or sent to a node that refuses `NX` with `GET` (before
    /// Redis 7.0), answers the script that decides instead: the caller sends it, once no
    /// later command to the node counts on this one having been the last (see
    /// `node::Queued`). Otherwise its nil (the key was free and is now ours) is 1, a
    /// value 0.
    pub(crate) async fn first_step<C: Send1>(&self, conn: &mut C) -> Result<Step<'_>, RedisError> {
        let sent = match &self.pipeline {
            Some(pipeline) => conn.send_pipeline(pipeline).await.and_then(first_answer),
            None => conn.send1(&self.cmd).await,
        };
        let reply = match sent.and_then(Value::extract_error) {
            Err(err) if is_no_script(&err) => match self.script {
                // Boxed: rare, and it would make every call's future bigger.
                Some(script) => Box::pin(self.reload(script, conn)).await?,
                None => return Err(err),
            },
            Err(err) if is_syntax_error(&err) => match self.fallback() {
                Some(fallback) => return Ok(Step::Fallback(fallback)),
                None => return Err(err),
            },
            reply => reply?,
        };
        Ok(Step::Answer(match (reply, self.fallback.is_some()) {
            (Value::Int(n), _) => u64::try_from(n).unwrap_or(0),
            // The extension script's answer for one lock.
            (Value::Array(answers), _) => match answers.as_slice() {
                [Value::Int(n)] => u64::try_from(*n).unwrap_or(0),
                _ => 0,
            },
            (Value::Okay, _) | (Value::Nil, true) => 1,
            (Value::BulkString(old), true) if old.first() == Some(&b'~') => match self.fallback() {
                Some(fallback) => return Ok(Step::Fallback(fallback)),
                None => 0,
            },
            _ => 0,
        }))
    }
}

/// The first answer of a pipeline, or the first error among its answers.
fn first_answer(answers: Vec<Value>) -> Result<Value, RedisError> {
    let mut answers = answers.into_iter();
    let first = answers.next().unwrap_or(Value::Nil).extract_error()?;
    for answer in answers {
        answer.extract_error()?;
    }
    Ok(first)
}

/// What the first round trip of a [`Command`] says.
pub(crate) enum Step<'a> {
    /// The node's answer.
    Answer(u64),
    /// The command's script must decide: send it.
    Fallback(&'a Command),
}

impl Command {
    /// Loads `script` on the node, then sends the command again.
    async fn reload<C: Send1>(&self, script: &Script, conn: &mut C) -> Result<Value, RedisError> {
        script.load_async(conn).await?;
        conn.send1(&self.cmd).await?.extract_error()
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The arguments hold the lock's value: not for logs.
        f.debug_struct("Command")
            .field("votes", &self.votes)
            .finish_non_exhaustive()
    }
}

pub(super) fn is_no_script(err: &RedisError) -> bool {
    err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// `ERR syntax error`: what a node before Redis 7.0 answers to `SET .. NX .. GET`.
fn is_syntax_error(err: &RedisError) -> bool {
    err.code() == Some("ERR") && err.detail().is_some_and(|d| d.contains("syntax"))
}

/// The one-shot acquisition of one key without fencing (`try_lock`'s), as one plain
/// command: `SET key value NX PX ttl GET`. Such an attempt may take a key that a
/// release is handing over to a queued waiter (`~<waiter>`); with `GET`, the node's
/// answer says whether the key held one, and only then does the script
/// ([`scripts::ACQUIRE_MANY`]) run, in a second round trip. Every other acquisition of
/// one key without fencing is a plain `SET NX PX` (see [`build`]).
fn set_nx_get(op: Op<'_>) -> Option<redis::Cmd> {
    let Op::Acquire {
        keys: [key],
        fence_keys: [],
        value,
        ttl_ms,
        waiter: None,
        barge: true,
        fence_step_us: _,
    } = op
    else {
        return None;
    };
    let mut cmd = redis::Cmd::with_capacity(7, key.len() + value.len() + 3 + 2 + 2 + 20 + 3);
    cmd.arg("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .arg("GET");
    Some(cmd)
}

/// A read lock's release, as plain commands in one write (no script): `DEL` of the
/// reader's key, `SREM` of its name from the readers' set and, to wake, `PUBLISH` of an
/// empty message on the writer's channel. The reader's key names its value, so no other
/// value can be in it: the `DEL` needs no compare, and its answer (1 if the key was
/// there) is the release's. Two steps, not one: a writer that looks in between finds a
/// name whose key is gone, a dead reader's, and drops it. The wake-up goes whether or
/// not a writer waits: a `PUBLISH` nobody listens to costs the node less than a script
/// that looks first. Only requests waiting for this read-write lock listen on the
/// channel: writers, whom it is for, and readers kept out by a writer (held or
/// waiting), who then try once more for nothing.
fn release_read(op: Op<'_>) -> Option<redis::Pipeline> {
    let Op::ReleaseRead {
        key,
        rw,
        value,
        wake,
    } = op
    else {
        return None;
    };
    debug_assert!(key.ends_with(value), "a reader's key names its value");
    let mut pipeline = redis::Pipeline::with_capacity(3);
    pipeline.cmd("DEL").arg(key);
    pipeline.cmd("SREM").arg(&rw.readers).arg(key);
    if wake {
        pipeline.cmd("PUBLISH").arg(&rw.write).arg("");
    }
    Some(pipeline)
}

/// Sends one command: directly on a multiplexed connection (its `ConnectionLike` method
/// boxes a future per command), through `ConnectionLike` on a pooled one.
pub(crate) trait Send1: ConnectionLike + Send {
    fn send1<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> impl Future<Output = Result<Value, RedisError>> + Send + 'a;

    /// Sends a pipeline's commands in one write and reads every answer.
    fn send_pipeline<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
    ) -> impl Future<Output = Result<Vec<Value>, RedisError>> + Send + 'a {
        self.req_packed_commands(pipeline, 0, pipeline.len())
    }
}

impl Send1 for MultiplexedConnection {
    fn send1<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> impl Future<Output = Result<Value, RedisError>> + Send + 'a {
        self.send_packed_command(cmd)
    }

    fn send_pipeline<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
    ) -> impl Future<Output = Result<Vec<Value>, RedisError>> + Send + 'a {
        self.send_packed_commands(pipeline, 0, pipeline.len())
    }
}

impl Send1 for deadpool_redis::Connection {
    fn send1<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> impl Future<Output = Result<Value, RedisError>> + Send + 'a {
        self.req_packed_command(cmd)
    }
}

/// One operation as a command (scripts by `EVALSHA`: the connection loaded them), with
/// the script it runs, if any.
fn build(op: Op<'_>) -> (redis::Cmd, Option<&'static Script>) {
    let evalsha = |script: &'static Script, keys: &[&String], args: &[String]| {
        let keys: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        evalsha_strs(script, &keys, &args)
    };
    match op {
        Op::Acquire {
            keys: [key],
            fence_keys: [],
            value,
            ttl_ms,
            waiter: None,
            barge: false,
            fence_step_us: _,
        } => {
            let mut cmd = redis::Cmd::with_capacity(6, key.len() + value.len() + 3 + 2 + 2 + 20);
            cmd.arg("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms);
            (cmd, None)
        }
        Op::Acquire {
            keys,
            fence_keys,
            value,
            ttl_ms,
            waiter: Some(waiter),
            fence_step_us,
            ..
        } => {
            let all = waiter_keys(keys, fence_keys);
            evalsha(
                &scripts::ACQUIRE_QUEUED,
                &all.iter().collect::<Vec<_>>(),
                &waiter_args(value, ttl_ms, waiter, keys.len(), fence_step_us),
            )
        }
        Op::Acquire {
            keys,
            fence_keys,
            value,
            ttl_ms,
            barge,
            fence_step_us,
            ..
        } => {
            let script = if fence_keys.is_empty() {
                &*scripts::ACQUIRE_MANY
            } else {
                &*scripts::ACQUIRE_FENCED
            };
            let all: Vec<&String> = keys.iter().chain(fence_keys).collect();
            evalsha(
                script,
                &all,
                &[
                    value.to_owned(),
                    ttl_ms.to_string(),
                    u8::from(barge).to_string(),
                    fence_step_us.to_string(),
                ],
            )
        }
        Op::RaiseFence { fence_keys, token } => evalsha(
            &scripts::RAISE_FENCE,
            &fence_keys.iter().collect::<Vec<_>>(),
            &[token.to_string()],
        ),
        Op::Release {
            keys,
            value,
            mode,
            handoff_ms,
            dequeue,
        } => {
            // Written straight into the command: a release is half of every lock cycle.
            let data = 2 * keys.iter().map(String::len).sum::<usize>()
                + 6 * keys.len()
                + value.len()
                + dequeue.map_or(0, str::len)
                + 7 // EVALSHA
                + 40 // the hash
                + 2 * 20; // the key count and the hand-over time
            let mut cmd = redis::Cmd::with_capacity(4 + 2 * keys.len() + 4, data);
            cmd.arg("EVALSHA")
                .arg(scripts::RELEASE.get_hash())
                .arg(2 * keys.len());
            for key in keys {
                cmd.arg(key.as_str());
            }
            for key in keys {
                redis::RedisWrite::write_arg_fmt(&mut cmd, QueueKey(key));
            }
            cmd.arg(value);
            // A lock's release (a hand-over, dequeueing nobody) passes the value alone.
            if mode != ReleaseMode::HandOver || dequeue.is_some() {
                cmd.arg(match mode {
                    ReleaseMode::Quiet => "0",
                    ReleaseMode::HandOver => "1",
                    ReleaseMode::FollowUp => "2",
                })
                .arg(handoff_ms);
                if let Some(dequeue) = dequeue {
                    cmd.arg(dequeue);
                }
            }
            (cmd, Some(&*scripts::RELEASE))
        }
        Op::Extend {
            keys,
            value,
            ttl_ms,
        } => evalsha(
            &scripts::EXTEND,
            &keys.iter().collect::<Vec<_>>(),
            &[keys.len().to_string(), value.to_owned(), ttl_ms.to_string()],
        ),
        Op::Remaining { keys } => {
            evalsha(&scripts::REMAINING, &keys.iter().collect::<Vec<_>>(), &[])
        }
        Op::ServerTime => evalsha(&scripts::SERVER_TIME, &[], &[]),
        Op::Mark { keys } => evalsha(&scripts::MARK, &keys.iter().collect::<Vec<_>>(), &[]),
        Op::AcquireRead {
            key,
            rw,
            value,
            ttl_ms,
        } => {
            // The script builds the other keys' names from the writer's key.
            debug_assert_eq!(key, rw.reader(value));
            evalsha_strs(
                &scripts::ACQUIRE_READ,
                &[&rw.write],
                &[value, &ttl_ms.to_string()],
            )
        }
        Op::AcquireWrite {
            rw,
            fence_keys,
            value,
            ttl_ms,
            writer,
            fence_step_us,
        } => {
            let mut keys = vec![
                rw.write.as_str(),
                &rw.readers,
                &rw.writers,
                &rw.writer_deadlines,
            ];
            keys.extend(fence_keys.iter().map(String::as_str));
            evalsha_strs(
                &scripts::ACQUIRE_WRITE,
                &keys,
                &[
                    value,
                    &ttl_ms.to_string(),
                    &writer.id,
                    &writer.since_ms.to_string(),
                    &writer.keep_ms.to_string(),
                    &fence_step_us.to_string(),
                ],
            )
        }
        // Plain commands: see `release_read`.
        Op::ReleaseRead { .. } => (redis::Cmd::new(), None),
        Op::ReleaseWrite { rw, value, wake } => evalsha_strs(
            &scripts::RELEASE_WRITE,
            &[&rw.write],
            &[value, if wake { "1" } else { "0" }],
        ),
        Op::Downgrade { key, rw, value } => evalsha_strs(
            &scripts::DOWNGRADE,
            &[&rw.write, &rw.readers, key],
            &[value],
        ),
        Op::LeaveWriters { rw, writer } => evalsha_strs(
            &scripts::LEAVE_WRITERS,
            &[&rw.writers, &rw.writer_deadlines, &rw.write],
            &[&writer.id],
        ),
        Op::JoinQueue { keys, waiter } => {
            let all = with_queues(keys);
            evalsha(
                &scripts::JOIN_QUEUE,
                &all.iter().collect::<Vec<_>>(),
                &[
                    waiter.id.clone(),
                    waiter.since_ms.to_string(),
                    waiter.keep_ms.to_string(),
                ],
            )
        }
    }
}

/// `EVALSHA` of `script` with these keys and arguments (the connection loaded the
/// script), sized up front: one allocation per buffer instead of a few growths.
fn evalsha_strs(
    script: &'static Script,
    keys: &[&str],
    args: &[&str],
) -> (redis::Cmd, Option<&'static Script>) {
    let data = keys.iter().chain(args).map(|s| s.len()).sum::<usize>() + 7 + 40 + 20;
    let mut cmd = redis::Cmd::with_capacity(3 + keys.len() + args.len(), data);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
    for part in keys.iter().chain(args) {
        cmd.arg(*part);
    }
    (cmd, Some(script))
}

fn waiter_args(
    value: &str,
    ttl_ms: u64,
    waiter: &Waiter,
    keys: usize,
    fence_step_us: u64,
) -> [String; 7] {
    [
        value.to_owned(),
        ttl_ms.to_string(),
        waiter.id.clone(),
        waiter.since_ms.to_string(),
        waiter.keep_ms.to_string(),
        keys.to_string(),
        fence_step_us.to_string(),
    ]
}

/// Adds loading every script to `pipe` (replies ignored).
pub(crate) fn load_scripts(pipe: &mut redis::Pipeline) {
    for source in scripts::ALL_SOURCES {
        pipe.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
    }
}

/// Runs a batch of operations (a pipeline that ignores errors) and returns each reply;
/// a node that lost its scripts (`SCRIPT FLUSH`) gets them loaded again and the batch
/// once more.
pub(crate) async fn query_batch<C: ConnectionLike + Send>(
    pipe: &redis::Pipeline,
    conn: &mut C,
) -> Result<Vec<redis::RedisResult<Value>>, RedisError> {
    let replies: Vec<redis::RedisResult<Value>> = pipe.query_async(conn).await?;
    if !replies
        .iter()
        .any(|reply| reply.as_ref().is_err_and(is_no_script))
    {
        return Ok(replies);
    }
    let mut load = redis::pipe();
    load_scripts(&mut load);
    load.exec_async(conn).await?;
    pipe.query_async(conn).await
}

pub(crate) fn breaks_connection(err: &RedisError) -> bool {
    err.is_io_error() || err.is_connection_dropped() || err.is_unrecoverable_error()
}

/// A node's error: a refusal that no retry can cure (a permission, credentials, a key of
/// another type) as its own [`NodeError`], anything else as a Redis error.
pub(crate) fn redis_error(err: RedisError) -> NodeError {
    match err.code() {
        Some("NOPERM") => NodeError::Permission(format!(
            "{}; the node's ACL user needs the lock's keys (`~<key prefix>*`, and `&*` for wake on release) and +@scripting",
            err.detail()
                .map_or_else(|| "NOPERM".to_owned(), |d| format!("NOPERM {d}"))
        )),
        Some("WRONGTYPE") => NodeError::WrongType {
            keys: "a key of the lock".to_owned(),
        },
        Some("NOAUTH" | "WRONGPASS") => NodeError::Authentication(err.to_string()),
        _ if err.kind() == redis::ErrorKind::AuthenticationFailed => {
            NodeError::Authentication(err.to_string())
        }
        _ => NodeError::Redis(Arc::new(err)),
    }
}

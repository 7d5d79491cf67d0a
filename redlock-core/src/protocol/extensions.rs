//! A watchdog round's extensions: a few commands, built once and sent to every node.

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, RedisResult, Value};

use super::command::{Send1, breaks_connection, is_no_script};
use super::scripts;

/// The most locks one command extends. A round's commands go out back to back (one
/// round trip), each small: a connection keeps the largest buffer it ever needed, and a
/// round of thousands of locks in one command would keep that much per node for good;
/// and each script run holds its node for well under a millisecond.
const LOCKS_PER_COMMAND: usize = 128;

/// How many of a round's commands one connection carries at a time: enough to keep it
/// busy (the next ones go out as the first answers come), few enough that a round's
/// packed commands never all wait in memory at once.
const COMMANDS_IN_FLIGHT: usize = 16;

/// The extension of many locks, as commands of the extension script
/// ([`scripts::EXTEND`]), each for up to [`LOCKS_PER_COMMAND`] locks.
pub(crate) struct Extensions {
    /// The commands, and how many locks each extends.
    commands: Vec<(Cmd, usize)>,
    /// How many locks in all.
    locks: usize,
}

impl Extensions {
    /// The commands extending `locks` (each: its keys, its value and its new TTL in ms),
    /// in order.
    pub(crate) fn new<'a>(locks: impl IntoIterator<Item = (&'a [String], &'a str, u64)>) -> Self {
        let mut commands = Vec::new();
        let mut total = 0;
        let mut chunk: Vec<(&[String], &str, u64)> = Vec::with_capacity(LOCKS_PER_COMMAND);
        for lock in locks {
            chunk.push(lock);
            total += 1;
            if chunk.len() == LOCKS_PER_COMMAND {
                commands.push((command(&chunk), chunk.len()));
                chunk.clear();
            }
        }
        if !chunk.is_empty() {
            commands.push((command(&chunk), chunk.len()));
        }
        Self {
            commands,
            locks: total,
        }
    }

    /// The commands, in order.
    pub(crate) fn commands(&self) -> impl Iterator<Item = &Cmd> {
        self.commands.iter().map(|(cmd, _)| cmd)
    }

    /// Each lock's answer from the commands' `replies` (in order): `Some(true)`
    /// extended, `Some(false)` not, `None` where its command failed or answered
    /// something else.
    pub(crate) fn answers(
        &self,
        replies: impl IntoIterator<Item = RedisResult<Value>>,
    ) -> Vec<Option<bool>> {
        let mut answers = Vec::with_capacity(self.locks);
        for ((_, count), reply) in self.commands.iter().zip(replies) {
            answers.extend(chunk_answers(reply, *count));
        }
        answers.resize(self.locks, None);
        answers
    }

    /// Sends the commands on the multiplexed connection `conn`, [`COMMANDS_IN_FLIGHT`]
    /// at a time (back to back: a round is about one round trip per that many
    /// commands), and returns each lock's answer (see [`answers`](Self::answers)),
    /// and whether an error broke the connection. Each reply is read down to a byte
    /// per lock as it comes: a round's replies never pile up as values.
    pub(crate) async fn send_all(&self, conn: &MultiplexedConnection) -> (Vec<Option<bool>>, bool) {
        // Nothing is packed or sent before a future is polled.
        let calls: Vec<_> = self
            .commands
            .iter()
            .map(|(cmd, count)| {
                let mut conn = conn.clone();
                async move {
                    let reply = send(cmd, &mut conn).await;
                    let broken = reply.as_ref().is_err_and(breaks_connection);
                    (chunk_answers(reply, *count), broken)
                }
            })
            .collect();
        let mut chunks = futures_util::stream::iter(calls).buffered(COMMANDS_IN_FLIGHT);
        let mut answers = Vec::with_capacity(self.locks);
        let mut broken = false;
        while let Some((chunk, chunk_broken)) = chunks.next().await {
            answers.extend(chunk);
            broken |= chunk_broken;
        }
        (answers, broken)
    }
}

/// The answers of one command's `count` locks.
fn chunk_answers(reply: RedisResult<Value>, count: usize) -> Vec<Option<bool>> {
    match reply {
        Ok(Value::Array(values)) if values.len() == count => values
            .into_iter()
            .map(|value| match value {
                Value::Int(n) => Some(n > 0),
                _ => None,
            })
            .collect(),
        _ => vec![None; count],
    }
}

/// Sends one extension command; a node that lost its scripts (`SCRIPT FLUSH`) gets the
/// script loaded again, then the command once more.
pub(crate) async fn send<C: Send1>(cmd: &Cmd, conn: &mut C) -> RedisResult<Value> {
    match conn.send1(cmd).await.and_then(Value::extract_error) {
        Err(err) if is_no_script(&err) => {
            scripts::EXTEND.load_async(conn).await?;
            conn.send1(cmd).await?.extract_error()
        }
        reply => reply,
    }
}

/// One command extending `locks`: `EVALSHA <extend> <keys> <key>... ` then, per lock,
/// its key count, value and TTL.
fn command(locks: &[(&[String], &str, u64)]) -> Cmd {
    let keys: usize = locks.iter().map(|(keys, _, _)| keys.len()).sum();
    // Sized up front: one allocation per buffer.
    let data = 7
        + 40
        + 20
        + locks
            .iter()
            .map(|(keys, value, _)| keys.iter().map(String::len).sum::<usize>() + value.len() + 25)
            .sum::<usize>();
    let mut cmd = Cmd::with_capacity(3 + keys + 3 * locks.len(), data);
    cmd.arg("EVALSHA").arg(scripts::EXTEND.get_hash()).arg(keys);
    for (lock_keys, _, _) in locks {
        for key in *lock_keys {
            cmd.arg(key.as_str());
        }
    }
    for (lock_keys, value, ttl_ms) in locks {
        cmd.arg(lock_keys.len()).arg(*value).arg(*ttl_ms);
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::RedisError;

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_round_is_split_into_small_commands_and_its_answers_joined_in_order() {
        let all: Vec<Vec<String>> = (0..300).map(|i| keys(&[&format!("k{i}")])).collect();
        let extensions = Extensions::new(all.iter().map(|k| (k.as_slice(), "v", 3000)));
        assert_eq!(extensions.commands().count(), 3, "128 + 128 + 44 locks");
        let replies = vec![
            Ok(Value::Array(vec![Value::Int(1); 128])),
            Err(RedisError::from((redis::ErrorKind::Io, "gone"))),
            Ok(Value::Array(vec![Value::Int(0); 44])),
        ];
        let answers = extensions.answers(replies);
        assert_eq!(answers.len(), 300);
        assert!(answers[..128].iter().all(|a| *a == Some(true)));
        assert!(
            answers[128..256].iter().all(Option::is_none),
            "a failed command's locks"
        );
        assert!(answers[256..].iter().all(|a| *a == Some(false)));
    }

    #[test]
    fn a_reply_of_the_wrong_length_answers_nothing() {
        let all = [keys(&["a", "b"]), keys(&["c"])];
        let extensions = Extensions::new(all.iter().map(|k| (k.as_slice(), "v", 3000)));
        let answers = extensions.answers(vec![Ok(Value::Array(vec![Value::Int(1)]))]);
        assert_eq!(answers, vec![None, None]);
        let cmd = extensions.commands().next().unwrap();
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(bytes) => Some(bytes.to_vec()),
                _ => None,
            })
            .collect();
        let text: Vec<&str> = args
            .iter()
            .map(|a| std::str::from_utf8(a).unwrap())
            .collect();
        assert_eq!(
            text[2..],
            ["3", "a", "b", "c", "2", "v", "3000", "1", "v", "3000"],
            "the keys, then per lock its key count, value and TTL"
        );
    }
}

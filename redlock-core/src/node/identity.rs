//! Which server each node is: one Redis server listed twice under two names
//! (`localhost:6379` and `127.0.0.1:6379`) would vote twice, and with two of three
//! entries would grant locks on its single vote. Every new connection reports the
//! server's `run_id` here before anyone may use it; a `run_id` that another node already
//! has refuses the connection, and the configuration for good.
//!
//! A node's answers count only once its own connection's identity is claimed, and a
//! majority is not taken as won while another node of the fan-out is still opening a
//! connection whose identity may show that a node that said yes is the same server:
//! the decision waits for that identity (see `quorum::Fanout`), within the node timeout
//! once the server has answered the connection's handshake, and for [`IDENTITY_WAIT`]
//! of the opening before that. So a configuration that lists one server twice is
//! refused before its first lock, and a name that becomes the same server as another
//! one (an address that moved) before its first vote on the new connection. A node that
//! does not answer in that time counts as unreachable: it does not vote, and holds up no
//! decision; should it turn out to be the same server as another node once connected,
//! the configuration is refused then (the locks granted meanwhile stood on distinct
//! servers).

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::error::{ConfigError, NodeError};

/// How long a connection being opened whose server has not answered yet holds up the
/// decisions that have their majority (never longer than the node timeout): once the
/// server answers the handshake, it is alive and its identity one round trip away, and
/// the decisions wait for it within the node timeout. A server that does not answer
/// (down, paused, cut off) so costs the decisions made while its connection is that
/// young this long at most, once per connection attempt, instead of a node timeout.
pub(crate) const IDENTITY_WAIT: Duration = Duration::from_millis(100);

/// The `run_id` each node's server reported last, shared by the nodes of one client.
#[derive(Debug)]
pub(crate) struct Identities {
    /// Per node (by index): its name and the `run_id` of its current connection.
    nodes: Mutex<Vec<(String, Option<String>)>>,
    /// How many nodes there are.
    count: usize,
    /// The first pair of nodes found to be one server.
    clash: OnceLock<ConfigError>,
}

impl Identities {
    /// A registry for nodes with these names (in configuration order).
    pub(crate) fn new(names: Vec<String>) -> Self {
        Self {
            count: names.len(),
            nodes: Mutex::new(names.into_iter().map(|name| (name, None)).collect()),
            clash: OnceLock::new(),
        }
    }

    /// Node `index` reaches the server with `run_id`: refused if another node reaches
    /// it too.
    pub(crate) fn claim(&self, index: usize, run_id: &str) -> Result<(), NodeError> {
        let mut nodes = self
            .nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let other = nodes
            .iter()
            .enumerate()
            .find(|(i, (_, id))| *i != index && id.as_deref() == Some(run_id))
            .map(|(_, (name, _))| name.clone());
        if let Some(other) = other {
            let name = nodes
                .get(index)
                .map(|(name, _)| name.clone())
                .unwrap_or_default();
            let clash = ConfigError::SameServer {
                first: other.clone(),
                second: name,
                run_id: run_id.to_owned(),
            };
            if self.clash.set(clash.clone()).is_ok() {
                tracing::error!(error = %clash, "configuration refused");
            }
            return Err(NodeError::SameServer {
                other,
                run_id: run_id.to_owned(),
            });
        }
        if let Some((_, id)) = nodes.get_mut(index) {
            *id = Some(run_id.to_owned());
        }
        Ok(())
    }

    /// There is more than one node: identities are compared.
    pub(crate) fn compared(&self) -> bool {
        self.count > 1
    }

    /// The two nodes found to be one server, if any: every lock call is refused then.
    pub(crate) fn clash(&self) -> Option<&ConfigError> {
        self.clash.get()
    }
}

/// The `run_id` field of an `INFO server` reply.
pub(crate) fn run_id(info: &str) -> Option<&str> {
    crate::protocol::info_field(info, "run_id")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_server_under_two_names_is_refused() {
        let ids = Identities::new(vec!["a:1".into(), "b:1".into(), "c:1".into()]);
        assert!(ids.claim(0, "r1").is_ok());
        assert!(ids.claim(2, "r2").is_ok());
        // Reconnecting to the same server is fine.
        assert!(ids.claim(0, "r1").is_ok());
        assert!(ids.clash().is_none());
        let err = ids.claim(1, "r1").unwrap_err();
        assert!(matches!(&err, NodeError::SameServer { other, .. } if other == "a:1"));
        let clash = ids.clash().unwrap().to_string();
        assert!(clash.contains("a:1") && clash.contains("b:1"), "{clash}");
    }

    #[test]
    fn reads_the_run_id() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:5\r\n";
        assert_eq!(run_id(info), Some("abc123"));
        assert_eq!(run_id("# Server\r\n"), None);
    }
}

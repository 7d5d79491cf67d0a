//! Shared plumbing of the example programs: where the Redis nodes come from.

/// Redis nodes for an example: the URLs in `REDLOCK_NODES` (comma-separated), or `n`
/// local `redis-server` processes started for the run (stopped when the value drops).
pub enum Nodes {
    /// Nodes listed in `REDLOCK_NODES`.
    External(Vec<String>),
    /// Nodes started by this program.
    Local(redlock_testkit::Cluster),
}

impl Nodes {
    /// Reads `REDLOCK_NODES`, or starts `n` local nodes.
    pub async fn from_env_or_start(n: usize) -> Self {
        match std::env::var("REDLOCK_NODES") {
            Ok(list) if !list.trim().is_empty() => Self::External(
                list.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
            ),
            _ => Self::Local(redlock_testkit::Cluster::start(n).await),
        }
    }

    /// The node URLs.
    pub fn urls(&self) -> Vec<String> {
        match self {
            Self::External(urls) => urls.clone(),
            Self::Local(cluster) => cluster.urls(),
        }
    }

    /// Where the nodes come from, for a banner.
    pub fn describe(&self) -> String {
        match self {
            Self::External(urls) => format!("{} nodes from REDLOCK_NODES", urls.len()),
            Self::Local(cluster) => format!("{} local redis-server nodes", cluster.len()),
        }
    }
}

//! The commands that talk to the Redis nodes: `nodes`, `locks`, `release` (of a lock,
//! a semaphore's permits or a read-write lock).
//!
//! They go through a [`Redlock`] client that takes no lock and casts no vote: node
//! health, the lock listing and a forced release are read-or-overrule operations the
//! algorithm is not part of.

use redlock_core::builder::DEFAULT_TTL_LIMIT;
use redlock_core::error::NodeFailure;
use redlock_core::inspect::{
    Agreement, ForceReleased, HeldLock, HeldRwLock, HeldSemaphore, LockListing, NodeHealth,
    RwReleased, SemaphoreReleased,
};
use redlock_core::{Error, Redlock};
use serde::Serialize;

use crate::cli::{Global, NODES_ENV};
use crate::format::{self, Table, line, or_dash};
use crate::outcome::{CliError, EXIT_FAILED, EXIT_PARTIAL, Report};

/// The nodes listed in `--nodes` / `REDLOCK_NODES` (blank entries dropped).
fn node_urls(global: &Global) -> Result<Vec<String>, CliError> {
    let urls: Vec<String> = global
        .nodes
        .iter()
        .map(|url| url.trim().to_owned())
        .filter(|url| !url.is_empty())
        .collect();
    if urls.is_empty() {
        return Err(CliError::failed(format!(
            "no Redis nodes configured: pass --nodes redis://host:port,... or set {NODES_ENV} (comma-separated), as for the services"
        )));
    }
    Ok(urls)
}

/// The client the commands use.
fn client(global: &Global) -> Result<(Redlock, usize), CliError> {
    let urls = node_urls(global)?;
    let count = urls.len();
    let max_ttl = global.max_ttl;
    let redlock = Redlock::builder()
        .nodes(urls)
        .key_prefix(global.key_prefix.clone())
        // Never seen in a lock value (this client takes no lock), but named anyway.
        .holder(format!("redlock-cli:{}", std::process::id()))
        // The restart quarantine stays ON, and it never makes this tool wait: only a
        // vote (taking or extending a lock) is refused to a node in quarantine, and this
        // client never votes: node health, the listing (`SCAN` + reads) and a forced
        // release are sent to every node whatever its quarantine. Keeping it on lets
        // `nodes` report which nodes the services (with the same `--max-ttl`) hold in
        // quarantine, and spares the "quarantine is off" persistence warning, which
        // would be about this tool's client rather than the services'.
        .restart_quarantine(true)
        .max_ttl(max_ttl)
        .ttl(max_ttl)
        .ttl_limit(max_ttl.max(DEFAULT_TTL_LIMIT))
        // No lock is waited for.
        .wake_on_release(false)
        .build()
        .map_err(|err| {
            CliError::failed(format!(
                "invalid Redis configuration (--nodes / {NODES_ENV}, --max-ttl): {err}"
            ))
        })?;
    Ok((redlock, count))
}

/// `node (cause), ...`.
fn named_failures(failures: &[NodeFailure]) -> String {
    failures
        .iter()
        .map(|f| format!("{} ({})", f.node, f.cause))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What `nodes --json` prints per node: the core's report, with what its methods say.
#[derive(Serialize)]
struct NodeReport<'a> {
    /// The node answered.
    reachable: bool,
    /// Every write reaches the disk before it is acknowledged (`None`: unknown).
    durable: Option<bool>,
    /// The node cannot evict lock keys (`None`: unknown).
    eviction_safe: Option<bool>,
    #[serde(flatten)]
    health: &'a NodeHealth,
}

/// `redlock nodes`.
pub(crate) async fn nodes(global: &Global) -> Result<Report, CliError> {
    let (redlock, _) = client(global)?;
    let health = redlock.node_health().await;
    let output = if global.json {
        let reports: Vec<NodeReport<'_>> = health
            .iter()
            .map(|health| NodeReport {
                reachable: health.reachable(),
                durable: health.durable(),
                eviction_safe: health.eviction_safe(),
                health,
            })
            .collect();
        format::json(&reports)?
    } else {
        render_health(&health)
    };
    let mut report = Report::ok(output);
    let total = health.len();
    let quorum = total / 2 + 1;
    let failed: Vec<String> = health
        .iter()
        .filter_map(|h| {
            h.error
                .as_ref()
                .map(|cause| format!("{} ({cause})", h.node))
        })
        .collect();
    if !failed.is_empty() {
        let answered = total - failed.len();
        if answered >= quorum {
            report.warnings.push(format!(
                "{} of {total} nodes did not answer: {}; locks still work (a majority answers) but tolerate fewer failures: bring them back",
                failed.len(),
                failed.join(", ")
            ));
            report.code = EXIT_PARTIAL;
        } else {
            report.error = Some(format!(
                "only {answered} of {total} nodes answered and {quorum} are needed for locks: {}; check that they are up and that --nodes / {NODES_ENV} names them",
                failed.join(", ")
            ));
            report.code = EXIT_FAILED;
        }
    }
    Ok(report)
}

/// The persistence of a node, in a word or two.
fn persistence(health: &NodeHealth) -> String {
    let rdb = health.save.as_deref().is_some_and(|s| !s.trim().is_empty());
    match health.appendonly {
        None => "?".to_owned(),
        Some(true) => {
            let aof = format!("aof {}", health.appendfsync.as_deref().unwrap_or("?"));
            if rdb { format!("{aof} + rdb") } else { aof }
        }
        Some(false) if rdb => "rdb".to_owned(),
        Some(false) => "none".to_owned(),
    }
}

fn render_health(health: &[NodeHealth]) -> String {
    let mut table = Table::new(&[
        "NODE",
        "STATUS",
        "LATENCY",
        "QUARANTINE",
        "VERSION",
        "ROLE",
        "UPTIME",
        "MAXMEMORY",
        "POLICY",
        "PERSISTENCE",
    ]);
    let mut notes = Vec::new();
    for h in health {
        if let Some(error) = &h.error {
            table.row(vec![
                h.node.clone(),
                "unreachable".to_owned(),
                "-".to_owned(),
                h.quarantined.map_or("-".to_owned(), format::duration),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
            ]);
            notes.push(format!("{}: unreachable: {error}", h.node));
            continue;
        }
        table.row(vec![
            h.node.clone(),
            "ok".to_owned(),
            h.latency.map_or("-".to_owned(), format::duration),
            h.quarantined.map_or("-".to_owned(), |left| {
                format!("{} left", format::duration(left))
            }),
            or_dash(h.version.as_deref()),
            or_dash(h.role.as_deref()),
            h.uptime.map_or("-".to_owned(), format::duration),
            match h.maxmemory {
                Some(0) => "none".to_owned(),
                Some(limit) => format::bytes(limit),
                None => "?".to_owned(),
            },
            or_dash(h.maxmemory_policy.as_deref()),
            persistence(h),
        ]);
        for warning in &h.warnings {
            notes.push(format!("{}: {warning}", h.node));
        }
    }
    let mut out = table.render();
    if !notes.is_empty() {
        line(&mut out, "\nWarnings:");
        for note in notes {
            line(&mut out, format!("  {note}"));
        }
    }
    out
}

/// `redlock locks [PREFIX] [--limit N]`.
pub(crate) async fn locks(global: &Global, prefix: &str, limit: usize) -> Result<Report, CliError> {
    let (redlock, _) = client(global)?;
    let listing = redlock
        .locks(prefix)
        .limit(limit)
        .timeout(global.timeout)
        .await
        .map_err(|err| match err {
            Error::NoQuorum {
                needed,
                total,
                failures,
                ..
            } => CliError::failed(format!(
                "cannot list the locks: only {} of {total} Redis nodes answered and {needed} are needed: {}; check that they are up and that --nodes / {NODES_ENV} names them",
                total.saturating_sub(failures.len()),
                named_failures(&failures)
            )),
            other => CliError::failed(format!("cannot list the locks: {other}")),
        })?;
    let output = if global.json {
        format::json(&listing)?
    } else {
        render_locks(&listing)
    };
    let mut report = Report::ok(output);
    if listing.truncated {
        report.warnings.push(format!(
            "more than {} locks are held: only the first {} by name are listed; raise --limit or narrow the prefix",
            listing.locks.len(),
            listing.locks.len()
        ));
    }
    if !listing.failures.is_empty() {
        report.warnings.push(format!(
            "{} of {} nodes did not answer: {}; the listing is from the others (every lock held has a majority, so none is missed) but lacks their view: bring them back",
            listing.failures.len(),
            listing.nodes,
            named_failures(&listing.failures)
        ));
        report.code = EXIT_PARTIAL;
    }
    Ok(report)
}

fn agreement(agreement: Agreement) -> &'static str {
    match agreement {
        Agreement::Majority => "majority",
        Agreement::Minority => "minority",
        Agreement::Conflicting => "conflicting",
        _ => "?",
    }
}

fn holder(lock: &HeldLock) -> String {
    match &lock.holder {
        Some(holder) => holder.clone(),
        None if lock.handed_over => "(handed over)".to_owned(),
        None => "?".to_owned(),
    }
}

fn render_locks(listing: &LockListing) -> String {
    if listing.locks.is_empty() && listing.semaphores.is_empty() && listing.rw_locks.is_empty() {
        return if listing.prefix.is_empty() {
            "no locks held\n".to_owned()
        } else {
            format!(
                "no locks held on resources starting with `{}`\n",
                listing.prefix
            )
        };
    }
    let mut out = String::new();
    if !listing.locks.is_empty() {
        let mut table = Table::new(&[
            "RESOURCE",
            "HOLDER",
            "AGREEMENT",
            "HOLDING",
            "VALIDITY",
            "FENCING TOKEN",
            "WAITERS",
        ]);
        for lock in &listing.locks {
            table.row(vec![
                lock.resource.clone(),
                holder(lock),
                agreement(lock.agreement).to_owned(),
                format!("{}/{}", lock.holding, listing.nodes),
                lock.validity.map_or("-".to_owned(), format::duration),
                or_dash(lock.fencing_token),
                lock.waiters.to_string(),
            ]);
        }
        out.push_str(&table.render());
    }
    if !listing.semaphores.is_empty() {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&render_semaphores(&listing.semaphores, listing.quorum));
    }
    if !listing.rw_locks.is_empty() {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&render_rw_locks(&listing.rw_locks));
    }
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let mut counts = vec![plural(listing.locks.len(), "lock", "locks")];
    if !listing.semaphores.is_empty() {
        counts.push(plural(listing.semaphores.len(), "semaphore", "semaphores"));
    }
    if !listing.rw_locks.is_empty() {
        counts.push(plural(
            listing.rw_locks.len(),
            "read-write lock",
            "read-write locks",
        ));
    }
    line(&mut out, format!("\n{}", counts.join(", ")));
    out
}

/// One row per semaphore slot held on some node: `name`, permits used of its size (on
/// the semaphore's first row), the slot, holder, validity and fencing token.
fn render_semaphores(semaphores: &[HeldSemaphore], quorum: usize) -> String {
    let mut table = Table::new(&[
        "SEMAPHORE",
        "PERMITS USED",
        "SLOT",
        "HOLDER",
        "VALIDITY",
        "FENCING TOKEN",
    ]);
    for semaphore in semaphores {
        let used = format!(
            "{}/{}",
            semaphore.used,
            semaphore
                .permits
                .map_or_else(|| "?".to_owned(), |p| p.to_string())
        );
        if semaphore.slots.is_empty() {
            table.row(vec![
                semaphore.name.clone(),
                used.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]);
        }
        for (i, slot) in semaphore.slots.iter().enumerate() {
            let mut who = holder(&slot.lock);
            if !slot.is_held(quorum) {
                who.push_str(" (not on a majority)");
            }
            table.row(vec![
                if i == 0 {
                    semaphore.name.clone()
                } else {
                    String::new()
                },
                if i == 0 { used.clone() } else { String::new() },
                slot.slot.to_string(),
                who,
                slot.lock.validity.map_or("-".to_owned(), format::duration),
                or_dash(slot.lock.fencing_token),
            ]);
        }
    }
    table.render()
}

/// One row per read-write lock: writer, readers, a waiting writer, fencing counter.
fn render_rw_locks(locks: &[HeldRwLock]) -> String {
    let mut table = Table::new(&[
        "RW LOCK",
        "WRITER",
        "READERS",
        "WRITER WAITING",
        "VALIDITY",
        "FENCING TOKEN",
    ]);
    for lock in locks {
        let writer = lock.writer.as_ref().map_or_else(
            || "-".to_owned(),
            |w| match w.agreement {
                Agreement::Majority => holder(w),
                other => format!("{} ({})", holder(w), agreement(other)),
            },
        );
        let readers: Vec<String> = lock
            .readers
            .iter()
            .map(|r| r.holder.clone().unwrap_or_else(|| "?".to_owned()))
            .collect();
        // The writer's validity, or the readers' (the soonest to end).
        let validity = lock
            .writer
            .as_ref()
            .and_then(|w| w.validity)
            .or_else(|| lock.readers.iter().filter_map(|r| r.validity).min());
        table.row(vec![
            lock.name.clone(),
            writer,
            if readers.is_empty() {
                "-".to_owned()
            } else {
                format!("{}: {}", readers.len(), readers.join(", "))
            },
            format::yes_no(lock.writer_waiting),
            validity.map_or("-".to_owned(), format::duration),
            or_dash(lock.fencing_token),
        ]);
    }
    table.render()
}

/// What `release --json` prints: the core's report and the number of nodes.
#[derive(Serialize)]
struct Released<'a> {
    #[serde(flatten)]
    released: &'a ForceReleased,
    /// Nodes configured.
    nodes: usize,
}

/// `redlock release KEY --force`.
pub(crate) async fn release(global: &Global, key: &str, force: bool) -> Result<Report, CliError> {
    if !force {
        return Err(CliError::usage(format!(
            "refusing to release `{key}` without --force: it deletes the lock on every node whoever holds it (the holder is not told, and learns it at its next extension) and raises the resource's fencing counter so that the holder's token is stale; nothing was done; run `redlock release {key} --force` to do it"
        )));
    }
    let (redlock, nodes) = client(global)?;
    let released = redlock.force_release(key).await.map_err(|err| match err {
        Error::Argument(err) => CliError::failed(format!("cannot release `{key}`: {err}")),
        Error::Config(err) => CliError::failed(format!("cannot release `{key}`: {err}")),
        other => CliError::failed(format!(
            "cannot release `{key}`: {other}; check that the nodes are up and that --nodes / {NODES_ENV} names them"
        )),
    })?;
    let output = if global.json {
        format::json(&Released {
            released: &released,
            nodes,
        })?
    } else {
        let mut out = String::new();
        if released.deleted == 0 {
            line(
                &mut out,
                format!("`{key}` was not held on any node reached; nothing deleted"),
            );
        } else {
            line(
                &mut out,
                format!(
                    "released `{key}` by force: deleted on {} of {nodes} nodes",
                    released.deleted
                ),
            );
        }
        line(
            &mut out,
            format!(
                "fencing token now {}: tokens handed out before are stale, the next holder's is above it",
                released.fencing_token
            ),
        );
        out
    };
    let mut report = Report::ok(output);
    if !released.failures.is_empty() {
        report.warnings.push(format!(
            "{} of {nodes} nodes could not be reached: {}; their copy of the lock expires by its TTL",
            released.failures.len(),
            named_failures(&released.failures)
        ));
        report.code = EXIT_PARTIAL;
    }
    Ok(report)
}

/// What `release --semaphore --json` and `release --rw --json` print: the core's
/// report and the number of nodes.
#[derive(Serialize)]
struct GroupReleased<'a, T: Serialize> {
    #[serde(flatten)]
    released: &'a T,
    /// Nodes configured.
    nodes: usize,
}

/// The usage error of a forced release without `--force`.
fn without_force(what: &str, does: &str, again: &str) -> CliError {
    CliError::usage(format!(
        "refusing to release {what} without --force: {does} (the holders are not told, and learn it at their next extension); nothing was done; run `redlock release {again} --force` to do it"
    ))
}

/// The error of a forced release that failed.
fn release_failed(what: &str, err: Error) -> CliError {
    match err {
        Error::Argument(err) => CliError::failed(format!("cannot release {what}: {err}")),
        Error::Config(err) => CliError::failed(format!("cannot release {what}: {err}")),
        other => CliError::failed(format!(
            "cannot release {what}: {other}; check that the nodes are up and that --nodes / {NODES_ENV} names them"
        )),
    }
}

/// Exit code 3 and a warning when some nodes were not reached.
fn partial(report: &mut Report, failures: &[NodeFailure], nodes: usize) {
    if !failures.is_empty() {
        report.warnings.push(format!(
            "{} of {nodes} nodes could not be reached: {}; their keys expire by their TTLs",
            failures.len(),
            named_failures(failures)
        ));
        report.code = EXIT_PARTIAL;
    }
}

/// `redlock release --semaphore NAME --force`.
pub(crate) async fn release_semaphore(
    global: &Global,
    name: &str,
    force: bool,
) -> Result<Report, CliError> {
    if !force {
        return Err(without_force(
            &format!("the permits of semaphore `{name}`"),
            "it deletes every permit of the semaphore on every node whoever holds it and raises each slot's fencing counter so that the holders' tokens are stale",
            &format!("--semaphore {name}"),
        ));
    }
    let (redlock, nodes) = client(global)?;
    let released: SemaphoreReleased = redlock
        .force_release_semaphore(name)
        .await
        .map_err(|err| release_failed(&format!("semaphore `{name}`"), err))?;
    let output = if global.json {
        format::json(&GroupReleased {
            released: &released,
            nodes,
        })?
    } else {
        let mut out = String::new();
        let size = released.permits.map_or_else(
            || "size not recorded".to_owned(),
            |p| format!("{p} permits"),
        );
        line(
            &mut out,
            format!(
                "released semaphore `{name}` ({size}) by force: {} of {} slots were held",
                released.released(),
                released.slots.len()
            ),
        );
        if !released.slots.is_empty() {
            let mut table = Table::new(&["SLOT", "DELETED ON", "FENCING TOKEN NOW"]);
            for slot in &released.slots {
                table.row(vec![
                    slot.slot.to_string(),
                    format!("{}/{nodes}", slot.deleted),
                    slot.fencing_token.to_string(),
                ]);
            }
            out.push_str(&table.render());
            line(
                &mut out,
                "tokens handed out before are stale; each slot's next holder's is above its counter",
            );
        }
        out
    };
    let mut report = Report::ok(output);
    partial(&mut report, &released.failures, nodes);
    Ok(report)
}

/// `redlock release --rw NAME --force`.
pub(crate) async fn release_rw(
    global: &Global,
    name: &str,
    force: bool,
) -> Result<Report, CliError> {
    if !force {
        return Err(without_force(
            &format!("read-write lock `{name}`"),
            "it deletes its writer, every reader and the waiting writers' queue on every node and raises the writer's fencing counter so that the writer's token is stale",
            &format!("--rw {name}"),
        ));
    }
    let (redlock, nodes) = client(global)?;
    let released: RwReleased = redlock
        .force_release_rw(name)
        .await
        .map_err(|err| release_failed(&format!("read-write lock `{name}`"), err))?;
    let output = if global.json {
        format::json(&GroupReleased {
            released: &released,
            nodes,
        })?
    } else {
        let mut out = String::new();
        line(
            &mut out,
            format!(
                "released read-write lock `{name}` by force: writer deleted on {} of {nodes} nodes, {} reader{} deleted, waiting writers' queue deleted on {} nodes",
                released.writer_deleted,
                released.readers_deleted,
                if released.readers_deleted == 1 {
                    ""
                } else {
                    "s"
                },
                released.writer_waiting_deleted,
            ),
        );
        line(
            &mut out,
            format!(
                "fencing token now {}: writers' tokens handed out before are stale, the next writer's is above it",
                released.fencing_token
            ),
        );
        out
    };
    let mut report = Report::ok(output);
    partial(&mut report, &released.failures, nodes);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn global(nodes: &[&str]) -> Global {
        use clap::Parser;
        let mut args = vec!["redlock".to_owned()];
        if !nodes.is_empty() {
            args.push("--nodes".to_owned());
            args.push(nodes.join(","));
        }
        args.push("nodes".to_owned());
        crate::cli::Cli::parse_from(args).global
    }

    #[test]
    fn no_nodes_names_the_flag_and_variable() {
        let err = node_urls(&global(&[])).unwrap_err();
        assert!(err.message.contains("--nodes") && err.message.contains("REDLOCK_NODES"));
        assert_eq!(err.code, 1);
    }

    #[test]
    fn bad_urls_are_reported() {
        let Err(err) = client(&global(&["redis://a:1", "redis://a:1"])) else {
            panic!("a duplicate node must be refused");
        };
        assert!(err.message.contains("listed twice"), "{}", err.message);
    }
}

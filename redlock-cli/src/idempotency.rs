//! `idempotency list`: the records an idempotency store keeps (the services'
//! `redlock-idempotency` middleware), read from Redis or a SQL database.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redlock_idempotency::store::{RedisStore, SqlStore};
use redlock_idempotency::{RecordSummary, Store, StoreError};
use serde_json::{Value, json};

use crate::cli::{Global, IdempotencyList};
use crate::format::{self, Table, or_dash};
use crate::outcome::{CliError, Report};

/// The kind of store a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Redis,
    Sql,
}

/// The store kind of `url`, from its scheme.
fn kind(url: &str) -> Result<Kind, CliError> {
    let scheme = url
        .split_once(':')
        .map(|(scheme, _)| scheme.to_ascii_lowercase())
        .unwrap_or_default();
    match scheme.as_str() {
        "redis" | "rediss" => Ok(Kind::Redis),
        "postgres" | "postgresql" | "sqlite" => Ok(Kind::Sql),
        _ => Err(CliError::failed(format!(
            "--store must be an idempotency store's URL: redis://HOST[:PORT][/DB] or rediss://... (a RedisStore), postgres://USER@HOST/DB or sqlite://PATH (a SqlStore){}",
            if scheme.is_empty() {
                String::new()
            } else {
                format!("; `{scheme}:` is none of them")
            }
        ))),
    }
}

/// Opens the store `--store` names, with its `--table` or `--redis-prefix`.
async fn open(list: &IdempotencyList) -> Result<Arc<dyn Store>, CliError> {
    let url = list.store.trim();
    let connect = |err: StoreError| {
        CliError::failed(format!(
            "cannot reach the idempotency store: {err}; check --store and that the store is up"
        ))
    };
    match kind(url)? {
        Kind::Redis => {
            if list.table.is_some() {
                return Err(CliError::usage(
                    "--table names a SQL store's table: this --store is a Redis URL (its keys' prefix is --redis-prefix)",
                ));
            }
            let store = RedisStore::open(url).await.map_err(connect)?;
            Ok(Arc::new(match &list.redis_prefix {
                Some(prefix) => store.prefix(prefix.clone()),
                None => store,
            }))
        }
        Kind::Sql => {
            if list.redis_prefix.is_some() {
                return Err(CliError::usage(
                    "--redis-prefix is the prefix of a Redis store's keys: this --store is a SQL URL (its table is --table)",
                ));
            }
            let store = SqlStore::connect(url).await.map_err(connect)?;
            match &list.table {
                Some(table) => store
                    .table(table.clone())
                    .map_err(|err| CliError::failed(format!("--table: {err}"))),
                None => Ok(store),
            }
            .map(|store| Arc::new(store) as Arc<dyn Store>)
        }
    }
}

/// `idempotency list`: the records whose id starts with `--prefix`, in id order.
pub(crate) async fn list(global: &Global, list: &IdempotencyList) -> Result<Report, CliError> {
    let limit = list.limit.max(1);
    let prefix = list.prefix.as_deref().unwrap_or_default();
    let listed = tokio::time::timeout(global.timeout, async {
        let store = open(list).await?;
        store
            .list(prefix, limit.saturating_add(1))
            .await
            .map_err(|err| {
                CliError::failed(format!(
                    "cannot list the idempotency records: {err}; check --store{} and that the store is up",
                    if list.table.is_some() || matches!(kind(&list.store), Ok(Kind::Sql)) {
                        " and --table (the services create the table: SqlStore::migrate)"
                    } else {
                        ""
                    }
                ))
            })
    })
    .await
    .map_err(|_| {
        CliError::failed(format!(
            "the idempotency store did not answer within {}: check --store and that the store is up (or raise --timeout)",
            format::duration(global.timeout)
        ))
    })??;
    let mut records = listed;
    let truncated = records.len() > limit;
    records.truncate(limit);
    let output = if global.json {
        format::json(&to_json(prefix, &records, truncated))?
    } else {
        render(prefix, &records, Utc::now())
    };
    let mut report = Report::ok(output);
    if truncated {
        report.warnings.push(format!(
            "more than {limit} records match: only the first {limit} by id are listed; raise --limit or narrow --prefix"
        ));
    }
    Ok(report)
}

/// The listing as JSON, as the admin service's `/api/idempotency` answers it.
fn to_json(prefix: &str, records: &[RecordSummary], truncated: bool) -> Value {
    let records: Vec<Value> = records
        .iter()
        .map(|record| {
            json!({
                "id": record.id,
                "state": record.state.as_str(),
                "token": record.token,
                "started_ms": record.started_ms,
                "status": record.status,
                "body_len": record.body_len,
                "expires_in_ms": record.expires_in.map(millis),
            })
        })
        .collect();
    json!({"prefix": prefix, "records": records, "truncated": truncated})
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The listing as a table.
fn render(prefix: &str, records: &[RecordSummary], now: DateTime<Utc>) -> String {
    if records.is_empty() {
        return if prefix.is_empty() {
            "no idempotency records\n".to_owned()
        } else {
            format!("no idempotency records with ids starting with `{prefix}`\n")
        };
    }
    let mut table = Table::new(&[
        "ID",
        "STATE",
        "TOKEN",
        "STARTED",
        "STATUS",
        "BODY",
        "EXPIRES IN",
    ]);
    for record in records {
        let started = i64::try_from(record.started_ms)
            .ok()
            .and_then(DateTime::from_timestamp_millis)
            .map_or_else(
                || record.started_ms.to_string(),
                |t| format::time_from(t, now),
            );
        table.row(vec![
            record.id.clone(),
            record.state.as_str().to_owned(),
            record.token.to_string(),
            started,
            or_dash(record.status),
            or_dash(
                record
                    .body_len
                    .map(|n| format::bytes(u64::try_from(n).unwrap_or(u64::MAX))),
            ),
            or_dash(record.expires_in.map(format::duration)),
        ]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_kinds_by_scheme() {
        assert_eq!(kind("redis://127.0.0.1:6379").ok(), Some(Kind::Redis));
        assert_eq!(kind("REDISS://host").ok(), Some(Kind::Redis));
        assert_eq!(kind("postgres://u@h/db").ok(), Some(Kind::Sql));
        assert_eq!(kind("postgresql://u@h/db").ok(), Some(Kind::Sql));
        assert_eq!(kind("sqlite://x.db").ok(), Some(Kind::Sql));
        assert_eq!(kind("sqlite::memory:").ok(), Some(Kind::Sql));
        let err = kind("mysql://h/db").err().map(|e| e.message);
        assert!(err.is_some_and(|m| m.contains("`mysql:`")));
        assert!(kind("just-a-host").is_err());
    }
}

//! Which database a history URL names: parsed, not pattern-matched.
//!
//! - `sqlite:PATH`, `sqlite://PATH` (a file, created if missing unless the query says a
//!   `mode`), `sqlite::memory:` (private to its pool), `sqlite:NAME?mode=memory&cache=shared`
//!   (in memory, shared between pools of this process);
//! - `postgres://USER[:PASSWORD]@HOST[:PORT]/DB` (or `postgresql://`).
//!
//! A file path that merely contains the word "memory" is a file.

use super::HistoryError as Error;

/// The database behind a history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

/// A parsed history URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) backend: Backend,
    /// The URL handed to sqlx.
    pub(crate) url: String,
    /// The place, as errors name it: `host:port/db` or the file path (no credentials).
    pub(crate) place: String,
    /// An in-memory SQLite database private to its pool (one connection, kept open).
    pub(crate) private_memory: bool,
    /// An in-memory SQLite database shared by name (keep one connection open).
    pub(crate) shared_memory: bool,
}

impl Target {
    pub(crate) fn parse(url: &str) -> Result<Self, Error> {
        let url = url.trim();
        let invalid = |reason: &str| Error::InvalidUrl {
            url: redact(url),
            reason: reason.to_owned(),
        };
        let Some((scheme, rest)) = url.split_once(':') else {
            return Err(invalid(
                "no scheme: write sqlite://PATH, sqlite::memory: or postgres://USER@HOST/DB",
            ));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "sqlite" => Self::sqlite(url, rest).ok_or_else(|| invalid("no database path")),
            "postgres" | "postgresql" => Self::postgres(url).map_err(|reason| invalid(&reason)),
            other => Err(invalid(&format!(
                "unsupported scheme `{other}`: write sqlite://PATH, sqlite::memory: or postgres://USER@HOST/DB"
            ))),
        }
    }

    fn sqlite(url: &str, rest: &str) -> Option<Self> {
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        let (path, query) = match rest.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (rest, None),
        };
        if path.is_empty() {
            return None;
        }
        let mode = query.and_then(|q| {
            q.split('&')
                .filter_map(|pair| pair.split_once('='))
                .find(|(key, _)| *key == "mode")
                .map(|(_, value)| value.to_owned())
        });
        let private_memory = path == ":memory:";
        let shared_memory = !private_memory && mode.as_deref() == Some("memory");
        let url = if private_memory || mode.is_some() {
            url.to_owned()
        } else {
            // A file: create it if missing.
            let sep = if query.is_some() { '&' } else { '?' };
            format!("{url}{sep}mode=rwc")
        };
        Some(Self {
            backend: Backend::Sqlite,
            url,
            place: if private_memory || shared_memory {
                format!("SQLite in memory ({path})")
            } else {
                format!("SQLite file {path}")
            },
            private_memory,
            shared_memory,
        })
    }

    fn postgres(url: &str) -> Result<Self, String> {
        let parsed = url::Url::parse(url).map_err(|err| err.to_string())?;
        let host = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .unwrap_or("localhost");
        let port = parsed.port().unwrap_or(5432);
        let db = parsed.path().trim_start_matches('/');
        Ok(Self {
            backend: Backend::Postgres,
            url: url.to_owned(),
            place: if db.is_empty() {
                format!("PostgreSQL at {host}:{port}")
            } else {
                format!("PostgreSQL at {host}:{port}/{db}")
            },
            private_memory: false,
            shared_memory: false,
        })
    }
}

/// `url` without its password, for errors and logs.
pub(crate) fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sqlite_forms() {
        let file = Target::parse("sqlite:///tmp/memory-reports/history.db").unwrap();
        assert_eq!(file.backend, Backend::Sqlite);
        assert!(
            !file.private_memory && !file.shared_memory,
            "a path with `memory` is a file"
        );
        assert_eq!(file.url, "sqlite:///tmp/memory-reports/history.db?mode=rwc");
        let relative = Target::parse("sqlite:history.db?cache=shared").unwrap();
        assert_eq!(relative.url, "sqlite:history.db?cache=shared&mode=rwc");
        let private = Target::parse("sqlite::memory:").unwrap();
        assert!(private.private_memory);
        assert_eq!(private.url, "sqlite::memory:");
        let shared = Target::parse("sqlite:file:a?mode=memory&cache=shared").unwrap();
        assert!(shared.shared_memory && !shared.private_memory);
        let read_only = Target::parse("sqlite://h.db?mode=ro").unwrap();
        assert_eq!(read_only.url, "sqlite://h.db?mode=ro");
    }

    #[test]
    fn postgres_forms_and_errors() {
        let pg = Target::parse("postgres://root:secret@db.internal:6543/app").unwrap();
        assert_eq!(pg.backend, Backend::Postgres);
        assert_eq!(pg.place, "PostgreSQL at db.internal:6543/app");
        assert_eq!(
            Target::parse("postgresql://localhost").unwrap().place,
            "PostgreSQL at localhost:5432"
        );
        let no_scheme = Target::parse("localhost/db").unwrap_err().to_string();
        assert!(no_scheme.contains("no scheme"), "{no_scheme}");
        let mysql = Target::parse("mysql://root:pw@h/db")
            .unwrap_err()
            .to_string();
        assert!(mysql.contains("unsupported scheme `mysql`"), "{mysql}");
        assert!(!mysql.contains("pw@"), "the password is redacted: {mysql}");
        assert!(Target::parse("sqlite:").is_err());
    }
}

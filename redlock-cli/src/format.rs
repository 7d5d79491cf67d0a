//! Human output: aligned tables, durations (`29.5s`, `4m05s`), times (RFC 3339 with
//! how long ago or ahead), sizes; and JSON.

use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

use crate::outcome::CliError;

/// A table whose columns are padded to their widest cell (the last one is not padded).
#[derive(Debug)]
pub(crate) struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub(crate) fn new(headers: &[&str]) -> Self {
        Self {
            rows: vec![headers.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    /// Adds a row (as many cells as headers).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table, one line per row.
    pub(crate) fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0; columns];
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let pad = widths[i] - cell.chars().count();
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// A duration for people: `312µs`, `4.2ms`, `29.5s`, `4m05s`, `2h03m`, `3d04h`.
pub(crate) fn duration(d: Duration) -> String {
    let micros = d.as_micros();
    let secs = d.as_secs();
    if micros < 1_000 {
        format!("{micros}µs")
    } else if micros < 10_000 {
        format!("{:.1}ms", d.as_secs_f64() * 1000.0)
    } else if micros < 1_000_000 {
        format!("{}ms", d.as_millis())
    } else if secs < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else if secs < 86_400 {
        format!("{}h{:02}m", secs / 3600, secs % 3600 / 60)
    } else {
        format!("{}d{:02}h", secs / 86_400, secs % 86_400 / 3600)
    }
}

/// A time as RFC 3339 (UTC; fractions of a second only where there are some, as in a
/// manual run's tick).
pub(crate) fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// A time as RFC 3339 with how far it is from `now`: `... (in 4.0s)`, `... (12s ago)`.
pub(crate) fn time_from(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let delta = t - now;
    match delta.to_std() {
        Ok(ahead) => format!("{} (in {})", time(t), duration(ahead)),
        Err(_) => {
            let ago = (now - t).to_std().unwrap_or_default();
            format!("{} ({} ago)", time(t), duration(ago))
        }
    }
}

/// A size in bytes for people: `512B`, `1.5KiB`, `2.0GiB`.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n}B");
    }
    #[allow(clippy::cast_precision_loss)] // a size shown with one decimal
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1}{}", UNITS[unit])
}

/// `value`, or `-` when absent.
pub(crate) fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// `yes` or `no`.
pub(crate) fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_owned()
}

/// `value` as pretty JSON, with a final newline.
pub(crate) fn json<T: Serialize + ?Sized>(value: &T) -> Result<String, CliError> {
    let mut out = serde_json::to_string_pretty(value)
        .map_err(|err| CliError::failed(format!("cannot write the JSON output: {err}")))?;
    out.push('\n');
    Ok(out)
}

/// Appends a line to `out`.
pub(crate) fn line(out: &mut String, text: impl std::fmt::Display) {
    let _ = writeln!(out, "{text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_for_people() {
        assert_eq!(duration(Duration::from_micros(312)), "312µs");
        assert_eq!(duration(Duration::from_micros(4_200)), "4.2ms");
        assert_eq!(duration(Duration::from_millis(250)), "250ms");
        assert_eq!(duration(Duration::from_millis(29_500)), "29.5s");
        assert_eq!(duration(Duration::from_secs(245)), "4m05s");
        assert_eq!(duration(Duration::from_secs(7380)), "2h03m");
        assert_eq!(
            duration(Duration::from_secs(3 * 86_400 + 4 * 3600)),
            "3d04h"
        );
    }

    #[test]
    fn sizes_and_times() {
        assert_eq!(bytes(512), "512B");
        assert_eq!(bytes(1536), "1.5KiB");
        assert_eq!(bytes(2 << 30), "2.0GiB");
        let now = DateTime::parse_from_rfc3339("2024-05-01T10:00:00Z")
            .unwrap()
            .to_utc();
        let later = now + chrono::Duration::seconds(4);
        assert_eq!(time_from(later, now), "2024-05-01T10:00:04Z (in 4.0s)");
        assert_eq!(time_from(now, later), "2024-05-01T10:00:00Z (4.0s ago)");
        let manual = now + chrono::Duration::milliseconds(436);
        assert_eq!(time(manual), "2024-05-01T10:00:00.436Z");
    }

    #[test]
    fn tables_align() {
        let mut table = Table::new(&["A", "LONGER"]);
        table.row(vec!["wide cell".into(), "x".into()]);
        assert_eq!(table.render(), "A          LONGER\nwide cell  x\n");
    }
}

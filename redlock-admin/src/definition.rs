//! A job's definition as `POST /api/jobs` and `POST /api/jobs/{job}/reschedule` take it:
//! a JSON object whose fields are those of a
//! [`JobSpec`](redlock_scheduler::JobSpec), each optional but the name and schedule of
//! a job added.
//!
//! ```json
//! {"name": "export-eu", "schedule": "0 */5 * * * *", "handler": "export",
//!  "time_zone": "Europe/Paris", "misfire": "catch_up:3", "misfire_grace_ms": 5000,
//!  "timeout_ms": 60000, "dst": "skip/twice", "run_on_leader": true}
//! ```
//!
//! `misfire` is `"skip"`, `"run_once"` or `"catch_up:<max>"`, or the object a
//! `JobChange` shows (`{"policy": "catch_up", "max": 3}`); `dst` is `<gap>/<fold>` or
//! the object `/api/jobs` shows (`{"gap": "skip", "fold": "twice"}`); `timeout_ms`
//! `null` is no timeout. A field this version does not know is refused (a typo would
//! otherwise change nothing silently).

use std::time::Duration;

use redlock_scheduler::JobSpec;
use redlock_scheduler::job::Misfire;
use redlock_scheduler::time::DstPolicy;
use serde_json::{Map, Value};

/// The fields a definition may have.
const FIELDS: &str =
    "name, schedule, handler, time_zone, misfire, misfire_grace_ms, timeout_ms, dst, run_on_leader";

/// The fields given in a request's body; `None`: not given (a job added takes the
/// default, a job rescheduled keeps its value).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Definition {
    pub(crate) name: Option<String>,
    schedule: Option<String>,
    handler: Option<String>,
    time_zone: Option<String>,
    misfire: Option<Misfire>,
    grace: Option<Duration>,
    /// `Some(None)`: no timeout (`"timeout_ms": null`).
    timeout: Option<Option<Duration>>,
    dst: Option<DstPolicy>,
    run_on_leader: Option<bool>,
}

impl Definition {
    /// Reads a JSON object; what is wrong with it, in words, if it cannot be read.
    pub(crate) fn from_json(body: &[u8]) -> Result<Self, String> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(format!(
                "send the job's definition as a JSON object in the body ({FIELDS})"
            ));
        }
        let value: Value = serde_json::from_slice(body)
            .map_err(|err| format!("the body is not valid JSON: {err}"))?;
        let Value::Object(object) = value else {
            return Err(format!(
                "the body must be a JSON object with the job's fields ({FIELDS})"
            ));
        };
        Self::from_object(object)
    }

    fn from_object(object: Map<String, Value>) -> Result<Self, String> {
        let mut definition = Self::default();
        for (field, value) in object {
            match field.as_str() {
                "name" => definition.name = Some(string(&field, value)?),
                "schedule" => definition.schedule = Some(string(&field, value)?),
                "handler" => definition.handler = Some(string(&field, value)?),
                "time_zone" => definition.time_zone = Some(string(&field, value)?),
                "misfire" => definition.misfire = Some(misfire(value)?),
                "misfire_grace_ms" => {
                    definition.grace = Some(millis(&field, &value)?);
                }
                "timeout_ms" => {
                    definition.timeout = Some(match value {
                        Value::Null => None,
                        value => Some(millis(&field, &value)?),
                    });
                }
                "dst" => definition.dst = Some(dst(value)?),
                "run_on_leader" => {
                    definition.run_on_leader =
                        Some(value.as_bool().ok_or_else(|| {
                            format!("`{field}` must be true or false, not {value}")
                        })?);
                }
                _ => {
                    return Err(format!(
                        "unknown field `{field}` in the job's definition: the fields are {FIELDS}"
                    ));
                }
            }
        }
        Ok(definition)
    }

    /// Whether it changes nothing (no field but, perhaps, the name).
    pub(crate) fn changes_nothing(&self) -> bool {
        *self
            == Self {
                name: self.name.clone(),
                ..Self::default()
            }
    }

    /// A new job's spec: the name and schedule are needed; the handler is the job's
    /// name unless given, the rest [`JobSpec`]'s defaults.
    pub(crate) fn into_spec(mut self) -> Result<JobSpec, String> {
        let Some(name) = self.name.take() else {
            return Err("the job's definition needs a `name`".to_owned());
        };
        let Some(schedule) = self.schedule.take() else {
            return Err(format!(
                "the job's definition needs a `schedule` (a cron expression: 5 fields, or 6 with seconds first) for `{name}`"
            ));
        };
        Ok(self.apply(JobSpec::new(name, schedule)))
    }

    /// `spec` with the fields given changed (the name aside).
    pub(crate) fn apply(self, mut spec: JobSpec) -> JobSpec {
        if let Some(schedule) = self.schedule {
            spec = spec.schedule(schedule);
        }
        if let Some(handler) = self.handler {
            spec = spec.handler(handler);
        }
        if let Some(zone) = self.time_zone {
            spec = spec.time_zone(zone);
        }
        if let Some(misfire) = self.misfire {
            spec = spec.misfire(misfire);
        }
        if let Some(grace) = self.grace {
            spec = spec.misfire_grace(grace);
        }
        if let Some(timeout) = self.timeout {
            spec = spec.timeout(timeout);
        }
        if let Some(dst) = self.dst {
            spec = spec.dst(dst);
        }
        if let Some(on_leader) = self.run_on_leader {
            spec = spec.run_on_leader(on_leader);
        }
        spec
    }
}

fn string(field: &str, value: Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s),
        other => Err(format!("`{field}` must be a string, not {other}")),
    }
}

fn millis(field: &str, value: &Value) -> Result<Duration, String> {
    value
        .as_u64()
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{field}` must be a whole number of milliseconds, not {value}"))
}

/// A misfire policy as text: `skip`, `run_once`, `catch_up:<max>`.
pub(crate) fn misfire_of_text(text: &str) -> Option<Misfire> {
    match text.trim() {
        "skip" => Some(Misfire::Skip),
        "run_once" => Some(Misfire::RunOnce),
        other => other
            .strip_prefix("catch_up:")
            .and_then(|max| max.trim().parse().ok())
            .map(|max| Misfire::CatchUp { max }),
    }
}

/// `misfire`: the text, or the object a `JobChange` shows.
fn misfire(value: Value) -> Result<Misfire, String> {
    let invalid = |value: &Value| {
        format!(
            "`misfire` must be \"skip\", \"run_once\" or \"catch_up:<max>\" (or {{\"policy\": \"catch_up\", \"max\": <max>}}), not {value}"
        )
    };
    let text = match &value {
        Value::String(text) => text.clone(),
        Value::Object(object) => match (
            object.get("policy").and_then(Value::as_str),
            object.get("max"),
            object.len(),
        ) {
            (Some(policy @ ("skip" | "run_once")), None, 1) => policy.to_owned(),
            (Some("catch_up"), Some(max), 2) => {
                format!("catch_up:{}", max.as_u64().ok_or_else(|| invalid(&value))?)
            }
            _ => return Err(invalid(&value)),
        },
        _ => return Err(invalid(&value)),
    };
    misfire_of_text(&text).ok_or_else(|| invalid(&value))
}

/// `dst`: `<gap>/<fold>`, or the object `/api/jobs` shows.
fn dst(value: Value) -> Result<DstPolicy, String> {
    let text = match &value {
        Value::String(text) => text.clone(),
        Value::Object(object) if object.len() == 2 => match (
            object.get("gap").and_then(Value::as_str),
            object.get("fold").and_then(Value::as_str),
        ) {
            (Some(gap), Some(fold)) => format!("{gap}/{fold}"),
            _ => String::new(),
        },
        _ => String::new(),
    };
    text.parse::<DstPolicy>()
        .map_err(|_| format!("`dst` must be \"<gap>/<fold>\": gap `run_at_end` or `skip`, fold `once` or `twice` (such as \"skip/twice\"), not {value}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use redlock_scheduler::time::{Fold, Gap};

    fn json_of(spec: &JobSpec) -> Value {
        serde_json::to_value(spec).unwrap()
    }

    #[test]
    fn a_full_definition_is_read() {
        let body = br#"{"name": "export-eu", "schedule": "0 */5 * * * *", "handler": "export",
            "time_zone": "Europe/Paris", "misfire": "catch_up:3", "misfire_grace_ms": 5000,
            "timeout_ms": 60000, "dst": "skip/twice", "run_on_leader": true}"#;
        let spec = Definition::from_json(body).unwrap().into_spec().unwrap();
        let expected = JobSpec::new("export-eu", "0 */5 * * * *")
            .handler("export")
            .time_zone("Europe/Paris")
            .misfire(Misfire::CatchUp { max: 3 })
            .misfire_grace(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .dst(DstPolicy::new().gap(Gap::Skip).fold(Fold::Twice))
            .run_on_leader(true);
        assert_eq!(spec, expected);
        // What a JobChange shows is read back the same.
        let mut shown = json_of(&expected);
        shown["dst"] = serde_json::json!({"gap": "skip", "fold": "twice"});
        let again = Definition::from_json(shown.to_string().as_bytes()).unwrap();
        assert_eq!(again.into_spec().unwrap(), expected);
    }

    #[test]
    fn a_minimal_definition_takes_the_defaults() {
        let definition = Definition::from_json(br#"{"name": "a", "schedule": "* * * * *"}"#);
        let spec = definition.unwrap().into_spec().unwrap();
        assert_eq!(spec, JobSpec::new("a", "* * * * *"));
        assert_eq!(spec.handler_name(), "a");
    }

    #[test]
    fn given_fields_change_and_the_others_stay() {
        let current = JobSpec::new("a", "* * * * *")
            .handler("h")
            .time_zone("Europe/Paris")
            .timeout(Duration::from_secs(9))
            .run_on_leader(true);
        let definition = Definition::from_json(br#"{"schedule": "*/5 * * * *"}"#).unwrap();
        assert!(!definition.changes_nothing());
        assert_eq!(
            definition.apply(current.clone()),
            current.clone().schedule("*/5 * * * *")
        );
        let cleared =
            Definition::from_json(br#"{"timeout_ms": null, "misfire": {"policy": "skip"}}"#)
                .unwrap()
                .apply(current.clone());
        assert_eq!(cleared, current.timeout(None).misfire(Misfire::Skip));
        assert!(
            Definition::from_json(br#"{"name": "a"}"#)
                .unwrap()
                .changes_nothing()
        );
    }

    #[test]
    fn malformed_definitions_say_what_is_wrong() {
        for (body, says) in [
            (&b""[..], "JSON object"),
            (b"[1]", "JSON object"),
            (b"{", "not valid JSON"),
            (
                br#"{"name": "a", "cron": "* * * * *"}"#,
                "unknown field `cron`",
            ),
            (br#"{"name": 3}"#, "`name` must be a string"),
            (br#"{"timeout_ms": -1}"#, "whole number of milliseconds"),
            (
                br#"{"misfire_grace_ms": 1.5}"#,
                "whole number of milliseconds",
            ),
            (br#"{"misfire": "sometimes"}"#, "`misfire` must be"),
            (br#"{"misfire": "catch_up:x"}"#, "`misfire` must be"),
            (
                br#"{"misfire": {"policy": "catch_up"}}"#,
                "`misfire` must be",
            ),
            (br#"{"dst": "skip"}"#, "`dst` must be"),
            (br#"{"run_on_leader": "yes"}"#, "true or false"),
        ] {
            let err = Definition::from_json(body).unwrap_err();
            assert!(
                err.contains(says),
                "{}: {err}",
                String::from_utf8_lossy(body)
            );
        }
        assert!(
            Definition::from_json(br#"{"schedule": "* * * * *"}"#)
                .unwrap()
                .into_spec()
                .unwrap_err()
                .contains("`name`")
        );
        assert!(
            Definition::from_json(br#"{"name": "a"}"#)
                .unwrap()
                .into_spec()
                .unwrap_err()
                .contains("`schedule`")
        );
    }

    #[test]
    fn misfire_texts() {
        assert_eq!(misfire_of_text("skip"), Some(Misfire::Skip));
        assert_eq!(misfire_of_text("run_once"), Some(Misfire::RunOnce));
        assert_eq!(
            misfire_of_text("catch_up:4"),
            Some(Misfire::CatchUp { max: 4 })
        );
        assert_eq!(misfire_of_text("catch_up"), None);
        assert_eq!(misfire_of_text("catch_up:-1"), None);
    }
}

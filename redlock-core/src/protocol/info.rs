//! Reading an `INFO` reply.

/// The value of field `name` in an `INFO` reply (`name:value` lines), trimmed.
pub(crate) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:5\r\n";
        assert_eq!(info_field(info, "run_id"), Some("abc123"));
        assert_eq!(info_field(info, "uptime_in_seconds"), Some("5"));
        // A name that is only the start of another field's name is not that field.
        assert_eq!(info_field(info, "uptime"), None);
        assert_eq!(info_field("# Server\r\n", "run_id"), None);
    }
}

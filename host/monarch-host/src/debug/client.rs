//! `monarch-host debug`: the `monarch_dbg>` prompt.

/// `monarch-host debug`.
#[derive(Debug, clap::Args)]
pub struct DebugArgs {}

/// Runs `monarch-host debug`.
pub fn command(args: DebugArgs) -> std::process::ExitCode {
    let _ = args;
    eprintln!("monarch-host debug: not built yet");
    std::process::ExitCode::FAILURE
}

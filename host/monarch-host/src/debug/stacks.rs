//! `monarch-host stacks`: each actor's current stack, sampled at its next
//! epoch tick without stopping it.

/// What one instance shows of its stack when asked.
#[derive(Debug, Default)]
pub struct Probe {}

/// `monarch-host stacks`.
#[derive(Debug, clap::Args)]
pub struct StacksArgs {}

/// Runs `monarch-host stacks`.
pub fn command(args: StacksArgs) -> std::process::ExitCode {
    let _ = args;
    eprintln!("monarch-host stacks: not built yet");
    std::process::ExitCode::FAILURE
}

//! The `monarch-host` command.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use monarch_host::{Sandbox, run_program};

/// Runs single-controller distributed programs: a sandboxed WebAssembly
/// controller that spawns meshes of procs and actors, calls them, and
/// handles their failures as values.
#[derive(Debug, Parser)]
#[command(name = "monarch-host", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs a program (a component built for the WIT world
    /// `monarch:host/program`) on procs in this process, and exits 0 when its
    /// `run` returns Ok.
    ///
    /// Example: monarch-host run hello.wasm -- --greeting hi
    Run {
        /// The program: a .wasm component, e.g. built with
        /// `cargo build --release --target wasm32-wasip2`.
        app: PathBuf,
        /// The most procs the program may spawn.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
        procs: u32,
        /// Linear memory per instance, in MiB.
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
        memory: u32,
        /// Wall-clock limit for the whole run, in seconds.
        #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
        timeout: u64,
        /// How long a call waits for replies unless the program sets
        /// another timeout, in seconds.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
        call_timeout: u64,
        /// Threads that run the controller and the actors. With 1 (the
        /// default) everything runs on one thread and a call to an actor
        /// costs a few microseconds; more threads let busy actors compute in
        /// parallel, at the price of waking threads (tens of microseconds
        /// per call on virtual machines).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
        threads: u16,
        /// Arguments passed to the program's `run`.
        #[arg(last = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Command::Run {
        app,
        procs,
        memory,
        timeout,
        call_timeout,
        threads,
        args,
    } = cli.command;
    tracing_subscriber::fmt()
        .with_env_filter(
            // Actor failures reach the program as values; their Wasm
            // backtraces are logged at info (RUST_LOG=monarch_host=info).
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,hyperactor::actor=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads.into());
        builder
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("monarch-host: error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let sandbox = Sandbox {
        memory_bytes: memory as usize * (1 << 20),
        deadline: Duration::from_secs(timeout),
        call_timeout: Duration::from_secs(call_timeout),
        max_procs: procs as usize,
    };
    let log = Arc::new(|line: &str| println!("{line}"));
    let outcome = runtime.block_on(async move {
        tokio::spawn(async move { run_program(&app, &args, sandbox, log).await }).await
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    match outcome {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("monarch-host: error: {e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("monarch-host: error: the run panicked: {e}");
            ExitCode::FAILURE
        }
    }
}

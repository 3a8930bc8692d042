//! The `monarch-host` command.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use monarch_host::{Placement, Sandbox, run_program};

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
    /// `monarch:host/program`) and exits 0 when its `run` returns Ok. Its
    /// procs are child processes of this one (or, with --in-process, run
    /// inside it).
    ///
    /// Example: monarch-host run hello.wasm -- --greeting hi
    Run(RunArgs),
    /// Serves one proc of a mesh; monarch-host starts it, not users.
    #[command(hide = true)]
    Bootstrap,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The program: a .wasm component, e.g. built with
    /// `cargo build --release --target wasm32-wasip2`.
    app: PathBuf,
    /// The most procs the program may spawn; each is a child process.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    procs: u32,
    /// Runs the procs inside this process instead of as child
    /// processes: calls are cheaper, but a crash ends everything.
    #[arg(long)]
    in_process: bool,
    /// The fan-out of the multicast trees that carry casts to meshes.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    fanout: u32,
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
    /// Threads of this process, which runs the controller (and, with
    /// --in-process, the actors). With 1 (the default) a call to an actor
    /// in this process costs a few microseconds; more threads let busy
    /// in-process actors compute in parallel, at the price of waking
    /// threads (tens of microseconds per call on virtual machines). Each
    /// child proc runs on a thread of its own.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// Arguments passed to the program's `run`.
    #[arg(last = true)]
    args: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let RunArgs {
        app,
        procs,
        in_process,
        fanout,
        memory,
        timeout,
        call_timeout,
        threads,
        args,
    } = match cli.command {
        Command::Bootstrap => return bootstrap(),
        Command::Run(run) => run,
    };
    init_tracing();
    let placement = if in_process {
        Placement::InProcess
    } else {
        match std::env::current_exe() {
            Ok(program) => Placement::Local { program },
            Err(e) => {
                eprintln!("monarch-host: error: cannot find this binary to start procs: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
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
        placement,
        fanout,
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

fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            // Actor failures reach the program as values; their Wasm
            // backtraces are logged at info (RUST_LOG=monarch_host=info).
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,hyperactor::actor=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// A child proc: serves until its parent goes away.
fn bootstrap() -> ExitCode {
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("monarch-host bootstrap: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(hyperactor_mesh::alloc::bootstrap_main(|config| {
        monarch_host::wasm_actor::registry(config.blob_dir.clone(), None)
    }));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("monarch-host bootstrap: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

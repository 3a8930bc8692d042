//! The `mesh` suite: Wasm actors on procs that are child processes, driven
//! by a Wasm controller, the way `monarch-host run` runs a program.
//!
//! The guest program (`host/bench/guest`, in its `mesh` mode) spawns the
//! procs, times everything with the monotonic clock WASI grants it and
//! logs `BENCH` lines (see [`crate::guest`]); this side runs it on
//! `monarch-host`'s library with [`Placement::Local`], so every proc is a
//! child process, and measures the floor, a bare Unix socket round trip
//! between two processes, in the same run.
//!
//! ```text
//! this process: controller (Wasm) + mesh client   child processes (this binary, `bootstrap`)
//!   spawn-procs / call / broadcast  ----- unix, multicast tree ----->  comm actor -> Wasm actors
//!                                   <---- gathered / reduced replies -
//! raw client (blocking std sockets) <---------- unix ---------->  raw-echo
//! ```
//!
//! The procs run this binary's hidden `bootstrap` subcommand, which serves a
//! proc exactly as `monarch-host bootstrap` does, so the suite needs no
//! separately built `monarch-host`; `--proc-program` names another binary
//! with that subcommand (a `monarch-host`) instead.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use monarch_host::{Placement, Sandbox};

use crate::guest::{self, Record};
use crate::raw::RawStream;
use crate::report::{Spread, Unit, emit, median};
use crate::runtime::raw_rtt;
use crate::worker::{Scratch, Worker};

const SUITE: &str = "mesh";

/// Every metric the guest reports in this suite.
pub const GUEST_METRICS: [&str; 6] = [
    "spawn_procs_8_ms",
    "call_gather_8_us",
    "spawn_procs_16_ms",
    "call_gather_16_us",
    "broadcast_100_then_call_16_ms",
    "cast_reduce_1024_us",
];

/// Quiet time before a round of the floor.
const FLOOR_SETTLE: Duration = Duration::from_millis(200);

/// Payload of a floor round trip: about what a small call's frame holds.
const FLOOR_PAYLOAD: usize = 64;

/// Arguments of the mesh suite.
#[derive(Debug, Args)]
pub struct MeshArgs {
    /// Far fewer repetitions: a smoke test of a few seconds; rough figures.
    #[arg(long)]
    quick: bool,
    /// Threads of this process's runtime, as `monarch-host run --threads`:
    /// 1 (the default, as there) is a current-thread runtime. Each proc
    /// runs a current-thread runtime of its own.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,
    /// The fan-out of the multicast trees that carry calls, as
    /// `monarch-host run --fanout`.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    fanout: u32,
    /// The guest program.
    #[arg(long, default_value = guest::DEFAULT_PROGRAM)]
    program: PathBuf,
    /// The binary every proc runs as `PROC_PROGRAM bootstrap`: by default
    /// this one; a `monarch-host` binary works too.
    #[arg(long)]
    proc_program: Option<PathBuf>,
}

/// Runs the suite and writes its records to stdout.
pub async fn run(args: MeshArgs) -> anyhow::Result<()> {
    let began = Instant::now();
    guest::check_program(&args.program)?;
    let proc_program = match args.proc_program {
        Some(path) => path,
        None => std::env::current_exe().context("cannot find this binary to start procs")?,
    };
    anyhow::ensure!(
        proc_program.exists(),
        "{} does not exist; --proc-program names a binary with a `bootstrap` subcommand (monarch-bench or monarch-host: `cargo build --release -p monarch-host`)",
        proc_program.display()
    );
    tracing::info!(
        quick = args.quick,
        threads = args.threads,
        fanout = args.fanout,
        program = %args.program.display(),
        procs = %proc_program.display(),
        "mesh suite"
    );

    // The floor, half before the program and half after it, so that a
    // machine that changes speed in between moves both.
    let samples = if args.quick { 1_000 } else { 10_000 };
    let scratch = Scratch::new()?;
    let raw_worker = Worker::start(
        "raw unix echo",
        &[
            "raw-echo".to_string(),
            "--addr".into(),
            scratch.unix_addr("raw.sock")?.to_string(),
        ],
    )
    .await?;
    let mut raw = RawStream::connect(raw_worker.ready())?;
    (raw, _) = raw_rtt(raw, FLOOR_PAYLOAD, samples / 5).await?;
    tokio::time::sleep(FLOOR_SETTLE).await;
    let (mut raw, mut floor) = raw_rtt(raw, FLOOR_PAYLOAD, samples / 2).await?;

    let sandbox = Sandbox {
        placement: Placement::Local {
            program: proc_program,
        },
        fanout: args.fanout,
        // The guest spawns fresh procs for every timed spawn: 5 of 8 and 5
        // of 16 procs in the full suite, and the host counts every proc a
        // run spawns, stopped or not.
        max_procs: 256,
        deadline: Duration::from_secs(110),
        ..Sandbox::default()
    };
    let mut guest_args = vec!["mesh".to_string()];
    if args.quick {
        guest_args.push("quick".into());
    }
    let records = guest::run(&args.program, &guest_args, sandbox)
        .await
        .context("the mesh benchmark program failed")?;
    guest::expect_metrics(&records, &GUEST_METRICS)?;
    // In the documented order, whatever order the guest measured them in.
    let mut records = records;
    records.sort_by_key(|r| GUEST_METRICS.iter().position(|m| *m == r.metric));
    for record in &records {
        emit(SUITE, &record.metric, record.value, record.unit)?;
    }

    tokio::time::sleep(FLOOR_SETTLE).await;
    let more;
    (raw, more) = raw_rtt(raw, FLOOR_PAYLOAD, samples / 2).await?;
    floor.extend(more);
    drop(raw);
    raw_worker.stop().await?;
    if let Some(spread) = Spread::of(&floor) {
        tracing::info!(
            metric = "raw_unix_rtt_us",
            samples = floor.len(),
            p10 = format!("{:.2}", spread.p10),
            p50 = format!("{:.2}", spread.p50),
            p90 = format!("{:.2}", spread.p90),
            p99 = format!("{:.2}", spread.p99),
            "round trip, us"
        );
    }
    let floor = median(&floor).context("no samples for raw_unix_rtt_us")?;
    emit(SUITE, "raw_unix_rtt_us", floor, Unit::Micros)?;
    log_ratios(&records, floor);
    tracing::info!(
        seconds = format!("{:.1}", began.elapsed().as_secs_f64()),
        "mesh suite done"
    );
    Ok(())
}

/// Logs every figure as a multiple of the floor.
fn log_ratios(records: &[Record], floor_us: f64) {
    for record in records {
        let micros = match record.unit {
            Unit::Nanos => record.value / 1e3,
            Unit::Micros => record.value,
            Unit::Millis => record.value * 1e3,
            Unit::CallsPerSec | Unit::MsgsPerSec => continue,
        };
        tracing::info!(
            metric = record.metric,
            over_raw_unix_rtt = format!("{:.1}", micros / floor_us),
            "as a multiple of the floor"
        );
    }
}

//! The `mesh` suite: Wasm actors on procs that are child processes, driven
//! by a Wasm controller, the way `monarch-host run` runs a program.
//!
//! The guest program (`host/bench/guest`, in its `mesh` mode) spawns the
//! procs, times everything with the monotonic clock WASI grants it and
//! logs `BENCH` lines (see [`crate::guest`]); a child process of this
//! binary (`mesh-round`) runs it on `monarch-host`'s library with
//! [`Placement::Local`], so every proc is a child process of that one, and
//! this side measures the floor, a bare Unix socket round trip between two
//! processes, in the same run.
//!
//! Each round runs in a fresh process, as `monarch-host run` runs a
//! program and as each peer's round is a Python process of its own: a
//! second program run in one process gathered 5 - 15 % slower than the
//! first (docs/benchmarks.md, "Rounds in processes of their own").
//!
//! ```text
//! round process: controller (Wasm) + mesh client   child processes (this binary, `bootstrap`)
//!   spawn-procs / call / broadcast  ----- unix, multicast tree ----->  comm actor -> Wasm actors
//!                                   <---- gathered / reduced replies -
//! raw client (blocking std sockets) <---------- unix ---------->  raw-echo
//! ```
//!
//! The procs run this binary's hidden `bootstrap` subcommand, which serves a
//! proc exactly as `monarch-host bootstrap` does, so the suite needs no
//! separately built `monarch-host`; `--proc-program` names another binary
//! with that subcommand (a `monarch-host`) instead.
//!
//! # The peers, side by side
//!
//! `--peers` then runs the same workloads on PyTorch Monarch 0.7.0 and Ray
//! 2.60.0 in the same run: `host/bench/peers/monarch_mesh.py` and
//! `ray_mesh.py` (built into this binary, written to a scratch directory
//! and run with `--peers-python`, by default `target/peers-venv/bin/python`).
//! Each prints records with a `peer` field, which are checked and passed
//! on to stdout:
//!
//! ```text
//! {"suite":"mesh","metric":"call_gather_8_us","peer":"monarch-0.7.0","value":2977.47,"unit":"us"}
//! ```
//!
//! With peers the suite runs in rounds (`--rounds`, 3 by default): this
//! host's workloads, then Monarch's, three times in turn, then Ray's three
//! times (its cluster takes seconds to stop, so it overlaps none of this
//! host's rounds). Every record, this host's and each peer's, is the
//! median of its rounds; each round's figures go to the log. A virtual
//! machine's speed moves from one minute to the next, and a slow minute
//! then falls on each system alike rather than on one.
//!
//! Each round also notes the share of the machine's CPU time the
//! hypervisor took while each metric was measured ([`crate::steal`]:
//! `/proc/stat` read as each figure is logged, by this host's program and
//! by the peers' scripts alike). A round in which more than `--max-steal`
//! (5 %) was stolen while any metric ran is run again, in turn as before,
//! up to `--rounds` more times, and each figure is the median over the
//! `--rounds` rounds in which the least was stolen while that metric ran:
//! every system is read from seconds in which it had the machine's CPUs.
//! The log says what each metric lost in each round and which rounds a
//! figure leaves out. Not with `--quick`.
//!
//! A missing Python or package is a warning on stderr (with the command
//! that installs them), not an error: the suite's own records stand. A
//! table of this host's figures beside the peers' goes to stderr.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use monarch_host::{Placement, Sandbox};
use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::guest::{self, Record};
use crate::raw::{self, RawStream};
use crate::report::{Unit, emit, log_spread, median};
use crate::runtime::raw_rtt;
use crate::steal::{self, CpuTimes};
use crate::worker::{Scratch, Worker};
use std::sync::{Arc, Mutex};

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

/// What each round of this host's runs, and how: arguments of both `mesh`
/// and `mesh-round`.
#[derive(Debug, Args)]
pub struct Workload {
    /// Far fewer repetitions: a smoke test of a few seconds; rough figures.
    #[arg(long)]
    quick: bool,
    /// Threads of the controller's runtime, as `monarch-host run
    /// --threads`: 1 (the default, as there) is a current-thread runtime.
    /// Each proc runs a current-thread runtime of its own.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,
    /// The fan-out of the multicast trees that carry calls, as
    /// `monarch-host run --fanout`.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    fanout: u32,
    /// The guest program.
    #[arg(long, default_value = guest::DEFAULT_PROGRAM)]
    program: PathBuf,
}

impl Workload {
    /// These arguments as flags on a command line, for `mesh-round`.
    fn args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec![
            "--threads".into(),
            self.threads.to_string().into(),
            "--fanout".into(),
            self.fanout.to_string().into(),
            "--program".into(),
            self.program.clone().into(),
        ];
        if self.quick {
            args.push("--quick".into());
        }
        args
    }
}

/// Arguments of the mesh suite.
#[derive(Debug, Args)]
pub struct MeshArgs {
    #[command(flatten)]
    pub workload: Workload,
    /// The binary every proc runs as `PROC_PROGRAM bootstrap`: by default
    /// this one; a `monarch-host` binary works too.
    #[arg(long)]
    proc_program: Option<PathBuf>,
    /// Also run the same workloads on PyTorch Monarch 0.7.0 and Ray 2.60.0
    /// (`host/bench/peers/*.py`) in the same run and print their records
    /// too, each with a `peer` field: 3 rounds by default (`--rounds`),
    /// Monarch's in turn with this host's and Ray's after them; about six
    /// minutes on 2 cores. Needs Python with both packages: `python3 -m venv
    /// target/peers-venv && target/peers-venv/bin/pip install
    /// torchmonarch==0.7.0 ray==2.60.0`.
    #[arg(long)]
    peers: bool,
    /// Runs this host's workloads and each peer's this many times, in
    /// turn (this host, Monarch, Ray, this host, ...), and reports each
    /// metric's median over the rounds: a virtual machine's speed moves
    /// from one minute to the next (by up to 3 x on the 2-vCPU VMs of
    /// docs/benchmarks.md, as the hypervisor takes their CPUs), and rounds
    /// in turn let a slow minute fall on every system alike. Default: 3
    /// with `--peers` (when a peer can run), else 1.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=9))]
    rounds: Option<u32>,
    /// A round in which the hypervisor took more than PCT % of the
    /// machine's CPU time (`steal` in /proc/stat) while any metric ran is
    /// run again, up to `--rounds` more times, and each figure is the
    /// median of the rounds that lost least while its metric ran. 100
    /// never runs a round again. Not with `--quick`.
    #[arg(long, default_value_t = 5.0, value_name = "PCT", value_parser = parse_pct)]
    max_steal: f64,
    /// The Python that runs the peers (`--peers`).
    #[arg(long, default_value = DEFAULT_PEERS_PYTHON, value_name = "PATH")]
    peers_python: PathBuf,
    /// Traces every cast with replies, as `monarch-host run --trace-file`,
    /// into FILE: the suite then measures what tracing costs (compare a
    /// run without it).
    #[arg(long, value_name = "FILE")]
    trace_file: Option<PathBuf>,
}

/// Runs the suite and writes its records to stdout.
pub async fn run(args: MeshArgs) -> anyhow::Result<()> {
    let began = Instant::now();
    guest::check_program(&args.workload.program)?;
    let proc_program = match args.proc_program.clone() {
        Some(path) => path,
        None => {
            hyperactor_mesh::exe::current_exe().context("cannot find this binary to start procs")?
        }
    };
    anyhow::ensure!(
        proc_program.exists(),
        "{} does not exist; --proc-program names a binary with a `bootstrap` subcommand (monarch-bench or monarch-host: `cargo build --release -p monarch-host`)",
        proc_program.display()
    );
    tracing::info!(
        quick = args.workload.quick,
        threads = args.workload.threads,
        fanout = args.workload.fanout,
        program = %args.workload.program.display(),
        procs = %proc_program.display(),
        "mesh suite"
    );

    // The floor, half before the program and half after it, so that a
    // machine that changes speed in between moves both.
    let samples = if args.workload.quick { 1_000 } else { 10_000 };
    let scratch = Scratch::new()?;
    let (raw_worker, mut raw, mut floor) = unix_floor(&scratch, samples).await?;

    // Each round runs in a process of its own (this binary's `mesh-round`),
    // as `monarch-host run` runs a program and as each peer's round is a
    // Python process of its own.
    let exe =
        hyperactor_mesh::exe::current_exe().context("cannot find this binary to run rounds")?;
    let round_command = |traced: bool| {
        let mut command = tokio::process::Command::new(&exe);
        command
            .arg("mesh-round")
            .args(args.workload.args())
            .arg("--proc-program")
            .arg(&proc_program);
        if let (true, Some(file)) = (traced, &args.trace_file) {
            command.arg("--trace-file").arg(file);
        }
        command
    };
    let peers = match args.peers {
        true => ready_peers(&args.peers_python, scratch.path()).await?,
        false => Vec::new(),
    };
    let rounds = args
        .rounds
        .unwrap_or(if peers.is_empty() { 1 } else { PEER_ROUNDS });
    // Rounds that lost more than `--max-steal` to the hypervisor are run
    // again, up to `rounds` more times (not in a smoke run).
    let passes = if args.workload.quick {
        rounds
    } else {
        rounds * 2
    };
    let mut ours: Vec<OurRound> = Vec::new();
    let mut peer_rounds: Vec<PeerRound> = Vec::new();
    let in_turn: Vec<&'static Peer> = peers.iter().copied().filter(|p| p.in_turn).collect();
    for round in 1..=passes {
        let ours_clean = ours
            .iter()
            .map(|r| Some(r.stolen.worst()))
            .collect::<Vec<_>>();
        if round > rounds
            && enough_clean(&ours_clean, rounds, args.max_steal)
            && !in_turn
                .iter()
                .any(|p| peer_wants_more(&peer_rounds, p, rounds, args.max_steal))
        {
            break;
        }
        if round > rounds {
            tracing::info!(
                round,
                max_steal = args.max_steal,
                "a round again: the hypervisor took more than --max-steal of the CPUs in one before"
            );
        }
        let span = steal::Span::begin();
        // The machine's CPU times as each figure is logged: what was
        // stolen while each metric was measured.
        let marks: Arc<Mutex<Vec<Mark>>> = Arc::default();
        let watch = {
            let marks = marks.clone();
            move |line: &str| {
                if let Ok(Some(record)) = guest::parse_line(line)
                    && let Ok(mut marks) = marks.lock()
                {
                    marks.push((record.metric, CpuTimes::now()));
                }
            }
        };
        // Only the first round is traced.
        let (records, _) = guest::run_in_child(round_command(round == 1), ROUND_LIMIT, watch)
            .await
            .context("the mesh benchmark program failed")?;
        let marks = marks.lock().map(|mut m| std::mem::take(&mut *m));
        let stolen = Stolen::since(&span, &marks.unwrap_or_default());
        guest::expect_metrics(&records, &GUEST_METRICS)?;
        if passes > 1 {
            let figures: Vec<String> = records
                .iter()
                .map(|r| format!("{} {:.2}", r.metric, r.value))
                .collect();
            tracing::info!(
                round,
                rounds,
                stolen = steal::pct(stolen.whole),
                "this host: {}",
                figures.join(", ")
            );
            stolen.log("this host", round);
        }
        ours.push(OurRound {
            round,
            records,
            stolen,
        });
        run_peer_round(&args, scratch.path(), &in_turn, round, &mut peer_rounds).await;
    }
    // Ray's cluster takes seconds to stop after its script ends: its
    // rounds come last, so that they overlap none of this host's.
    let last: Vec<&'static Peer> = peers.iter().copied().filter(|p| !p.in_turn).collect();
    for round in 1..=passes {
        let more = last
            .iter()
            .any(|p| peer_wants_more(&peer_rounds, p, rounds, args.max_steal));
        if last.is_empty() || (round > rounds && !more) {
            break;
        }
        run_peer_round(&args, scratch.path(), &last, round, &mut peer_rounds).await;
    }
    // Each metric's median over the rounds, in the documented order: over
    // the `rounds` rounds in which the least was stolen while it ran.
    let mut left_out = Vec::new();
    let records: Vec<Record> = GUEST_METRICS
        .iter()
        .filter_map(|metric| {
            let ran: Vec<(u32, Option<f64>)> = ours
                .iter()
                .map(|r| (r.round, r.stolen.during(metric)))
                .collect();
            let used = least_stolen(metric, &ran, rounds as usize, &mut left_out);
            let values: Vec<f64> = ours
                .iter()
                .filter(|round| used.contains(&round.round))
                .filter_map(|round| round.records.iter().find(|r| r.metric == *metric))
                .map(|r| r.value)
                .collect();
            let unit = ours[0].records.iter().find(|r| r.metric == *metric)?.unit;
            Some(Record {
                metric: metric.to_string(),
                value: median(&values)?,
                unit,
            })
        })
        .collect();
    log_left_out("this host", &left_out);
    let theirs = least_stolen_peer_records(&peer_rounds, rounds as usize);
    for record in &records {
        emit(SUITE, &record.metric, record.value, record.unit)?;
    }

    tokio::time::sleep(FLOOR_SETTLE).await;
    let more;
    (raw, more) = raw_rtt(raw, FLOOR_PAYLOAD, samples / 2).await?;
    floor.extend(more);
    drop(raw);
    raw_worker.stop().await?;
    log_spread("raw_unix_rtt_us", &floor, "round trip, us");
    let floor = median(&floor).context("no samples for raw_unix_rtt_us")?;
    emit(SUITE, "raw_unix_rtt_us", floor, Unit::Micros)?;
    log_ratios(&records, floor);
    let gather_floors = gather_floor(&scratch, args.workload.quick).await?;
    for (metric, micros) in &gather_floors {
        emit(SUITE, metric, *micros, Unit::Micros)?;
    }
    log_gather_ratios(&records, &gather_floors);
    tracing::info!(
        seconds = format!("{:.1}", began.elapsed().as_secs_f64()),
        "mesh suite done"
    );
    if !peers.is_empty() {
        let peers = peer_medians(&theirs)?;
        log_comparison(&records, &peers, &gather_floors);
    }
    Ok(())
}

/// How long a round of this host's may take, its procs' start included,
/// before it is killed: past the program's own deadline
/// ([`round_sandbox`]).
const ROUND_LIMIT: Duration = Duration::from_secs(150);

/// Arguments of `mesh-round`, one round of this host's in a process of
/// its own; [`run`] passes them on from its own.
#[derive(Debug, Args)]
pub struct MeshRoundArgs {
    #[command(flatten)]
    pub workload: Workload,
    /// The binary every proc runs as `PROC_PROGRAM bootstrap`.
    #[arg(long)]
    proc_program: PathBuf,
    /// As `mesh --trace-file`.
    #[arg(long, value_name = "FILE")]
    trace_file: Option<PathBuf>,
}

/// The sandbox of every round: the guest spawns fresh procs for every timed
/// spawn (5 of 8 and 5 of 16 procs in the full suite), and the host counts
/// every proc a run spawns, stopped or not.
fn round_sandbox(proc_program: PathBuf, fanout: u32) -> Sandbox {
    Sandbox {
        placement: Placement::Local {
            program: proc_program,
        },
        fanout,
        max_procs: 256,
        deadline: Duration::from_secs(110),
        ..Sandbox::default()
    }
}

/// One round of this host's (`mesh-round`): runs the guest program's mesh
/// workloads and writes each line of its log to stdout as it is logged.
pub async fn run_round(args: MeshRoundArgs) -> anyhow::Result<()> {
    let mut guest_args = vec!["mesh".to_string()];
    if args.workload.quick {
        guest_args.push("quick".into());
    }
    let traces = match &args.trace_file {
        Some(file) => Some(
            monarch_host::traces::TraceOutput::start(None, Some(file))
                .map_err(|e| anyhow::anyhow!(e))?,
        ),
        None => None,
    };
    let sandbox = round_sandbox(args.proc_program, args.workload.fanout);
    monarch_host::run_program(
        &args.workload.program,
        &guest_args,
        sandbox,
        guest::stdout_sink(),
    )
    .await
    .context("the mesh benchmark program failed")?;
    if let Some(traces) = traces {
        let report = traces.finish(Duration::from_secs(30));
        tracing::info!(
            traces = report.traces,
            spans = report.spans,
            dropped = report.dropped,
            "casts traced"
        );
    }
    Ok(())
}

/// Starts the floor of the mesh-like suites, a bare Unix socket round trip
/// between this process and a `raw-echo` worker, and measures its first
/// half: `samples / 5` untimed round trips, a pause, then `samples / 2`
/// timed ones. The caller measures the second half after its program.
pub(crate) async fn unix_floor(
    scratch: &Scratch,
    samples: usize,
) -> anyhow::Result<(Worker, RawStream, Vec<f64>)> {
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
    let (raw, floor) = raw_rtt(raw, FLOOR_PAYLOAD, samples / 2).await?;
    Ok((raw_worker, raw, floor))
}

/// The gathers of the suite and the metric of the floor of each: a bare
/// gather over as many `raw-echo` worker processes.
const GATHER_FLOORS: [(&str, &str, usize); 2] = [
    ("call_gather_8_us", "raw_gather_8_us", 8),
    ("call_gather_16_us", "raw_gather_16_us", 16),
];

/// Measures the floor of the suite's gathers: one `raw-echo` worker
/// process per proc, and from this process, 64 bytes written to each, then
/// 64 read back from each, over blocking Unix sockets. Medians after a
/// warm-up, as `(metric, us)`.
async fn gather_floor(scratch: &Scratch, quick: bool) -> anyhow::Result<Vec<(String, f64)>> {
    let (warmup, samples) = if quick { (10, 50) } else { (200, 2_000) };
    let most = GATHER_FLOORS.iter().map(|(_, _, n)| *n).max().unwrap_or(0);
    let mut workers = Vec::with_capacity(most);
    for i in 0..most {
        let addr = scratch.unix_addr(&format!("gather-{i}.sock"))?;
        let args = ["raw-echo".to_string(), "--addr".into(), addr.to_string()];
        workers.push(Worker::start("raw gather echo", &args).await?);
    }
    let streams = workers
        .iter()
        .map(|worker| RawStream::connect(worker.ready()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    tokio::time::sleep(FLOOR_SETTLE).await;
    let timed = tokio::task::spawn_blocking(move || {
        let mut streams = streams;
        let mut timed = Vec::new();
        for (_, metric, procs) in GATHER_FLOORS {
            raw::gathers(&mut streams[..procs], FLOOR_PAYLOAD, warmup)?;
            timed.push((
                metric,
                raw::gathers(&mut streams[..procs], FLOOR_PAYLOAD, samples)?,
            ));
        }
        anyhow::Ok(timed)
    })
    .await
    .context("the raw gather thread panicked")??;
    for worker in workers {
        worker.stop().await?;
    }
    let mut floors = Vec::with_capacity(timed.len());
    for (metric, micros) in timed {
        log_spread(metric, &micros, "gather, us");
        let median = median(&micros).with_context(|| format!("no samples for {metric}"))?;
        floors.push((metric.to_string(), median));
    }
    Ok(floors)
}

/// Logs each gather as a multiple of its floor.
fn log_gather_ratios(records: &[Record], floors: &[(String, f64)]) {
    for (gather, floor_metric, _) in GATHER_FLOORS {
        let measured = records.iter().find(|r| r.metric == gather);
        let floor = floors.iter().find(|(m, _)| m == floor_metric);
        if let (Some(measured), Some((_, floor))) = (measured, floor) {
            tracing::info!(
                metric = gather,
                floor = floor_metric,
                over_floor = format!("{:.2}", measured.value / floor),
                "a gather as a multiple of its floor"
            );
        }
    }
}

/// Logs every figure as a multiple of the floor.
fn log_ratios(records: &[Record], floor_us: f64) {
    for record in records {
        let micros = match record.unit {
            Unit::Nanos => record.value / 1e3,
            Unit::Micros => record.value,
            Unit::Millis => record.value * 1e3,
            Unit::Seconds => record.value * 1e6,
            Unit::CallsPerSec | Unit::MsgsPerSec | Unit::MiB => continue,
        };
        tracing::info!(
            metric = record.metric,
            over_raw_unix_rtt = format!("{:.1}", micros / floor_us),
            "as a multiple of the floor"
        );
    }
}

/// Where `--peers` looks for Python by default, from the repository root.
const DEFAULT_PEERS_PYTHON: &str = "target/peers-venv/bin/python";

/// How to install what `--peers` needs, from the repository root.
const PEERS_INSTALL: &str = "python3 -m venv target/peers-venv && target/peers-venv/bin/pip install torchmonarch==0.7.0 ray==2.60.0";

/// Rounds of each system with `--peers`, when `--rounds` does not say.
const PEER_ROUNDS: u32 = 3;

/// How long one peer's script may run (each takes about a minute on two
/// cores) before it is killed with everything it started.
const PEER_TIMEOUT: Duration = Duration::from_secs(240);

/// How long asking Python for a package's version may take.
const PEER_CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// A system that `--peers` runs the suite's workloads on.
struct Peer {
    /// The `peer` field of its records.
    label: &'static str,
    /// The Python distribution it needs, and its version.
    package: &'static str,
    version: &'static str,
    /// Its script: a file name and the text (`host/bench/peers`).
    script: &'static str,
    source: &'static str,
    /// Its rounds alternate with this host's (`--rounds`); else they run
    /// after all of them.
    in_turn: bool,
}

/// The peers, in the order they run and appear in the table.
const PEERS: [Peer; 2] = [
    Peer {
        label: "monarch-0.7.0",
        package: "torchmonarch",
        version: "0.7.0",
        script: "monarch_mesh.py",
        source: include_str!("../peers/monarch_mesh.py"),
        in_turn: true,
    },
    Peer {
        label: "ray-2.60.0",
        package: "ray",
        version: "2.60.0",
        script: "ray_mesh.py",
        source: include_str!("../peers/ray_mesh.py"),
        in_turn: false,
    },
];

/// A figure a peer reported.
#[derive(Debug, Clone, PartialEq)]
struct PeerRecord {
    peer: String,
    metric: String,
    value: f64,
    unit: String,
}

impl PeerRecord {
    /// The record as a JSON line, fields in the documented order (suite,
    /// metric, peer, value, unit).
    fn line(&self) -> String {
        let text = |s: &str| serde_json::Value::from(s).to_string();
        format!(
            "{{\"suite\":{},\"metric\":{},\"peer\":{},\"value\":{},\"unit\":{}}}",
            text(SUITE),
            text(&self.metric),
            text(&self.peer),
            serde_json::Value::from(self.value),
            text(&self.unit)
        )
    }
}

/// The unit every metric of the suite is reported in, from its name.
fn unit_of(metric: &str) -> Option<&'static str> {
    if metric.ends_with("_ms") {
        Some("ms")
    } else if metric.ends_with("_us") {
        Some("us")
    } else {
        None
    }
}

/// Checks one line a peer's script printed: a JSON object with exactly
/// the fields suite (this suite), metric (one the guest measures), peer
/// (`peer`), value (a positive number) and unit (the metric's).
fn parse_peer_line(line: &str, peer: &str) -> Result<PeerRecord, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("not JSON ({e})"))?;
    let fields = value.as_object().ok_or("not a JSON object")?;
    let text = |key: &str| {
        fields
            .get(key)
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| format!("no string field {key:?}"))
    };
    if fields.len() != 5 {
        return Err(format!(
            "{} fields where suite, metric, peer, value and unit were expected",
            fields.len()
        ));
    }
    if text("suite")? != SUITE {
        return Err(format!("suite {:?}, not {SUITE:?}", text("suite")?));
    }
    if text("peer")? != peer {
        return Err(format!("peer {:?}, not {peer:?}", text("peer")?));
    }
    let metric = text("metric")?;
    if !GUEST_METRICS.contains(&metric) {
        return Err(format!("unknown metric {metric:?}"));
    }
    let unit = text("unit")?;
    if Some(unit) != unit_of(metric) {
        return Err(format!("unit {unit:?} for {metric}"));
    }
    let figure = fields
        .get("value")
        .and_then(serde_json::Value::as_f64)
        .ok_or("no number field \"value\"")?;
    if !(figure.is_finite() && figure > 0.0) {
        return Err(format!("value {figure} is not a positive figure"));
    }
    Ok(PeerRecord {
        peer: peer.to_string(),
        metric: metric.to_string(),
        value: figure,
        unit: unit.to_string(),
    })
}

/// The peers that can run: `python` has each one's package at its
/// version; their scripts are written to `scratch`. Whatever keeps a peer
/// from running is a warning, not an error.
async fn ready_peers(python: &Path, scratch: &Path) -> anyhow::Result<Vec<&'static Peer>> {
    let mut ready = Vec::new();
    if !python.exists() {
        tracing::warn!(
            python = %python.display(),
            "--peers: no Python here, so no peer figures; from the repository root, install them with: {PEERS_INSTALL} (or name another Python with --peers-python)"
        );
        return Ok(ready);
    }
    for peer in &PEERS {
        match installed_version(python, peer.package).await {
            Ok(version) if version == peer.version => {}
            Ok(version) => {
                tracing::warn!(
                    peer = peer.label,
                    python = %python.display(),
                    "--peers: {} {version} is installed, not {}; skipping {}; install it with: {} -m pip install {}=={}",
                    peer.package,
                    peer.version,
                    peer.label,
                    python.display(),
                    peer.package,
                    peer.version
                );
                continue;
            }
            Err(err) => {
                tracing::warn!(
                    peer = peer.label,
                    python = %python.display(),
                    "--peers: {err:#}; skipping {}; install it with: {} -m pip install {}=={} (or, from the repository root: {PEERS_INSTALL})",
                    peer.label,
                    python.display(),
                    peer.package,
                    peer.version
                );
                continue;
            }
        }
        let script = scratch.join(peer.script);
        std::fs::write(&script, peer.source)
            .with_context(|| format!("cannot write {}", script.display()))?;
        ready.push(peer);
    }
    Ok(ready)
}

/// Runs each peer's script once with `python` and adds the round, its
/// records and the CPU time stolen meanwhile, to `rounds`. A peer that
/// fails is a warning: the other figures stand.
async fn run_peer_round(
    args: &MeshArgs,
    scratch: &Path,
    peers: &[&'static Peer],
    round: u32,
    rounds: &mut Vec<PeerRound>,
) {
    let (python, quick) = (&args.peers_python, args.workload.quick);
    for peer in peers {
        let script = scratch.join(peer.script);
        let began = Instant::now();
        tracing::info!(
            peer = peer.label,
            round,
            "running the suite's workloads on a peer"
        );
        let mut these = Vec::new();
        let mut marks = Vec::new();
        let span = steal::Span::begin();
        let ran = run_peer(peer, python, &script, quick, &mut these, &mut marks).await;
        let stolen = Stolen::since(&span, &marks);
        let ok = match ran {
            Ok(()) => {
                tracing::info!(
                    peer = peer.label,
                    seconds = format!("{:.1}", began.elapsed().as_secs_f64()),
                    stolen = steal::pct(stolen.whole),
                    "peer done"
                );
                true
            }
            Err(err) => {
                tracing::warn!(peer = peer.label, "--peers: {err:#}");
                false
            }
        };
        let missing: Vec<&str> = GUEST_METRICS
            .iter()
            .copied()
            .filter(|m| !these.iter().any(|r| r.metric == *m))
            .collect();
        if !missing.is_empty() {
            tracing::info!(
                peer = peer.label,
                "no figure for {} (the peer's log above says why)",
                missing.join(", ")
            );
        }
        stolen.log(peer.label, round);
        rounds.push(PeerRound {
            peer: peer.label,
            round,
            stolen,
            ok: ok && !these.is_empty(),
            records: these,
        });
    }
}

/// A metric as it was logged, and the machine's CPU times then.
type Mark = (String, Option<CpuTimes>);

/// What the hypervisor took, in percent of the machine's CPU time, over a
/// round and while each of its metrics was measured.
#[derive(Debug, Clone, Default, PartialEq)]
struct Stolen {
    whole: Option<f64>,
    /// From the figure logged before each (or the round's start) to its own.
    phases: Vec<(String, Option<f64>)>,
}

impl Stolen {
    /// What was stolen since `span` began, and between the `marks` of its
    /// figures.
    fn since(span: &steal::Span, marks: &[Mark]) -> Stolen {
        Stolen::between(span.start(), span.stolen_pct(), marks)
    }

    /// What was stolen between the `marks`, the first from `start`, in a
    /// round that lost `whole`.
    fn between(start: Option<CpuTimes>, whole: Option<f64>, marks: &[Mark]) -> Stolen {
        let mut before = start;
        let phases = marks
            .iter()
            .map(|(metric, at)| {
                let stolen = before.zip(*at).and_then(|(a, b)| a.stolen_pct_until(&b));
                before = *at;
                (metric.clone(), stolen)
            })
            .collect();
        Stolen { whole, phases }
    }

    /// What the round lost: the most stolen while any of its metrics ran,
    /// or over the whole round.
    fn worst(&self) -> Option<f64> {
        self.phases
            .iter()
            .filter_map(|(_, s)| *s)
            .chain(self.whole)
            .max_by(f64::total_cmp)
    }

    /// What was stolen while `metric` was measured; the round's share
    /// where the metric has no phase of its own or one too short to tell
    /// (two figures logged together).
    fn during(&self, metric: &str) -> Option<f64> {
        self.phases
            .iter()
            .find(|(m, _)| m == metric)
            .and_then(|(_, s)| *s)
            .or(self.whole)
    }

    /// Logs what was stolen while each metric of a round was measured.
    fn log(&self, system: &str, round: u32) {
        let each: Vec<String> = self
            .phases
            .iter()
            .map(|(metric, stolen)| format!("{metric} {}", steal::pct(*stolen)))
            .collect();
        tracing::info!(system, round, "stolen while each ran: {}", each.join(", "));
    }
}

/// One round of this host's workloads.
struct OurRound {
    round: u32,
    records: Vec<Record>,
    stolen: Stolen,
}

/// One round of a peer's workloads.
struct PeerRound {
    peer: &'static str,
    round: u32,
    stolen: Stolen,
    /// Its script ran to the end and reported figures.
    ok: bool,
    records: Vec<PeerRecord>,
}

/// Whether at least `want` of these rounds ran (`Some`) with at most
/// `max_steal` percent of the CPU time stolen (or with no way to tell).
fn enough_clean(rounds: &[Option<Option<f64>>], want: u32, max_steal: f64) -> bool {
    let clean = rounds
        .iter()
        .filter(|r| matches!(r, Some(stolen) if stolen.is_none_or(|s| s <= max_steal)))
        .count();
    clean >= want as usize
}

/// Whether `peer` should run again: it ran to the end at least once (a
/// peer that fails every time is not run again and again), and fewer than
/// `want` of its rounds ran with at most `max_steal` stolen.
fn peer_wants_more(rounds: &[PeerRound], peer: &Peer, want: u32, max_steal: f64) -> bool {
    let stolen: Vec<Option<Option<f64>>> = rounds
        .iter()
        .filter(|r| r.peer == peer.label)
        .map(|r| r.ok.then_some(r.stolen.worst()))
        .collect();
    stolen.iter().any(Option::is_some) && !enough_clean(&stolen, want, max_steal)
}

/// The `want` rounds of `metric` with the least stolen while it ran, in
/// the order they ran; a round whose stolen share cannot be told counts as
/// none stolen. The rounds it leaves out go to `left_out`, for the log.
fn least_stolen(
    metric: &str,
    rounds: &[(u32, Option<f64>)],
    want: usize,
    left_out: &mut Vec<String>,
) -> Vec<u32> {
    let mut by_steal = rounds.to_vec();
    by_steal.sort_by(|a, b| a.1.unwrap_or(0.0).total_cmp(&b.1.unwrap_or(0.0)));
    let mut used: Vec<u32> = by_steal.iter().take(want).map(|r| r.0).collect();
    used.sort_unstable();
    let out: Vec<String> = by_steal
        .iter()
        .skip(want)
        .map(|(round, stolen)| format!("{round} ({})", steal::pct(*stolen)))
        .collect();
    if !out.is_empty() {
        left_out.push(format!("{metric} without round {}", out.join(", ")));
    }
    used
}

/// Logs which rounds the figures of `system` left out.
fn log_left_out(system: &str, left_out: &[String]) {
    if !left_out.is_empty() {
        tracing::info!(
            system,
            "figures from the least-stolen rounds: {}",
            left_out.join("; ")
        );
    }
}

/// Each peer's records of each metric from its rounds that ran to the end
/// and lost least while that metric ran, as many as `want`.
fn least_stolen_peer_records(rounds: &[PeerRound], want: usize) -> Vec<PeerRecord> {
    let mut records = Vec::new();
    for peer in &PEERS {
        let mut left_out = Vec::new();
        for metric in GUEST_METRICS {
            let ran: Vec<(u32, Option<f64>)> = rounds
                .iter()
                .filter(|r| r.peer == peer.label && r.ok)
                .filter(|r| r.records.iter().any(|rec| rec.metric == metric))
                .map(|r| (r.round, r.stolen.during(metric)))
                .collect();
            let used = least_stolen(metric, &ran, want, &mut left_out);
            records.extend(
                rounds
                    .iter()
                    .filter(|r| r.peer == peer.label && used.contains(&r.round))
                    .flat_map(|r| r.records.iter().filter(|rec| rec.metric == metric))
                    .cloned(),
            );
        }
        log_left_out(peer.label, &left_out);
    }
    records
}

/// A percentage from 0 to 100, for `--max-steal`.
fn parse_pct(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(pct) if (0.0..=100.0).contains(&pct) => Ok(pct),
        _ => Err(format!("`{text}` is not a percentage from 0 to 100")),
    }
}

/// Each peer's median of each metric over its rounds, written to stdout
/// (one record a peer and metric) and returned.
fn peer_medians(records: &[PeerRecord]) -> anyhow::Result<Vec<PeerRecord>> {
    let mut medians = Vec::new();
    let mut out = std::io::stdout().lock();
    for peer in &PEERS {
        for metric in GUEST_METRICS {
            let of: Vec<&PeerRecord> = records
                .iter()
                .filter(|r| r.peer == peer.label && r.metric == metric)
                .collect();
            let values: Vec<f64> = of.iter().map(|r| r.value).collect();
            let (Some(first), Some(value)) = (of.first(), median(&values)) else {
                continue;
            };
            if of.len() > 1 {
                let each: Vec<String> = values.iter().map(|v| format!("{v:.2}")).collect();
                tracing::info!(peer = peer.label, metric, "rounds: {}", each.join(", "));
            }
            let record = PeerRecord {
                peer: peer.label.to_string(),
                metric: metric.to_string(),
                value,
                unit: first.unit.clone(),
            };
            writeln!(out, "{}", record.line())?;
            medians.push(record);
        }
    }
    out.flush()?;
    Ok(medians)
}

/// The version of `package` installed for `python`.
async fn installed_version(python: &Path, package: &str) -> anyhow::Result<String> {
    let query = tokio::process::Command::new(python)
        .args([
            "-c",
            "import importlib.metadata, sys; print(importlib.metadata.version(sys.argv[1]))",
        ])
        .arg(package)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(PEER_CHECK_TIMEOUT, query)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "{} did not say within {} s whether {package} is installed",
                python.display(),
                PEER_CHECK_TIMEOUT.as_secs()
            )
        })?
        .with_context(|| format!("cannot run {}", python.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "{package} is not installed for {}",
        python.display()
    );
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// Runs one peer's script, passing each valid record on to stdout as it
/// comes and dropping (with a warning) any other line. The script runs in
/// a process group of its own, so that a script that runs past
/// [`PEER_TIMEOUT`] is killed with every process it started.
async fn run_peer(
    peer: &Peer,
    python: &Path,
    script: &Path,
    quick: bool,
    records: &mut Vec<PeerRecord>,
    marks: &mut Vec<Mark>,
) -> anyhow::Result<()> {
    let mut command = tokio::process::Command::new(python);
    command.arg(script);
    if quick {
        command.arg("--quick");
    }
    let mut child = guest::spawn_group(&mut command)
        .with_context(|| format!("cannot run {} {}", python.display(), script.display()))?;
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let forward = async {
        let mut lines = BufReader::new(stdout).lines();
        while let Some(line) = lines.next_line().await? {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            match parse_peer_line(line, peer.label) {
                Ok(record) => {
                    marks.push((record.metric.clone(), CpuTimes::now()));
                    records.push(record);
                }
                Err(why) => tracing::warn!(
                    peer = peer.label,
                    "dropped a line of the peer's stdout ({why}): {line:?}"
                ),
            }
        }
        anyhow::Ok(child.wait().await?)
    };
    match tokio::time::timeout(PEER_TIMEOUT, forward).await {
        Ok(status) => {
            let status = status?;
            anyhow::ensure!(
                status.success(),
                "{} exited with {status}; its log is above",
                peer.script
            );
            Ok(())
        }
        Err(_) => {
            guest::kill_group(&mut child).await;
            anyhow::bail!(
                "{} ran past {} s and was killed with its processes",
                peer.script,
                PEER_TIMEOUT.as_secs()
            )
        }
    }
}

/// Logs this host's figures beside the peers', with how many times this
/// host's figure each peer's is.
fn log_comparison(ours: &[Record], peers: &[PeerRecord], floors: &[(String, f64)]) {
    if peers.is_empty() {
        return;
    }
    let mut table = format!("{:<32} {:>12}", "metric (peer / this host)", "this host");
    for peer in &PEERS {
        table.push_str(&format!(" {:>14} {:>8}", peer.label, "x"));
    }
    for metric in GUEST_METRICS {
        let Some(mine) = ours.iter().find(|r| r.metric == metric) else {
            continue;
        };
        let unit = mine.unit.as_str();
        table.push_str(&format!(
            "\n{:<32} {:>12}",
            metric,
            format!("{:.2} {unit}", mine.value)
        ));
        for peer in &PEERS {
            match peers
                .iter()
                .find(|r| r.peer == peer.label && r.metric == metric)
            {
                Some(theirs) => table.push_str(&format!(
                    " {:>14} {:>8}",
                    format!("{:.2} {}", theirs.value, theirs.unit),
                    ratio(theirs.value / mine.value)
                )),
                None => table.push_str(&format!(" {:>14} {:>8}", "-", "-")),
            }
        }
    }
    // Each gather's floor, and every system's figure as a multiple of it.
    for (gather, floor_metric, _) in GATHER_FLOORS {
        let Some((_, floor)) = floors.iter().find(|(m, _)| m == floor_metric) else {
            continue;
        };
        table.push_str(&format!(
            "\n{floor_metric:<32} {:>12}",
            format!("{floor:.2} us")
        ));
        if let Some(mine) = ours.iter().find(|r| r.metric == gather) {
            table.push_str(&format!(
                "   {gather}: this host {}",
                ratio(mine.value / floor)
            ));
        }
        for peer in &PEERS {
            if let Some(theirs) = peers
                .iter()
                .find(|r| r.peer == peer.label && r.metric == gather)
            {
                table.push_str(&format!(", {} {}", peer.label, ratio(theirs.value / floor)));
            }
        }
    }
    eprintln!("mesh suite beside its peers, same run:\n{table}");
}

/// A ratio for the table: one decimal, two below 1.
fn ratio(x: f64) -> String {
    if x < 1.0 {
        format!("{x:.2} x")
    } else {
        format!("{x:.1} x")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"suite":"mesh","metric":"call_gather_8_us","peer":"monarch-0.7.0","value":2977.47,"unit":"us"}"#;

    #[test]
    fn figures_come_from_the_least_stolen_rounds_in_the_order_they_ran() {
        let rounds = [(1, Some(30.0)), (2, Some(0.4)), (3, None), (4, Some(2.0))];
        let mut left_out = Vec::new();
        assert_eq!(least_stolen("m", &rounds, 3, &mut left_out), vec![2, 3, 4]);
        assert_eq!(
            least_stolen("m", &rounds, 9, &mut left_out),
            vec![1, 2, 3, 4]
        );
        assert_eq!(least_stolen("m", &[], 3, &mut left_out), Vec::<u32>::new());
        assert_eq!(left_out, vec!["m without round 1 (30.0 %)".to_string()]);
    }

    #[test]
    fn a_round_is_run_again_only_while_too_few_ran_unstolen() {
        let ran = [Some(Some(0.5)), Some(Some(12.0)), Some(None)];
        assert!(enough_clean(&ran, 2, 5.0));
        assert!(!enough_clean(&ran, 3, 5.0));
        assert!(enough_clean(&ran, 3, 100.0));
        // A round that failed counts for nothing.
        assert!(!enough_clean(&[None, Some(Some(0.0))], 2, 5.0));

        let round = |peer: &'static str, round, stolen, ok| PeerRound {
            peer,
            round,
            stolen: Stolen {
                whole: Some(stolen),
                phases: Vec::new(),
            },
            ok,
            records: Vec::new(),
        };
        let monarch = &PEERS[0];
        let stolen_once = [
            round(monarch.label, 1, 0.0, true),
            round(monarch.label, 2, 40.0, true),
        ];
        assert!(peer_wants_more(&stolen_once, monarch, 2, 5.0));
        assert!(!peer_wants_more(&stolen_once, monarch, 1, 5.0));
        // A peer that never ran to the end is not run again and again.
        let failing = [round(monarch.label, 1, 0.0, false)];
        assert!(!peer_wants_more(&failing, monarch, 2, 5.0));
        // Another peer's rounds are not this one's.
        assert!(!peer_wants_more(&stolen_once, &PEERS[1], 2, 5.0));
    }

    #[test]
    fn each_metric_is_read_from_the_rounds_that_lost_least_while_it_ran() {
        let ticks = |stolen, total| parse(stolen, total);
        let start = ticks(0, 0);
        let marks = vec![
            ("call_gather_8_us".to_string(), ticks(0, 200)),
            ("call_gather_16_us".to_string(), ticks(60, 400)),
            ("spawn_procs_8_ms".to_string(), ticks(60, 600)),
            ("spawn_procs_16_ms".to_string(), ticks(60, 600)),
            ("cast_reduce_1024_us".to_string(), None),
        ];
        let whole = Some(10.0);
        let stolen = Stolen::between(start, whole, &marks);
        let phases = &stolen.phases;
        assert_eq!(phases[0], ("call_gather_8_us".to_string(), Some(0.0)));
        assert_eq!(phases[1], ("call_gather_16_us".to_string(), Some(30.0)));
        assert_eq!(phases[2].1, Some(0.0));
        // Logged with the one before it: no ticks of its own.
        assert_eq!(phases[3].1, None);
        assert_eq!(phases[4].1, None);
        assert_eq!(stolen.worst(), Some(30.0));
        assert_eq!(stolen.during("call_gather_16_us"), Some(30.0));
        assert_eq!(stolen.during("call_gather_8_us"), Some(0.0));
        // Too short to tell, or not a phase of this round: the round's share.
        assert_eq!(stolen.during("spawn_procs_16_ms"), whole);
        assert_eq!(stolen.during("broadcast_100_then_call_16_ms"), whole);
        let mut left_out = Vec::new();
        let ran = [(1, Some(30.0)), (2, None)];
        assert_eq!(
            least_stolen("call_gather_16_us", &ran, 1, &mut left_out),
            vec![2]
        );
        assert_eq!(
            left_out,
            vec!["call_gather_16_us without round 1 (30.0 %)".to_string()]
        );
        left_out.clear();
        assert_eq!(
            least_stolen("m", &[(1, Some(30.0))], 1, &mut left_out),
            vec![1]
        );
        assert!(left_out.is_empty());
    }

    /// CPU times with `stolen` of `total` ticks.
    fn parse(stolen: u64, total: u64) -> Option<CpuTimes> {
        CpuTimes::from_ticks(stolen, total)
    }

    #[test]
    fn max_steal_is_a_percentage() {
        assert_eq!(parse_pct("5"), Ok(5.0));
        assert_eq!(parse_pct("100"), Ok(100.0));
        for bad in ["-1", "101", "five", "NaN"] {
            assert!(parse_pct(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_peer_record_passes_and_prints_in_the_documented_order() {
        let record = parse_peer_line(GOOD, "monarch-0.7.0").unwrap();
        assert_eq!(record.value, 2977.47);
        assert_eq!(record.line(), GOOD);
        let spawn = r#"{"unit":"ms","value":1477.41,"peer":"ray-2.60.0","metric":"spawn_procs_8_ms","suite":"mesh"}"#;
        let record = parse_peer_line(spawn, "ray-2.60.0").unwrap();
        assert_eq!(
            record.line(),
            r#"{"suite":"mesh","metric":"spawn_procs_8_ms","peer":"ray-2.60.0","value":1477.41,"unit":"ms"}"#
        );
    }

    #[test]
    fn anything_else_a_peer_prints_is_refused() {
        for bad in [
            "Monarch internal logs are being written to /tmp",
            "[1, 2]",
            r#"{"suite":"mesh","metric":"call_gather_8_us","peer":"ray-2.60.0","value":1.0,"unit":"us"}"#,
            r#"{"suite":"runtime","metric":"call_gather_8_us","peer":"monarch-0.7.0","value":1.0,"unit":"us"}"#,
            r#"{"suite":"mesh","metric":"made_up_us","peer":"monarch-0.7.0","value":1.0,"unit":"us"}"#,
            r#"{"suite":"mesh","metric":"call_gather_8_us","peer":"monarch-0.7.0","value":1.0,"unit":"ms"}"#,
            r#"{"suite":"mesh","metric":"call_gather_8_us","peer":"monarch-0.7.0","value":0,"unit":"us"}"#,
            r#"{"suite":"mesh","metric":"call_gather_8_us","peer":"monarch-0.7.0","value":"1","unit":"us"}"#,
            r#"{"suite":"mesh","metric":"call_gather_8_us","peer":"monarch-0.7.0","value":1.0,"unit":"us","x":1}"#,
            r#"{"suite":"mesh","metric":"call_gather_8_us","value":1.0,"unit":"us"}"#,
        ] {
            assert!(parse_peer_line(bad, "monarch-0.7.0").is_err(), "{bad}");
        }
    }

    #[test]
    fn every_metric_has_a_unit_and_every_peer_a_script() {
        for metric in GUEST_METRICS {
            assert!(unit_of(metric).is_some(), "{metric}");
        }
        for peer in &PEERS {
            assert!(peer.source.contains(peer.label), "{}", peer.script);
            // The spawn metrics are named with the count filled in.
            for metric in GUEST_METRICS
                .iter()
                .filter(|m| !m.starts_with("spawn_procs_"))
            {
                assert!(
                    peer.source.contains(metric),
                    "{} lacks {metric}",
                    peer.script
                );
            }
            assert!(
                peer.source.contains("spawn_procs_{count}_ms"),
                "{}",
                peer.script
            );
        }
    }
}

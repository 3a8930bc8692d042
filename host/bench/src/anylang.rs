//! The `anylang` suite: the same program written in Rust, Python and
//! JavaScript, measured side by side in one run, as `monarch-host run`
//! runs it.
//!
//! The programs (`host/bench/guest`'s `anylang` mode,
//! `host/bench/programs/python/anylang.py`, `host/bench/programs/js/anylang.js`)
//! do the same things: a controller that spawns a proc and an `Echoer`
//! actor on it and times sequential `call_one`s of its `ping` (replies at
//! once) and its `spin` (busy-waits 20 us on the clock, then replies), then
//! on fresh procs times spawning a mesh of N actors on one proc, for a few
//! N. Each times itself with the WASI monotonic clock (`Instant`,
//! `time.perf_counter_ns`, `performance.now()`) and prints `BENCH <metric>
//! <value> <unit>` lines (see [`crate::guest`]), which this side reads from
//! the run's output.
//!
//! This side builds the programs (cargo for Rust, `monarch-host build` for
//! Python, `node guest-sdk/js/build.mjs` for JavaScript; not timed), then
//! runs each with a `monarch-host` binary, one phase at a time with the
//! languages taking turns:
//!
//! 1. cold starts: `monarch-host run APP -- hello` (spawn a proc and an
//!    actor, one call) with `MONARCH_CACHE_DIR` an empty directory, so the
//!    run compiles the component; timed end to end from this side;
//! 2. warm starts: the same with the first cold run's cache;
//! 3. `monarch-host run APP -- bench ...`: round trips to an actor in a
//!    child proc, and the spawns;
//! 4. `monarch-host run --in-process APP -- bench ...`: round trips to an
//!    actor in the controller's process.
//!
//! The floors, measured in the same run (half before the programs and half
//! after): a bare Unix socket round trip between two processes
//! (`raw_unix_rtt_us`, as in the mesh suite), for the round trips to child
//! procs, and `monarch-host --version` end to end (`host_exec_ms`), for the
//! starts. The Rust figures are the reference for the other languages: the
//! log prints each figure as a multiple of Rust's and of its floor.
//!
//! A language whose toolchain is missing (cargo with the `wasm32-wasip2`
//! target, componentize-py, node with jco) is skipped with a line on
//! stderr that says why, and its metrics are not printed; with
//! `--require-all` that fails the suite instead.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;

use crate::guest::{self, Record};
use crate::raw::RawStream;
use crate::report::{Unit, emit, log_spread, median};
use crate::worker::{Flavor, Scratch, Worker};

const SUITE: &str = "anylang";

/// The repository this binary was built from: where the programs and the
/// SDKs' build tools are found by default.
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Payload of a floor round trip, as in the mesh suite.
const FLOOR_PAYLOAD: usize = 64;

/// Quiet time before a round of the floor.
const FLOOR_SETTLE: Duration = Duration::from_millis(200);

/// The wall-clock limit of each `monarch-host run`, in seconds.
const RUN_TIMEOUT_S: u32 = 240;

/// A language the suite measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Language {
    /// The Rust SDK: the benchmark guest (`host/bench/guest`), mode `anylang`.
    Rust,
    /// The Python SDK: `host/bench/programs/python/anylang.py`.
    #[value(name = "py", alias = "python")]
    Python,
    /// The JavaScript SDK: `host/bench/programs/js/anylang.js`.
    #[value(name = "js", alias = "javascript")]
    Js,
}

impl Language {
    const ALL: [Language; 3] = [Language::Rust, Language::Python, Language::Js];

    /// The prefix of the language's metric names.
    fn prefix(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::Python => "py",
            Language::Js => "js",
        }
    }
}

/// Arguments of the anylang suite.
#[derive(Debug, Args)]
pub struct AnylangArgs {
    /// A smoke test: 100 calls a figure, one run of each start, meshes of 1
    /// and 10 actors. The figures are rough.
    #[arg(long)]
    quick: bool,
    /// Fail when a language cannot be built (its toolchain is missing)
    /// instead of skipping its metrics with a line on stderr.
    #[arg(long)]
    require_all: bool,
    /// The languages to measure, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_values_t = Language::ALL
    )]
    languages: Vec<Language>,
    /// The `monarch-host` that runs the programs (and builds the Python
    /// one): by default the one next to this binary, else `monarch-host` on
    /// PATH.
    #[arg(long, value_name = "PATH")]
    monarch_host: Option<PathBuf>,
    /// The repository: the programs under `host/bench/programs`, the Rust
    /// guest workspace `guest-sdk`, the JavaScript build
    /// `guest-sdk/js/build.mjs` and the WIT `wit`.
    #[arg(long, value_name = "DIR", default_value = REPO)]
    repo: PathBuf,
    /// The Rust program, already built (`controller_bench.wasm`), instead of
    /// building it with cargo.
    #[arg(long, value_name = "PATH")]
    rust_program: Option<PathBuf>,
    /// The node that runs the JavaScript build (which runs `jco`, or
    /// `$JCO`).
    #[arg(long, value_name = "PATH", default_value = "node")]
    node: PathBuf,
    /// After the suite, time a Monarch-style Python program
    /// (`host/bench/programs/python/monarch_style.py`: 8 procs and a few
    /// actor meshes) end to end, warm, under monarch-host and, unchanged,
    /// under PyTorch Monarch with this Python (a venv with
    /// `torchmonarch==0.7.0`), runs alternating.
    #[arg(long, value_name = "PYTHON", num_args = 0..=1, default_missing_value = "target/peers-venv/bin/python")]
    peers: Option<PathBuf>,
}

/// How much the suite measures.
struct Settings {
    /// Timed sequential calls per round-trip figure.
    calls: u32,
    /// Untimed calls before them.
    warmup: u32,
    /// Fresh procs the spawns are timed on.
    spawn_reps: u32,
    /// Actors per mesh in the timed spawns; the first is 1, the last the
    /// one the cost per actor is read from.
    sizes: Vec<u32>,
    /// Timed runs of each start, cold and warm.
    start_runs: u32,
    /// Floor round trips, half before and half after the programs.
    floor_samples: usize,
    /// Runs of `monarch-host --version`, half before and half after.
    exec_runs: u32,
}

impl Settings {
    fn new(quick: bool) -> Settings {
        if quick {
            Settings {
                calls: 100,
                warmup: 20,
                spawn_reps: 1,
                sizes: vec![1, 10],
                start_runs: 1,
                floor_samples: 1_000,
                exec_runs: 4,
            }
        } else {
            Settings {
                calls: 3_000,
                warmup: 300,
                spawn_reps: 3,
                sizes: vec![1, 50, 200],
                start_runs: 3,
                floor_samples: 10_000,
                exec_runs: 10,
            }
        }
    }

    /// The arguments of a program's `bench` mode; `spawns` or not.
    fn bench_args(&self, spawns: bool) -> Vec<String> {
        let mut args = vec![
            "bench".to_string(),
            self.calls.to_string(),
            self.warmup.to_string(),
        ];
        if spawns {
            args.push(self.spawn_reps.to_string());
            args.extend(self.sizes.iter().map(u32::to_string));
        } else {
            args.push("0".into());
        }
        args
    }
}

/// A built program of one language.
struct Program {
    language: Language,
    /// The component.
    wasm: PathBuf,
    /// Arguments before the mode (`anylang` for the Rust guest, whose
    /// other modes are the controller and mesh suites).
    lead: Vec<String>,
}

impl Program {
    fn args(&self, mode: &[String]) -> Vec<String> {
        self.lead.iter().chain(mode).cloned().collect()
    }
}

/// Runs the suite and writes its records to stdout.
pub fn main(args: AnylangArgs) -> anyhow::Result<()> {
    let began = Instant::now();
    let settings = Settings::new(args.quick);
    let host = find_host(args.monarch_host.as_deref())?;
    let scratch = Scratch::new()?;
    tracing::info!(
        quick = args.quick,
        host = %host.display(),
        repo = %args.repo.display(),
        "anylang suite"
    );

    let mut languages = args.languages.clone();
    languages.sort();
    languages.dedup();
    let mut programs = Vec::new();
    for language in languages {
        match build(language, &args, &host, scratch.path()) {
            Ok(program) => programs.push(program),
            Err(why) if args.require_all => {
                return Err(why.context(format!(
                    "{} (--require-all)",
                    skip_line(language, "could not be built")
                )));
            }
            Err(why) => tracing::warn!("{}: {why:#}", skip_line(language, "skipped")),
        }
    }

    let rt = crate::worker::runtime(Flavor::CurrentThread, 1)?;
    let raw_worker = rt.block_on(Worker::start(
        "raw unix echo",
        &[
            "raw-echo".to_string(),
            "--addr".into(),
            scratch.unix_addr("raw.sock")?.to_string(),
        ],
    ))?;
    let mut raw = RawStream::connect(raw_worker.ready())?;
    raw.round_trips(FLOOR_PAYLOAD, settings.floor_samples / 5)?;
    std::thread::sleep(FLOOR_SETTLE);
    let mut floor = raw.round_trips(FLOOR_PAYLOAD, settings.floor_samples / 2)?;
    let mut execs = host_execs(&host, settings.exec_runs / 2)?;

    let mut figures = Figures::default();
    let result = measure(&host, &programs, &settings, scratch.path(), &mut figures);

    std::thread::sleep(FLOOR_SETTLE);
    floor.extend(raw.round_trips(FLOOR_PAYLOAD, settings.floor_samples / 2)?);
    execs.extend(host_execs(
        &host,
        settings.exec_runs - settings.exec_runs / 2,
    )?);
    drop(raw);
    rt.block_on(raw_worker.stop())?;
    result?;

    log_spread("raw_unix_rtt_us", &floor, "round trip, us");
    let floor = median(&floor).context("no samples for raw_unix_rtt_us")?;
    emit(SUITE, "raw_unix_rtt_us", floor, Unit::Micros)?;
    log_spread("host_exec_ms", &execs, "monarch-host --version, ms");
    let exec = median(&execs).context("no samples for host_exec_ms")?;
    emit(SUITE, "host_exec_ms", exec, Unit::Millis)?;
    figures.log_side_by_side(floor, exec);
    if let Some(python) = &args.peers {
        monarch_style(&host, python, &args.repo, &settings)?;
    }
    tracing::info!(
        seconds = format!("{:.1}", began.elapsed().as_secs_f64()),
        "anylang suite done"
    );
    Ok(())
}

/// The Monarch-style program, warm, under monarch-host and under Monarch:
/// whole runs of the same file, alternating, after one run of each to
/// build, compile and fill the page cache.
fn monarch_style(
    host: &Path,
    python: &Path,
    repo: &Path,
    settings: &Settings,
) -> anyhow::Result<()> {
    let program = repo.join("host/bench/programs/python/monarch_style.py");
    let python = if python.is_relative() && !python.exists() {
        repo.join(python)
    } else {
        python.to_path_buf()
    };
    let time = |command: &mut Command, what: &str| -> anyhow::Result<f64> {
        let started = Instant::now();
        let output = command
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {what}"))?;
        let took = started.elapsed().as_secs_f64();
        let text = output_text(&output);
        if !output.status.success() || !text.contains("It didn't say hello") {
            bail!("{what} failed ({}):\n{}", output.status, tail(&text));
        }
        Ok(took)
    };
    let ours = || {
        time(
            Command::new(host).arg("run").arg(&program),
            "monarch-host run monarch_style.py",
        )
    };
    let theirs = || {
        time(
            Command::new(&python).arg(&program),
            "Monarch (python monarch_style.py)",
        )
    };
    ours()?;
    if let Err(e) = theirs() {
        tracing::warn!(
            "anylang: Monarch is not runnable with {} ({e:#}); install it with \
             `python3 -m venv target/peers-venv && target/peers-venv/bin/pip install torchmonarch==0.7.0`",
            python.display()
        );
        return Ok(());
    }
    let runs = if settings.exec_runs >= 10 { 5 } else { 2 };
    let (mut mine, mut peer) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        mine.push(ours()?);
        peer.push(theirs()?);
    }
    log_spread("py_monarch_program_s", &mine, "monarch-host, s");
    log_spread(
        "py_monarch_program_s (monarch-0.7.0)",
        &peer,
        "Monarch 0.7.0, s",
    );
    let (mine, peer) = (
        median(&mine).context("no samples")?,
        median(&peer).context("no samples")?,
    );
    emit(SUITE, "py_monarch_program_s", mine, Unit::Seconds)?;
    println!(
        "{}",
        serde_json::json!({"suite": SUITE, "metric": "py_monarch_program_s", "peer": "monarch-0.7.0", "value": peer, "unit": "s"})
    );
    tracing::info!(
        "the Monarch-style program: monarch-host {mine:.2} s, Monarch 0.7.0 {peer:.2} s ({:.2} of Monarch's time)",
        mine / peer
    );
    Ok(())
}

/// The stderr line of a language that is not measured.
fn skip_line(language: Language, what: &str) -> String {
    format!(
        "anylang: {} ({}_* metrics) {what}",
        match language {
            Language::Rust => "Rust",
            Language::Python => "Python",
            Language::Js => "JavaScript",
        },
        language.prefix()
    )
}

/// Every phase, languages taking turns within each.
fn measure(
    host: &Path,
    programs: &[Program],
    settings: &Settings,
    scratch: &Path,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let hello = ["hello".to_string()];
    let cache = |program: &Program, run: u32| {
        scratch.join(format!("cache-{}-{run}", program.language.prefix()))
    };

    // Cold starts: an empty compile cache each time.
    let mut cold: BTreeMap<Language, Vec<f64>> = BTreeMap::new();
    for run in 0..settings.start_runs {
        for program in programs {
            let dir = cache(program, run);
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let (took, _) = run_program(host, program, &dir, false, &hello)?;
            cold.entry(program.language)
                .or_default()
                .push(took.as_secs_f64());
        }
    }
    for program in programs {
        for run in 1..settings.start_runs {
            let _ = std::fs::remove_dir_all(cache(program, run));
        }
        figures.emit_samples(program.language, "cold_start_s", &cold[&program.language])?;
    }

    // Warm starts: the first cold run's cache.
    let mut warm: BTreeMap<Language, Vec<f64>> = BTreeMap::new();
    for _ in 0..settings.start_runs {
        for program in programs {
            let (took, _) = run_program(host, program, &cache(program, 0), false, &hello)?;
            warm.entry(program.language)
                .or_default()
                .push(took.as_secs_f64());
        }
    }
    for program in programs {
        figures.emit_samples(program.language, "warm_start_s", &warm[&program.language])?;
    }

    // Round trips to a child proc, and spawns.
    let child_args = settings.bench_args(true);
    let mut expected = vec!["call_rtt_us".to_string(), "call_rtt_20us_handler_us".into()];
    expected.extend(settings.sizes.iter().map(|n| format!("spawn_{n}_ms")));
    let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    let mut spawns = Vec::new();
    for program in programs {
        let (_, output) = run_program(host, program, &cache(program, 0), false, &child_args)?;
        let records = read_records(program, &output, &expected)?;
        figures.emit_record(
            program.language,
            "call_rtt_child_us",
            &records,
            "call_rtt_us",
        )?;
        figures.emit_record(
            program.language,
            "call_rtt_child_20us_handler_us",
            &records,
            "call_rtt_20us_handler_us",
        )?;
        spawns.push((program.language, records));
    }

    // Round trips in process.
    let inproc_args = settings.bench_args(false);
    for program in programs {
        let (_, output) = run_program(host, program, &cache(program, 0), true, &inproc_args)?;
        let records = read_records(program, &output, &expected[..2])?;
        figures.emit_record(
            program.language,
            "call_rtt_inproc_us",
            &records,
            "call_rtt_us",
        )?;
        figures.emit_record(
            program.language,
            "call_rtt_inproc_20us_handler_us",
            &records,
            "call_rtt_20us_handler_us",
        )?;
    }

    // The cost of one more actor in a mesh on one proc.
    for (language, records) in spawns {
        let spawn_ms = |n: u32| {
            records
                .iter()
                .find(|r| r.metric == format!("spawn_{n}_ms"))
                .map(|r| r.value)
                .with_context(|| format!("no spawn_{n}_ms from {}", language.prefix()))
        };
        let (first, last) = (settings.sizes[0], settings.sizes[settings.sizes.len() - 1]);
        let base = spawn_ms(first)?;
        let mut slopes = Vec::new();
        for &n in &settings.sizes[1..] {
            let ms = spawn_ms(n)?;
            slopes.push(format!(
                "{n} actors {ms:.2} ms ({:.3} ms per actor over {first})",
                (ms - base) / f64::from(n - first)
            ));
        }
        tracing::info!(
            language = language.prefix(),
            "spawn of {first} actor {base:.2} ms; {}",
            slopes.join("; ")
        );
        let cost = (spawn_ms(last)? - base) / f64::from(last - first);
        figures.emit(language, "actor_cost_ms", cost, Unit::Millis)?;
    }
    Ok(())
}

/// The guest's records in a run's output, checked against `expected`;
/// its other lines (spreads) go to the log.
fn read_records(program: &Program, output: &str, expected: &[&str]) -> anyhow::Result<Vec<Record>> {
    let mut records = Vec::new();
    for line in output.lines() {
        match guest::parse_line(line)? {
            Some(record) => records.push(record),
            None => {
                if let Some(at) = line.find("SPREAD ") {
                    tracing::info!(language = program.language.prefix(), "{}", &line[at..]);
                }
            }
        }
    }
    guest::expect_metrics(&records, expected).with_context(|| {
        format!(
            "the {} program's output:\n{output}",
            program.language.prefix()
        )
    })?;
    Ok(records)
}

/// Runs `program` with `mode` through `monarch-host run`, with `cache` as
/// its compile cache, and times it end to end. Returns the time and its
/// output (stdout, then stderr).
fn run_program(
    host: &Path,
    program: &Program,
    cache: &Path,
    in_process: bool,
    mode: &[String],
) -> anyhow::Result<(Duration, String)> {
    let mut command = Command::new(host);
    command
        .arg("run")
        .args(["--timeout", &RUN_TIMEOUT_S.to_string()]);
    if in_process {
        command.arg("--in-process");
    }
    command
        .arg(&program.wasm)
        .arg("--")
        .args(program.args(mode))
        .env("MONARCH_CACHE_DIR", cache)
        .stdin(Stdio::null());
    let started = Instant::now();
    let output = command
        .output()
        .with_context(|| format!("cannot run {}", host.display()))?;
    let took = started.elapsed();
    let text = output_text(&output);
    if !output.status.success() {
        bail!(
            "`monarch-host run{} {} -- {}` failed ({}):\n{text}",
            if in_process { " --in-process" } else { "" },
            program.wasm.display(),
            program.args(mode).join(" "),
            output.status
        );
    }
    if mode.first().is_some_and(|m| m == "hello") && !text.contains("hello ok") {
        bail!(
            "the {} program's hello run did not say `hello ok`:\n{text}",
            program.language.prefix()
        );
    }
    Ok((took, text))
}

fn output_text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The last lines of a tool's output, for a message.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

/// The `monarch-host` to use: `given`, else the one next to this binary,
/// else `monarch-host` on PATH.
fn find_host(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let host = match given {
        Some(path) => path.to_path_buf(),
        None => hyperactor_mesh::exe::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.join("monarch-host")))
            .filter(|path| path.is_file())
            .unwrap_or_else(|| PathBuf::from("monarch-host")),
    };
    let output = Command::new(&host)
        .arg("--version")
        .stdin(Stdio::null())
        .output();
    match output {
        Ok(output) if output.status.success() => Ok(host),
        Ok(output) => bail!(
            "`{} --version` failed ({}): {}",
            host.display(),
            output.status,
            tail(&output_text(&output))
        ),
        Err(e) => bail!(
            "cannot run {} ({e}): build it with `cargo build --release -p monarch-host`, or name one with --monarch-host",
            host.display()
        ),
    }
}

/// Times `runs` runs of `monarch-host --version`, in milliseconds: what
/// starting the host's process costs, before any program.
fn host_execs(host: &Path, runs: u32) -> anyhow::Result<Vec<f64>> {
    let mut millis = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let status = Command::new(host)
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .with_context(|| format!("cannot run {}", host.display()))?;
        millis.push(started.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(status.success(), "`monarch-host --version` failed");
    }
    Ok(millis)
}

/// Builds the program of `language` into `scratch`.
fn build(
    language: Language,
    args: &AnylangArgs,
    host: &Path,
    scratch: &Path,
) -> anyhow::Result<Program> {
    let programs = args.repo.join("host/bench/programs");
    let started = Instant::now();
    let program = match language {
        Language::Rust => Program {
            language,
            wasm: match &args.rust_program {
                Some(path) => {
                    guest::check_program(path)?;
                    path.clone()
                }
                None => build_rust(&args.repo)?,
            },
            lead: vec!["anylang".into()],
        },
        Language::Python => {
            let source = programs.join("python/anylang.py");
            let wasm = scratch.join("anylang_py.wasm");
            let mut command = Command::new(host);
            command.arg("build").arg(&source).arg("-o").arg(&wasm);
            run_tool(command, "monarch-host build (componentize-py)")?;
            Program {
                language,
                wasm,
                lead: vec![],
            }
        }
        Language::Js => {
            let source = programs.join("js/anylang.js");
            let wasm = scratch.join("anylang_js.wasm");
            let mut command = Command::new(&args.node);
            command
                .arg(args.repo.join("guest-sdk/js/build.mjs"))
                .arg(&source)
                .arg("-o")
                .arg(&wasm)
                .arg("--wit")
                .arg(args.repo.join("wit"));
            run_tool(command, "node guest-sdk/js/build.mjs (jco)").with_context(|| {
                "the JavaScript build needs Node 18 or later and jco (`npm install -g @bytecodealliance/jco`)"
            })?;
            Program {
                language,
                wasm,
                lead: vec![],
            }
        }
    };
    tracing::info!(
        language = language.prefix(),
        program = %program.wasm.display(),
        kib = std::fs::metadata(&program.wasm).map(|m| m.len() / 1024).unwrap_or(0),
        seconds = format!("{:.1}", started.elapsed().as_secs_f64()),
        "built"
    );
    Ok(program)
}

/// Builds the benchmark guest with cargo (a no-op when it is up to date)
/// and returns its path.
fn build_rust(repo: &Path) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--release", "--quiet", "-p", "controller-bench"])
        .args(["--target", "wasm32-wasip2", "--manifest-path"])
        .arg(repo.join("guest-sdk/Cargo.toml"));
    // What an outer build sets would change the guest build's target or
    // flags.
    for name in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        command.env_remove(name);
    }
    run_tool(command, "cargo build --target wasm32-wasip2").with_context(|| {
        "the Rust build needs cargo and `rustup target add wasm32-wasip2`; or name a built controller_bench.wasm with --rust-program"
    })?;
    let wasm = repo.join("guest-sdk/target/wasm32-wasip2/release/controller_bench.wasm");
    guest::check_program(&wasm)?;
    Ok(wasm)
}

/// Runs a build tool; fails with its output's last lines.
fn run_tool(mut command: Command, what: &str) -> anyhow::Result<()> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {what} ({:?})", command.get_program()))?;
    if !output.status.success() {
        bail!(
            "{what} failed ({}):\n{}",
            output.status,
            tail(&output_text(&output))
        );
    }
    Ok(())
}

/// What was printed, by language and metric (without the prefix), for the
/// side-by-side table at the end.
#[derive(Default)]
struct Figures(BTreeMap<(&'static str, Language), f64>);

impl Figures {
    /// Prints `{prefix}_{metric}` and keeps it.
    fn emit(
        &mut self,
        language: Language,
        metric: &'static str,
        value: f64,
        unit: Unit,
    ) -> anyhow::Result<()> {
        emit(
            SUITE,
            &format!("{}_{metric}", language.prefix()),
            value,
            unit,
        )?;
        self.0.insert((metric, language), value);
        Ok(())
    }

    /// The median of start times in seconds, with the runs in the log.
    fn emit_samples(
        &mut self,
        language: Language,
        metric: &'static str,
        seconds: &[f64],
    ) -> anyhow::Result<()> {
        let runs: Vec<String> = seconds.iter().map(|s| format!("{s:.3}")).collect();
        tracing::info!(
            language = language.prefix(),
            "{metric} runs: {} s",
            runs.join(" ")
        );
        let value = median(seconds).with_context(|| format!("no runs for {metric}"))?;
        self.emit(language, metric, value, Unit::Seconds)
    }

    /// The guest's `from` record as `{prefix}_{metric}`.
    fn emit_record(
        &mut self,
        language: Language,
        metric: &'static str,
        records: &[Record],
        from: &str,
    ) -> anyhow::Result<()> {
        let record = records
            .iter()
            .find(|r| r.metric == from)
            .with_context(|| format!("the {} program did not report {from}", language.prefix()))?;
        self.emit(language, metric, record.value, record.unit)
    }

    /// Logs each metric across the languages, as a multiple of Rust's and
    /// of its floor.
    fn log_side_by_side(&self, raw_unix_rtt_us: f64, host_exec_ms: f64) {
        let mut metrics: Vec<&'static str> = self.0.keys().map(|(m, _)| *m).collect();
        metrics.dedup();
        for metric in metrics {
            let rust = self.0.get(&(metric, Language::Rust)).copied();
            let floor = match metric {
                "call_rtt_child_us" | "call_rtt_child_20us_handler_us" => {
                    Some((raw_unix_rtt_us, "raw_unix_rtt_us"))
                }
                "cold_start_s" | "warm_start_s" => Some((host_exec_ms / 1e3, "host_exec_ms")),
                _ => None,
            };
            let mut line = Vec::new();
            for language in Language::ALL {
                let Some(value) = self.0.get(&(metric, language)).copied() else {
                    continue;
                };
                let mut cell = format!("{} {value:.3}", language.prefix());
                if let Some(rust) = rust.filter(|_| language != Language::Rust) {
                    cell += &format!(" ({:.2} x rust)", value / rust);
                }
                if let Some((floor, name)) = floor {
                    cell += &format!(" ({:.1} x {name})", value / floor);
                }
                line.push(cell);
            }
            tracing::info!("{metric}: {}", line.join(", "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_args_name_the_spawns_only_for_child_procs() {
        let settings = Settings::new(true);
        assert_eq!(
            settings.bench_args(true),
            ["bench", "100", "20", "1", "1", "10"]
        );
        assert_eq!(settings.bench_args(false), ["bench", "100", "20", "0"]);
        for quick in [true, false] {
            let settings = Settings::new(quick);
            assert_eq!(settings.sizes[0], 1, "the cost per actor is read from 1");
            assert!(settings.sizes.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn the_programs_are_where_the_suite_looks() {
        let repo = Path::new(REPO);
        assert!(repo.join("host/bench/programs/python/anylang.py").is_file());
        assert!(repo.join("host/bench/programs/js/anylang.js").is_file());
        assert!(repo.join("guest-sdk/js/build.mjs").is_file());
    }

    #[test]
    fn a_skipped_language_names_its_metrics() {
        assert_eq!(
            skip_line(Language::Python, "skipped"),
            "anylang: Python (py_* metrics) skipped"
        );
    }
}

//! `monarch-host test`: runs a program's tests, the functions its Rust
//! crate marks `#[monarch_guest::test]` or a Python script's `test*`
//! functions, and reports them as `cargo test` does.
//!
//! A program built with the Rust or Python SDK exports `monarch:host/tests`
//! (`wit/monarch.wit`): `list-tests` names its tests, `run-test(name)` runs
//! one as the controller, the way `run` runs the program's main. The
//! runner lists them once, keeps those whose name contains `--filter`, and
//! runs each, up to `--jobs` at once, on a cluster of its own placed as
//! `monarch-host run` places one (child-process procs). What a test and its
//! actors print is kept and shown only when it fails, followed by why it
//! failed: the `Err` it returned, its trap (a Rust panic: the panic hook's
//! `panicked at FILE:LINE:COL` line is among its output) with the Wasm
//! backtrace, or its timeout.
//!
//! - TT-1: every test runs on a fresh cluster of its own, whose procs are
//!   stopped when the test ends, however it ends (passed, failed, trapped
//!   or timed out); one test's failure never fails another.
//! - TT-2: a failed test's report holds everything it and its actors
//!   printed, then why it failed.
//! - TT-3: the exit status is 0 when every test ran passed, 1 when one
//!   failed, 2 when the tests could not be listed (bad flags, not a
//!   component, no `tests` export) or the JUnit report not written.
//! - TT-4: `--junit FILE` is well-formed XML whatever the tests printed
//!   (escaped, characters XML cannot hold replaced), and appears whole or
//!   not at all (written beside FILE, then renamed over it).
//!
//! With `--sim` each test runs in a deterministic simulation instead
//! (`test_runner/sim.rs`, TS-1..3).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::engine::{self, Grants, Placement, PoolShape, Sandbox};
use crate::host::LogSink;
use crate::{Prepared, RunError};

/// The exit status of a run whose tests could not be listed (TT-3).
const BAD_INPUT: u8 = 2;

/// How long a test's procs may take to stop after its timeout, before the
/// runner gives up on them and reports the test anyway.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// The flags of `monarch-host test`.
#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// The program: a .wasm component built with the Rust SDK (e.g.
    /// `cargo build --release --target wasm32-wasip2`), whose
    /// `#[monarch_guest::test]` functions are its tests; or a Python
    /// script (.py), built as `run app.py` builds it (cached), whose
    /// `test*` functions are its tests.
    pub app: PathBuf,
    /// Runs only the tests whose name contains this text.
    #[arg(long, value_name = "SUBSTR")]
    pub filter: Option<String>,
    /// How many tests run at once, each on its own cluster.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub jobs: u16,
    /// The most time one test may take, in seconds; a test past it fails
    /// with "timed out after N s" and its procs are stopped.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout: u64,
    /// Writes a JUnit XML report of the tests to FILE, for CI servers.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// The most procs one test may spawn; each is a child process.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub procs: u32,
    /// Linear memory per instance, in MiB.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub memory: u32,
    /// How long a call waits for replies unless the test sets another
    /// timeout, in seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub call_timeout: u64,
    /// Runs each test in a deterministic simulation: its procs inside this
    /// process on a virtual clock, every message between them delivered
    /// after a latency drawn from the seed (docs/testing.md, "Simulation").
    #[arg(long)]
    pub sim: bool,
    /// The simulation's seed (with --sim); the same seed gives the same
    /// interleaving, and the same trace.
    #[arg(long, value_name = "N", requires = "sim", conflicts_with = "seeds")]
    pub seed: Option<u64>,
    /// Runs each test under every seed from A to B, both included (with
    /// --sim), and reports the first seed that fails, with the command
    /// that replays it.
    #[arg(long, value_name = "A..B", requires = "sim", value_parser = sim::parse_seeds)]
    pub seeds: Option<std::ops::RangeInclusive<u64>>,
    /// Prints each simulated run's interleaving: every message delivered
    /// between procs, with its virtual time (with --sim).
    #[arg(long, requires = "sim")]
    pub trace: bool,
    /// Accepted for symmetry with `run`; tests take no arguments, so these
    /// are passed nowhere.
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// What became of one test.
#[derive(Debug, Clone, PartialEq)]
pub struct TestOutcome {
    /// The test's name.
    pub name: String,
    /// How long it took, its cluster's start and stop included.
    pub time: Duration,
    /// What it and its actors printed, line by line.
    pub output: Vec<String>,
    /// Why it failed; None when it passed.
    pub failure: Option<String>,
}

impl TestOutcome {
    /// Its report: what it printed, then why it failed (TT-2).
    pub fn report(&self) -> String {
        let mut text = String::new();
        for line in &self.output {
            text.push_str(line);
            text.push('\n');
        }
        if let Some(failure) = &self.failure {
            if !self.output.is_empty() {
                text.push('\n');
            }
            text.push_str(failure.trim_end());
            text.push('\n');
        }
        text
    }
}

/// Runs `monarch-host test`; see the module docs.
pub fn command(args: TestArgs) -> ExitCode {
    init_tracing();
    let bad_input = |e: String| {
        eprintln!("monarch-host test: error: {e}");
        ExitCode::from(BAD_INPUT)
    };
    if let Some(file) = &args.junit {
        let dir = match file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        if file.file_name().is_none() || !dir.is_dir() {
            return bad_input(format!(
                "--junit {}: give a file in a directory that exists",
                file.display()
            ));
        }
    }
    if !args.args.is_empty() {
        eprintln!(
            "monarch-host test: note: tests take no arguments; ignoring {:?}",
            args.args
        );
    }
    let app = match source_program(&args.app) {
        Ok(app) => app,
        Err(e) => return bad_input(e),
    };
    let placement = match hyperactor_mesh::exe::current_exe() {
        Ok(program) => Placement::Local { program },
        Err(e) => return bad_input(format!("cannot find this binary to start procs: {e}")),
    };
    let prepared = match prepare(&app, &args) {
        Ok(prepared) => Arc::new(prepared),
        Err(e) => return bad_input(e.to_string()),
    };
    if !prepared.has_tests() {
        return bad_input(format!(
            "{} has no tests: it does not export monarch:host/tests (build it with the Rust SDK's #[monarch_guest::test], or write a Python script's `test_*` functions)",
            args.app.display()
        ));
    }
    hyperactor_mesh::alloc::keep_freed_memory();
    if args.sim {
        return sim::command(&args, prepared);
    }
    let mut builder = match args.jobs {
        1 => tokio::runtime::Builder::new_current_thread(),
        jobs => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            builder.worker_threads(usize::from(jobs).min(cores).max(1));
            builder
        }
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return bad_input(format!("cannot start the runtime: {e}")),
    };
    let settings = Settings {
        placement,
        timeout: Duration::from_secs(args.timeout),
        call_timeout: Duration::from_secs(args.call_timeout),
        memory_bytes: args.memory as usize * (1 << 20),
        procs: args.procs as usize,
    };
    let suite = suite_name(&args.app);
    let status = runtime.block_on(async {
        let started = Instant::now();
        let names = match list(&prepared, &settings).await {
            Ok(names) => names,
            Err(e) => return bad_input(e),
        };
        let total = names.len();
        let names: Vec<String> = match &args.filter {
            Some(filter) => names.into_iter().filter(|n| n.contains(filter)).collect(),
            None => names,
        };
        let filtered_out = total - names.len();
        println!();
        println!(
            "running {} test{}",
            names.len(),
            if names.len() == 1 { "" } else { "s" }
        );
        let outcomes = run_all(&prepared, &settings, names, args.jobs.into()).await;
        let elapsed = started.elapsed();
        print!("{}", final_report(&outcomes, filtered_out, elapsed));
        let _ = std::io::stdout().flush();
        if let Some(file) = &args.junit {
            let xml = junit_xml(&suite, &outcomes, elapsed);
            if let Err(e) = write_atomic(file, xml.as_bytes()) {
                return bad_input(format!(
                    "cannot write the JUnit report {}: {e}",
                    file.display()
                ));
            }
        }
        match outcomes.iter().any(|o| o.failure.is_some()) {
            true => ExitCode::FAILURE,
            false => ExitCode::SUCCESS,
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    status
}

#[path = "test_runner/sim.rs"]
mod sim;

/// What every test's sandbox is made of.
struct Settings {
    placement: Placement,
    timeout: Duration,
    call_timeout: Duration,
    memory_bytes: usize,
    procs: usize,
}

impl Settings {
    /// A fresh sandbox for one test (or the listing).
    fn sandbox(&self) -> Sandbox {
        Sandbox {
            memory_bytes: self.memory_bytes,
            deadline: self.timeout,
            call_timeout: self.call_timeout,
            max_procs: self.procs,
            placement: self.placement.clone(),
            fanout: 16,
            handler_timeout: None,
            grants: Grants::default(),
            max_instances: engine::DEFAULT_MAX_INSTANCES,
            dumps: None,
            debug: None,
            debug_engine: false,
            live: Default::default(),
        }
    }
}

/// `app` itself for a `.wasm`; for a program in a language `build` takes,
/// the component built from it (through the cache).
fn source_program(app: &Path) -> Result<PathBuf, String> {
    if crate::build::Language::of(app).is_none() {
        return Ok(app.to_path_buf());
    }
    let progress = |line: &str| eprintln!("monarch-host: {line}");
    crate::build::build(app, None, &progress)
        .map(|built| built.path)
        .map_err(|e| e.to_string())
}

/// Compiles the program (through the cache) in an engine whose pool is
/// sized for it, as `run` does.
fn prepare(app: &Path, args: &TestArgs) -> Result<Prepared, RunError> {
    load(app, args.memory as usize * (1 << 20))
}

/// Compiles the component at `app` (through the cache) in an engine whose
/// pool is sized for it with `memory_bytes` of linear memory per
/// instance, as `run` and `test` do: for embeddings such as
/// `monarch-test`.
pub fn load(app: &Path, memory_bytes: usize) -> Result<Prepared, RunError> {
    let bytes = std::fs::read(app).map_err(|source| engine::LoadError::Read {
        path: app.to_path_buf(),
        source,
    })?;
    let footprint = engine::inspect(app, &bytes)?;
    let shape = PoolShape::for_program(
        &footprint.needs,
        engine::DEFAULT_MAX_INSTANCES,
        memory_bytes,
    );
    let engine = engine::pooled_engine(&shape).map_err(|e| RunError::Host(format!("{e:#}")))?;
    engine::start_epoch_ticker(&engine);
    Prepared::new(&engine, app, bytes)
}

/// A log sink that keeps the lines, and the lines it keeps.
fn capture() -> (LogSink, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let lines = lines.clone();
        Arc::new(move |line: &str| {
            if let Ok(mut lines) = lines.lock() {
                lines.push(line.to_string());
            }
        })
    };
    (sink, lines)
}

fn take_lines(lines: &Mutex<Vec<String>>) -> Vec<String> {
    lines
        .lock()
        .map(|mut lines| std::mem::take(&mut *lines))
        .unwrap_or_default()
}

/// The program's tests, as `list-tests` names them; a failure says what
/// the listing printed.
async fn list(prepared: &Prepared, settings: &Settings) -> Result<Vec<String>, String> {
    let (sink, lines) = capture();
    let listed = prepared.list_tests(settings.sandbox(), sink).await;
    listed.map_err(|e| {
        let mut text = format!("cannot list the tests: {e}");
        for line in take_lines(&lines) {
            text.push_str("\n    ");
            text.push_str(&line);
        }
        text
    })
}

/// Runs `names`, up to `jobs` at once, printing each one's line as it
/// ends; the outcomes in the order they ended.
async fn run_all(
    prepared: &Arc<Prepared>,
    settings: &Settings,
    names: Vec<String>,
    jobs: usize,
) -> Vec<TestOutcome> {
    let mut waiting = names.into_iter();
    let mut running = tokio::task::JoinSet::new();
    let mut names = std::collections::HashMap::new();
    let mut outcomes = Vec::new();
    loop {
        while running.len() < jobs.max(1) {
            let Some(name) = waiting.next() else { break };
            let prepared = prepared.clone();
            let sandbox = settings.sandbox();
            let timeout = settings.timeout;
            let task = name.clone();
            let handle =
                running.spawn(async move { run_one(&prepared, task, sandbox, timeout).await });
            names.insert(handle.id(), name);
        }
        let Some(joined) = running.join_next_with_id().await else {
            break;
        };
        let outcome = match joined {
            Ok((_, outcome)) => outcome,
            // A panic of the host's own in one test fails that test only.
            Err(e) => TestOutcome {
                name: names.get(&e.id()).cloned().unwrap_or_default(),
                time: Duration::ZERO,
                output: Vec::new(),
                failure: Some(format!("the host panicked running it: {e}")),
            },
        };
        let verdict = match outcome.failure {
            None => "ok",
            Some(_) => "FAILED",
        };
        println!("test {} ... {verdict}", outcome.name);
        let _ = std::io::stdout().flush();
        outcomes.push(outcome);
    }
    outcomes
}

/// Runs one test on a fresh cluster (TT-1).
async fn run_one(
    prepared: &Prepared,
    name: String,
    sandbox: Sandbox,
    timeout: Duration,
) -> TestOutcome {
    let (sink, lines) = capture();
    let started = Instant::now();
    // The sandbox's deadline ends the test; this one only guards against
    // procs that never stop.
    let ran = tokio::time::timeout(
        timeout + STOP_GRACE,
        prepared.run_test(&name, sandbox, sink, std::future::pending()),
    )
    .await;
    let output = take_lines(&lines);
    let failure = match ran {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(failure_text(&e, timeout, &output)),
        Err(_) => Some(format!(
            "timed out after {} s (and its procs did not stop within {} s)",
            timeout.as_secs(),
            STOP_GRACE.as_secs()
        )),
    };
    TestOutcome {
        name,
        time: started.elapsed(),
        output,
        failure,
    }
}

/// Why a test failed, as its report says it: a first line that says it
/// all (the JUnit failure's message), then the details.
fn failure_text(error: &RunError, timeout: Duration, output: &[String]) -> String {
    let timed_out = format!("timed out after {} s", timeout.as_secs());
    match error {
        RunError::Failed(text) => format!("Error: {text}"),
        RunError::Timeout(_) => timed_out,
        // The deadline stopped the guest where it ran: the trap says where.
        RunError::Trap(trap) if trap.contains(crate::host::DEADLINE_PASSED) => {
            format!("{timed_out}\n\n{trap}")
        }
        RunError::Trap(trap) => match panic_line(output) {
            Some(panic) => format!("the test {panic}\n\n{trap}"),
            None => format!("the test trapped: {}\n\n{trap}", trap_cause(trap)),
        },
        RunError::Exit(code) => format!("the test exited with status {code}"),
        other => other.to_string(),
    }
}

/// The first line of the panic hook's message among a test's output:
/// `panicked at FILE:LINE:COL: MESSAGE`.
fn panic_line(output: &[String]) -> Option<&str> {
    output.iter().rev().find_map(|entry| {
        entry.lines().find_map(|line| {
            let at = line.find("panicked at ")?;
            // A one-line message logged at error level ends so.
            Some(line[at..].trim_end().trim_end_matches(" (error)"))
        })
    })
}

/// The innermost cause of a trap's text (e.g. `wasm trap: wasm
/// \`unreachable\` instruction executed`), else its first line.
fn trap_cause(trap: &str) -> &str {
    let first = trap.lines().next().unwrap_or(trap);
    let Some((_, causes)) = trap.split_once("\n\nCaused by:\n") else {
        return first;
    };
    causes
        .lines()
        .map(str::trim)
        .rfind(|line| !line.is_empty())
        .map(|line| match line.split_once(": ") {
            // `N: cause` when there are several.
            Some((n, cause)) if n.chars().all(|c| c.is_ascii_digit()) => cause,
            _ => line,
        })
        .unwrap_or(first)
}

/// The JUnit suite's name: the program's file name without `.wasm`.
fn suite_name(app: &Path) -> String {
    app.file_stem()
        .map(|stem| stem.to_string_lossy().into_owned())
        .unwrap_or_else(|| app.display().to_string())
}

/// `test result: ok. 3 passed; 0 failed; 0 filtered out; finished in 1.42s`.
pub fn summary_line(
    passed: usize,
    failed: usize,
    filtered_out: usize,
    elapsed: Duration,
) -> String {
    let verdict = match failed {
        0 => "ok",
        _ => "FAILED",
    };
    format!(
        "test result: {verdict}. {passed} passed; {failed} failed; {filtered_out} filtered out; finished in {:.2}s",
        elapsed.as_secs_f64()
    )
}

/// What follows the tests' lines: the failures' reports, their names, and
/// the summary line.
fn final_report(outcomes: &[TestOutcome], filtered_out: usize, elapsed: Duration) -> String {
    // By name, so that the reports read the same whatever --jobs did.
    let mut failed: Vec<&TestOutcome> = outcomes.iter().filter(|o| o.failure.is_some()).collect();
    failed.sort_by(|a, b| a.name.cmp(&b.name));
    let mut text = String::from("\n");
    if !failed.is_empty() {
        text.push_str("failures:\n\n");
        for outcome in &failed {
            let _ = writeln!(text, "---- {} ----", outcome.name);
            text.push_str(&outcome.report());
            text.push('\n');
        }
        text.push_str("failures:\n");
        for outcome in &failed {
            let _ = writeln!(text, "    {}", outcome.name);
        }
        text.push('\n');
    }
    let passed = outcomes.len() - failed.len();
    text.push_str(&summary_line(passed, failed.len(), filtered_out, elapsed));
    text.push_str("\n\n");
    text
}

/// `text` escaped for an XML attribute or text node; characters XML 1.0
/// cannot hold at all (most control characters) become U+FFFD (TT-4).
pub fn escape_xml(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            // Kept in text, but an attribute would normalize them away.
            '\n' => escaped.push_str("&#10;"),
            '\r' => escaped.push_str("&#13;"),
            '\t' => escaped.push_str("&#9;"),
            '\u{0}'..='\u{1f}' | '\u{fffe}' | '\u{ffff}' => escaped.push('\u{fffd}'),
            c => escaped.push(c),
        }
    }
    escaped
}

/// The JUnit XML report of `outcomes`, one suite named `suite`.
pub fn junit_xml(suite: &str, outcomes: &[TestOutcome], elapsed: Duration) -> String {
    let failures = outcomes.iter().filter(|o| o.failure.is_some()).count();
    let suite = escape_xml(suite);
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        xml,
        "<testsuites name=\"{suite}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" time=\"{:.3}\">",
        outcomes.len(),
        elapsed.as_secs_f64()
    );
    let _ = writeln!(
        xml,
        "  <testsuite name=\"{suite}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"0\" time=\"{:.3}\">",
        outcomes.len(),
        elapsed.as_secs_f64()
    );
    for outcome in outcomes {
        let _ = write!(
            xml,
            "    <testcase classname=\"{suite}\" name=\"{}\" time=\"{:.3}\"",
            escape_xml(&outcome.name),
            outcome.time.as_secs_f64()
        );
        match &outcome.failure {
            None => xml.push_str("/>\n"),
            Some(failure) => {
                let message = failure.lines().next().unwrap_or_default();
                let _ = writeln!(
                    xml,
                    ">\n      <failure message=\"{}\" type=\"failure\">{}</failure>\n    </testcase>",
                    escape_xml(message),
                    escape_text(&outcome.report())
                );
            }
        }
    }
    xml.push_str("  </testsuite>\n</testsuites>\n");
    xml
}

/// [`escape_xml`] for a text node, where line breaks stay as they are.
fn escape_text(text: &str) -> String {
    escape_xml(text)
        .replace("&#10;", "\n")
        .replace("&#9;", "\t")
}

/// Writes `bytes` to `path` whole or not at all: to a file beside it, then
/// renamed over it (TT-4).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("it names no file"))?;
    let temporary = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = std::fs::File::create(&temporary).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&temporary, path)) {
        let _ = std::fs::remove_file(&temporary);
        return Err(e);
    }
    Ok(())
}

/// Logs to stderr, as `run` does, unless this process already logs.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "warn,hyperactor::actor=off".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(name: &str, output: &[&str], failure: Option<&str>) -> TestOutcome {
        TestOutcome {
            name: name.into(),
            time: Duration::from_millis(1234),
            output: output.iter().map(|l| l.to_string()).collect(),
            failure: failure.map(str::to_string),
        }
    }

    #[test]
    fn summary_says_ok_only_when_nothing_failed() {
        assert_eq!(
            summary_line(3, 0, 1, Duration::from_millis(1420)),
            "test result: ok. 3 passed; 0 failed; 1 filtered out; finished in 1.42s"
        );
        assert_eq!(
            summary_line(2, 1, 0, Duration::from_millis(5)),
            "test result: FAILED. 2 passed; 1 failed; 0 filtered out; finished in 0.01s"
        );
    }

    #[test]
    fn tt2_final_report_lists_each_failure_by_name_with_its_output_then_its_error() {
        let outcomes = [
            outcome(
                "b_fails",
                &["[workers 0] hi", "controller line"],
                Some("Error: 2 != 3"),
            ),
            outcome("a_passes", &["not shown"], None),
            outcome("a_fails", &[], Some("timed out after 2 s")),
        ];
        let report = final_report(&outcomes, 0, Duration::from_secs(1));
        let expected = "\nfailures:\n\n---- a_fails ----\ntimed out after 2 s\n\n---- b_fails ----\n[workers 0] hi\ncontroller line\n\nError: 2 != 3\n\nfailures:\n    a_fails\n    b_fails\n\ntest result: FAILED. 1 passed; 2 failed; 0 filtered out; finished in 1.00s\n\n";
        assert_eq!(report, expected);
        assert!(
            !report.contains("not shown"),
            "a passed test's output is not shown"
        );
    }

    #[test]
    fn tt2_a_failure_says_first_why_the_test_failed() {
        let timeout = Duration::from_secs(2);
        let trap = "error while executing at wasm backtrace:\n    0:  0x25fe4 - app.wasm!abort\n\nCaused by:\n    wasm trap: wasm `unreachable` instruction executed\n";
        let panicked = [
            "before".to_string(),
            "[controller] panicked at src/lib.rs:66:5: assertion `left == right` failed\n  left: 2\n right: 3 (error)".to_string(),
        ];
        let text = failure_text(&RunError::Trap(trap.into()), timeout, &panicked);
        assert!(
            text.starts_with("the test panicked at src/lib.rs:66:5: assertion `left == right` failed\n\nerror while executing"),
            "{text}"
        );
        assert!(
            text.contains("app.wasm!abort"),
            "the backtrace is kept: {text}"
        );
        let text = failure_text(&RunError::Trap(trap.into()), timeout, &[]);
        assert!(
            text.starts_with(
                "the test trapped: wasm trap: wasm `unreachable` instruction executed\n"
            ),
            "{text}"
        );
        let deadline = format!(
            "error while executing\n\nCaused by:\n    {}",
            crate::host::DEADLINE_PASSED
        );
        let text = failure_text(&RunError::Trap(deadline), timeout, &[]);
        assert!(text.starts_with("timed out after 2 s\n"), "{text}");
        let text = failure_text(&RunError::Timeout(timeout), timeout, &[]);
        assert_eq!(text, "timed out after 2 s");
        let text = failure_text(&RunError::Failed("7 != 8".into()), timeout, &panicked);
        assert_eq!(text, "Error: 7 != 8");
    }

    #[test]
    fn tt4_escape_xml_escapes_markup_and_drops_what_xml_cannot_hold() {
        assert_eq!(
            escape_xml(r#"a<b>&"c"'d'"#),
            "a&lt;b&gt;&amp;&quot;c&quot;&apos;d&apos;"
        );
        assert_eq!(escape_xml("x\u{1b}[31my\u{0}"), "x\u{fffd}[31my\u{fffd}");
        assert_eq!(escape_xml("l1\nl2\tend"), "l1&#10;l2&#9;end");
        assert_eq!(escape_xml("ünï ✓"), "ünï ✓");
    }

    #[test]
    fn tt4_junit_report_counts_and_escapes() {
        let outcomes = [
            outcome("ok_<one>", &[], None),
            outcome(
                "fails",
                &["left: 2 & \"right\": 3"],
                Some("the test trapped: panicked at <lib.rs:3:5>\nbacktrace"),
            ),
        ];
        let xml = junit_xml("my&app", &outcomes, Duration::from_millis(2500));
        assert!(xml.contains(
            "<testsuite name=\"my&amp;app\" tests=\"2\" failures=\"1\" errors=\"0\" skipped=\"0\" time=\"2.500\">"
        ), "{xml}");
        assert!(
            xml.contains(
                "<testcase classname=\"my&amp;app\" name=\"ok_&lt;one&gt;\" time=\"1.234\"/>"
            ),
            "{xml}"
        );
        assert!(xml.contains(
            "<failure message=\"the test trapped: panicked at &lt;lib.rs:3:5&gt;\" type=\"failure\">left: 2 &amp; &quot;right&quot;: 3\n\nthe test trapped: panicked at &lt;lib.rs:3:5&gt;\nbacktrace\n</failure>"
        ), "{xml}");
        // Every tag opened is closed, in order.
        let mut open: Vec<String> = Vec::new();
        for tag in xml.split('<').skip(1) {
            let tag = tag.split('>').next().unwrap_or_default();
            if tag.starts_with('?') || tag.ends_with('/') {
                continue;
            }
            let name = tag.split_whitespace().next().unwrap_or_default();
            match name.strip_prefix('/') {
                Some(closed) => assert_eq!(open.pop().as_deref(), Some(closed), "{xml}"),
                None => open.push(name.to_string()),
            }
        }
        assert!(open.is_empty(), "unclosed: {open:?}\n{xml}");
    }

    #[test]
    fn tt4_write_atomic_replaces_the_file_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("monarch-junit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let file = dir.join("report.xml");
        std::fs::write(&file, "old").expect("the old report");
        write_atomic(&file, b"<new/>").expect("written");
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "<new/>");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .expect("listed")
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 1, "only the report is left: {left:?}");
        let missing = dir.join("no-such-dir").join("report.xml");
        assert!(write_atomic(&missing, b"x").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

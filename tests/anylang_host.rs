//! The host's fixes for interpreted guests: programs built with
//! componentize-py (Python) or jco (JavaScript), whose components are tens
//! of MiB, make 9 to 14 core instances each, start with MiBs of linear
//! memory, and collect garbage.
//!
//! The programs are raw Python against the WIT bindings
//! (`tests/programs/python-raw/`, no SDK), built here with componentize-py
//! into `target/tmp/anylang`, keyed by a hash of their sources, the WIT and
//! componentize-py's version. Without componentize-py these tests fail with
//! a message that says to run `scripts/setup`, unless
//! `MONARCH_SKIP_ANYLANG=1`, which makes them print a line and pass.
//!
//! They run one at a time: the first to run a program compiles it into the
//! compile cache (minutes for an 18 MiB component in a debug build), and
//! those after it reuse that; and some measure memory.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Held by each test for its whole run.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// How long a run that compiles an interpreter's component may take: a
/// debug build of the host compiles 18 MiB of Python in minutes.
const COMPILING: Duration = Duration::from_secs(900);

/// How long a refusal that must come before compiling may take.
const AT_ONCE: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the repository")
        .to_path_buf()
}

/// The version componentize-py prints, or None where it is not installed
/// and `MONARCH_SKIP_ANYLANG=1` says to skip; panics where it is missing
/// and nothing says so.
fn componentize_py(test: &str) -> Option<String> {
    let version = Command::new("componentize-py")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string());
    if version.is_none() && std::env::var("MONARCH_SKIP_ANYLANG").as_deref() == Ok("1") {
        eprintln!("skipping {test}: componentize-py is not installed (MONARCH_SKIP_ANYLANG=1)");
        return None;
    }
    Some(version.unwrap_or_else(|| {
        panic!(
            "{test} needs componentize-py, which is not installed: run scripts/setup \
             (or set MONARCH_SKIP_ANYLANG=1 to skip the tests of interpreted guests)"
        )
    }))
}

/// The WIT package's files, sorted by name.
fn wit_files(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            (path.extension()? == "wit").then(|| {
                let text = std::fs::read_to_string(&path).unwrap();
                (
                    path.file_name().unwrap().to_string_lossy().into_owned(),
                    text,
                )
            })
        })
        .collect();
    files.sort();
    files
}

/// Builds `tests/programs/python-raw/<name>/app.py` into a component of
/// `world` of the WIT package in `wit` (the repository's `wit/` unless
/// given), through a cache keyed by their hash. None: skipped.
fn python(test: &str, name: &str, wit: Option<&Path>, world: &str) -> Option<PathBuf> {
    static BUILDING: Mutex<()> = Mutex::new(());
    let version = componentize_py(test)?;
    let source_dir = repo().join("tests/programs/python-raw").join(name);
    let source = std::fs::read_to_string(source_dir.join("app.py"))
        .unwrap_or_else(|e| panic!("{}: {e}", source_dir.display()));
    let wit = wit.map_or_else(|| repo().join("wit"), Path::to_path_buf);
    let mut key = DefaultHasher::new();
    (&source, wit_files(&wit), world, &version).hash(&mut key);
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("anylang");
    let wasm = out_dir.join(format!("{name}-{world}-{:016x}.wasm", key.finish()));
    let _building = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    if wasm.exists() {
        return Some(wasm);
    }
    std::fs::create_dir_all(&out_dir).unwrap();
    let partial = wasm.with_extension("partial");
    let out = Command::new("componentize-py")
        .arg("-d")
        .arg(&wit)
        .args(["-w", world, "componentize", "-p"])
        .arg(&source_dir)
        .args(["app", "-o"])
        .arg(&partial)
        // No __pycache__ in the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run componentize-py");
    assert!(
        out.status.success(),
        "componentize-py could not build {}:\n{}{}",
        source_dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&partial, &wasm).unwrap();
    Some(wasm)
}

/// Takes this file's turn (see the module docs), and builds the Python
/// program of these tests, of the `program` world. None: skipped.
fn turn(test: &str) -> Option<(MutexGuard<'static, ()>, PathBuf)> {
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    Some((turn, python(test, "anylang", None, "program")?))
}

/// What one `monarch-host run` did.
struct Run {
    code: Option<i32>,
    stdout: Vec<String>,
    stderr: String,
    elapsed: Duration,
    /// What the host and its child procs held when the program printed
    /// `READY`.
    memory: Vec<Memory>,
}

struct Memory {
    pid: u32,
    command: String,
    rss_kib: u64,
    pss_kib: u64,
    private_kib: u64,
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} ({}): resident {} KiB, proportional {} KiB, private {} KiB",
            self.pid, self.command, self.rss_kib, self.pss_kib, self.private_kib
        )
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "exit code {:?} after {:?}; stdout:",
            self.code, self.elapsed
        )?;
        for line in &self.stdout {
            writeln!(f, "{line}")?;
        }
        writeln!(f, "stderr:\n{}", self.stderr)?;
        for m in &self.memory {
            writeln!(f, "{m:?}")?;
        }
        Ok(())
    }
}

impl Run {
    fn line(&self, prefix: &str) -> &str {
        self.stdout
            .iter()
            .find(|line| line.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starts with {prefix:?}: {self:?}"))
    }
}

/// Runs `monarch-host run ARGS...`; measures the memory of it and its
/// children when the program prints `READY`; kills it and panics past
/// `limit`.
fn run(args: &[&str], limit: Duration) -> Run {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .arg("run")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start monarch-host");
    let pid = child.id();
    let mut stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let (lines, lines_rx) = std::sync::mpsc::channel();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let mut stdout = Vec::new();
    let mut memory = Vec::new();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "monarch-host {args:?} ran past {limit:?}; stdout so far:\n{}\nstderr:\n{}",
                stdout.join("\n"),
                stderr.join().unwrap_or_default()
            );
        }
        while let Ok(line) = lines_rx.recv_timeout(Duration::from_millis(20)) {
            if line.starts_with("READY") {
                memory = measure(pid);
            }
            stdout.push(line);
        }
    };
    stdout.extend(lines_rx.iter());
    Run {
        code,
        stdout,
        stderr: stderr.join().unwrap_or_default(),
        elapsed: started.elapsed(),
        memory,
    }
}

/// The memory of `pid` and its child processes.
fn measure(pid: u32) -> Vec<Memory> {
    let mut pids = vec![pid];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // The parent's pid is the second field after the command's `)`.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if parent == Some(pid) {
            pids.push(child);
        }
    }
    pids.into_iter()
        .filter_map(|pid| {
            let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
            let field = |name: &str| -> u64 {
                rollup
                    .lines()
                    .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                    .and_then(|v| v.split_whitespace().next()?.parse().ok())
                    .unwrap_or(0)
            };
            let command = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .replace('\0', " ");
            Some(Memory {
                pid,
                command,
                rss_kib: field("Rss"),
                pss_kib: field("Pss"),
                private_kib: field("Private_Clean") + field("Private_Dirty"),
            })
        })
        .collect()
}

/// 1,000 Python actors fit on one child proc at the default settings (the
/// pool used to hold 4 core instances per component instance, 342 Python
/// actors), and need well under a GiB there: what one actor dirties of its
/// memory image, and its instance's state.
#[test]
fn a_thousand_python_actors_fit_on_one_child_proc() {
    let Some((_turn, app)) = turn("a_thousand_python_actors_fit_on_one_child_proc") else {
        return;
    };
    let run = run(
        &[app.to_str().unwrap(), "--", "spawn", "1", "1000", "1"],
        COMPILING,
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.line("READY"), "READY 1000", "{run:?}");
    let proc = run
        .memory
        .iter()
        .find(|m| m.command.contains("bootstrap"))
        .unwrap_or_else(|| panic!("no child proc was measured: {run:?}"));
    eprintln!("1,000 Python actors on one child proc: {proc:?}");
    assert!(proc.pss_kib < 2 << 20, "{run:?}");
}

/// With `--in-process` the controller and 1,000 Python actors share one
/// process and its pool.
#[test]
fn a_thousand_python_actors_fit_in_process() {
    let Some((_turn, app)) = turn("a_thousand_python_actors_fit_in_process") else {
        return;
    };
    let run = run(
        &[
            app.to_str().unwrap(),
            "--in-process",
            "--",
            "spawn",
            "1",
            "1000",
            "1",
        ],
        COMPILING,
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.line("READY"), "READY 1000", "{run:?}");
    eprintln!(
        "the host with 1,000 in-process Python actors: {:?}",
        run.memory
    );
    assert!(run.memory[0].pss_kib < 3 << 20, "{run:?}");
}

/// A spawn past the pool fails at the first rank that does not fit, with
/// an error that names the limit and `--max-instances`; with
/// `--in-process` the controller holds one of the places.
#[test]
fn a_full_pool_names_its_limit_the_flag_and_the_first_rank_that_did_not_fit() {
    let Some((_turn, app)) = turn("a_full_pool_names_its_limit") else {
        return;
    };
    let app = app.to_str().unwrap();
    for (placement, first_left_out) in [("--procs=1", 40), ("--in-process", 39)] {
        let run = run(
            &[
                app,
                placement,
                "--max-instances",
                "40",
                "--",
                "spawn",
                "1",
                "50",
                "0",
            ],
            COMPILING,
        );
        assert_eq!(run.code, Some(1), "{run:?}");
        let expected = format!(
            "many[{first_left_out}] of class `Echo` did not start: this process's instance pool is full: it holds 40 component instances"
        );
        assert!(
            run.stderr.contains(&expected),
            "expected {expected:?}: {run:?}"
        );
        assert!(run.stderr.contains("raise --max-instances"), "{run:?}");
    }
}

/// `--memory` below the program's initial linear memory (componentize-py's
/// is about 13 MiB) is refused before compiling, saying how much it needs.
#[test]
fn too_little_memory_is_refused_before_compiling() {
    let Some((_turn, app)) = turn("too_little_memory_is_refused_before_compiling") else {
        return;
    };
    let run = run(
        &[
            app.to_str().unwrap(),
            "--memory",
            "4",
            "--",
            "spawn",
            "1",
            "1",
            "0",
        ],
        AT_ONCE,
    );
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains("MiB of linear memory")
            && run
                .stderr
                .contains("more than the cap of 4 MiB per instance; raise --memory to"),
        "{run:?}"
    );
}

/// A program that imports an interface the host does not provide (as
/// ComponentizeJS's output imports wasi:http unless built with `-d http`)
/// is refused before compiling, naming the import.
#[test]
fn a_stray_import_is_refused_before_compiling() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if componentize_py("a_stray_import_is_refused_before_compiling").is_none() {
        return;
    }
    // The program's world, plus an import nobody provides.
    let wit = Path::new(env!("CARGO_TARGET_TMPDIR")).join("anylang-stray-wit");
    std::fs::create_dir_all(&wit).unwrap();
    for (name, text) in wit_files(&repo().join("wit")) {
        std::fs::write(wit.join(name), text).unwrap();
    }
    std::fs::write(
        wit.join("stray.wit"),
        "package monarch:host@0.2.0;\n\
         interface stray { ping: func() -> u32; }\n\
         world stray-program { include program; import stray; }\n",
    )
    .unwrap();
    let Some(app) = python("stray", "anylang", Some(&wit), "stray-program") else {
        return;
    };
    let run = run(
        &[app.to_str().unwrap(), "--", "spawn", "1", "1", "0"],
        AT_ONCE,
    );
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr
            .contains("imports an interface this host does not provide: monarch:host/stray@0.2.0."),
        "{run:?}"
    );
}

/// A `memory.grow` past the cap fails instead of trapping: Python raises
/// `MemoryError`, a handler that catches it collects and goes on, and the
/// actor lives. One that lets it escape fails with kind out-of-memory,
/// naming the cap.
#[test]
fn python_catches_memory_error_and_lives() {
    let Some((_turn, app)) = turn("python_catches_memory_error_and_lives") else {
        return;
    };
    let run = run(
        &[app.to_str().unwrap(), "--memory", "64", "--", "oom"],
        COMPILING,
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    let caught = run.line("CAUGHT held ");
    assert!(caught.ends_with("MiB, then 4 MiB again"), "{run:?}");
    assert_eq!(run.line("ALIVE"), "ALIVE pong 0", "{run:?}");
    let uncaught = run.line("UNCAUGHT");
    assert!(
        uncaught.starts_with("UNCAUGHT OUT_OF_MEMORY growing memory to")
            && uncaught
                .contains("the cap is 64 MiB per instance (--memory), and then the guest trapped"),
        "{run:?}"
    );
}

/// A host's child procs share the compiled program (mapped from the
/// compile cache) and keep no copy of the component's bytes: 8 procs of
/// one Python actor each hold little memory of their own.
#[test]
fn child_procs_share_the_program() {
    let Some((_turn, app)) = turn("child_procs_share_the_program") else {
        return;
    };
    let size = std::fs::metadata(&app).unwrap().len() >> 10;
    let run = run(
        &[app.to_str().unwrap(), "--", "spawn", "8", "1", "1"],
        COMPILING,
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.line("READY"), "READY 8", "{run:?}");
    let procs: Vec<&Memory> = run
        .memory
        .iter()
        .filter(|m| m.command.contains("bootstrap"))
        .collect();
    assert_eq!(procs.len(), 8, "{run:?}");
    for proc in procs {
        eprintln!("a child proc of a {size} KiB Python program: {proc:?}");
        assert!(
            proc.private_kib < size,
            "a proc holds more of its own than the component's size ({size} KiB): {run:?}"
        );
    }
}

/// The median round trips (us) the program measured in `rtt` mode, by
/// handler time.
fn round_trips(app: &Path, placement: &[&str], busy_us: &[&str]) -> Vec<(String, f64)> {
    let mut args = vec![app.to_str().unwrap()];
    args.extend(placement);
    args.extend(["--", "rtt", "2000"]);
    args.extend(busy_us);
    let run = run(&args, COMPILING);
    assert_eq!(run.code, Some(0), "{run:?}");
    run.stdout
        .iter()
        .filter_map(|line| {
            let mut words = line.strip_prefix("RTT ")?.split(' ');
            Some((words.next()?.to_string(), words.next()?.parse().ok()?))
        })
        .collect()
}

/// A call to a Python actor on a child proc costs what one in process does
/// plus the trip between processes, whatever its handler takes up to
/// hundreds of microseconds: both sides poll for as long as the
/// conversation's turns have lately taken, so neither pays a sleeping
/// thread's wake-up (about 90 us on a VM) per call. With a fixed 50 us of
/// polling, a Python call (the interpreter takes tens of microseconds on
/// each side) paid it every time: 120 us against 20 in process.
///
/// Timing, so only in release builds (`cargo test --release -p
/// monarch-tests --test anylang_host`): a debug build's own cost per call
/// (about 800 us) hides it. The best of three runs, as other load on the
/// machine only ever slows a run.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "measures latency: run with `cargo test --release`"
)]
fn a_call_to_a_child_proc_pays_no_wake_ups() {
    let Some((_turn, app)) = turn("a_call_to_a_child_proc_pays_no_wake_ups") else {
        return;
    };
    let busy = ["0", "20", "100"];
    let mut runs = Vec::new();
    for _ in 0..3 {
        let in_process = round_trips(&app, &["--in-process"], &busy);
        let child = round_trips(&app, &[], &busy);
        eprintln!("round trips (us) in process {in_process:?}, to a child proc {child:?}");
        let near = in_process.len() == busy.len()
            && child.len() == busy.len()
            && in_process
                .iter()
                .zip(&child)
                .all(|((_, here), (_, there))| *there < *here + 50.0);
        if near {
            return;
        }
        runs.push((in_process, child));
    }
    panic!("a call to a child proc took 50 us more than in process in every run: {runs:?}");
}

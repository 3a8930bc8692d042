//! Component tests: real guest programs, built for `wasm32-wasip2` by this
//! crate's build script, run by monarch-host.
//!
//! The programs are the examples (`examples/`) and the edge cases in
//! `tests/programs/`: a controller or actor that spins (`spin`), one that
//! allocates past the memory cap (`hog`), and a component of the wrong WIT
//! world (`wrong_world`). Files that are not programs at all (garbage, a
//! core module, a missing file) are written here.
//!
//! Most tests call the host's library, [`monarch_host::run_program`], and
//! capture the program's log lines; the `cli_*` tests run the
//! `monarch-host` command as a process, to check what a user sees: the exit
//! status and the error on stderr. Every guest program has a test named
//! after it (`foreach_guest_program!`, made by the build script).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use monarch_host::host::LogSink;
use monarch_host::{LoadError, RunError, Sandbox, run_program};

#[path = "support/cli.rs"]
mod cli;
use cli::{monarch_host, monarch_host_env};

#[macro_use]
mod guest_programs {
    include!(concat!(env!("OUT_DIR"), "/guest_programs.rs"));
}

/// Fails to compile unless a test function is named after the program.
macro_rules! assert_test_exists {
    ($name:ident) => {
        #[allow(unused_imports)]
        use self::$name as _;
    };
}
foreach_guest_program!(assert_test_exists);

/// How long a run that should succeed may take before the host ends it.
const DEADLINE: Duration = Duration::from_secs(20);

/// What one run did.
struct Run {
    result: Result<(), RunError>,
    /// The program's log lines, as the command would print them.
    lines: Vec<String>,
    /// When each line was logged, from the start of the run.
    logged_at: Vec<Duration>,
    /// How long the run took, loading the program included.
    elapsed: Duration,
}

impl Run {
    /// When the first line that contains `needle` was logged.
    fn first_logged(&self, needle: &str) -> Duration {
        self.assert_logged(needle);
        let index = self.lines.iter().position(|line| line.contains(needle));
        self.logged_at[index.unwrap_or_default()]
    }

    /// The log lines that contain `needle`.
    fn lines_with(&self, needle: &str) -> Vec<&str> {
        self.lines
            .iter()
            .filter(|line| line.contains(needle))
            .map(String::as_str)
            .collect()
    }

    /// Panics, showing the run, unless a log line contains `needle`.
    fn assert_logged(&self, needle: &str) {
        assert!(
            !self.lines_with(needle).is_empty(),
            "no log line contains {needle:?}; the run logged:\n{}\nand returned {:?}",
            self.lines.join("\n"),
            self.result
        );
    }

    /// Panics, showing the run, unless it returned Ok.
    fn assert_ok(&self) {
        assert!(
            self.result.is_ok(),
            "the run failed: {:?}; it logged:\n{}",
            self.result,
            self.lines.join("\n")
        );
    }
}

/// A sandbox like the command's defaults, with a test-sized deadline.
fn sandbox() -> Sandbox {
    Sandbox {
        deadline: DEADLINE,
        ..Sandbox::default()
    }
}

/// Runs the program at `path` with `args`, the way the command does: on a
/// multi-threaded runtime, in a task of its own.
fn run(path: &Path, args: &[&str], sandbox: Sandbox) -> Run {
    let started = Instant::now();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let log: LogSink = {
        let lines = lines.clone();
        Arc::new(move |line: &str| {
            let at = started.elapsed();
            lines.lock().unwrap().push((at, line.to_string()));
        })
    };
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    let path = path.to_path_buf();
    // Past the deadline the host must end the run; later (compiling the
    // program in a debug build is slow on a busy machine), the test does.
    let limit = sandbox.deadline + Duration::from_secs(30);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let result = runtime.block_on(async move {
        let task = tokio::spawn(async move { run_program(&path, &args, sandbox, log).await });
        match tokio::time::timeout(limit, task).await {
            Ok(joined) => joined.expect("run_program panicked"),
            Err(_) => panic!("the run did not end within {limit:?}, past its deadline"),
        }
    });
    let elapsed = started.elapsed();
    // Actors still computing yield at every epoch tick, so this is quick.
    runtime.shutdown_timeout(Duration::from_secs(1));
    let (logged_at, lines) = std::mem::take(&mut *lines.lock().unwrap())
        .into_iter()
        .unzip();
    Run {
        result,
        lines,
        logged_at,
        elapsed,
    }
}

/// A file named `name` in this test's scratch directory, holding `bytes`.
fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The smallest core module: the magic, then version 1 of layer 0.
const CORE_MODULE: &[u8] = b"\0asm\x01\0\0\0";

/// The `MiB` of every "holds N MiB" line the hog logged.
fn held_mib(run: &Run) -> Vec<usize> {
    run.lines_with(" holds ")
        .iter()
        .filter_map(|line| {
            line.split(" holds ")
                .nth(1)?
                .strip_suffix(" MiB")?
                .parse()
                .ok()
        })
        .collect()
}

/// hello: four greeters, one greeting line per rank, in rank order.
#[test]
fn hello() {
    let run = run(Path::new(env!("GUEST_HELLO")), &[], sandbox());
    run.assert_ok();
    let expected: Vec<String> = (0..4)
        .map(|rank| format!("[controller] rank {rank}: hello from rank {rank} of 4"))
        .collect();
    assert_eq!(
        run.lines_with("hello from rank"),
        expected,
        "{:#?}",
        run.lines
    );
}

/// failing-tests: a program of tests (`tests/test_runner.rs` runs them);
/// its main only says so.
#[test]
fn failing_tests() {
    let run = run(Path::new(env!("GUEST_FAILING_TESTS")), &[], sandbox());
    run.assert_ok();
    run.assert_logged("failing-tests has only tests");
}

/// faults: a program of tests that make faults on purpose
/// (`tests/test_runner.rs` runs them, in real and simulated mode); its
/// main only says so.
#[test]
fn faults() {
    let run = run(Path::new(env!("GUEST_FAULTS")), &[], sandbox());
    run.assert_ok();
    run.assert_logged("faults has only tests");
}

/// racy: a racy test and its fix, for `monarch-host test --sim`
/// (`tests/test_runner.rs`); its main only says so.
#[test]
fn racy() {
    let run = run(Path::new(env!("GUEST_RACY")), &[], sandbox());
    run.assert_ok();
    run.assert_logged("racy has only tests");
}

/// ping-pong: two pingers hit their pongers three times each, awaiting the
/// replies inside their handlers; the pongers counted six hits in all.
#[test]
fn ping_pong() {
    let run = run(Path::new(env!("GUEST_PING_PONG")), &[], sandbox());
    run.assert_ok();
    run.assert_logged("[controller] pinger 0 got 3 pongs back");
    run.assert_logged("[controller] pinger 1 got 3 pongs back");
    run.assert_logged("[controller] total hits: 6");
}

/// counter: an endpoint error and a trapped actor both come back to the
/// controller as values, and the run carries on to a new mesh.
#[test]
fn counter() {
    let run = run(Path::new(env!("GUEST_COUNTER")), &[], sandbox());
    run.assert_ok();
    // The endpoint's error keeps its kind, origin and type name.
    run.assert_logged(
        "kind endpoint: the endpoint `add` at counters[1] returned an error: ValueError: cannot add -1: counters only count up",
    );
    run.assert_logged("counter 1 lives on, still at 5");
    // The trap is one failure, of kind trap, naming the endpoint.
    run.assert_logged("kind trap: actor counters[2] failed in `crash`: trap: wasm trap");
    // A later call names where the actor failed, whether the failure
    // event or the call reaches the controller first.
    run.assert_logged("a call to the whole mesh fails: actor counters[2] failed in `crash`: trap");
    run.assert_logged("a new mesh on the same procs sums to 300");
}

/// The losses of data-parallel's `step N loss X` lines, in order, checking
/// that the steps are numbered 1, 2, ...
fn losses(lines: &[&str]) -> Vec<f64> {
    lines
        .iter()
        .enumerate()
        .map(|(i, line)| {
            let rest = line
                .split(&format!("step {} loss ", i + 1))
                .nth(1)
                .unwrap_or_else(|| panic!("line {i} is not step {}: {line:?}", i + 1));
            rest.trim()
                .parse()
                .unwrap_or_else(|e| panic!("{rest:?} is not a loss: {e}"))
        })
        .collect()
}

/// data-parallel: 20 steps of linear regression on 4 procs, each printing
/// `step N loss X`; the loss falls every step, by orders of magnitude, and
/// the learned weights match the true ones.
#[test]
fn data_parallel() {
    let run = run(Path::new(env!("GUEST_DATA_PARALLEL")), &[], sandbox());
    run.assert_ok();
    let losses = losses(&run.lines_with("] step "));
    assert_eq!(losses.len(), 20, "{:#?}", run.lines);
    for pair in losses.windows(2) {
        assert!(
            pair[1] < pair[0],
            "the loss must fall every step: {losses:?}"
        );
    }
    assert!(losses[19] < losses[0] * 1e-9, "{losses:?}");
    run.assert_logged("split by rows over 4 procs");
    run.assert_logged("the loss fell every step");
    let within = run.lines_with("learned w is within");
    let error: f64 = within
        .first()
        .and_then(|line| line.split("within ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("no error figure in {within:?}"));
    assert!(error < 1e-3, "w is {error} away from the true w");
}

/// data-parallel's arguments: other sizes train too, and a bad argument or
/// a CUDA device on a build without CUDA ends the run with an error that
/// says why, not a hang or a trap.
#[test]
fn data_parallel_arguments() {
    let path = Path::new(env!("GUEST_DATA_PARALLEL"));
    let small = run(
        path,
        &["--procs", "2", "--steps", "5", "--rows", "64"],
        sandbox(),
    );
    small.assert_ok();
    assert_eq!(losses(&small.lines_with("] step ")).len(), 5);
    small.assert_logged("split by rows over 2 procs");
    let bogus = run(path, &["--bogus"], sandbox());
    let error = format!("{:?}", bogus.result);
    assert!(error.contains("unknown argument `--bogus`"), "{error}");
    let too_few = run(path, &["--rows", "2"], sandbox());
    let error = format!("{:?}", too_few.result);
    assert!(error.contains("must be at least --procs"), "{error}");
    // This crate builds monarch-host without its `cuda` feature.
    let cuda = run(path, &["--device", "cuda"], sandbox());
    let error = format!("{:?}", cuda.result);
    assert!(error.contains("no CUDA backend"), "{error}");
    assert!(
        error.contains("step 1"),
        "the error names the step: {error}"
    );
}

/// dataplane: the `tensor` and `rdma` interfaces end to end on a 2 x 2
/// mesh, results and errors; each check logs `ok: <name>`.
#[test]
fn dataplane() {
    let run = run(Path::new(env!("GUEST_DATAPLANE")), &[], sandbox());
    run.assert_ok();
    for check in DATAPLANE_CHECKS {
        run.assert_logged(&format!("ok: {check}"));
    }
    run.assert_logged("all checks passed");
}

/// What `dataplane` checks, by the names it logs.
const DATAPLANE_CHECKS: &[&str] = &[
    "a fetch returns every element",
    "shardings hold the same global tensor",
    "fetch-shard returns each rank's block",
    "scalar and elementwise ops",
    "unary ops",
    "matmul and transpose",
    "sum to one value",
    "xᵀx of row blocks is partial",
    "an all-reduce replicates",
    "the all-reduced sum is xᵀx",
    "axpy after an all-reduce sees the sum",
    "a 2.4 MB tensor from bytes",
    "send-shard copies one rank's shard into another's",
    "send-shard of unequal shards is refused",
    "a shape mismatch poisons the result",
    "and what is computed from it",
    "a rank's failure poisons the result and names the op",
    "an unknown mesh dimension in a sharding",
    "an all-reduce over an unknown dimension",
    "a fetch from a rank out of range",
    "bytes that do not fill the shape",
    "a fetch as the wrong dtype",
    "operands of two engines",
    "the engine carries on after errors",
    "sync",
    "a buffer has its size",
    "read-into copies proc to proc",
    "write-from copies proc to proc",
    "a reference names the same buffer",
    "transfers between buffers of different sizes",
    "a read past the end",
    "a write past the end",
    "an allocation on a rank out of range",
    "a reference that is not one",
    "a freed buffer cannot be read",
    "nor read from by another proc",
    "other buffers live on",
];

/// breakpoints: without debugging on (no `--debug-listen`), each rank's
/// `breakpoint!` does nothing and the call returns at once, on child procs
/// and in process. tests/debugger.rs drives them with a debugger.
#[test]
fn breakpoints() {
    for mode in [&[][..], &["--in-process"][..]] {
        let mut args: Vec<&str> = mode.to_vec();
        args.extend([env!("GUEST_BREAKPOINTS"), "--", "2000"]);
        let run = monarch_host(&args, Duration::from_secs(120));
        assert_eq!(run.code, Some(0), "{run:?}");
        assert!(
            !run.lines_with("results: [70, 71, 72, 73]").is_empty(),
            "{run:?}"
        );
    }
}

/// stepper: on the normal engine, the debug engine's test program runs as
/// any other (every rank replies to `busy`). tests/debug_engine.rs drives
/// it under `--debug`.
#[test]
fn stepper() {
    let args = [env!("GUEST_STEPPER"), "--", "bench", "1000"];
    let run = monarch_host(&args, Duration::from_secs(120));
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        !run.lines_with("bench: 1000 iterations").is_empty(),
        "{run:?}"
    );
}

/// spin: a controller that never calls the host is stopped at the run's
/// deadline, not before and not long after, with an error that names the
/// deadline. (The deadline starts once the program is compiled, so the
/// window is measured from the controller's first line.)
#[test]
fn spin() {
    let deadline = Duration::from_secs(2);
    let run = run(
        Path::new(env!("GUEST_SPIN")),
        &[],
        Sandbox {
            deadline,
            ..sandbox()
        },
    );
    run.assert_logged("[controller] the controller starts spinning");
    match &run.result {
        Err(RunError::Timeout(after)) => assert_eq!(*after, deadline),
        Err(RunError::Trap(reason)) => assert!(reason.contains("deadline"), "{reason}"),
        other => panic!("expected a timeout or a deadline trap, got {other:?}"),
    }
    assert!(
        run.result
            .as_ref()
            .is_err_and(|e| e.to_string().contains("--timeout")),
        "the error should name the option that sets the deadline: {:?}",
        run.result
    );
    let spinning = run.elapsed - run.first_logged("the controller starts spinning");
    assert!(
        run.elapsed >= deadline && spinning < deadline + Duration::from_secs(3),
        "the run took {:?}, {spinning:?} of it spinning, with a deadline of {deadline:?}",
        run.elapsed
    );
}

/// An actor spinning in a handler does not hold its caller: the call ends
/// with a timeout error after the call timeout, and the controller finishes.
#[test]
fn spin_in_an_actor_times_out_the_call_and_the_run_goes_on() {
    let run = run(Path::new(env!("GUEST_SPIN")), &["actor"], sandbox());
    run.assert_ok();
    let spinning = run.first_logged("[spinners[0]] spinner 0 starts spinning");
    let timed_out = run.first_logged("[controller] the call to the spinner timed out after 500ms");
    assert!(
        timed_out - spinning < Duration::from_secs(3)
            && run.elapsed - timed_out < Duration::from_secs(3),
        "the actor spun from {spinning:?}, the call timed out at {timed_out:?} and the run ended at {:?}",
        run.elapsed
    );
}

/// hog: a controller that allocates without end fails the run with a trap
/// once its memory reaches the cap; the cap, not anything else, is what
/// stopped it, since a larger cap lets it hold more.
#[test]
fn hog() {
    let capped = |mib: usize| {
        run(
            Path::new(env!("GUEST_HOG")),
            &[],
            Sandbox {
                memory_bytes: mib << 20,
                ..sandbox()
            },
        )
    };
    for cap in [32, 64] {
        let run = capped(cap);
        match &run.result {
            Err(RunError::Trap(reason)) => assert!(reason.contains("memory"), "{reason}"),
            other => panic!("expected the controller to trap under a {cap} MiB cap, got {other:?}"),
        }
        let most = held_mib(&run).into_iter().max().unwrap_or(0);
        assert!(
            most >= cap / 2 && most < cap,
            "under a {cap} MiB cap the hog held at most {most} MiB; it logged:\n{}",
            run.lines.join("\n")
        );
    }
}

/// An actor that runs out of memory fails alone: its caller gets an error
/// of kind out-of-memory and the controller returns Ok.
#[test]
fn hog_in_an_actor_fails_the_actor_not_the_run() {
    let run = run(
        Path::new(env!("GUEST_HOG")),
        &["actor"],
        Sandbox {
            memory_bytes: 32 << 20,
            ..sandbox()
        },
    );
    run.assert_ok();
    run.assert_logged("[hogs[0]] hog 0 holds 16 MiB");
    // Growing its memory past the cap fails (as a GC runtime would want);
    // the Rust allocator then aborts, which is reported as out of memory.
    run.assert_logged(
        "[controller] the hog failed: actor hogs[0] failed in `eat`: out-of-memory: growing memory to",
    );
    run.assert_logged("the cap is 32 MiB per instance (--memory), and then the guest trapped");
}

/// EX-6: a failure that no supervisor handles ends the run, naming the
/// actor that failed.
#[test]
fn an_unhandled_failure_fails_the_run() {
    let run = run(
        Path::new(env!("GUEST_HOG")),
        &["unsupervised"],
        Sandbox {
            memory_bytes: 32 << 20,
            ..sandbox()
        },
    );
    let error = run.result.as_ref().expect_err("the run fails").to_string();
    assert!(
        error.contains("unhandled failure: actor hogs[0] failed"),
        "{error}"
    );
}

/// The reason an out-of-memory actor failed should say so, the way the
/// controller's trap does.
#[test]
fn an_actor_out_of_memory_says_why_it_failed() {
    let run = run(
        Path::new(env!("GUEST_HOG")),
        &["actor"],
        Sandbox {
            memory_bytes: 32 << 20,
            ..sandbox()
        },
    );
    run.assert_ok();
    run.assert_logged("growing memory");
}

/// hostile: an unknown mode is refused, naming the modes;
/// tests/hostile.rs runs every attack, from the controller and from actors.
#[test]
fn hostile() {
    let run = run(Path::new(env!("GUEST_HOSTILE")), &["bogus"], sandbox());
    match &run.result {
        Err(RunError::Failed(reason)) => assert!(
            reason.contains("unknown mode `bogus`") && reason.contains("payload-len"),
            "{reason}"
        ),
        other => panic!("expected the run to fail, got {other:?}"),
    }
}

/// wrong-world: a component of the `actor` world exports `actor-class` but no
/// `run`; the host refuses it before running anything, naming `run`.
#[test]
fn wrong_world() {
    let path = Path::new(env!("GUEST_WRONG_WORLD"));
    let run = run(path, &[], sandbox());
    match &run.result {
        Err(RunError::WrongWorld {
            path: named,
            reason,
        }) => {
            assert_eq!(Path::new(named), path);
            assert!(
                reason.contains("`run`"),
                "the reason should name `run`: {reason}"
            );
        }
        other => panic!("expected a wrong-world error, got {other:?}"),
    }
    let message = run.result.unwrap_err().to_string();
    assert!(message.contains("monarch:host/program"), "{message}");
    assert!(run.lines.is_empty(), "it ran: {:#?}", run.lines);
}

/// controller-only: a component of the `controller` world (`run`, no actor
/// classes) runs; spawning actors from it is refused by name.
#[test]
fn controller_only() {
    let path = Path::new(env!("GUEST_CONTROLLER_ONLY"));
    let ran = run(path, &["a", "b"], sandbox());
    assert!(ran.result.is_ok(), "{:?} {:#?}", ran.result, ran.lines);
    assert_eq!(
        ran.lines[0],
        "[controller] controller-only runs with [\"a\", \"b\"]"
    );
    assert!(
        ran.lines[1].contains("spawn refused: cannot spawn `nobody`")
            && ran.lines[1].contains("`controller` world"),
        "{:#?}",
        ran.lines
    );
    let failed = run(path, &["fail"], sandbox());
    match failed.result {
        Err(RunError::Failed(reason)) => assert_eq!(reason, "asked to fail"),
        other => panic!("expected the run to fail, got {other:?}"),
    }
}

/// Persistent actor meshes belong to a server (tests/persist.rs runs them
/// there): a plain run has none, and says so.
#[test]
fn persist() {
    let path = Path::new(env!("GUEST_PERSIST"));
    let spawned = run(path, &["spawn", "counter", "1"], sandbox());
    match &spawned.result {
        Err(RunError::Failed(reason)) => assert!(
            reason.contains("cannot spawn the persistent actor mesh `counter`")
                && reason.contains("monarch-host serve"),
            "{reason}"
        ),
        other => panic!("expected the spawn to fail, got {other:?}"),
    }
    let looked_up = run(path, &["lookup", "counter"], sandbox());
    assert!(looked_up.result.is_ok(), "{:?}", looked_up.result);
    looked_up.assert_logged("lookup failed");
    looked_up.assert_logged("monarch-host serve");
}

/// Bytes that are not WebAssembly are refused as such, empty files too.
#[test]
fn garbage_is_not_wasm() {
    for (name, bytes) in [
        (
            "component-garbage.wasm",
            &b"#!/bin/sh\necho this is not wasm\n"[..],
        ),
        ("component-empty.wasm", b""),
        ("component-magic-only.wasm", b"\0asm"),
    ] {
        let path = scratch_file(name, bytes);
        let run = run(&path, &[], sandbox());
        match &run.result {
            Err(RunError::Load(LoadError::NotWasm { path: named })) => assert_eq!(named, &path),
            other => panic!("{name}: expected a not-wasm error, got {other:?}"),
        }
        let message = run.result.unwrap_err().to_string();
        assert!(message.contains("not a WebAssembly file"), "{message}");
    }
}

/// A core module is refused with the way to build a component.
#[test]
fn core_module_is_not_a_component() {
    let path = scratch_file("component-core-module.wasm", CORE_MODULE);
    let run = run(&path, &[], sandbox());
    match &run.result {
        Err(RunError::Load(LoadError::CoreModule { path: named })) => assert_eq!(named, &path),
        other => panic!("expected a core-module error, got {other:?}"),
    }
    let message = run.result.unwrap_err().to_string();
    assert!(
        message.contains("not a component") && message.contains("wasm32-wasip2"),
        "{message}"
    );
}

/// A file that does not exist is a read error that names it.
#[test]
fn missing_file_is_a_read_error() {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-no-such-program.wasm");
    let run = run(&path, &[], sandbox());
    match &run.result {
        Err(RunError::Load(LoadError::Read { path: named, .. })) => assert_eq!(named, &path),
        other => panic!("expected a read error, got {other:?}"),
    }
}

/// semantics: structured errors and one failure per actor with procs in
/// this process (`tests/semantics.rs` runs every mode across processes).
#[test]
fn semantics() {
    let typed = run(
        Path::new(env!("GUEST_SEMANTICS")),
        &["typed-error"],
        sandbox(),
    );
    typed.assert_ok();
    typed.assert_logged("type=ValueError kind=endpoint message=bad value");
    let trapped = run(
        Path::new(env!("GUEST_SEMANTICS")),
        &["trap-once"],
        sandbox(),
    );
    trapped.assert_ok();
    trapped.assert_logged("errors=3 kinds=trap,trap,trap");
    trapped.assert_logged("failures=1");
    let stopped = run(Path::new(env!("GUEST_SEMANTICS")), &["stopped"], sandbox());
    stopped.assert_ok();
    stopped.assert_logged("stopped-call kind=stopped");
    stopped.assert_logged("stopped-procs kind=stopped");
}

/// tree: actors that own meshes, with every proc inside this process
/// (`tests/supervision.rs` runs the tree across processes): a leaf's trap
/// is handled by its owner, or climbs to the controller as a supervision
/// failure.
#[test]
fn tree() {
    let handled = run(Path::new(env!("GUEST_TREE")), &["handled"], sandbox());
    handled.assert_ok();
    handled.assert_logged("[controller] failures=0");
    handled.assert_logged("[controller] handled 0,1");
    let unhandled = run(Path::new(env!("GUEST_TREE")), &["unhandled"], sandbox());
    unhandled.assert_ok();
    unhandled.assert_logged("[controller] failure mesh=level1 rank=0 kind=supervision");
}

/// `monarch-host run` places procs in child processes: every example runs
/// to the end across them, and the procs start as processes of their own.
#[test]
fn cli_runs_the_examples_across_processes() {
    for (program, expect) in [
        (env!("GUEST_HELLO"), "hello from rank 3 of 4"),
        (env!("GUEST_PING_PONG"), "total hits: 6"),
        (
            env!("GUEST_COUNTER"),
            "a new mesh on the same procs sums to 300",
        ),
        (env!("GUEST_DATA_PARALLEL"), "the loss fell every step"),
        (env!("GUEST_DATAPLANE"), "all checks passed"),
    ] {
        let out = monarch_host_env(
            &[program, "--procs", "8"],
            Duration::from_secs(120),
            &[("RUST_LOG", "hyperactor_mesh=info")],
        );
        assert_eq!(out.code, Some(0), "{out:?}");
        assert!(
            out.stdout.iter().any(|(_, line)| line.contains(expect)),
            "{out:?}"
        );
        let pids: std::collections::HashSet<&str> = out
            .stderr
            .lines()
            .filter(|line| line.contains("proc started"))
            .filter_map(|line| line.split("pid=").nth(1))
            .collect();
        assert!(pids.len() >= 2, "procs in processes of their own: {out:?}");
    }
}

/// `--timeout 2` on a spinning controller: the command exits 1 about two
/// seconds after the controller starts, and says the deadline passed.
#[test]
fn cli_spin_past_its_timeout_exits_with_an_error() {
    let out = monarch_host(
        &[env!("GUEST_SPIN"), "--timeout", "2"],
        Duration::from_secs(40),
    );
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.starts_with("monarch-host: error: ") && out.stderr.contains("(--timeout)"),
        "{out:?}"
    );
    let spinning = out.elapsed - out.printed_at("[controller] the controller starts spinning");
    assert!(
        out.elapsed >= Duration::from_secs(2) && spinning < Duration::from_secs(5),
        "{spinning:?} spinning; {out:?}"
    );
}

/// `--memory 32` on a hog: the command exits 1 with an error that says
/// the memory ran out; no signal or abort ends it. (The guest's allocator
/// gets a failed `memory.grow`, prints that it failed, and aborts.)
#[test]
fn cli_hog_past_its_memory_cap_exits_with_an_error() {
    let out = monarch_host(
        &[env!("GUEST_HOG"), "--memory", "32"],
        Duration::from_secs(40),
    );
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.lines().any(|line| line.starts_with(
            "monarch-host: error: the controller trapped: out of memory: growing memory to"
        )),
        "{out:?}"
    );
    out.printed_at("[controller] the controller holds 16 MiB");
}

/// Files that are not programs: exit 1 and an error that names the file and
/// what is wrong with it, before anything runs.
#[test]
fn cli_refuses_what_is_not_a_program() {
    let garbage = scratch_file("cli-garbage.wasm", b"not wasm at all");
    let core = scratch_file("cli-core-module.wasm", CORE_MODULE);
    for (path, what) in [
        (garbage.to_str().unwrap(), "is not a WebAssembly file"),
        (core.to_str().unwrap(), "is a core WebAssembly module"),
        (env!("GUEST_WRONG_WORLD"), "is not a monarch-host program"),
    ] {
        let out = monarch_host(&[path], Duration::from_secs(40));
        assert_eq!(out.code, Some(1), "{out:?}");
        let expected = format!("monarch-host: error: {path} {what}");
        assert!(
            out.stderr.starts_with(&expected),
            "expected {expected:?}; {out:?}"
        );
        assert!(out.stdout.is_empty(), "{out:?}");
    }
}

/// A proc of data-parallel's tensor engine killed with SIGKILL mid-run:
/// the next wait on its rank fails, naming the proc and the signal, and the
/// command exits 1 within seconds instead of hanging (TE-2).
#[test]
fn cli_a_killed_tensor_proc_ends_data_parallel_with_an_error() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args(["run", env!("GUEST_DATA_PARALLEL"), "--timeout", "120", "--"])
        .args(["--steps", "100000000", "--rows", "64"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start monarch-host");
    let pid = child.id();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    // Training is under way once step 3 is out.
    for line in stdout.by_ref() {
        if line.expect("read stdout").contains("step 3 loss") {
            break;
        }
    }
    let children = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("list monarch-host's threads")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>();
    assert_eq!(children.len(), 4, "one child proc per rank: {children:?}");
    let victim = children[2];
    let killed = std::process::Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let killed_at = Instant::now();
    let drain = std::thread::spawn(move || stdout.count());
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for monarch-host") {
            break status;
        }
        if killed_at.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("monarch-host did not end within 30 s of a proc's SIGKILL");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let _ = drain.join();
    assert_eq!(status.code(), Some(1), "{stderr}");
    let error = stderr
        .lines()
        .find(|line| line.contains("the program failed"))
        .unwrap_or_else(|| panic!("no error line in {stderr}"));
    assert!(error.contains(": step "), "names the step: {error}");
    assert!(
        error.contains("killed by signal 9"),
        "names the signal: {error}"
    );
    assert!(
        error.contains("tensor0["),
        "names the tensor worker: {error}"
    );
}

/// polyglot: a Rust controller spawns actors written in Python (the actor
/// library `py`, `tests/programs/python/greeters.py`, built by the
/// command), gathers their replies, sums one in the host, and gets a
/// Python `ValueError` back as an endpoint error of that type. Needs
/// componentize-py (scripts/setup); `MONARCH_SKIP_ANYLANG=1` skips it.
#[test]
fn polyglot() {
    if std::env::var_os("MONARCH_SKIP_ANYLANG").is_some() {
        eprintln!("skipped: MONARCH_SKIP_ANYLANG is set");
        return;
    }
    let greeters = Path::new(env!("CARGO_MANIFEST_DIR")).join("programs/python/greeters.py");
    let library = format!("py={}", greeters.display());
    for mode in [&[][..], &["--in-process"][..]] {
        let mut args: Vec<&str> = mode.to_vec();
        args.extend([env!("GUEST_POLYGLOT"), "--actors", &library]);
        let run = monarch_host(&args, Duration::from_secs(600));
        assert_eq!(run.code, Some(0), "{run:?}");
        assert!(
            !run.lines_with("rank 1 says: hi from Python rank 1")
                .is_empty(),
            "{run:?}"
        );
        assert_eq!(run.after("summed in the host: "), "41", "{run:?}");
        assert!(
            !run.lines_with("Python raised ValueError: Python will not")
                .is_empty(),
            "{run:?}"
        );
        assert!(!run.lines_with("polyglot ok").is_empty(), "{run:?}");
    }
}

/// session-echo: a Rust guest of the `session` world, driven line by line
/// on one store (its variables persist between inputs), with blocks,
/// errors, output and Ctrl-C; `run` refuses it, naming the console.
#[test]
fn session_echo() {
    use monarch_host::session::{ConsoleFlag, Input, InputDone, SessionDriver};
    let path = Path::new(env!("GUEST_SESSION_ECHO"));
    let refused = run(path, &[], sandbox());
    match &refused.result {
        Err(RunError::WrongWorld { reason, .. }) => {
            assert!(reason.contains("monarch-host console"), "{reason}")
        }
        other => panic!("a session is not a program: {other:?}"),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let log: LogSink = {
        let lines = lines.clone();
        Arc::new(move |line: &str| lines.lock().unwrap().push(line.to_string()))
    };
    runtime.block_on(async move {
        let shape = monarch_host::engine::PoolShape::any_program(64, 64 << 20);
        let engine = monarch_host::engine::pooled_engine(&shape).unwrap();
        monarch_host::engine::start_epoch_ticker(&engine);
        let prepared =
            monarch_host::Prepared::new(&engine, path, std::fs::read(path).unwrap()).unwrap();
        assert_eq!(prepared.world(), "session");
        assert!(prepared.is_session());
        let (inputs, received) = tokio::sync::mpsc::channel(1);
        let (ready, is_ready) = tokio::sync::oneshot::channel();
        let console = Arc::new(ConsoleFlag::default());
        let driver = SessionDriver {
            args: vec!["a".into(), "b".into()],
            inputs: received,
            console: console.clone(),
            idle_ttl: Duration::from_secs(60),
            ready: Some(ready),
        };
        let session = tokio::spawn(async move {
            prepared
                .run_session(
                    driver,
                    sandbox(),
                    log,
                    monarch_host::Mesh::Fresh,
                    None,
                    std::future::pending(),
                )
                .await
        });
        assert_eq!(is_ready.await.unwrap(), Ok("> ".to_string()));
        let send = |line: &str| {
            let inputs = inputs.clone();
            let line = line.to_string();
            async move {
                let (done, result) = tokio::sync::oneshot::channel();
                inputs.send(Input { line, done }).await.unwrap();
                match result.await.unwrap() {
                    InputDone::Ran { result, prompt } => (result, prompt),
                    InputDone::Ended(why) => panic!("the session ended: {why}"),
                }
            }
        };
        assert_eq!(send("args").await, (Ok("a b".into()), "> ".into()));
        assert_eq!(send("set x 5").await.0, Ok(String::new()));
        assert_eq!(send("set y 7").await.0, Ok(String::new()));
        assert_eq!(send("sum").await.0, Ok("12".into()));
        assert_eq!(send("get nope").await.0, Err("no nope".into()));
        assert_eq!(send("fail").await.0, Err("failed on purpose".into()));
        assert_eq!(send("get x").await.0, Ok("5".into()), "it goes on");
        assert_eq!(send("block").await.1, "... ");
        assert_eq!(send("one").await.1, "... ");
        assert_eq!(send("two").await.1, "... ");
        assert_eq!(send("").await, (Ok("2".into()), "> ".into()));
        assert_eq!(send("print hi").await.0, Ok(String::new()));
        // Ctrl-C ends a long wait early; the session goes on.
        let started = Instant::now();
        let waiting = tokio::spawn(send("wait 60000"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        console.raise();
        assert_eq!(waiting.await.unwrap().0, Err("interrupted".into()));
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(send("get y").await.0, Ok("7".into()));
        // Closed when every sender is gone.
        drop(inputs);
        session.await.unwrap().unwrap();
    });
    assert!(
        lines.lock().unwrap().iter().any(|line| line == "hi"),
        "what the session prints is its output, unprefixed: {:?}",
        lines.lock().unwrap()
    );
}

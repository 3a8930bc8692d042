//! The debug engine (`monarch-host run --debug`), driven as a user drives
//! it: `monarch-host debug` on a terminal (a pty), against the stepper test
//! program (tests/programs/stepper, built unoptimized with debug info).
//! Breakpoints by line and by function stop every rank of the mesh, in
//! both procs; `next`, `step` and `finish` move by source line; `locals`
//! shows the Wasm locals the program set; `interrupt` stops a spinning
//! rank; a trap stops with its frames before it unwinds.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CLI: &str = env!("CARGO_BIN_EXE_monarch-host-cli");

#[path = "support/terminal.rs"]
mod terminal;
use terminal::Terminal;

/// Types `line` and returns all that came before its answer ends.
/// News (a rank that pauses) comes with prompts of its own at any time, so
/// the end is marked: an unknown command typed after `line`, which the
/// hub, or the paused rank attached to, refuses in order.
fn answer(terminal: &mut Terminal, line: &str) -> String {
    static MARKS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let mark = format!(
        "mark{}",
        MARKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    );
    terminal.type_line(line);
    terminal.type_line(&mark);
    let text = terminal.expect(
        &format!("*** unknown command `{mark}`; try `help`\n"),
        Duration::from_secs(60),
    );
    // The prompt the last answer ended with.
    let mut text = text.as_str();
    while let Some(rest) = text
        .strip_prefix("monarch_dbg> ")
        .or_else(|| text.strip_prefix("(wasm) "))
    {
        text = rest;
    }
    text.to_string()
}

/// A `monarch-host run` in the background, its stdout line by line.
struct Run {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Run {
    fn start(args: &[&str], cache: &std::path::Path) -> Run {
        let mut child = Command::new(CLI)
            .arg("run")
            .args(args)
            .env("MONARCH_CACHE_DIR", cache)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start monarch-host run");
        let (tx, lines) = mpsc::channel();
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { return };
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        Run {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The first line holding `needle`, waiting for it.
    fn wait_for(&mut self, needle: &str, within: Duration) -> String {
        if let Some(line) = self.seen.iter().find(|l| l.contains(needle)) {
            return line.clone();
        }
        let until = Instant::now() + within;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "the run printed no {needle:?} within {within:?}:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    fn exit_code(&mut self, within: Duration) -> Option<i32> {
        let until = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                Instant::now() < until,
                "the run did not end within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The cache directory of these tests, shared by them and kept between
/// runs (the debug engine's compiled program is made once, and no copy of
/// its 20 MB is left behind per run); each test names its run to the
/// debugger (`debug ID`), so that runs in parallel do not mix.
fn cache() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join("monarch-debug-engine-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The stepper's source.
const SOURCE: &str = include_str!("programs/stepper/src/lib.rs");

/// The line of the stepper's source that holds `text`.
fn line_of(text: &str) -> usize {
    let found: Vec<usize> = SOURCE
        .lines()
        .enumerate()
        .filter(|(_, line)| line.contains(text))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(found.len(), 1, "one line of the stepper holds {text:?}");
    found[0]
}

/// Starts the stepper under `--debug` with `args`; returns it and a
/// debugger attached to it, at its prompt.
fn debug_stepper(args: &[&str]) -> (Run, Terminal) {
    let cache = cache();
    let mut run_args = vec![env!("GUEST_STEPPER"), "--debug"];
    run_args.extend(args);
    let mut run = Run::start(&run_args, &cache);
    let line = run.wait_for(
        "breakpoints are on (debug engine)",
        Duration::from_secs(120),
    );
    let id = line
        .split("run ")
        .last()
        .and_then(|rest| rest.strip_suffix(')'))
        .expect("the run prints its id")
        .to_string();
    let mut terminal = Terminal::spawn(
        CLI,
        &["debug", &id],
        &[("MONARCH_CACHE_DIR", cache.as_os_str())],
    );
    terminal.expect("monarch_dbg> ", Duration::from_secs(30));
    (run, terminal)
}

/// Lists until `count` ranks of `stepper` are paused and each row holds
/// `needle`; returns the table.
fn list_until(terminal: &mut Terminal, count: usize, needle: &str) -> String {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let table = answer(terminal, "list");
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("stepper")).collect();
        if rows.len() == count && rows.iter().all(|row| row.contains(needle)) {
            return table;
        }
        assert!(
            Instant::now() < until,
            "never {count} paused ranks at {needle:?}; last list:\n{table}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn a_line_breakpoint_stops_every_rank_steps_move_by_line_and_interrupt_stops_a_spin() {
    let call = line_of("let result = compute(work.x, self.rank);");
    let total = line_of("let total = x * 60606;");
    let shifted = line_of("let shifted = total + i64::from(rank);");
    let result = line_of("    shifted * 10");
    let after = line_of("        Ok(result)");
    let at = |line: usize| format!("stepper/src/lib.rs:{line}");
    let (mut run, mut terminal) = debug_stepper(&["--break", &format!("lib.rs:{call}")]);

    // `list`: every rank of both procs, at the line, in the handler.
    let table = list_until(&mut terminal, 4, &at(call));
    for rank in 0..4 {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("stepper  {rank} ")))
            .unwrap_or_else(|| panic!("no row for rank {rank}:\n{table}"));
        assert!(
            row.contains("Handler<stepper::Work>>::handle") && row.ends_with("break"),
            "{row}"
        );
        assert!(
            row.contains(&format!("hosts={}, gpus={}", rank / 2, rank % 2)),
            "{row}"
        );
    }

    // Rank 0: `step` into `compute`, `next` down to the line after
    // `total`, and its locals.
    let attached = answer(&mut terminal, "attach stepper 0");
    assert!(
        attached.contains(&format!("{} in ", at(call))) && attached.contains("(break)"),
        "{attached}"
    );
    let step = answer(&mut terminal, "step");
    assert!(
        step.contains("in stepper::compute (step)"),
        "`step` enters the call: {step}"
    );
    let mut next = step;
    for _ in 0..3 {
        if next.contains(&at(total)) {
            break;
        }
        next = answer(&mut terminal, "next");
    }
    assert!(next.contains("let total = x * 60606;"), "{next}");
    let next = answer(&mut terminal, "next");
    assert!(
        next.contains(&format!("{} in stepper::compute (step)", at(shifted)))
            && next.contains("let shifted"),
        "`next` moves to the next source line, not into an inlined `From`: {next}"
    );
    let locals = answer(&mut terminal, "locals");
    assert!(locals.contains("i64 = 7\n"), "x: {locals}");
    assert!(
        locals.contains("i64 = 424242\n"),
        "total = 7 * 60606: {locals}"
    );
    let bt = answer(&mut terminal, "bt");
    let frames: Vec<&str> = bt.lines().collect();
    assert!(
        frames[0].contains("#0") && frames[0].contains("stepper::compute"),
        "{bt}"
    );
    assert!(
        frames[1].contains("Handler<stepper::Work>>::handle") && frames[1].contains(&at(call)),
        "{bt}"
    );

    // `finish` returns to the line that called `compute`; `next` leaves it.
    let finish = answer(&mut terminal, "finish");
    assert!(
        finish.contains(&format!("{} in ", at(call))) && finish.contains("(finish)"),
        "{finish}"
    );
    let next = answer(&mut terminal, "next");
    assert!(
        next.contains(&at(after)) && next.contains("(step)"),
        "{next}"
    );

    // A breakpoint set at one rank's stop reaches the others, in the other
    // proc too: they stop there once continued.
    let set = answer(&mut terminal, &format!("break lib.rs:{result}"));
    assert!(
        set.contains("every actor of the run stops there") && set.contains(&at(result)),
        "{set}"
    );
    terminal.type_line("c");
    let detached = terminal.expect("monarch_dbg> ", Duration::from_secs(30));
    assert!(detached.contains("[stepper 0] continued"), "{detached}");
    let continued = answer(&mut terminal, "continue");
    for rank in 1..4 {
        assert!(
            continued.contains(&format!("[stepper {rank}] continued")),
            "{continued}"
        );
    }
    list_until(&mut terminal, 3, &at(result));
    let cast = answer(&mut terminal, "cast stepper ranks(*) locals");
    for rank in 1..4 {
        let shifted = 424242 + rank;
        assert!(
            cast.contains(&format!("[stepper {rank}]   local4: i64 = {shifted}")),
            "rank {rank}'s `shifted`: {cast}"
        );
    }
    answer(&mut terminal, "continue");
    let results = run.wait_for("results:", Duration::from_secs(60));
    assert!(
        results.contains("results: [4242420, 4242430, 4242440, 4242450]"),
        "{results}"
    );

    // `interrupt` stops the rank that spins, inside its loop.
    run.wait_for("spinning", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let stopped = answer(&mut terminal, "interrupt stepper ranks(0:2)");
    assert!(
        stopped.contains("[stepper 0] stopped at") && stopped.contains("in stepper::spin_forever"),
        "{stopped}"
    );
    assert!(
        stopped.contains("[stepper 1] runs none of its own code"),
        "an idle rank is not left to stop at its next message: {stopped}"
    );
    let table = list_until(&mut terminal, 1, "interrupt");
    assert!(table.contains("stepper::spin_forever"), "{table}");
    answer(&mut terminal, "attach stepper 0");
    let bt = answer(&mut terminal, "bt");
    // It may stop in a callee of the loop (`black_box`); the program's own
    // frame, the one selected, is the loop's.
    let own = bt.lines().find(|l| l.starts_with('>'));
    assert!(
        own.is_some_and(|l| l.contains("stepper::spin_forever at")),
        "{bt}"
    );
    assert!(bt.contains("Handler<stepper::Spin>>::handle"), "{bt}");
    let detached = answer(&mut terminal, "detach");
    assert!(detached.starts_with("detached\n"), "{detached}");
    let nobody = answer(&mut terminal, "interrupt nobody ranks(0)");
    assert!(nobody.contains("no rank of `nobody`"), "{nobody}");
    terminal.type_line("quit");
}

#[test]
fn a_function_breakpoint_stops_every_rank_and_a_trap_stops_before_it_unwinds() {
    let pick = line_of("values[at]");
    let (mut run, mut terminal) = debug_stepper(&["--break", "stepper::pick", "--", "trap"]);
    list_until(&mut terminal, 4, &format!("stepper/src/lib.rs:{pick}"));
    answer(&mut terminal, "continue");

    // Rank 1 indexes past the end: it stops at the trap, its frames whole.
    let table = list_until(
        &mut terminal,
        1,
        "trap: wasm `unreachable` instruction executed",
    );
    assert!(
        table.contains("stepper  1 ") && table.contains("stepper::pick"),
        "the program's own frame is listed, not `abort`: {table}"
    );
    let attached = answer(&mut terminal, "attach stepper 1");
    assert!(attached.contains("values[at]"), "{attached}");
    let bt = answer(&mut terminal, "bt");
    assert!(
        bt.contains(" abort at "),
        "the trap's own frame is #0: {bt}"
    );
    let own = bt
        .lines()
        .find(|l| l.contains("stepper::pick at"))
        .unwrap_or_else(|| panic!("{bt}"));
    assert!(
        own.starts_with('>'),
        "`locals` shows the program's frame: {bt}"
    );
    let locals = answer(&mut terminal, "locals");
    assert!(
        locals.contains("i32 = 3\n") && locals.contains("i32 = 7\n"),
        "the length and the index: {locals}"
    );
    let refused = answer(&mut terminal, "next");
    assert!(refused.contains("cannot run on"), "{refused}");
    terminal.type_line("c");
    terminal.expect("[stepper 1] continued", Duration::from_secs(30));
    let failed = run.wait_for("failed:", Duration::from_secs(60));
    assert!(
        failed.contains("stepper[1] failed in `pick`") && failed.contains("unreachable"),
        "{failed}"
    );
    assert_eq!(run.exit_code(Duration::from_secs(30)), Some(0));
}

#[test]
fn without_debug_a_trap_fails_the_actor_at_once() {
    let mut run = Run::start(&[env!("GUEST_STEPPER"), "--", "trap"], &cache());
    let failed = run.wait_for("failed:", Duration::from_secs(60));
    assert!(failed.contains("unreachable"), "{failed}");
    assert_eq!(run.exit_code(Duration::from_secs(30)), Some(0));
    assert!(
        !run.seen.iter().any(|l| l.contains("breakpoints are on")),
        "{:?}",
        run.seen
    );
}

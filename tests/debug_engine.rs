//! The debug engine (`monarch-host run --debug`), driven as a user drives
//! it: `monarch-host debug` on a terminal (a pty), against the stepper test
//! program (tests/programs/stepper, built unoptimized with debug info).
//! Breakpoints by line and by function stop every rank of the mesh, in
//! both procs; `next`, `step` and `finish` move by source line; `locals`
//! shows the Wasm locals the program set; `interrupt` stops a spinning
//! rank; a trap stops with its frames before it unwinds.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CLI: &str = env!("CARGO_BIN_EXE_monarch-host-cli");

/// A command on a pty whose output is read as it comes.
struct Terminal {
    child: Child,
    master: std::fs::File,
    output: mpsc::Receiver<Vec<u8>>,
    /// Output read and not yet consumed by `expect`.
    pending: String,
}

impl Terminal {
    fn spawn(args: &[&str], cache: &std::path::Path) -> Terminal {
        let (mut master, mut slave) = (0, 0);
        // SAFETY: openpty fills two new descriptors.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // No echo: what is read is what the command printed.
        // SAFETY: `slave` is a terminal we own; termios is plain data.
        unsafe {
            let mut termios: libc::termios = std::mem::zeroed();
            libc::tcgetattr(slave, &mut termios);
            termios.c_lflag &= !libc::ECHO;
            libc::tcsetattr(slave, libc::TCSANOW, &termios);
        }
        // SAFETY: both descriptors are ours alone from here.
        let slave = unsafe { OwnedFd::from_raw_fd(slave) };
        let master = unsafe { std::fs::File::from_raw_fd(master) };
        let child = Command::new(CLI)
            .args(args)
            .env("MONARCH_CACHE_DIR", cache)
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave))
            .spawn()
            .expect("start monarch-host debug");
        let mut reader = master.try_clone().unwrap();
        let (tx, output) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Terminal {
            child,
            master,
            output,
            pending: String::new(),
        }
    }

    /// Types `line` and Enter.
    fn type_line(&mut self, line: &str) {
        self.master
            .write_all(format!("{line}\n").as_bytes())
            .expect("type into the terminal");
    }

    /// Reads until the output holds `needle`; returns what came before it
    /// and consumes both.
    fn expect(&mut self, needle: &str, within: Duration) -> String {
        let until = Instant::now() + within;
        loop {
            if let Some(at) = self.pending.find(needle) {
                let before = self.pending[..at].to_string();
                self.pending.drain(..at + needle.len());
                return before;
            }
            let left = until.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left) {
                Ok(bytes) => self
                    .pending
                    .push_str(&String::from_utf8_lossy(&bytes).replace('\r', "")),
                Err(_) => panic!(
                    "no {needle:?} within {within:?}; the terminal shows:\n{}",
                    self.pending
                ),
            }
        }
    }

    /// Types `line` and returns its answer, up to the next `prompt`.
    fn ask(&mut self, line: &str, prompt: &str) -> String {
        self.type_line(line);
        self.expect(prompt, Duration::from_secs(30))
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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

/// A cache directory of this test process's own, shared by its tests (the
/// debug engine's compiled program is made once); each test names its run
/// to the debugger (`debug --run ID`), so that runs in parallel do not mix.
fn cache() -> std::path::PathBuf {
    static CACHE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    CACHE
        .get_or_init(|| {
            let dir =
                std::env::temp_dir().join(format!("monarch-debug-engine-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            dir
        })
        .clone()
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
    let mut terminal = Terminal::spawn(&["debug", "--run", &id], &cache);
    terminal.expect("monarch_dbg> ", Duration::from_secs(30));
    (run, terminal)
}

/// Lists until `count` ranks of `stepper` are paused and each row holds
/// `needle`; returns the table.
fn list_until(terminal: &mut Terminal, count: usize, needle: &str) -> String {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let table = terminal.ask("list", "monarch_dbg> ");
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
fn a_line_breakpoint_stops_every_rank_and_next_steps_by_line() {
    let total = line_of("let total = x * 60606;");
    let shifted = line_of("let shifted = total + i64::from(rank);");
    let result = line_of("    shifted * 10");
    let at = |line: usize| format!("stepper/src/lib.rs:{line}");
    let (mut run, mut terminal) = debug_stepper(&["--break", &format!("lib.rs:{total}")]);

    // `list`: every rank of both procs, at the line, in `compute`.
    let table = list_until(&mut terminal, 4, &at(total));
    for rank in 0..4 {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("stepper  {rank} ")))
            .unwrap_or_else(|| panic!("no row for rank {rank}:\n{table}"));
        assert!(
            row.contains("stepper::compute") && row.ends_with("break"),
            "{row}"
        );
        assert!(
            row.contains(&format!("hosts={}, gpus={}", rank / 2, rank % 2)),
            "{row}"
        );
    }

    // Rank 0: where it is, `next` to the following line, its locals.
    let attached = terminal.ask("attach stepper 0", "(wasm) ");
    assert!(
        attached.contains(&format!("{} in stepper::compute (break)", at(total)))
            && attached.contains("let total = x * 60606;"),
        "{attached}"
    );
    let next = terminal.ask("next", "(wasm) ");
    assert!(
        next.contains(&format!("{} in stepper::compute (step)", at(shifted)))
            && next.contains("let shifted"),
        "`next` moves to the next source line, not into an inlined `From`: {next}"
    );
    let locals = terminal.ask("locals", "(wasm) ");
    assert!(locals.contains("i64 = 7\n"), "x: {locals}");
    assert!(
        locals.contains("i64 = 424242\n"),
        "total = 7 * 60606: {locals}"
    );
    let bt = terminal.ask("bt", "(wasm) ");
    let frames: Vec<&str> = bt.lines().collect();
    assert!(
        frames[0].contains("#0") && frames[0].contains("stepper::compute"),
        "{bt}"
    );
    assert!(
        frames[1].contains("Handler<stepper::Work>>::handle") && frames[1].contains("lib.rs:"),
        "{bt}"
    );

    // `finish` returns to the handler's line that called `compute`.
    let finish = terminal.ask("finish", "(wasm) ");
    assert!(
        finish.contains("(finish)") && finish.contains("let result = compute(work.x, self.rank);"),
        "{finish}"
    );

    // A breakpoint set at one rank's stop reaches the others, in the other
    // proc too: they stop there once continued.
    let set = terminal.ask(&format!("break lib.rs:{result}"), "(wasm) ");
    assert!(
        set.contains("every actor of the run stops there") && set.contains(&at(result)),
        "{set}"
    );
    terminal.type_line("c");
    let detached = terminal.expect("monarch_dbg> ", Duration::from_secs(30));
    assert!(detached.contains("[stepper 0] continued"), "{detached}");
    let continued = terminal.ask("continue", "monarch_dbg> ");
    for rank in 1..4 {
        assert!(
            continued.contains(&format!("[stepper {rank}] continued")),
            "{continued}"
        );
    }
    list_until(&mut terminal, 3, &at(result));
    let cast = terminal.ask("cast stepper ranks(*) locals", "monarch_dbg> ");
    for rank in 1..4 {
        let shifted = 424242 + rank;
        assert!(
            cast.contains(&format!("[stepper {rank}]   local4: i64 = {shifted}")),
            "rank {rank}'s `shifted`: {cast}"
        );
    }
    terminal.ask("continue", "monarch_dbg> ");
    let results = run.wait_for("results:", Duration::from_secs(60));
    assert!(
        results.contains("results: [4242420, 4242430, 4242440, 4242450]"),
        "{results}"
    );

    // `interrupt` stops the rank that spins, inside its loop.
    run.wait_for("spinning", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let stopped = terminal.ask("interrupt stepper ranks(0)", "monarch_dbg> ");
    assert!(
        stopped.contains("[stepper 0] stopped at") && stopped.contains("in stepper::spin_forever"),
        "{stopped}"
    );
    let table = list_until(&mut terminal, 1, "interrupt");
    assert!(table.contains("stepper::spin_forever"), "{table}");
    terminal.ask("attach stepper 0", "(wasm) ");
    let bt = terminal.ask("bt", "(wasm) ");
    assert!(
        bt.lines()
            .next()
            .is_some_and(|l| l.contains("stepper::spin_forever")),
        "{bt}"
    );
    assert!(bt.contains("Handler<stepper::Spin>>::handle"), "{bt}");
    let none = terminal.ask("detach", "monarch_dbg> ");
    assert_eq!(none.trim(), "detached");
    let nobody = terminal.ask("interrupt nobody ranks(0)", "monarch_dbg> ");
    assert!(nobody.contains("no rank of `nobody`"), "{nobody}");
    terminal.type_line("quit");
}

#[test]
fn a_function_breakpoint_stops_every_rank_and_a_trap_stops_before_it_unwinds() {
    let pick = line_of("values[at]");
    let (mut run, mut terminal) = debug_stepper(&["--break", "stepper::pick", "--", "trap"]);
    list_until(&mut terminal, 4, &format!("stepper/src/lib.rs:{pick}"));
    terminal.ask("continue", "monarch_dbg> ");

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
    let attached = terminal.ask("attach stepper 1", "(wasm) ");
    assert!(attached.contains("values[at]"), "{attached}");
    let bt = terminal.ask("bt", "(wasm) ");
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
    let locals = terminal.ask("locals", "(wasm) ");
    assert!(
        locals.contains("i32 = 3\n") && locals.contains("i32 = 7\n"),
        "the length and the index: {locals}"
    );
    let refused = terminal.ask("next", "(wasm) ");
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

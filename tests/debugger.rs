//! `monarch-host debug`, driven as a user drives it: through a terminal
//! (a pty), against a `monarch-host run --debug-listen` whose actors pause
//! at breakpoints. After the shape of Monarch's `test_debugger.py`.

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

fn cache() -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("monarch-debugger-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The source lines of the four `breakpoint!`s of the test program's
/// `step`, in rank order.
fn breakpoint_lines() -> Vec<usize> {
    let source = include_str!("programs/breakpoints/src/lib.rs");
    source
        .lines()
        .enumerate()
        .filter(|(_, line)| line.contains("=> monarch_guest::breakpoint!"))
        .map(|(i, _)| i + 1)
        .collect()
}

/// Lists until `count` ranks are paused; returns the table.
fn list_paused(terminal: &mut Terminal, count: usize) -> String {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let table = terminal.ask("list", "monarch_dbg> ");
        let rows = table
            .lines()
            .filter(|l| l.starts_with("trainers-v1"))
            .count();
        if rows == count {
            return table;
        }
        assert!(
            Instant::now() < until,
            "never {count} paused ranks; last list:\n{table}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn four_ranks_pause_and_are_listed_attached_cast_to_and_continued() {
    let cache = cache();
    let call_timeout = Duration::from_millis(1500);
    let started = Instant::now();
    let mut run = Run::start(
        &[
            env!("GUEST_BREAKPOINTS"),
            "--debug-listen",
            "127.0.0.1:0",
            "--",
            &call_timeout.as_millis().to_string(),
        ],
        &cache,
    );
    run.wait_for("breakpoints are on", Duration::from_secs(60));
    let mut terminal = Terminal::spawn(&["debug"], &cache);
    terminal.expect("monarch_dbg> ", Duration::from_secs(30));

    // `list`: the four, each at its own line, with their coordinates.
    let table = list_paused(&mut terminal, 4);
    let lines = breakpoint_lines();
    assert_eq!(lines.len(), 4, "the program has a breakpoint per rank");
    for (rank, line) in lines.iter().enumerate() {
        let coords = format!("hosts={}, gpus={}", rank / 2, rank % 2);
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("trainers-v1  {rank} ")))
            .unwrap_or_else(|| panic!("no row for rank {rank}:\n{table}"));
        assert!(row.contains(&coords), "rank {rank} at {coords}:\n{table}");
        assert!(
            row.contains(&format!("breakpoints/src/lib.rs:{line}")),
            "rank {rank} pauses at line {line}:\n{table}"
        );
        assert!(row.contains("Handler<breakpoints::Step>>::handle"), "{row}");
    }

    // `attach`: the breakpoint's values; `p`; detach and re-attach replay
    // the output since the last input.
    let attached = terminal.ask("attach trainers-v1 2", "(monarch) ");
    assert!(attached.contains("attached to trainers-v1 2"), "{attached}");
    assert!(
        attached.contains("x = 7") && attached.contains("doubled = 14"),
        "{attached}"
    );
    let answer = terminal.ask("p doubled", "(monarch) ");
    assert_eq!(answer.trim(), "14");
    assert_eq!(terminal.ask("detach", "monarch_dbg> ").trim(), "detached");
    let replay = terminal.ask("attach trainers-v1 2", "(monarch) ");
    assert_eq!(
        replay.trim(),
        format!("attached to trainers-v1 2\n{}", answer.trim()),
        "re-attaching replays what came since the last input"
    );
    terminal.ask("detach", "monarch_dbg> ");

    // `cast ranks(0,3) c` moves only those two.
    let cast = terminal.ask("cast trainers-v1 ranks(0,3) c", "monarch_dbg> ");
    assert!(
        cast.contains("[trainers-v1 0] continued") && cast.contains("[trainers-v1 3] continued"),
        "{cast}"
    );
    let table = list_paused(&mut terminal, 2);
    assert!(
        table.contains("trainers-v1  1 ") && table.contains("trainers-v1  2 "),
        "{table}"
    );

    // The paused ranks outlive three call timeouts.
    let held = call_timeout * 3 + Duration::from_millis(500);
    std::thread::sleep(held.saturating_sub(started.elapsed()));
    assert!(
        run.child.try_wait().unwrap().is_none(),
        "the run waits for its paused ranks"
    );

    // `continue` completes the original call with its values.
    let continued = terminal.ask("continue", "monarch_dbg> ");
    assert!(
        continued.contains("[trainers-v1 1] continued"),
        "{continued}"
    );
    let results = run.wait_for("results:", Duration::from_secs(30));
    assert!(results.contains("results: [70, 71, 72, 73]"), "{results}");
    assert!(
        started.elapsed() > call_timeout * 3,
        "the call outlived three timeouts"
    );
    terminal.type_line("quit");
    assert_eq!(run.exit_code(Duration::from_secs(30)), Some(0));
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn a_pause_nobody_attends_is_abandoned_with_an_error() {
    let cache = cache();
    let mut run = Run::start(
        &[
            env!("GUEST_BREAKPOINTS"),
            "--debug-listen",
            "127.0.0.1:0",
            "--debug-pause-limit",
            "1.5",
            "--",
            "one",
            "60000",
        ],
        &cache,
    );
    let started = Instant::now();
    let failed = run.wait_for("failed:", Duration::from_secs(60));
    assert!(failed.contains("breakpoint abandoned"), "{failed}");
    assert!(
        failed.contains("no debugger connected for 1.5 s"),
        "{failed}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "not the call timeout"
    );
    assert_eq!(run.exit_code(Duration::from_secs(30)), Some(0));
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn breakpoints_do_nothing_without_debugging_on() {
    let cache = cache();
    let mut run = Run::start(&[env!("GUEST_BREAKPOINTS"), "--", "2000"], &cache);
    let results = run.wait_for("results:", Duration::from_secs(60));
    assert!(results.contains("results: [70, 71, 72, 73]"), "{results}");
    assert_eq!(run.exit_code(Duration::from_secs(30)), Some(0));
    // And a debugger says what it found.
    let out = Command::new(CLI)
        .arg("debug")
        .env("MONARCH_CACHE_DIR", &cache)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no live `monarch-host run`"), "{stderr}");
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn a_debugger_with_a_wrong_token_is_refused() {
    // The hub answers a wrong token with an error, and the client says so.
    let cache = cache();
    let mut run = Run::start(
        &[
            env!("GUEST_BREAKPOINTS"),
            "--debug-listen",
            "127.0.0.1:0",
            "--debug-pause-limit",
            "5",
            "--",
            "one",
        ],
        &cache,
    );
    let line = run.wait_for("breakpoints are on", Duration::from_secs(60));
    let addr = line
        .split("hub at ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .expect("the run prints its hub's address")
        .to_string();
    let token = cache.join("wrong-token");
    std::fs::write(&token, "not-the-token").unwrap();
    let out = Command::new(CLI)
        .args(["debug", "--addr", &addr, "--token-file"])
        .arg(&token)
        .env("MONARCH_CACHE_DIR", &cache)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("wrong token"), "{stderr}");
    drop(run);
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn python_breakpoint_gives_pdb() {
    if std::env::var_os("MONARCH_SKIP_ANYLANG").is_some() {
        eprintln!("skipped: MONARCH_SKIP_ANYLANG is set");
        return;
    }
    let cache = cache();
    let program = concat!(env!("CARGO_MANIFEST_DIR"), "/programs/python/debugging.py");
    let mut run = Run::start(&[program, "--debug-listen", "127.0.0.1:0"], &cache);
    let line = run.wait_for("breakpoints are on", Duration::from_secs(300));
    let id = line
        .split("run ")
        .last()
        .and_then(|rest| rest.strip_suffix(')'))
        .expect("the run prints its id")
        .to_string();
    let mut terminal = Terminal::spawn(&["debug", &id], &cache);
    terminal.expect("monarch_dbg> ", Duration::from_secs(30));
    let until = Instant::now() + Duration::from_secs(300);
    loop {
        let table = terminal.ask("list", "monarch_dbg> ");
        if table
            .lines()
            .filter(|l| l.starts_with("py-trainers"))
            .count()
            == 2
        {
            assert!(table.contains("Trainer.step"), "{table}");
            assert!(table.contains("debugging.py:19"), "{table}");
            break;
        }
        assert!(Instant::now() < until, "never 2 paused ranks:\n{table}");
        std::thread::sleep(Duration::from_millis(500));
    }
    // pdb on rank 0: `p x`, `n`, `p y`, then `c`.
    let attached = terminal.ask("attach py-trainers 0", "(Pdb) ");
    assert!(attached.contains("debugging.py(19)step()"), "{attached}");
    assert_eq!(terminal.ask("p x", "(Pdb) ").trim(), "7");
    let next = terminal.ask("n", "(Pdb) ");
    assert!(next.contains("-> z = y + 1"), "{next}");
    assert_eq!(terminal.ask("p y", "(Pdb) ").trim(), "14");
    let next = terminal.ask("n", "(Pdb) ");
    assert!(next.contains("-> return z * 10"), "{next}");
    assert_eq!(terminal.ask("p z", "(Pdb) ").trim(), "15");
    terminal.type_line("c");
    let detached = terminal.expect("monarch_dbg> ", Duration::from_secs(30));
    assert!(detached.contains("[py-trainers 0] continued"), "{detached}");
    // pdb on rank 1 through a cast, then `continue`.
    let cast = terminal.ask("cast py-trainers ranks(1) p x * 3", "monarch_dbg> ");
    assert!(cast.contains("[py-trainers 1] 21"), "{cast}");
    let continued = terminal.ask("continue", "monarch_dbg> ");
    assert!(
        continued.contains("[py-trainers 1] continued"),
        "{continued}"
    );
    let results = run.wait_for("results:", Duration::from_secs(60));
    assert!(results.contains("results: [150, 150]"), "{results}");
    terminal.type_line("quit");
    assert_eq!(run.exit_code(Duration::from_secs(30)), Some(0));
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn a_server_job_with_debug_on_is_debugged_with_server_url_job() {
    #[path = "support/serve.rs"]
    mod serve_support;
    let dir = serve_support::Scratch::new("debugger");
    let server = serve_support::ServeProcess::start(&dir.0, &[]);
    let token = dir.0.join("token");
    let token = token.to_str().unwrap();
    let cli = |args: &[&str], stdin: &str| {
        let mut child = Command::new(CLI)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let server_args = ["--server", server.base.as_str(), "--token-file", token];
    let mut submit = vec!["submit"];
    submit.extend(server_args);
    submit.extend(["--debug", env!("GUEST_BREAKPOINTS"), "--", "one", "60000"]);
    let submitted = cli(&submit, "");
    assert!(submitted.status.success(), "{submitted:?}");
    let job = String::from_utf8_lossy(&submitted.stdout)
        .trim()
        .to_string();
    let mut debug = vec!["debug"];
    debug.extend(server_args);
    debug.push(&job);
    // The job pauses rank 0; the debugger lists it.
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let listed = cli(&debug, "list\nquit\n");
        let out = String::from_utf8_lossy(&listed.stdout).to_string();
        if out.contains("trainers-v1  0 ") {
            assert!(out.contains("hosts=0, gpus=0"), "{out}");
            break;
        }
        assert!(Instant::now() < until, "rank 0 never paused: {listed:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut terminal = Terminal::spawn(&debug, &dir.0);
    terminal.expect("monarch_dbg> ", Duration::from_secs(30));
    let continued = terminal.ask("continue", "monarch_dbg> ");
    assert!(
        continued.contains("[trainers-v1 0] continued"),
        "{continued}"
    );
    let mut logs = vec!["logs", job.as_str()];
    logs.extend(server_args);
    let log = cli(&logs, "");
    let text = String::from_utf8_lossy(&log.stdout);
    assert!(log.status.success(), "{log:?}");
    assert!(text.contains("results: [70, 71, 72, 73]"), "{text}");
    // A job without debug on says so.
    let mut plain = vec!["submit"];
    plain.extend(server_args);
    plain.extend([env!("GUEST_SPIN"), "--", "actor"]);
    let plain = cli(&plain, "");
    let plain_job = String::from_utf8_lossy(&plain.stdout).trim().to_string();
    let mut debug_plain = vec!["debug"];
    debug_plain.extend(server_args);
    debug_plain.push(&plain_job);
    let refused = cli(&debug_plain, "quit\n");
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("without breakpoints") || stderr.contains("is not running"),
        "{stderr}"
    );
}

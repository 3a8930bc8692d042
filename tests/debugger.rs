//! `monarch-host debug`, driven as a user drives it: through a terminal
//! (a pty), against a `monarch-host run --debug-listen` whose actors pause
//! at breakpoints. After the shape of Monarch's `test_debugger.py`.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CLI: &str = env!("CARGO_BIN_EXE_monarch-host-cli");

#[path = "support/terminal.rs"]
mod terminal;
use terminal::Terminal;

/// How long an answer at the debugger's prompt may take.
const ASK: Duration = Duration::from_secs(30);

/// The debugger on a terminal, with `cache` as its cache.
fn debugger(args: &[&str], cache: &std::path::Path) -> Terminal {
    Terminal::spawn(CLI, args, &[("MONARCH_CACHE_DIR", cache.as_os_str())])
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
        let table = terminal.ask("list", "monarch_dbg> ", ASK);
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
    let mut terminal = debugger(&["debug"], &cache);
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
    let attached = terminal.ask("attach trainers-v1 2", "(monarch) ", ASK);
    assert!(attached.contains("attached to trainers-v1 2"), "{attached}");
    assert!(
        attached.contains("x = 7") && attached.contains("doubled = 14"),
        "{attached}"
    );
    let answer = terminal.ask("p doubled", "(monarch) ", ASK);
    assert_eq!(answer.trim(), "14");
    assert_eq!(
        terminal.ask("detach", "monarch_dbg> ", ASK).trim(),
        "detached"
    );
    let replay = terminal.ask("attach trainers-v1 2", "(monarch) ", ASK);
    assert_eq!(
        replay.trim(),
        format!("attached to trainers-v1 2\n{}", answer.trim()),
        "re-attaching replays what came since the last input"
    );
    terminal.ask("detach", "monarch_dbg> ", ASK);

    // `cast ranks(0,3) c` moves only those two.
    let cast = terminal.ask("cast trainers-v1 ranks(0,3) c", "monarch_dbg> ", ASK);
    assert!(
        cast.contains("[trainers-v1 0] continued") && cast.contains("[trainers-v1 3] continued"),
        "{cast}"
    );
    let table = list_paused(&mut terminal, 2);
    assert!(
        table.contains("trainers-v1  1 ") && table.contains("trainers-v1  2 "),
        "{table}"
    );

    // The paused ranks outlive three call timeouts, counted from the
    // moment all four were paused (compiling and spawning do not count).
    let paused = Instant::now();
    let held = call_timeout * 3 + Duration::from_millis(500);
    std::thread::sleep(held.saturating_sub(paused.elapsed()));
    assert!(
        run.child.try_wait().unwrap().is_none(),
        "the run waits for its paused ranks"
    );

    // `continue` completes the original call with its values.
    let continued = terminal.ask("continue", "monarch_dbg> ", ASK);
    assert!(
        continued.contains("[trainers-v1 1] continued"),
        "{continued}"
    );
    let results = run.wait_for("results:", Duration::from_secs(30));
    assert!(results.contains("results: [70, 71, 72, 73]"), "{results}");
    // The call itself, as the program timed it, outlived three timeouts.
    let call_secs: f64 = results
        .split(" after ")
        .nth(1)
        .and_then(|rest| rest.split(" s").next())
        .and_then(|secs| secs.trim().parse().ok())
        .unwrap_or_else(|| panic!("no call time in {results}"));
    assert!(
        call_secs > (call_timeout * 3).as_secs_f64(),
        "the call returned after {call_secs} s, within three timeouts of {call_timeout:?}"
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
    let mut terminal = debugger(&["debug", &id], &cache);
    terminal.expect("monarch_dbg> ", Duration::from_secs(30));
    let until = Instant::now() + Duration::from_secs(300);
    loop {
        let table = terminal.ask("list", "monarch_dbg> ", ASK);
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
    let attached = terminal.ask("attach py-trainers 0", "(Pdb) ", ASK);
    assert!(attached.contains("debugging.py(19)step()"), "{attached}");
    assert_eq!(terminal.ask("p x", "(Pdb) ", ASK).trim(), "7");
    let next = terminal.ask("n", "(Pdb) ", ASK);
    assert!(next.contains("-> z = y + 1"), "{next}");
    assert_eq!(terminal.ask("p y", "(Pdb) ", ASK).trim(), "14");
    let next = terminal.ask("n", "(Pdb) ", ASK);
    assert!(next.contains("-> return z * 10"), "{next}");
    assert_eq!(terminal.ask("p z", "(Pdb) ", ASK).trim(), "15");
    terminal.type_line("c");
    let detached = terminal.expect("monarch_dbg> ", Duration::from_secs(30));
    assert!(detached.contains("[py-trainers 0] continued"), "{detached}");
    // pdb on rank 1 through a cast, then `continue`.
    let cast = terminal.ask("cast py-trainers ranks(1) p x * 3", "monarch_dbg> ", ASK);
    assert!(cast.contains("[py-trainers 1] 21"), "{cast}");
    let continued = terminal.ask("continue", "monarch_dbg> ", ASK);
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
    use std::sync::{Arc, Mutex};
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
    // The debugger is given only the address of a forwarder to the
    // server, which keeps what it was sent: what it asked for shows.
    let forwarder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let forwarder_port = forwarder.local_addr().unwrap().port();
    let via = format!("http://127.0.0.1:{forwarder_port}");
    let sent = Arc::new(Mutex::new(Vec::<u8>::new()));
    {
        let upstream = server.base.trim_start_matches("http://").to_string();
        let sent = sent.clone();
        std::thread::spawn(move || {
            for client in forwarder.incoming() {
                let (Ok(mut client), Ok(mut upstream)) =
                    (client, std::net::TcpStream::connect(&upstream))
                else {
                    continue;
                };
                let (mut from_client, mut to_upstream) =
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                let sent = sent.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = from_client.read(&mut buf) {
                        sent.lock().unwrap().extend_from_slice(&buf[..n]);
                        if to_upstream.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to_upstream.shutdown(std::net::Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut upstream, &mut client);
                    let _ = client.shutdown(std::net::Shutdown::Both);
                });
            }
        });
    }
    let server_args = ["--server", server.base.as_str(), "--token-file", token];
    let mut submit = vec!["submit"];
    submit.extend(server_args);
    submit.extend(["--debug", env!("GUEST_BREAKPOINTS"), "--", "one", "60000"]);
    let submitted = cli(&submit, "");
    assert!(submitted.status.success(), "{submitted:?}");
    let job = String::from_utf8_lossy(&submitted.stdout)
        .trim()
        .to_string();
    let via_args = ["--server", via.as_str(), "--token-file", token];
    let mut debug = vec!["debug"];
    debug.extend(via_args);
    debug.push(&job);
    // The job pauses rank 0; the debugger lists it.
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let listed = cli(&debug, "list\nquit\n");
        let out = String::from_utf8_lossy(&listed.stdout).to_string();
        if out.contains("trainers-v1  0 ") {
            assert!(out.contains("hosts=0, gpus=0"), "{out}");
            assert!(out.contains("bye; paused ranks stay paused"), "{out}");
            break;
        }
        assert!(Instant::now() < until, "rank 0 never paused: {listed:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
    // The bridge's routes, as any HTTP client uses them.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        use monarch_host::serve::client::SseParser;
        let id: u64 = job.parse().unwrap();
        let api = server.client();
        let opened = api.debug_bridge(id).await.unwrap();
        let bridge = opened["bridge"].as_str().unwrap().to_string();
        assert_eq!(
            opened["stream"],
            format!("/v1/jobs/{id}/debug/bridges/{bridge}/stream"),
            "{opened}"
        );
        let mut stream = api.debug_bridge_stream(id, &bridge).await.unwrap();
        let twice = api.debug_bridge_stream(id, &bridge).await.unwrap_err();
        assert!(twice.contains("409"), "{twice}");
        api.debug_bridge_input(id, &bridge, "list").await.unwrap();
        let mut parser = SseParser::default();
        let mut pending = std::collections::VecDeque::new();
        let mut next = async || loop {
            if let Some(event) = pending.pop_front() {
                return event;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), stream.chunk())
                .await
                .expect("an event within 30 s")
                .unwrap()
                .expect("more of the stream");
            pending.extend(parser.feed(&chunk));
        };
        let mut shown = String::new();
        while !shown.contains("trainers-v1  0 ") {
            let (event, data) = next().await;
            assert_eq!(event, "hub", "{data}");
            let said: serde_json::Value = serde_json::from_str(&data).unwrap();
            shown.push_str(said["out"].as_str().unwrap_or_default());
        }
        let path = format!("/v1/jobs/{id}/debug/bridges/{bridge}/input");
        let other = reqwest::Client::new()
            .post(format!("{}{path}", server.base))
            .bearer_auth(serve_support::OTHER_TOKEN)
            .json(&serde_json::json!({ "line": "continue" }));
        assert_eq!(serve_support::send(other).await.0, 403);
        let two_lines = server
            .request(reqwest::Method::POST, &path)
            .json(&serde_json::json!({ "line": "list\ncontinue" }));
        assert_eq!(serve_support::send(two_lines).await.0, 400);
        let closed = api.debug_bridge_close(id, &bridge).await.unwrap();
        assert_eq!(closed["job_ended"], false, "{closed}");
        let (event, data) = next().await;
        assert_eq!(event, "end", "{data}");
        assert!(data.contains("DELETE"), "{data}");
        let gone = api
            .debug_bridge_input(id, &bridge, "list")
            .await
            .unwrap_err();
        assert!(gone.contains("410"), "{gone}");
        let unknown = api
            .debug_bridge_input(id, "0123", "list")
            .await
            .unwrap_err();
        assert!(unknown.contains("404"), "{unknown}");
        let no_job = api.debug_bridge(id + 1000).await.unwrap_err();
        assert!(no_job.contains("404"), "{no_job}");
    });
    let mut terminal = debugger(&debug, &dir.0);
    terminal.expect("monarch_dbg> ", Duration::from_secs(30));
    // The debugger's every TCP connection is to the server's address (the
    // forwarder), and the job's hub has one client on its unix socket:
    // the server's bridge. (The debugger's unix sockets are its runtime's
    // own socket pair.)
    let sockets: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", terminal.pid()))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().to_string();
            let inode = link.strip_prefix("socket:[")?.strip_suffix(']')?;
            Some(inode.to_string())
        })
        .collect();
    let table = |names: &[&str]| -> Vec<Vec<String>> {
        names
            .iter()
            .flat_map(|name| {
                let text = std::fs::read_to_string(format!("/proc/net/{name}")).unwrap_or_default();
                text.lines()
                    .skip(1)
                    .map(|row| row.split_whitespace().map(str::to_string).collect())
                    .collect::<Vec<Vec<String>>>()
            })
            .collect()
    };
    let tcp = table(&["tcp", "tcp6"]);
    let connected: Vec<&Vec<String>> = tcp.iter().filter(|row| sockets.contains(&row[9])).collect();
    assert!(!connected.is_empty(), "the debugger has no connection");
    for row in connected {
        let port = row[2].rsplit(':').next().unwrap();
        assert_eq!(
            u16::from_str_radix(port, 16).unwrap(),
            forwarder_port,
            "the debugger is connected elsewhere than the server: {row:?}"
        );
    }
    let hub_socket = server.data.join("debug").join(format!("{job}.sock"));
    let hub_socket = hub_socket.to_str().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        // Accepted connections show the listener's path; state 03: connected.
        let clients = table(&["unix"])
            .into_iter()
            .filter(|row| row.get(5).map(String::as_str) == Some("03"))
            .filter(|row| row.get(7).map(String::as_str) == Some(hub_socket))
            .count();
        if clients == 1 {
            break;
        }
        assert!(
            Instant::now() < until,
            "the job's hub has {clients} clients on its unix socket, not 1 (the bridge)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let continued = terminal.ask("continue", "monarch_dbg> ", ASK);
    assert!(
        continued.contains("[trainers-v1 0] continued"),
        "{continued}"
    );
    // It asked the server for bridges, never for the hub's address.
    let sent = String::from_utf8_lossy(&sent.lock().unwrap()).to_string();
    for asked in [
        format!("POST /v1/jobs/{job}/debug/bridges HTTP/1.1"),
        "/stream HTTP/1.1".to_string(),
        "/input HTTP/1.1".to_string(),
    ] {
        assert!(sent.contains(&asked), "no {asked:?} in {sent}");
    }
    assert!(
        !sent.contains(&format!("GET /v1/jobs/{job}/debug HTTP")),
        "{sent}"
    );
    let mut logs = vec!["logs", job.as_str()];
    logs.extend(server_args);
    let log = cli(&logs, "");
    let text = String::from_utf8_lossy(&log.stdout);
    assert!(log.status.success(), "{log:?}");
    assert!(text.contains("results: [70, 71, 72, 73]"), "{text}");
    // The job has ended: so has the debugger's session.
    terminal.expect("the run has ended", Duration::from_secs(30));
    assert_eq!(
        terminal.exit_code(Duration::from_secs(10)),
        Some(0),
        "the debugger exits"
    );
    // A job without debug on says so.
    let mut plain = vec!["submit"];
    plain.extend(server_args);
    plain.extend([env!("GUEST_SPIN"), "--", "actor"]);
    let plain = cli(&plain, "");
    let plain_job = String::from_utf8_lossy(&plain.stdout).trim().to_string();
    let mut debug_plain = vec!["debug"];
    debug_plain.extend(via_args);
    debug_plain.push(&plain_job);
    let refused = cli(&debug_plain, "quit\n");
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("without breakpoints") || stderr.contains("is not running"),
        "{stderr}"
    );
}

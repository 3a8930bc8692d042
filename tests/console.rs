//! `monarch-host console` against `monarch-host serve`, driven as a user
//! drives it: through a terminal (a pty). A session's meshes and actors
//! live on the server; consoles come and go (killed, detached) and find
//! them as they left them.

use std::time::{Duration, Instant};

#[path = "support/serve.rs"]
mod serve_support;
#[path = "support/terminal.rs"]
mod terminal;

use serve_support::{OTHER_TOKEN, Scratch, ServeProcess, TOKEN, send};
use terminal::Terminal;

const CLI: &str = env!("CARGO_BIN_EXE_monarch-host-cli");

/// The first Python session on a server builds the REPL and compiles it.
const OPEN: Duration = Duration::from_secs(240);
const STEP: Duration = Duration::from_secs(60);

/// A console on `server` as the owner of `token_file`.
fn console(server: &ServeProcess, dir: &Scratch, token_file: &str, extra: &[&str]) -> Terminal {
    let token = dir.0.join(token_file);
    let mut args = vec!["console", "--server", server.base.as_str(), "--token-file"];
    args.push(token.to_str().unwrap());
    args.extend(extra);
    let cache = dir.0.join("console-cache");
    Terminal::spawn(CLI, &args, &[("MONARCH_CACHE_DIR", cache.as_os_str())])
}

/// Types `line`, waits for `shows` in what it prints, then the prompt.
fn run_line(terminal: &mut Terminal, line: &str, shows: &str) {
    terminal.type_line(line);
    terminal.expect(shows, STEP);
    terminal.expect(">>> ", STEP);
}

/// Types a Python block (lines, then an empty line to end it).
fn type_block(terminal: &mut Terminal, lines: &[&str]) {
    for line in lines {
        terminal.type_line(line);
        terminal.expect("... ", STEP);
    }
    terminal.type_line("");
    terminal.expect(">>> ", STEP);
}

const COUNTER: &[&str] = &[
    "class Counter(Actor):",
    "    def __init__(self, start):",
    "        self.n = start",
    "    @endpoint",
    "    def incr(self, by):",
    "        self.n += by",
    "        print('now', self.n)",
    "        return self.n",
];

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces; split after ')'.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if parent == Some(pid) {
            found.push(child);
        }
    }
    found
}

fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < until, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_python_session_outlives_a_killed_console_and_shrugs_off_errors_and_ctrl_c() {
    let dir = Scratch::new("console-python");
    let server = ServeProcess::start(&dir.0, &[]);
    let mut first = console(&server, &dir, "token", &["--session", "work"]);
    first.expect("session work", OPEN);
    first.expect(">>> ", OPEN);
    type_block(&mut first, COUNTER);
    // Each check waits for what the input prints, which the line as
    // typed (drawn by the line editor) does not hold.
    run_line(
        &mut first,
        "procs = this_host().spawn_procs(per_host={'gpus': 2}); print('procs', len(procs.info()))",
        "procs 2\n",
    );
    run_line(
        &mut first,
        "counters = procs.spawn('counters', Counter, 10); print('spawned', len(counters))",
        "spawned 2\n",
    );
    // A call to the mesh: each actor prints (prefixed with mesh and
    // rank), and the expression's value is shown as the REPL shows it.
    first.type_line("list(counters.incr.call(5).get().values())");
    first.expect_all(&["[counters 0] now 15", "[15, 15]"], STEP);
    first.expect(">>> ", STEP);
    // A traceback leaves the session and its meshes alive.
    first.type_line("1/0");
    first.expect("ZeroDivisionError", STEP);
    first.expect(">>> ", STEP);
    first.type_line("print('total', sum(counters.incr.call(1).get().values()))");
    first.expect("total 32", STEP);
    first.expect(">>> ", STEP);
    // Ctrl-C stops a long input, not the session.
    first.type_line("import time; time.sleep(120)");
    std::thread::sleep(Duration::from_secs(2));
    first.type_raw("\x03");
    first.expect("KeyboardInterrupt", Duration::from_secs(20));
    first.expect(">>> ", STEP);
    first.type_line("print('after ctrl-c', counters.incr.call(0).get().item(gpus=1))");
    first.expect("after ctrl-c 16", STEP);
    first.expect(">>> ", STEP);
    // The console dies; the session does not.
    // (Matched on what it prints, not on the line as typed.)
    first.type_line("print('last', 'words')");
    first.expect("last words", STEP);
    first.expect(">>> ", STEP);
    first.kill();
    let mut second = console(&server, &dir, "token", &["--session", "work"]);
    second.expect("<output since your last input follows>", STEP);
    second.expect("last words", STEP);
    second.expect(">>> ", STEP);
    second.type_line("print('state', list(counters.incr.call(1).get().values()))");
    second.expect("state [17, 17]", STEP);
    second.expect(">>> ", STEP);
    // The session's meshes, by the console's own command.
    second.type_line(":meshes");
    second.expect("counters: 2 ranks of Counter (2 running)", STEP);
    second.expect(">>> ", STEP);
    // Ctrl-D detaches; the session runs on.
    second.type_raw("\x04");
    second.expect("detached", STEP);
    assert_eq!(second.exit_code(STEP), Some(0));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (status, body) = runtime.block_on(send(
        server.request(reqwest::Method::GET, "/v1/sessions/work"),
    ));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "active", "{body}");
    assert_eq!(body["meshes"], serde_json::json!(["counters"]), "{body}");
    // `:close` stops it and what it spawned.
    let mut third = console(&server, &dir, "token", &["--session", "work"]);
    third.expect(">>> ", STEP);
    third.type_line(":close");
    third.expect("closed", STEP);
    assert_eq!(third.exit_code(STEP), Some(0));
    let pid = server.pid().unwrap();
    wait_until("the session's procs stop", STEP, || {
        children(pid).is_empty()
    });
}

#[test]
fn an_idle_session_expires_and_leaves_no_process_behind() {
    let dir = Scratch::new("console-ttl");
    let server = ServeProcess::start(&dir.0, &[]);
    let pid = server.pid().unwrap();
    let mut terminal = console(
        &server,
        &dir,
        "token",
        &["--session", "brief", "--idle-ttl", "2"],
    );
    terminal.expect(">>> ", OPEN);
    type_block(&mut terminal, COUNTER);
    run_line(
        &mut terminal,
        "counters = this_host().spawn_procs(per_host={'gpus': 2}).spawn('c', Counter, 0); print('spawned', len(counters))",
        "spawned 2\n",
    );
    assert_eq!(children(pid).len(), 2, "two procs run for the session");
    terminal.type_raw("\x04");
    terminal.expect("detached", STEP);
    // Two seconds without input: closed, with a log line, and its procs
    // are gone.
    wait_until(
        "the idle session's procs stop",
        Duration::from_secs(30),
        || children(pid).is_empty(),
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (status, body) = runtime.block_on(send(
        server.request(reqwest::Method::GET, "/v1/sessions/brief"),
    ));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "expired", "{body}");
    assert!(
        body["reason"].as_str().unwrap_or("").contains("idle"),
        "{body}"
    );
    let listed = std::process::Command::new(CLI)
        .args(["sessions", "--server", &server.base, "--token-file"])
        .arg(dir.0.join("token"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "{listed:?}");
    assert!(text.contains("brief") && text.contains("expired"), "{text}");
}

#[test]
fn two_sessions_on_one_proc_mesh_see_no_cross_talk_and_another_token_cannot_attach() {
    let dir = Scratch::new("console-shared");
    let server = ServeProcess::start(&dir.0, &["--mesh", "shared=2"]);
    let mut one = console(
        &server,
        &dir,
        "token",
        &["--session", "one", "--mesh", "shared"],
    );
    one.expect(">>> ", OPEN);
    let mut two = console(
        &server,
        &dir,
        "token",
        &["--session", "two", "--mesh", "shared"],
    );
    two.expect(">>> ", OPEN);
    for (terminal, start) in [(&mut one, 100), (&mut two, 200)] {
        type_block(terminal, COUNTER);
        run_line(
            terminal,
            &format!(
                "c = this_host().spawn_procs(per_host={{'gpus': 2}}).spawn('counters', Counter, {start}); print('spawned', len(c))"
            ),
            "spawned 2\n",
        );
    }
    one.type_line("print('one has', list(c.incr.call(1).get().values()))");
    one.expect("one has [101, 101]", STEP);
    one.expect(">>> ", STEP);
    two.type_line("print('two has', list(c.incr.call(2).get().values()))");
    two.expect("two has [202, 202]", STEP);
    two.expect(">>> ", STEP);
    // What one's actors print reaches one's console only.
    two.expect_not("now 101", Duration::from_secs(1));
    one.expect_not("now 202", Duration::from_secs(1));
    // Another token is refused, by the API and by the console.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let other = |method, path: &str| {
        reqwest::Client::new()
            .request(method, format!("{}{path}", server.base))
            .bearer_auth(OTHER_TOKEN)
    };
    let (status, body) = runtime.block_on(send(other(reqwest::Method::GET, "/v1/sessions/one")));
    assert_eq!(status, 403, "{body}");
    let (status, body) = runtime.block_on(send(
        other(reqwest::Method::POST, "/v1/sessions/one/input")
            .json(&serde_json::json!({"line": "c"})),
    ));
    assert_eq!(status, 403, "{body}");
    let mut intruder = console(&server, &dir, "other-token", &["--session", "one"]);
    intruder.expect("belongs to another token", STEP);
    assert_eq!(intruder.exit_code(STEP), Some(1));
    // Its owner still reaches it.
    let (status, _) = runtime.block_on(send(
        server.request(reqwest::Method::GET, "/v1/sessions/one"),
    ));
    assert_eq!(status, 200);
    let _ = TOKEN;
}

/// The session world from Rust (`tests/programs/session-echo`), over the
/// API: state between inputs, blocks, errors, Ctrl-C, and a restart that
/// marks sessions lost.
#[test]
fn a_rust_session_keeps_state_between_inputs_and_a_restart_marks_it_lost() {
    let dir = Scratch::new("console-rust");
    let mut server = ServeProcess::start(&dir.0, &[]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = server.client();
    let bytes = std::fs::read(env!("GUEST_SESSION_ECHO")).unwrap();
    let component = runtime.block_on(client.upload(bytes)).unwrap().id;
    let opened = runtime
        .block_on(
            client.open_session(&monarch_host::serve::api::SessionRequest {
                name: Some("echo".into()),
                component: Some(component),
                args: vec!["a".into(), "b".into()],
                ..Default::default()
            }),
        )
        .unwrap();
    assert_eq!(opened.prompt, "> ");
    let input = |line: &str| runtime.block_on(client.input("echo", line)).unwrap();
    assert_eq!(input("args").output.as_deref(), Some("a b"));
    input("set x 5");
    input("set y 7");
    assert_eq!(input("get x").output.as_deref(), Some("5"));
    assert_eq!(input("sum").output.as_deref(), Some("12"));
    let failed = input("fail");
    assert_eq!(failed.error.as_deref(), Some("failed on purpose"));
    assert_eq!(input("get y").output.as_deref(), Some("7"), "it goes on");
    // A block: the prompt says more is expected until an empty line.
    assert_eq!(input("block").prompt, "... ");
    assert_eq!(input("one").prompt, "... ");
    let ended = input("");
    assert_eq!(
        (ended.output.as_deref(), ended.prompt.as_str()),
        (Some("1"), "> ")
    );
    // Ctrl-C ends a wait early.
    let waiting = {
        let client = client.clone();
        runtime.spawn(async move { client.input("echo", "wait 60000").await })
    };
    std::thread::sleep(Duration::from_millis(500));
    // A second input while one runs is refused, not queued behind it.
    let busy = runtime.block_on(client.input("echo", "get x")).unwrap_err();
    assert!(busy.contains("409"), "{busy}");
    let started = Instant::now();
    runtime.block_on(client.interrupt("echo")).unwrap();
    let interrupted = runtime.block_on(waiting).unwrap().unwrap();
    assert_eq!(interrupted.error.as_deref(), Some("interrupted"));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(input("get x").output.as_deref(), Some("5"));
    // A restart: the session is lost, and says so.
    server.kill();
    let server = ServeProcess::start(&dir.0, &[]);
    let client = server.client();
    let listed = runtime.block_on(client.sessions()).unwrap();
    let echo = listed.iter().find(|s| s.name == "echo").expect("listed");
    assert_eq!(echo.state, "lost");
    assert_eq!(echo.reason.as_deref(), Some("server restarted"));
    let error = runtime.block_on(client.input("echo", "get x")).unwrap_err();
    assert!(error.contains("ended") && error.contains("410"), "{error}");
}

//! Traces of casts across hosts, as a user sees them: three agents on
//! loopback addresses of their own, `monarch-host run --hosts` runs the
//! `hello` example over them with `--otlp` pointed at a small OTLP/HTTP
//! receiver in this test (an axum route) and `--trace-file`; the call's
//! spans must form one complete, well-nested tree (TR-2): the controller's
//! cast, a hop on each of the three procs (one under another: fan-out 2),
//! each proc's handler and reduction, and the root's reduction. The trace
//! file holds the same spans, and `monarch-host trace FILE` prints them.
//! A job of `serve --trace` is traced into its own file, which
//! `monarch-host trace ID` reads from the server.

#[path = "support/serve.rs"]
mod serve_support;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyperactor_mesh::trace::SpanRecord;
use monarch_host::traces::{check_tree, group_traces, parse_otlp_json, read_trace_file};

const CLI: &str = env!("CARGO_BIN_EXE_monarch-host-cli");
const DEADLINE: Duration = Duration::from_secs(120);

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An agent on `ip`, port 0; its address once it listens.
fn start_agent(dir: &Path, ip: &str) -> (Agent, String) {
    let file = dir.join(format!("agent-{ip}.addr"));
    let child = Command::new(CLI)
        .args(["agent", "--listen", &format!("{ip}:0"), "--address-file"])
        .arg(&file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start an agent");
    let agent = Agent(child);
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&file)
            && text.ends_with('\n')
        {
            let addr = text.trim().trim_start_matches("tcp:").to_string();
            return (agent, addr);
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the agent on {ip} did not write {}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An OTLP/HTTP JSON receiver on loopback: every request body it took.
fn receiver(rt: &tokio::runtime::Runtime) -> (String, Arc<Mutex<Vec<serde_json::Value>>>) {
    use axum::routing::post;
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let store = bodies.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: axum::body::Bytes| {
            let store = store.clone();
            async move {
                match serde_json::from_slice::<serde_json::Value>(&body) {
                    Ok(value) => {
                        store.lock().unwrap().push(value);
                        (axum::http::StatusCode::OK, "{}")
                    }
                    Err(_) => (axum::http::StatusCode::BAD_REQUEST, "{}"),
                }
            }
        }),
    );
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind the receiver");
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), bodies)
}

/// What `monarch-host trace ARGS` printed, having succeeded.
fn printed_trace(args: &[&std::ffi::OsStr]) -> String {
    let printed = Command::new(CLI).arg("trace").args(args).output().unwrap();
    let text = String::from_utf8_lossy(&printed.stdout).into_owned();
    assert!(
        printed.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    text
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("monarch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The trace whose root is the controller's `greet` call.
fn greet_trace(spans: Vec<SpanRecord>) -> Vec<SpanRecord> {
    let traces = group_traces(spans);
    let mut found: Vec<Vec<SpanRecord>> = traces
        .into_iter()
        .filter(|t| t.iter().any(|s| s.parent == 0 && s.name == "cast greet"))
        .collect();
    assert_eq!(found.len(), 1, "one traced `greet` call");
    found.remove(0)
}

#[test]
fn a_cast_over_three_agents_is_one_complete_trace() {
    let dir = scratch("tracing");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (url, bodies) = receiver(&rt);
    let mut agents = Vec::new();
    let mut hosts = Vec::new();
    for ip in ["127.0.0.2", "127.0.0.3", "127.0.0.4"] {
        let (agent, addr) = start_agent(&dir, ip);
        agents.push(agent);
        hosts.push(addr);
    }
    let trace_file = dir.join("trace.jsonl");
    let started = Instant::now();
    let out = Command::new(CLI)
        .args(["run", env!("GUEST_HELLO"), "--hosts", &hosts.join(",")])
        .args(["--fanout", "2", "--otlp", &url, "--trace-file"])
        .arg(&trace_file)
        .args(["--", "3"])
        .output()
        .expect("run hello");
    assert!(started.elapsed() < DEADLINE);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("3 greetings"), "{stdout}");
    assert!(!stderr.contains("spans lost"), "{stderr}");

    // What the collector received: one complete tree for the call.
    let received: Vec<SpanRecord> = bodies
        .lock()
        .unwrap()
        .iter()
        .flat_map(|body| parse_otlp_json(body).expect("an OTLP request"))
        .collect();
    let trace = greet_trace(received);
    check_tree(&trace).expect("one well-nested tree");
    let root = trace.iter().find(|s| s.parent == 0).unwrap();
    assert_eq!(root.attr("mesh"), Some("greeters"));
    assert_eq!(root.attr("ranks"), Some("3"));
    let hops: Vec<&SpanRecord> = trace.iter().filter(|s| s.name == "hop").collect();
    let procs: HashSet<&str> = hops.iter().filter_map(|s| s.attr("proc")).collect();
    assert_eq!(hops.len(), 3, "a hop per proc: {trace:#?}");
    assert_eq!(procs.len(), 3, "three procs: {procs:?}");
    // Fan-out 2 over 3 procs: two hops under the root, one under a hop.
    let under_root = hops.iter().filter(|s| s.parent == root.span).count();
    let under_hop = hops
        .iter()
        .filter(|s| hops.iter().any(|h| h.span == s.parent))
        .count();
    assert_eq!((under_root, under_hop), (2, 1), "{trace:#?}");
    let handlers: Vec<&SpanRecord> = trace.iter().filter(|s| s.name == "handle greet").collect();
    let ranks: HashSet<&str> = handlers.iter().filter_map(|s| s.attr("rank")).collect();
    assert_eq!(ranks, HashSet::from(["0", "1", "2"]));
    for handler in &handlers {
        assert!(
            hops.iter().any(|h| h.span == handler.parent),
            "a handler under its proc's hop"
        );
    }
    // A reduction on every proc and one at the root.
    let reduces: Vec<&SpanRecord> = trace.iter().filter(|s| s.name == "reduce").collect();
    assert_eq!(reduces.len(), 4, "{trace:#?}");
    assert!(reduces.iter().any(|s| s.parent == root.span));
    assert!(trace.iter().all(|s| !s.error));

    // The trace file holds the same spans.
    let from_file = greet_trace(read_trace_file(&trace_file).expect("the trace file"));
    let ids = |spans: &[SpanRecord]| spans.iter().map(|s| s.span).collect::<HashSet<u64>>();
    assert_eq!(ids(&from_file), ids(&trace));

    // `monarch-host trace FILE --trace ID --check` prints the tree.
    let id = format!("{:032x}", root.trace);
    let text = printed_trace(&[
        trace_file.as_os_str(),
        "--trace".as_ref(),
        id[..12].as_ref(),
        "--check".as_ref(),
    ]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with(&format!("trace {id}")), "{text}");
    assert!(lines[1].starts_with("cast greet"), "{text}");
    assert_eq!(
        lines.iter().filter(|l| l.contains("hop ")).count(),
        3,
        "{text}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.contains("handle greet")).count(),
        3
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("─ hop") && (l.starts_with('│') || l.starts_with(' '))),
        "a hop nested under another: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn trace_reports_bad_input_clearly() {
    let dir = scratch("tracing-bad");
    let unreachable = Command::new(CLI)
        .args(["trace", "42", "--server", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!unreachable.status.success());
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert!(
        stderr.contains("cannot reach http://127.0.0.1:1"),
        "{stderr}"
    );
    let neither = Command::new(CLI)
        .args(["trace", "no-such-file.jsonl"])
        .output()
        .unwrap();
    assert!(!neither.status.success());
    assert!(String::from_utf8_lossy(&neither.stderr).contains("no such trace file"));
    let garbage = dir.join("garbage.jsonl");
    std::fs::write(&garbage, "{\"resourceSpans\": []}\nnot json\n").unwrap();
    let out = Command::new(CLI)
        .arg("trace")
        .arg(&garbage)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("garbage.jsonl:2: not JSON"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bad_url = Command::new(CLI)
        .args(["run", env!("GUEST_HELLO"), "--otlp", "collector:4318"])
        .output()
        .unwrap();
    assert!(!bad_url.status.success());
    assert!(String::from_utf8_lossy(&bad_url.stderr).contains("--otlp"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_job_of_serve_trace_is_printed_by_its_id() {
    let scratch = serve_support::Scratch::new("tracing-serve");
    let server = serve_support::ServeProcess::start(&scratch.0, &["--trace"]);
    let token = scratch.0.join("token");
    let submit = Command::new(CLI)
        .args(["submit", env!("GUEST_HELLO"), "--server", &server.base])
        .arg("--token-file")
        .arg(&token)
        .args(["--procs", "3", "--follow", "--", "3"])
        .output()
        .expect("submit");
    let stdout = String::from_utf8_lossy(&submit.stdout);
    assert!(
        submit.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&submit.stderr)
    );
    let text = printed_trace(&[
        "1".as_ref(),
        "--check".as_ref(),
        "--server".as_ref(),
        server.base.as_ref(),
        "--token-file".as_ref(),
        token.as_os_str(),
    ]);
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("cast greet")),
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.contains("─ hop")).count(),
        3,
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.contains("handle greet")).count(),
        3,
        "{text}"
    );
    // A job that does not exist is a 404 named as such.
    let missing = Command::new(CLI)
        .args(["trace", "99", "--server", &server.base])
        .arg("--token-file")
        .arg(&token)
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("404"));
}

//! Post-mortem dumps as a user meets them: the `counter` example makes one
//! of its actors panic (`crash`), run through the `monarch-host` command
//! with a scratch cache directory. The trap leaves a JSON record and a core
//! dump in `<cache>/dumps/<RUN>`, the fault the controller prints names the
//! record, the record's first frame that is not the standard library's
//! panic machinery is the `crash` handler at the `panic!`'s line, and
//! `monarch-host dumps list` and `dumps show` print them; `--no-dumps`
//! writes nothing. Under `monarch-host serve`, a job's records are at
//! `GET /v1/jobs/{id}/dumps`, and each file at `.../dumps/{file}`.

#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use monarch_host::serve::api::{JobRequest, JobStatus};
use reqwest::Method;
use serde_json::Value;
use serve_support::{Scratch, ServeProcess, send};

/// How long one run of the counter may take (it compiles the program into
/// an empty cache first).
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// The line of `examples/counter/src/lib.rs` that panics.
fn panic_line() -> u32 {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/counter/src/lib.rs");
    let text = std::fs::read_to_string(&source).expect("the counter's source");
    let index = text
        .lines()
        .position(|line| line.contains("panic!(\"counter {} was asked to crash\""))
        .expect("the counter's panic! line");
    index as u32 + 1
}

/// Runs `monarch-host ARGS...` (not `run`) with its cache in `cache`.
fn monarch_host(args: &[&str], cache: &Path) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args(args)
        .env("MONARCH_CACHE_DIR", cache)
        .stdin(Stdio::null())
        .output()
        .expect("start monarch-host");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs the counter with its cache in `cache` and `extra` arguments.
fn run_counter(cache: &Path, extra: &[&str]) -> cli::Command {
    let mut args = extra.to_vec();
    args.push(env!("GUEST_COUNTER"));
    let cache = cache.to_string_lossy().into_owned();
    let run = cli::monarch_host_env(&args, RUN_LIMIT, &[("MONARCH_CACHE_DIR", &cache)]);
    assert_eq!(run.code, Some(0), "{run:?}");
    run
}

/// The first frame of a record that is not folded.
fn first_own_frame(record: &Value) -> &Value {
    record["frames"]
        .as_array()
        .and_then(|frames| frames.iter().find(|f| f["folded"] == false))
        .unwrap_or_else(|| panic!("no frame that is not folded in {record:#}"))
}

#[test]
fn a_panicking_actor_leaves_a_record_and_a_core_dump_that_dumps_list_and_show_print() {
    let scratch = Scratch::new("dumps-cli");
    let cache = scratch.0.join("cache");
    let run = run_counter(&cache, &[]);

    // The fault the controller printed names the record.
    let trap = run.after("kind trap: ");
    assert!(
        trap.starts_with("actor counters[2] failed in `crash`: trap: wasm trap: "),
        "{run:?}"
    );
    let (_, record_path) = trap
        .split_once(" (post-mortem: ")
        .unwrap_or_else(|| panic!("the trap names no post-mortem record: {run:?}"));
    let record_path = PathBuf::from(record_path.trim_end_matches(')'));
    let dumps = cache.join("dumps");
    assert_eq!(record_path.file_name().unwrap(), "counters-2.json");
    let run_dir = record_path.parent().unwrap().to_path_buf();
    assert_eq!(run_dir.parent(), Some(dumps.as_path()), "{run:?}");
    let run_id = run_dir.file_name().unwrap().to_string_lossy().into_owned();

    // The record: who, where, why, and the backtrace whose first own frame
    // is the handler that panicked, at its line.
    let record: Value =
        serde_json::from_slice(&std::fs::read(&record_path).expect("the record")).unwrap();
    assert_eq!(record["mesh"], "counters");
    assert_eq!(record["rank"], 2);
    assert_eq!(record["endpoint"], "crash");
    assert_eq!(record["kind"], "trap");
    assert_eq!(record["run"], run_id.as_str());
    assert_eq!(
        record["reason"],
        "wasm trap: wasm `unreachable` instruction executed"
    );
    assert!(
        record["pid"].as_u64().is_some_and(|pid| pid > 0),
        "{record:#}"
    );
    assert!(record["host"].as_str().is_some_and(|h| !h.is_empty()));
    let frame = first_own_frame(&record);
    let function = frame["function"].as_str().unwrap_or_default();
    assert!(
        function.starts_with(
            "<counter::Counter as monarch_guest::actor::Handler<counter::Crash>>::handle"
        ),
        "the first own frame is {frame:#}"
    );
    let file = frame["file"].as_str().unwrap_or_default();
    assert!(file.ends_with("examples/counter/src/lib.rs"), "{frame:#}");
    assert_eq!(frame["line"], panic_line(), "{frame:#}");
    // What came before it is the panic machinery, folded.
    let frames = record["frames"].as_array().unwrap();
    let folded = frames.iter().take_while(|f| f["folded"] == true).count();
    assert!(folded >= 3, "{record:#}");
    assert!(frames[..folded].iter().any(|f| {
        f["function"]
            .as_str()
            .is_some_and(|name| name.contains("panic"))
    }));

    // The core dump: a Wasm module whose first section is `core`.
    assert_eq!(record["coredump"], "counters-2.coredump");
    let coredump = std::fs::read(run_dir.join("counters-2.coredump")).expect("the core dump");
    assert!(
        coredump.starts_with(b"\0asm\x01\0\0\0\0"),
        "not a core dump"
    );
    assert!(
        coredump[9..16].windows(5).any(|w| w == b"\x04core"),
        "no `core` section first"
    );

    // `dumps list`: the run, newest first, and its record.
    let (code, list, stderr) = monarch_host(&["dumps", "list"], &cache);
    assert_eq!(code, Some(0), "{list}{stderr}");
    assert!(
        list.starts_with(&format!("{run_id}  (1 record, ")),
        "{list}"
    );
    let row = list
        .lines()
        .find(|line| line.trim_start().starts_with("counters "))
        .unwrap_or_else(|| panic!("no row of counters in {list}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[..4], ["counters", "2", "crash", "trap:"], "{list}");
    assert!(
        row.ends_with("wasm `unreachable` instruction executed"),
        "{list}"
    );

    // `dumps show`: the reason, the endpoint, the frames as `function
    // (file:line)` with the handler first, and the core dump's path.
    let (code, shown, stderr) = monarch_host(&["dumps", "show", &run_id, "counters", "2"], &cache);
    assert_eq!(code, Some(0), "{shown}{stderr}");
    assert!(
        shown.contains("  reason:   trap: wasm trap: wasm `unreachable` instruction executed\n"),
        "{shown}"
    );
    assert!(shown.contains("  endpoint: crash\n"), "{shown}");
    let handler = format!("{function} ({file}:{})", panic_line());
    let first_frame = shown
        .lines()
        .skip_while(|line| !line.starts_with("backtrace"))
        .find(|line| !line.starts_with("backtrace") && !line.contains("folded"))
        .unwrap_or_default();
    assert_eq!(first_frame.trim(), handler, "{shown}");
    let coredump_line = format!(
        "coredump: {}",
        run_dir.join("counters-2.coredump").display()
    );
    assert!(shown.contains(&coredump_line), "{shown}");
    // `latest` is the newest run; `--json` is the record as written.
    let (_, latest, _) = monarch_host(&["dumps", "show", "latest", "counters", "2"], &cache);
    assert_eq!(latest, shown);
    let (_, json, _) = monarch_host(
        &["dumps", "show", &run_id, "counters", "2", "--json"],
        &cache,
    );
    assert_eq!(serde_json::from_str::<Value>(&json).ok(), Some(record));

    // Unknown runs and actors are errors that say what there is.
    let (code, _, stderr) = monarch_host(&["dumps", "show", &run_id, "counters", "7"], &cache);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains(&format!(
            "run `{run_id}` has no record of counters[7]; it has records of: counters 2"
        )),
        "{stderr}"
    );
    let (code, _, stderr) = monarch_host(
        &["dumps", "show", "19700101-000000-1", "counters", "2"],
        &cache,
    );
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("no run `19700101-000000-1` in") && stderr.contains("dumps list"),
        "{stderr}"
    );
}

#[test]
fn no_dumps_writes_nothing_and_names_no_record() {
    let scratch = Scratch::new("dumps-off");
    let cache = scratch.0.join("cache");
    let run = run_counter(&cache, &["--no-dumps"]);
    let trap = run.after("kind trap: ");
    assert_eq!(
        trap,
        "actor counters[2] failed in `crash`: trap: wasm trap: wasm `unreachable` instruction executed",
        "{run:?}"
    );
    assert!(!cache.join("dumps").exists(), "{run:?}");
    let (code, list, _) = monarch_host(&["dumps", "list"], &cache);
    assert_eq!(code, Some(0));
    assert!(list.starts_with("no post-mortem records in "), "{list}");
}

#[tokio::test]
async fn a_jobs_records_and_their_files_are_served() {
    let scratch = Scratch::new("dumps-serve");
    let server = ServeProcess::start(&scratch.0, &[]);
    let client = server.client();
    let counter = std::fs::read(env!("GUEST_COUNTER")).expect("the counter");
    let component = client.upload(counter).await.expect("upload").id;
    let job = JobRequest {
        component,
        args: Vec::new(),
        limits: None,
        mesh: None,
        dirs: Vec::new(),
        env: Vec::new(),
        ..Default::default()
    };
    let id = client.submit(&job).await.expect("submit");
    let until = Instant::now() + RUN_LIMIT;
    let info = loop {
        let info = client.job(id).await.expect("the job");
        if info.status.is_final() {
            break info;
        }
        assert!(Instant::now() < until, "job {id} did not end: {info:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(info.status, JobStatus::Succeeded, "{info:?}");

    let (status, body) = send(server.request(Method::GET, &format!("/v1/jobs/{id}/dumps"))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["job"], id);
    let dumps = body["dumps"].as_array().expect("dumps");
    assert_eq!(dumps.len(), 1, "{body:#}");
    assert_eq!(dumps[0]["file"], "counters-2.json");
    let record = &dumps[0]["record"];
    assert_eq!(
        (&record["mesh"], &record["rank"], &record["endpoint"]),
        (
            &Value::from("counters"),
            &Value::from(2),
            &Value::from("crash")
        )
    );
    assert_eq!(record["run"], id.to_string());
    assert_eq!(first_own_frame(record)["line"], panic_line());
    // They are in the server's data directory, under the job's id.
    let dir = server.data.join("dumps").join(id.to_string());
    assert!(dir.join("counters-2.json").is_file());

    // Each file, as written.
    let path = |file: &str| format!("/v1/jobs/{id}/dumps/{file}");
    let response = server
        .request(Method::GET, &path("counters-2.coredump"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let bytes = response.bytes().await.unwrap();
    assert_eq!(
        bytes.as_ref(),
        std::fs::read(dir.join("counters-2.coredump")).unwrap()
    );
    let (status, served) = send(server.request(Method::GET, &path("counters-2.json"))).await;
    assert_eq!(status, 200);
    assert_eq!(&served, record);

    // Nothing else: no way out of the job's directory, no other file, no
    // other job's, and not without the token.
    for (file, expected) in [
        ("..%2F..%2Fjobs.db", 400),
        ("%2Fetc%2Fpasswd.json", 400),
        (".counters-2.json", 400),
        ("counters-3.json", 404),
    ] {
        let (status, body) = send(server.request(Method::GET, &path(file))).await;
        assert_eq!(status, expected, "{file}: {body}");
    }
    let (status, _) =
        send(server.request(Method::GET, &format!("/v1/jobs/{}/dumps", id + 1))).await;
    assert_eq!(status, 404);
    let anonymous = reqwest::Client::new()
        .get(format!("{}/v1/jobs/{id}/dumps", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
}

//! Progress on the command line (`monarch_host::progress`): none of it
//! without a terminal (PG-1, PG-2), `submit --follow` saying its job's
//! state as it changes, and uploads that count their bytes.

#[path = "support/serve.rs"]
mod serve_support;

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use monarch_host::serve::api::{JobRequest, JobStatus};
use serve_support::{Scratch, ServeProcess};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

const CLI: &str = env!("CARGO_BIN_EXE_monarch-host-cli");

/// Fails if `text` holds what a terminal would take for drawing: escape
/// sequences, or carriage returns that redraw a line; or any of `steps`,
/// the messages of progress bars.
fn assert_draws_nothing(what: &str, text: &str, steps: &[&str]) {
    assert!(
        !text.contains("\x1b["),
        "{what} has escape sequences: {text:?}"
    );
    assert!(
        !text.contains('\r'),
        "{what} has carriage returns: {text:?}"
    );
    for step in steps {
        assert!(!text.contains(step), "{what} shows `{step}`: {text:?}");
    }
}

/// PG-1, PG-2: `run` with stdout and stderr piped compiles its program (a
/// fresh cache) and starts procs without drawing anything on either.
#[test]
fn pg1_a_run_without_a_terminal_draws_no_progress() {
    let cache = Scratch::new("progress-cache");
    let out = std::process::Command::new(CLI)
        .args(["run", env!("GUEST_HELLO"), "--timeout", "120", "--", "4"])
        .env("MONARCH_CACHE_DIR", &cache.0)
        .stdin(Stdio::null())
        .output()
        .expect("run monarch-host");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("hello from rank 3 of 4"),
        "the program's output is on stdout: {stdout}"
    );
    let compiled = std::fs::read_dir(&cache.0)
        .expect("the cache directory")
        .filter_map(Result::ok)
        .any(|entry| entry.path().extension().is_some_and(|e| e == "cwasm"));
    assert!(
        compiled,
        "the run compiled the program into the fresh cache"
    );
    let steps = ["compiling hello.wasm", "compiled hello.wasm", "procs up"];
    assert_draws_nothing("stdout", &stdout, &steps);
    assert_draws_nothing("stderr", &stderr, &steps);
}

/// The state lines `submit --follow` wrote on stderr for job `id`, in
/// order.
fn states(stderr: &str, id: u64) -> Vec<String> {
    let prefix = format!("monarch-host submit: job {id}: ");
    stderr
        .lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .map(str::to_string)
        .collect()
}

/// The job id `submit --follow` names on stderr.
fn submitted_id(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|line| line.strip_prefix("monarch-host submit: job "))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or_else(|| panic!("no job id in {stderr}"))
}

/// `submit --follow` says each state of its job once, as it changes:
/// queued while another job holds the only slot, running, then how it
/// ended; the log still goes to stdout, and nothing is drawn.
#[tokio::test]
async fn submit_follow_says_each_state_of_its_job_as_it_changes() {
    let dir = Scratch::new("progress-follow");
    let server = ServeProcess::start(&dir.0, &["--max-jobs", "1"]);
    let client = server.client();
    let spin = std::fs::read(env!("GUEST_SPIN")).expect("the spin program");
    let uploaded = client.upload(spin).await.expect("upload spin");
    // It holds the server's only slot until it is cancelled.
    let holder = client
        .submit(&JobRequest {
            component: uploaded.id,
            ..Default::default()
        })
        .await
        .expect("submit spin");
    let until = Instant::now() + Duration::from_secs(30);
    while client.job(holder).await.expect("the job").status != JobStatus::Running {
        assert!(Instant::now() < until, "job {holder} did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut child = tokio::process::Command::new(CLI)
        .args(["submit", env!("GUEST_HELLO"), "--follow", "--", "2"])
        .env("MONARCH_SERVER", &server.base)
        .env("MONARCH_TOKEN_FILE", dir.0.join("token"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the CLI");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut stderr = String::new();
    // Once it says its job is queued, the slot is freed.
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            stderr.push_str(&line);
            stderr.push('\n');
            if line.ends_with(": queued") {
                return;
            }
        }
        panic!("the CLI ended without saying its job is queued: {stderr}");
    })
    .await
    .unwrap_or_else(|_| panic!("no `queued` line within 60 s: {stderr}"));
    client.cancel(holder).await.expect("cancel spin");
    let rest = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            stderr.push_str(&line);
            stderr.push('\n');
        }
        let mut out = String::new();
        stdout.read_to_string(&mut out).await.expect("read stdout");
        (child.wait().await.expect("the CLI's status"), out)
    })
    .await;
    let (status, stdout) = rest.unwrap_or_else(|_| panic!("the CLI did not end: {stderr}"));
    assert!(status.success(), "{stdout}{stderr}");
    let id = submitted_id(&stderr);
    assert_eq!(
        states(&stderr, id),
        ["queued", "running", "succeeded"],
        "{stderr}"
    );
    assert!(
        stdout.contains("hello from rank 1 of 2"),
        "the log goes to stdout: {stdout}"
    );
    // `submit` says as a line that it uploads `/path/to/hello.wasm`; its
    // bar would say `uploading hello.wasm`.
    assert_draws_nothing("stderr", &stderr, &["uploading hello.wasm"]);

    // A job that fails says so last, beside the reason.
    let out = tokio::process::Command::new(CLI)
        .args(["submit", env!("GUEST_SPIN"), "--timeout", "2", "--follow"])
        .env("MONARCH_SERVER", &server.base)
        .env("MONARCH_TOKEN_FILE", dir.0.join("token"))
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run the CLI");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let id = submitted_id(&stderr);
    let said = states(&stderr, id);
    assert_eq!(said.last().map(String::as_str), Some("failed"), "{stderr}");
    assert!(said.iter().any(|s| s == "running"), "{stderr}");
    assert!(
        stderr.contains(&format!("monarch-host: job {id} failed")),
        "{stderr}"
    );
}

/// An upload with progress counts every byte of the component once, and
/// the server gets it whole; one over the server's limit is refused with
/// the reason, as a plain upload is.
#[tokio::test]
async fn an_upload_with_progress_counts_each_byte_and_keeps_the_limit() {
    let dir = Scratch::new("progress-upload");
    let server = ServeProcess::start(&dir.0, &["--max-upload-mib", "1"]);
    let client = server.client();
    let hello = std::fs::read(env!("GUEST_HELLO")).expect("the hello program");
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    let reply = client
        .upload_with_progress(hello.clone(), move |n| {
            counted.fetch_add(n, Ordering::Relaxed);
        })
        .await
        .expect("upload");
    assert_eq!(sent.load(Ordering::Relaxed), hello.len() as u64);
    assert_eq!(reply.size, hello.len() as u64);
    assert_eq!(reply.id, monarch_host::engine::sha256_hex(&hello));
    assert!(!reply.existing);

    let too_big = vec![0u8; 2 << 20];
    let error = client
        .upload_with_progress(too_big, |_| {})
        .await
        .expect_err("over the limit");
    assert!(error.contains("larger than this server's limit"), "{error}");
}

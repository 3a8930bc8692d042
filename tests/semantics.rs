//! Failure semantics, deadlines, time, introspection and grants, as a
//! program sees them: `tests/programs/semantics` run by the `monarch-host`
//! command, its procs in child processes, one mode per test. The program
//! prints what it saw (`stopped-call kind=stopped ms=3`); the tests assert
//! on those lines, on timings, and on the exit status. `docs/semantics.md`
//! is the table these tests check.

#[path = "support/cli.rs"]
mod cli;

#[path = "support/serve.rs"]
mod serve_support;

use std::time::{Duration, Instant};

use cli::{Command, monarch_host};
use monarch_host::serve::api::{JobRequest, JobStatus, MeshChoice};

const PROGRAM: &str = env!("GUEST_SEMANTICS");

/// Runs the semantics program in `mode`, with `flags` for the command.
fn semantics(mode: &[&str], flags: &[&str]) -> Command {
    let mut args = vec![PROGRAM];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(mode);
    monarch_host(&args, Duration::from_secs(120))
}

/// The value of `key=` in the first line that starts with `line` (after
/// the `[controller] ` prefix), up to the next space.
fn field<'a>(out: &'a Command, line: &str, key: &str) -> &'a str {
    let rest = out.after(&format!("[controller] {line} "));
    let at = rest
        .find(&format!("{key}="))
        .unwrap_or_else(|| panic!("no {key}= after {line:?}:\n{out:?}"));
    let value = &rest[at + key.len() + 1..];
    value.split(' ').next().unwrap_or_default()
}

fn ms(out: &Command, line: &str) -> u64 {
    field(out, line, "ms")
        .parse()
        .unwrap_or_else(|_| panic!("{line}: ms is not a number:\n{out:?}"))
}

fn assert_ok(out: &Command) {
    assert_eq!(out.code, Some(0), "{out:?}");
}

/// MS-1: a call to a stopped mesh, to a slice of it, through a reference
/// held by another actor in another process, and to a mesh whose procs
/// were stopped, each fails at once (well under 100 ms) with kind
/// `stopped`, not after the call timeout.
#[test]
fn a_call_to_a_stopped_mesh_fails_at_once() {
    let out = semantics(&["stopped"], &["--call-timeout", "30"]);
    assert_ok(&out);
    for line in ["stopped-call", "stopped-slice", "stopped-procs"] {
        assert_eq!(field(&out, line, "kind"), "stopped", "{line}: {out:?}");
        assert!(ms(&out, line) < 100, "{line}: {out:?}");
    }
    // The reference went to an actor of another mesh, which called the
    // stopped mesh through its own caster.
    let reply = out.after("[controller] stopped-ref ");
    let (kind, elapsed) = reply.split_once(' ').expect("kind and ms");
    assert_eq!(kind, "stopped", "{out:?}");
    assert!(elapsed.parse::<u64>().unwrap() < 100, "{out:?}");
}

/// A broadcast whose endpoint returns an error fails that actor, as in
/// Monarch: its owner's supervisor gets one failure of kind `endpoint`
/// naming the mesh, rank and endpoint; calls to that rank then fail at
/// once, while the other rank answers.
#[test]
fn a_broadcast_error_stops_the_actor_and_tells_its_owner() {
    let out = semantics(&["broadcast-error"], &[]);
    assert_ok(&out);
    let failure = out.after("[controller] failure ");
    for part in [
        "mesh=workers",
        "rank=1",
        "kind=endpoint",
        "endpoint=fail",
        "bad",
    ] {
        assert!(failure.contains(part), "{part}: {out:?}");
    }
    assert_eq!(field(&out, "after-failure", "kind"), "endpoint", "{out:?}");
    assert!(!out.lines_with("other-rank ok").is_empty(), "{out:?}");
    assert_eq!(out.lines_with("choose ok").len(), 4, "{out:?}");
    // A stream gives the failed rank's failure and the live rank's reply.
    assert!(
        !out.lines_with("stream rank=1 endpoint").is_empty(),
        "{out:?}"
    );
    assert!(!out.lines_with("stream rank=0 ok").is_empty(), "{out:?}");
    assert_eq!(out.after("[controller] failures="), "1", "{out:?}");
}

/// A handler stuck in a loop past its mesh's 1 s deadline is interrupted
/// within 2 s, its actor fails with kind `deadline` (one failure event),
/// and another mesh's actor on the same proc keeps answering. A per-call
/// deadline overrides the mesh's.
#[test]
fn an_infinite_loop_past_its_deadline_fails_its_actor_and_spares_the_proc() {
    let out = semantics(&["deadline"], &[]);
    assert_ok(&out);
    assert_eq!(field(&out, "spin", "kind"), "deadline", "{out:?}");
    let spun = ms(&out, "spin");
    assert!((900..2000).contains(&spun), "{spun} ms: {out:?}");
    assert!(
        out.after("[controller] spin ").contains("1000 ms"),
        "{out:?}"
    );
    assert_eq!(out.after("[controller] bystander "), "5", "{out:?}");
    assert_eq!(out.after("[controller] failures="), "1", "{out:?}");
    assert_eq!(field(&out, "override", "kind"), "deadline", "{out:?}");
    assert!(ms(&out, "override") < 1500, "{out:?}");
    assert_eq!(out.after("[controller] bystander-after "), "5", "{out:?}");
}

/// `--handler-timeout` is the default deadline of every mesh.
#[test]
fn the_handler_timeout_flag_is_every_meshs_default() {
    // `spinners` sets its own 1 s; `sleepers` takes the flag's 0.5 s even
    // for the call whose own deadline is 0.3 s... the call's wins.
    let out = semantics(&["deadline"], &["--handler-timeout", "0.5"]);
    assert_ok(&out);
    assert!(ms(&out, "override") < 1500, "{out:?}");
    let bad = semantics(&["deadline"], &["--handler-timeout", "soon"]);
    assert_eq!(bad.code, Some(2), "{bad:?}");
    assert!(bad.stderr.contains("not a number of seconds"), "{bad:?}");
}

/// A trap fails the actor once: each of the three calls in flight gets its
/// own error of kind `trap` naming the actor, and one failure event comes.
#[test]
fn a_trap_yields_one_failure_and_an_error_per_pending_call() {
    let out = semantics(&["trap-once"], &[]);
    assert_ok(&out);
    assert_eq!(
        field(&out, "errors=3", "kinds"),
        "trap,trap,trap",
        "{out:?}"
    );
    assert_eq!(out.after("[controller] failures="), "1", "{out:?}");
    assert_eq!(out.after("[controller] backtrace="), "yes", "{out:?}");
}

/// An endpoint's error keeps the type name its actor gave it.
#[test]
fn an_endpoint_error_keeps_its_type_name() {
    let out = semantics(&["typed-error"], &[]);
    assert_ok(&out);
    assert_eq!(
        field(&out, "type=ValueError", "kind"),
        "endpoint",
        "{out:?}"
    );
    assert!(
        out.after("[controller] type=ValueError")
            .ends_with("message=bad value"),
        "{out:?}"
    );
}

/// Sleep, timeout and select in the controller and in an actor, driven by
/// the event loop.
#[test]
fn time_works_in_the_controller_and_in_actors() {
    let out = semantics(&["time"], &[]);
    assert_ok(&out);
    let slept = ms(&out, "sleep");
    assert!((190..1000).contains(&slept), "{out:?}");
    assert_eq!(field(&out, "timeout", "elapsed"), "true", "{out:?}");
    assert!(ms(&out, "timeout") < 900, "{out:?}");
    assert_eq!(field(&out, "select", "winner"), "call", "{out:?}");
    assert!(ms(&out, "select") < 1500, "{out:?}");
    let actor: u64 = out.after("[controller] actor-sleep ms=").parse().unwrap();
    assert!((140..1000).contains(&actor), "{out:?}");
}

/// A proc mesh tells each proc's host, pid and state; killing one (its
/// own) is a `proc-lost` failure, and the other proc carries on.
#[test]
fn a_program_kills_its_own_proc_and_sees_it_lost() {
    let out = semantics(&["info-kill"], &[]);
    assert_ok(&out);
    let procs = out.lines_with("[controller] proc rank=");
    assert_eq!(procs.len(), 2, "{out:?}");
    for line in &procs {
        assert!(
            line.contains("host=local") && line.contains("state=running"),
            "{out:?}"
        );
        let pid = line.split("pid=").nth(1).and_then(|p| p.split(' ').next());
        assert!(pid.is_some_and(|p| p.parse::<u32>().is_ok()), "{line}");
    }
    assert_eq!(field(&out, "failure", "kind"), "proc-lost", "{out:?}");
    assert_eq!(field(&out, "failure", "rank"), "1", "{out:?}");
    assert_eq!(
        out.after("[controller] after-kill state="),
        "failed",
        "{out:?}"
    );
    assert!(!out.lines_with("survivor ok").is_empty(), "{out:?}");
}

/// `exit` in the controller is the command's exit status. WASI 0.2's
/// `exit(result)`, which Rust's `std::process::exit` calls, carries only
/// success or failure, so `exit(3)` arrives as 1 (a guest that imports
/// `exit-with-code` passes its own code through).
#[test]
fn the_programs_exit_status_is_the_commands() {
    let out = semantics(&["exit", "3"], &[]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("exited with status 1"), "{out:?}");
    let out = semantics(&["exit", "0"], &[]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
}

/// What actors print on stdout and stderr reaches the controller's
/// terminal, each line prefixed with its mesh and rank, in order per actor
/// (lines of different actors, and the controller's own, may interleave).
#[test]
fn actor_output_reaches_the_terminal_prefixed() {
    let out = semantics(&["print"], &[]);
    assert_ok(&out);
    let at = |needle: &str| {
        out.stdout
            .iter()
            .position(|(_, line)| line == needle)
            .unwrap_or_else(|| panic!("no line {needle:?}:\n{out:?}"))
    };
    for rank in 0..2 {
        let out_line = at(&format!("[printers {rank}] hello from {rank}"));
        let err_line = at(&format!("[printers {rank}] err: hello from {rank}"));
        assert!(out_line < err_line, "{out:?}");
    }
    at("controller stdout");
    at("[controller] print done");
}

/// Nothing is granted by default; `--dir` preopens a directory read-only
/// for the controller and its actors, and `--env` passes variables.
#[test]
fn directories_and_environment_are_granted_only_by_flags() {
    let dir = std::env::temp_dir().join(format!("semantics-grant-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("in.txt"), "granted bytes\n").unwrap();
    let grant = format!("{}::/data", dir.display());

    let none = semantics(&["files", "/data/in.txt", "GREETING"], &[]);
    assert_ok(&none);
    assert!(
        none.after("[controller] controller-file ")
            .starts_with("error"),
        "{none:?}"
    );
    assert_eq!(none.after("[controller] controller-env "), "-", "{none:?}");
    assert!(
        none.after("[controller] actor-file ").starts_with("error"),
        "{none:?}"
    );

    let granted = semantics(
        &["files", "/data/in.txt", "GREETING"],
        &["--dir", &grant, "--env", "GREETING=hi there"],
    );
    assert_ok(&granted);
    assert_eq!(
        granted.after("[controller] controller-file "),
        "granted bytes"
    );
    assert_eq!(granted.after("[controller] controller-env "), "hi there");
    assert_eq!(granted.after("[controller] actor-file "), "granted bytes");
    assert_eq!(granted.after("[controller] actor-env "), "hi there");
    assert_eq!(
        granted.after("[controller] write "),
        "error",
        "read-only by default"
    );
    assert!(!dir.join("written.txt").exists());

    let writable = semantics(
        &["files", "/data/in.txt", "GREETING"],
        &["--dir", &format!("{grant}:rw")],
    );
    assert_eq!(writable.after("[controller] write "), "ok", "{writable:?}");
    assert!(dir.join("written.txt").exists());

    let missing = semantics(&["echo"], &["--dir", "/no/such/dir::/data"]);
    assert_eq!(missing.code, Some(2), "{missing:?}");
    assert!(missing.stderr.contains("/no/such/dir"), "{missing:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Job `id` once it has ended; panics past 10 s.
async fn final_status(
    client: &monarch_host::serve::client::ApiClient,
    id: u64,
) -> monarch_host::serve::api::JobInfo {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let info = client.job(id).await.expect("the job");
        if info.status.is_final() {
            return info;
        }
        assert!(Instant::now() < until, "job {id} hung: {info:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Under `serve`, on a persistent mesh: cancelling a job whose actors
/// sleep in WASI stops them within a second, and the next job on the same
/// mesh succeeds within 2 s; a job's actor output reaches its log; and a
/// job may not kill the mesh's procs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_job_frees_its_persistent_mesh_for_the_next() {
    let dir = serve_support::Scratch::new("semantics-cancel");
    let server = serve_support::ServeProcess::start(&dir.0, &["--mesh", "workers=2"]);
    let client = server.client();
    let component = client
        .upload(std::fs::read(PROGRAM).expect("the program"))
        .await
        .expect("upload")
        .id;
    let job = |args: &[&str]| JobRequest {
        component: component.clone(),
        args: args.iter().map(|a| a.to_string()).collect(),
        limits: None,
        mesh: Some(MeshChoice::Name("workers".into())),
        dirs: Vec::new(),
        env: Vec::new(),
        ..Default::default()
    };
    let sleeping = client.submit(&job(&["sleep-forever", "2"])).await.unwrap();
    // The job's log file, as the server writes it.
    let log = server.data.join("logs").join(format!("{sleeping}.log"));
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("sleeping") {
            break;
        }
        assert!(Instant::now() < until, "the job never slept: {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Give the broadcast time to reach the actors' WASI sleeps.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cancelled_at = Instant::now();
    client.cancel(sleeping).await.expect("cancel");
    let cancelled = final_status(&client, sleeping).await;
    let took = cancelled_at.elapsed();
    assert_eq!(cancelled.status, JobStatus::Cancelled, "{cancelled:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");

    let next_at = Instant::now();
    let next = client.submit(&job(&["echo", "2"])).await.unwrap();
    let info = final_status(&client, next).await;
    let took = next_at.elapsed();
    assert_eq!(info.status, JobStatus::Succeeded, "{info:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");

    // What the job's actors print lands in the job's log, prefixed with
    // the job's mesh and the rank, and so does the controller's stdout.
    let printing = client.submit(&job(&["print"])).await.unwrap();
    let mut lines = Vec::new();
    let end = client
        .follow_logs(printing, |line| lines.push(line.to_string()))
        .await
        .expect("the log");
    assert_eq!(end.status, JobStatus::Succeeded, "{lines:?}");
    for expected in [
        format!("[j{printing}.printers 0] hello from 0"),
        format!("[j{printing}.printers 1] err: hello from 1"),
        "[controller] controller stdout".to_string(),
    ] {
        assert!(lines.contains(&expected), "{expected:?} in {lines:?}");
    }

    // A job may not kill the procs of a persistent mesh: they are not its.
    let killing = client.submit(&job(&["info-kill"])).await.unwrap();
    let end = client.follow_logs(killing, |_| {}).await.expect("the log");
    assert_eq!(end.status, JobStatus::Failed);
    let error = end.error.unwrap_or_default();
    assert!(error.contains("belongs to a persistent mesh"), "{error}");
    let meshes = client.meshes().await.unwrap();
    assert!(
        meshes[0].procs.iter().all(|p| p.state == "running"),
        "{meshes:?}"
    );
}

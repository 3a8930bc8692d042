//! Persistent actor meshes of `monarch-host serve` end to end: one job
//! spawns a persistent counter on a persistent mesh and counts to 5, later
//! jobs (separate submissions) look it up and read 5; a name in use is
//! refused naming `respawn`, which replaces the mesh and says its state
//! was lost; a failure of its actors fails no job and shows in
//! `GET /v1/meshes`; `DELETE /v1/meshes/NAME` stops it, after which a
//! lookup fails and its actors are gone. The guest is
//! `tests/programs/persist`, one step per job.

#[path = "support/serve.rs"]
mod serve_support;

use std::time::{Duration, Instant};

use monarch_host::serve::api::{JobRequest, JobStatus, MeshChoice};
use monarch_host::serve::client::ApiClient;
use reqwest::Method;
use serde_json::Value;
use serve_support::{Scratch, ServeProcess, send};

/// Runs the step `args` of the persist program on `mesh` (the persistent
/// mesh `workers` unless None) to its end; returns its status, error and
/// the `[controller]` lines of its log.
async fn step(
    client: &ApiClient,
    component: &str,
    args: &[&str],
    mesh: Option<&str>,
) -> (JobStatus, Option<String>, Vec<String>) {
    let id = client
        .submit(&JobRequest {
            component: component.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
            mesh: mesh.map(|m| MeshChoice::Name(m.into())),
            ..Default::default()
        })
        .await
        .expect("submit");
    let mut lines = Vec::new();
    let end = client
        .follow_logs(id, |line| lines.push(line.to_string()))
        .await
        .expect("the log stream");
    let info = client.job(id).await.expect("the job");
    assert_eq!(info.status, end.status);
    (end.status, info.error, lines)
}

fn has(lines: &[String], needle: &str) -> bool {
    lines.iter().any(|line| line.contains(needle))
}

/// Submits `args` as a job on the mesh `workers` and waits until its log
/// shows `started`.
async fn start(
    client: &ApiClient,
    server: &ServeProcess,
    program: &str,
    args: &[&str],
    started: &str,
) -> u64 {
    let job = client
        .submit(&JobRequest {
            component: program.to_string(),
            args: args.iter().map(|arg| arg.to_string()).collect(),
            mesh: Some(MeshChoice::Name("workers".into())),
            ..Default::default()
        })
        .await
        .expect("submit");
    let log = server.data.join("logs").join(format!("{job}.log"));
    let until = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log).is_ok_and(|text| text.contains(started)) {
        assert!(Instant::now() < until, "{args:?} did not print {started:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    job
}

/// The persistent actor meshes `GET /v1/meshes` reports.
async fn actor_meshes(server: &ServeProcess) -> Vec<Value> {
    let (status, body) = send(server.request(Method::GET, "/v1/meshes")).await;
    assert_eq!(status, 200, "{body}");
    body["actor_meshes"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("no actor_meshes in {body}"))
}

#[tokio::test]
async fn a_persistent_counter_outlives_its_job_until_it_is_deleted() {
    let dir = Scratch::new("persist");
    let server = ServeProcess::start(&dir.0, &["--mesh", "workers=2"]);
    let client = server.client();
    let bytes = std::fs::read(env!("GUEST_PERSIST")).expect("the persist program");
    let program = client.upload(bytes).await.expect("upload").id;
    let program = program.as_str();

    // Job A spawns the persistent counter and increments it 5 times.
    let (status, error, lines) = step(
        &client,
        program,
        &["spawn", "counter", "2"],
        Some("workers"),
    )
    .await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert!(has(&lines, "spawned p.counter at [5, 5]"), "{lines:?}");
    // It outlived job A: the server reports it, and job A's own actors
    // are gone from the mesh.
    let meshes = actor_meshes(&server).await;
    assert_eq!(meshes.len(), 1, "{meshes:?}");
    let counter = &meshes[0];
    assert_eq!(counter["name"], "counter");
    assert_eq!(counter["class"], "Counter");
    assert_eq!(counter["mesh"], "workers");
    assert_eq!(counter["state"], "running", "{counter}");
    assert_eq!(counter["ranks"].as_array().map(Vec::len), Some(2));
    let procs = client.meshes().await.unwrap();
    assert!(procs[0].actors.is_empty(), "{procs:?}");

    // Job B, a separate submission, looks it up and reads 5.
    let (status, error, lines) =
        step(&client, program, &["read", "counter"], Some("workers")).await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert!(has(&lines, "counter reads [5, 5]"), "{lines:?}");

    // So does a job on a fresh mesh of its own.
    let (status, error, lines) = step(&client, program, &["read", "counter"], None).await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert!(has(&lines, "counter reads [5, 5]"), "{lines:?}");

    // A spawn under the name in use fails, naming `respawn`.
    let (status, error, lines) = step(
        &client,
        program,
        &["spawn-twice", "counter", "2"],
        Some("workers"),
    )
    .await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert!(
        has(&lines, "spawn failed") && has(&lines, "`respawn`"),
        "{lines:?}"
    );

    // A job on a fresh mesh cannot persist: its procs end with it.
    let (status, error, lines) = step(&client, program, &["spawn", "elsewhere", "1"], None).await;
    assert_eq!(status, JobStatus::Failed, "{lines:?}");
    let error = error.unwrap_or_default();
    assert!(
        error.contains("persist needs procs that outlive this job") && error.contains("--mesh"),
        "{error}"
    );

    // `stop` through a handle leaves it running: it is the server's.
    let (status, error, lines) =
        step(&client, program, &["stop", "counter"], Some("workers")).await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert!(has(&lines, "counter after stop reads [5, 5]"), "{lines:?}");
    assert!(
        has(&lines, "DELETE /v1/meshes/counter stops it"),
        "{lines:?}"
    );

    // A failure of its actors fails no job: the calling job gets its call
    // error and no supervision failure, and the server reports it.
    let (status, error, lines) =
        step(&client, program, &["crash", "counter"], Some("workers")).await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert!(has(&lines, "crash: trap"), "{lines:?}");
    assert!(has(&lines, "failures reported to this job: 0"), "{lines:?}");
    assert!(has(&lines, "after the crash: trap"), "{lines:?}");
    let until = Instant::now() + Duration::from_secs(10);
    let counter = loop {
        let meshes = actor_meshes(&server).await;
        if meshes[0]["state"] == "failed" || Instant::now() > until {
            break meshes[0].clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(counter["state"], "failed", "{counter}");
    assert_eq!(counter["ranks"][0]["state"], "failed", "{counter}");
    assert!(
        counter["ranks"][0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("wasm trap")),
        "{counter}"
    );
    assert_eq!(counter["ranks"][1]["state"], "running", "{counter}");
    let (status, body) = send(server.request(Method::GET, "/healthz")).await;
    assert_eq!((status, body), (200, Value::String("ok".into())));

    // `respawn` replaces it, and says its state was lost.
    let (status, error, lines) = step(
        &client,
        program,
        &["respawn", "counter", "2"],
        Some("workers"),
    )
    .await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert!(has(&lines, "state was lost"), "{lines:?}");
    assert!(has(&lines, "respawned counter at [0, 0]"), "{lines:?}");
    let meshes = actor_meshes(&server).await;
    assert_eq!(meshes[0]["state"], "running", "{meshes:?}");

    // DELETE stops it: a job holding it sees its actors gone, and a later
    // lookup fails.
    let holder = start(
        &client,
        &server,
        program,
        &["hold", "counter"],
        "holding counter",
    )
    .await;
    let (status, body) = send(server.request(Method::DELETE, "/v1/meshes/counter")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["name"], "counter", "{body}");
    assert_eq!(body["state"], "stopped", "{body}");
    let mut lines = Vec::new();
    let end = client
        .follow_logs(holder, |line| lines.push(line.to_string()))
        .await
        .expect("the log stream");
    assert_eq!(end.status, JobStatus::Succeeded, "{end:?} {lines:?}");
    // The call after the delete ends as stopped, whoever answers it: the
    // procs (the actors are gone), a rank that was handling it when the
    // stop came, or the server's record of the deleted mesh; never as a
    // trap of the guest, and with no post-mortem.
    assert!(
        has(&lines, "after the delete: stopped")
            && has(&lines, "p.counter[")
            && !has(&lines, "trap")
            && !has(&lines, "post-mortem"),
        "{lines:?}"
    );
    assert!(actor_meshes(&server).await.is_empty());
    let (status, error, lines) =
        step(&client, program, &["lookup", "counter"], Some("workers")).await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert!(
        has(&lines, "lookup failed") && has(&lines, "no persistent actor mesh named `counter`"),
        "{lines:?}"
    );
    let (status, _) = send(server.request(Method::DELETE, "/v1/meshes/counter")).await;
    assert_eq!(status, 404);

    // Deleting a persistent mesh stops the persistent actor meshes on it.
    let (status, error, lines) =
        step(&client, program, &["spawn", "again", "1"], Some("workers")).await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert_eq!(actor_meshes(&server).await.len(), 1);

    // A DELETE while a rank computes inside a handler ends that call as
    // stopped, not as a trap of the guest (and writes no post-mortem).
    let spinner = start(
        &client,
        &server,
        program,
        &["hold-spin", "again"],
        "spinning again",
    )
    .await;
    // What a persistent mesh prints is not the job's: give the call time
    // to reach the rank and start spinning.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (status, body) = send(server.request(Method::DELETE, "/v1/meshes/again")).await;
    assert_eq!(status, 200, "{body}");
    let mut lines = Vec::new();
    let end = client
        .follow_logs(spinner, |line| lines.push(line.to_string()))
        .await
        .expect("the log stream");
    assert_eq!(end.status, JobStatus::Succeeded, "{end:?} {lines:?}");
    assert!(
        has(&lines, "after the delete: stopped")
            && has(&lines, "was stopped while it handled `spin`")
            && !has(&lines, "post-mortem"),
        "{lines:?}"
    );
    let (status, error, lines) =
        step(&client, program, &["spawn", "again", "1"], Some("workers")).await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert_eq!(actor_meshes(&server).await.len(), 1);
    let (status, body) = send(server.request(Method::DELETE, "/v1/meshes/workers")).await;
    assert_eq!(status, 200, "{body}");
    assert!(actor_meshes(&server).await.is_empty());
}

/// The same from Python (`persist=True`, `lookup_actor_mesh`, `respawn`),
/// built with `monarch-host build`; skipped where `MONARCH_SKIP_ANYLANG`
/// is set, as the other Python tests are.
#[tokio::test]
async fn python_spawns_looks_up_and_respawns_a_persistent_counter() {
    if std::env::var_os("MONARCH_SKIP_ANYLANG").is_some() {
        eprintln!("skipped: MONARCH_SKIP_ANYLANG is set");
        return;
    }
    let dir = Scratch::new("persist-python");
    let source =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("programs/python/persist_counter.py");
    let wasm = dir.0.join("persist_counter.wasm");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .arg("build")
        .arg(&source)
        .arg("-o")
        .arg(&wasm)
        .output()
        .expect("run monarch-host build");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let server = ServeProcess::start(&dir.0, &["--mesh", "workers=1"]);
    let client = server.client();
    let program = client
        .upload(std::fs::read(&wasm).unwrap())
        .await
        .expect("upload")
        .id;
    let program = program.as_str();
    let on_mesh = Some("workers");

    let (status, error, lines) = step(&client, program, &["spawn", "counter"], on_mesh).await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert!(has(&lines, "spawned counter at 5"), "{lines:?}");
    let (status, error, lines) = step(&client, program, &["read", "counter"], on_mesh).await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert!(has(&lines, "counter reads 5"), "{lines:?}");
    let (status, error, lines) = step(&client, program, &["again", "counter"], on_mesh).await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert!(
        has(&lines, "spawn failed") && has(&lines, "respawn"),
        "{lines:?}"
    );
    let (status, error, lines) = step(&client, program, &["respawn", "counter"], on_mesh).await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert!(has(&lines, "respawned counter at 0"), "{lines:?}");
    assert!(has(&lines, "state was lost"), "{lines:?}");
    let (status, body) = send(server.request(Method::DELETE, "/v1/meshes/counter")).await;
    assert_eq!(status, 200, "{body}");
    let (status, error, lines) = step(&client, program, &["lookup", "counter"], on_mesh).await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:?}");
    assert!(
        has(&lines, "lookup failed") && has(&lines, "no persistent actor mesh named `counter`"),
        "{lines:?}"
    );
}

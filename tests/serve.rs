//! `monarch-host serve` end to end: a real server process on loopback,
//! driven over HTTP and through the CLI client.

#[path = "support/serve.rs"]
mod serve_support;

use std::time::{Duration, Instant};

use monarch_host::serve::api::{JobRequest, JobStatus, MeshChoice, MeshSpec};
use reqwest::Method;
use serde_json::{Value, json};
use serve_support::{Scratch, ServeProcess, TOKEN, finished, send};

fn program(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

async fn upload(server: &ServeProcess, bytes: Vec<u8>) -> (u16, Value) {
    send(
        server
            .request(Method::POST, "/v1/components")
            .header("content-type", "application/wasm")
            .body(bytes),
    )
    .await
}

fn error_of(body: &Value) -> &str {
    body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error in {body}"))
}

fn job(component: &str, args: &[&str], mesh: Option<MeshChoice>) -> JobRequest {
    JobRequest {
        component: component.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
        limits: None,
        mesh,
        dirs: Vec::new(),
        env: Vec::new(),
        ..Default::default()
    }
}

#[tokio::test]
async fn uploads_are_kept_by_hash_and_bad_ones_are_refused_with_a_reason() {
    let dir = Scratch::new("uploads");
    let server = ServeProcess::start(&dir.0, &["--max-upload-mib", "1"]);
    let hello = program(env!("GUEST_HELLO"));

    let (status, first) = upload(&server, hello.clone()).await;
    assert_eq!(status, 201, "{first}");
    let id = first["id"].as_str().expect("an id").to_string();
    assert_eq!(id.len(), 64, "{first}");
    assert_eq!(first["existing"], false);
    assert_eq!(first["size"], hello.len());
    assert!(
        server
            .data
            .join("components")
            .join(format!("{id}.wasm"))
            .exists(),
        "stored by its hash"
    );
    // The same bytes again: the same id, not compiled again.
    let (status, again) = upload(&server, hello.clone()).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["id"], id.as_str());
    assert_eq!(again["existing"], true);
    let (status, list) = send(server.request(Method::GET, "/v1/components")).await;
    assert_eq!(status, 200);
    assert_eq!(
        list["components"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );

    let mut elf = b"\x7fELF\x02\x01\x01\0".to_vec();
    elf.resize(4096, 0);
    let mut big = b"\0asm\x0d\0\x01\0".to_vec();
    big.resize(3 << 20, 0);
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("empty", Vec::new(), 400, "empty"),
        (
            "garbage",
            b"#!/bin/sh\necho not wasm\n".to_vec(),
            400,
            "not a WebAssembly file",
        ),
        (
            "a core module",
            b"\0asm\x01\0\0\0".to_vec(),
            400,
            "core WebAssembly module",
        ),
        ("a precompiled artifact", elf, 400, "precompiled"),
        (
            "a component that does not compile",
            b"\0asm\x0d\0\x01\0\xff\xff".to_vec(),
            400,
            "does not compile",
        ),
        (
            "the wrong world",
            program(env!("GUEST_WRONG_WORLD")),
            422,
            "`run`",
        ),
        (
            "over the limit",
            big,
            413,
            "larger than this server's limit",
        ),
    ];
    for (what, bytes, want, says) in cases {
        let (status, body) = upload(&server, bytes).await;
        assert_eq!(status, want, "{what}: {body}");
        assert!(error_of(&body).contains(says), "{what}: {body}");
    }
    // A component of the `controller` world (`run` alone) is taken too.
    let (status, controller) = upload(&server, program(env!("GUEST_CONTROLLER_ONLY"))).await;
    assert_eq!(status, 201, "{controller}");
    assert_eq!(controller["world"], "controller");
    assert_eq!(first["world"], "program");
    // Nothing of the refused uploads is left behind.
    let (_, list) = send(server.request(Method::GET, "/v1/components")).await;
    assert_eq!(
        list["components"].as_array().map(Vec::len),
        Some(2),
        "{list}"
    );
    let leftovers = std::fs::read_dir(server.data.join("uploads"))
        .unwrap()
        .count();
    assert_eq!(leftovers, 0, "partial uploads are removed");
    let (_, metrics) = send(server.request(Method::GET, "/metrics")).await;
    let metrics = metrics.as_str().expect("text").to_string();
    assert!(
        metrics.contains("monarch_uploads_total{result=\"rejected\"} 7"),
        "{metrics}"
    );
    assert!(
        metrics.contains("monarch_uploads_total{result=\"existing\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn every_route_but_healthz_needs_the_token() {
    let dir = Scratch::new("auth");
    let server = ServeProcess::start(&dir.0, &[]);
    let plain = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", server.base);
    for (method, path) in [
        (Method::GET, "/v1/jobs"),
        (Method::POST, "/v1/jobs"),
        (Method::GET, "/v1/jobs/1"),
        (Method::DELETE, "/v1/jobs/1"),
        (Method::GET, "/v1/jobs/1/logs"),
        (Method::POST, "/v1/components"),
        (Method::GET, "/v1/meshes"),
        (Method::GET, "/metrics"),
        (Method::GET, "/v1/openapi.json"),
        (Method::GET, "/"),
    ] {
        let (status, body) = send(plain.request(method.clone(), url(path))).await;
        assert_eq!(status, 401, "{method} {path} without a token: {body}");
        let (status, body) = send(
            plain
                .request(method.clone(), url(path))
                .bearer_auth("wrong"),
        )
        .await;
        assert_eq!(status, 401, "{method} {path} with a wrong token: {body}");
    }
    let (status, body) = send(plain.get(url("/healthz"))).await;
    assert_eq!((status, body), (200, Value::String("ok".into())));
    // The dashboard takes the token in its URL, since a browser opening it
    // cannot set a header.
    let (status, _) = send(plain.get(url(&format!("/?token={TOKEN}")))).await;
    assert_eq!(status, 200);
    let (status, body) = send(server.request(Method::GET, "/v1/jobs")).await;
    assert_eq!(status, 200, "{body}");

    // The OpenAPI document describes the routes.
    let (status, doc) = send(server.request(Method::GET, "/v1/openapi.json")).await;
    assert_eq!(status, 200);
    for path in [
        "/v1/components",
        "/v1/jobs",
        "/v1/jobs/{id}",
        "/v1/jobs/{id}/logs",
        "/v1/meshes",
        "/metrics",
        "/healthz",
    ] {
        assert!(
            doc["paths"].get(path).is_some(),
            "{path} missing from the OpenAPI document"
        );
    }
    assert!(
        doc["components"]["schemas"].get("JobInfo").is_some(),
        "{doc}"
    );
}

#[test]
fn the_server_refuses_to_listen_beyond_loopback_without_a_token() {
    let dir = Scratch::new("no-token");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data"])
        .arg(dir.0.join("data"))
        .output()
        .expect("run monarch-host serve");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("without a token"), "{stderr}");
}

#[tokio::test]
async fn jobs_succeed_fail_and_are_cancelled_and_their_logs_stream() {
    let dir = Scratch::new("jobs");
    let server = ServeProcess::start(&dir.0, &["--mesh", "workers=2", "--max-memory-mib", "512"]);
    let client = server.client();
    let hello = client
        .upload(program(env!("GUEST_HELLO")))
        .await
        .expect("upload")
        .id;
    let spin = client
        .upload(program(env!("GUEST_SPIN")))
        .await
        .expect("upload")
        .id;

    // On the persistent mesh: its actors are the job's, named for it.
    let on_mesh = client
        .submit(&job(
            &hello,
            &["2"],
            Some(MeshChoice::Name("workers".into())),
        ))
        .await
        .expect("submit");
    let mut lines = Vec::new();
    let end = client
        .follow_logs(on_mesh, |line| lines.push(line.to_string()))
        .await
        .expect("the log stream");
    assert_eq!(end.status, JobStatus::Succeeded, "{end:?} {lines:?}");
    assert_eq!(
        lines,
        [
            "[controller] 2 greetings from a mesh shaped hosts=1, gpus=2:",
            "[controller] rank 0: hello from rank 0 of 2",
            "[controller] rank 1: hello from rank 1 of 2",
        ]
    );
    let info = client.job(on_mesh).await.unwrap();
    assert_eq!(info.status, JobStatus::Succeeded);
    assert_eq!(info.mesh.as_deref(), Some("workers"));
    assert!(info.started_at_ms.is_some() && info.finished_at_ms.is_some());
    // The mesh outlived the job, and the job's actors are gone from it.
    let meshes = client.meshes().await.unwrap();
    assert_eq!(meshes.len(), 1);
    assert!(
        meshes[0].procs.iter().all(|p| p.state == "running"),
        "{meshes:?}"
    );
    assert!(meshes[0].actors.is_empty(), "{meshes:?}");

    // An actor that spins forever on the mesh is stopped with its job, so
    // the next job on the same procs runs at once (not after the spinning
    // job's deadline).
    let spinner = client
        .submit(&job(
            &spin,
            &["actor"],
            Some(MeshChoice::Name("workers".into())),
        ))
        .await
        .unwrap();
    let done = finished(&client, spinner, Duration::from_secs(30)).await;
    assert_eq!(done.status, JobStatus::Succeeded, "{done:?}");
    let started = Instant::now();
    let next = client
        .submit(&job(
            &hello,
            &["2"],
            Some(MeshChoice::Name("workers".into())),
        ))
        .await
        .unwrap();
    let next = finished(&client, next, Duration::from_secs(30)).await;
    assert_eq!(next.status, JobStatus::Succeeded, "{next:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    // On a fresh mesh of at most 2 procs: asking for 3 fails by name.
    let fresh = client
        .submit(&job(
            &hello,
            &["3"],
            Some(MeshChoice::Spec(MeshSpec { procs: 2 })),
        ))
        .await
        .unwrap();
    let failed = finished(&client, fresh, Duration::from_secs(60)).await;
    assert_eq!(failed.status, JobStatus::Failed);
    let error = failed.error.unwrap_or_default();
    assert!(error.contains("allows 2 procs"), "{error}");

    // `run` returning an error fails the job with it.
    let bad = client.submit(&job(&hello, &["many"], None)).await.unwrap();
    let failed = finished(&client, bad, Duration::from_secs(60)).await;
    assert_eq!(failed.status, JobStatus::Failed);
    assert!(
        failed
            .error
            .unwrap_or_default()
            .contains("`many` is not a number")
    );

    // A spinning controller is stopped by a cancel at its next epoch tick.
    let spinning = client.submit(&job(&spin, &[], None)).await.unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while client.job(spinning).await.unwrap().status != JobStatus::Running {
        assert!(Instant::now() < until, "the spinner never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cancelled_at = Instant::now();
    client.cancel(spinning).await.expect("cancel");
    let cancelled = finished(&client, spinning, Duration::from_secs(10)).await;
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(2),
        "{:?}",
        cancelled_at.elapsed()
    );
    assert_eq!(cancelled.status, JobStatus::Cancelled);
    assert_eq!(cancelled.error.as_deref(), Some("cancelled by a user"));
    // Its log says where it got to, and ends.
    let mut lines = Vec::new();
    let end = client
        .follow_logs(spinning, |l| lines.push(l.to_string()))
        .await
        .unwrap();
    assert_eq!(end.status, JobStatus::Cancelled);
    assert_eq!(
        lines.first().map(String::as_str),
        Some("[controller] the controller starts spinning")
    );
    // A finished job cannot be cancelled.
    let again = client.cancel(spinning).await.unwrap_err();
    assert!(
        again.contains("already finished") && again.contains("409"),
        "{again}"
    );

    // Limits over the server's caps are refused, naming the cap.
    let (status, body) = send(
        server
            .request(Method::POST, "/v1/jobs")
            .json(&json!({"component": hello, "limits": {"memory_mib": 4096}})),
    )
    .await;
    assert_eq!(status, 400);
    assert!(error_of(&body).contains("cap of 512"), "{body}");
    // Requests that name no component, or a path, or a missing mesh.
    for (request, want, says) in [
        (
            json!({"component": "../../etc/passwd"}),
            400,
            "not a component id",
        ),
        (json!({"component": "0".repeat(64)}), 404, "upload it first"),
        (
            json!({"component": hello, "mesh": "nope"}),
            404,
            "no persistent mesh",
        ),
        (
            json!({"component": hello, "mesh": "../x"}),
            400,
            "bad mesh name",
        ),
        (
            json!({"component": hello, "colour": "red"}),
            400,
            "unknown field",
        ),
    ] {
        let (status, body) = send(server.request(Method::POST, "/v1/jobs").json(&request)).await;
        assert_eq!(status, want, "{request}: {body}");
        assert!(error_of(&body).contains(says), "{request}: {body}");
    }
    let (status, body) = send(server.request(Method::GET, "/v1/jobs/../state.db")).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = send(server.request(Method::GET, "/v1/jobs/abc")).await;
    assert_eq!(status, 400, "{body}");

    let (_, metrics) = send(server.request(Method::GET, "/metrics")).await;
    let metrics = metrics.as_str().unwrap().to_string();
    for line in [
        "monarch_jobs_finished_total{status=\"succeeded\"} 3",
        "monarch_jobs_finished_total{status=\"failed\"} 2",
        "monarch_jobs_finished_total{status=\"cancelled\"} 1",
        "monarch_mesh_procs{state=\"running\"} 2",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

#[tokio::test]
async fn a_restart_keeps_components_and_history_and_fails_what_was_running() {
    let dir = Scratch::new("restart");
    let mut server = ServeProcess::start(&dir.0, &[]);
    let client = server.client();
    let hello = client
        .upload(program(env!("GUEST_HELLO")))
        .await
        .unwrap()
        .id;
    let spin = client.upload(program(env!("GUEST_SPIN"))).await.unwrap().id;
    let done = client.submit(&job(&hello, &["1"], None)).await.unwrap();
    assert_eq!(
        finished(&client, done, Duration::from_secs(60))
            .await
            .status,
        JobStatus::Succeeded
    );
    let running = client.submit(&job(&spin, &[], None)).await.unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while client.job(running).await.unwrap().status != JobStatus::Running {
        assert!(Instant::now() < until, "the spinner never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A crash: no chance to record anything.
    server.kill();

    let server = ServeProcess::start(&dir.0, &[]);
    let client = server.client();
    let kept = client.job(done).await.unwrap();
    assert_eq!(kept.status, JobStatus::Succeeded);
    assert_eq!(kept.args, ["1"]);
    let lost = client.job(running).await.unwrap();
    assert_eq!(lost.status, JobStatus::Failed);
    assert_eq!(lost.error.as_deref(), Some("server restarted"));
    // Logs survive too.
    let mut lines = Vec::new();
    client
        .follow_logs(done, |l| lines.push(l.to_string()))
        .await
        .unwrap();
    assert_eq!(lines.len(), 2, "{lines:?}");
    // The component is still there: it runs without being uploaded again,
    // and new jobs get new ids.
    let again = client.submit(&job(&hello, &["1"], None)).await.unwrap();
    assert!(again > running);
    assert_eq!(
        finished(&client, again, Duration::from_secs(60))
            .await
            .status,
        JobStatus::Succeeded
    );
    assert_eq!(client.jobs(10).await.unwrap().len(), 3);
}

#[tokio::test]
async fn the_cli_submits_follows_lists_and_cancels() {
    let dir = Scratch::new("cli");
    let server = ServeProcess::start(&dir.0, &["--mesh", "workers=2"]);
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
            .args(args)
            .env("MONARCH_SERVER", &server.base)
            .env("MONARCH_TOKEN_FILE", dir.0.join("token"))
            .output()
            .expect("run the CLI");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let hello = env!("GUEST_HELLO");
    let (code, stdout, stderr) =
        cli(&["submit", hello, "--mesh", "workers", "--follow", "--", "2"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("[controller] rank 1: hello from rank 1 of 2"),
        "{stdout}"
    );
    // A failing job fails the command, with the reason.
    let (code, _, stderr) = cli(&["submit", hello, "--follow", "--", "many"]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("failed") && stderr.contains("`many` is not a number"),
        "{stderr}"
    );
    // Without --follow it prints the id.
    let (code, stdout, stderr) = cli(&["submit", env!("GUEST_SPIN")]);
    assert_eq!(code, Some(0), "{stderr}");
    let id: u64 = stdout.trim().parse().expect("a job id");
    let (code, stdout, _) = cli(&["jobs"]);
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("succeeded") && stdout.contains("workers"),
        "{stdout}"
    );
    let (code, _, stderr) = cli(&["cancel", &id.to_string()]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, _, stderr) = cli(&["logs", &id.to_string()]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("cancelled"), "{stderr}");
    // Bad input gets a clear error.
    let (code, _, stderr) = cli(&["logs", "999"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("no job 999"), "{stderr}");
    let (code, _, stderr) = cli(&["jobs", "--server", "http://127.0.0.1:1"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("cannot reach the server"), "{stderr}");
    let (code, _, stderr) = cli(&["submit", "/nonexistent.wasm"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("cannot read /nonexistent.wasm"), "{stderr}");
}

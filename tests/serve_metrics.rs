//! The metrics of `monarch-host serve` end to end: a real server with a
//! persistent mesh of two procs, jobs that spin on its procs and call its
//! actors, and what `/v1/metrics/series`, `/v1/metrics/stream` and
//! `/v1/jobs/{id}/actors` say of them.

#[path = "support/serve.rs"]
mod serve_support;

use std::time::{Duration, Instant};

use monarch_host::serve::api::{JobRequest, JobStatus, MeshChoice};
use reqwest::Method;
use serde_json::Value;
use serve_support::{Scratch, ServeProcess, finished, send};

fn program(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn on_workers(component: &str, args: &[&str]) -> JobRequest {
    JobRequest {
        component: component.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
        mesh: Some(MeshChoice::Name("workers".into())),
        ..Default::default()
    }
}

/// The first `event: sample` of the metrics stream, within `within`.
async fn first_sample(server: &ServeProcess, within: Duration) -> Value {
    let mut response = server
        .request(Method::GET, "/v1/metrics/stream")
        .send()
        .await
        .expect("the stream");
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let until = tokio::time::Instant::now() + within;
    let mut text = String::new();
    loop {
        let chunk = tokio::time::timeout_at(until, response.chunk())
            .await
            .unwrap_or_else(|_| panic!("no sample within {within:?}; got {text:?}"))
            .expect("the stream's bytes")
            .unwrap_or_else(|| panic!("the stream ended; got {text:?}"));
        text.push_str(&String::from_utf8_lossy(&chunk));
        // An event ends with a blank line.
        while let Some(end) = text.find("\n\n") {
            let event: String = text.drain(..end + 2).collect();
            if !event.lines().any(|l| l == "event: sample") {
                continue;
            }
            let data: String = event
                .lines()
                .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                .collect();
            return serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}"));
        }
    }
}

fn f64_of(value: &Value) -> f64 {
    value.as_f64().unwrap_or(0.0)
}

#[tokio::test]
async fn series_show_each_procs_cpu_and_memory_the_calls_and_the_jobs() {
    let dir = Scratch::new("metrics");
    let server = ServeProcess::start(&dir.0, &["--mesh", "workers=2"]);
    let client = server.client();
    let spin = client.upload(program(env!("GUEST_SPIN"))).await.unwrap().id;
    let semantics = client
        .upload(program(env!("GUEST_SEMANTICS")))
        .await
        .unwrap()
        .id;

    // The stream samples every second, from the start.
    let sample = first_sample(&server, Duration::from_secs(10)).await;
    assert_eq!(sample["interval_ms"], 1000, "{sample}");
    let procs = sample["procs"].as_array().expect("procs");
    assert_eq!(procs.len(), 2, "{sample}");
    assert!(
        procs
            .iter()
            .all(|p| p["points"].as_array().map(Vec::len) == Some(1)),
        "{sample}"
    );

    // Each proc of the mesh spins for two seconds (one job per rank), and
    // jobs call an actor mesh on them.
    let mut spinners = Vec::new();
    for rank in ["0", "1"] {
        let job = on_workers(&spin, &["stacks", "2", rank, "2"]);
        spinners.push(client.submit(&job).await.expect("submit"));
    }
    let mut echoes = Vec::new();
    for _ in 0..3 {
        let id = client
            .submit(&on_workers(&semantics, &["echo", "2"]))
            .await
            .expect("submit");
        let done = finished(&client, id, Duration::from_secs(60)).await;
        assert_eq!(done.status, JobStatus::Succeeded, "{done:?}");
        echoes.push(id);
    }
    for id in spinners {
        let done = finished(&client, id, Duration::from_secs(60)).await;
        assert_eq!(done.status, JobStatus::Succeeded, "{done:?}");
    }
    let echo = echoes[0];
    let info = client.job(echo).await.unwrap();
    assert!(info.duration_ms.is_some_and(|d| d > 0), "{info:?}");
    // The sampler takes the last calls within a second.
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let (status, series) = send(server.request(Method::GET, "/v1/metrics/series")).await;
    assert_eq!(status, 200, "{series}");
    let procs = series["procs"].as_array().expect("procs");
    for rank in [0, 1] {
        let proc = procs
            .iter()
            .find(|p| p["mesh"] == "workers" && p["rank"] == rank)
            .unwrap_or_else(|| panic!("no series of workers[{rank}]: {series}"));
        assert!(proc["pid"].as_u64().is_some(), "{proc}");
        let points = proc["points"].as_array().expect("points");
        assert!(points.len() >= 3, "{proc}");
        assert!(
            points.iter().any(|p| f64_of(&p["cpu_pct"]) > 0.0),
            "workers[{rank}] never used the CPU: {proc}"
        );
        assert!(
            points.iter().all(|p| p["rss_bytes"].as_u64() > Some(0)),
            "{proc}"
        );
    }
    let meshes = series["meshes"].as_array().expect("meshes");
    for id in &echoes {
        let mesh = meshes
            .iter()
            .find(|m| m["job"] == *id && m["mesh"] == "workers")
            .unwrap_or_else(|| panic!("no series of job {id}'s actor mesh: {series}"));
        let called = mesh["points"]
            .as_array()
            .expect("points")
            .iter()
            .find(|p| f64_of(&p["calls_per_s"]) > 0.0)
            .unwrap_or_else(|| panic!("job {id}'s calls are not counted: {mesh}"));
        assert_eq!(called["msgs_out"], 2, "{called}");
        assert_eq!(called["msgs_in"], 2, "{called}");
        assert_eq!(called["errors"], 0, "{called}");
        assert!(f64_of(&called["p50_ms"]) > 0.0, "{called}");
        assert!(
            f64_of(&called["p99_ms"]) >= f64_of(&called["p50_ms"]),
            "{called}"
        );
    }
    let jobs = series["jobs"].as_array().expect("jobs");
    let job = jobs
        .iter()
        .find(|j| j["id"] == echo)
        .unwrap_or_else(|| panic!("no job {echo}: {series}"));
    assert_eq!(job["status"], "succeeded", "{job}");
    assert!(job["duration_ms"].as_i64() > Some(0), "{job}");
    assert!(job["ended_at_ms"].as_i64().is_some(), "{job}");

    // Selecting one job leaves the procs of the persistent mesh out.
    let (status, one) =
        send(server.request(Method::GET, &format!("/v1/metrics/series?job={echo}"))).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["procs"].as_array().map(Vec::len), Some(0), "{one}");
    assert_eq!(one["meshes"].as_array().map(Vec::len), Some(1), "{one}");
    assert_eq!(one["jobs"].as_array().map(Vec::len), Some(1), "{one}");
    // Since now: nothing yet.
    let later = series["now_ms"].as_i64().unwrap() + 60_000;
    let (status, none) = send(server.request(
        Method::GET,
        &format!("/v1/metrics/series?since_ms={later}&mesh=workers"),
    ))
    .await;
    assert_eq!(status, 200, "{none}");
    assert_eq!(none["procs"].as_array().map(Vec::len), Some(0), "{none}");

    for bad in ["since_ms=yesterday", "job=seven", "mesh=", "colour=blue"] {
        let path = format!("/v1/metrics/series?{bad}");
        let (status, body) = send(server.request(Method::GET, &path)).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{body}"
        );
        let path = format!("/v1/metrics/stream?{bad}");
        let (status, _) = send(server.request(Method::GET, &path)).await;
        assert_eq!(status, 400, "{bad}");
    }

    // The job's actor mesh, stopped with its job.
    let (status, actors) =
        send(server.request(Method::GET, &format!("/v1/jobs/{echo}/actors"))).await;
    assert_eq!(status, 200, "{actors}");
    let actors = actors.as_array().expect("a list").clone();
    assert_eq!(actors.len(), 1, "{actors:?}");
    assert_eq!(actors[0]["mesh"], "workers");
    assert_eq!(actors[0]["class"], "Worker");
    let ranks = actors[0]["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 2, "{actors:?}");
    assert!(ranks.iter().all(|r| r["state"] == "stopped"), "{actors:?}");

    // The new names are in the OpenAPI document and in /metrics; the old
    // ones stay.
    let (_, doc) = send(server.request(Method::GET, "/v1/openapi.json")).await;
    for path in [
        "/v1/metrics/series",
        "/v1/metrics/stream",
        "/v1/jobs/{id}/actors",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path}");
    }
    let text = server
        .request(Method::GET, "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "monarch_jobs_submitted_total",
        "monarch_mesh_procs",
        "monarch_proc_cpu_percent",
        "monarch_proc_resident_bytes",
        "monarch_actor_mesh_calls_per_second",
    ] {
        assert!(text.contains(name), "{name} not in {text}");
    }
}

#[tokio::test]
async fn a_failed_rank_shows_its_reason_endpoint_and_dump() {
    let dir = Scratch::new("metrics-failed");
    let server = ServeProcess::start(&dir.0, &["--mesh", "workers=2"]);
    let client = server.client();
    let semantics = client
        .upload(program(env!("GUEST_SEMANTICS")))
        .await
        .unwrap()
        .id;
    // One actor traps in its `trap` endpoint; the controller expects it.
    let id = client
        .submit(&on_workers(&semantics, &["trap-once"]))
        .await
        .expect("submit");
    let done = finished(&client, id, Duration::from_secs(60)).await;
    assert_eq!(done.status, JobStatus::Succeeded, "{done:?}");

    let started = Instant::now();
    let failed = loop {
        let (status, actors) =
            send(server.request(Method::GET, &format!("/v1/jobs/{id}/actors"))).await;
        assert_eq!(status, 200, "{actors}");
        let failed = actors.as_array().and_then(|meshes| {
            meshes
                .iter()
                .flat_map(|m| m["ranks"].as_array().cloned().unwrap_or_default())
                .find(|r| r["state"] == "failed")
        });
        match failed {
            Some(rank) => break rank,
            None => assert!(
                started.elapsed() < Duration::from_secs(10),
                "no failed rank: {actors}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(failed["rank"], 0, "{failed}");
    let reason = failed["reason"].as_str().expect("a reason");
    assert!(
        reason.contains("unreachable") || reason.contains("trap"),
        "{reason}"
    );
    assert_eq!(failed["endpoint"], "trap", "{failed}");
    let dump = failed["dump"].as_str().expect("a dump");
    assert!(dump.starts_with(&format!("/v1/jobs/{id}/dumps/")), "{dump}");
    let (status, _) = send(server.request(Method::GET, dump)).await;
    assert_eq!(status, 200, "{dump}");

    // Bad ids and unknown jobs.
    let (status, _) = send(server.request(Method::GET, "/v1/jobs/x/actors")).await;
    assert_eq!(status, 400);
    let (status, _) = send(server.request(Method::GET, "/v1/jobs/999/actors")).await;
    assert_eq!(status, 404);
}

//! `monarch-host serve` state that survives restarts and dead procs, end to
//! end with a real server process:
//! - PM-1: persistent meshes (`--mesh` and `POST /v1/meshes`) come back
//!   after a `kill -9` of the server, with new procs; the job that ran on
//!   one at the kill is marked; a deleted mesh does not come back; a
//!   persistent actor mesh on one is listed as lost, not restored;
//! - PM-2: a proc of a persistent mesh killed with `kill -9` is replaced at
//!   its rank, and jobs on the mesh run again;
//! - JR-1, JR-2: jobs queued at a `kill -9` run after the restart, in their
//!   order; the one that was running is failed "server restarted".

#[path = "support/serve.rs"]
mod serve_support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use monarch_host::serve::api::{JobRequest, JobStatus, MeshChoice};
use monarch_host::serve::client::ApiClient;
use reqwest::Method;
use serde_json::{Value, json};
use serve_support::{Scratch, ServeProcess, finished, send};

fn program(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn job(component: &str, args: &[&str], mesh: Option<&str>) -> JobRequest {
    JobRequest {
        component: component.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
        mesh: mesh.map(|m| MeshChoice::Name(m.to_string())),
        ..Default::default()
    }
}

/// Waits until job `id` runs.
async fn running(client: &ApiClient, id: u64) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let job = client.job(id).await.expect("the job");
        match job.status {
            JobStatus::Running => return,
            JobStatus::Queued => {}
            other => panic!("job {id} ended ({other:?}) before it was seen running: {job:?}"),
        }
        assert!(Instant::now() < until, "job {id} never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `hello 2` on the persistent mesh `mesh`, which must succeed.
async fn hello_runs_on(client: &ApiClient, hello: &str, mesh: &str) {
    let id = client
        .submit(&job(hello, &["2"], Some(mesh)))
        .await
        .expect("a job on the mesh");
    let done = finished(client, id, Duration::from_secs(120)).await;
    assert_eq!(
        done.status,
        JobStatus::Succeeded,
        "hello on `{mesh}`: {done:?}"
    );
}

/// The persistent mesh `name` as `GET /v1/meshes` lists it, if it does.
async fn mesh(server: &ServeProcess, name: &str) -> Option<Value> {
    let (status, body) = send(server.request(Method::GET, "/v1/meshes")).await;
    assert_eq!(status, 200, "{body}");
    body["meshes"]
        .as_array()
        .expect("meshes")
        .iter()
        .find(|m| m["name"] == name && m["persistent"] == true)
        .cloned()
}

/// The pids of a listed mesh's procs, each running.
fn live_pids(mesh: &Value) -> Vec<u32> {
    mesh["procs"]
        .as_array()
        .expect("procs")
        .iter()
        .map(|p| {
            assert_eq!(p["state"], "running", "{mesh}");
            p["pid"]
                .as_u64()
                .unwrap_or_else(|| panic!("no pid: {mesh}")) as u32
        })
        .collect()
}

/// Waits for `text` in the server's log.
fn wait_for_log(server: &ServeProcess, text: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    while !server.log_text().contains(text) {
        assert!(
            Instant::now() < until,
            "no `{text}` in the server's log:\n{}",
            server.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn pm_1_persistent_meshes_come_back_after_kill_9_until_deleted() {
    let dir = Scratch::new("restore-meshes");
    let args = ["--mesh", "workers=2"];
    let mut server = ServeProcess::start(&dir.0, &args);
    let client = server.client();
    let hello = client
        .upload(program(env!("GUEST_HELLO")))
        .await
        .unwrap()
        .id;
    let spin = client.upload(program(env!("GUEST_SPIN"))).await.unwrap().id;
    let (status, body) = send(
        server
            .request(Method::POST, "/v1/meshes")
            .json(&json!({"name": "mine", "procs": 2})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    hello_runs_on(&client, &hello, "workers").await;
    hello_runs_on(&client, &hello, "mine").await;
    let mut before: HashSet<u32> = HashSet::new();
    for name in ["workers", "mine"] {
        let listed = mesh(&server, name).await.expect("the mesh");
        before.extend(live_pids(&listed));
    }
    // A persistent actor mesh on `workers`, recorded within a second.
    let persist = client
        .upload(program(env!("GUEST_PERSIST")))
        .await
        .unwrap()
        .id;
    let spawned = client
        .submit(&job(&persist, &["spawn", "counter", "2"], Some("workers")))
        .await
        .unwrap();
    let done = finished(&client, spawned, Duration::from_secs(120)).await;
    assert_eq!(done.status, JobStatus::Succeeded, "{done:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let spinning = client
        .submit(&job(&spin, &[], Some("workers")))
        .await
        .unwrap();
    running(&client, spinning).await;
    // A crash: the server records nothing more.
    server.kill();

    let mut server = ServeProcess::start(&dir.0, &args);
    let client = server.client();
    for name in ["workers", "mine"] {
        let listed = mesh(&server, name)
            .await
            .unwrap_or_else(|| panic!("`{name}` did not come back: {}", server.log_text()));
        let pids = live_pids(&listed);
        assert_eq!(pids.len(), 2, "{listed}");
        assert!(
            pids.iter().all(|pid| !before.contains(pid)),
            "`{name}` has procs of before the restart: {listed}"
        );
        hello_runs_on(&client, &hello, name).await;
    }
    let log = server.log_text();
    assert!(
        log.contains("restored persistent mesh workers (2 procs)")
            && log.contains("restored persistent mesh mine (2 procs)"),
        "{log}"
    );
    // The --mesh flag of a restored mesh does not make a second one.
    let (_, body) = send(server.request(Method::GET, "/v1/meshes")).await;
    let named_workers = body["meshes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["name"] == "workers")
        .count();
    assert_eq!(named_workers, 1, "{body}");
    // The job that ran at the kill is marked, naming its mesh.
    let lost = client.job(spinning).await.unwrap();
    assert_eq!(lost.status, JobStatus::Failed);
    let error = lost.error.unwrap_or_default();
    assert!(
        error.starts_with("server restarted") && error.contains("`workers`"),
        "{error}"
    );

    // The persistent actor mesh is not restored: the API says it was lost
    // with the restart, and a lookup finds nothing.
    let (_, body) = send(server.request(Method::GET, "/v1/meshes")).await;
    let counter = body["actor_meshes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "counter")
        .unwrap_or_else(|| panic!("the lost counter is not listed: {body}"))
        .clone();
    assert_eq!(counter["state"], "lost", "{counter}");
    assert_eq!(counter["mesh"], "workers", "{counter}");
    assert!(
        counter["reason"]
            .as_str()
            .is_some_and(|r| r.contains("lost with the server's restart")),
        "{counter}"
    );
    let lookup = client
        .submit(&job(&persist, &["lookup", "counter"], Some("workers")))
        .await
        .unwrap();
    let mut lines = Vec::new();
    client
        .follow_logs(lookup, |line| lines.push(line.to_string()))
        .await
        .unwrap();
    assert!(
        lines.iter().any(|l| l.contains("lookup failed")),
        "{lines:?}"
    );
    // DELETE forgets a lost one.
    let (status, body) = send(server.request(Method::DELETE, "/v1/meshes/counter")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "lost", "{body}");
    let (_, body) = send(server.request(Method::GET, "/v1/meshes")).await;
    assert_eq!(body["actor_meshes"], json!([]), "{body}");

    // A deleted mesh stays deleted; the other comes back again.
    let (status, body) = send(server.request(Method::DELETE, "/v1/meshes/mine")).await;
    assert_eq!(status, 200, "{body}");
    server.kill();
    let server = ServeProcess::start(&dir.0, &args);
    assert!(
        mesh(&server, "mine").await.is_none(),
        "{}",
        server.log_text()
    );
    assert!(mesh(&server, "workers").await.is_some());
    hello_runs_on(&server.client(), &hello, "workers").await;
}

#[tokio::test]
async fn pm_2_a_killed_proc_of_a_persistent_mesh_is_replaced_at_its_rank() {
    let dir = Scratch::new("restore-replace");
    let server = ServeProcess::start(&dir.0, &["--mesh", "workers=2"]);
    let client = server.client();
    let hello = client
        .upload(program(env!("GUEST_HELLO")))
        .await
        .unwrap()
        .id;
    hello_runs_on(&client, &hello, "workers").await;
    let listed = mesh(&server, "workers").await.expect("the mesh");
    let pids = live_pids(&listed);
    // SAFETY: kill(2) of a proc the server started for this test.
    let killed = unsafe { libc::kill(pids[1] as i32, libc::SIGKILL) };
    assert_eq!(killed, 0, "kill {}", pids[1]);
    let until = Instant::now() + Duration::from_secs(30);
    let replaced = loop {
        let listed = mesh(&server, "workers").await.expect("the mesh");
        if listed["procs"][1]["replaced"] == 1 && listed["procs"][1]["state"] == "running" {
            break listed;
        }
        assert!(
            Instant::now() < until,
            "rank 1 was not replaced: {listed}\n{}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let now = live_pids(&replaced);
    assert_eq!(now[0], pids[0], "rank 0 was left alone: {replaced}");
    assert_ne!(now[1], pids[1], "rank 1 has a new proc: {replaced}");
    assert_eq!(replaced["replaced"], 1, "{replaced}");
    assert_eq!(replaced["last_replacement"]["rank"], 1, "{replaced}");
    wait_for_log(&server, "persistent mesh workers: proc 1 died");
    assert!(
        server.log_text().contains("; replaced"),
        "{}",
        server.log_text()
    );
    hello_runs_on(&client, &hello, "workers").await;
}

#[tokio::test]
async fn jr_1_jobs_queued_at_kill_9_run_after_the_restart_in_their_order() {
    let dir = Scratch::new("restore-queue");
    let args = ["--max-jobs", "1"];
    let mut server = ServeProcess::start(&dir.0, &args);
    let client = server.client();
    let hello = client
        .upload(program(env!("GUEST_HELLO")))
        .await
        .unwrap()
        .id;
    let spin = client.upload(program(env!("GUEST_SPIN"))).await.unwrap().id;
    let spinning = client.submit(&job(&spin, &[], None)).await.unwrap();
    running(&client, spinning).await;
    let mut queued = Vec::new();
    for n in ["1", "2", "3"] {
        queued.push(client.submit(&job(&hello, &[n], None)).await.unwrap());
    }
    for id in &queued {
        assert_eq!(client.job(*id).await.unwrap().status, JobStatus::Queued);
    }
    server.kill();

    let server = ServeProcess::start(&dir.0, &args);
    let client = server.client();
    // JR-2: what ran may have had effects: failed, not run again.
    let lost = client.job(spinning).await.unwrap();
    assert_eq!(lost.status, JobStatus::Failed);
    assert_eq!(lost.error.as_deref(), Some("server restarted"));
    let mut started = Vec::new();
    for (id, n) in queued.iter().zip(["1", "2", "3"]) {
        let done = finished(&client, *id, Duration::from_secs(120)).await;
        assert_eq!(done.status, JobStatus::Succeeded, "{done:?}");
        assert_eq!(done.args, [n], "{done:?}");
        started.push(done.started_at_ms.expect("a start"));
    }
    // In the order they were submitted (one slot: --max-jobs 1).
    assert!(
        started.windows(2).all(|pair| pair[0] <= pair[1]),
        "out of order: {started:?}"
    );
    wait_for_log(&server, "requeued 3 jobs submitted before the restart");
}

//! `monarch-host serve` for many users: principals from a tokens file,
//! what each sees (PR-3, HA-1, HA-3), quotas and rates (QU-1, QU-2), and
//! limits on slow or large requests (LS-1, HA-2). A real server process,
//! driven over HTTP and raw TCP.

#[path = "support/serve.rs"]
mod serve_support;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use serve_support::{Scratch, ServeProcess, send};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ADMIN: &str = "admin-token-0123456789abcdef";
const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef01";

/// An admin, alice (one unfinished job at most) and bob (4 procs at most).
fn tokens() -> String {
    format!(
        "# the principals of the tenants test\n\
         ops    admin {ADMIN}\n\
         \n\
         alice  user  {ALICE} max_jobs=1\n\
         bob    user  {BOB}   max_procs=4\n"
    )
}

fn program(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn error_of(body: &Value) -> &str {
    body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error in {body}"))
}

struct As<'a> {
    server: &'a ServeProcess,
    token: &'static str,
}

impl As<'_> {
    async fn get(&self, path: &str) -> (u16, Value) {
        send(self.server.request_as(self.token, Method::GET, path)).await
    }

    async fn delete(&self, path: &str) -> (u16, Value) {
        send(self.server.request_as(self.token, Method::DELETE, path)).await
    }

    async fn upload(&self, bytes: Vec<u8>) -> (u16, Value) {
        send(
            self.server
                .request_as(self.token, Method::POST, "/v1/components")
                .header("content-type", "application/wasm")
                .body(bytes),
        )
        .await
    }

    async fn submit(&self, request: Value) -> (u16, Value) {
        send(
            self.server
                .request_as(self.token, Method::POST, "/v1/jobs")
                .json(&request),
        )
        .await
    }

    async fn job_ids(&self) -> Vec<u64> {
        let (status, list) = self.get("/v1/jobs").await;
        assert_eq!(status, 200, "{list}");
        list["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .map(|j| j["id"].as_u64().expect("an id"))
            .collect()
    }

    async fn wait_status(&self, id: u64, wanted: &str) -> Value {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, job) = self.get(&format!("/v1/jobs/{id}")).await;
            assert_eq!(status, 200, "{job}");
            if job["status"] == wanted {
                return job;
            }
            assert!(Instant::now() < until, "job {id} never {wanted}: {job}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn pr_3_users_see_and_act_on_their_own_and_an_admin_on_all() {
    let dir = Scratch::new("tenants");
    let server = ServeProcess::start_with_tokens(&dir.0, &tokens(), &[]);
    let [admin, alice, bob] = [ADMIN, ALICE, BOB].map(|token| As {
        server: &server,
        token,
    });
    for (who, name, role) in [(&admin, "ops", "admin"), (&alice, "alice", "user")] {
        let (status, me) = who.get("/v1/principal").await;
        assert_eq!(status, 200, "{me}");
        assert_eq!(
            (me["name"].as_str(), me["role"].as_str()),
            (Some(name), Some(role))
        );
    }
    let (status, _) = send(server.request_as("not-a-token", Method::GET, "/v1/jobs")).await;
    assert_eq!(status, 401);

    // HA-3: alice's component is not bob's to run, nor listed for him,
    // until he uploads the same bytes himself.
    let spin = program(env!("GUEST_SPIN"));
    let (status, uploaded) = alice.upload(spin.clone()).await;
    assert_eq!(status, 201, "{uploaded}");
    let spin_id = uploaded["id"].as_str().expect("an id").to_string();
    let spin_job = json!({"component": spin_id, "limits": {"procs": 2}});
    let (status, refused) = bob.submit(spin_job.clone()).await;
    assert_eq!(status, 404, "{refused}");
    assert!(
        error_of(&refused).contains("uploaded by principal `bob`"),
        "{refused}"
    );
    let (_, listed) = bob.get("/v1/components").await;
    assert_eq!(listed["components"], json!([]), "{listed}");
    let (status, again) = bob.upload(spin.clone()).await;
    assert_eq!(status, 201, "{again}");
    assert_eq!(again["id"], spin_id.as_str());
    assert_eq!(again["existing"], false, "another's upload is not told");

    // Each runs a job; each lists only its own, the admin both.
    let (status, created) = alice.submit(spin_job.clone()).await;
    assert_eq!(status, 201, "{created}");
    let a = created["id"].as_u64().unwrap();
    let (status, created) = bob.submit(spin_job.clone()).await;
    assert_eq!(status, 201, "{created}");
    let b = created["id"].as_u64().unwrap();
    assert_eq!(alice.job_ids().await, vec![a]);
    assert_eq!(bob.job_ids().await, vec![b]);
    assert_eq!(admin.job_ids().await, vec![b, a]);
    let (_, job) = admin.get(&format!("/v1/jobs/{a}")).await;
    assert_eq!(job["owner"], "alice", "{job}");

    // HA-1: another's job is 403 with the reason, on every route of it.
    for (method, path) in [
        (Method::GET, format!("/v1/jobs/{a}")),
        (Method::GET, format!("/v1/jobs/{a}/logs")),
        (Method::GET, format!("/v1/jobs/{a}/stacks")),
        (Method::GET, format!("/v1/jobs/{a}/dumps")),
        (Method::DELETE, format!("/v1/jobs/{a}")),
    ] {
        let (status, body) = send(server.request_as(BOB, method.clone(), &path)).await;
        assert_eq!(status, 403, "{method} {path}: {body}");
        assert_eq!(
            error_of(&body),
            format!("job {a} belongs to another principal"),
            "{method} {path}"
        );
    }
    // The CLI shows the reason and the status.
    let bob_token = dir.0.join("bob-token");
    std::fs::write(&bob_token, format!("{BOB}\n")).unwrap();
    let cancel = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args([
            "cancel",
            &a.to_string(),
            "--server",
            &server.base,
            "--token-file",
        ])
        .arg(&bob_token)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&cancel.stderr);
    assert!(!cancel.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "job {a} belongs to another principal (403 Forbidden)"
        )),
        "{stderr}"
    );
    let (status, body) = bob.get("/metrics").await;
    assert_eq!(status, 403, "{body}");
    assert!(error_of(&body).contains("admin"), "{body}");
    let (status, _) = admin.get("/metrics").await;
    assert_eq!(status, 200);

    // QU-2: over a quota is 429 naming it, its use and its cap, and
    // nothing is stored.
    let (status, refused) = alice.submit(spin_job.clone()).await;
    assert_eq!(status, 429, "{refused}");
    let why = error_of(&refused);
    assert!(
        why.contains("jobs quota of principal `alice`")
            && why.contains("holds 1 unfinished job")
            && why.contains("max_jobs=1"),
        "{why}"
    );
    let (status, refused) = bob
        .submit(json!({"component": spin_id, "limits": {"procs": 8}}))
        .await;
    assert_eq!(status, 429, "{refused}");
    let why = error_of(&refused);
    assert!(
        why.contains("procs quota of principal `bob`")
            && why.contains("holds 2 proc(s) and asks for 8")
            && why.contains("max_procs=4"),
        "{why}"
    );
    assert_eq!(
        admin.job_ids().await,
        vec![b, a],
        "a refused job is not stored"
    );
    let (_, me) = alice.get("/v1/principal").await;
    assert_eq!(
        (me["jobs"].as_u64(), me["max_jobs"].as_u64()),
        (Some(1), Some(1)),
        "{me}"
    );

    // HA-2: a JSON body over the limit is 413, with a reason.
    let big = json!({"component": spin_id, "args": ["x".repeat(70 << 10)]});
    let (status, refused) = alice.submit(big).await;
    assert_eq!(status, 413, "{refused}");
    assert!(error_of(&refused).contains("larger than"), "{refused}");

    // The admin cancels both.
    alice.wait_status(a, "running").await;
    for id in [a, b] {
        let (status, body) = admin.delete(&format!("/v1/jobs/{id}")).await;
        assert_eq!(status, 202, "{body}");
    }
    let cancelled = alice.wait_status(a, "cancelled").await;
    assert_eq!(
        cancelled["error"], "cancelled by the admin `ops`",
        "{cancelled}"
    );
    bob.wait_status(b, "cancelled").await;
    // Its job ended, alice is under her quota again.
    let (status, created) = alice.submit(spin_job).await;
    assert_eq!(status, 201, "{created}");
    let c = created["id"].as_u64().unwrap();
    let (status, _) = alice.delete(&format!("/v1/jobs/{c}")).await;
    assert_eq!(status, 202);
    alice.wait_status(c, "cancelled").await;
}

#[tokio::test]
async fn qu_1_a_principal_over_its_rate_gets_429_with_retry_after() {
    let dir = Scratch::new("tenants-rate");
    let server = ServeProcess::start_with_tokens(
        &dir.0,
        &tokens(),
        &["--rate-limit", "0.5", "--rate-burst", "5"],
    );
    let mut answered = Vec::new();
    for _ in 0..8 {
        let response = server
            .request_as(ALICE, Method::GET, "/v1/principal")
            .send()
            .await
            .expect("an answer");
        let status = response.status().as_u16();
        let retry = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let body: Value = response.json().await.expect("JSON");
        answered.push((status, retry, body));
    }
    assert!(
        answered[..5].iter().all(|(s, _, _)| *s == 200),
        "{answered:?}"
    );
    let (status, retry, body) = &answered[7];
    assert_eq!(*status, 429, "{answered:?}");
    assert!(retry.is_some_and(|s| (1..=2).contains(&s)), "{answered:?}");
    assert!(
        error_of(body).contains("principal `alice`") && error_of(body).contains("--rate-limit"),
        "{body}"
    );
    // Another principal has its own bucket.
    let (status, _) = send(server.request_as(BOB, Method::GET, "/v1/principal")).await;
    assert_eq!(status, 200);
}

/// Reads what the server sends on `stream` until it closes it; the bytes,
/// and how long that took. Fails past `within`.
async fn until_closed(stream: &mut tokio::net::TcpStream, within: Duration) -> (String, Duration) {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buffer = [0u8; 1024];
    loop {
        match tokio::time::timeout(within, stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buffer[..n]),
            Err(_) => panic!("the server kept the connection open past {within:?}"),
        }
    }
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

/// Sends `path` a request whose body (200 bytes promised) comes a byte
/// every 300 ms, half of it, then nothing; the answer, and how long it
/// took after the headers.
async fn trickled_body(addr: &str, path: &str, content_type: &str) -> (String, Duration) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\nContent-Type: {content_type}\r\nContent-Length: 200\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let (mut reader, mut writer) = stream.split();
    let write = async {
        for _ in 0..100 {
            if writer.write_all(b" ").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        // 100 bytes of the 200 promised: the rest never comes.
        std::future::pending::<()>().await
    };
    let read = async {
        let mut got = Vec::new();
        let mut buffer = [0u8; 1024];
        while !String::from_utf8_lossy(&got).contains("--body-timeout") {
            match tokio::time::timeout(Duration::from_secs(10), reader.read(&mut buffer)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => got.extend_from_slice(&buffer[..n]),
                Err(_) => panic!("no answer to the slow body of {path} within 10 s"),
            }
        }
        (
            String::from_utf8_lossy(&got).into_owned(),
            started.elapsed(),
        )
    };
    tokio::select! {
        answer = read => answer,
        () = write => unreachable!(),
    }
}

#[tokio::test]
async fn ls_1_slow_headers_and_slow_bodies_are_cut_off_while_others_are_served() {
    let dir = Scratch::new("tenants-slow");
    let server = ServeProcess::start_with_tokens(
        &dir.0,
        &tokens(),
        &["--header-timeout", "2s", "--body-timeout", "2s"],
    );
    let addr = server.base.trim_start_matches("http://").to_string();

    // Headers a byte every 200 ms: cut off about 2 s after they began.
    let mut slow_headers = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let headers =
        format!("GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\r\n");
    let trickle = {
        let (mut reader, mut writer) = slow_headers.split();
        let write = async {
            for byte in headers.bytes() {
                if writer.write_all(&[byte]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            std::future::pending::<()>().await
        };
        let read = async {
            let started = Instant::now();
            let mut buffer = [0u8; 256];
            let n = tokio::time::timeout(Duration::from_secs(10), reader.read(&mut buffer))
                .await
                .expect("the server kept the slow connection open past 10 s");
            (n.unwrap_or(0), started.elapsed())
        };
        // Meanwhile, another client is served at once.
        let normal = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let started = Instant::now();
            let (status, _) = send(server.request_as(BOB, Method::GET, "/v1/jobs")).await;
            (status, started.elapsed())
        };
        let ((n, took), (status, normal_took)) = tokio::select! {
            done = async { tokio::join!(read, normal) } => done,
            () = write => unreachable!(),
        };
        assert_eq!(status, 200);
        assert!(normal_took < Duration::from_secs(1), "{normal_took:?}");
        (n, took)
    };
    let (n, took) = trickle;
    assert_eq!(n, 0, "the slow request got an answer rather than a close");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(5),
        "closed after {took:?}"
    );

    // A body a byte every 300 ms, of a job or an upload: 408 with the
    // reason, within the bound, and nothing stored.
    for (path, content_type) in [
        ("/v1/jobs", "application/json"),
        ("/v1/components", "application/wasm"),
    ] {
        let (answer, took) = trickled_body(&addr, path, content_type).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        assert!(
            answer.contains("did not arrive within 2 s"),
            "{path}: {answer}"
        );
        assert!(took < Duration::from_secs(5), "{path}: {took:?}");
    }
    let (_, list) = send(server.request_as(ADMIN, Method::GET, "/v1/jobs")).await;
    assert_eq!(list["jobs"], json!([]), "{list}");
    let (_, list) = send(server.request_as(ADMIN, Method::GET, "/v1/components")).await;
    assert_eq!(list["components"], json!([]), "{list}");
    let left: Vec<_> = std::fs::read_dir(server.data.join("uploads"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "a partial upload was left: {left:?}");

    // An idle connection (no request at all) is closed too.
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (_, took) = until_closed(&mut idle, Duration::from_secs(10)).await;
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn pr_1_a_bad_tokens_file_line_stops_the_server_with_file_and_line() {
    let dir = Scratch::new("tenants-bad");
    let tokens = dir.0.join("tokens");
    std::fs::write(
        &tokens,
        format!("# ok so far\nops admin {ADMIN}\nalice owner {ALICE}\n"),
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.0.join("data"))
        .arg("--tokens-file")
        .arg(&tokens)
        .output()
        .expect("run monarch-host serve");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{}:3: unknown role `owner`", tokens.display())),
        "{stderr}"
    );
}

/// SS-1 with principals: a session is its owner's terminal; another user
/// and an admin get 403 on it, the admin lists it and may close it; its
/// job counts against its owner's quota, and its component must be the
/// owner's.
#[tokio::test]
async fn ss_1_a_users_session_is_its_own_and_an_admin_may_only_list_and_close_it() {
    let dir = Scratch::new("tenants-sessions");
    let server = ServeProcess::start_with_tokens(&dir.0, &tokens(), &[]);
    let [admin, alice, bob] = [ADMIN, ALICE, BOB].map(|token| As {
        server: &server,
        token,
    });
    let echo = program(env!("GUEST_SESSION_ECHO"));
    let (status, uploaded) = alice.upload(echo).await;
    assert_eq!(status, 201, "{uploaded}");
    let id = uploaded["id"].as_str().unwrap().to_string();
    let open = |token, name: &str| {
        server
            .request_as(token, Method::POST, "/v1/sessions")
            .json(&json!({"name": name, "component": id}))
    };
    // Not bob's component: refused as missing.
    let (status, refused) = send(open(BOB, "bobs")).await;
    assert_eq!(status, 404, "{refused}");
    let (status, opened) = send(open(ALICE, "work")).await;
    assert_eq!(status, 201, "{opened}");
    assert_eq!(opened["owner"], "alice", "{opened}");
    // Her one unfinished job is the session: another is over her quota.
    let (status, refused) = send(open(ALICE, "more")).await;
    assert_eq!(status, 429, "{refused}");
    assert!(error_of(&refused).contains("jobs quota"), "{refused}");
    let input = |token| {
        server
            .request_as(token, Method::POST, "/v1/sessions/work/input")
            .json(&json!({"line": "args"}))
    };
    let (status, _) = send(input(ALICE)).await;
    assert_eq!(status, 200);
    for token in [BOB, ADMIN] {
        let (status, body) = send(input(token)).await;
        assert_eq!(status, 403, "{body}");
        assert!(error_of(&body).contains("belongs to another"), "{body}");
        let (status, _) = send(server.request_as(token, Method::GET, "/v1/sessions/work")).await;
        assert_eq!(status, 403);
    }
    let names = |list: Value| -> Vec<String> {
        list["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(bob.get("/v1/sessions").await.1), Vec::<String>::new());
    assert_eq!(names(admin.get("/v1/sessions").await.1), vec!["work"]);
    let (status, body) = bob.delete("/v1/sessions/work").await;
    assert_eq!(status, 403, "{body}");
    let (status, closed) = admin.delete("/v1/sessions/work").await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["state"], "closed", "{closed}");
    assert!(
        closed["reason"]
            .as_str()
            .is_some_and(|r| r.contains("closed by the admin `ops`")),
        "{closed}"
    );
}

/// HA-1 inside the runtime: a job finds (or respawns) only the persistent
/// actor meshes its principal may see over HTTP. Alice's counter on the
/// server's own mesh is hers and an admin's to look up; bob's job is told
/// it belongs to another principal, and cannot take its name by respawn.
#[tokio::test]
async fn a_job_looks_up_only_persistent_actor_meshes_its_principal_may_see() {
    let dir = Scratch::new("tenants-actor-meshes");
    let server = ServeProcess::start_with_tokens(&dir.0, &tokens(), &["--mesh", "workers=2"]);
    let persist = program(env!("GUEST_PERSIST"));
    // Runs the persist program's step `args` as `token` on `workers`; its
    // status and error once it ended.
    let step = |token: &'static str, args: &'static [&'static str]| {
        let server = &server;
        let persist = persist.clone();
        async move {
            let who = As { server, token };
            let (status, uploaded) = who.upload(persist).await;
            assert!(status == 201 || status == 200, "{uploaded}");
            let (status, created) = who
                .submit(json!({
                    "component": uploaded["id"],
                    "args": args,
                    "mesh": "workers",
                }))
                .await;
            assert_eq!(status, 201, "{created}");
            let id = created["id"].as_u64().expect("a job id");
            let client = monarch_host::serve::client::ApiClient::new(
                &server.base,
                Some(token.into()),
                Duration::from_secs(60),
            )
            .expect("a client");
            let job = serve_support::finished(&client, id, Duration::from_secs(90)).await;
            (job.status, job.error.unwrap_or_default())
        }
    };
    use monarch_host::serve::api::JobStatus;
    let (status, error) = step(ALICE, &["spawn", "counter", "2"]).await;
    assert_eq!(status, JobStatus::Succeeded, "{error}");
    let (status, error) = step(BOB, &["read", "counter"]).await;
    assert_eq!(status, JobStatus::Failed);
    assert!(
        error.contains("`counter` belongs to another principal"),
        "{error}"
    );
    let (status, error) = step(BOB, &["respawn", "counter", "2"]).await;
    assert_eq!(status, JobStatus::Failed);
    assert!(
        error.contains("another principal's persistent actor mesh"),
        "{error}"
    );
    for token in [ALICE, ADMIN] {
        let (status, error) = step(token, &["read", "counter"]).await;
        assert_eq!(status, JobStatus::Succeeded, "{error}");
    }
}

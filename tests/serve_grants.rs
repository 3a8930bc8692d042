//! `monarch-host serve` grants end to end: a job may be granted only
//! directories inside the server's `--allow-dir`s (resolved, so neither
//! `..` nor a symlink leads out), and what it is granted reaches its
//! controller and its actors, on a fresh mesh and on a persistent one.

#[path = "support/serve.rs"]
mod serve_support;

use std::path::PathBuf;

use monarch_host::serve::api::{JobRequest, JobStatus, MeshChoice, PartialLimits};
use monarch_host::serve::client::ApiClient;
use reqwest::Method;
use serde_json::{Value, json};
use serve_support::{Scratch, ServeProcess, send};

const PROGRAM: &str = env!("GUEST_SEMANTICS");

/// What the program reads, in the granted directory.
const CONTENTS: &str = "granted bytes\n";

/// A scratch directory laid out for grants: `allowed/` (the server's
/// `--allow-dir`) holding `data/in.txt` and a symlink `out` to
/// `outside/`, which holds a file of its own.
struct Layout {
    scratch: Scratch,
    allowed: PathBuf,
    data: PathBuf,
    outside: PathBuf,
}

impl Layout {
    fn new(name: &str) -> Layout {
        let scratch = Scratch::new(name);
        // Resolved, since the server reports resolved paths (the temporary
        // directory may sit behind a symlink).
        let root = std::fs::canonicalize(&scratch.0).expect("the scratch directory");
        let allowed = root.join("allowed");
        let data = allowed.join("data");
        let outside = root.join("outside");
        std::fs::create_dir_all(&data).expect("allowed/data");
        std::fs::create_dir_all(&outside).expect("outside");
        std::fs::write(data.join("in.txt"), CONTENTS).expect("in.txt");
        std::fs::write(outside.join("in.txt"), "secret\n").expect("outside/in.txt");
        std::os::unix::fs::symlink(&outside, allowed.join("out")).expect("a symlink");
        Layout {
            scratch,
            allowed,
            data,
            outside,
        }
    }
}

fn error_of(body: &Value) -> &str {
    body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error in {body}"))
}

async fn upload(client: &ApiClient) -> String {
    let bytes = std::fs::read(PROGRAM).unwrap_or_else(|e| panic!("{PROGRAM}: {e}"));
    client.upload(bytes).await.expect("upload").id
}

/// Runs job `request` to its end; its final status and its log lines.
async fn run(client: &ApiClient, request: &JobRequest) -> (JobStatus, Option<String>, Vec<String>) {
    let id = client.submit(request).await.expect("submit");
    let mut lines = Vec::new();
    let end = client
        .follow_logs(id, |line| lines.push(line.to_string()))
        .await
        .expect("the log stream");
    (end.status, end.error, lines)
}

fn files_job(component: &str, dir: String, mesh: Option<MeshChoice>) -> JobRequest {
    JobRequest {
        component: component.to_string(),
        args: ["files", "/data/in.txt", "GREETING"]
            .map(String::from)
            .to_vec(),
        limits: None,
        mesh,
        dirs: vec![dir],
        env: vec!["GREETING=hi".into()],
        ..Default::default()
    }
}

fn assert_has(lines: &[String], want: &str) {
    assert!(
        lines.iter().any(|l| l == want),
        "no line `{want}` in {lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowed_directories_are_granted_and_grants_reach_the_job() {
    let layout = Layout::new("grants");
    let server = ServeProcess::start(
        &layout.scratch.0,
        &[
            "--allow-dir",
            layout.allowed.to_str().expect("a UTF-8 path"),
            "--max-timeout",
            "600",
            "--mesh",
            "workers=2",
        ],
    );
    let client = server.client();
    let component = upload(&client).await;

    // Refused at submission, with 400 and the entry at fault.
    let outside = layout.outside.display().to_string();
    let escape = format!("{}/data/../../outside::/data", layout.allowed.display());
    let link = format!("{}/out::/data", layout.allowed.display());
    let missing = format!("{}/nope::/data", layout.allowed.display());
    let refused = [
        (
            json!({"dirs": [format!("{outside}::/data")]}),
            vec![
                outside.as_str(),
                "not inside a directory this server allows",
            ],
        ),
        (
            json!({"dirs": [&escape]}),
            vec![escape.as_str(), "not inside a directory this server allows"],
        ),
        (
            json!({"dirs": [&link]}),
            vec![link.as_str(), "not inside a directory this server allows"],
        ),
        (
            json!({"dirs": [&missing]}),
            vec![missing.as_str(), "cannot grant"],
        ),
        (json!({"dirs": ["allowed/data::/data"]}), vec!["absolute"]),
        (
            json!({"env": ["GREETING=hi", "NOEQUALS"]}),
            vec!["env[1]", "NOEQUALS"],
        ),
        (json!({"env": ["=value"]}), vec!["env[0]", "KEY=VALUE"]),
        (
            json!({"limits": {"handler_timeout_s": 0}}),
            vec!["handler_timeout_s"],
        ),
        (
            json!({"limits": {"handler_timeout_s": 601}}),
            vec!["handler_timeout_s", "cap of 600"],
        ),
    ];
    for (mut request, says) in refused {
        request["component"] = json!(component);
        request["args"] = json!(["files", "/data/in.txt", "GREETING"]);
        let (status, body) = send(server.request(Method::POST, "/v1/jobs").json(&request)).await;
        assert_eq!(status, 400, "{request}: {body}");
        for part in says {
            assert!(error_of(&body).contains(part), "{request}: {body}");
        }
    }
    // None of them became a job.
    assert!(client.jobs(10).await.expect("jobs").is_empty());

    // Granted read-only, with a variable and a handler deadline: the
    // controller and its actor read the file and the variable; writing
    // fails. On a fresh mesh, then on the persistent one, whose procs
    // were started before the job.
    let grant = format!("{}::/data", layout.data.display());
    for mesh in [None, Some(MeshChoice::Name("workers".into()))] {
        let mut request = files_job(&component, grant.clone(), mesh.clone());
        request.limits = Some(PartialLimits {
            handler_timeout_s: Some(30.0),
            ..PartialLimits::default()
        });
        let (status, error, lines) = run(&client, &request).await;
        assert_eq!(
            status,
            JobStatus::Succeeded,
            "{mesh:?} {error:?} {lines:#?}"
        );
        for want in [
            "[controller] controller-file granted bytes",
            "[controller] controller-env hi",
            "[controller] actor-file granted bytes",
            "[controller] actor-env hi",
            "[controller] write error",
        ] {
            assert_has(&lines, want);
        }
        assert!(!layout.data.join("written.txt").exists(), "{mesh:?}");
    }
    // The job shows what it was granted, but not the variables' values.
    let newest = &client.jobs(1).await.expect("jobs")[0];
    assert_eq!(
        newest.dirs,
        vec![format!("{}::/data:ro", layout.data.display())]
    );
    assert_eq!(newest.env, vec!["GREETING".to_string()]);
    assert_eq!(newest.limits.handler_timeout_s, Some(30.0));

    // The CLI passes its flags; `:rw` lets the job write.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args(["submit", "--server", &server.base, "--token-file"])
        .arg(layout.scratch.0.join("token"))
        .args(["--dir", &format!("{grant}:rw")])
        .args([
            "--env",
            "GREETING=hi",
            "--handler-timeout",
            "30",
            "--follow",
        ])
        .arg(PROGRAM)
        .args(["--", "files", "/data/in.txt", "GREETING"])
        .output()
        .expect("run monarch-host submit");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.lines().any(|l| l == "[controller] write ok"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l == "[controller] controller-env hi"),
        "{stdout}"
    );
    assert!(layout.data.join("written.txt").exists());

    // The client refuses a malformed variable before it reaches the server.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args(["submit", "--server", &server.base, "--env", "NOEQUALS"])
        .arg(PROGRAM)
        .output()
        .expect("run monarch-host submit");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("NOEQUALS"));
}

/// Without `--allow-dir` no job is granted a directory, and the answer
/// says how an admin would allow one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_allowed_directories_grants_none() {
    let layout = Layout::new("grants-none");
    let server = ServeProcess::start(&layout.scratch.0, &[]);
    let client = server.client();
    let component = upload(&client).await;
    let request = files_job(
        &component,
        format!("{}::/data", layout.data.display()),
        None,
    );
    let (status, body) = send(server.request(Method::POST, "/v1/jobs").json(&request)).await;
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).contains("--allow-dir"), "{body}");
    assert!(error_of(&body).contains("dirs[0]"), "{body}");

    // Variables need no allowance: without a directory the job runs and
    // sees its variable, but not the file.
    let request = JobRequest {
        dirs: Vec::new(),
        ..request
    };
    let (status, error, lines) = run(&client, &request).await;
    assert_eq!(status, JobStatus::Succeeded, "{error:?} {lines:#?}");
    assert_has(&lines, "[controller] controller-env hi");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("[controller] controller-file error")),
        "{lines:#?}"
    );
}

#[test]
fn a_missing_allowed_directory_stops_the_server_at_start() {
    let dir = Scratch::new("grants-missing");
    let missing = dir.0.join("no-such-dir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.0.join("data"))
        .arg("--allow-dir")
        .arg(&missing)
        .output()
        .expect("run monarch-host serve");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--allow-dir") && stderr.contains(&*missing.to_string_lossy()),
        "{stderr}"
    );
}

//! `monarch-host k8s` end to end, offline: `manifest` against golden
//! files, and `attach` and `down` against a fake Kubernetes API server (an
//! axum app on loopback that answers as the real one does behind `kubectl
//! proxy`: PodLists, newline-delimited WatchEvents, Status objects).
//!
//! The golden files are tests/golden/k8s/*.yaml. After a deliberate change
//! to the manifests, write them again with
//! `UPDATE_GOLDEN=1 cargo test -p monarch-tests --test k8s` and review the
//! diff.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

const NAME: &str = "train";
const NAMESPACE: &str = "ml";
const SELECTOR: &str = "monarch.pytorch.org/mesh-name=train";

/// A directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("monarch-k8s-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch(dir)
    }

    /// A token file holding `token`.
    fn token(&self, token: &str) -> PathBuf {
        let file = self.0.join("given.token");
        std::fs::write(&file, format!("{token}\n")).expect("the token file");
        file
    }

    /// The cluster files' directory (MONARCH_CLUSTER_DIR).
    fn clusters(&self) -> PathBuf {
        self.0.join("clusters")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a `monarch-host k8s ...` run did.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit code {:?}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `monarch-host k8s ARGS` with its cluster files in `scratch`.
async fn k8s(scratch: &Scratch, args: &[&str]) -> Run {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .arg("k8s")
        .args(args)
        .env("MONARCH_CLUSTER_DIR", scratch.clusters())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), child)
        .await
        .unwrap_or_else(|_| panic!("monarch-host k8s {args:?} did not exit within 60 s"))
        .expect("run monarch-host");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Compares `actual` with golden file `name`, or writes it with
/// UPDATE_GOLDEN=1; a mismatch shows the lines that differ.
fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden/k8s")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("the golden dir");
        std::fs::write(&path, actual).expect("write the golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; make it with UPDATE_GOLDEN=1 cargo test -p monarch-tests --test k8s",
            path.display()
        )
    });
    if expected == actual {
        return;
    }
    let (want, got): (Vec<&str>, Vec<&str>) =
        (expected.lines().collect(), actual.lines().collect());
    let mut diff = String::new();
    for line in 0..want.len().max(got.len()) {
        match (want.get(line), got.get(line)) {
            (Some(w), Some(g)) if w == g => {}
            (w, g) => {
                diff += &format!(
                    "line {}:\n  - {}\n  + {}\n",
                    line + 1,
                    w.unwrap_or(&"(none)"),
                    g.unwrap_or(&"(none)")
                )
            }
        }
    }
    panic!(
        "the manifest differs from {} (- golden, + now); if the change is meant, run again with \
         UPDATE_GOLDEN=1:\n{diff}",
        path.display()
    );
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            match i <= chunk.len() {
                true => out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char),
                false => out.push('='),
            }
        }
    }
    out
}

#[tokio::test]
async fn manifest_matches_golden_and_keeps_the_token_out_of_argv() {
    let scratch = Scratch::new("golden");
    let token = scratch.token("0123456789abcdef");
    let token = token.to_str().expect("a UTF-8 path");
    let run = k8s(&scratch, &golden_flags(token)).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    golden("manifest.yaml", &run.stdout);
    // The token is only in the Secret's data, base64 as Kubernetes wants.
    assert!(!run.stdout.contains("0123456789abcdef"), "{run:?}");
    assert!(
        run.stdout
            .contains(&format!("token: {}", base64(b"0123456789abcdef")))
    );
    assert!(
        run.stderr.contains(&format!("--token-file {token}")),
        "{run:?}"
    );

    let run = k8s(
        &scratch,
        &[
            "manifest",
            "--name",
            NAME,
            "--replicas",
            "2",
            "--image",
            "registry.example.com/monarch-host:0.1.0",
            "--namespace",
            NAMESPACE,
            "--label",
            "kueue.x-k8s.io/queue-name=team-a",
            "--token-file",
            token,
            "--monarchmesh",
        ],
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    golden("monarchmesh.yaml", &run.stdout);
}

/// The flags of the golden manifest, with `token` in the Secret.
fn golden_flags(token: &str) -> Vec<&str> {
    vec![
        "manifest",
        "--name",
        NAME,
        "--replicas",
        "4",
        "--image",
        "registry.example.com/monarch-host:0.1.0",
        "--namespace",
        NAMESPACE,
        "--gpus",
        "8",
        "--label",
        "kueue.x-k8s.io/queue-name=team-a",
        "--label",
        "team=research",
        "--token-file",
        token,
    ]
}

#[tokio::test]
async fn manifest_with_a_tls_secret_mounts_it_and_drops_insecure() {
    let scratch = Scratch::new("tls");
    let token = scratch.token("0123456789abcdef");
    let token = token.to_str().expect("a UTF-8 path");

    // Without --tls-secret: --insecure, and a warning that names the flag.
    let plain = k8s(&scratch, &golden_flags(token)).await;
    assert_eq!(plain.code, Some(0), "{plain:?}");
    assert!(plain.stdout.contains("- --insecure\n"), "{plain:?}");
    let warning = plain
        .stderr
        .lines()
        .find(|line| line.contains("WARNING"))
        .unwrap_or_else(|| panic!("no warning in {plain:?}"));
    for words in ["--insecure", "travel in clear", "token", "--tls-secret"] {
        assert!(warning.contains(words), "no {words:?} in {warning:?}");
    }

    let mut flags = golden_flags(token);
    flags.extend(["--tls-secret", "train-tls"]);
    let run = k8s(&scratch, &flags).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    golden("manifest-tls.yaml", &run.stdout);
    assert!(!run.stdout.contains("--insecure"), "{run:?}");
    assert!(
        run.stdout
            .contains("        - --tls-dir\n        - /etc/monarch-tls\n"),
        "{run:?}"
    );
    assert!(run.stdout.contains("secretName: train-tls"), "{run:?}");
    assert!(!run.stdout.contains("ca.key"), "{run:?}");
    // Only the TLS parts differ from the manifest without it.
    let extra: Vec<&str> = run
        .stdout
        .lines()
        .filter(|line| !plain.stdout.lines().any(|p| p == *line))
        .collect();
    assert!(
        extra.iter().all(|line| [
            "tls",
            "ca.pem",
            "host.pem",
            "host.key",
            "defaultMode",
            "readOnly",
            "items:"
        ]
        .iter()
        .any(|w| line.contains(w))),
        "{extra:?}"
    );
    assert!(!run.stderr.contains("WARNING"), "{run:?}");
    assert!(
        run.stderr.contains(
            "kubectl create secret generic train-tls -n ml --from-file=ca.pem=D/ca.pem \
             --from-file=host.pem=D/host.pem --from-file=host.key=D/host.key"
        ),
        "{run:?}"
    );
    // The token is still only in the Secret's data.
    assert!(!run.stdout.contains("0123456789abcdef"), "{run:?}");
}

#[tokio::test]
async fn manifest_refuses_a_tls_secret_that_is_not_a_secret_name() {
    let scratch = Scratch::new("bad-tls");
    // `=`: a value may start with `-`.
    let manifest = |secret: &str| {
        let flag = format!("--tls-secret={secret}");
        let scratch = &scratch;
        async move {
            let args = [
                "manifest",
                "--name",
                NAME,
                "--replicas",
                "1",
                "--image",
                "img:1",
                &flag,
            ];
            k8s(scratch, &args).await
        }
    };
    for bad in ["Train-TLS", "train_tls", "-tls", "tls.", "a..b"] {
        let run = manifest(bad).await;
        assert_eq!(run.code, Some(2), "{bad}: {run:?}");
        assert!(
            run.stderr
                .contains(&format!("`{bad}` is not a Kubernetes Secret name")),
            "{bad}: {run:?}"
        );
        assert!(run.stderr.contains("--tls-secret"), "{bad}: {run:?}");
        assert!(run.stdout.is_empty(), "{run:?}");
    }
    // The token Secret's own name would be overwritten by `k8s manifest`.
    let run = manifest("train-token").await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("token Secret"), "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    assert!(!scratch.clusters().join("train.token").exists());
}

#[tokio::test]
async fn manifest_makes_a_private_token_once_and_reuses_it() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = Scratch::new("token");
    let args = [
        "manifest",
        "--name",
        NAME,
        "--replicas",
        "1",
        "--image",
        "img:1",
    ];
    let first = k8s(&scratch, &args).await;
    assert_eq!(first.code, Some(0), "{first:?}");
    let file = scratch.clusters().join("train.token");
    assert!(
        first.stderr.contains(&file.display().to_string()),
        "{first:?}"
    );
    assert!(first.stderr.contains("made now"), "{first:?}");
    let mode = std::fs::metadata(&file)
        .expect("the token file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let token = std::fs::read_to_string(&file).expect("the token");
    assert_eq!(token.trim().len(), 64, "{token:?}");
    assert!(
        first
            .stdout
            .contains(&format!("token: {}", base64(token.trim().as_bytes())))
    );
    // Printing again must not change the Secret under running pods.
    let second = k8s(&scratch, &args).await;
    assert_eq!(second.code, Some(0), "{second:?}");
    assert_eq!(first.stdout, second.stdout);
}

#[tokio::test]
async fn manifest_refuses_bad_input_with_a_reason() {
    let scratch = Scratch::new("bad");
    let cases: [(&[&str], &str); 5] = [
        (&["--name", NAME, "--replicas", "0"], "--replicas 0"),
        (
            &["--name", "Train", "--replicas", "1"],
            "`Train` cannot name a Kubernetes cluster",
        ),
        (
            &["--name", NAME, "--replicas", "1", "--label", "team"],
            "`team` is not a label",
        ),
        (
            &[
                "--name",
                NAME,
                "--replicas",
                "1",
                "--label",
                "monarch.pytorch.org/mesh-name=x",
            ],
            "is set by monarch-host",
        ),
        (
            &["--name", "my-train", "--replicas", "1", "--monarchmesh"],
            "cannot name a MonarchMesh",
        ),
    ];
    for (args, why) in cases {
        let mut all = vec!["manifest", "--image", "img:1"];
        all.extend_from_slice(args);
        let run = k8s(&scratch, &all).await;
        assert_eq!(run.code, Some(1), "{all:?}: {run:?}");
        assert!(
            run.stderr.starts_with("monarch-host k8s: error: "),
            "{run:?}"
        );
        assert!(run.stderr.contains(why), "{all:?}: {run:?}");
        assert!(run.stdout.is_empty(), "{run:?}");
    }
    // No token was made for refused flags.
    assert!(!scratch.clusters().join("train.token").exists());
}

// ---- The fake API server ----

/// One line of a watch stream, or what the stream does after its lines.
#[derive(Clone)]
enum Step {
    /// A WatchEvent, as one line of JSON.
    Event(Value),
    /// The stream stays open (until the client goes).
    Hold,
}

#[derive(Default)]
struct Fake {
    /// Each request: `METHOD PATH` and its decoded query, `k=v&...`.
    requests: Vec<String>,
    /// PodLists to answer, in turn (the last one repeats).
    lists: VecDeque<Value>,
    /// Watch streams to answer, in turn (then streams that hold).
    watches: VecDeque<Vec<Step>>,
    /// The cluster file the attach under test would write.
    cluster_file: Option<PathBuf>,
    /// Whether the cluster file existed as each watch began.
    file_at_watch: Vec<bool>,
    /// `spec.replicas` of the StatefulSet.
    replicas: i64,
}

type Shared = Arc<Mutex<Fake>>;

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    })
}

fn json_response(code: StatusCode, body: Value) -> Response {
    (
        code,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A pod of the StatefulSet as the API server shows it.
#[derive(Clone, Copy)]
enum PodIs {
    /// Scheduled, its image being pulled.
    Creating,
    /// Not yet scheduled.
    Unschedulable,
    /// The agent exited; the container is being restarted.
    Crashed,
    /// The container runs; the readiness probe has not passed yet.
    Starting,
    /// Ready.
    Ready,
}

fn pod(name: &str, uid: &str, version: &str, ip: Option<&str>, is: PodIs) -> Value {
    let ready = matches!(is, PodIs::Ready);
    let truth = |b: bool| if b { "True" } else { "False" };
    let phase = match is {
        PodIs::Creating | PodIs::Unschedulable => "Pending",
        _ => "Running",
    };
    let state = match is {
        PodIs::Creating => json!({"waiting": {"reason": "ContainerCreating"}}),
        PodIs::Crashed => json!({"terminated": {"exitCode": 1, "reason": "Error"}}),
        _ => json!({"running": {"startedAt": "2025-06-01T10:00:05Z"}}),
    };
    let mut conditions = vec![json!({"type": "PodScheduled", "status": "True"})];
    if matches!(is, PodIs::Unschedulable) {
        conditions = vec![json!({
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
        })];
    } else {
        conditions.push(json!({
            "type": "Ready", "status": truth(ready),
            "reason": if ready { Value::Null } else { json!("ContainersNotReady") },
        }));
    }
    let mut status = json!({"phase": phase, "conditions": conditions, "qosClass": "BestEffort"});
    if !matches!(is, PodIs::Unschedulable) {
        status["containerStatuses"] = json!([{
            "name": "agent", "image": "img:1", "imageID": "", "ready": ready,
            "restartCount": 0, "started": !matches!(is, PodIs::Creating), "state": state,
        }]);
        status["hostIP"] = json!("192.168.7.1");
    }
    if let Some(ip) = ip {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{"ip": ip}]);
    }
    json!({
        "metadata": {
            "name": name, "generateName": "train-", "namespace": NAMESPACE, "uid": uid,
            "resourceVersion": version, "creationTimestamp": "2025-06-01T10:00:00Z",
            "labels": {
                "app.kubernetes.io/name": "monarch-worker",
                "monarch.pytorch.org/mesh-name": NAME,
                "statefulset.kubernetes.io/pod-name": name,
            },
        },
        "spec": {
            "hostname": name, "subdomain": NAME,
            "containers": [{"name": "agent", "image": "img:1"}],
        },
        "status": status,
    })
}

/// A PodList: items carry no kind or apiVersion, as the real ones.
fn pod_list(version: &str, pods: Vec<Value>) -> Value {
    json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": version}, "items": pods})
}

/// A WatchEvent: its object carries its kind and apiVersion.
fn event(kind: &str, mut pod: Value) -> Step {
    pod["kind"] = json!("Pod");
    pod["apiVersion"] = json!("v1");
    Step::Event(json!({"type": kind, "object": pod}))
}

fn bookmark(version: &str) -> Step {
    Step::Event(json!({
        "type": "BOOKMARK",
        "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": version}},
    }))
}

fn record(fake: &Shared, method: &Method, uri: &Uri) {
    let query = uri
        .query()
        .map(|q| {
            q.split('&')
                .map(|pair| {
                    let decoded = pair.replace("%2F", "/").replace("%3D", "=");
                    decoded.replace('+', " ")
                })
                .collect::<Vec<_>>()
                .join("&")
        })
        .unwrap_or_default();
    let line = match query.is_empty() {
        true => format!("{method} {}", uri.path()),
        false => format!("{method} {}?{query}", uri.path()),
    };
    fake.lock().expect("the fake").requests.push(line);
}

async fn pods(
    State(fake): State<Shared>,
    method: Method,
    uri: Uri,
    Query(query): Query<std::collections::HashMap<String, String>>,
) -> Response {
    record(&fake, &method, &uri);
    if query.get("labelSelector").map(String::as_str) != Some(SELECTOR) {
        return json_response(
            StatusCode::BAD_REQUEST,
            status(400, "BadRequest", "wrong selector"),
        );
    }
    let mut state = fake.lock().expect("the fake");
    if query.get("watch").map(String::as_str) != Some("true") {
        let list = match state.lists.len() {
            0 => pod_list("1", vec![]),
            1 => state.lists[0].clone(),
            _ => state.lists.pop_front().expect("a list"),
        };
        return json_response(StatusCode::OK, list);
    }
    let existed = state.cluster_file.as_ref().is_some_and(|f| f.exists());
    state.file_at_watch.push(existed);
    let steps = state.watches.pop_front().unwrap_or(vec![Step::Hold]);
    drop(state);
    let mut lines = Vec::new();
    let mut hold = false;
    for step in steps {
        match step {
            Step::Event(value) => {
                lines.push(Ok::<_, std::convert::Infallible>(format!("{value}\n")))
            }
            Step::Hold => hold = true,
        }
    }
    let body = futures::stream::iter(lines);
    let body = match hold {
        true => Body::from_stream(futures::StreamExt::chain(body, futures::stream::pending())),
        false => Body::from_stream(body),
    };
    Response::builder()
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(body)
        .expect("a response")
}

async fn stateful_set(State(fake): State<Shared>, method: Method, uri: Uri) -> Response {
    record(&fake, &method, &uri);
    let replicas = fake.lock().expect("the fake").replicas;
    json_response(
        StatusCode::OK,
        json!({
            "kind": "StatefulSet", "apiVersion": "apps/v1",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "resourceVersion": "90"},
            "spec": {
                "replicas": replicas, "serviceName": NAME, "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"monarch.pytorch.org/mesh-name": NAME}},
                "template": {"spec": {"containers": [{"name": "agent"}]}},
            },
        }),
    )
}

/// The server's answers to `k8s down`: no MonarchMesh CRD, one of each
/// other kind.
async fn deletions(State(fake): State<Shared>, method: Method, uri: Uri) -> Response {
    record(&fake, &method, &uri);
    let path = uri.path();
    let item = |name: &str| json!({"metadata": {"name": name, "namespace": NAMESPACE}});
    match (method.as_str(), path) {
        (_, p) if p.contains("monarch.pytorch.org") => {
            (StatusCode::NOT_FOUND, "404 page not found\n").into_response()
        }
        ("DELETE", "/apis/apps/v1/namespaces/ml/statefulsets") => json_response(
            StatusCode::OK,
            json!({"kind": "StatefulSetList", "apiVersion": "apps/v1", "metadata": {}, "items": [item(NAME)]}),
        ),
        ("GET", "/api/v1/namespaces/ml/services") => json_response(
            StatusCode::OK,
            json!({"kind": "ServiceList", "apiVersion": "v1", "metadata": {}, "items": [item(NAME)]}),
        ),
        ("DELETE", "/api/v1/namespaces/ml/services/train") => {
            let mut service = item(NAME);
            service["kind"] = json!("Service");
            json_response(StatusCode::OK, service)
        }
        ("DELETE", "/api/v1/namespaces/ml/secrets") => json_response(
            StatusCode::OK,
            json!({"kind": "SecretList", "apiVersion": "v1", "metadata": {}, "items": [item("train-token")]}),
        ),
        _ => json_response(
            StatusCode::NOT_FOUND,
            status(404, "NotFound", "no such thing"),
        ),
    }
}

/// Serves `fake` on a loopback port; returns `http://127.0.0.1:PORT`.
async fn serve(fake: Shared) -> String {
    let app = Router::new()
        .route("/api/v1/namespaces/ml/pods", axum::routing::get(pods))
        .route(
            "/apis/apps/v1/namespaces/ml/statefulsets/train",
            axum::routing::get(stateful_set),
        )
        .fallback(deletions)
        .with_state(fake);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_waits_out_a_pod_restart_and_addresses_pods_by_dns() {
    use PodIs::*;
    let scratch = Scratch::new("attach");
    let token = scratch.token("attach-token");
    let cluster_file = scratch.clusters().join("train.json");
    let fake = Shared::default();
    {
        let mut state = fake.lock().expect("the fake");
        state.replicas = 3;
        state.cluster_file = Some(cluster_file.clone());
        state.lists = VecDeque::from([
            pod_list(
                "100",
                vec![
                    pod("train-0", "u0", "97", Some("10.0.0.1"), Ready),
                    pod("train-1", "u1", "98", None, Creating),
                    pod("train-2", "u2", "99", Some("10.0.0.3"), Ready),
                    // A rank beyond --replicas (the set was scaled down).
                    pod("train-3", "u3", "96", Some("10.0.0.4"), Ready),
                ],
            ),
            // After the 410: train-0 is back with a new IP, not Ready yet.
            pod_list(
                "200",
                vec![
                    pod("train-0", "u0b", "198", Some("10.0.0.9"), Starting),
                    pod("train-1", "u1", "105", Some("10.0.0.2"), Ready),
                    pod("train-2", "u2", "99", Some("10.0.0.3"), Ready),
                ],
            ),
        ]);
        state.watches = VecDeque::from([
            // train-0's agent dies, its pod is deleted, and the server
            // ends the stream.
            vec![
                event(
                    "MODIFIED",
                    pod("train-0", "u0", "101", Some("10.0.0.1"), Crashed),
                ),
                event(
                    "DELETED",
                    pod("train-0", "u0", "102", Some("10.0.0.1"), Crashed),
                ),
                bookmark("103"),
            ],
            // Its new pod, train-1 Ready, then the history is gone.
            vec![
                event("ADDED", pod("train-0", "u0b", "104", None, Creating)),
                event(
                    "MODIFIED",
                    pod("train-1", "u1", "105", Some("10.0.0.2"), Ready),
                ),
                Step::Event(json!({
                    "type": "ERROR",
                    "object": status(410, "Expired", "too old resource version: 103 (150)"),
                })),
            ],
            vec![
                event(
                    "MODIFIED",
                    pod("train-0", "u0b", "201", Some("10.0.0.9"), Ready),
                ),
                Step::Hold,
            ],
        ]);
    }
    let api = serve(fake.clone()).await;
    let run = k8s(
        &scratch,
        &[
            "attach",
            "--name",
            NAME,
            "--namespace",
            NAMESPACE,
            "--api-server",
            &api,
            "--timeout",
            "30",
            "--token-file",
            token.to_str().expect("UTF-8"),
        ],
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let state = fake.lock().expect("the fake");
    let watch = |rv: &str| {
        format!(
            "GET /api/v1/namespaces/ml/pods?labelSelector={SELECTOR}&watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=300"
        )
    };
    let list = format!("GET /api/v1/namespaces/ml/pods?labelSelector={SELECTOR}");
    assert_eq!(
        state.requests,
        [
            "GET /apis/apps/v1/namespaces/ml/statefulsets/train".to_string(),
            list.clone(),
            watch("100"),
            // The stream ended: resumed from the bookmark's version.
            watch("103"),
            // 410 Gone: listed again, and watched from the list's version.
            list,
            watch("200"),
        ],
        "{run:?}"
    );
    // Attach was still waiting for the restarted train-0 when the last
    // watch began.
    assert_eq!(state.file_at_watch, [false, false, false]);

    for line in [
        "k8s attach: 2/3 pods ready (train-1 Pending: ContainerCreating)\n",
        "k8s attach: 1/3 pods ready (train-0 Running: Error, train-1 Pending: ContainerCreating)\n",
        "k8s attach: 2/3 pods ready (train-0 Running: agent not listening yet)\n",
        "k8s attach: 3/3 pods ready\n",
    ] {
        assert!(run.stderr.contains(line), "no {line:?} in {run:?}");
    }
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(&cluster_file).expect("the cluster file"))
            .expect("JSON");
    assert_eq!(
        file["placed"],
        json!({"kind": "kubernetes", "namespace": "ml"})
    );
    assert_eq!(file["token_file"], json!(token));
    assert_eq!(
        file["agents"],
        json!([
            {"node": "train-0", "addr": "train-0.train.ml.svc.cluster.local:26600"},
            {"node": "train-1", "addr": "train-1.train.ml.svc.cluster.local:26600"},
            {"node": "train-2", "addr": "train-2.train.ml.svc.cluster.local:26600"},
        ])
    );
    assert!(!file.to_string().contains("10.0.0."), "{file}");
    // The pods' agents have no --tls-dir.
    assert_eq!(file["spec"]["tls"], json!("false"), "{file}");
    assert!(
        run.stdout
            .contains("monarch-host run --cluster train PROGRAM.wasm"),
        "{run:?}"
    );
}

/// `pod` whose agent container runs `command`.
fn pod_running(name: &str, uid: &str, version: &str, command: &[&str]) -> Value {
    let mut pod = pod(name, uid, version, Some("10.0.0.1"), PodIs::Ready);
    pod["spec"]["containers"][0]["command"] = json!(command);
    pod
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_records_that_the_agents_use_tls() {
    let scratch = Scratch::new("attach-tls");
    let token = scratch.token("t");
    let tls = [
        "monarch-host",
        "agent",
        "--listen",
        "$(POD_NAME).train.ml.svc.cluster.local:26600",
        "--tls-dir",
        "/etc/monarch-tls",
    ];
    let fake = Shared::default();
    fake.lock().expect("the fake").lists = VecDeque::from([pod_list(
        "7",
        vec![
            pod_running("train-0", "u0", "5", &tls),
            pod_running("train-1", "u1", "6", &tls),
        ],
    )]);
    let api = serve(fake.clone()).await;
    let attach = |replicas: &'static str| {
        let api = api.clone();
        let token = token.clone();
        let scratch = &scratch;
        async move {
            k8s(
                scratch,
                &[
                    "attach",
                    "--name",
                    NAME,
                    "--namespace",
                    NAMESPACE,
                    "--replicas",
                    replicas,
                    "--api-server",
                    &api,
                    "--timeout",
                    "30",
                    "--token-file",
                    token.to_str().expect("UTF-8"),
                ],
            )
            .await
        }
    };
    let run = attach("2").await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let cluster_file = scratch.clusters().join("train.json");
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(&cluster_file).expect("the cluster file"))
            .expect("JSON");
    assert_eq!(file["spec"]["tls"], json!("true"), "{file}");
    assert!(
        run.stdout
            .contains("monarch-host run --cluster train --tls-dir DIR PROGRAM.wasm"),
        "{run:?}"
    );
    // A controller without TLS is told so before it dials (K8-7).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args(["run", "--cluster", NAME, env!("GUEST_HELLO")])
        .env("MONARCH_CLUSTER_DIR", scratch.clusters())
        .env_remove("MONARCH_TLS_DIR")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run monarch-host");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("this cluster's agents use TLS: give --tls-dir DIR"),
        "{stderr}"
    );

    // A rollout half done: one agent with TLS, one without.
    std::fs::remove_file(&cluster_file).expect("remove the cluster file");
    fake.lock().expect("the fake").lists = VecDeque::from([pod_list(
        "8",
        vec![
            pod_running("train-0", "u0", "5", &tls),
            pod_running(
                "train-1",
                "u1b",
                "9",
                &["monarch-host", "agent", "--insecure"],
            ),
        ],
    )]);
    let run = attach("2").await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("disagree on TLS"), "{run:?}");
    assert!(run.stderr.contains("kubectl rollout status"), "{run:?}");
    assert!(!cluster_file.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_times_out_naming_the_pods_not_ready() {
    let scratch = Scratch::new("timeout");
    let token = scratch.token("t");
    let fake = Shared::default();
    fake.lock().expect("the fake").lists = VecDeque::from([pod_list(
        "7",
        vec![
            pod("train-0", "u0", "5", Some("10.0.0.1"), PodIs::Ready),
            pod("train-1", "u1", "6", None, PodIs::Unschedulable),
        ],
    )]);
    let api = serve(fake.clone()).await;
    let run = k8s(
        &scratch,
        &[
            "attach",
            "--name",
            NAME,
            "--namespace",
            NAMESPACE,
            "--replicas",
            "2",
            "--api-server",
            &api,
            "--timeout",
            "1.5",
            "--token-file",
            token.to_str().expect("UTF-8"),
        ],
    )
    .await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("were not all Ready within"), "{run:?}");
    assert!(
        run.stderr.contains("train-1 Pending: Unschedulable"),
        "{run:?}"
    );
    assert!(!scratch.clusters().join("train.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_without_the_token_says_where_it_looked() {
    let scratch = Scratch::new("notoken");
    let fake = Shared::default();
    let api = serve(fake.clone()).await;
    let run = k8s(&scratch, &["attach", "--name", NAME, "--api-server", &api]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("train.token"), "{run:?}");
    assert!(run.stderr.contains("--token-file"), "{run:?}");
    assert!(fake.lock().expect("the fake").requests.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_deletes_by_label_and_removes_the_cluster_file() {
    let scratch = Scratch::new("down");
    let clusters = scratch.clusters();
    std::fs::create_dir_all(&clusters).expect("the clusters dir");
    let token = clusters.join("train.token");
    std::fs::write(&token, "t\n").expect("a token");
    let file = json!({
        "version": 1, "name": NAME, "placed": {"kind": "kubernetes", "namespace": NAMESPACE},
        "spec": {}, "agents": [{"node": "train-0", "addr": "train-0.train.ml.svc.cluster.local:26600"}],
        "token_file": token, "agent_version": "0.1.0", "created_unix": 1,
    });
    std::fs::write(clusters.join("train.json"), file.to_string()).expect("a cluster file");
    let fake = Shared::default();
    let api = serve(fake.clone()).await;
    // No --namespace: the cluster file's.
    let run = k8s(&scratch, &["down", "--name", NAME, "--api-server", &api]).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let by_label = format!("labelSelector={SELECTOR}");
    assert_eq!(
        fake.lock().expect("the fake").requests,
        [
            format!(
                "DELETE /apis/monarch.pytorch.org/v1alpha1/namespaces/ml/monarchmeshes?{by_label}&propagationPolicy=Background"
            ),
            format!(
                "DELETE /apis/apps/v1/namespaces/ml/statefulsets?{by_label}&propagationPolicy=Background"
            ),
            format!("GET /api/v1/namespaces/ml/services?{by_label}"),
            "DELETE /api/v1/namespaces/ml/services/train".to_string(),
            format!("DELETE /api/v1/namespaces/ml/secrets?{by_label}"),
        ]
    );
    for line in [
        "k8s down: deleted statefulset/train in namespace ml",
        "k8s down: deleted service/train in namespace ml",
        "k8s down: deleted secret/train-token in namespace ml",
        "k8s down: removed the cluster file",
    ] {
        assert!(run.stdout.contains(line), "no {line:?} in {run:?}");
    }
    assert!(!clusters.join("train.json").exists());
    assert!(!token.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_stops_at_an_api_error_and_keeps_the_cluster_file() {
    let scratch = Scratch::new("down-refused");
    let clusters = scratch.clusters();
    std::fs::create_dir_all(&clusters).expect("the clusters dir");
    let token = clusters.join("train.token");
    std::fs::write(&token, "t\n").expect("a token");
    let fake = Shared::default();
    let api = serve(fake.clone()).await;
    // Namespace `other` has no routes: the statefulset DELETE is a 404 Status.
    let run = k8s(
        &scratch,
        &[
            "down",
            "--name",
            NAME,
            "--namespace",
            "other",
            "--api-server",
            &api,
        ],
    )
    .await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains("deleting the statefulsets of `train`"),
        "{run:?}"
    );
    assert!(run.stderr.contains("404"), "{run:?}");
    assert!(
        token.exists(),
        "the token stays while the pods may still run"
    );
}

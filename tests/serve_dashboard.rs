//! The dashboard of `monarch-host serve`, as a user sees it: the real
//! server runs as a process with a persistent mesh `workers` of two procs,
//! this test uploads the `hello` example and runs it there as a job, then
//! headless Chromium opens the dashboard on that job and the test reads the
//! page it rendered (`--dump-dom`): the job's row and final status, its log
//! lines, and the mesh's procs. Opened without a token, the page asks for
//! one and shows no jobs.
//!
//! The test needs Chromium at `/usr/bin/chromium`; without it, it says so
//! and passes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const CHROMIUM: &str = "/usr/bin/chromium";
const TOKEN: &str = "serve-dashboard-test-token";
/// How long the server may take to listen, and a job to finish.
const STARTUP: Duration = Duration::from_secs(60);
const JOB_DEADLINE: Duration = Duration::from_secs(60);
/// How long one request may go without a byte: a log stream that does not
/// end is reported, not waited on.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one Chromium run may take.
const BROWSER_DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn dashboard_shows_a_job_its_logs_and_the_mesh() {
    if !Path::new(CHROMIUM).exists() {
        eprintln!("skipped: {CHROMIUM} is missing (install it with `apt-get install chromium`)");
        return;
    }
    // Declared first so that it is dropped last, after the server.
    let scratch = Scratch::new("serve-dashboard");
    let server = Server::start(&scratch.0);

    // Upload `hello` and run it on the persistent mesh.
    let wasm = std::fs::read(env!("GUEST_HELLO")).expect("read the hello example");
    let uploaded = server.request("POST", "/v1/components", Some("application/wasm"), &wasm);
    assert!(
        uploaded.status == 201 || uploaded.status == 200,
        "upload: {uploaded}\n{}",
        server.log()
    );
    let component = uploaded.json()["id"].clone();
    assert!(!component.is_null(), "upload: no id in {uploaded}");
    let job = json!({"component": component, "args": ["2"], "mesh": "workers"});
    let submitted = server.request(
        "POST",
        "/v1/jobs",
        Some("application/json"),
        job.to_string().as_bytes(),
    );
    assert_eq!(
        submitted.status,
        201,
        "submit: {submitted}\n{}",
        server.log()
    );
    let id = submitted.json()["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("submit: no numeric id in {submitted}"));
    let finished = server.wait_for_job(id);
    assert_eq!(
        finished["status"],
        "succeeded",
        "job {id}: {finished}\nlogs:\n{}\n{}",
        server.logs_route(id),
        server.log()
    );

    // The page, opened as a user would from a link that carries the token.
    let url = format!("http://{}/?token={TOKEN}#job={id}", server.addr);
    let dom = chromium_dump_dom(&url, &scratch.0.join("profile-token"));
    let context = || {
        format!(
            "the page showed:\n{}\nthe logs route answers:\n{}\n{}",
            body_of(&dom),
            server.logs_route(id),
            server.log()
        )
    };
    // No error banner and no token form.
    assert!(
        is_hidden(&dom, "error"),
        "an error banner is shown; {}",
        context()
    );
    assert!(
        is_hidden(&dom, "token-form"),
        "the token form is shown; {}",
        context()
    );
    // The job's row in #jobs, succeeded.
    let id_text = id.to_string();
    let row = open_tags(&dom).find(|tag| {
        tag_name(tag) == "tr"
            && has_class(tag, "job")
            && attr(tag, "data-id") == Some(id_text.as_str())
    });
    let row = row.unwrap_or_else(|| panic!("no row for job {id} in #jobs; {}", context()));
    assert_eq!(
        attr(row, "data-status"),
        Some("succeeded"),
        "row {row}; {}",
        context()
    );
    // The selected job: its final status, from the log stream's `end` event,
    // and its log lines, one per line.
    assert_eq!(
        text_of(&dom, "job-status").as_deref(),
        Some("succeeded"),
        "#job-status; {}",
        context()
    );
    let logs_state = by_id(&dom, "logs-state").and_then(|tag| attr(tag, "data-state"));
    assert_eq!(
        logs_state,
        Some("ended"),
        "the page did not read the log stream to its `end` event; {}",
        context()
    );
    assert_eq!(
        text_of(&dom, "logs-state").as_deref(),
        Some("end of log: job succeeded"),
        "#logs-state; {}",
        context()
    );
    let logs = text_of(&dom, "logs").unwrap_or_else(|| panic!("no #logs; {}", context()));
    for rank in 0..2 {
        let greeting = format!("rank {rank}: hello from rank {rank} of 2");
        assert!(
            logs.lines()
                .any(|line| line.starts_with("[controller] ") && line.ends_with(&greeting)),
            "#logs has no line `[controller] ... {greeting}`; {}",
            context()
        );
    }
    assert!(
        logs.lines()
            .any(|line| line.contains("2 greetings from a mesh shaped")),
        "#logs misses the greetings header; {}",
        context()
    );
    // The persistent mesh, two procs running.
    let workers = mesh_div(&dom, "workers")
        .unwrap_or_else(|| panic!("no .mesh[data-name=workers] in #meshes; {}", context()));
    let procs: Vec<&str> = open_tags(workers)
        .filter(|tag| has_class(tag, "rank") && has_class(tag, "proc"))
        .collect();
    assert_eq!(procs.len(), 2, "procs of workers: {procs:?}; {}", context());
    assert!(
        procs
            .iter()
            .all(|tag| attr(tag, "data-state") == Some("running")),
        "procs of workers: {procs:?}; {}",
        context()
    );
    assert!(
        workers.contains("persistent"),
        "workers is not shown as persistent: {workers}"
    );

    // Without a token: the form that asks for one, and no jobs.
    let url = format!("http://{}/", server.addr);
    let dom = chromium_dump_dom(&url, &scratch.0.join("profile-no-token"));
    assert!(
        by_id(&dom, "token-form").is_some(),
        "GET / without a token did not serve the dashboard; the page showed:\n{}\n{}",
        body_of(&dom),
        server.log()
    );
    assert!(
        !is_hidden(&dom, "token-form"),
        "no token form without a token; the page showed:\n{}\n{}",
        body_of(&dom),
        server.log()
    );
    let rows = open_tags(&dom)
        .filter(|tag| tag_name(tag) == "tr" && has_class(tag, "job"))
        .count();
    assert_eq!(
        rows,
        0,
        "job rows without a token; the page showed:\n{}",
        body_of(&dom)
    );
}

/// A directory of this test's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("monarch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the scratch directory");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `monarch-host serve`, killed and reaped when dropped.
struct Server {
    child: Child,
    /// Where it listens: `127.0.0.1:PORT`.
    addr: String,
    /// Its stdout and stderr.
    log_path: PathBuf,
}

impl Server {
    /// Starts the server with a mesh `workers` of two procs; returns once
    /// it has written its address to the port file.
    fn start(dir: &Path) -> Server {
        let token_file = dir.join("token");
        std::fs::write(&token_file, TOKEN).expect("write the token file");
        let port_file = dir.join("port");
        let data = dir.join("data");
        std::fs::create_dir_all(&data).expect("create the data directory");
        let log_path = dir.join("server.log");
        let log = std::fs::File::create(&log_path).expect("create the server log");
        let child = Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .arg("--data")
            .arg(&data)
            .arg("--token-file")
            .arg(&token_file)
            .args(["--mesh", "workers=2"])
            .arg("--port-file")
            .arg(&port_file)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log file"))
            .stderr(log)
            .spawn()
            .expect("start monarch-host serve");
        let mut server = Server {
            child,
            addr: String::new(),
            log_path,
        };
        let started = Instant::now();
        loop {
            // The address is whole once its newline is written.
            let written = std::fs::read_to_string(&port_file).unwrap_or_default();
            if let Some(addr) = written.strip_suffix('\n')
                && addr.trim().parse::<std::net::SocketAddr>().is_ok()
            {
                server.addr = addr.trim().to_string();
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "monarch-host serve exited ({status}) before it listened\n{}",
                    server.log()
                );
            }
            if started.elapsed() > STARTUP {
                panic!(
                    "monarch-host serve wrote no address to {} within {STARTUP:?}\n{}",
                    port_file.display(),
                    server.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the server printed, for failure messages.
    fn log(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let tail = text.len().saturating_sub(8000);
        let tail = (tail..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        format!("server log:\n{}", &text[tail..])
    }

    /// One request with the token.
    fn request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Response {
        http(&self.addr, method, path, Some(TOKEN), content_type, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}\n{}", self.log()))
    }

    /// What `GET /v1/jobs/{id}/logs` answers, or why it did not, for
    /// failure messages: never panics.
    fn logs_route(&self, id: u64) -> String {
        let path = format!("/v1/jobs/{id}/logs");
        match http(&self.addr, "GET", &path, Some(TOKEN), None, b"") {
            Ok(response) => response.to_string(),
            Err(e) => format!("GET {path}: {e}"),
        }
    }

    /// Polls `GET /v1/jobs/{id}` until the job has finished; returns it.
    fn wait_for_job(&self, id: u64) -> Value {
        let started = Instant::now();
        loop {
            let response = self.request("GET", &format!("/v1/jobs/{id}"), None, b"");
            assert_eq!(response.status, 200, "job {id}: {response}");
            let job = response.json();
            if matches!(
                job["status"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            ) {
                return job;
            }
            if started.elapsed() > JOB_DEADLINE {
                panic!(
                    "job {id} did not finish within {JOB_DEADLINE:?}: {job}\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP response: its status and body.
struct Response {
    status: u16,
    body: Vec<u8>,
}

impl Response {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self}"))
    }
}

impl std::fmt::Display for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.text())
    }
}

/// A tiny HTTP/1.1 client: one request per connection, read to the end.
fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT))?;
    stream.set_write_timeout(Some(HTTP_TIMEOUT))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if let Some(content_type) = content_type {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| invalid("no end of headers"))?;
    let headers = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = headers
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid("no status"))?;
    let mut body = raw[split + 4..].to_vec();
    if headers
        .lines()
        .any(|line| line.starts_with("transfer-encoding:") && line.contains("chunked"))
    {
        body = dechunk(&body).ok_or_else(|| invalid("bad chunked body"))?;
    }
    Ok(Response { status, body })
}

/// Decodes a chunked body.
fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&raw[..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

/// Runs headless Chromium on `url` with a fresh profile in `profile`;
/// returns the DOM it rendered once the page went idle (or its virtual
/// clock ran 8 s: the dashboard refreshes every second).
fn chromium_dump_dom(url: &str, profile: &Path) -> String {
    let mut child = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--virtual-time-budget=8000", "--dump-dom", url])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start chromium");
    let mut stdout = child.stdout.take().expect("chromium's stdout");
    let stdout = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let mut stderr = child.stderr.take().expect("chromium's stderr");
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if started.elapsed() > BROWSER_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish {url} within {BROWSER_DEADLINE:?}; stderr:\n{}",
                stderr.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let dom = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    assert!(
        status.success() && dom.contains("</html>"),
        "chromium on {url} exited {status}; stdout:\n{dom}\nstderr:\n{stderr}"
    );
    dom
}

/// The opening tags of `html`, such as `<tr class="job" data-id="7">`.
fn open_tags(html: &str) -> impl Iterator<Item = &str> {
    html.match_indices('<').filter_map(move |(start, _)| {
        let rest = &html[start + 1..];
        if !rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return None;
        }
        let end = rest.find('>')?;
        Some(&html[start..start + 1 + end + 1])
    })
}

/// A tag's name: `tr` for `<tr class="job">`.
fn tag_name(tag: &str) -> &str {
    let name = &tag[1..];
    let end = name
        .find(|c: char| c.is_whitespace() || c == '>' || c == '/')
        .unwrap_or(name.len());
    &name[..end]
}

/// The value of an attribute of an opening tag, as Chromium writes it:
/// ` name="value"`, or ` name` alone (then the value is empty).
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let quoted = format!(" {name}=\"");
    if let Some(start) = tag.find(&quoted) {
        let value = &tag[start + quoted.len()..];
        return value.find('"').map(|end| &value[..end]);
    }
    let bare = format!(" {name}");
    tag.match_indices(&bare).find_map(|(start, _)| {
        let after = &tag[start + bare.len()..];
        after
            .starts_with(|c: char| c.is_whitespace() || c == '>' || c == '/')
            .then_some("")
    })
}

fn has_class(tag: &str, class: &str) -> bool {
    attr(tag, "class").is_some_and(|classes| classes.split_whitespace().any(|c| c == class))
}

/// The opening tag of the element with `id`.
fn by_id<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    open_tags(dom).find(|tag| attr(tag, "id") == Some(id))
}

/// Whether the element with `id` carries the `hidden` attribute; panics if
/// there is no such element.
fn is_hidden(dom: &str, id: &str) -> bool {
    let tag = by_id(dom, id).unwrap_or_else(|| panic!("no #{id} in the page:\n{}", body_of(dom)));
    attr(tag, "hidden").is_some()
}

/// The text of the element with `id` up to its first child element,
/// unescaped: the whole text of `#logs` or `#job-status`.
fn text_of(dom: &str, id: &str) -> Option<String> {
    let tag = by_id(dom, id)?;
    let start = tag.as_ptr() as usize - dom.as_ptr() as usize + tag.len();
    let rest = &dom[start..];
    let end = rest.find('<').unwrap_or(rest.len());
    Some(unescape(&rest[..end]))
}

/// The markup of `<div class="mesh" data-name="NAME">`, up to the next
/// mesh or the end of the page.
fn mesh_div<'a>(dom: &'a str, name: &str) -> Option<&'a str> {
    let is_mesh = |tag: &&str| tag_name(tag) == "div" && has_class(tag, "mesh");
    let tag = open_tags(dom).find(|tag| is_mesh(tag) && attr(tag, "data-name") == Some(name))?;
    let start = tag.as_ptr() as usize - dom.as_ptr() as usize;
    let rest = &dom[start + tag.len()..];
    let end = open_tags(rest)
        .find(is_mesh)
        .map(|next| next.as_ptr() as usize - rest.as_ptr() as usize)
        .unwrap_or(rest.len());
    Some(&dom[start..start + tag.len() + end])
}

/// The page's body up to its script: what failure messages show of it.
fn body_of(dom: &str) -> &str {
    let start = dom.find("<body").unwrap_or(0);
    let end = dom[start..]
        .find("<script")
        .map_or(dom.len(), |end| start + end);
    &dom[start..end]
}

/// Undoes the escapes Chromium writes in text.
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

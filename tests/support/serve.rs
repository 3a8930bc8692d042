//! A `monarch-host serve` process for the tests, on loopback, with its own
//! scratch directory; killed when dropped.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The token the test servers are started with.
pub const TOKEN: &str = "serve-test-token";

/// A second token the test servers accept: another owner.
pub const OTHER_TOKEN: &str = "serve-test-other-token";

/// A directory removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A fresh directory named after `name` and this process.
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("monarch-serve-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running server.
pub struct ServeProcess {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its data directory.
    pub data: PathBuf,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl ServeProcess {
    /// Starts `monarch-host serve` with the token, data in `dir/data`, and
    /// `extra` arguments; waits until it listens.
    pub fn start(dir: &Path, extra: &[&str]) -> ServeProcess {
        // Clients read `token` (or `other-token`); the server takes both,
        // one per line.
        std::fs::write(dir.join("token"), format!("{TOKEN}\n")).expect("the token file");
        std::fs::write(dir.join("other-token"), format!("{OTHER_TOKEN}\n"))
            .expect("the token file");
        let token_file = dir.join("server-tokens");
        std::fs::write(&token_file, format!("{TOKEN}\n{OTHER_TOKEN}\n")).expect("the token file");
        let log = format!(
            "server-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        Self::spawn(dir, "--token-file", &token_file, &log, extra)
    }

    /// Starts `monarch-host serve` with the tokens file `tokens` (written
    /// to `dir/tokens`; `--tokens-file`, no `--token-file`), data in
    /// `dir/data`, and `extra` arguments; waits until it listens.
    pub fn start_with_tokens(dir: &Path, tokens: &str, extra: &[&str]) -> ServeProcess {
        let tokens_file = dir.join("tokens");
        std::fs::write(&tokens_file, tokens).expect("the tokens file");
        Self::spawn(
            dir,
            "--tokens-file",
            &tokens_file,
            "server-tenants.log",
            extra,
        )
    }

    /// Starts the server with `auth_flag auth_file`, its stderr in
    /// `dir/log`; waits until it writes its port file.
    fn spawn(
        dir: &Path,
        auth_flag: &str,
        auth_file: &Path,
        log: &str,
        extra: &[&str],
    ) -> ServeProcess {
        let port_file = dir.join("port");
        let _ = std::fs::remove_file(&port_file);
        let data = dir.join("data");
        let log = dir.join(log);
        let child = Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--data"])
            .arg(&data)
            .arg(auth_flag)
            .arg(auth_file)
            .arg("--port-file")
            .arg(&port_file)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the server's log"))
            .spawn()
            .expect("start monarch-host serve");
        let mut server = ServeProcess {
            child: Some(child),
            base: String::new(),
            data,
            log,
        };
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(text) = std::fs::read_to_string(&port_file)
                && let Some(addr) = text.strip_suffix('\n')
            {
                server.base = format!("http://{addr}");
                return server;
            }
            if let Some(child) = server.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("the server exited ({status}): {}", server.log_text());
            }
            assert!(
                Instant::now() < until,
                "the server did not listen within 60 s: {}",
                server.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// What the server wrote to stderr.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server with SIGTERM and waits for it to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("a running server");
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        child.wait().expect("the server's exit status")
    }

    /// A client of the server's API with the token.
    pub fn client(&self) -> monarch_host::serve::client::ApiClient {
        monarch_host::serve::client::ApiClient::new(
            &self.base,
            Some(TOKEN.into()),
            Duration::from_secs(60),
        )
        .expect("a client")
    }

    /// A request to `path` with the token.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.request_as(TOKEN, method, path)
    }

    /// A request to `path` with `token` (another principal's).
    pub fn request_as(
        &self,
        token: &str,
        method: reqwest::Method,
        path: &str,
    ) -> reqwest::RequestBuilder {
        reqwest::Client::new()
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token)
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends `request`; the status and the body as JSON (or as a string).
pub async fn send(request: reqwest::RequestBuilder) -> (u16, serde_json::Value) {
    let response = request.send().await.expect("an answer");
    let status = response.status().as_u16();
    let text = response.text().await.expect("a body");
    let body = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, body)
}

/// Waits until job `id` has a final status, polling every 50 ms; panics
/// past `within`.
pub async fn finished(
    client: &monarch_host::serve::client::ApiClient,
    id: u64,
    within: Duration,
) -> monarch_host::serve::api::JobInfo {
    let until = Instant::now() + within;
    loop {
        let job = client.job(id).await.expect("the job");
        if job.status.is_final() {
            return job;
        }
        assert!(
            Instant::now() < until,
            "job {id} still {:?} after {within:?}",
            job.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

//! A client of the server's HTTP API, for the CLI (`submit`, `jobs`,
//! `logs`, `cancel`), the tests and the benchmarks.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;

use super::api::*;

/// Talks to one server.
#[derive(Clone)]
pub struct ApiClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
    /// For log streams, which last as long as their job: no read timeout.
    streams: reqwest::Client,
}

impl ApiClient {
    /// A client of the server at `base` (`http://HOST:PORT`), presenting
    /// `token`; each request but a log stream must finish within `timeout`.
    pub fn new(base: &str, token: Option<String>, timeout: Duration) -> Result<ApiClient, String> {
        let base = base.trim_end_matches('/').to_string();
        if !base.starts_with("http://") {
            return Err(format!(
                "the server address `{base}` must start with http:// (for example http://127.0.0.1:7171)"
            ));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .read_timeout(timeout)
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
        let streams = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
        Ok(ApiClient {
            base,
            token,
            http,
            streams,
        })
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    async fn send<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, String> {
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = response
            .bytes()
            .await
            .map_err(|e| format!("the server's answer was cut off: {e}"))?;
        if !status.is_success() {
            let mut text = error_text(status, &body);
            if let Some(seconds) = retry_after {
                text.push_str(&format!("; the server asks to retry after {seconds} s"));
            }
            return Err(text);
        }
        serde_json::from_slice(&body)
            .map_err(|e| format!("the server's answer is not what this client expects: {e}"))
    }

    fn unreachable(&self, e: reqwest::Error) -> String {
        if e.is_timeout() {
            format!("the server at {} did not answer in time", self.base)
        } else {
            format!("cannot reach the server at {}: {e}", self.base)
        }
    }

    /// The principal this client's token is (`GET /v1/principal`): its
    /// name, role, quotas and use.
    pub async fn principal(&self) -> Result<PrincipalInfo, String> {
        self.send(self.request(Method::GET, "/v1/principal")).await
    }

    /// Uploads a component.
    pub async fn upload(&self, bytes: Vec<u8>) -> Result<UploadReply, String> {
        self.send(
            self.request(Method::POST, "/v1/components")
                .header(reqwest::header::CONTENT_TYPE, "application/wasm")
                .body(bytes),
        )
        .await
    }

    /// Uploads a component as [`ApiClient::upload`] does, telling `sent`
    /// how many more bytes went out as the body goes (a progress bar).
    pub async fn upload_with_progress(
        &self,
        bytes: Vec<u8>,
        sent: impl Fn(u64) + Send + Sync + 'static,
    ) -> Result<UploadReply, String> {
        const CHUNK: usize = 64 << 10;
        let len = bytes.len();
        let bytes = hyper::body::Bytes::from(bytes);
        let chunks: Vec<hyper::body::Bytes> = (0..len)
            .step_by(CHUNK)
            .map(|at| bytes.slice(at..(at + CHUNK).min(len)))
            .collect();
        let frames = futures::stream::iter(chunks.into_iter().map(move |chunk| {
            sent(chunk.len() as u64);
            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(chunk))
        }));
        let body = reqwest::Body::wrap(http_body_util::StreamBody::new(frames));
        self.send(
            self.request(Method::POST, "/v1/components")
                .header(reqwest::header::CONTENT_TYPE, "application/wasm")
                .header(reqwest::header::CONTENT_LENGTH, len)
                .body(body),
        )
        .await
    }

    /// Submits a job; returns its id.
    pub async fn submit(&self, job: &JobRequest) -> Result<u64, String> {
        let created: Created = self
            .send(self.request(Method::POST, "/v1/jobs").json(job))
            .await?;
        Ok(created.id)
    }

    /// One job.
    pub async fn job(&self, id: u64) -> Result<JobInfo, String> {
        self.send(self.request(Method::GET, &format!("/v1/jobs/{id}")))
            .await
    }

    /// The newest `limit` jobs.
    pub async fn jobs(&self, limit: usize) -> Result<Vec<JobInfo>, String> {
        let list: JobList = self
            .send(self.request(Method::GET, &format!("/v1/jobs?limit={limit}")))
            .await?;
        Ok(list.jobs)
    }

    /// Cancels a job.
    pub async fn cancel(&self, id: u64) -> Result<JobInfo, String> {
        self.send(self.request(Method::DELETE, &format!("/v1/jobs/{id}")))
            .await
    }

    /// The stacks of running job `id`, sampled without stopping its
    /// actors, as the server gives them ([`StacksReport`]).
    pub async fn stacks(&self, id: u64) -> Result<serde_json::Value, String> {
        self.send(self.request(Method::GET, &format!("/v1/jobs/{id}/stacks")))
            .await
    }

    /// Where a running job's debug hub is (a job with breakpoints on).
    pub async fn debug_endpoint(&self, id: u64) -> Result<serde_json::Value, String> {
        self.send(self.request(Method::GET, &format!("/v1/jobs/{id}/debug")))
            .await
    }

    /// Creates a persistent mesh.
    pub async fn create_mesh(&self, name: &str, procs: u32) -> Result<MeshInfo, String> {
        let request = MeshRequest {
            name: name.to_string(),
            procs,
        };
        self.send(self.request(Method::POST, "/v1/meshes").json(&request))
            .await
    }

    /// Meshes.
    pub async fn meshes(&self) -> Result<Vec<MeshInfo>, String> {
        let list: MeshList = self.send(self.request(Method::GET, "/v1/meshes")).await?;
        Ok(list.meshes)
    }

    /// Opens a console session.
    pub async fn open_session(&self, request: &SessionRequest) -> Result<SessionInfo, String> {
        // Opening builds and compiles the built-in REPL the first time.
        let request = self
            .streams
            .post(format!("{}/v1/sessions", self.base))
            .json(request);
        self.send(self.authorized(request)).await
    }

    /// Session `name`; Err with the server's words, and the status (404
    /// none, 403 another token's, 410 ended).
    pub async fn session(&self, name: &str) -> Result<SessionInfo, (Option<StatusCode>, String)> {
        let response = self
            .request(Method::GET, &format!("/v1/sessions/{name}"))
            .send()
            .await
            .map_err(|e| (None, self.unreachable(e)))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| (None, format!("the server's answer was cut off: {e}")))?;
        if !status.is_success() {
            return Err((Some(status), error_text(status, &body)));
        }
        serde_json::from_slice(&body).map_err(|e| {
            (
                None,
                format!("the server's answer is not what this client expects: {e}"),
            )
        })
    }

    /// Sessions, running then ended.
    pub async fn sessions(&self) -> Result<Vec<SessionInfo>, String> {
        let list: SessionList = self.send(self.request(Method::GET, "/v1/sessions")).await?;
        Ok(list.sessions)
    }

    /// Closes session `name`.
    pub async fn close_session(&self, name: &str) -> Result<SessionInfo, String> {
        self.send(self.request(Method::DELETE, &format!("/v1/sessions/{name}")))
            .await
    }

    /// Runs `line` in session `name`, waiting as long as it runs.
    pub async fn input(&self, name: &str, line: &str) -> Result<InputReply, String> {
        let request = self
            .streams
            .post(format!("{}/v1/sessions/{name}/input", self.base))
            .json(&InputRequest {
                line: line.to_string(),
            });
        self.send(self.authorized(request)).await
    }

    /// Ctrl-C for session `name`'s running input.
    pub async fn interrupt(&self, name: &str) -> Result<SessionInfo, String> {
        self.send(self.request(Method::POST, &format!("/v1/sessions/{name}/interrupt")))
            .await
    }

    /// Attaches to session `name`: its event stream (`hello`, then `out`,
    /// `result`, `end`), to read with [`SseParser`].
    pub async fn session_stream(&self, name: &str) -> Result<reqwest::Response, String> {
        self.open_stream(&format!("/v1/sessions/{name}/stream"))
            .await
    }

    /// Job `id`'s log as a stream of `log` events (then `end`).
    pub async fn log_stream(&self, id: u64) -> Result<reqwest::Response, String> {
        self.open_stream(&format!("/v1/jobs/{id}/logs")).await
    }

    async fn open_stream(&self, path: &str) -> Result<reqwest::Response, String> {
        let request = self.streams.get(format!("{}{path}", self.base));
        let response = self
            .authorized(request)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        if !response.status().is_success() {
            let status = response.status();
            let body = response.bytes().await.unwrap_or_default();
            return Err(error_text(status, &body));
        }
        Ok(response)
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Follows job `id`'s log from its first line, handing each line to
    /// `line`, until the job ends; returns how it ended.
    pub async fn follow_logs(&self, id: u64, mut line: impl FnMut(&str)) -> Result<LogEnd, String> {
        let request = self.streams.get(format!("{}/v1/jobs/{id}/logs", self.base));
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let mut response = request.send().await.map_err(|e| self.unreachable(e))?;
        if !response.status().is_success() {
            let status = response.status();
            let body = response.bytes().await.unwrap_or_default();
            return Err(error_text(status, &body));
        }
        let mut parser = SseParser::default();
        loop {
            let chunk = response
                .chunk()
                .await
                .map_err(|e| format!("the log stream was cut off: {e}"))?;
            let Some(chunk) = chunk else {
                return Err("the log stream ended before the job did".into());
            };
            for (event, data) in parser.feed(&chunk) {
                match event.as_str() {
                    "log" => line(&data),
                    "end" => {
                        return serde_json::from_str(&data)
                            .map_err(|e| format!("a bad end of the log stream: {e}"));
                    }
                    _ => {}
                }
            }
        }
    }

    /// Opens a debug bridge to running job `id`'s debug hub (a job with
    /// breakpoints on): `{"bridge", "job", "stream", "input",
    /// "idle_timeout_s"}`.
    pub async fn debug_bridge(&self, id: u64) -> Result<serde_json::Value, String> {
        self.send(self.request(Method::POST, &format!("/v1/jobs/{id}/debug/bridges")))
            .await
    }

    /// Debug bridge `bridge`'s stream: `hub` events (the hub's JSON
    /// lines), then `end`, to read with [`SseParser`].
    pub async fn debug_bridge_stream(
        &self,
        id: u64,
        bridge: &str,
    ) -> Result<reqwest::Response, String> {
        self.open_stream(&format!("/v1/jobs/{id}/debug/bridges/{bridge}/stream"))
            .await
    }

    /// Sends `line` to debug bridge `bridge`'s hub.
    pub async fn debug_bridge_input(
        &self,
        id: u64,
        bridge: &str,
        line: &str,
    ) -> Result<serde_json::Value, String> {
        let path = format!("/v1/jobs/{id}/debug/bridges/{bridge}/input");
        let body = serde_json::json!({ "line": line });
        self.send(self.request(Method::POST, &path).json(&body))
            .await
    }

    /// Closes debug bridge `bridge`.
    pub async fn debug_bridge_close(
        &self,
        id: u64,
        bridge: &str,
    ) -> Result<serde_json::Value, String> {
        let path = format!("/v1/jobs/{id}/debug/bridges/{bridge}");
        self.send(self.request(Method::DELETE, &path)).await
    }
}

fn error_text(status: StatusCode, body: &[u8]) -> String {
    match serde_json::from_slice::<ApiError>(body) {
        Ok(error) => format!("{} ({status})", error.error),
        Err(_) => format!(
            "the server answered {status}: {}",
            String::from_utf8_lossy(body).trim()
        ),
    }
}

/// Splits a Server-Sent Events stream into (event, data) pairs.
#[derive(Default)]
pub struct SseParser {
    buffer: Vec<u8>,
    event: String,
    data: Vec<String>,
}

impl SseParser {
    /// Takes the next bytes of the stream; returns the events they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<(String, String)> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(at) = self.buffer.iter().position(|&b| b == b'\n') {
            let raw: Vec<u8> = self.buffer.drain(..=at).collect();
            let text = String::from_utf8_lossy(&raw[..raw.len() - 1]);
            let text = text.strip_suffix('\r').unwrap_or(&text);
            if text.is_empty() {
                if !self.data.is_empty() {
                    let event = std::mem::take(&mut self.event);
                    let event = if event.is_empty() {
                        "message".into()
                    } else {
                        event
                    };
                    events.push((event, self.data.join("\n")));
                    self.data.clear();
                }
                self.event.clear();
                continue;
            }
            if text.starts_with(':') {
                continue;
            }
            let (field, value) = text.split_once(':').unwrap_or((text, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => self.event = value.to_string(),
                "data" => self.data.push(value.to_string()),
                _ => {}
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::SseParser;

    #[test]
    fn sse_events_split_across_chunks_come_out_whole() {
        let mut parser = SseParser::default();
        let stream = b"event: log\ndata: [controller] hi\n\n: keep-alive\n\nevent: log\ndata: a\ndata: b\n\nevent: end\ndata: {\"status\":\"succeeded\"}\n\n";
        let mut events = Vec::new();
        for chunk in stream.chunks(7) {
            events.extend(parser.feed(chunk));
        }
        assert_eq!(
            events,
            vec![
                ("log".to_string(), "[controller] hi".to_string()),
                ("log".to_string(), "a\nb".to_string()),
                ("end".to_string(), "{\"status\":\"succeeded\"}".to_string()),
            ]
        );
    }
}

//! Debug bridges: the `monarch_dbg>` prompt of a running job's debug hub
//! over the server's own HTTP, so that a debugger outside the cluster
//! needs only the server's address and token
//! (`monarch-host debug --server URL JOB`).
//!
//! - DB-1: `POST /v1/jobs/{id}/debug/bridges` connects the server to the
//!   job's hub on the hub's unix socket as a `client` (the hub's hello,
//!   with the job's debug token, which never leaves the server) and
//!   answers with the bridge's id once the hub has greeted it.
//! - DB-2: `GET .../bridges/{bridge}/stream` is the hub's side: an SSE
//!   `hub` event per JSON line the hub sends (`{"out", "prompt", "bye"}`,
//!   as a local debugger reads them, the greeting first), then one `end`
//!   (`{"reason", "job_ended"}`). One stream per bridge.
//! - DB-3: `POST .../bridges/{bridge}/input` (`{"line"}`) sends one line
//!   to the hub, in order; what it prints comes on the stream.
//! - DB-4: a bridge closes, and its hub client with it, when its stream's
//!   client goes away, the hub closes (`quit`, or the job ended), the job
//!   ends, `DELETE .../bridges/{bridge}` is called, or no stream is opened
//!   within [`IDLE`]. Its routes then answer 410 with why.
//! - DB-5: a bridge belongs to the token that opened it; another token
//!   gets 403. Every request but the stream ends within a few seconds.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, State as With};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use utoipa::ToSchema;

use super::State;
use super::api::ApiError;
use super::handlers::{Answer, Caller, Fail, fail, internal, ok, parse_json};
use crate::debug::hub::{Endpoint, connect};

/// How long reaching the hub and its greeting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a bridge waits for its stream before it is dropped.
const IDLE: Duration = Duration::from_secs(30);

/// How long an input waits for room in the queue to the hub.
const INPUT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a bridge checks that its job still runs.
const JOB_CHECK: Duration = Duration::from_millis(500);

/// Bridges open at once on one server.
const MAX_BRIDGES: usize = 64;

/// Ended bridges remembered, to answer 410 rather than 404.
const ENDED_KEPT: usize = 256;

/// Lines from the hub held for a stream that reads slowly (or has not
/// been opened yet).
const FROM_HUB_LINES: usize = 1024;

/// An open bridge (`POST /v1/jobs/{id}/debug/bridges`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DebugBridge {
    /// The bridge's id.
    pub bridge: String,
    /// The job it debugs.
    pub job: u64,
    /// Its stream of what the hub sends (SSE).
    pub stream: String,
    /// Where its lines go (`POST`, `{"line": ...}`).
    pub input: String,
    /// How long it waits for its stream to be opened before it closes.
    pub idle_timeout_s: u64,
}

/// One line typed at the `monarch_dbg>` prompt (or at an attached rank's).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DebugLine {
    /// The line, without its newline.
    pub line: String,
}

/// A line was queued for the hub; what it prints comes on the stream.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DebugLineQueued {
    /// Always true.
    pub queued: bool,
}

/// How a bridge ended: the data of its stream's `end` event, and the
/// answer to `DELETE`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DebugBridgeEnd {
    /// The bridge's id.
    pub bridge: String,
    /// Why it ended.
    pub reason: String,
    /// Whether it ended because the job's hub did (the job ended): what a
    /// local debugger shows as "the run has ended".
    pub job_ended: bool,
}

/// Why a bridge ended.
#[derive(Clone)]
struct Ending {
    reason: String,
    job_ended: bool,
}

struct Bridge {
    id: String,
    /// The server's data directory: bridges of another server in this
    /// process (the tests) are not found.
    scope: PathBuf,
    job: u64,
    owner: String,
    /// Lines to the hub, in order.
    to_hub: mpsc::Sender<String>,
    /// Lines from the hub, until a stream takes them.
    from_hub: Mutex<Option<mpsc::Receiver<String>>>,
    ended: Mutex<Option<Ending>>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Bridge {
    fn ending(&self) -> Option<Ending> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Ends the bridge (once): its tasks stop, which closes its
    /// connection to the hub, and its stream ends with `why`.
    fn close(&self, reason: String, job_ended: bool) {
        {
            let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
            if ended.is_some() {
                return;
            }
            *ended = Some(Ending {
                reason: reason.clone(),
                job_ended,
            });
        }
        {
            let mut registry = registry();
            registry.open.remove(&self.id);
            registry.ended.push_back(Ended {
                id: self.id.clone(),
                scope: self.scope.clone(),
                job: self.job,
                owner: self.owner.clone(),
                reason,
            });
            while registry.ended.len() > ENDED_KEPT {
                registry.ended.pop_front();
            }
        }
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            task.abort();
        }
    }

    fn end_of(&self) -> DebugBridgeEnd {
        let ending = self.ending().unwrap_or(Ending {
            reason: "closed".into(),
            job_ended: false,
        });
        DebugBridgeEnd {
            bridge: self.id.clone(),
            reason: ending.reason,
            job_ended: ending.job_ended,
        }
    }
}

struct Ended {
    id: String,
    scope: PathBuf,
    job: u64,
    owner: String,
    reason: String,
}

#[derive(Default)]
struct Registry {
    open: HashMap<String, Arc<Bridge>>,
    ended: VecDeque<Ended>,
}

static BRIDGES: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

fn registry() -> MutexGuard<'static, Registry> {
    BRIDGES.lock().unwrap_or_else(|p| p.into_inner())
}

fn job_id(text: &str) -> Result<u64, Fail> {
    text.parse().map_err(|_| {
        fail(
            StatusCode::BAD_REQUEST,
            format!("`{}` is not a job id", text.escape_debug()),
        )
    })
}

/// Job `id`'s status; 404 if there is none.
fn job_status(state: &State, id: u64) -> Result<super::api::JobStatus, Fail> {
    state
        .db
        .job(id)
        .map_err(internal)?
        .map(|job| job.status)
        .ok_or_else(|| fail(StatusCode::NOT_FOUND, format!("no job {id}")))
}

/// The open bridge `bridge` of job `id`, if the caller owns it (DB-5); an
/// ended one is 410 with why it ended.
fn owned(state: &State, caller: &Caller, id: &str, bridge: &str) -> Result<Arc<Bridge>, Fail> {
    let job = job_id(id)?;
    let scope = &state.config.data;
    let forbidden = || {
        fail(
            StatusCode::FORBIDDEN,
            format!("the debug bridge {bridge} belongs to another token"),
        )
    };
    {
        let registry = registry();
        if let Some(open) = registry.open.get(bridge)
            && open.scope == *scope
            && open.job == job
        {
            return match open.owner == caller.name() {
                true => Ok(open.clone()),
                false => Err(forbidden()),
            };
        }
        if let Some(ended) = registry
            .ended
            .iter()
            .find(|e| e.id == bridge && e.scope == *scope && e.job == job)
        {
            return match ended.owner == caller.name() {
                true => Err(fail(
                    StatusCode::GONE,
                    format!("the debug bridge {bridge} has ended: {}", ended.reason),
                )),
                false => Err(forbidden()),
            };
        }
    }
    job_status(state, job)?;
    Err(fail(
        StatusCode::NOT_FOUND,
        format!(
            "job {job} has no debug bridge `{}`; open one with POST /v1/jobs/{job}/debug/bridges",
            bridge.escape_debug()
        ),
    ))
}

/// Opens a debug bridge to a running job's debug hub (a job submitted
/// with `"debug": true`): the server connects to the hub and the hub
/// greets it; its stream and input routes are in the answer (DB-1).
#[utoipa::path(
    post,
    path = "/v1/jobs/{id}/debug/bridges",
    params(("id" = u64, Path)),
    responses(
        (status = 201, body = DebugBridge),
        (status = 404, body = ApiError),
        (status = 409, description = "The job is not running, or runs without breakpoints", body = ApiError),
        (status = 429, description = "Too many bridges are open", body = ApiError),
        (status = 502, description = "The job's debug hub could not be reached", body = ApiError)
    )
)]
pub(super) async fn open(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Answer<DebugBridge> {
    let job = job_id(&id)?;
    let status = super::handlers::find_job(&state, &caller, job)?.status;
    let live = state.live().get(&job).cloned();
    let endpoint =
        live.and_then(|live| live.debug.lock().unwrap_or_else(|p| p.into_inner()).clone());
    let not_running = || {
        fail(
            StatusCode::CONFLICT,
            format!("job {job} is not running ({})", status.as_str()),
        )
    };
    let Some(endpoint) = endpoint else {
        return Err(match status.is_final() {
            true => not_running(),
            false => fail(
                StatusCode::CONFLICT,
                format!(
                    "job {job} runs without breakpoints (submit it with \"debug\": true, or `monarch-host submit --debug`), or has not started yet"
                ),
            ),
        });
    };
    let Some(control) = crate::debug::hub::find(&endpoint.token).map(|hub| hub.control.clone())
    else {
        return Err(not_running());
    };
    let scope = state.config.data.clone();
    let open = registry()
        .open
        .values()
        .filter(|b| b.scope == scope)
        .count();
    if open >= MAX_BRIDGES {
        return Err(fail(
            StatusCode::TOO_MANY_REQUESTS,
            format!("{open} debug bridges are open on this server, the most it keeps; close one"),
        ));
    }
    // The hub's hello, then its greeting: an error (a wrong token) comes
    // instead of the greeting.
    let connected = tokio::time::timeout(CONNECT_TIMEOUT, async {
        let (read, write) = connect(
            &Endpoint::Unix(control),
            &endpoint.token,
            "client",
            json!({}),
        )
        .await?;
        let mut lines = BufReader::new(read).lines();
        let first = lines
            .next_line()
            .await
            .map_err(|e| format!("reading the hub's greeting: {e}"))?
            .ok_or("the hub closed the connection before greeting")?;
        let said: Value = serde_json::from_str(&first)
            .map_err(|e| format!("the hub sent a bad greeting: {e}"))?;
        if let Some(error) = said.get("error").and_then(Value::as_str) {
            return Err(error.to_string());
        }
        Ok((lines, write, first))
    })
    .await;
    let (mut lines, mut write, greeting) = match connected {
        Ok(Ok(connected)) => connected,
        Ok(Err(e)) => {
            return Err(fail(
                StatusCode::BAD_GATEWAY,
                format!("cannot reach job {job}'s debug hub: {e}"),
            ));
        }
        Err(_) => {
            return Err(fail(
                StatusCode::BAD_GATEWAY,
                format!(
                    "job {job}'s debug hub did not answer within {} s",
                    CONNECT_TIMEOUT.as_secs()
                ),
            ));
        }
    };
    let id = crate::debug::runs::random_token().map_err(internal)?;
    let (to_hub, mut outgoing) = mpsc::channel::<String>(64);
    let (incoming, from_hub) = mpsc::channel::<String>(FROM_HUB_LINES);
    let _ = incoming.try_send(greeting);
    let bridge = Arc::new(Bridge {
        id: id.clone(),
        scope,
        job,
        owner: caller.name().to_string(),
        to_hub,
        from_hub: Mutex::new(Some(from_hub)),
        ended: Mutex::new(None),
        tasks: Mutex::new(Vec::new()),
    });
    registry().open.insert(id.clone(), bridge.clone());
    let weak = Arc::downgrade(&bridge);
    // From the hub to the stream.
    let reader = {
        let weak = weak.clone();
        tokio::spawn(async move {
            let mut quit = false;
            let (reason, job_ended) = loop {
                match lines.next_line().await {
                    Ok(Some(line)) => {
                        quit = serde_json::from_str::<Value>(&line)
                            .ok()
                            .and_then(|said| said.get("bye").and_then(Value::as_bool))
                            == Some(true);
                        if incoming.send(line).await.is_err() {
                            break ("its stream went away".to_string(), false);
                        }
                    }
                    Ok(None) if quit => break ("the debugger quit".to_string(), false),
                    Ok(None) => {
                        break (format!("job {job}'s debug hub closed the connection"), true);
                    }
                    Err(e) => break (format!("reading from job {job}'s debug hub: {e}"), true),
                }
            };
            close_weak(&weak, reason, job_ended);
        })
    };
    // From the inputs to the hub.
    let writer = {
        let weak = weak.clone();
        tokio::spawn(async move {
            while let Some(line) = outgoing.recv().await {
                let mut message = json!({ "line": line }).to_string();
                message.push('\n');
                if let Err(e) = write.write_all(message.as_bytes()).await {
                    close_weak(
                        &weak,
                        format!("writing to job {job}'s debug hub: {e}"),
                        true,
                    );
                    return;
                }
            }
        })
    };
    // Ends the bridge with its job, or when no stream came.
    let watch = {
        let weak = weak.clone();
        let state = Arc::downgrade(&state);
        tokio::spawn(async move {
            let opened = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(JOB_CHECK).await;
                let Some(bridge) = weak.upgrade() else { return };
                let running = state
                    .upgrade()
                    .is_some_and(|state| state.live().contains_key(&job));
                if !running {
                    bridge.close(format!("job {job} has ended"), true);
                    return;
                }
                let streamed = bridge
                    .from_hub
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_none();
                if !streamed && opened.elapsed() >= IDLE {
                    let why = format!("no stream was opened within {} s", IDLE.as_secs());
                    bridge.close(why, false);
                    return;
                }
            }
        })
    };
    bridge
        .tasks
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend([
            reader.abort_handle(),
            writer.abort_handle(),
            watch.abort_handle(),
        ]);
    // A task that ended it before its tasks were listed stopped none.
    if bridge.ending().is_some() {
        for task in [reader, writer, watch] {
            task.abort();
        }
    }
    tracing::info!(job, bridge = %id, "debug bridge opened");
    ok(
        StatusCode::CREATED,
        DebugBridge {
            stream: format!("/v1/jobs/{job}/debug/bridges/{id}/stream"),
            input: format!("/v1/jobs/{job}/debug/bridges/{id}/input"),
            bridge: id,
            job,
            idle_timeout_s: IDLE.as_secs(),
        },
    )
}

/// Closes the bridge `weak`, if it is still there.
fn close_weak(weak: &Weak<Bridge>, reason: String, job_ended: bool) {
    if let Some(bridge) = weak.upgrade() {
        bridge.close(reason, job_ended);
    }
}

/// Closes the bridge when its stream is dropped: its client went away.
struct CloseOnDrop(Arc<Bridge>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close("its stream's client went away".into(), false);
    }
}

/// What a debug bridge's hub sends, as Server-Sent Events: `hub` (one
/// JSON line of the hub: `{"out": TEXT, "prompt": TEXT or null, "bye":
/// true at the end}`, the greeting first), then `end`
/// ([`DebugBridgeEnd`]). One stream per bridge; the bridge closes when
/// this stream's client goes away (DB-2, DB-4).
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/debug/bridges/{bridge}/stream",
    params(("id" = u64, Path), ("bridge" = String, Path)),
    responses(
        (status = 200, description = "text/event-stream: hub, end"),
        (status = 403, description = "Another token's", body = ApiError),
        (status = 404, body = ApiError),
        (status = 409, description = "The bridge has a stream already", body = ApiError),
        (status = 410, description = "The bridge has ended", body = ApiError)
    )
)]
pub(super) async fn stream(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path((id, bridge)): Path<(String, String)>,
) -> Result<Response, Fail> {
    let bridge = owned(&state, &caller, &id, &bridge)?;
    let from_hub = bridge
        .from_hub
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    let Some(from_hub) = from_hub else {
        return Err(fail(
            StatusCode::CONFLICT,
            format!(
                "the debug bridge {} has a stream already; open another bridge",
                bridge.id
            ),
        ));
    };
    let guard = CloseOnDrop(bridge);
    let events = futures::stream::unfold(
        (from_hub, Some(guard)),
        |(mut from_hub, guard)| async move {
            let guard = guard?;
            let event = match from_hub.recv().await {
                Some(line) => Event::default().event("hub").data(line),
                None => {
                    let end = guard.0.end_of();
                    let data = serde_json::to_string(&end).unwrap_or_default();
                    let event = Event::default().event("end").data(data);
                    return Some((Ok::<_, std::convert::Infallible>(event), (from_hub, None)));
                }
            };
            Some((Ok(event), (from_hub, Some(guard))))
        },
    );
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
        .into_response())
}

/// Sends one line to a debug bridge's hub, after the lines sent before
/// it; what it prints comes on the bridge's stream (DB-3).
#[utoipa::path(
    post,
    path = "/v1/jobs/{id}/debug/bridges/{bridge}/input",
    params(("id" = u64, Path), ("bridge" = String, Path)),
    request_body = DebugLine,
    responses(
        (status = 202, body = DebugLineQueued),
        (status = 400, description = "Not one line", body = ApiError),
        (status = 403, description = "Another token's", body = ApiError),
        (status = 404, body = ApiError),
        (status = 410, description = "The bridge has ended", body = ApiError),
        (status = 503, description = "The hub takes no lines now", body = ApiError)
    )
)]
pub(super) async fn input(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path((id, bridge)): Path<(String, String)>,
    super::handlers::JsonBody(body): super::handlers::JsonBody,
) -> Answer<DebugLineQueued> {
    let request: DebugLine = parse_json(&body, "input")?;
    let bridge = owned(&state, &caller, &id, &bridge)?;
    if request.line.contains(['\n', '\r']) {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "send one line at a time, without its newline",
        ));
    }
    let gone = |bridge: &Bridge| {
        fail(
            StatusCode::GONE,
            format!(
                "the debug bridge {} has ended: {}",
                bridge.id,
                bridge.end_of().reason
            ),
        )
    };
    if bridge.ending().is_some() {
        return Err(gone(&bridge));
    }
    match bridge
        .to_hub
        .send_timeout(request.line, INPUT_TIMEOUT)
        .await
    {
        Ok(()) => ok(StatusCode::ACCEPTED, DebugLineQueued { queued: true }),
        Err(mpsc::error::SendTimeoutError::Closed(_)) => Err(gone(&bridge)),
        Err(mpsc::error::SendTimeoutError::Timeout(_)) => Err(fail(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "job {}'s debug hub took no line for {} s",
                bridge.job,
                INPUT_TIMEOUT.as_secs()
            ),
        )),
    }
}

/// Closes a debug bridge: the hub sees its client leave (paused ranks
/// stay paused, as after `quit`).
#[utoipa::path(
    delete,
    path = "/v1/jobs/{id}/debug/bridges/{bridge}",
    params(("id" = u64, Path), ("bridge" = String, Path)),
    responses(
        (status = 200, body = DebugBridgeEnd),
        (status = 403, description = "Another token's", body = ApiError),
        (status = 404, body = ApiError),
        (status = 410, description = "It had ended", body = ApiError)
    )
)]
pub(super) async fn close(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path((id, bridge)): Path<(String, String)>,
) -> Answer<DebugBridgeEnd> {
    let bridge = owned(&state, &caller, &id, &bridge)?;
    bridge.close("closed by its owner (DELETE)".into(), false);
    ok(StatusCode::OK, bridge.end_of())
}

//! The routes: authentication, uploads, jobs, log streams, meshes,
//! metrics, the OpenAPI document and the dashboard.
//!
//! - HA-1: every request but `/healthz` is made as a principal
//!   ([`Caller`]); a `user` gets 403 with a reason from every route of a
//!   job, component or mesh it does not own, and lists only its own
//!   (PR-3). `/metrics` is an admin's.
//! - HA-2: a JSON body over [`JSON_LIMIT`] is 413, one that has not
//!   arrived within `--body-timeout` is 408 (an upload's likewise); each
//!   before anything is stored.
//! - HA-3: a principal may run a component by id only if it uploaded
//!   those bytes itself (or is an admin): ids are never a capability.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, RawQuery, Request, State as With};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Router};
use futures::StreamExt;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::sync::mpsc;
use utoipa::OpenApi;

use super::api::*;
use super::jobs::{self, Target};
use super::meshes::{ActorMeshAccess, validate_mesh_name};
use super::principals::Principal;
use super::quotas::{self, Usage};
use super::{State, db, sessions};
use crate::engine::{DirGrant, Grants, LoadError, parse_env};
use crate::mesh::PersistentActorMesh;
use crate::run::{Prepared, RunError};

/// The largest JSON body a route takes (HA-2).
pub(crate) const JSON_LIMIT: usize = 64 << 10;

/// The most arguments a job may have.
const MAX_ARGS: usize = 1024;

/// An error answer: a status and a sentence, as JSON.
pub(crate) struct Fail(pub(crate) StatusCode, pub(crate) String);

impl IntoResponse for Fail {
    fn into_response(self) -> Response {
        let mut response = (self.0, axum::Json(ApiError { error: self.1 })).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                "Bearer".parse().expect("a header"),
            );
        }
        response
    }
}

pub(super) fn fail(status: StatusCode, message: impl Into<String>) -> Fail {
    Fail(status, message.into())
}

pub(super) fn internal(message: String) -> Fail {
    tracing::error!(error = %message, "request failed");
    Fail(StatusCode::INTERNAL_SERVER_ERROR, message)
}

pub(super) type Answer<T> = Result<(StatusCode, axum::Json<T>), Fail>;

pub(super) fn ok<T>(status: StatusCode, value: T) -> Answer<T> {
    Ok((status, axum::Json(value)))
}

/// The routes, behind authentication.
pub(crate) fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/v1/principal", get(principal))
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/components", post(upload).get(list_components))
        .route("/v1/jobs", post(submit).get(list_jobs))
        .route("/v1/jobs/{id}", get(get_job).delete(cancel_job))
        .route("/v1/jobs/{id}/logs", get(job_logs))
        .route("/v1/jobs/{id}/dumps", get(job_dumps))
        .route("/v1/jobs/{id}/trace", get(job_trace))
        .route("/v1/jobs/{id}/dumps/{file}", get(job_dump_file))
        .route("/v1/jobs/{id}/stacks", get(job_stacks))
        .route("/v1/jobs/{id}/actors", get(job_actors))
        .route("/v1/metrics/series", get(metrics_series))
        .route("/v1/metrics/stream", get(metrics_stream))
        .route("/v1/jobs/{id}/debug", get(job_debug))
        .route(
            "/v1/jobs/{id}/debug/bridges",
            post(super::debug_bridge::open),
        )
        .route(
            "/v1/jobs/{id}/debug/bridges/{bridge}",
            delete(super::debug_bridge::close),
        )
        .route(
            "/v1/jobs/{id}/debug/bridges/{bridge}/stream",
            get(super::debug_bridge::stream),
        )
        .route(
            "/v1/jobs/{id}/debug/bridges/{bridge}/input",
            post(super::debug_bridge::input),
        )
        .route("/v1/meshes", post(create_mesh).get(list_meshes))
        .route("/v1/meshes/{name}", delete(delete_mesh))
        .route("/v1/sessions", post(sessions::create).get(sessions::list))
        .route(
            "/v1/sessions/{name}",
            get(sessions::get_one).delete(sessions::close),
        )
        .route("/v1/sessions/{name}/input", post(sessions::input))
        .route("/v1/sessions/{name}/interrupt", post(sessions::interrupt))
        .route("/v1/sessions/{name}/stream", get(sessions::stream))
        .fallback(|| async { fail(StatusCode::NOT_FOUND, "no such route; see /v1/openapi.json") })
        .layer(DefaultBodyLimit::max(JSON_LIMIT))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

/// The OpenAPI document of the routes.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "monarch-host serve",
        description = "Upload controller components, run them as jobs, follow their logs, keep meshes between jobs."
    ),
    paths(
        upload,
        list_components,
        submit,
        list_jobs,
        get_job,
        cancel_job,
        job_logs,
        job_trace,
        job_dumps,
        job_dump_file,
        job_stacks,
        job_actors,
        job_debug,
        metrics_series,
        metrics_stream,
        principal,
        super::debug_bridge::open,
        super::debug_bridge::stream,
        super::debug_bridge::input,
        super::debug_bridge::close,
        create_mesh,
        list_meshes,
        delete_mesh,
        sessions::create,
        sessions::list,
        sessions::get_one,
        sessions::close,
        sessions::input,
        sessions::interrupt,
        sessions::stream,
        metrics,
        healthz
    ),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(Deserialize)]
struct TokenQuery {
    token: Option<String>,
}

/// Every route but `/healthz` needs a principal's token: in the
/// Authorization header, or (for the dashboard page only) as `?token=`.
/// Then its principal's rate (QU-1).
async fn authenticate(With(state): With<Arc<State>>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if path == "/healthz" {
        return next.run(request).await;
    }
    let principal = if state.principals.is_empty() {
        state.anonymous.clone()
    } else {
        let from_header = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|v| v.trim().to_string());
        let from_query = (path == "/")
            .then(|| {
                Query::<TokenQuery>::try_from_uri(request.uri())
                    .ok()
                    .and_then(|q| q.0.token)
            })
            .flatten();
        let presented = from_header.or(from_query);
        match presented.as_deref().and_then(|t| state.principals.find(t)) {
            Some(principal) => principal,
            // The dashboard page holds no data: without the token it is
            // answered 401 with the page, which asks for the token.
            None if path == "/" => {
                state.unauthorized.fetch_add(1, Ordering::Relaxed);
                return (StatusCode::UNAUTHORIZED, dashboard().await).into_response();
            }
            None => {
                state.unauthorized.fetch_add(1, Ordering::Relaxed);
                let why = if presented.is_some() {
                    "wrong token"
                } else {
                    "this server needs a token: send `Authorization: Bearer TOKEN`"
                };
                return fail(StatusCode::UNAUTHORIZED, why).into_response();
            }
        }
    };
    if let Err(wait) = state.rate.take(&principal.name, Instant::now()) {
        state.rate_limited.fetch_add(1, Ordering::Relaxed);
        let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
        let limit = state.config.rate_limit;
        let mut response = fail(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "principal `{}` sent more than {} requests a second (burst {}, --rate-limit); retry after {seconds} s",
                principal.name, limit.per_second, limit.burst
            ),
        )
        .into_response();
        if let Ok(value) = seconds.to_string().parse() {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return response;
    }
    request.extensions_mut().insert(Caller(principal));
    next.run(request).await
}

/// Who made a request: the principal whose token it presented, or the
/// anonymous admin (`-`) of a server without tokens. What it makes
/// belongs to it (HA-1).
#[derive(Clone, Debug)]
pub(crate) struct Caller(pub(crate) Arc<Principal>);

impl Caller {
    /// The principal's name.
    pub(crate) fn name(&self) -> &str {
        &self.0.name
    }

    /// Whether it may see and act on what `owner` owns.
    pub(crate) fn may_see(&self, owner: Option<&str>) -> bool {
        self.0.is_admin() || owner == Some(self.name())
    }

    /// The owner to filter listings by: None (all) for an admin.
    pub(crate) fn filter(&self) -> Option<&str> {
        match self.0.is_admin() {
            true => None,
            false => Some(self.name()),
        }
    }
}

/// A JSON request's body: at most [`JSON_LIMIT`] bytes (else 413), all of
/// it within `--body-timeout` (else 408) (HA-2).
pub(crate) struct JsonBody(pub(crate) Bytes);

impl FromRequest<Arc<State>> for JsonBody {
    type Rejection = Fail;

    async fn from_request(request: Request, state: &Arc<State>) -> Result<Self, Fail> {
        let too_big = || {
            fail(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the request body is larger than this server's limit of {JSON_LIMIT} bytes for JSON"
                ),
            )
        };
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let timeout = state.config.body_timeout;
        let mut stream = request.into_body().into_data_stream();
        if declared.is_some_and(|n| n > JSON_LIMIT as u64) {
            // Read (a little of) what is still coming, so that the client
            // gets the answer rather than a reset connection.
            let _ = tokio::time::timeout(timeout, async {
                let mut drained = 0;
                while let Some(Ok(chunk)) = stream.next().await {
                    drained += chunk.len();
                    if drained > JSON_DRAIN_LIMIT {
                        break;
                    }
                }
            })
            .await;
            return Err(too_big());
        }
        let read = async {
            let mut body = Vec::new();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| {
                    fail(
                        StatusCode::BAD_REQUEST,
                        format!("the request body was cut off: {e}"),
                    )
                })?;
                if body.len() + chunk.len() > JSON_LIMIT {
                    let mut drained = body.len() + chunk.len();
                    while let Some(Ok(chunk)) = stream.next().await {
                        drained += chunk.len();
                        if drained > JSON_DRAIN_LIMIT {
                            break;
                        }
                    }
                    return Err(too_big());
                }
                body.extend_from_slice(&chunk);
            }
            Ok(Bytes::from(body))
        };
        match tokio::time::timeout(timeout, read).await {
            Ok(body) => body.map(JsonBody),
            Err(_) => Err(slow_body(timeout)),
        }
    }
}

/// The most of an oversized JSON body read only to answer it.
const JSON_DRAIN_LIMIT: usize = 4 << 20;

/// The answer to a body that did not arrive in time.
fn slow_body(timeout: std::time::Duration) -> Fail {
    fail(
        StatusCode::REQUEST_TIMEOUT,
        format!(
            "the request body did not arrive within {} s (--body-timeout)",
            timeout.as_secs_f64()
        ),
    )
}

/// 403 for a thing of another principal's.
pub(crate) fn not_yours(what: impl std::fmt::Display) -> Fail {
    fail(
        StatusCode::FORBIDDEN,
        format!("{what} belongs to another principal"),
    )
}

/// The first 12 hex digits of the sha256 of `token`: names its owner in
/// listings without showing the token.
pub(crate) fn fingerprint(token: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(token.as_bytes());
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

async fn dashboard() -> Html<&'static str> {
    Html(include_str!("dashboard.html"))
}

/// Health check, without authentication.
#[utoipa::path(get, path = "/healthz", security(()), responses((status = 200, description = "The server runs", body = String)))]
async fn healthz() -> &'static str {
    "ok"
}

async fn openapi() -> Response {
    match ApiDoc::openapi().to_pretty_json() {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => internal(format!("cannot write the OpenAPI document: {e}")).into_response(),
    }
}

/// Removes a partial upload unless it was kept.
struct PartFile(Option<std::path::PathBuf>);

impl Drop for PartFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

pub(super) fn is_component_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Uploads a component: streamed to disk and hashed, compiled, checked
/// against the `program` world, stored by its sha256.
#[utoipa::path(
    post,
    path = "/v1/components",
    request_body(content = Vec<u8>, content_type = "application/wasm", description = "The component's bytes"),
    responses(
        (status = 201, description = "Stored and compiled", body = UploadReply),
        (status = 200, description = "The same bytes were uploaded before", body = UploadReply),
        (status = 400, description = "Empty, not WebAssembly, a core module, a precompiled artifact, or does not compile", body = ApiError),
        (status = 408, description = "The bytes did not arrive within --body-timeout", body = ApiError),
        (status = 413, description = "Over the size limit", body = ApiError),
        (status = 422, description = "Not of the `program` world", body = ApiError)
    )
)]
async fn upload(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Answer<UploadReply> {
    let answer = receive(&state, &caller, &headers, body).await;
    let counter = match &answer {
        Ok((StatusCode::CREATED, _)) => &state.uploads.new,
        Ok(_) => &state.uploads.existing,
        Err(_) => &state.uploads.rejected,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    answer
}

/// Streams an upload to disk, hashing it, within `--max-upload-mib` and
/// `--body-timeout` (HA-2); compiles it unless it is known. Its owner is
/// `caller`, beside any other principal that uploaded the same bytes.
async fn receive(
    state: &Arc<State>,
    caller: &Caller,
    headers: &HeaderMap,
    body: Body,
) -> Answer<UploadReply> {
    let limit = state.config.max_upload_bytes;
    let deadline = tokio::time::Instant::now() + state.config.body_timeout;
    let too_big = || {
        fail(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the component is larger than this server's limit of {limit} bytes (--max-upload-mib)"
            ),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut stream = body.into_data_stream();
    if declared.is_some_and(|n| n > limit) {
        drain(&mut stream, deadline).await;
        return Err(too_big());
    }
    static UPLOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nth = UPLOADS.fetch_add(1, Ordering::Relaxed);
    let part_path = state
        .config
        .data
        .join("uploads")
        .join(format!("{nth}.part"));
    let mut part = PartFile(Some(part_path.clone()));
    let mut file = tokio::fs::File::create(&part_path)
        .await
        .map_err(|e| internal(format!("cannot store the upload: {e}")))?;
    let mut hasher = Sha256::new();
    let mut size: u64 = 0;
    loop {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .map_err(|_| slow_body(state.config.body_timeout))?;
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(|e| {
            fail(
                StatusCode::BAD_REQUEST,
                format!("the upload was cut off: {e}"),
            )
        })?;
        size += chunk.len() as u64;
        if size > limit {
            drain(&mut stream, deadline).await;
            return Err(too_big());
        }
        hasher.update(&chunk);
        file.write_all(&chunk)
            .await
            .map_err(|e| internal(format!("cannot store the upload: {e}")))?;
    }
    file.flush()
        .await
        .map_err(|e| internal(format!("cannot store the upload: {e}")))?;
    drop(file);
    state.uploads.bytes.fetch_add(size, Ordering::Relaxed);
    if size == 0 {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "the upload is empty: send the component's bytes as the request body",
        ));
    }
    let id: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let stored = state.component_path(&id);
    if let Some(info) = state.db.component(&id).map_err(internal)?
        && stored.exists()
    {
        // Whether *this* principal had uploaded it: another's upload of
        // the same bytes is not told (HA-3).
        let existing = state
            .db
            .owns_component(&id, caller.name())
            .map_err(internal)?;
        state
            .db
            .add_component_owner(&id, caller.name())
            .map_err(internal)?;
        return ok(
            if existing {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            },
            UploadReply {
                id,
                size: info.size,
                world: info.world,
                compile_ms: 0,
                existing,
            },
        );
    }
    let bytes = tokio::fs::read(&part_path)
        .await
        .map_err(|e| internal(format!("cannot read the upload back: {e}")))?;
    let started = Instant::now();
    let prepared = {
        let _permit = state
            .compile_gate
            .acquire()
            .await
            .map_err(|e| internal(e.to_string()))?;
        let engine = state.engine.clone();
        tokio::task::spawn_blocking(move || {
            Prepared::new(&engine, std::path::Path::new("the upload"), bytes)
        })
        .await
        .map_err(|e| internal(format!("compiling panicked: {e}")))?
    };
    let compile_ms = started.elapsed().as_millis() as u64;
    let prepared = prepared.map_err(|e| match e {
        RunError::WrongWorld { .. } => fail(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
        RunError::Load(LoadError::Read { .. }) | RunError::Host(_) => internal(e.to_string()),
        e => fail(StatusCode::BAD_REQUEST, e.to_string()),
    })?;
    tokio::fs::rename(&part_path, &stored)
        .await
        .map_err(|e| internal(format!("cannot store the component: {e}")))?;
    part.0 = None;
    let info = ComponentInfo {
        id: id.clone(),
        size,
        world: prepared.world().into(),
        uploaded_at_ms: db::now_ms(),
    };
    state.db.insert_component(&info).map_err(internal)?;
    state
        .db
        .add_component_owner(&id, caller.name())
        .map_err(internal)?;
    state
        .prepared
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(
            id.clone(),
            Arc::new(tokio::sync::OnceCell::new_with(Some(Arc::new(prepared)))),
        );
    tracing::info!(component = %id, size, compile_ms, "component uploaded");
    ok(
        StatusCode::CREATED,
        UploadReply {
            id,
            size,
            world: info.world,
            compile_ms,
            existing: false,
        },
    )
}

/// Reads and drops the rest of a refused upload (up to [`DRAIN_LIMIT`]),
/// so that the client, still sending, gets the answer rather than a
/// broken connection; no later than `deadline`.
async fn drain(stream: &mut axum::body::BodyDataStream, deadline: tokio::time::Instant) {
    let _ = tokio::time::timeout_at(deadline, async {
        let mut drained: u64 = 0;
        while let Some(Ok(chunk)) = stream.next().await {
            drained += chunk.len() as u64;
            if drained > DRAIN_LIMIT {
                break;
            }
        }
    })
    .await;
}

/// The most of a refused upload read only to answer it.
const DRAIN_LIMIT: u64 = 256 << 20;

/// Lists uploaded components: a user's own, or all for an admin.
#[utoipa::path(get, path = "/v1/components", responses((status = 200, body = ComponentList)))]
async fn list_components(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
) -> Answer<ComponentList> {
    let components = state.db.components(caller.filter()).map_err(internal)?;
    ok(StatusCode::OK, ComponentList { components })
}

/// Reads a JSON body, answering 400 with what is wrong.
pub(super) fn parse_json<T: serde::de::DeserializeOwned>(
    body: &Bytes,
    what: &str,
) -> Result<T, Fail> {
    serde_json::from_slice(body)
        .map_err(|e| fail(StatusCode::BAD_REQUEST, format!("bad {what}: {e}")))
}

/// A job's limits: what it asks for, else the defaults; each at most the
/// server's cap.
pub(super) fn limits(
    state: &State,
    asked: Option<PartialLimits>,
    procs: Option<u32>,
) -> Result<Limits, Fail> {
    let asked = asked.unwrap_or_default();
    let (default, max) = (state.config.default_limits, state.config.max_limits);
    let check = |name: &str, flag: &str, value: u64, cap: u64| {
        if value == 0 {
            Err(fail(
                StatusCode::BAD_REQUEST,
                format!("limits.{name} must be at least 1"),
            ))
        } else if value > cap {
            Err(fail(
                StatusCode::BAD_REQUEST,
                format!("limits.{name} is {value}, over this server's cap of {cap} ({flag})"),
            ))
        } else {
            Ok(())
        }
    };
    let limits = Limits {
        memory_mib: asked.memory_mib.unwrap_or(default.memory_mib),
        timeout_s: asked.timeout_s.unwrap_or(default.timeout_s),
        call_timeout_s: asked.call_timeout_s.unwrap_or(default.call_timeout_s),
        procs: procs.or(asked.procs).unwrap_or(default.procs),
        handler_timeout_s: asked.handler_timeout_s.or(default.handler_timeout_s),
    };
    if let Some(seconds) = limits.handler_timeout_s {
        // JSON has no NaN or infinity, but a caller of the library might.
        if !(seconds > 0.0 && seconds.is_finite()) {
            return Err(fail(
                StatusCode::BAD_REQUEST,
                format!("limits.handler_timeout_s is {seconds}: give more than 0 seconds"),
            ));
        }
        if seconds > max.timeout_s as f64 {
            return Err(fail(
                StatusCode::BAD_REQUEST,
                format!(
                    "limits.handler_timeout_s is {seconds}, over this server's cap of {} (--max-timeout)",
                    max.timeout_s
                ),
            ));
        }
    }
    check(
        "memory_mib",
        "--max-memory-mib",
        limits.memory_mib.into(),
        max.memory_mib.into(),
    )?;
    check(
        "timeout_s",
        "--max-timeout",
        limits.timeout_s,
        max.timeout_s,
    )?;
    check(
        "call_timeout_s",
        "--max-timeout",
        limits.call_timeout_s,
        max.call_timeout_s,
    )?;
    check(
        "procs",
        "--max-procs",
        limits.procs.into(),
        max.procs.into(),
    )?;
    Ok(limits)
}

/// The most directories, and the most environment variables, a job may be
/// granted.
const MAX_GRANTS: usize = 256;

/// What a job asks to be granted, checked: each directory is inside one of
/// `allowed` (resolved, so that neither `..` nor a symlink leads out), each
/// variable is `KEY=VALUE`. The error names the entry at fault.
fn grants(
    allowed: &[std::path::PathBuf],
    dirs: &[String],
    env: &[String],
) -> Result<Grants, String> {
    if dirs.len() > MAX_GRANTS || env.len() > MAX_GRANTS {
        return Err(format!(
            "at most {MAX_GRANTS} dirs and {MAX_GRANTS} env entries"
        ));
    }
    let dirs = dirs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            grant_dir(allowed, spec)
                .map_err(|e| format!("dirs[{i}] `{}`: {e}", spec.escape_debug()))
        })
        .collect::<Result<_, _>>()?;
    let env = env
        .iter()
        .enumerate()
        .map(|(i, spec)| parse_env(spec).map_err(|e| format!("env[{i}]: {e}")))
        .collect::<Result<_, _>>()?;
    Ok(Grants { dirs, env })
}

/// One directory a job asks for, `HOST[::GUEST][:ro|:rw]`, if `HOST` is
/// inside one of `allowed` (which are resolved already).
fn grant_dir(allowed: &[std::path::PathBuf], spec: &str) -> Result<DirGrant, String> {
    if allowed.is_empty() {
        return Err(
            "this server grants no directories; its admin can allow some with `serve --allow-dir DIR`"
                .into(),
        );
    }
    // HOST comes first in the spec: a relative one would be resolved
    // against the server's working directory, which no client knows.
    if !spec.starts_with('/') {
        return Err("HOST must be an absolute path on the server's machine".into());
    }
    let grant: DirGrant = spec.parse()?;
    // Both sides are resolved, so comparing whole components is enough:
    // `/srv/data-other` is not inside `/srv/data`.
    if !allowed.iter().any(|dir| grant.host.starts_with(dir)) {
        let allowed: Vec<String> = allowed.iter().map(|d| d.display().to_string()).collect();
        return Err(format!(
            "{} is not inside a directory this server allows ({})",
            grant.host.display(),
            allowed.join(", ")
        ));
    }
    Ok(grant)
}

/// Submits a job.
#[utoipa::path(
    post,
    path = "/v1/jobs",
    request_body = JobRequest,
    responses(
        (status = 201, description = "Queued", body = Created),
        (status = 400, description = "A bad request, limits over the server's caps, a directory outside the allowed ones or missing, a malformed env entry", body = ApiError),
        (status = 403, description = "The persistent mesh is another principal's", body = ApiError),
        (status = 404, description = "No such component (of the caller's) or mesh", body = ApiError),
        (status = 408, description = "The body did not arrive within --body-timeout", body = ApiError),
        (status = 413, description = "The body is over 64 KiB", body = ApiError),
        (status = 429, description = "Over the caller's rate or quota", body = ApiError)
    )
)]
async fn submit(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody,
) -> Answer<Created> {
    let request: JobRequest = parse_json(&body, "job request")?;
    usable_component(&state, &caller, &request.component)?;
    if request.args.len() > MAX_ARGS {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            format!("at most {MAX_ARGS} arguments"),
        ));
    }
    let (target, procs) = match &request.mesh {
        None => (Target::Fresh, None),
        Some(MeshChoice::Spec(spec)) => (Target::Fresh, Some(spec.procs)),
        Some(MeshChoice::Name(name)) => {
            usable_mesh(&state, &caller, name)?;
            (Target::Persistent(name.clone()), None)
        }
    };
    let limits = limits(&state, request.limits, procs)?;
    let grants = grants(&state.config.allowed_dirs, &request.dirs, &request.env)
        .map_err(|e| fail(StatusCode::BAD_REQUEST, e))?;
    let mesh = match &target {
        Target::Persistent(name) => Some(name.as_str()),
        Target::Fresh => None,
    };
    // The quota is checked and the job recorded as one step (QU-2).
    let _admission = state.admission.lock().unwrap_or_else(|p| p.into_inner());
    quotas::check(&state, &caller.0, job_cost(&limits, &target))?;
    let id = state
        .db
        .insert_job(
            caller.name(),
            &request.component,
            &request.args,
            mesh,
            &limits,
            &grants,
        )
        .map_err(internal)?;
    if request.debug {
        state.db.set_job_debug(id).map_err(internal)?;
    }
    let started = jobs::start(
        &state,
        id,
        caller.name(),
        request.component,
        request.args,
        limits,
        grants,
        target,
        request.debug,
        None,
    );
    if let Err(e) = started {
        let _ = state.db.finish_job(id, JobStatus::Failed, Some(&e));
        return Err(internal(e));
    }
    ok(StatusCode::CREATED, Created { id })
}

/// What a job asks of its principal's quotas.
pub(super) fn job_cost(limits: &Limits, target: &Target) -> Usage {
    Usage {
        jobs: 1,
        procs: match target {
            Target::Fresh => limits.procs.into(),
            Target::Persistent(_) => 0,
        },
        memory_mib: limits.memory_mib.into(),
    }
}

/// Checks that `caller` may run component `id`: it uploaded those bytes,
/// or is an admin (HA-3). Another's component is answered as a missing
/// one, so that ids tell nothing.
pub(super) fn usable_component(state: &State, caller: &Caller, id: &str) -> Result<(), Fail> {
    if !is_component_id(id) {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            format!(
                "`{}` is not a component id (64 hex digits, from POST /v1/components)",
                id.escape_debug()
            ),
        ));
    }
    let usable = match caller.0.is_admin() {
        true => state.db.component(id).map_err(internal)?.is_some(),
        false => state
            .db
            .owns_component(id, caller.name())
            .map_err(internal)?,
    };
    match usable {
        true => Ok(()),
        false if caller.0.is_admin() => Err(fail(
            StatusCode::NOT_FOUND,
            format!("no component {id} on this server; upload it first"),
        )),
        false => Err(fail(
            StatusCode::NOT_FOUND,
            format!(
                "no component {id} uploaded by principal `{}`; upload it first (POST /v1/components; the same bytes as another principal's are fine)",
                caller.name()
            ),
        )),
    }
}

/// Checks that persistent mesh `name` exists and `caller` may run on it:
/// the server's own meshes (`serve --mesh`) are everyone's.
pub(super) fn usable_mesh(state: &State, caller: &Caller, name: &str) -> Result<(), Fail> {
    validate_mesh_name(name).map_err(|e| fail(StatusCode::BAD_REQUEST, e))?;
    match state.persistent(name) {
        None => Err(fail(
            StatusCode::NOT_FOUND,
            format!("no persistent mesh named `{name}`; create it with POST /v1/meshes"),
        )),
        Some(mesh) if mesh.owner.is_none() || caller.may_see(mesh.owner.as_deref()) => Ok(()),
        Some(_) => Err(not_yours(format_args!("the persistent mesh `{name}`"))),
    }
}

/// Lists jobs, newest first: a user's own, or every one for an admin.
#[utoipa::path(get, path = "/v1/jobs", params(("limit" = Option<usize>, Query, description = "At most this many (100)")), responses((status = 200, body = JobList)))]
async fn list_jobs(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> Answer<JobList> {
    let mut limit = 100;
    for pair in query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        if let Some(("limit", n)) = pair.split_once('=') {
            limit = n.parse::<usize>().map_err(|_| {
                fail(
                    StatusCode::BAD_REQUEST,
                    format!("limit `{}` is not a number", n.escape_debug()),
                )
            })?;
        }
    }
    let limit = limit.clamp(1, 10_000);
    let jobs = state.db.jobs(limit, caller.filter()).map_err(internal)?;
    ok(StatusCode::OK, JobList { jobs })
}

fn job_id(text: &str) -> Result<u64, Fail> {
    text.parse().map_err(|_| {
        fail(
            StatusCode::BAD_REQUEST,
            format!("`{}` is not a job id", text.escape_debug()),
        )
    })
}

/// Job `id`, if `caller` may see it (HA-1).
pub(super) fn find_job(state: &State, caller: &Caller, id: u64) -> Result<JobInfo, Fail> {
    let job = state
        .db
        .job(id)
        .map_err(internal)?
        .ok_or_else(|| fail(StatusCode::NOT_FOUND, format!("no job {id}")))?;
    match caller.may_see(job.owner.as_deref()) {
        true => Ok(job),
        false => Err(not_yours(format_args!("job {id}"))),
    }
}

/// One job.
#[utoipa::path(get, path = "/v1/jobs/{id}", params(("id" = u64, Path)), responses((status = 200, body = JobInfo), (status = 403, description = "Another principal's", body = ApiError), (status = 404, body = ApiError)))]
async fn get_job(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Answer<JobInfo> {
    let id = job_id(&id)?;
    ok(StatusCode::OK, find_job(&state, &caller, id)?)
}

/// Cancels a job: a queued one never starts; a running controller stops
/// at its next host call or deadline tick, and its fresh mesh stops.
#[utoipa::path(delete, path = "/v1/jobs/{id}", params(("id" = u64, Path)), responses((status = 202, body = JobInfo), (status = 403, description = "Another principal's", body = ApiError), (status = 404, body = ApiError), (status = 409, description = "The job has finished", body = ApiError)))]
async fn cancel_job(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Answer<JobInfo> {
    let id = job_id(&id)?;
    let job = find_job(&state, &caller, id)?;
    let live = state.live().get(&id).cloned();
    match live {
        Some(live) if !job.status.is_final() => {
            let why = match job.owner.as_deref() == Some(caller.name()) {
                true => "cancelled by a user".to_string(),
                false => format!("cancelled by the admin `{}`", caller.name()),
            };
            live.cancel(why);
            ok(StatusCode::ACCEPTED, job)
        }
        _ => Err(fail(
            StatusCode::CONFLICT,
            format!("job {id} has already finished: {}", job.status.as_str()),
        )),
    }
}

/// Each actor's current stack in a running job, sampled at its next epoch
/// tick without stopping it (what `monarch-host stacks --server` prints).
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/stacks",
    params(("id" = u64, Path)),
    responses(
        (status = 200, body = StacksReport),
        (status = 404, body = ApiError),
        (status = 409, description = "The job is not running", body = ApiError)
    )
)]
async fn job_stacks(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<axum::Json<serde_json::Value>, Fail> {
    let id = job_id(&id)?;
    let job = find_job(&state, &caller, id)?;
    let cluster = state.live().get(&id).and_then(|live| live.run.cluster());
    let Some(cluster) = cluster else {
        let status = job.status.as_str();
        let why = match job.status.is_final() {
            true => format!("job {id} is not running ({status}): only a running job has stacks"),
            false => format!(
                "job {id} has not started its controller yet ({status}); ask again in a moment"
            ),
        };
        return Err(fail(StatusCode::CONFLICT, why));
    };
    let stacks = crate::debug::stacks::collect(&cluster).await;
    match stacks.get("error").and_then(serde_json::Value::as_str) {
        Some(error) => Err(fail(StatusCode::CONFLICT, format!("job {id}: {error}"))),
        None => Ok(axum::Json(stacks)),
    }
}

/// The actor meshes a job's controller spawned, with every rank's state;
/// a failed rank's reason, the endpoint it was handling, and its
/// post-mortem record's URL where it left one. A job that ended shows its
/// meshes as they were when they stopped.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/actors",
    params(("id" = u64, Path)),
    responses(
        (status = 200, body = Vec<JobActorMesh>),
        (status = 403, description = "Another principal's", body = ApiError),
        (status = 404, body = ApiError)
    )
)]
async fn job_actors(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Answer<Vec<JobActorMesh>> {
    let id = job_id(&id)?;
    find_job(&state, &caller, id)?;
    let mut views: Vec<Arc<super::meshes::MeshView>> = state
        .persistent
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .map(|m| m.view.clone())
        .collect();
    views.extend(
        state
            .fresh
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned(),
    );
    let mut meshes: Vec<JobActorMesh> = views.iter().flat_map(|v| v.job_actors(id)).collect();
    for stopped in state.actor_archive.get(id) {
        if !meshes.iter().any(|m| m.mesh == stopped.mesh) {
            meshes.push(stopped);
        }
    }
    let dir = crate::debug::dumps::for_job(&state.config.data, id).dir;
    let dumps = match meshes
        .iter()
        .flat_map(|m| &m.ranks)
        .any(|r| r.state == "failed")
    {
        true => tokio::task::spawn_blocking(move || match dir.is_dir() {
            true => crate::debug::dumps::read_dumps(&dir).unwrap_or_default(),
            false => Vec::new(),
        })
        .await
        .unwrap_or_default(),
        false => Vec::new(),
    };
    let scope = format!("j{id}.");
    for mesh in &mut meshes {
        for rank in &mut mesh.ranks {
            if let Some(reason) = rank.reason.take() {
                let fault =
                    hyperactor_mesh::Fault::decode(&reason, hyperactor_mesh::FaultKind::Trap);
                rank.endpoint = fault.endpoint.clone();
                rank.reason = Some(fault.to_string());
            }
            if rank.state != "failed" {
                continue;
            }
            let dump = dumps.iter().find(|d| {
                d.record.rank == rank.rank
                    && d.record.mesh.strip_prefix(&scope).unwrap_or(&d.record.mesh) == mesh.mesh
            });
            if let Some(dump) = dump {
                rank.endpoint
                    .get_or_insert_with(|| dump.record.endpoint.clone());
                rank.dump = Some(format!("/v1/jobs/{id}/dumps/{}", dump.file));
            }
        }
    }
    meshes.sort_by(|a, b| a.mesh.cmp(&b.mesh));
    ok(StatusCode::OK, meshes)
}

/// The time series of the server's samples since `since_ms` (default: 10
/// minutes ago; the last hour is kept): each proc's CPU and memory, each
/// actor mesh's calls, and the jobs that ran. A user sees the procs of the
/// meshes it may use and its own jobs' actor meshes.
#[utoipa::path(
    get,
    path = "/v1/metrics/series",
    params(
        ("since_ms" = Option<i64>, Query, description = "From when, in ms since the Unix epoch (10 minutes ago)"),
        ("job" = Option<u64>, Query, description = "Only this job's procs, actor meshes and status"),
        ("mesh" = Option<String>, Query, description = "Only the procs of this mesh and the actor meshes of this name")
    ),
    responses((status = 200, body = MetricsSeries), (status = 400, description = "A bad parameter", body = ApiError))
)]
async fn metrics_series(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> Answer<MetricsSeries> {
    let query = super::metrics::Query::parse(query.as_deref())
        .map_err(|e| fail(StatusCode::BAD_REQUEST, e))?;
    let series =
        tokio::task::spawn_blocking(move || super::metrics::series(&state, &caller, &query))
            .await
            .map_err(|e| internal(format!("reading the metrics failed: {e}")))?
            .map_err(internal)?;
    ok(StatusCode::OK, series)
}

/// The server's samples as they are taken: every interval one
/// `event: sample` whose data is a `MetricsSeries` with the newest point
/// of each series; keep-alive comments between. It ends when the server
/// stops.
#[utoipa::path(
    get,
    path = "/v1/metrics/stream",
    params(
        ("job" = Option<u64>, Query, description = "Only this job's procs, actor meshes and status"),
        ("mesh" = Option<String>, Query, description = "Only the procs of this mesh and the actor meshes of this name")
    ),
    responses(
        (status = 200, description = "`event: sample` per interval, its data a MetricsSeries", content_type = "text/event-stream", body = String),
        (status = 400, description = "A bad parameter", body = ApiError),
        (status = 503, description = "The server is stopping", body = ApiError)
    )
)]
async fn metrics_stream(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> Result<Response, Fail> {
    let query = super::metrics::Query::parse(query.as_deref())
        .map_err(|e| fail(StatusCode::BAD_REQUEST, e))?;
    let Some(mut samples) = state.metrics.subscribe() else {
        return Err(fail(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is stopping",
        ));
    };
    let (tx, rx) = mpsc::channel::<Event>(16);
    tokio::spawn(async move {
        loop {
            let sample = match samples.recv().await {
                Ok(sample) => sample,
                // A slow reader skips the samples it missed.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            };
            let state = state.clone();
            let (caller, query) = (caller.clone(), query.clone());
            let item = tokio::task::spawn_blocking(move || {
                super::metrics::stream_item(&state, &caller, &query, &sample)
            })
            .await;
            let data = match item {
                Ok(Ok(item)) => serde_json::to_string(&item).unwrap_or_default(),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot make a metrics sample");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "making a metrics sample failed");
                    continue;
                }
            };
            if tx
                .send(Event::default().event("sample").data(data))
                .await
                .is_err()
            {
                break;
            }
        }
    });
    Ok(sse(rx))
}

/// Where a running job's debug hub listens (a job submitted with
/// `"debug": true`), for tools on the server's network; `monarch-host
/// debug --server URL JOB` goes through a bridge instead
/// (`debug_bridge`), and needs only the server's address.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/debug",
    params(("id" = u64, Path)),
    responses(
        (status = 200, body = DebugEndpoint),
        (status = 404, body = ApiError),
        (status = 409, description = "The job is not running, or runs without breakpoints", body = ApiError)
    )
)]
async fn job_debug(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<axum::Json<DebugEndpoint>, Fail> {
    let id = job_id(&id)?;
    let job = find_job(&state, &caller, id)?;
    let live = state.live().get(&id).cloned();
    let endpoint =
        live.and_then(|live| live.debug.lock().unwrap_or_else(|p| p.into_inner()).clone());
    match endpoint {
        Some(endpoint) => Ok(axum::Json(endpoint)),
        None if job.status.is_final() => Err(fail(
            StatusCode::CONFLICT,
            format!("job {id} is not running ({})", job.status.as_str()),
        )),
        None => Err(fail(
            StatusCode::CONFLICT,
            format!(
                "job {id} runs without breakpoints (submit it with \"debug\": true, or `monarch-host submit --debug`), or has not started yet"
            ),
        )),
    }
}

/// The post-mortem records of a job's trapped actors: who trapped, in
/// which endpoint, why, the backtrace, and the core dump's file name.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/dumps",
    params(("id" = u64, Path)),
    responses((status = 200, body = DumpList), (status = 404, body = ApiError))
)]
async fn job_dumps(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Answer<DumpList> {
    let id = job_id(&id)?;
    find_job(&state, &caller, id)?;
    let dir = crate::debug::dumps::for_job(&state.config.data, id).dir;
    let dumps = tokio::task::spawn_blocking(move || match dir.is_dir() {
        true => crate::debug::dumps::read_dumps(&dir),
        false => Ok(Vec::new()),
    })
    .await
    .map_err(|e| internal(format!("reading the dumps failed: {e}")))?
    .map_err(internal)?;
    ok(StatusCode::OK, DumpList { job: id, dumps })
}

/// One file of a job's post-mortem records, by the name
/// `GET /v1/jobs/{id}/dumps` gives: a record (`NAME.json`) or a core dump
/// (`NAME.coredump`, a Wasm module for Wasm debuggers).
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/dumps/{file}",
    params(("id" = u64, Path), ("file" = String, Path)),
    responses(
        (status = 200, description = "The file", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "Not the name of a dump file", body = ApiError),
        (status = 404, body = ApiError)
    )
)]
async fn job_dump_file(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path((id, file)): Path<(String, String)>,
) -> Result<Response, Fail> {
    let id = job_id(&id)?;
    find_job(&state, &caller, id)?;
    // A plain name in the job's directory: nothing that leads out of it.
    if !crate::debug::dumps::is_dump_file_name(&file) {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            format!(
                "`{}` is not the name of a dump file (NAME.json or NAME.coredump)",
                file.escape_debug()
            ),
        ));
    }
    let path = crate::debug::dumps::for_job(&state.config.data, id)
        .dir
        .join(&file);
    let missing = || {
        fail(
            StatusCode::NOT_FOUND,
            format!("job {id} has no dump file `{file}`"),
        )
    };
    match tokio::fs::symlink_metadata(&path).await {
        Ok(meta) if meta.is_file() => {}
        _ => return Err(missing()),
    }
    let bytes = tokio::fs::read(&path).await.map_err(|_| missing())?;
    let content_type = match file.ends_with(".json") {
        true => "application/json",
        false => "application/octet-stream",
    };
    let headers = [
        (header::CONTENT_TYPE, content_type.to_string()),
        (
            header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"{file}\""),
        ),
    ];
    Ok((headers, bytes).into_response())
}

/// The traces of a job's calls (`serve --trace`): one OTLP JSON
/// `ExportTraceServiceRequest` per traced call, a line each, as `run
/// --trace-file` writes them; `monarch-host trace ID` prints them.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/trace",
    params(("id" = u64, Path)),
    responses(
        (status = 200, description = "OTLP JSON lines, one per traced call", content_type = "application/x-ndjson", body = String),
        (status = 404, description = "No such job, or no traces (the server traces only with --trace)", body = ApiError)
    )
)]
async fn job_trace(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, Fail> {
    let id = job_id(&id)?;
    find_job(&state, &caller, id)?;
    if !state.config.trace {
        return Err(fail(
            StatusCode::NOT_FOUND,
            "this server does not trace its jobs' calls; start it with `serve --trace`",
        ));
    }
    match tokio::fs::read(state.trace_path(id)).await {
        Ok(bytes) => Ok((
            [(header::CONTENT_TYPE, "application/x-ndjson".to_string())],
            bytes,
        )
            .into_response()),
        Err(_) => Err(fail(
            StatusCode::NOT_FOUND,
            format!("job {id} made no traced call (yet): only calls with replies are traced"),
        )),
    }
}

/// Streams a job's log as Server-Sent Events.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/logs",
    params(("id" = u64, Path)),
    responses(
        (status = 200, description = "`event: log` per line, then `event: end` with the final status (LogEnd)", content_type = "text/event-stream", body = String),
        (status = 404, body = ApiError)
    )
)]
async fn job_logs(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, Fail> {
    let id = job_id(&id)?;
    find_job(&state, &caller, id)?;
    let live = state.live().get(&id).cloned();
    let (tx, rx) = mpsc::channel::<Event>(256);
    tokio::spawn(follow(state.clone(), id, live, tx));
    Ok(sse(rx))
}

/// A Server-Sent Events answer of the events sent to `rx`, with a
/// keep-alive every 5 s; it ends when every sender is dropped.
pub(super) fn sse(mut rx: mpsc::Receiver<Event>) -> Response {
    let stream =
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|e| e.map(Ok::<_, Infallible>)));
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(5)))
        .into_response()
}

/// Sends the lines of job `id`'s log from the first, following it while
/// the job runs, then its end.
async fn follow(
    state: Arc<State>,
    id: u64,
    live: Option<Arc<jobs::LiveJob>>,
    tx: mpsc::Sender<Event>,
) {
    let mut written = live.as_ref().map(|l| l.log.subscribe());
    let mut file = tokio::fs::File::open(state.log_path(id)).await.ok();
    let mut offset: u64 = 0;
    let mut partial: Vec<u8> = Vec::new();
    loop {
        let done = live.as_ref().is_none_or(|l| l.log.is_done());
        if let Some(file) = file.as_mut() {
            let mut buffer = Vec::new();
            if file.seek(std::io::SeekFrom::Start(offset)).await.is_ok()
                && let Ok(n) = file.read_to_end(&mut buffer).await
            {
                offset += n as u64;
                partial.extend_from_slice(&buffer);
                while let Some(at) = partial.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = partial.drain(..=at).collect();
                    let text = String::from_utf8_lossy(&line[..line.len() - 1]).replace('\r', "");
                    if tx
                        .send(Event::default().event("log").data(text))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
        if done {
            let job = state.db.job(id).ok().flatten();
            let end = LogEnd {
                status: job.as_ref().map_or(JobStatus::Failed, |j| j.status),
                error: job.and_then(|j| j.error),
            };
            let data = serde_json::to_string(&end).unwrap_or_default();
            let _ = tx.send(Event::default().event("end").data(data)).await;
            return;
        }
        let Some(written) = written.as_mut() else {
            return;
        };
        tokio::select! {
            changed = written.changed() => {
                if changed.is_err() {
                    // The log is gone: read what is left, then end.
                    continue;
                }
            }
            _ = tx.closed() => return,
        }
    }
}

/// Creates a persistent mesh.
#[utoipa::path(
    post,
    path = "/v1/meshes",
    request_body = MeshRequest,
    responses(
        (status = 201, description = "Its procs run", body = MeshInfo),
        (status = 400, body = ApiError),
        (status = 409, description = "The name is taken", body = ApiError),
        (status = 429, description = "Over the caller's procs quota", body = ApiError)
    )
)]
async fn create_mesh(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody,
) -> Answer<MeshInfo> {
    let request: MeshRequest = parse_json(&body, "mesh request")?;
    validate_mesh_name(&request.name).map_err(|e| fail(StatusCode::BAD_REQUEST, e))?;
    let cap = state.config.max_limits.procs;
    if request.procs == 0 || request.procs > cap {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            format!(
                "procs is {}; a mesh has 1 to {cap} procs (--max-procs)",
                request.procs
            ),
        ));
    }
    if state.actor_meshes.get(&request.name).is_some() {
        return Err(fail(
            StatusCode::CONFLICT,
            format!(
                "a persistent actor mesh is named `{}`; DELETE /v1/meshes/{} stops it",
                request.name, request.name
            ),
        ));
    }
    {
        // The quota is checked and the mesh's procs counted as one step
        // (QU-2): a mesh being created counts as made.
        let _admission = state.admission.lock().unwrap_or_else(|p| p.into_inner());
        let ask = Usage {
            procs: request.procs.into(),
            ..Usage::default()
        };
        quotas::check(&state, &caller.0, ask)?;
        let mut creating = state.creating.lock().unwrap_or_else(|p| p.into_inner());
        if state.persistent(&request.name).is_some() || creating.contains_key(&request.name) {
            return Err(fail(
                StatusCode::CONFLICT,
                format!("a mesh named `{}` exists", request.name),
            ));
        }
        creating.insert(
            request.name.clone(),
            (caller.name().to_string(), request.procs),
        );
    }
    let made = state
        .create_mesh(
            &request.name,
            request.procs,
            Some(caller.name().to_string()),
        )
        .await;
    state
        .creating
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&request.name);
    let info = made.map_err(internal)?;
    // Recorded, it comes back after a restart until it is deleted (PM-1).
    let record = super::db::MeshRecord {
        name: request.name.clone(),
        procs: request.procs,
        owner: Some(caller.name().to_string()),
        origin: "api".into(),
        created_at_ms: super::db::now_ms(),
    };
    if let Err(e) = state.db.record_mesh(&record) {
        state.stop_mesh(&request.name);
        return Err(internal(e));
    }
    ok(StatusCode::CREATED, info)
}

/// Lists meshes: persistent ones, running jobs' fresh ones, and the
/// persistent actor meshes with each rank's state (a failed rank says why).
/// A user sees the server's own persistent meshes and what it owns (its
/// meshes, its jobs' fresh meshes, what its jobs spawned).
#[utoipa::path(get, path = "/v1/meshes", responses((status = 200, body = MeshList)))]
async fn list_meshes(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
) -> Answer<MeshList> {
    let actor_meshes = state
        .actor_meshes()
        .into_iter()
        .filter(|m| may_see_actor_mesh(&state, &caller, m))
        .collect();
    ok(
        StatusCode::OK,
        MeshList {
            meshes: state.meshes_of(&caller),
            actor_meshes,
        },
    )
}

/// Whether `caller` may see (and stop) persistent actor mesh `mesh`: one
/// its job spawned, or one on a persistent mesh it owns.
fn may_see_actor_mesh(state: &State, caller: &Caller, mesh: &ActorMeshInfo) -> bool {
    may_see_actor_mesh_on(state, caller, &mesh.mesh, &mesh.spawned_by)
}

/// The principal `owner`'s jobs may look up and respawn the persistent
/// actor meshes it may see over HTTP, and no other (HA-1).
pub(crate) fn actor_mesh_access(state: &Arc<State>, owner: &str) -> ActorMeshAccess {
    let caller = Caller(state.principal_named(owner));
    let state = Arc::downgrade(state);
    Arc::new(move |mesh: &PersistentActorMesh| {
        state.upgrade().is_some_and(|state| {
            may_see_actor_mesh_on(&state, &caller, &mesh.proc_mesh, &mesh.spawned_by)
        })
    })
}

fn may_see_actor_mesh_on(
    state: &State,
    caller: &Caller,
    proc_mesh: &str,
    spawned_by: &str,
) -> bool {
    if caller.0.is_admin() {
        return true;
    }
    let on_own = state
        .persistent(proc_mesh)
        .is_some_and(|m| m.owner.as_deref() == Some(caller.name()));
    let spawner = spawned_by
        .strip_prefix("job ")
        .and_then(|id| id.parse::<u64>().ok())
        .and_then(|id| state.db.job(id).ok().flatten())
        .and_then(|job| job.owner);
    on_own || spawner.as_deref() == Some(caller.name())
}

/// Stops a persistent mesh (jobs running on it fail, and the persistent
/// actor meshes on it stop), or a persistent actor mesh (later lookups of
/// it fail; jobs holding it get `stopped` errors).
#[utoipa::path(
    delete,
    path = "/v1/meshes/{name}",
    params(("name" = String, Path, description = "A persistent mesh's or a persistent actor mesh's name")),
    responses(
        (status = 200, description = "What was stopped: a mesh (MeshInfo) or an actor mesh (ActorMeshInfo)", body = StoppedMesh),
        (status = 403, description = "Another principal's, or the server's own (for a user)", body = ApiError),
        (status = 404, body = ApiError)
    )
)]
async fn delete_mesh(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Answer<StoppedMesh> {
    validate_mesh_name(&name).map_err(|e| fail(StatusCode::BAD_REQUEST, e))?;
    // The server's own meshes are an admin's to stop.
    if let Some(mesh) = state.persistent(&name)
        && !caller.may_see(mesh.owner.as_deref())
    {
        return Err(not_yours(format_args!("the persistent mesh `{name}`")));
    }
    if let Some(info) = state.stop_mesh(&name) {
        // Deleted, it does not come back after a restart.
        state.db.forget_mesh(&name).map_err(internal)?;
        return ok(StatusCode::OK, StoppedMesh::Procs(info));
    }
    if let Some(mesh) = state.actor_meshes().iter().find(|m| m.name == name)
        && !may_see_actor_mesh(&state, &caller, mesh)
    {
        return Err(not_yours(format_args!(
            "the persistent actor mesh `{name}`"
        )));
    }
    match state.stop_actor_mesh(&name).await {
        Some(info) => ok(StatusCode::OK, StoppedMesh::Actors(info)),
        None => Err(fail(
            StatusCode::NOT_FOUND,
            format!("no persistent mesh or persistent actor mesh named `{name}`"),
        )),
    }
}

/// The caller: its principal's name, role, quotas and what it holds now.
#[utoipa::path(get, path = "/v1/principal", responses((status = 200, body = PrincipalInfo)))]
async fn principal(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
) -> Answer<PrincipalInfo> {
    let used = quotas::usage(&state, caller.name());
    let quota = caller.0.quota;
    ok(
        StatusCode::OK,
        PrincipalInfo {
            name: caller.name().to_string(),
            role: caller.0.role.as_str().into(),
            max_jobs: quota.max_jobs,
            max_procs: quota.max_procs,
            max_memory_mib: quota.max_memory_mib,
            jobs: used.jobs,
            procs: used.procs,
            memory_mib: used.memory_mib,
        },
    )
}

/// Prometheus metrics, for an admin (HA-1).
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String), (status = 403, description = "The caller is not an admin", body = ApiError)))]
async fn metrics(With(state): With<Arc<State>>, Extension(caller): Extension<Caller>) -> Response {
    use std::fmt::Write;
    if !caller.0.is_admin() {
        return fail(
            StatusCode::FORBIDDEN,
            "the metrics are the whole server's, an admin's to read; GET /v1/principal shows your own use",
        )
        .into_response();
    }
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, values: &[(&str, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in values {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let c = &state.counters;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let running = get(&c.running);
    let live = state.live().len() as u64;
    metric(
        "monarch_jobs_submitted_total",
        "counter",
        "Jobs submitted since the server started.",
        &[("", get(&c.submitted))],
    );
    metric(
        "monarch_jobs_finished_total",
        "counter",
        "Jobs finished since the server started, by status.",
        &[
            ("{status=\"succeeded\"}", get(&c.succeeded)),
            ("{status=\"failed\"}", get(&c.failed)),
            ("{status=\"cancelled\"}", get(&c.cancelled)),
        ],
    );
    metric(
        "monarch_jobs_running",
        "gauge",
        "Jobs whose controller runs.",
        &[("", running)],
    );
    metric(
        "monarch_jobs_queued",
        "gauge",
        "Jobs waiting for a slot.",
        &[("", live.saturating_sub(running))],
    );
    metric(
        "monarch_job_run_seconds_total",
        "counter",
        "Seconds jobs' controllers ran, in all.",
        &[("", get(&c.run_us) / 1_000_000)],
    );
    metric(
        "monarch_uploads_total",
        "counter",
        "Component uploads, by result.",
        &[
            ("{result=\"new\"}", get(&state.uploads.new)),
            ("{result=\"existing\"}", get(&state.uploads.existing)),
            ("{result=\"rejected\"}", get(&state.uploads.rejected)),
        ],
    );
    metric(
        "monarch_upload_bytes_total",
        "counter",
        "Bytes uploaded.",
        &[("", get(&state.uploads.bytes))],
    );
    metric(
        "monarch_unauthorized_requests_total",
        "counter",
        "Requests refused for a missing or wrong token.",
        &[("", get(&state.unauthorized))],
    );
    metric(
        "monarch_rate_limited_requests_total",
        "counter",
        "Requests refused (429) for their principal's rate (--rate-limit).",
        &[("", get(&state.rate_limited))],
    );
    let meshes = state.meshes_of(&caller);
    let persistent = meshes.iter().filter(|m| m.persistent).count() as u64;
    let procs = |s: &str| {
        meshes
            .iter()
            .flat_map(|m| &m.procs)
            .filter(|p| p.state == s)
            .count() as u64
    };
    metric(
        "monarch_meshes",
        "gauge",
        "Meshes, persistent or a running job's.",
        &[
            ("{kind=\"persistent\"}", persistent),
            ("{kind=\"fresh\"}", meshes.len() as u64 - persistent),
        ],
    );
    metric(
        "monarch_mesh_procs",
        "gauge",
        "Procs of the meshes, by state.",
        &[
            ("{state=\"running\"}", procs("running")),
            ("{state=\"stopped\"}", procs("stopped")),
        ],
    );
    if let Ok(counts) = state.db.status_counts() {
        let values: Vec<(String, u64)> = counts
            .into_iter()
            .map(|(status, n)| (format!("{{status=\"{status}\"}}"), n))
            .collect();
        let values: Vec<(&str, u64)> = values.iter().map(|(l, n)| (l.as_str(), *n)).collect();
        metric(
            "monarch_jobs_recorded",
            "gauge",
            "Jobs in the server's history, by status.",
            &values,
        );
    }
    if let Some(latest) = state.metrics.latest() {
        out.push_str(&super::metrics::prometheus(&latest));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory with an allowed directory `allowed/` (holding
    /// `data/` and a symlink `out` to `outside/`), and `outside/`.
    struct Dirs(std::path::PathBuf);

    impl Dirs {
        fn new(name: &str) -> Dirs {
            let root =
                std::env::temp_dir().join(format!("monarch-grants-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("allowed/data")).unwrap();
            std::fs::create_dir_all(root.join("outside")).unwrap();
            std::fs::create_dir_all(root.join("allowed-not")).unwrap();
            std::os::unix::fs::symlink(root.join("outside"), root.join("allowed/out")).unwrap();
            Dirs(std::fs::canonicalize(&root).unwrap())
        }

        fn path(&self, rest: &str) -> String {
            format!("{}/{rest}", self.0.display())
        }

        fn allowed(&self) -> Vec<std::path::PathBuf> {
            vec![self.0.join("allowed")]
        }
    }

    impl Drop for Dirs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_openapi_document_shows_what_a_job_may_be_granted() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let schemas = &doc["components"]["schemas"];
        for field in ["dirs", "env"] {
            assert!(
                schemas["JobRequest"]["properties"].get(field).is_some(),
                "{field}"
            );
            assert!(
                schemas["JobInfo"]["properties"].get(field).is_some(),
                "{field}"
            );
        }
        for field in ["meshes", "actor_meshes"] {
            assert!(
                schemas["MeshList"]["properties"].get(field).is_some(),
                "{field}"
            );
        }
        assert!(schemas.get("ActorMeshInfo").is_some());
        assert!(doc["paths"].get("/v1/principal").is_some());
        for field in ["name", "role", "max_jobs", "jobs"] {
            assert!(
                schemas["PrincipalInfo"]["properties"].get(field).is_some(),
                "{field}"
            );
        }
        assert!(schemas["JobInfo"]["properties"].get("owner").is_some());
        assert!(schemas.get("StoppedMesh").is_some());
        for schema in ["PartialLimits", "Limits"] {
            assert!(
                schemas[schema]["properties"]
                    .get("handler_timeout_s")
                    .is_some(),
                "{schema}"
            );
        }
    }

    #[test]
    fn a_directory_inside_an_allowed_one_is_granted_as_asked() {
        let dirs = Dirs::new("inside");
        let grant = grant_dir(
            &dirs.allowed(),
            &format!("{}::/data:rw", dirs.path("allowed/data")),
        )
        .unwrap();
        assert_eq!(grant.host, dirs.0.join("allowed/data"));
        assert_eq!(grant.guest, "/data");
        assert!(grant.writable);
        let grant = grant_dir(&dirs.allowed(), &dirs.path("allowed")).unwrap();
        assert_eq!(grant.guest, dirs.path("allowed"));
        assert!(!grant.writable);
    }

    #[test]
    fn neither_dot_dot_nor_a_symlink_nor_a_shared_prefix_leads_out() {
        let dirs = Dirs::new("escape");
        for spec in [
            dirs.path("allowed/../outside"),
            dirs.path("allowed/data/../../outside::/data"),
            dirs.path("allowed/out::/data:ro"),
            dirs.path("allowed-not"),
            "/".to_string(),
        ] {
            let error = grant_dir(&dirs.allowed(), &spec).unwrap_err();
            assert!(
                error.contains("is not inside a directory this server allows"),
                "{spec}: {error}"
            );
        }
    }

    #[test]
    fn missing_relative_and_unallowed_directories_are_refused_with_a_reason() {
        let dirs = Dirs::new("refused");
        let error = grant_dir(&dirs.allowed(), &dirs.path("allowed/nope")).unwrap_err();
        assert!(error.contains("cannot grant the directory"), "{error}");
        let error = grant_dir(&dirs.allowed(), "allowed/data").unwrap_err();
        assert!(error.contains("absolute"), "{error}");
        let error = grant_dir(&[], &dirs.path("allowed/data")).unwrap_err();
        assert!(error.contains("--allow-dir"), "{error}");
    }

    #[test]
    fn a_refused_grant_names_its_entry() {
        let dirs = Dirs::new("names");
        let good = dirs.path("allowed/data");
        let bad = dirs.path("outside");
        let error = grants(&dirs.allowed(), &[good.clone(), bad.clone()], &[]).unwrap_err();
        assert!(error.starts_with(&format!("dirs[1] `{bad}`")), "{error}");
        let error =
            grants(&dirs.allowed(), &[good], &["A=1".into(), "NOEQUALS".into()]).unwrap_err();
        assert!(
            error.contains("env[1]") && error.contains("NOEQUALS"),
            "{error}"
        );
        let granted = grants(&dirs.allowed(), &[], &["A=1=2".into()]).unwrap();
        assert_eq!(granted.env, vec![("A".to_string(), "1=2".to_string())]);
    }
}

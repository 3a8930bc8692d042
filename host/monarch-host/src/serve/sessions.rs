//! Console sessions on the server (`/v1/sessions`): each one is a job whose
//! controller is a session component (the built-in Python REPL unless the
//! request names another), driven one line at a time
//! ([`crate::session`]). The session, its store and everything it spawned
//! live on the server; a console attaches to its stream and detaches at
//! will, so a session outlives its clients.
//!
//! - SS-1: a session belongs to the principal that opened it; any other
//!   gets 403 from every route of it, an admin too (a console is its
//!   owner's terminal), except that an admin lists every session and may
//!   close one (`DELETE`).
//! - SS-2: a console that attaches gets, first, what was printed since the
//!   session's last input began (`hello`), then every line and result as
//!   it happens, in the order the session made them.
//! - SS-3: an input runs to its end whether or not the console that sent
//!   it is still there; its result goes to every attached console.
//! - SS-4: a session ends by `DELETE` (closed), its idle TTL (expired), a
//!   trap (failed) or the server's stop; what it spawned is stopped, and
//!   its row says why. A restart marks the active ones `lost: server
//!   restarted` (`db`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::{Path, State as With};
use axum::http::StatusCode;
use axum::response::Response;
use axum::response::sse::Event;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::State;
use super::api::*;
use super::db::{self, SessionRow};
use super::handlers::{
    Answer, Caller, Fail, JsonBody, fail, internal, job_cost, limits, ok, parse_json, sse,
    usable_component, usable_mesh,
};
use super::jobs::{self, SessionStart, Target};
use super::quotas;
use crate::host::LogSink;
use crate::session::{ConsoleFlag, Input, InputDone, SessionDriver};

/// How long opening a session may take: building and compiling the
/// built-in REPL the first time, then its `init`.
const OPEN_TIMEOUT: Duration = Duration::from_secs(300);

/// The sessions that run, by name.
#[derive(Default)]
pub(crate) struct Sessions {
    map: Mutex<BTreeMap<String, Arc<Session>>>,
    /// The built-in REPL's component id, once stored.
    builtin: tokio::sync::OnceCell<String>,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Session>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, name: &str) -> Option<Arc<Session>> {
        self.lock().get(name).cloned()
    }

    /// Ends every session as the server stops: each is marked `lost`,
    /// as a restart finds it (SS-4), and its consoles are told `why`.
    pub(crate) fn close_all(&self, db: &super::db::Db, why: &str) {
        for session in self.lock().values() {
            if let Err(e) = db.end_session(&session.name, "lost", db::RESTARTED) {
                tracing::error!(session = %session.name, error = %e, "cannot record the session's end");
            }
            session.close_inputs();
            session.push(Ev::End(why.to_string()));
        }
    }
}

/// What a session's stream carries after its `hello`.
#[derive(Clone, Debug)]
enum Ev {
    Out(String),
    Result(InputReply),
    End(String),
}

/// What was printed since the last input began, and the stream of what
/// comes next: one lock, so an attaching console misses nothing and sees
/// nothing twice (SS-2).
struct Out {
    replay: VecDeque<String>,
    truncated: bool,
    events: broadcast::Sender<Ev>,
}

pub(crate) struct Session {
    name: String,
    job: u64,
    owner: String,
    mesh: Option<String>,
    idle_ttl: Duration,
    created_at_ms: i64,
    inputs: Mutex<Option<mpsc::Sender<Input>>>,
    console: Arc<ConsoleFlag>,
    out: Mutex<Out>,
    busy: AtomicBool,
    seq: Mutex<u64>,
    last_active: Mutex<Instant>,
    prompt: Mutex<String>,
    /// Set once `init` returned.
    active: AtomicBool,
}

impl Session {
    fn push(&self, ev: Ev) {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        if let Ev::Out(line) = &ev {
            if out.replay.len() >= REPLAY_LINES {
                out.replay.pop_front();
                out.truncated = true;
            }
            out.replay.push_back(line.clone());
        }
        let _ = out.events.send(ev);
    }

    /// A new input begins: what is replayed starts over.
    fn begin_input(&self) {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        out.replay.clear();
        out.truncated = false;
    }

    fn close_inputs(&self) {
        self.inputs.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    fn info(&self, state: &State) -> SessionInfo {
        let meshes = state
            .meshes()
            .into_iter()
            .flat_map(|mesh| mesh.actors)
            .filter(|actors| actors.job == self.job)
            .map(|actors| unscoped(self.job, &actors.name).to_string())
            .collect();
        SessionInfo {
            name: self.name.clone(),
            job: self.job,
            owner: self.owner.clone(),
            state: match self.active.load(Ordering::Acquire) {
                true => "active",
                false => "starting",
            }
            .into(),
            reason: None,
            mesh: self.mesh.clone(),
            meshes,
            idle_s: self
                .last_active
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .elapsed()
                .as_secs(),
            idle_ttl_s: self.idle_ttl.as_secs(),
            busy: self.busy.load(Ordering::Acquire),
            prompt: self
                .prompt
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            created_at_ms: self.created_at_ms,
        }
    }
}

/// An actor mesh's name as its session called it: without the `j<job>.`
/// scope that a persistent proc mesh's actors get.
fn unscoped(job: u64, name: &str) -> &str {
    name.strip_prefix(&format!("j{job}.")).unwrap_or(name)
}

/// A line of the session's log as its console shows it: actors' lines
/// without their job scope (`[j7.counters 2]` is `[counters 2]`).
fn console_line(job: u64, line: &str) -> String {
    let scope = format!("[j{job}.");
    match line.strip_prefix(&scope) {
        Some(rest) => format!("[{rest}"),
        None => line.to_string(),
    }
}

fn row_info(row: SessionRow) -> SessionInfo {
    SessionInfo {
        name: row.name,
        job: row.job,
        owner: row.owner,
        state: row.state,
        reason: row.reason,
        mesh: row.mesh,
        meshes: Vec::new(),
        idle_s: row
            .ended_at_ms
            .map(|ended| ((db::now_ms() - ended).max(0) / 1000) as u64)
            .unwrap_or(0),
        idle_ttl_s: row.idle_ttl_s,
        busy: false,
        prompt: String::new(),
        created_at_ms: row.created_at_ms,
    }
}

/// A session name: 1 to 64 letters, digits, `-`, `_` and `.`.
fn validate_session_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    match ok {
        true => Ok(()),
        false => Err(format!(
            "bad session name `{}`: use 1 to 64 letters, digits, `-`, `_` and `.`",
            name.escape_debug()
        )),
    }
}

/// The running session `name`, if the caller owns it (SS-1); an ended
/// one is 410 with why it ended.
fn owned(state: &State, caller: &Caller, name: &str) -> Result<Arc<Session>, Fail> {
    reachable(state, caller, name, false)
}

/// The running session `name`, if the caller owns it, or (`admin_too`)
/// is an admin (SS-1).
fn reachable(
    state: &State,
    caller: &Caller,
    name: &str,
    admin_too: bool,
) -> Result<Arc<Session>, Fail> {
    validate_session_name(name).map_err(|e| fail(StatusCode::BAD_REQUEST, e))?;
    let mine = |owner: &str| owner == caller.name() || (admin_too && caller.0.is_admin());
    match state.sessions.get(name) {
        Some(session) if mine(&session.owner) => Ok(session),
        Some(_) => Err(forbidden(name)),
        None => match state.db.session(name).map_err(internal)? {
            Some(row) if !mine(&row.owner) => Err(forbidden(name)),
            Some(row) => Err(fail(
                StatusCode::GONE,
                format!(
                    "the session `{name}` has ended ({}{})",
                    row.state,
                    row.reason.map(|r| format!(": {r}")).unwrap_or_default()
                ),
            )),
            None => Err(fail(
                StatusCode::NOT_FOUND,
                format!("no session named `{name}`; open one with POST /v1/sessions"),
            )),
        },
    }
}

fn forbidden(name: &str) -> Fail {
    fail(
        StatusCode::FORBIDDEN,
        format!("the session `{name}` belongs to another token (principal)"),
    )
}

/// The built-in Python REPL's component id: built (cached) and stored
/// the first time a session asks for it.
async fn builtin_component(state: &Arc<State>) -> Result<String, Fail> {
    state
        .sessions
        .builtin
        .get_or_try_init(|| async {
            let built = tokio::task::spawn_blocking(|| {
                crate::build::python_session(&|step: &str| {
                    tracing::info!("the built-in Python session: {step}")
                })
            })
            .await
            .map_err(|e| internal(format!("building the Python session panicked: {e}")))?
            .map_err(|e| {
                fail(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("this server cannot build the built-in Python session: {e}"),
                )
            })?;
            let bytes = tokio::fs::read(&built)
                .await
                .map_err(|e| internal(format!("cannot read {}: {e}", built.display())))?;
            store_component(state, bytes).await.map_err(internal)
        })
        .await
        .cloned()
}

/// Stores `bytes` as a component of this server (as an upload would),
/// compiled; returns its id.
async fn store_component(state: &Arc<State>, bytes: Vec<u8>) -> Result<String, String> {
    let id = crate::engine::sha256_hex(&bytes);
    let path = state.component_path(&id);
    if state.db.component(&id)?.is_none() || !path.exists() {
        let partial = path.with_extension("partial");
        tokio::fs::write(&partial, &bytes)
            .await
            .map_err(|e| format!("cannot store the component: {e}"))?;
        tokio::fs::rename(&partial, &path)
            .await
            .map_err(|e| format!("cannot store the component: {e}"))?;
        let prepared = state.prepared(&id).await?;
        state.db.insert_component(&ComponentInfo {
            id: id.clone(),
            size: bytes.len() as u64,
            world: prepared.world().into(),
            uploaded_at_ms: db::now_ms(),
        })?;
    }
    Ok(id)
}

/// Opens a console session.
#[utoipa::path(
    post,
    path = "/v1/sessions",
    request_body = SessionRequest,
    responses(
        (status = 201, description = "It runs and waits for input", body = SessionInfo),
        (status = 400, body = ApiError),
        (status = 403, description = "The persistent mesh is another principal's", body = ApiError),
        (status = 404, description = "No such component (of the caller's) or mesh", body = ApiError),
        (status = 409, description = "The name is taken", body = ApiError),
        (status = 429, description = "Over the caller's quota", body = ApiError)
    )
)]
pub(super) async fn create(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody,
) -> Answer<SessionInfo> {
    let request: SessionRequest = parse_json(&body, "session request")?;
    if let Some(name) = &request.name {
        validate_session_name(name).map_err(|e| fail(StatusCode::BAD_REQUEST, e))?;
        if state.sessions.get(name).is_some() {
            return Err(taken(name));
        }
    }
    let component = match &request.component {
        None => builtin_component(&state).await?,
        Some(id) => {
            usable_component(&state, &caller, id)?;
            id.clone()
        }
    };
    let prepared = state
        .prepared(&component)
        .await
        .map_err(|e| fail(StatusCode::UNPROCESSABLE_ENTITY, e))?;
    if !prepared.is_session() {
        return Err(fail(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "the component {component} is a `{}`, not a session (the WIT world `monarch:host/session`)",
                prepared.world()
            ),
        ));
    }
    let target = match &request.mesh {
        None => Target::Fresh,
        Some(name) => {
            usable_mesh(&state, &caller, name)?;
            Target::Persistent(name.clone())
        }
    };
    let limits = limits(&state, request.limits, None)?;
    let idle_ttl = request
        .idle_ttl_s
        .map(|s| Duration::from_secs(s.max(1)))
        .unwrap_or(state.config.session_idle_ttl);
    // The quota is checked, and the session's job recorded and started,
    // as one step (QU-2).
    let admission = state.admission.lock().unwrap_or_else(|p| p.into_inner());
    quotas::check(&state, &caller.0, job_cost(&limits, &target))?;
    let job = state
        .db
        .insert_job(
            caller.name(),
            &component,
            &request.args,
            request.mesh.as_deref(),
            &limits,
            &Default::default(),
        )
        .map_err(internal)?;
    let name = request.name.clone().unwrap_or_else(|| format!("s{job}"));
    let row = SessionRow {
        name: name.clone(),
        job,
        owner: caller.name().to_string(),
        mesh: request.mesh.clone(),
        idle_ttl_s: idle_ttl.as_secs(),
        state: "active".into(),
        reason: None,
        created_at_ms: db::now_ms(),
        ended_at_ms: None,
    };
    let end_job = |why: &str| {
        let _ = state.db.finish_job(job, JobStatus::Failed, Some(why));
    };
    if !state.db.insert_session(&row).map_err(internal)? {
        end_job("the session's name was taken");
        return Err(taken(&name));
    }
    let (inputs, received) = mpsc::channel(1);
    let (ready, is_ready) = oneshot::channel();
    let (events, _) = broadcast::channel(4096);
    let session = Arc::new(Session {
        name: name.clone(),
        job,
        owner: caller.name().to_string(),
        mesh: request.mesh.clone(),
        idle_ttl,
        created_at_ms: row.created_at_ms,
        inputs: Mutex::new(Some(inputs)),
        console: Arc::default(),
        out: Mutex::new(Out {
            replay: VecDeque::new(),
            truncated: false,
            events,
        }),
        busy: AtomicBool::new(false),
        seq: Mutex::new(0),
        last_active: Mutex::new(Instant::now()),
        prompt: Mutex::new(String::new()),
        active: AtomicBool::new(false),
    });
    {
        let mut map = state.sessions.lock();
        if map.contains_key(&name) {
            drop(map);
            end_job("the session's name was taken");
            return Err(taken(&name));
        }
        map.insert(name.clone(), session.clone());
    }
    let tee: LogSink = {
        let session = Arc::downgrade(&session);
        Arc::new(move |line: &str| {
            if let Some(session) = session.upgrade() {
                session.push(Ev::Out(console_line(session.job, line)));
            }
        })
    };
    let on_end: Box<dyn FnOnce(JobStatus, Option<String>) + Send> = {
        let state = state.clone();
        let session = session.clone();
        Box::new(move |status, error| ended(&state, &session, status, error))
    };
    let driver = SessionDriver {
        args: request.args.clone(),
        inputs: received,
        console: session.console.clone(),
        idle_ttl,
        ready: Some(ready),
    };
    let started = jobs::start(
        &state,
        job,
        caller.name(),
        component,
        request.args,
        limits,
        Default::default(),
        target,
        false,
        Some(Box::new(SessionStart {
            driver,
            tee,
            on_end: Some(on_end),
        })),
    );
    drop(admission);
    if let Err(e) = started {
        state.sessions.lock().remove(&name);
        let _ = state.db.end_session(&name, "failed", &e);
        end_job(&e);
        return Err(internal(e));
    }
    match tokio::time::timeout(OPEN_TIMEOUT, is_ready).await {
        Ok(Ok(Ok(prompt))) => {
            *session.prompt.lock().unwrap_or_else(|p| p.into_inner()) = prompt;
            session.active.store(true, Ordering::Release);
            *session
                .last_active
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Instant::now();
            tracing::info!(session = %name, job, owner = %caller.name(), "session opened");
            ok(StatusCode::CREATED, session.info(&state))
        }
        Ok(Ok(Err(why))) => Err(fail(StatusCode::UNPROCESSABLE_ENTITY, why)),
        Ok(Err(_)) => {
            // The job ended before `init` returned: its row says why.
            let why = state
                .db
                .job(job)
                .ok()
                .flatten()
                .and_then(|j| j.error)
                .unwrap_or_else(|| "it ended before it was ready".into());
            Err(fail(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("the session could not start: {why}"),
            ))
        }
        Err(_) => {
            if let Some(live) = state.live().get(&job).cloned() {
                live.cancel("it did not start in time".into());
            }
            Err(fail(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "the session did not start within {} s",
                    OPEN_TIMEOUT.as_secs()
                ),
            ))
        }
    }
}

fn taken(name: &str) -> Fail {
    fail(
        StatusCode::CONFLICT,
        format!("a session named `{name}` runs already; attach to it, or pick another name"),
    )
}

/// Session `session`'s job ended with `status`: record why, tell its
/// consoles, forget it (SS-4).
fn ended(state: &State, session: &Session, status: JobStatus, error: Option<String>) {
    let why = error.unwrap_or_else(|| "closed".into());
    let kind = if why.contains("idle TTL") {
        "expired"
    } else {
        match status {
            JobStatus::Succeeded | JobStatus::Cancelled => "closed",
            _ => "failed",
        }
    };
    if let Err(e) = state.db.end_session(&session.name, kind, &why) {
        tracing::error!(session = %session.name, error = %e, "cannot record the session's end");
    }
    tracing::info!(session = %session.name, job = session.job, state = kind, reason = %why, "session ended");
    session.close_inputs();
    session.push(Ev::End(format!("{kind}: {why}")));
    let mut map = state.sessions.lock();
    if map
        .get(&session.name)
        .is_some_and(|s| std::ptr::eq(Arc::as_ptr(s), session))
    {
        map.remove(&session.name);
    }
}

/// Lists sessions: running ones, then ended ones, newest first; a user's
/// own, or every one for an admin.
#[utoipa::path(get, path = "/v1/sessions", responses((status = 200, body = SessionList)))]
pub(super) async fn list(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
) -> Answer<SessionList> {
    let running: Vec<Arc<Session>> = state
        .sessions
        .lock()
        .values()
        .filter(|s| caller.may_see(Some(&s.owner)))
        .cloned()
        .collect();
    let mut sessions: Vec<SessionInfo> = running.iter().map(|s| s.info(&state)).collect();
    sessions.sort_by_key(|s| std::cmp::Reverse(s.created_at_ms));
    let ended = state.db.sessions(100).map_err(internal)?;
    sessions.extend(
        ended
            .into_iter()
            .filter(|row| row.state != "active" && caller.may_see(Some(&row.owner)))
            .map(row_info),
    );
    ok(StatusCode::OK, SessionList { sessions })
}

/// One session.
#[utoipa::path(
    get,
    path = "/v1/sessions/{name}",
    params(("name" = String, Path, description = "The session's name")),
    responses(
        (status = 200, body = SessionInfo),
        (status = 403, description = "Another token's", body = ApiError),
        (status = 404, body = ApiError)
    )
)]
pub(super) async fn get_one(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Answer<SessionInfo> {
    match owned(&state, &caller, &name) {
        Ok(session) => ok(StatusCode::OK, session.info(&state)),
        // An ended session's row, for its owner.
        Err(Fail(StatusCode::GONE, _)) => {
            let row = state.db.session(&name).map_err(internal)?;
            match row {
                Some(row) => ok(StatusCode::OK, row_info(row)),
                None => Err(fail(StatusCode::NOT_FOUND, "no such session")),
            }
        }
        Err(e) => Err(e),
    }
}

/// Closes a session: stops everything it owns.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{name}",
    params(("name" = String, Path, description = "The session's name")),
    responses(
        (status = 200, description = "It ended", body = SessionInfo),
        (status = 403, description = "Another token's", body = ApiError),
        (status = 404, body = ApiError),
        (status = 410, description = "It had ended", body = ApiError)
    )
)]
pub(super) async fn close(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Answer<SessionInfo> {
    let session = reachable(&state, &caller, &name, true)?;
    let mut events = session
        .out
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .events
        .subscribe();
    // The reason first: closing the inputs may end the job by itself.
    if let Some(live) = state.live().get(&session.job).cloned() {
        let why = match session.owner == caller.name() {
            true => "closed by its owner".to_string(),
            false => format!("closed by the admin `{}`", caller.name()),
        };
        live.cancel(why);
    }
    session.close_inputs();
    // Wait for its end (its procs stopped), a while.
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match events.recv().await {
                Ok(Ev::End(_)) | Err(broadcast::error::RecvError::Closed) => return,
                _ => {}
            }
        }
    })
    .await;
    let row = state.db.session(&name).map_err(internal)?;
    match row {
        Some(row) if row.state != "active" => ok(StatusCode::OK, row_info(row)),
        _ => ok(StatusCode::ACCEPTED, session.info(&state)),
    }
}

/// Runs one line in a session; answers when it has run (SS-3).
#[utoipa::path(
    post,
    path = "/v1/sessions/{name}/input",
    params(("name" = String, Path, description = "The session's name")),
    request_body = InputRequest,
    responses(
        (status = 200, description = "It ran", body = InputReply),
        (status = 403, description = "Another token's", body = ApiError),
        (status = 409, description = "An input is running", body = ApiError),
        (status = 410, description = "The session ended", body = ApiError)
    )
)]
pub(super) async fn input(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> Answer<InputReply> {
    let request: InputRequest = parse_json(&body, "input")?;
    let session = owned(&state, &caller, &name)?;
    if !session.active.load(Ordering::Acquire) {
        return Err(fail(StatusCode::CONFLICT, "the session is still starting"));
    }
    if session
        .busy
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err(fail(
            StatusCode::CONFLICT,
            "an input is running in this session; wait for it, or interrupt it (POST .../interrupt, Ctrl-C)",
        ));
    }
    let sender = session
        .inputs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let Some(sender) = sender else {
        session.busy.store(false, Ordering::Release);
        return Err(fail(StatusCode::GONE, "the session is ending"));
    };
    session.begin_input();
    let seq = {
        let mut seq = session.seq.lock().unwrap_or_else(|p| p.into_inner());
        *seq += 1;
        *seq
    };
    // The input runs to its end even if this request goes away (SS-3).
    let task = {
        let session = session.clone();
        tokio::spawn(async move {
            let (done, result) = oneshot::channel();
            let outcome = match sender
                .send(Input {
                    line: request.line,
                    done,
                })
                .await
            {
                Ok(()) => result
                    .await
                    .unwrap_or_else(|_| InputDone::Ended("the session ended".into())),
                Err(_) => InputDone::Ended("the session ended".into()),
            };
            *session
                .last_active
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Instant::now();
            let reply = match outcome {
                InputDone::Ran { result, prompt } => {
                    *session.prompt.lock().unwrap_or_else(|p| p.into_inner()) = prompt.clone();
                    let (output, error) = match result {
                        Ok(text) => (Some(text), None),
                        Err(text) => (None, Some(text)),
                    };
                    let reply = InputReply {
                        seq,
                        output,
                        error,
                        prompt,
                    };
                    session.push(Ev::Result(reply.clone()));
                    Ok(reply)
                }
                InputDone::Ended(why) => Err(why),
            };
            session.busy.store(false, Ordering::Release);
            reply
        })
    };
    match task.await {
        Ok(Ok(reply)) => ok(StatusCode::OK, reply),
        Ok(Err(why)) => Err(fail(StatusCode::GONE, why)),
        Err(e) => Err(internal(format!("the input's task failed: {e}"))),
    }
}

/// Ctrl-C: interrupts the running input; the session goes on.
#[utoipa::path(
    post,
    path = "/v1/sessions/{name}/interrupt",
    params(("name" = String, Path, description = "The session's name")),
    responses(
        (status = 202, description = "The input was told to stop", body = SessionInfo),
        (status = 403, description = "Another token's", body = ApiError)
    )
)]
pub(super) async fn interrupt(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Answer<SessionInfo> {
    let session = owned(&state, &caller, &name)?;
    if session.busy.load(Ordering::Acquire) {
        session.console.raise();
    }
    ok(StatusCode::ACCEPTED, session.info(&state))
}

/// Attaches: a stream of Server-Sent Events, `hello` ([`SessionHello`])
/// first, then `out` (a line), `result` ([`InputReply`]) and, as the
/// session ends, `end` (why) (SS-2).
#[utoipa::path(
    get,
    path = "/v1/sessions/{name}/stream",
    params(("name" = String, Path, description = "The session's name")),
    responses(
        (status = 200, description = "text/event-stream: hello, out, result, end"),
        (status = 403, description = "Another token's", body = ApiError),
        (status = 410, description = "The session ended", body = ApiError)
    )
)]
pub(super) async fn stream(
    With(state): With<Arc<State>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, Fail> {
    let session = owned(&state, &caller, &name)?;
    let (replay, truncated, mut events) = {
        let out = session.out.lock().unwrap_or_else(|p| p.into_inner());
        (
            out.replay.iter().cloned().collect::<Vec<_>>(),
            out.truncated,
            out.events.subscribe(),
        )
    };
    let hello = SessionHello {
        session: session.info(&state),
        replay,
        truncated,
    };
    let (tx, rx) = mpsc::channel::<Event>(256);
    let first = Event::default()
        .event("hello")
        .data(serde_json::to_string(&hello).unwrap_or_default());
    tokio::spawn(async move {
        if tx.send(first).await.is_err() {
            return;
        }
        loop {
            let event = tokio::select! {
                event = events.recv() => event,
                _ = tx.closed() => return,
            };
            let (event, last) = match event {
                Ok(Ev::Out(line)) => (Event::default().event("out").data(line), false),
                Ok(Ev::Result(reply)) => (
                    Event::default()
                        .event("result")
                        .data(serde_json::to_string(&reply).unwrap_or_default()),
                    false,
                ),
                Ok(Ev::End(why)) => (Event::default().event("end").data(why), true),
                Err(broadcast::error::RecvError::Lagged(n)) => (
                    Event::default().event("out").data(format!(
                        "[server] {n} lines were dropped for this console, which read too slowly"
                    )),
                    false,
                ),
                Err(broadcast::error::RecvError::Closed) => {
                    (Event::default().event("end").data("closed"), true)
                }
            };
            if tx.send(event).await.is_err() || last {
                return;
            }
        }
    });
    Ok(sse(rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_names_are_checked() {
        validate_session_name("train-1.v2_a").unwrap();
        for bad in ["", "a b", "../x", &"x".repeat(65)] {
            assert!(validate_session_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_console_sees_actors_without_their_job_scope() {
        assert_eq!(
            console_line(7, "[j7.counters 2] hi"),
            "[counters 2] hi".to_string()
        );
        assert_eq!(console_line(7, "[j8.x 0] hi"), "[j8.x 0] hi".to_string());
        assert_eq!(console_line(7, "plain"), "plain".to_string());
        assert_eq!(unscoped(7, "j7.counters"), "counters");
    }
}

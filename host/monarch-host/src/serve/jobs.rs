//! Running jobs: a queue behind the server's limit of running jobs, one
//! task per job that runs its controller, and each job's log file, which
//! log streams follow as it grows.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::State;
use super::api::{JobStatus, Limits};
use super::meshes::MeshView;
use crate::engine::{Grants, Placement, Sandbox};
use crate::host::{AttachedProcs, LogSink};
use crate::run::{Mesh, RunError};

/// A job's log: a file of lines, and a counter of the bytes written that
/// wakes the streams following it.
pub(crate) struct JobLog {
    file: Mutex<Option<std::fs::File>>,
    written: watch::Sender<u64>,
    limit: u64,
    /// Set once the job has its final status and nothing more is written.
    done: AtomicBool,
    /// Also gets every line (a session's console), if set.
    tee: Mutex<Option<LogSink>>,
}

impl JobLog {
    pub(crate) fn create(path: PathBuf, limit: u64) -> Result<Arc<JobLog>, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("cannot create the job's log: {e}"))?;
        Ok(Arc::new(JobLog {
            file: Mutex::new(Some(file)),
            written: watch::Sender::new(0),
            limit,
            done: AtomicBool::new(false),
            tee: Mutex::new(None),
        }))
    }

    /// Appends `line`, unless the log is at its size limit (then one line
    /// says so and the rest is dropped).
    pub(crate) fn write(&self, line: &str) {
        let tee = self.tee.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(tee) = tee {
            tee(line);
        }
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let Some(f) = file.as_mut() else { return };
        let at = *self.written.borrow();
        let over = at + line.len() as u64 + 1 > self.limit;
        let text = if over {
            format!(
                "[server] the log reached its limit of {} bytes (--max-log-mib); later lines are dropped\n",
                self.limit
            )
        } else {
            format!("{line}\n")
        };
        if f.write_all(text.as_bytes()).is_ok() {
            self.written.send_modify(|n| *n += text.len() as u64);
        }
        if over {
            *file = None;
        }
    }

    /// Sends every line written from now on to `tee` as well.
    pub(crate) fn set_tee(&self, tee: LogSink) {
        *self.tee.lock().unwrap_or_else(|p| p.into_inner()) = Some(tee);
    }

    /// Marks the log complete and wakes its followers.
    pub(crate) fn finish(&self) {
        self.done.store(true, Ordering::SeqCst);
        self.written.send_modify(|_| {});
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.written.subscribe()
    }

    /// A sink for the job's controller and actors.
    pub(crate) fn sink(self: &Arc<Self>) -> LogSink {
        let log = self.clone();
        Arc::new(move |line: &str| log.write(line))
    }
}

/// A job that has not finished.
pub(crate) struct LiveJob {
    pub(crate) log: Arc<JobLog>,
    cancel: watch::Sender<Option<String>>,
    /// The job's cluster while its controller runs, for `stacks`.
    pub(crate) run: crate::debug::LiveRun,
    /// Its debug hub's address and token, while it runs with breakpoints
    /// on (`"debug": true`).
    pub(crate) debug: Mutex<Option<crate::serve::api::DebugEndpoint>>,
    /// The principal that submitted it (`-` on a server without tokens).
    pub(crate) owner: String,
    /// The procs its fresh mesh may start (0 on a persistent mesh), which
    /// count against its owner's quota while it is unfinished.
    pub(crate) procs: u64,
    /// The Wasm memory it asked for, which counts likewise.
    pub(crate) memory_mib: u64,
}

impl LiveJob {
    pub(crate) fn cancel(&self, reason: String) {
        self.cancel.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(reason);
                true
            } else {
                false
            }
        });
    }
}

/// Unfinished jobs, by id.
pub(crate) type LiveJobs = Mutex<HashMap<u64, Arc<LiveJob>>>;

/// Counters of the jobs this server ran, for `/metrics`.
#[derive(Default)]
pub(crate) struct JobCounters {
    pub(crate) submitted: AtomicU64,
    pub(crate) succeeded: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) running: AtomicU64,
    /// Microseconds jobs ran, in all.
    pub(crate) run_us: AtomicU64,
}

/// What makes a job a session (`serve::sessions`): its driver, and where
/// its log's lines go besides the file.
pub(crate) struct SessionStart {
    pub(crate) driver: crate::session::SessionDriver,
    pub(crate) tee: LogSink,
    /// Called once the job has its final status.
    pub(crate) on_end: Option<SessionEnd>,
}

/// What a session does when its job ends.
pub(crate) type SessionEnd = Box<dyn FnOnce(JobStatus, Option<String>) + Send>;

/// How long a session may live in all; its idle TTL ends it sooner.
const SESSION_LIFETIME: Duration = Duration::from_secs(366 * 24 * 3600);

/// Where a job runs, decided at submission.
pub(crate) enum Target {
    Fresh,
    Persistent(String),
}

/// A requeued job's place in the queue (JR-1): it waits for `go` before
/// it waits for a slot, and sends `queued` once it has one (or ended), so
/// that the jobs a restart requeues take slots in their original order.
pub(crate) struct Turn {
    pub(crate) go: tokio::sync::oneshot::Receiver<()>,
    pub(crate) queued: tokio::sync::oneshot::Sender<()>,
}

/// Queues job `id` of principal `owner` and starts its task; `grants`
/// were checked against the server's allowed directories at submission.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start(
    state: &Arc<State>,
    id: u64,
    owner: &str,
    component: String,
    args: Vec<String>,
    limits: Limits,
    grants: Grants,
    target: Target,
    debug: bool,
    session: Option<Box<SessionStart>>,
) -> Result<(), String> {
    start_in_turn(
        state, id, owner, component, args, limits, grants, target, debug, session, None,
    )
}

/// [`start`], for a job that waits for its `turn` before it queues.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start_in_turn(
    state: &Arc<State>,
    id: u64,
    owner: &str,
    component: String,
    args: Vec<String>,
    limits: Limits,
    grants: Grants,
    target: Target,
    debug: bool,
    mut session: Option<Box<SessionStart>>,
    turn: Option<Turn>,
) -> Result<(), String> {
    let log = JobLog::create(state.log_path(id), state.config.max_log_bytes)?;
    if let Some(session) = &session {
        log.set_tee(session.tee.clone());
    }
    let on_end = session.as_mut().and_then(|s| s.on_end.take());
    let (cancel, mut cancelled) = watch::channel(None::<String>);
    let live = Arc::new(LiveJob {
        log: log.clone(),
        cancel,
        run: Default::default(),
        debug: Mutex::new(None),
        owner: owner.to_string(),
        procs: match target {
            Target::Fresh => limits.procs.into(),
            Target::Persistent(_) => 0,
        },
        memory_mib: limits.memory_mib.into(),
    });
    state.live().insert(id, live);
    state.counters.submitted.fetch_add(1, Ordering::Relaxed);
    let state = state.clone();
    let owner = owner.to_string();
    tokio::spawn(async move {
        let ran = {
            let state = state.clone();
            let log = log.clone();
            tokio::spawn(async move {
                run(
                    &state,
                    id,
                    &owner,
                    &component,
                    &args,
                    limits,
                    grants,
                    target,
                    debug,
                    session,
                    &log,
                    &mut cancelled,
                    turn,
                )
                .await
            })
            .await
        };
        let (status, error) = match ran {
            Ok(outcome) => outcome,
            Err(e) => (
                JobStatus::Failed,
                Some(format!("the job's task failed: {e}")),
            ),
        };
        finish(&state, id, &log, status, error.clone());
        if let Some(on_end) = on_end {
            on_end(status, error);
        }
    });
    Ok(())
}

/// Starts job `id`'s debug hub on the server's address (its unix socket
/// in the data directory), and publishes where it is.
async fn start_hub(
    state: &Arc<State>,
    id: u64,
    live: crate::debug::LiveRun,
) -> Result<
    (
        Arc<crate::debug::hub::Hub>,
        crate::debug::pause::DebugConfig,
    ),
    String,
> {
    let token = crate::debug::runs::random_token()?;
    let dir = state.config.data.join("debug");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let listen = std::net::SocketAddr::new(state.config.listen.ip(), 0).to_string();
    let pause_limit = Duration::from_secs(600);
    let hub = crate::debug::hub::Hub::start(
        token.clone(),
        &dir.join(format!("{id}.sock")),
        Some(&listen),
        pause_limit,
        live,
    )
    .await?;
    let addr = hub
        .tcp
        .map(|addr| addr.to_string())
        .ok_or("the job's debug hub has no address")?;
    if let Some(job) = state.live().get(&id) {
        *job.debug.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(crate::serve::api::DebugEndpoint {
                addr: addr.clone(),
                token: token.clone(),
            });
    }
    let config = crate::debug::pause::DebugConfig {
        addr,
        token,
        pause_limit_ms: u64::try_from(pause_limit.as_millis()).unwrap_or(u64::MAX),
    };
    Ok((hub, config))
}

/// Gives job `id` its final status, then ends its log.
fn finish(state: &State, id: u64, log: &JobLog, status: JobStatus, error: Option<String>) {
    if let Some(error) = &error {
        log.write(&format!("[server] job {id} {}: {error}", status.as_str()));
    }
    match state.db.finish_job(id, status, error.as_deref()) {
        Ok(true) => {
            let counter = match status {
                JobStatus::Succeeded => &state.counters.succeeded,
                JobStatus::Cancelled => &state.counters.cancelled,
                _ => &state.counters.failed,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Ok(false) => {}
        Err(e) => tracing::error!(job = id, error = %e, "cannot record the job's end"),
    }
    state.live().remove(&id);
    log.finish();
}

/// Checks, as a queued job starts, that each directory it was granted is
/// still the one checked at submission: one removed, or replaced by a
/// symlink that leads elsewhere, fails the job rather than being left out
/// or followed.
fn recheck(grants: &Grants) -> Result<(), String> {
    for dir in &grants.dirs {
        let now = std::fs::canonicalize(&dir.host).map_err(|e| {
            format!(
                "the granted directory {} is gone since the job was submitted: {e}",
                dir.host.display()
            )
        })?;
        if now != dir.host || !now.is_dir() {
            return Err(format!(
                "the granted directory {} was replaced since the job was submitted",
                dir.host.display()
            ));
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn run(
    state: &Arc<State>,
    id: u64,
    owner: &str,
    component: &str,
    args: &[String],
    limits: Limits,
    grants: Grants,
    target: Target,
    debug: bool,
    session: Option<Box<SessionStart>>,
    log: &Arc<JobLog>,
    cancelled: &mut watch::Receiver<Option<String>>,
    turn: Option<Turn>,
) -> (JobStatus, Option<String>) {
    let cancel_reason = |cancelled: &watch::Receiver<Option<String>>| {
        cancelled
            .borrow()
            .clone()
            .unwrap_or_else(|| "cancelled".into())
    };
    // A requeued job waits for its turn (JR-1); dropping `queued` when
    // this returns hands the turn on, whatever happened.
    let _queued = match turn {
        None => None,
        Some(Turn { go, queued }) => {
            tokio::select! {
                _ = go => {}
                _ = cancelled.wait_for(Option::is_some) => {}
            }
            Some(queued)
        }
    };
    // Wait for a slot, unless cancelled first.
    let permit = tokio::select! {
        permit = state.run_gate.clone().acquire_owned() => Some(permit),
        _ = cancelled.wait_for(Option::is_some) => None,
    };
    drop(_queued);
    let permit = match permit {
        Some(Ok(permit)) => permit,
        Some(Err(_)) => return (JobStatus::Failed, Some("the server is stopping".into())),
        None => return (JobStatus::Cancelled, Some(cancel_reason(cancelled))),
    };
    match state.db.start_job(id) {
        Ok(true) => {}
        Ok(false) => return (JobStatus::Cancelled, Some(cancel_reason(cancelled))),
        Err(e) => return (JobStatus::Failed, Some(e)),
    }
    if let Err(e) = recheck(&grants) {
        return (JobStatus::Failed, Some(e));
    }
    let prepared = match state.prepared(component).await {
        Ok(prepared) => prepared,
        Err(e) => return (JobStatus::Failed, Some(e)),
    };
    let live = state
        .live()
        .get(&id)
        .map(|job| job.run.clone())
        .unwrap_or_default();
    // A job with breakpoints on gets a debug hub of its own, on the
    // server's address, while it runs.
    let hub = match debug {
        false => None,
        true => match start_hub(state, id, live.clone()).await {
            Ok(hub) => Some(hub),
            Err(e) => return (JobStatus::Failed, Some(e)),
        },
    };
    let sandbox = Sandbox {
        memory_bytes: limits.memory_mib as usize * (1 << 20),
        // A session lasts until it is closed or idles out.
        deadline: match session {
            Some(_) => SESSION_LIFETIME,
            None => Duration::from_secs(limits.timeout_s),
        },
        call_timeout: Duration::from_secs(limits.call_timeout_s),
        max_procs: limits.procs as usize,
        placement: state
            .config
            .placement
            .clone()
            .unwrap_or_else(|| Placement::Local {
                program: state.config.bootstrap.clone(),
            }),
        fanout: state.config.fanout,
        handler_timeout: limits
            .handler_timeout_s
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .map(|d| d.max(Duration::from_millis(1))),
        grants,
        max_instances: crate::engine::DEFAULT_MAX_INSTANCES,
        dumps: Some(crate::debug::dumps::for_job(&state.config.data, id)),
        debug: hub.as_ref().map(|(_, config)| config.clone()),
        // A server's jobs run on the normal engine.
        debug_engine: false,
        live,
    };
    let (mesh, view, fresh) = match &target {
        Target::Persistent(name) => {
            let Some(persistent) = state.persistent(name) else {
                return (
                    JobStatus::Failed,
                    Some(format!(
                        "the mesh `{name}` was stopped before the job started"
                    )),
                );
            };
            let procs = AttachedProcs {
                mesh: name.clone(),
                procs: persistent.view.procs(),
                scope: format!("j{id}."),
            };
            let mesh = Mesh::Attached {
                client: persistent.client.clone(),
                procs,
            };
            (mesh, persistent.view.clone(), false)
        }
        Target::Fresh => {
            let view = MeshView::new(format!("job-{id}"), Some(id), Vec::new());
            state.add_fresh_view(id, view.clone());
            (Mesh::Fresh, view, true)
        }
    };
    state.counters.running.fetch_add(1, Ordering::Relaxed);
    let started = std::time::Instant::now();
    let access = super::handlers::actor_mesh_access(state, owner);
    let cancel = {
        let mut cancelled = cancelled.clone();
        async move {
            let _ = cancelled.wait_for(Option::is_some).await;
            cancelled.borrow().clone().unwrap_or_default()
        }
    };
    let is_session = session.is_some();
    let trace = state.config.trace.then(|| state.trace_path(id));
    let outcome = match session {
        None => {
            prepared
                .run(
                    args,
                    sandbox,
                    log.sink(),
                    mesh,
                    Some(view.observer(
                        id,
                        state.actor_meshes.clone(),
                        access.clone(),
                        trace.clone(),
                    )),
                    cancel,
                )
                .await
        }
        Some(session) => {
            prepared
                .run_session(
                    session.driver,
                    sandbox,
                    log.sink(),
                    mesh,
                    Some(view.observer(
                        id,
                        state.actor_meshes.clone(),
                        access.clone(),
                        trace.clone(),
                    )),
                    cancel,
                )
                .await
        }
    };
    state
        .counters
        .run_us
        .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    state.counters.running.fetch_sub(1, Ordering::Relaxed);
    view.forget_job(id);
    if fresh {
        state.remove_fresh_view(id);
    }
    drop(permit);
    match outcome {
        // A session closed on request may see its inputs end before the
        // cancel: it ended because of the cancel, and says whose.
        Ok(()) if is_session && cancelled.borrow().is_some() => {
            (JobStatus::Cancelled, Some(cancel_reason(cancelled)))
        }
        Ok(()) => (JobStatus::Succeeded, None),
        Err(RunError::Cancelled(reason)) => (JobStatus::Cancelled, Some(reason)),
        // A session that idled out ended as it should.
        Err(RunError::Idle(ttl)) => (JobStatus::Succeeded, Some(RunError::Idle(ttl).to_string())),
        Err(e) => (JobStatus::Failed, Some(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::DirGrant;

    #[test]
    fn a_granted_directory_removed_or_replaced_while_queued_fails_the_job() {
        let root = std::env::temp_dir().join(format!("monarch-recheck-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("data")).unwrap();
        std::fs::create_dir_all(root.join("elsewhere")).unwrap();
        let spec = format!("{}::/data", root.join("data").display());
        let grants = Grants {
            dirs: vec![spec.parse::<DirGrant>().unwrap()],
            env: Vec::new(),
        };
        recheck(&grants).unwrap();
        std::fs::remove_dir(root.join("data")).unwrap();
        let error = recheck(&grants).unwrap_err();
        assert!(error.contains("is gone"), "{error}");
        std::os::unix::fs::symlink(root.join("elsewhere"), root.join("data")).unwrap();
        let error = recheck(&grants).unwrap_err();
        assert!(error.contains("was replaced"), "{error}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}

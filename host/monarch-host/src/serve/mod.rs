//! `monarch-host serve`: programs uploaded over HTTP, jobs that run their
//! controllers, and persistent meshes that outlive jobs. The routes and
//! their JSON are in `docs/serve.md`; the OpenAPI document at
//! `/v1/openapi.json` is generated from [`handlers`] and [`api`].
//!
//! - [`db`]: components, jobs and persistent meshes in SQLite; a restart
//!   fails what was running and runs what was queued.
//! - [`jobs`]: the queue, one task per job, log files that streams follow.
//! - [`meshes`]: persistent meshes and the server's view of every mesh.
//! - `metrics`: the sampler of procs' CPU and memory and of actor meshes'
//!   calls, behind `/v1/metrics/series` and `/v1/metrics/stream`.
//!
//! - [`principals`]: who may use the server (tokens, roles), and
//!   [`quotas`]: how much each may ask for (rate, jobs, procs, memory).
//! - `listen`: the accept loop, with deadlines for slow clients.
//!
//! A job may be granted directories only inside the admin's `--allow-dir`s
//! ([`ServeConfig::allowed_dirs`]), checked at submission in `handlers`
//! and again as it starts in `jobs`.
//!
//! Jobs, the components a principal uploaded, console sessions and
//! persistent meshes belong to the principal that made them; see
//! [`principals`] for who sees what, and docs/serve.md ("Users, roles and
//! limits").

pub mod api;
pub mod client;
mod db;
mod debug_bridge;
mod handlers;
mod jobs;
mod listen;
mod meshes;
mod metrics;
pub mod principals;
pub mod quotas;
mod sessions;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use hyperactor::ClusterToken;
use hyperactor_mesh::agent::Registry;
use hyperactor_mesh::alloc::{Allocator, BootstrapCommand, LocalAllocator};
use hyperactor_mesh::client::MeshClient;
use principals::{Principals, Quota};
use quotas::{RateLimit, RateLimiter};
use tokio::sync::{OnceCell, Semaphore};
use wasmtime::Engine;

use crate::engine;
use crate::mesh::PersistentActorMeshes;
use crate::run::Prepared;
pub use api::Limits;
use api::{ActorMeshInfo, MeshInfo};
use db::Db;
use jobs::{JobCounters, LiveJob, LiveJobs};
use meshes::{ActorArchive, MeshView, PersistentMesh};

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Where state, components and logs are kept.
    pub data: PathBuf,
    /// The text of a legacy token file (`--token-file`): one token a
    /// line, each an `admin` principal named by its fingerprint. A token
    /// (here or in `tokens_file`) is required off loopback.
    pub token: Option<String>,
    /// A tokens file (`--tokens-file`): `NAME ROLE TOKEN [QUOTA=N...]`
    /// a line ([`principals`]); read, and refused with `file:line` and
    /// why, by [`Server::start`].
    pub tokens_file: Option<PathBuf>,
    /// Each principal's quotas, unless its line of the tokens file sets
    /// its own.
    pub quota: Quota,
    /// Each principal's request rate.
    pub rate_limit: RateLimit,
    /// How long a client may take to send a request's headers
    /// (`--header-timeout`); then its connection is closed.
    pub header_timeout: Duration,
    /// How long a client may take to send a request's body
    /// (`--body-timeout`, an upload's included); then it is answered 408.
    pub body_timeout: Duration,
    /// How long a console session may sit without input before it is
    /// closed, unless it asks for its own (`console --idle-ttl`).
    pub session_idle_ttl: Duration,
    /// The binary whose `bootstrap` subcommand serves a proc.
    pub bootstrap: PathBuf,
    /// Where procs run: None, as child processes of the server (with
    /// `bootstrap`); `Placement::Hosts`, on a cluster's agents (`serve
    /// --cluster`), for jobs' fresh meshes and persistent meshes alike.
    pub placement: Option<crate::engine::Placement>,
    /// The largest component accepted, in bytes.
    pub max_upload_bytes: u64,
    /// The largest log a job may write, in bytes.
    pub max_log_bytes: u64,
    /// Limits a job gets when it asks for none.
    pub default_limits: Limits,
    /// The most a job may ask for.
    pub max_limits: Limits,
    /// Jobs running at once; more wait in the queue.
    pub max_running_jobs: usize,
    /// Components compiling at once.
    pub compile_concurrency: usize,
    /// The fan-out of casts.
    pub fanout: u32,
    /// Persistent meshes to start with.
    pub meshes: Vec<(String, u32)>,
    /// The directories whose contents jobs may be granted (`--allow-dir`);
    /// none: no job is granted a directory. [`Server::start`] resolves
    /// them and refuses one that is not a directory.
    pub allowed_dirs: Vec<PathBuf>,
    /// How often the metrics sampler samples procs and actor meshes
    /// (`/v1/metrics/series`); a second by default.
    pub metrics_interval: Duration,
    /// Traces the calls of every job's controller into
    /// `DATA/traces/ID.jsonl` (`GET /v1/jobs/{id}/trace`, `monarch-host
    /// trace ID`).
    pub trace: bool,
}

impl ServeConfig {
    /// A configuration with the defaults of `monarch-host serve`.
    pub fn new(listen: SocketAddr, data: PathBuf, bootstrap: PathBuf) -> ServeConfig {
        ServeConfig {
            listen,
            data,
            token: None,
            tokens_file: None,
            quota: Quota::default(),
            rate_limit: RateLimit::default(),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            session_idle_ttl: Duration::from_secs(8 * 3600),
            bootstrap,
            placement: None,
            max_upload_bytes: 64 << 20,
            max_log_bytes: 64 << 20,
            default_limits: Limits::default(),
            max_limits: Limits {
                memory_mib: 4096,
                timeout_s: 24 * 3600,
                call_timeout_s: 3600,
                procs: 256,
                handler_timeout_s: None,
            },
            max_running_jobs: 16,
            compile_concurrency: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
            fanout: crate::host::FANOUT,
            meshes: Vec::new(),
            allowed_dirs: Vec::new(),
            metrics_interval: Duration::from_secs(1),
            trace: false,
        }
    }
}

/// What the handlers share.
pub(crate) struct State {
    config: ServeConfig,
    /// The principals, by token; none: no token is asked for, and every
    /// request is the anonymous admin's.
    principals: Principals,
    /// The anonymous admin of a server without tokens.
    anonymous: Arc<principals::Principal>,
    /// Each principal's token bucket.
    rate: RateLimiter,
    /// Held while a request checks its principal's quotas and records what
    /// it was granted (QU-2).
    admission: Mutex<()>,
    /// Console sessions that run.
    sessions: sessions::Sessions,
    db: Db,
    engine: Engine,
    /// Compiled components, by id.
    prepared: Mutex<HashMap<String, Arc<OnceCell<Arc<Prepared>>>>>,
    compile_gate: Semaphore,
    run_gate: Arc<Semaphore>,
    live: LiveJobs,
    persistent: Mutex<BTreeMap<String, Arc<PersistentMesh>>>,
    /// Persistent meshes being created: name, and owner and procs (which
    /// count against its quota already).
    creating: Mutex<HashMap<String, (String, u32)>>,
    fresh: Mutex<BTreeMap<u64, Arc<MeshView>>>,
    /// Persistent actor meshes, which belong to the server: jobs and
    /// sessions spawn and find them through their observers.
    actor_meshes: Arc<PersistentActorMeshes>,
    /// Jobs' actor meshes as they stopped (`GET /v1/jobs/{id}/actors`).
    actor_archive: Arc<ActorArchive>,
    /// The samples of procs and actor meshes.
    metrics: metrics::Metrics,
    counters: JobCounters,
    uploads: UploadCounters,
    unauthorized: AtomicU64,
    rate_limited: AtomicU64,
    meshes_made: AtomicU64,
}

#[derive(Default)]
struct UploadCounters {
    new: AtomicU64,
    existing: AtomicU64,
    rejected: AtomicU64,
    bytes: AtomicU64,
}

impl State {
    /// The principal `name` (a job's owner): the anonymous admin on a
    /// server without tokens; a plain user of that name when the tokens
    /// file no longer has it.
    pub(crate) fn principal_named(&self, name: &str) -> Arc<principals::Principal> {
        if self.principals.is_empty() {
            return self.anonymous.clone();
        }
        self.principals
            .named(name)
            .unwrap_or_else(|| Arc::new(principals::Principal::former(name)))
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<LiveJob>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn log_path(&self, job: u64) -> PathBuf {
        self.config.data.join("logs").join(format!("{job}.log"))
    }

    /// Where a job's traces go (`serve --trace`).
    fn trace_path(&self, job: u64) -> PathBuf {
        self.config.data.join("traces").join(format!("{job}.jsonl"))
    }

    fn component_path(&self, id: &str) -> PathBuf {
        self.config
            .data
            .join("components")
            .join(format!("{id}.wasm"))
    }

    fn persistent(&self, name: &str) -> Option<Arc<PersistentMesh>> {
        self.persistent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    fn add_fresh_view(&self, job: u64, view: Arc<MeshView>) {
        view.set_archive(self.actor_archive.clone());
        self.fresh
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(job, view);
    }

    fn remove_fresh_view(&self, job: u64) {
        self.fresh
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&job);
    }

    /// Every mesh: persistent ones by name, then running jobs' fresh ones.
    fn meshes(&self) -> Vec<MeshInfo> {
        let mut all: Vec<MeshInfo> = self
            .persistent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|m| m.view.info(true))
            .collect();
        all.extend(
            self.fresh
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .map(|v| v.info(false)),
        );
        all
    }

    /// The meshes `caller` may see (HA-1): an admin every one; a user the
    /// server's own persistent meshes, its own, and its jobs' fresh ones.
    fn meshes_of(&self, caller: &handlers::Caller) -> Vec<MeshInfo> {
        if caller.0.is_admin() {
            return self.meshes();
        }
        let mut all: Vec<MeshInfo> = self
            .persistent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|m| m.owner.is_none() || m.owner.as_deref() == Some(caller.name()))
            .map(|m| m.view.info(true))
            .collect();
        let own: std::collections::HashSet<u64> = self
            .live()
            .iter()
            .filter(|(_, job)| job.owner == caller.name())
            .map(|(id, _)| *id)
            .collect();
        all.extend(
            self.fresh
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|(job, _)| own.contains(job))
                .map(|(_, v)| v.info(false)),
        );
        // On a shared mesh, only the actors of its own jobs.
        for mesh in &mut all {
            mesh.actors.retain(|a| {
                own.contains(&a.job) || self.owner_of(a.job).as_deref() == Some(caller.name())
            });
        }
        all
    }

    /// The principal that submitted job `id`.
    fn owner_of(&self, id: u64) -> Option<String> {
        if let Some(job) = self.live().get(&id) {
            return Some(job.owner.clone());
        }
        self.db.job(id).ok().flatten().and_then(|job| job.owner)
    }

    /// The compiled form of component `id`: in memory, or compiled (from
    /// the compile cache, usually) from its stored bytes.
    async fn prepared(&self, id: &str) -> Result<Arc<Prepared>, String> {
        let cell = self
            .prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_string())
            .or_default()
            .clone();
        cell.get_or_try_init(|| async {
            let path = self.component_path(id);
            let bytes = tokio::fs::read(&path)
                .await
                .map_err(|e| format!("the component {id} is not on this server's disk: {e}"))?;
            let _permit = self
                .compile_gate
                .acquire()
                .await
                .map_err(|e| e.to_string())?;
            let engine = self.engine.clone();
            let prepared = tokio::task::spawn_blocking(move || {
                Prepared::new(&engine, std::path::Path::new("the component"), bytes)
            })
            .await
            .map_err(|e| format!("compiling panicked: {e}"))?
            .map_err(|e| e.to_string())?;
            Ok(Arc::new(prepared))
        })
        .await
        .cloned()
    }

    /// Starts the persistent mesh `name` with `procs` procs, of principal
    /// `owner` (None: the server's own).
    async fn create_mesh(
        self: &Arc<Self>,
        name: &str,
        procs: u32,
        owner: Option<String>,
    ) -> Result<MeshInfo, String> {
        let blob_dir = crate::run::blob_dir();
        let (addr, allocator, proc_config): (String, Arc<dyn Allocator>, _) =
            match &self.config.placement {
                Some(crate::engine::Placement::Hosts {
                    agents,
                    token,
                    liveness,
                }) => {
                    let (addr, allocator) =
                        crate::run::remote_allocator(agents, token, *liveness).await?;
                    let config = hyperactor::ProcConfig {
                        cluster_token: ClusterToken::new(token),
                        ..hyperactor::ProcConfig::default()
                    };
                    (addr, allocator, config)
                }
                _ => {
                    let command = BootstrapCommand {
                        program: self.config.bootstrap.clone(),
                        args: vec!["bootstrap".into()],
                    };
                    let allocator = LocalAllocator::new(command, Arc::new(Registry::new(blob_dir)))
                        .map_err(|e| format!("cannot prepare child procs: {e}"))?;
                    let nth = self.meshes_made.fetch_add(1, Ordering::Relaxed);
                    let socket = hyperactor_mesh::alloc::controller_socket(
                        hyperactor_mesh::alloc::ControllerSocket::Serve,
                        nth,
                    );
                    let addr = format!("unix:{}", socket.display());
                    (addr, Arc::new(allocator), hyperactor::ProcConfig::default())
                }
            };
        let addr = addr.parse().map_err(|e| format!("{e}"))?;
        // Actors' log lines go to the log of the job that spawned them.
        let weak: Weak<State> = Arc::downgrade(self);
        let log: crate::host::LogSink = Arc::new(move |line: &str| {
            let job = job_of_line(line).and_then(|job| {
                let state = weak.upgrade()?;
                state.live().get(&job).cloned()
            });
            match job {
                Some(live) => live.log.write(line),
                None => tracing::info!(target: "guest", "{line}"),
            }
        });
        let client = MeshClient::with_config(addr, proc_config, allocator, log)
            .await
            .map_err(|e| e.to_string())?;
        let allocated = client
            .spawn_procs(procs as usize)
            .await
            .map_err(|e| format!("cannot start the mesh's procs: {e}"))?;
        let view = MeshView::new(
            name.to_string(),
            None,
            allocated.iter().map(|a| a.proc.clone()).collect(),
        );
        view.set_pids(allocated.iter().map(|a| a.pid).collect());
        view.set_archive(self.actor_archive.clone());
        let mut events = client.subscribe();
        let watched = Arc::downgrade(&view);
        // Failures of persistent actor meshes on these procs are the
        // server's: logged and recorded, failing no job.
        let actor_meshes = Arc::downgrade(&self.actor_meshes);
        let mesh_name = name.to_string();
        let server = Arc::downgrade(self);
        let mesh_client = Arc::downgrade(&client);
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                let Some(view) = watched.upgrade() else { break };
                view.take_event(&event);
                if let Some(actor_meshes) = actor_meshes.upgrade() {
                    actor_meshes.take_event(&mesh_name, &event);
                }
                if let hyperactor_mesh::agent::MeshEvent::ProcStopped { proc, reason } = &event
                    && let (Some(server), Some(client)) = (server.upgrade(), mesh_client.upgrade())
                {
                    server.proc_died(&mesh_name, &view, client, proc, reason);
                }
            }
        });
        let info = view.info(true);
        self.actor_meshes.set_proc_mesh(name, true);
        self.persistent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                name.to_string(),
                Arc::new(PersistentMesh {
                    client,
                    view,
                    owner,
                    procs,
                }),
            );
        tracing::info!(mesh = name, procs, "persistent mesh started");
        Ok(info)
    }

    /// A proc of the persistent mesh `name` died: unless the mesh is
    /// being stopped, or the rank died too often (PM-3), a new proc takes
    /// its rank (PM-2). Jobs holding the old proc see its failure; jobs
    /// started later get the new one.
    fn proc_died(
        self: &Arc<Self>,
        name: &str,
        view: &Arc<MeshView>,
        client: Arc<MeshClient>,
        proc: &hyperactor::ProcId,
        reason: &str,
    ) {
        // A mesh being stopped (DELETE, the server's stop) stops its procs.
        let current = self
            .persistent(name)
            .is_some_and(|mesh| Arc::ptr_eq(&mesh.view, view));
        if !current
            || reason.contains(hyperactor_mesh::comm::STOPPED_BY_OWNER)
            || client.proc_info(proc).is_some_and(|info| info.stopped)
        {
            return;
        }
        let rank = match view.should_replace(proc, reason, std::time::Instant::now()) {
            meshes::Replace::Rank(rank) => rank,
            meshes::Replace::NotOurs => return,
            meshes::Replace::StormLimit(rank) => {
                tracing::error!(
                    mesh = name,
                    rank,
                    %reason,
                    "persistent mesh {name}: proc {rank} died ({reason}); it died {} times within {} s, so it is left dead",
                    meshes::STORM_LIMIT + 1,
                    meshes::STORM_WINDOW.as_secs()
                );
                return;
            }
        };
        let name = name.to_string();
        let view = view.clone();
        let old = proc.clone();
        let reason = reason.to_string();
        tokio::spawn(async move {
            match client.spawn_procs(1).await {
                Ok(mut spawned) if spawned.len() == 1 => {
                    let new = spawned.remove(0);
                    if view.replace(rank, &old, new.proc.clone(), new.pid, &reason) {
                        tracing::warn!(
                            mesh = %name,
                            rank,
                            %reason,
                            "persistent mesh {name}: proc {rank} died ({reason}); replaced"
                        );
                    } else {
                        client.stop_procs(&[new.proc]);
                    }
                }
                Ok(_) => tracing::error!(
                    mesh = %name,
                    rank,
                    "persistent mesh {name}: proc {rank} died ({reason}); its replacement did not start"
                ),
                Err(e) => tracing::error!(
                    mesh = %name,
                    rank,
                    error = %e,
                    "persistent mesh {name}: proc {rank} died ({reason}); cannot start a replacement: {e}"
                ),
            }
        });
    }

    /// Stops the persistent mesh `name`, and the persistent actor meshes
    /// on it.
    fn stop_mesh(&self, name: &str) -> Option<MeshInfo> {
        let mesh = self
            .persistent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name)?;
        self.actor_meshes.set_proc_mesh(name, false);
        self.actor_meshes
            .forget_on(name, &format!("its mesh `{name}` was stopped"));
        mesh.client.stop_all();
        Some(mesh.view.info(true))
    }

    /// Runs again the jobs a restart found queued, in their order (JR-1),
    /// as they were submitted; one whose persistent mesh is gone fails.
    fn requeue(self: &Arc<Self>, queued: Vec<db::QueuedJob>) {
        if queued.is_empty() {
            return;
        }
        let count = queued.len();
        let mut turns = Vec::new();
        for job in queued {
            let target = match &job.mesh {
                None => jobs::Target::Fresh,
                Some(name) if self.persistent(name).is_some() => {
                    jobs::Target::Persistent(name.clone())
                }
                Some(name) => {
                    let why = format!(
                        "{}: the job was queued for the persistent mesh `{name}`, which is gone",
                        db::RESTARTED
                    );
                    if let Err(e) = self
                        .db
                        .finish_job(job.id, api::JobStatus::Failed, Some(&why))
                    {
                        tracing::error!(job = job.id, error = %e, "cannot record the job's end");
                    }
                    continue;
                }
            };
            let (go, go_rx) = tokio::sync::oneshot::channel();
            let (queued_tx, queued) = tokio::sync::oneshot::channel();
            let started = jobs::start_in_turn(
                self,
                job.id,
                &job.owner,
                job.component,
                job.args,
                job.limits,
                job.grants,
                target,
                job.debug,
                None,
                Some(jobs::Turn {
                    go: go_rx,
                    queued: queued_tx,
                }),
            );
            match started {
                Ok(()) => turns.push((go, queued)),
                Err(e) => {
                    let _ = self.db.finish_job(job.id, api::JobStatus::Failed, Some(&e));
                }
            }
        }
        // One job at a time takes its place in the queue, in order.
        tokio::spawn(async move {
            for (go, queued) in turns {
                let _ = go.send(());
                let _ = queued.await;
            }
        });
        tracing::warn!(
            jobs = count,
            "requeued {count} jobs submitted before the restart"
        );
    }

    /// The persistent actor meshes, by name: those that live, then those
    /// a restart lost (state `lost`, PM-1) that were not spawned again.
    fn actor_meshes(&self) -> Vec<ActorMeshInfo> {
        let mut all: Vec<ActorMeshInfo> = self
            .actor_meshes
            .list()
            .iter()
            .map(|m| meshes::actor_mesh_info(m))
            .collect();
        let lost = self.db.lost_actor_meshes().unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot read the lost persistent actor meshes");
            Vec::new()
        });
        for (mesh, _) in lost {
            if all.iter().any(|m| m.name == mesh.name) {
                continue;
            }
            all.push(meshes::lost_actor_mesh_info(mesh));
        }
        all
    }

    /// Records the persistent actor meshes that live now, when they
    /// changed, so that the next start can say which a restart lost.
    fn sync_actor_meshes(&self, last: &mut Vec<db::ActorMeshRecord>) {
        let mut live: Vec<db::ActorMeshRecord> = self
            .actor_meshes
            .list()
            .iter()
            .map(|m| db::ActorMeshRecord {
                name: m.name.clone(),
                mesh: m.proc_mesh.clone(),
                class: m.class.clone(),
                spawned_by: m.spawned_by.clone(),
                extent: m.extent(),
            })
            .collect();
        live.sort_by(|a, b| a.name.cmp(&b.name));
        if live == *last {
            return;
        }
        match self.db.sync_actor_meshes(&live) {
            Ok(()) => *last = live,
            Err(e) => tracing::error!(error = %e, "cannot record the persistent actor meshes"),
        }
    }

    /// Stops the persistent actor mesh `name`, or forgets it if a restart
    /// lost it.
    async fn stop_actor_mesh(&self, name: &str) -> Option<ActorMeshInfo> {
        let why =
            format!("the persistent actor mesh `{name}` was stopped (DELETE /v1/meshes/{name})");
        if let Some(mesh) = self.actor_meshes.stop(name, &why).await {
            return Some(meshes::actor_mesh_info(&mesh));
        }
        let lost = self.actor_meshes().into_iter().find(|m| m.name == name)?;
        match self.db.forget_lost_actor_mesh(name) {
            Ok(true) => Some(lost),
            Ok(false) => None,
            Err(e) => {
                tracing::error!(error = %e, "cannot forget a lost persistent actor mesh");
                None
            }
        }
    }
}

/// The job a log line of an actor on a persistent mesh belongs to: lines
/// start with `[j<job>.<mesh>[<rank>]]`.
fn job_of_line(line: &str) -> Option<u64> {
    let rest = line.strip_prefix("[j")?;
    let digits = rest.find('.')?;
    rest[..digits].parse().ok()
}

/// An `--allow-dir`, resolved: absolute, without `..` or symlinks, so that
/// a granted path can be checked against it by its components.
fn allowed_dir(dir: &std::path::Path) -> Result<PathBuf, String> {
    let canonical =
        std::fs::canonicalize(dir).map_err(|e| format!("--allow-dir {}: {e}", dir.display()))?;
    if !canonical.is_dir() {
        return Err(format!(
            "--allow-dir {}: not a directory; name the directory whose contents jobs may be granted",
            dir.display()
        ));
    }
    Ok(canonical)
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Opens the data directory, starts the configured meshes, and
    /// listens. Refuses a non-loopback address without a token.
    pub async fn start(mut config: ServeConfig) -> Result<Server, String> {
        if config.token.is_none()
            && config.tokens_file.is_none()
            && !config.listen.ip().is_loopback()
        {
            return Err(format!(
                "refusing to serve on {} without a token: anyone who reaches it could run code here. Pass --tokens-file (or --token-file), or listen on 127.0.0.1",
                config.listen
            ));
        }
        let mut principals = Principals::default();
        if let Some(text) = &config.token {
            principals.add_legacy(text, config.quota)?;
            if principals.is_empty() {
                return Err("the token file holds no token".into());
            }
        }
        if let Some(path) = &config.tokens_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--tokens-file {}: {e}", path.display()))?;
            let before = principals.len();
            principals.add_file(path, &text, config.quota)?;
            if principals.len() == before {
                return Err(format!(
                    "{}: the tokens file names no principal; write `NAME ROLE TOKEN` lines (ROLE admin or user)",
                    path.display()
                ));
            }
        }
        for (name, role) in principals.summary() {
            tracing::info!(principal = %name, role, "principal");
        }
        config.allowed_dirs = config
            .allowed_dirs
            .iter()
            .map(|dir| allowed_dir(dir))
            .collect::<Result<_, _>>()?;
        for dir in ["components", "logs", "uploads"] {
            let dir = config.data.join(dir);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        // Uploads cut off by a stop are of no use.
        if let Ok(entries) = std::fs::read_dir(config.data.join("uploads")) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let (db, recovered) = Db::open(&config.data.join("state.db"))?;
        if recovered.failed > 0 {
            tracing::warn!(
                jobs = recovered.failed,
                "jobs left running by the last run were marked failed (server restarted)"
            );
        }
        // Jobs' controllers, of programs not known yet (their actors run in
        // child procs, whose pools are sized for their program).
        let shape = engine::PoolShape::any_program(
            engine::DEFAULT_MAX_INSTANCES,
            config.max_limits.memory_mib as usize * (1 << 20),
        );
        let engine =
            engine::pooled_engine(&shape).map_err(|e| format!("cannot start the engine: {e:#}"))?;
        engine::start_epoch_ticker(&engine);
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let state = Arc::new(State {
            principals,
            anonymous: Arc::new(principals::Principal::anonymous(config.quota)),
            rate: RateLimiter::new(config.rate_limit),
            admission: Mutex::new(()),
            sessions: Default::default(),
            db,
            engine,
            prepared: Mutex::default(),
            compile_gate: Semaphore::new(config.compile_concurrency.max(1)),
            run_gate: Arc::new(Semaphore::new(config.max_running_jobs.max(1))),
            live: Mutex::default(),
            persistent: Mutex::default(),
            creating: Mutex::default(),
            fresh: Mutex::default(),
            actor_meshes: Arc::default(),
            actor_archive: Arc::default(),
            metrics: metrics::Metrics::new(config.metrics_interval),
            counters: JobCounters::default(),
            uploads: UploadCounters::default(),
            unauthorized: AtomicU64::new(0),
            rate_limited: AtomicU64::new(0),
            meshes_made: AtomicU64::new(0),
            config,
        });
        for (name, _) in &state.config.meshes {
            meshes::validate_mesh_name(name)?;
        }
        // The persistent meshes of the last run come back first (PM-1),
        // with new procs; a `--mesh` of a recorded name is that mesh.
        for record in state.db.recorded_meshes()? {
            match state
                .create_mesh(&record.name, record.procs, record.owner.clone())
                .await
            {
                Ok(_) => tracing::warn!(
                    mesh = %record.name,
                    procs = record.procs,
                    "restored persistent mesh {} ({} procs)",
                    record.name,
                    record.procs
                ),
                // One this start's `--mesh` asks for must start, as
                // a new one must.
                Err(e) if state.config.meshes.iter().any(|(n, _)| *n == record.name) => {
                    return Err(format!("mesh `{}`: {e}", record.name));
                }
                Err(e) => tracing::error!(
                    mesh = %record.name,
                    error = %e,
                    "cannot restore the persistent mesh {}: {e}",
                    record.name
                ),
            }
        }
        for (name, procs) in state.config.meshes.clone() {
            if let Some(mesh) = state.persistent(&name) {
                if mesh.procs != procs {
                    tracing::warn!(
                        mesh = %name,
                        "--mesh {name}={procs}: the mesh was restored with its recorded {} procs; DELETE /v1/meshes/{name} and restart to change it",
                        mesh.procs
                    );
                }
                continue;
            }
            state
                .create_mesh(&name, procs, None)
                .await
                .map_err(|e| format!("mesh `{name}`: {e}"))?;
            state.db.record_mesh(&db::MeshRecord {
                name: name.clone(),
                procs,
                owner: None,
                origin: "flag".into(),
                created_at_ms: db::now_ms(),
            })?;
        }
        state.requeue(recovered.queued);
        metrics::start(&state);
        // What persistent actor meshes live is written down within a
        // second of a change, for the next start to say they were lost.
        let watched = Arc::downgrade(&state);
        tokio::spawn(async move {
            let mut last = Vec::new();
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let Some(state) = watched.upgrade() else {
                    break;
                };
                state.sync_actor_meshes(&mut last);
            }
        });
        let router = handlers::router(state.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let header_timeout = state.config.header_timeout;
        let task = tokio::spawn(listen::serve(
            listener,
            router,
            header_timeout,
            async move {
                let _ = stopped.await;
            },
        ));
        tracing::info!(%addr, "serving");
        Ok(Server {
            addr,
            state,
            stop: Some(stop),
            task,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops: cancels unfinished jobs (they are marked failed), waits up
    /// to `grace` for them and for open requests, then stops every mesh.
    pub async fn stop(mut self, grace: Duration) {
        // Metrics streams end, so that open requests can.
        self.state.metrics.stop();
        self.state
            .sessions
            .close_all(&self.state.db, "the server is stopping");
        let live: Vec<Arc<LiveJob>> = self.state.live().values().cloned().collect();
        for job in &live {
            job.cancel("the server is stopping".into());
        }
        let until = tokio::time::Instant::now() + grace;
        while !self.state.live().is_empty() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout_at(until, &mut self.task).await;
        self.task.abort();
        let names: Vec<String> = self
            .state
            .persistent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        for name in names {
            self.state.stop_mesh(&name);
        }
    }
}

//! `monarch-host serve`: programs uploaded over HTTP, jobs that run their
//! controllers, and persistent meshes that outlive jobs. The routes and
//! their JSON are in `docs/serve.md`; the OpenAPI document at
//! `/v1/openapi.json` is generated from [`handlers`] and [`api`].
//!
//! - [`db`]: components and jobs in SQLite; a restart fails what was running.
//! - [`jobs`]: the queue, one task per job, log files that streams follow.
//! - [`meshes`]: persistent meshes and the server's view of every mesh.
//!
//! A job may be granted directories only inside the admin's `--allow-dir`s
//! ([`ServeConfig::allowed_dirs`]), checked at submission in `handlers`
//! and again as it starts in `jobs`.

pub mod api;
pub mod client;
mod db;
mod debug_bridge;
mod handlers;
mod jobs;
mod meshes;
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
use tokio::sync::{OnceCell, Semaphore};
use wasmtime::Engine;

use crate::engine;
use crate::mesh::PersistentActorMeshes;
use crate::run::Prepared;
pub use api::Limits;
use api::{ActorMeshInfo, MeshInfo};
use db::Db;
use jobs::{JobCounters, LiveJob, LiveJobs};
use meshes::{MeshView, PersistentMesh};

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Where state, components and logs are kept.
    pub data: PathBuf,
    /// The bearer token clients must present; required off loopback.
    /// Several tokens, one per line, give several owners: a console
    /// session belongs to the token that opened it.
    pub token: Option<String>,
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
}

impl ServeConfig {
    /// A configuration with the defaults of `monarch-host serve`.
    pub fn new(listen: SocketAddr, data: PathBuf, bootstrap: PathBuf) -> ServeConfig {
        ServeConfig {
            listen,
            data,
            token: None,
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
        }
    }
}

/// What the handlers share.
pub(crate) struct State {
    config: ServeConfig,
    /// The tokens clients may present; none: no token is asked for.
    tokens: Vec<ClusterToken>,
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
    /// Names of persistent meshes being created.
    creating: Mutex<std::collections::HashSet<String>>,
    fresh: Mutex<BTreeMap<u64, Arc<MeshView>>>,
    /// Persistent actor meshes, which belong to the server: jobs and
    /// sessions spawn and find them through their observers.
    actor_meshes: Arc<PersistentActorMeshes>,
    counters: JobCounters,
    uploads: UploadCounters,
    unauthorized: AtomicU64,
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
    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<LiveJob>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn log_path(&self, job: u64) -> PathBuf {
        self.config.data.join("logs").join(format!("{job}.log"))
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

    /// Starts the persistent mesh `name` with `procs` procs.
    async fn create_mesh(self: &Arc<Self>, name: &str, procs: u32) -> Result<MeshInfo, String> {
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
                    let socket = std::env::temp_dir()
                        .join(format!("monarch-serve-{}-{nth}.sock", std::process::id()));
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
            allocated.into_iter().map(|a| a.proc).collect(),
        );
        let mut events = client.subscribe();
        let watched = Arc::downgrade(&view);
        // Failures of persistent actor meshes on these procs are the
        // server's: logged and recorded, failing no job.
        let actor_meshes = Arc::downgrade(&self.actor_meshes);
        let mesh_name = name.to_string();
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                let Some(view) = watched.upgrade() else { break };
                view.take_event(&event);
                if let Some(actor_meshes) = actor_meshes.upgrade() {
                    actor_meshes.take_event(&mesh_name, &event);
                }
            }
        });
        let info = view.info(true);
        self.actor_meshes.set_proc_mesh(name, true);
        self.persistent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), Arc::new(PersistentMesh { client, view }));
        tracing::info!(mesh = name, procs, "persistent mesh started");
        Ok(info)
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

    /// The persistent actor meshes, by name.
    fn actor_meshes(&self) -> Vec<ActorMeshInfo> {
        self.actor_meshes
            .list()
            .iter()
            .map(|m| meshes::actor_mesh_info(m))
            .collect()
    }

    /// Stops the persistent actor mesh `name`.
    async fn stop_actor_mesh(&self, name: &str) -> Option<ActorMeshInfo> {
        let why =
            format!("the persistent actor mesh `{name}` was stopped (DELETE /v1/meshes/{name})");
        let mesh = self.actor_meshes.stop(name, &why).await?;
        Some(meshes::actor_mesh_info(&mesh))
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
        if config.token.is_none() && !config.listen.ip().is_loopback() {
            return Err(format!(
                "refusing to serve on {} without a token: anyone who reaches it could run code here. Pass --token-file, or listen on 127.0.0.1",
                config.listen
            ));
        }
        // One token per line; blank lines and `#` comments are skipped.
        let tokens: Vec<ClusterToken> = match &config.token {
            Some(text) => text
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with('#'))
                .filter_map(ClusterToken::new)
                .collect(),
            None => Vec::new(),
        };
        if config.token.is_some() && tokens.is_empty() {
            return Err("the token file holds no token".into());
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
        let (db, interrupted) = Db::open(&config.data.join("state.db"))?;
        if interrupted > 0 {
            tracing::warn!(
                jobs = interrupted,
                "jobs left unfinished by the last run were marked failed"
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
        // Log streams write small events: without TCP_NODELAY an event
        // after the headers waits ~40 ms for a delayed ACK.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let state = Arc::new(State {
            tokens,
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
            counters: JobCounters::default(),
            uploads: UploadCounters::default(),
            unauthorized: AtomicU64::new(0),
            meshes_made: AtomicU64::new(0),
            config,
        });
        for (name, procs) in state.config.meshes.clone() {
            meshes::validate_mesh_name(&name)?;
            state
                .create_mesh(&name, procs)
                .await
                .map_err(|e| format!("mesh `{name}`: {e}"))?;
        }
        let router = handlers::router(state.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the HTTP server failed");
            }
        });
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

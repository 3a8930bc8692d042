//! The host side of the WIT imports, for the controller and for actors.
//!
//! Every instance, controller or actor, has a [`HostState`]: its resource
//! table, its sandbox limits, the mailbox it sends from, and a caster
//! ([`hyperactor_mesh::Caster`]) for its requests. A request (`call`,
//! `stream`...) becomes a cast down the mesh's multicast tree and returns
//! its id at once; exactly one final event comes for the id, which
//! `next-events` hands over with the failures of the meshes the instance
//! spawned (an actor's go to its `supervise` export instead).
//!
//! - FE-1: one failure event per failed actor of the meshes the instance
//!   owns; every request waiting on it gets an error of its own.
//! - MS-1: a request to a mesh its owner stopped, or to a rank whose
//!   failure it heard of, fails before anything is sent.
//!
//! A guest may be hostile (`docs/host.md`, "Hostile guests"); what it can
//! make the host hold is bounded per instance:
//!
//! - HG-1: linear memory by the memory cap (`--memory`), tables by the
//!   engine's pool; a refused growth is remembered, so that the trap after
//!   it is reported as out of memory, naming the cap.
//! - HG-2: what one host call takes from the guest by the hostcall fuel
//!   ([`HOSTCALL_FUEL`], as large as a frame between procs); past it the
//!   guest traps with "payload too large".
//! - HG-3: resources by [`MAX_RESOURCES`]; past it the guest traps with
//!   "too many handles".
//! - HG-4: a message larger than [`MAX_MESSAGE`] (so that its frame would
//!   not fit between procs) fails at once with kind `invalid`, naming its
//!   size and the limit, instead of being dropped on the way; a reply
//!   that large is an endpoint error of the actor that made it.
//! - HG-5: at most [`MAX_IN_FLIGHT`] requests whose events the guest has
//!   not taken; past it the guest traps with "too many requests", so that
//!   a guest that calls without ever waiting cannot grow the host's
//!   memory without bound.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use hyperactor::proc::Pace;
use hyperactor::{Mailbox, ProcId};
use hyperactor_mesh::agent::MeshEvent;
use hyperactor_mesh::client::{ActorSpec, MeshClient};
use hyperactor_mesh::{CastMode, Caster, Fault, FaultKind, Outcome};
use tokio::sync::mpsc;
use wasmtime::component::{HasSelf, Linker, Resource, ResourceTable};
use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::bindings::monarch::host::{logging, mesh, types};
use crate::bindings::{
    CallError, Dim, ErrorKind, Event, EventKind, ProcInfo, ProcState, ProgramPre, Reducer, Reply,
    SliceDim, SpawnOptions, SupervisionFailure, ValueMesh,
};
use crate::engine::{Placement, Sandbox};
use crate::errors;
use crate::mesh::{
    ActorMeshHandle, MeshBase, PersistentActorMesh, PersistentActorMeshes, ProcMeshHandle,
    WasmSpawnParams, checked_extent_size, extent_size, persistent_actor_name, slice,
    validate_extent, validate_persistent_name,
};
use crate::output::LineOutput;

mod data_plane;
mod faults;

/// Where log lines of guests go.
pub type LogSink = Arc<dyn Fn(&str) + Send + Sync>;

/// What an actor does once it has a mesh client of its own.
pub(crate) type ClientHook = Box<dyn Fn(&Arc<MeshClient>) + Send + Sync>;

/// Raised when an instance's actor is stopped: the guest is interrupted at
/// once, wherever it is (running, or waiting in any host call), so a stop
/// never waits on a guest.
#[derive(Default)]
pub struct Interrupt {
    raised: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Interrupt {
    /// Raises it; every waiter wakes, now and later.
    pub fn raise(&self) {
        self.raised.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Whether it was raised.
    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Acquire)
    }

    /// Whether it was raised since the last take; lowers it (a session's
    /// Ctrl-C, read once by the guest).
    pub fn take(&self) -> bool {
        self.raised.swap(false, Ordering::AcqRel)
    }

    /// Completes once it is raised.
    pub async fn raised(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_raised() {
                return;
            }
            notified.await;
        }
    }
}

/// The program a cluster runs, as bytes for the hosts that do not have it:
/// in memory where the controller read them, else read from the host's
/// blob store the first time an actor ships them on (a proc keeps no copy
/// of a program it only runs).
#[derive(Clone)]
pub(crate) struct ProgramBytes {
    pub(crate) sha256: String,
    /// What an instance of it takes from its engine's pool.
    pub(crate) needs: crate::engine::Needs,
    bytes: Arc<std::sync::OnceLock<Arc<Vec<u8>>>>,
    file: Option<std::path::PathBuf>,
}

impl ProgramBytes {
    /// A program held in memory.
    pub(crate) fn in_memory(sha256: String, needs: crate::engine::Needs, bytes: Vec<u8>) -> Self {
        ProgramBytes {
            sha256,
            needs,
            bytes: Arc::new(Arc::new(bytes).into()),
            file: None,
        }
    }

    /// A program in the file `file`, read when first needed.
    pub(crate) fn in_file(
        sha256: String,
        needs: crate::engine::Needs,
        file: std::path::PathBuf,
    ) -> Self {
        ProgramBytes {
            sha256,
            needs,
            bytes: Arc::default(),
            file: Some(file),
        }
    }

    /// The program's bytes.
    pub(crate) fn bytes(&self) -> Result<Arc<Vec<u8>>, String> {
        if let Some(bytes) = self.bytes.get() {
            return Ok(bytes.clone());
        }
        let file = self.file.as_ref().ok_or("the program's bytes are gone")?;
        let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
        Ok(self.bytes.get_or_init(|| Arc::new(bytes)).clone())
    }
}

/// What every instance of one program on one OS process shares: the
/// engine, the compiled program, and (on the controller's process) the
/// mesh client that starts procs.
pub struct Cluster {
    pub(crate) engine: Engine,
    /// The program's actor classes; None for a component of the
    /// `controller` world, which defines none.
    pub(crate) pre: Option<ProgramPre<HostState>>,
    pub(crate) sandbox: Sandbox,
    pub(crate) log: LogSink,
    pub(crate) deadline: Instant,
    pub(crate) program: ProgramBytes,
    client: std::sync::OnceLock<Arc<MeshClient>>,
    pub(crate) job: JobHooks,
    /// An actor's cluster: it starts a mesh client of its own on the
    /// actor's first `spawn-procs` (AO-1).
    actor_owned: bool,
}

/// Hears what a job's controller spawns and stops, for the server's view
/// of its meshes.
pub trait MeshObserver: Send + Sync {
    /// The controller got `procs` (started, or lent by a persistent mesh).
    fn procs_spawned(&self, procs: &[ProcId]);
    /// An actor mesh `name` of `class` runs `per_proc` actors on each of `procs`.
    fn actors_spawned(&self, name: &str, class: &str, procs: &[ProcId], per_proc: u32);
    /// The actor mesh `name` was stopped.
    fn actors_stopped(&self, name: &str);
    /// A proc or actor of the run's fresh mesh failed or stopped (a
    /// persistent mesh's events go to its owner, not through here).
    fn mesh_event(&self, event: &MeshEvent);
    /// The server's persistent actor meshes, which the controller spawns
    /// with `spawn-persistent` and finds with `lookup-actor-mesh`; None
    /// where there is no server (`monarch-host run`).
    fn persistent_actors(&self) -> Option<Arc<PersistentActorMeshes>> {
        None
    }
    /// Where the traces of the controller's calls go, if they are traced
    /// for this run alone (`serve --trace`: the job's trace file).
    fn trace_sink(&self) -> Option<hyperactor_mesh::cast::TraceSink> {
        None
    }
    /// Whether the controller may look up, or respawn, the persistent
    /// actor mesh `mesh`: on a server with principals, one its own
    /// principal may see (HA-1).
    fn may_use_actor_mesh(&self, _mesh: &PersistentActorMesh) -> bool {
        true
    }
    /// The server's job whose controller this is, for its call statistics.
    fn job(&self) -> Option<u64> {
        None
    }
}

/// Procs a job borrows from a persistent mesh: `spawn-procs` hands out
/// these (they are never stopped by the job), and the job's actor meshes
/// are named `<scope><name>` on them, so jobs sharing procs never collide.
#[derive(Clone)]
pub struct AttachedProcs {
    /// The persistent mesh's name, for errors.
    pub mesh: String,
    /// Its procs, in rank order.
    pub procs: Vec<ProcId>,
    /// The prefix of the job's actor mesh names, e.g. `j7.`.
    pub scope: String,
}

/// What a job run by the server adds to a plain run.
#[derive(Clone, Default)]
pub(crate) struct JobHooks {
    pub(crate) attached: Option<AttachedProcs>,
    pub(crate) observer: Option<Arc<dyn MeshObserver>>,
    /// Actor libraries: other programs (in any language) whose actor
    /// classes the controller spawns as `NAME/Class` (`run --actors
    /// NAME=PATH`).
    pub(crate) libraries: Arc<std::collections::BTreeMap<String, ProgramBytes>>,
}

impl Cluster {
    /// The cluster of one actor: what it spawns runs where
    /// `sandbox.placement` says (procs inside this process, or child
    /// processes of it) and is owned by the actor (AO-1).
    pub(crate) fn for_actor(
        engine: Engine,
        pre: Option<ProgramPre<HostState>>,
        sandbox: Sandbox,
        log: LogSink,
        program: ProgramBytes,
    ) -> Arc<Self> {
        Self::build(
            engine,
            pre,
            sandbox,
            log,
            program,
            JobHooks::default(),
            true,
        )
    }

    /// A cluster for a job of the server.
    pub(crate) fn for_job(
        engine: Engine,
        pre: Option<ProgramPre<HostState>>,
        sandbox: Sandbox,
        log: LogSink,
        program: ProgramBytes,
        job: JobHooks,
    ) -> Arc<Self> {
        Self::build(engine, pre, sandbox, log, program, job, false)
    }

    fn build(
        engine: Engine,
        pre: Option<ProgramPre<HostState>>,
        sandbox: Sandbox,
        log: LogSink,
        program: ProgramBytes,
        job: JobHooks,
        actor_owned: bool,
    ) -> Arc<Self> {
        let deadline = Instant::now() + sandbox.deadline;
        Arc::new(Cluster {
            engine,
            pre,
            sandbox,
            log,
            deadline,
            program,
            client: std::sync::OnceLock::new(),
            job,
            actor_owned,
        })
    }

    /// The mesh client that starts this instance's procs: the
    /// controller's, set by its run; for an actor, one started now on its
    /// first spawn (AO-1). True when it was started by this call.
    async fn client_for_spawn(self: &Arc<Self>) -> Result<(Arc<MeshClient>, bool), String> {
        if let Some(client) = self.client.get() {
            return Ok((client.clone(), false));
        }
        if !self.actor_owned {
            return Err("this instance has no mesh client to start procs".into());
        }
        // One actor handles one message at a time, so nothing races here.
        let client =
            crate::run::start_client(self, &self.sandbox.placement, self.log.clone()).await?;
        let _ = self.client.set(client.clone());
        Ok((client, true))
    }

    /// Whether this process has a core to spare for polling: its procs run
    /// inside it, on other hosts, or as child processes that leave a core
    /// free (beyond that, a polling process takes the core that a proc
    /// needs to answer, as the procs' own polling rule says).
    pub(crate) fn spare_core(&self) -> bool {
        match &self.sandbox.placement {
            Placement::InProcess | Placement::Hosts { .. } => true,
            Placement::Local { .. } => {
                static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
                let cores = *CORES
                    .get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
                self.client
                    .get()
                    .is_some_and(|client| client.live_procs() < cores)
            }
        }
    }

    /// Gives the cluster the mesh client that starts its procs.
    pub(crate) fn set_client(&self, client: Arc<MeshClient>) {
        let _ = self.client.set(client);
    }

    pub(crate) fn client(&self) -> Result<&Arc<MeshClient>, String> {
        self.client
            .get()
            .ok_or_else(|| "this instance has spawned no procs".to_string())
    }

    async fn spawn_procs(&self, count: usize) -> Result<Vec<ProcId>, String> {
        let client = self.client()?;
        if let Some(attached) = &self.job.attached {
            if count > attached.procs.len() {
                return Err(format!(
                    "the mesh `{}` has {} procs; {count} asked for",
                    attached.mesh,
                    attached.procs.len()
                ));
            }
            let procs = attached.procs[..count].to_vec();
            if let Some((proc, reason)) = procs
                .iter()
                .find_map(|p| client.dead(p).map(|reason| (p, reason)))
            {
                return Err(format!(
                    "proc {proc} of the mesh `{}` {reason}",
                    attached.mesh
                ));
            }
            if let Some(observer) = &self.job.observer {
                observer.procs_spawned(&procs);
            }
            return Ok(procs);
        }
        let running = client.live_procs();
        if running + count > self.sandbox.max_procs {
            return Err(format!(
                "this run allows {} procs (`run --procs`, or a job's `limits.procs`) and {running} are running; {count} more asked for",
                self.sandbox.max_procs,
            ));
        }
        // "N of M procs up" on a terminal, as each proc comes up.
        let up = crate::progress::bar(count as u64, "procs up");
        let count_up = up.counter();
        let spawned = hyperactor_mesh::alloc::reporting_procs_up(
            Arc::new(move |n: usize| count_up(n as u64)),
            client.spawn_procs(count),
        )
        .await;
        up.clear();
        match spawned {
            Ok(allocated) => {
                let procs: Vec<ProcId> = allocated.into_iter().map(|a| a.proc).collect();
                if let Some(observer) = &self.job.observer {
                    observer.procs_spawned(&procs);
                }
                Ok(procs)
            }
            Err(e) => Err(format!("cannot start procs: {e}")),
        }
    }

    /// Stops the actor mesh `mesh`, and tells the observer.
    async fn stop_actors(&self, client: &MeshClient, mesh: &MeshBase, timeout: Duration) {
        client.stop_actors(&mesh.procs, &mesh.name, timeout).await;
        if let Some(observer) = &self.job.observer {
            observer.actors_stopped(&mesh.name);
        }
    }

    /// Stops `meshes` (what the controller spawned), then every proc.
    pub(crate) async fn stop_all(&self, meshes: Vec<Arc<MeshBase>>) {
        let Some(client) = self.client.get() else {
            return;
        };
        let stops = meshes
            .iter()
            .map(|m| self.stop_actors(client, m, Duration::from_secs(2)));
        futures::future::join_all(stops).await;
        // Procs lent by a persistent mesh stay up for the next job.
        if self.job.attached.is_none() {
            client.stop_all();
        }
    }
}

/// How a request treats replies.
#[derive(Clone, Copy)]
enum Mode {
    Gather,
    Reduce(Reducer),
    Single,
    Stream,
    Broadcast,
}

impl Mode {
    fn cast_mode(self) -> CastMode {
        use hyperactor_mesh::Reducer as R;
        match self {
            Mode::Gather | Mode::Single => CastMode::Gather,
            Mode::Stream => CastMode::Stream,
            Mode::Broadcast => CastMode::Broadcast,
            Mode::Reduce(reducer) => CastMode::Reduce(match reducer {
                Reducer::SumI64 => R::SumI64,
                Reducer::MinI64 => R::MinI64,
                Reducer::MaxI64 => R::MaxI64,
                Reducer::SumF64 => R::SumF64,
                Reducer::MinF64 => R::MinF64,
                Reducer::MaxF64 => R::MaxF64,
                Reducer::Concat => R::Concat,
            }),
        }
    }
}

/// A request whose cast is in flight.
struct Pending {
    id: u64,
    mode: Mode,
    mesh: String,
    endpoint: String,
    extent: Vec<Dim>,
    /// For `choose`: the counter to give back.
    chosen: Option<(Arc<Vec<AtomicUsize>>, usize)>,
    /// When it was sent, and to how many ranks (`observe`).
    started: crate::observe::Started,
}

/// The host state of one instance.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limits: Limits,
    pub(crate) cluster: Arc<Cluster>,
    caster: Caster,
    /// Events ready for `next-events`.
    ready: VecDeque<Event>,
    /// Requests in flight, by cast number.
    pending: HashMap<u64, Pending>,
    next_request: u64,
    call_timeout: Duration,
    /// The handler deadline of requests made from now on; None: each
    /// mesh's own.
    handler_timeout: Option<Duration>,
    /// Actors whose one failure event was given (mesh, rank).
    reported: HashSet<(String, u32)>,
    who: String,
    /// Failures of procs and actors (the controller's).
    events: Option<mpsc::UnboundedReceiver<MeshEvent>>,
    /// The meshes this instance spawned, whose failures it hears of.
    spawned: Vec<Arc<MeshBase>>,
    /// The procs this instance stopped: a reference to a mesh on them,
    /// resolved later, is stopped at once (MS-1), not cast to a proc that
    /// is gone.
    stopped_procs: HashSet<ProcId>,
    /// Where the data plane's waits (tensor fetches, RDMA transfers) post
    /// their `done` events, and where `next-events` takes them from.
    completions: mpsc::UnboundedSender<Event>,
    completed: mpsc::UnboundedReceiver<Event>,
    /// The RDMA actors of this instance's proc meshes, started on first use.
    rdma: data_plane::RdmaMeshes,
    /// Raised when the instance's actor is stopped: the guest traps at its
    /// next epoch tick or wait, even if it would never return.
    pub(crate) interrupt: Arc<Interrupt>,
    /// An actor's failures of the meshes it owns go to its `supervise`
    /// export (AO-2), not to `next-events`: here until the host calls it.
    pub(crate) unsupervised: Option<VecDeque<SupervisionFailure>>,
    /// Called once the instance has a mesh client of its own (an actor's
    /// first spawn), so that its actor hears of failures while idle.
    pub(crate) on_client: Option<ClientHook>,
    /// The instance's place in its engine's pool, given back with the
    /// store.
    pub(crate) slot: Option<crate::engine::Slot>,
    /// How long waits for replies poll before they sleep.
    pace: Pace,
    /// An actor's breakpoints: who it is, and its pause if it is paused.
    pub(crate) debug: crate::debug::pause::ActorDebug,
    /// What the instance shows of its stack when `monarch-host stacks` asks.
    pub(crate) probe: Option<Arc<crate::debug::stacks::Probe>>,
    /// A session's Ctrl-C (`console.interrupted`); None but in a session's
    /// controller.
    pub(crate) console: Option<Arc<crate::session::ConsoleFlag>>,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// How long `next-events` polls for an event before it sleeps, at least.
const EVENT_SPIN: Duration = Duration::from_micros(50);

/// How long `next-events` polls at most, when replies have lately come
/// within it: it polls twice as long as they have lately taken, between
/// [`EVENT_SPIN`] and this, as a proc's connections do
/// ([`hyperactor::proc::Pace`]), unless the host's procs have every core.
const EVENT_SPIN_MAX: Duration = Duration::from_millis(1);

/// The most bytes a guest may hand the host in one call (a message, a
/// name), as large as the biggest frame a proc sends.
const HOSTCALL_FUEL: usize = 64 << 20;

/// Resources one instance may hold at once.
pub(crate) const MAX_RESOURCES: usize = 10_000;

/// Requests one instance may have in flight or finished but not yet
/// taken by `next-events` (HG-5).
pub(crate) const MAX_IN_FLIGHT: usize = 65_536;

/// How [`too_many_requests`] starts.
pub(crate) const TOO_MANY_REQUESTS: &str = "too many requests: ";

/// Why a guest with [`MAX_IN_FLIGHT`] requests whose events it has not
/// taken cannot make another.
pub(crate) fn too_many_requests() -> String {
    format!(
        "{TOO_MANY_REQUESTS}the instance has {MAX_IN_FLIGHT} requests whose events it has not taken, the most one instance may have; await replies (next-events) before making more"
    )
}

/// How [`too_many_handles`] starts.
pub(crate) const TOO_MANY_HANDLES: &str = "too many handles: ";

/// Why a guest that holds [`MAX_RESOURCES`] resources cannot get another.
pub(crate) fn too_many_handles() -> String {
    format!(
        "{TOO_MANY_HANDLES}the instance holds {MAX_RESOURCES} resources (meshes, slices, tensors, buffers, WASI streams), the most one instance may hold at once; drop the handles it no longer needs"
    )
}

/// The most bytes one message (its payload and endpoint name) may carry:
/// a frame between procs is at most [`HOSTCALL_FUEL`] bytes, and its
/// envelope (addresses, the cast's ranks) takes the rest (HG-4).
pub(crate) const MAX_MESSAGE: usize = HOSTCALL_FUEL - (64 << 10);

/// The error of a message of `payload` to `endpoint` that exceeds
/// [`MAX_MESSAGE`], refused before it is sent (HG-4); None when it fits.
pub(crate) fn too_large(endpoint: &str, payload: &[u8]) -> Option<CallError> {
    let size = endpoint.len() + payload.len();
    (size > MAX_MESSAGE).then(|| {
        errors::invalid(format!(
            "a message to `{endpoint}` of {size} bytes exceeds the limit of {MAX_MESSAGE} bytes (a frame between procs is at most {} MiB, envelope included); send large data in parts",
            HOSTCALL_FUEL >> 20
        ))
    })
}

/// How [`payload_too_large`] starts.
pub(crate) const PAYLOAD_TOO_LARGE: &str = "payload too large: ";

/// Why a guest that handed the host more than [`HOSTCALL_FUEL`] bytes in
/// one call was stopped.
pub(crate) fn payload_too_large() -> String {
    format!(
        "{PAYLOAD_TOO_LARGE}the guest handed the host more than {} MiB in one call, the most one call (a message, a name) may carry; send large data in parts",
        HOSTCALL_FUEL >> 20
    )
}

/// The fan-out of the multicast trees of casts.
pub const FANOUT: u32 = hyperactor_mesh::comm::DEFAULT_FANOUT;

impl HostState {
    /// The state of an instance that sends from `mailbox` and logs as
    /// `who`. Its stdout and stderr go to the cluster's log sink, each line
    /// after `output` (an actor's `[mesh rank] `), or to the host's own
    /// when `output` is None (a controller run from the command line).
    pub(crate) fn new(
        cluster: Arc<Cluster>,
        mailbox: &Mailbox,
        who: String,
        output: Option<String>,
    ) -> Self {
        // Nothing is granted but what the operator named: directories,
        // environment variables. No network.
        let mut wasi = WasiCtx::builder();
        match output {
            Some(prefix) => {
                let out = LineOutput::new(cluster.log.clone(), prefix);
                wasi.stdout(out.clone()).stderr(out);
            }
            None => {
                wasi.inherit_stdout().inherit_stderr();
            }
        }
        if let Some(seed) = hyperactor::sim::seeded(&who) {
            // Under `test --sim` the guest's clock is the simulation's, and
            // its random numbers come from the seed (a Rust guest's
            // HashMap order with them), per instance.
            wasi.monotonic_clock(VirtualClock(tokio::time::Instant::now()));
            wasi.secure_random(SeededRandom(hyperactor::sim::SeededNumbers::new(seed)));
            wasi.insecure_random(SeededRandom(hyperactor::sim::SeededNumbers::new(!seed)));
            wasi.insecure_random_seed(u128::from(seed) << 64 | u128::from(!seed));
        }
        let grants = &cluster.sandbox.grants;
        wasi.envs(&grants.env);
        for dir in &grants.dirs {
            let perms = match dir.writable {
                true => wasmtime_wasi::FsPerms::ReadWrite,
                false => wasmtime_wasi::FsPerms::ReadOnly,
            };
            if let Err(e) = wasi.preopened_dir(&dir.host, &dir.guest, perms) {
                // Checked when granted; a directory removed since is left out.
                tracing::warn!(dir = %dir.host.display(), error = %e, "cannot preopen a granted directory");
            }
        }
        let wasi = wasi.build();
        let limits = Limits::new(cluster.sandbox.memory_bytes);
        let call_timeout = cluster.sandbox.call_timeout;
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        let (completions, completed) = mpsc::unbounded_channel();
        let mut caster = Caster::new(mailbox, cluster.sandbox.fanout);
        // In a debugged run whose hub is in this process (the
        // controller's), calls wait as long as their ranks are paused.
        if let Some(config) = &cluster.sandbox.debug
            && let Some(clock) = crate::debug::hub::clock(&config.token)
        {
            caster.set_hold(Arc::new(move || clock.paused()));
        }
        if let Some(sink) = cluster.job.observer.as_ref().and_then(|o| o.trace_sink()) {
            caster.set_trace_sink(sink);
        }
        HostState {
            wasi,
            table,
            limits,
            caster,
            cluster,
            ready: VecDeque::new(),
            pending: HashMap::new(),
            next_request: 1,
            call_timeout,
            handler_timeout: None,
            reported: HashSet::new(),
            who,
            events: None,
            spawned: Vec::new(),
            stopped_procs: HashSet::new(),
            completions,
            completed,
            rdma: Default::default(),
            interrupt: Arc::default(),
            unsupervised: None,
            on_client: None,
            slot: None,
            pace: Pace::new(EVENT_SPIN, EVENT_SPIN_MAX),
            debug: Default::default(),
            probe: None,
            console: None,
        }
    }

    /// Takes the meshes this instance spawned (and has not stopped).
    pub(crate) fn take_spawned(&mut self) -> Vec<Arc<MeshBase>> {
        std::mem::take(&mut self.spawned)
    }

    /// Hands this instance the failures of procs and actors.
    pub(crate) fn watch(&mut self, events: mpsc::UnboundedReceiver<MeshEvent>) {
        self.events = Some(events);
    }

    /// Adds a resource the guest will hold; past [`MAX_RESOURCES`] the
    /// guest traps with [`too_many_handles`] (HG-3).
    fn push<T: Send + 'static>(&mut self, value: T) -> wasmtime::Result<Resource<T>> {
        match self.table.push(value) {
            Ok(resource) => Ok(resource),
            Err(wasmtime::component::ResourceTableError::Full) => {
                wasmtime::bail!("{}", too_many_handles())
            }
            Err(e) => Err(e.into()),
        }
    }

    fn request_id(&mut self) -> u64 {
        let id = self.next_request;
        self.next_request += 1;
        id
    }

    fn finish_now(&mut self, id: u64, kind: EventKind) {
        self.ready.push_back(Event { id, kind });
    }

    /// Sends a request to the ranks at `positions` of `mesh` (all of them
    /// when `None`) and returns its id.
    fn start(
        &mut self,
        mesh: &ActorMeshHandle,
        positions: Option<Vec<usize>>,
        endpoint: String,
        message: Vec<u8>,
        mode: Mode,
    ) -> u64 {
        let id = self.request_id();
        let target = mesh.target(positions.as_deref());
        let started = crate::observe::Started::now(target.ranks.iter().map(Vec::len).sum());
        let chosen = match (&positions, mode) {
            (Some(p), Mode::Single) if p.len() == 1 => {
                mesh.in_flight[p[0]].fetch_add(1, Ordering::Relaxed);
                Some((mesh.in_flight.clone(), p[0]))
            }
            _ => None,
        };
        // Casts made back to back reach each proc in one write, when the
        // guest next waits (or the links' tasks otherwise get to run).
        let (caster, timeout, handler) =
            (&mut self.caster, self.call_timeout, self.handler_timeout);
        let seq = hyperactor::channel::corked(|| {
            caster.cast_with(
                target,
                &endpoint,
                message,
                mode.cast_mode(),
                timeout,
                handler,
            )
        });
        if !matches!(mode, Mode::Broadcast) {
            self.pending.insert(
                seq,
                Pending {
                    id,
                    mode,
                    mesh: mesh.name().to_string(),
                    endpoint,
                    extent: mesh.extent.clone(),
                    chosen,
                    started,
                },
            );
        }
        id
    }

    /// Turns what came back for a cast into the guest's event.
    fn take_outcome(&mut self, outcome: Outcome) {
        let (id, kind) = match outcome {
            // A broadcast's rank did not take it. An actor that failed
            // (an endpoint error included) is reported once, by its
            // owner's supervision, not once per broadcast; the rest (a
            // timeout) is no failure of the actor.
            Outcome::Failed {
                mesh, rank, error, ..
            } => {
                tracing::debug!(%mesh, rank, %error, "a broadcast was not handled");
                return;
            }
            // An item leaves its request in flight.
            Outcome::Item { seq, rank, result } => {
                let Some(pending) = self.pending.get(&seq) else {
                    return;
                };
                let result = result
                    .map_err(|e| errors::call_error(&pending.mesh, rank, &pending.endpoint, e));
                (pending.id, EventKind::Item((rank, result)))
            }
            Outcome::End { seq } => match self.pending.remove(&seq) {
                Some(pending) => {
                    pending.started.done(&self.cluster, &pending.mesh, true);
                    (pending.id, EventKind::End)
                }
                None => return,
            },
            Outcome::Done { seq, result } => {
                let Some(pending) = self.pending.remove(&seq) else {
                    return;
                };
                if let Some((counts, index)) = &pending.chosen {
                    counts[*index].fetch_sub(1, Ordering::Relaxed);
                }
                pending
                    .started
                    .done(&self.cluster, &pending.mesh, result.is_ok());
                let result = match result {
                    Err((rank, error)) => Err(errors::call_error(
                        &pending.mesh,
                        rank,
                        &pending.endpoint,
                        error,
                    )),
                    Ok(mut values) => Ok(match pending.mode {
                        Mode::Gather => Reply::Gathered(ValueMesh {
                            extent: pending.extent,
                            values,
                        }),
                        _ => Reply::Single(values.pop().unwrap_or_default()),
                    }),
                };
                (pending.id, EventKind::Done(result))
            }
        };
        self.ready.push_back(Event { id, kind });
    }

    /// Takes a failure of a proc or an actor: casts waiting on a dead proc
    /// fail its ranks; meshes this instance spawned report one failure
    /// event per actor lost (FE-1), and remember it, so that later
    /// requests to it fail at once (MS-1).
    fn take_mesh_event(&mut self, event: MeshEvent) {
        match event {
            MeshEvent::ProcStopped { proc, reason } => {
                self.caster.proc_died(&proc, &reason);
                let mut lost = Vec::new();
                for base in &self.spawned {
                    if let Some(at) = base.procs.iter().position(|p| p == &proc) {
                        let first = at as u32 * base.per_proc;
                        for rank in first..first + base.per_proc {
                            let why = format!("proc {proc} {reason}");
                            lost.push((base.clone(), rank, Fault::new(FaultKind::ProcLost, why)));
                        }
                    }
                }
                for (base, rank, fault) in lost {
                    self.report_failure(&base, rank, fault);
                }
            }
            MeshEvent::ActorFailed { actor, reason } => {
                let proc = actor.proc_id();
                let mine = self
                    .spawned
                    .iter()
                    .find(|base| base.name == actor.name() && base.procs.iter().any(|p| p == proc))
                    .cloned();
                if let Some(base) = mine {
                    let fault = Fault::decode(&reason, FaultKind::Trap);
                    self.report_failure(&base, actor.rank(), fault);
                }
            }
            MeshEvent::Log { .. } => {}
        }
    }

    /// Gives the one failure event of `base[rank]` (FE-1), unless it was
    /// given already or the mesh was stopped on purpose.
    fn report_failure(&mut self, base: &Arc<MeshBase>, rank: u32, fault: Fault) {
        if !self.reported.insert((base.name.clone(), rank)) {
            return;
        }
        let failure = errors::failure(&base.name, rank, fault);
        {
            let mut state = base.state();
            if state.stopped.is_some() {
                return;
            }
            state.failed.insert(rank, failure.clone());
        }
        match &mut self.unsupervised {
            Some(queue) => queue.push_back(failure),
            None => self.ready.push_back(Event {
                id: 0,
                kind: EventKind::Failure(failure),
            }),
        }
    }

    /// Takes what happened to the meshes this instance owns so far; for an
    /// actor, returns the next failure its `supervise` has not seen.
    pub(crate) fn next_unsupervised(&mut self) -> Option<SupervisionFailure> {
        self.drain_mesh_events();
        self.unsupervised.as_mut()?.pop_front()
    }

    fn drain_mesh_events(&mut self) {
        while let Some(event) = self.events.as_mut().and_then(|rx| rx.try_recv().ok()) {
            self.take_mesh_event(event);
        }
    }
}

/// A store's limits: the memory cap, and at most 64 core instances, 64
/// tables and 16 memories. A `memory.grow` past the cap fails (returns -1)
/// instead of trapping, so that a guest with a garbage collector (Python,
/// JavaScript) can collect and retry, and one that cannot (Rust's
/// allocator aborts) traps on its own; the refusal is remembered, so that
/// such a trap is reported as out of memory, naming the cap.
pub(crate) struct Limits {
    inner: StoreLimits,
    cap: usize,
    /// Why growing a memory was last refused, since [`Limits::clear`].
    refused: Option<String>,
}

impl Limits {
    fn new(cap: usize) -> Self {
        Limits {
            inner: StoreLimitsBuilder::new()
                .memory_size(cap)
                .instances(64)
                .tables(64)
                .memories(16)
                .build(),
            cap,
            refused: None,
        }
    }

    /// Forgets refusals: called before each export, so that a trap is
    /// blamed on memory only if growing it was refused during that call.
    pub(crate) fn clear(&mut self) {
        self.refused = None;
    }

    /// Why the guest is out of memory, if growing its memory was refused
    /// since the last [`Limits::clear`].
    pub(crate) fn out_of_memory(&self) -> Option<&str> {
        self.refused.as_deref()
    }
}

impl wasmtime::ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.inner.memory_growing(current, desired, maximum)?;
        if !allowed {
            let mib = |bytes: usize| bytes.div_ceil(1 << 20);
            self.refused = Some(if desired > self.cap {
                format!(
                    "growing memory to {} MiB was refused: the cap is {} MiB per instance (--memory)",
                    mib(desired),
                    mib(self.cap)
                )
            } else {
                format!(
                    "growing memory to {} MiB was refused: the memory's own maximum is {} MiB",
                    mib(desired),
                    mib(maximum.unwrap_or(desired))
                )
            });
        }
        Ok(allowed)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.refused = Some(format!("growing memory failed: {error}"));
        Ok(())
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.inner.table_growing(current, desired, maximum)?;
        if !allowed {
            self.refused = Some(match maximum {
                Some(max) => format!(
                    "growing a table to {desired} elements was refused: the most it may hold is {max} (its own maximum, or the engine's pool, sized for the program)"
                ),
                None => format!("growing a table to {desired} elements was refused"),
            });
        }
        Ok(allowed)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        if self.refused.is_none() {
            self.refused = Some(format!("growing a table failed: {error}"));
        }
        Ok(())
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

/// The trap of a guest still running at its run's deadline.
pub(crate) const DEADLINE_PASSED: &str =
    "the run's deadline passed while the guest was running (--timeout)";

/// A store for one instance, with the sandbox's limits and deadline.
pub(crate) fn new_store(cluster: &Arc<Cluster>, state: HostState) -> Store<HostState> {
    let mut store = Store::new(&cluster.engine, state);
    store.limiter(|state| &mut state.limits);
    store.set_hostcall_fuel(HOSTCALL_FUEL);
    let deadline = cluster.deadline;
    store.epoch_deadline_callback(move |cx| {
        if cx.data().interrupt.is_raised() {
            wasmtime::bail!("the actor was stopped while its guest ran");
        }
        if Instant::now() >= deadline {
            wasmtime::bail!("{DEADLINE_PASSED}");
        }
        // `monarch-host stacks` asked for this instance's stack: take it
        // here, where the guest's frames are, and let the guest go on. One
        // relaxed load per tick while nobody asks (ST-1).
        if let Some(probe) = &cx.data().probe
            && probe.wanted()
        {
            probe.take_sample(&cx);
        }
        // Under simulation (`test --sim`) the guest goes on at a tick
        // instead of yielding: the ticks come from a thread on the real
        // clock, so where a guest yielded would depend on how fast this
        // machine ran it, and a seed's run would not repeat (SIM-3).
        match hyperactor::sim::Simulation::active() {
            true => Ok(UpdateDeadline::Continue(1)),
            false => Ok(UpdateDeadline::Yield(1)),
        }
    });
    store.set_epoch_deadline(1);
    store
}

/// The linker with WASI (nothing granted) and the monarch imports.
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    crate::bindings::Program::add_to_linker::<HostState, HasSelf<HostState>>(
        &mut linker,
        |state| state,
    )?;
    crate::session::add_to_linker(&mut linker)?;
    Ok(linker)
}

/// The simulation's numbers as WASI's random source (`test --sim`).
struct SeededRandom(hyperactor::sim::SeededNumbers);

impl rand_core::TryRng for SeededRandom {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok(self.0.next_u64() as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(self.0.next_u64())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        self.0.fill(dst);
        Ok(())
    }
}

/// The runtime's clock as WASI's monotonic clock: virtual under a paused
/// runtime (`monarch-host test --sim`), so a guest measures the simulated
/// time its calls took.
struct VirtualClock(tokio::time::Instant);

impl wasmtime_wasi::HostMonotonicClock for VirtualClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.0);
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
    }
}

impl types::Host for HostState {}

impl logging::Host for HostState {
    async fn log(&mut self, level: logging::Level, message: String) -> wasmtime::Result<()> {
        let line = format!("[{}] {message}", self.who);
        match level {
            logging::Level::Trace | logging::Level::Debug => {
                tracing::debug!(target: "guest", "{line}")
            }
            logging::Level::Info => (self.cluster.log)(&line),
            logging::Level::Warn => (self.cluster.log)(&format!("{line} (warning)")),
            logging::Level::Error => (self.cluster.log)(&format!("{line} (error)")),
        }
        Ok(())
    }
}

impl mesh::Host for HostState {
    async fn spawn_procs(
        &mut self,
        extent: Vec<Dim>,
    ) -> wasmtime::Result<Result<Resource<ProcMeshHandle>, String>> {
        if let Err(e) = validate_extent(&extent) {
            return Ok(Err(e));
        }
        match Cluster::client_for_spawn(&self.cluster).await {
            Ok((client, true)) => {
                // An actor's own client: it hears of what it spawns.
                self.watch(client.subscribe());
                if let Some(hook) = &self.on_client {
                    hook(&client);
                }
            }
            Ok((_, false)) => {}
            Err(e) => return Ok(Err(e)),
        }
        let procs = match self.cluster.spawn_procs(extent_size(&extent)).await {
            Ok(procs) => procs,
            Err(e) => return Ok(Err(e)),
        };
        let owned = self.cluster.job.attached.is_none();
        Ok(Ok(self.push(ProcMeshHandle {
            extent,
            procs,
            owned,
        })?))
    }

    async fn next_events(&mut self, max: u32, timeout_ms: u64) -> wasmtime::Result<Vec<Event>> {
        let max = max.clamp(1, 65_536) as usize;
        let now = Instant::now();
        if now >= self.cluster.deadline {
            wasmtime::bail!("the run's deadline passed (--timeout)");
        }
        if self.interrupt.is_raised() {
            wasmtime::bail!("the actor was stopped while it waited");
        }
        let until = (now + Duration::from_millis(timeout_ms)).min(self.cluster.deadline);
        // Poll before sleeping: a reply from a nearby actor comes within
        // microseconds, and waking a sleeping thread costs more (`Pace`).
        let awaiting = !self.caster.is_idle();
        let spare_core = awaiting && self.cluster.spare_core();
        if awaiting && let Some(client) = self.cluster.client.get() {
            // The client proc's connections follow the same rule (PR-12).
            client.proc().set_busy_poll(spare_core);
        }
        // Under simulation time moves only while every task waits, so a
        // spin would never end.
        let budget = if !awaiting || hyperactor::sim::Simulation::active() {
            Duration::ZERO
        } else if spare_core {
            self.pace.budget()
        } else {
            EVENT_SPIN
        };
        let spin_until = (now + budget).min(until);
        let polling = self.pace.polling(budget);
        loop {
            self.drain_mesh_events();
            while let Ok(event) = self.completed.try_recv() {
                self.ready.push_back(event);
            }
            while let Some(outcome) = self.caster.try_next() {
                self.take_outcome(outcome);
                if self.ready.len() >= max {
                    break;
                }
            }
            if !self.ready.is_empty() {
                break;
            }
            // A session's Ctrl-C: the guest looks at `console.interrupted`
            // after this wait (SE-2 of `session`).
            if self.console.as_ref().is_some_and(|c| c.is_raised()) {
                break;
            }
            let now = Instant::now();
            if now >= until {
                break;
            }
            if now < spin_until && !self.caster.is_idle() {
                tokio::task::yield_now().await;
                continue;
            }
            let busy = !self.caster.is_idle();
            let events = &mut self.events;
            let console = self.console.clone();
            tokio::select! {
                _ = async {
                    match &console {
                        Some(flag) => flag.raised().await,
                        None => std::future::pending().await,
                    }
                } => continue,
                outcome = self.caster.next(), if busy => {
                    if let Some(outcome) = outcome {
                        self.take_outcome(outcome);
                    }
                }
                Some(event) = async {
                    match events.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => self.take_mesh_event(event),
                Some(event) = self.completed.recv() => self.ready.push_back(event),
                _ = tokio::time::sleep_until(until) => break,
            }
        }
        // How long replies take: a wait that ended with an event, or one
        // that ran past the longest poll without any.
        let waited = now.elapsed();
        if awaiting && (!self.ready.is_empty() || waited >= EVENT_SPIN_MAX) {
            self.pace.came(waited);
        }
        self.pace.polled(polling);
        let count = self.ready.len().min(max);
        Ok(self.ready.drain(..count).collect())
    }

    async fn set_call_timeout(&mut self, timeout_ms: Option<u64>) -> wasmtime::Result<()> {
        self.call_timeout = match timeout_ms {
            Some(ms) => Duration::from_millis(ms.max(1)),
            None => self.cluster.sandbox.call_timeout,
        };
        Ok(())
    }

    async fn set_handler_timeout(&mut self, timeout_ms: Option<u64>) -> wasmtime::Result<()> {
        self.handler_timeout = timeout_ms.map(|ms| Duration::from_millis(ms.max(1)));
        Ok(())
    }

    async fn lookup_actor_mesh(
        &mut self,
        name: String,
    ) -> wasmtime::Result<Result<Resource<ActorMeshHandle>, String>> {
        let registry = match self.persistent_actors() {
            Ok(registry) => registry,
            Err(e) => return Ok(Err(format!("cannot look up `{name}`: {e}"))),
        };
        match registry.get(&name) {
            Some(mesh) if self.may_use_actor_mesh(&mesh) => Ok(Ok(self.push(mesh.handle())?)),
            Some(_) => Ok(Err(format!(
                "the persistent actor mesh `{name}` belongs to another principal"
            ))),
            None => {
                let known: Vec<String> = registry
                    .list()
                    .iter()
                    .filter(|m| self.may_use_actor_mesh(m))
                    .map(|m| m.name.clone())
                    .collect();
                Ok(Err(format!(
                    "no persistent actor mesh named `{name}` ({}); spawn one with `persist=True` (`spawn-persistent`) from a job on a persistent mesh",
                    if known.is_empty() {
                        "there are none".to_string()
                    } else {
                        format!("there are {}", known.join(", "))
                    }
                )))
            }
        }
    }
}

impl mesh::HostProcMesh for HostState {
    async fn extent(&mut self, this: Resource<ProcMeshHandle>) -> wasmtime::Result<Vec<Dim>> {
        Ok(self.table.get(&this)?.extent.clone())
    }

    async fn slice(
        &mut self,
        this: Resource<ProcMeshHandle>,
        dims: Vec<SliceDim>,
    ) -> wasmtime::Result<Result<Resource<ProcMeshHandle>, String>> {
        let mesh = self.table.get(&this)?;
        let owned = mesh.owned;
        let sliced = slice(&mesh.extent, &mesh.procs, &dims);
        match sliced {
            Ok((extent, procs)) => Ok(Ok(self.push(ProcMeshHandle {
                extent,
                procs,
                owned,
            })?)),
            Err(e) => Ok(Err(e)),
        }
    }

    async fn spawn(
        &mut self,
        this: Resource<ProcMeshHandle>,
        name: String,
        class: String,
        init: Vec<u8>,
    ) -> wasmtime::Result<Result<Resource<ActorMeshHandle>, String>> {
        self.spawn_mesh_with(this, name, class, init, Vec::new(), None, false)
            .await
    }

    async fn spawn_with(
        &mut self,
        this: Resource<ProcMeshHandle>,
        name: String,
        class: String,
        init: Vec<u8>,
        options: SpawnOptions,
    ) -> wasmtime::Result<Result<Resource<ActorMeshHandle>, String>> {
        if let Err(e) = check_spawn_options(&options) {
            return Ok(Err(e));
        }
        self.spawn_mesh_with(
            this,
            name,
            class,
            init,
            options.per_proc,
            options.handler_timeout_ms,
            false,
        )
        .await
    }

    async fn info(&mut self, this: Resource<ProcMeshHandle>) -> wasmtime::Result<Vec<ProcInfo>> {
        let procs = self.table.get(&this)?.procs.clone();
        let client = self.cluster.client().ok();
        let infos = procs
            .iter()
            .enumerate()
            .map(|(rank, proc)| {
                let known = client.and_then(|c| c.proc_info(proc));
                let state = match &known {
                    Some(info) if info.stopped => ProcState::Stopped,
                    Some(info) => match &info.ended {
                        Some(reason) => ProcState::Failed(reason.clone()),
                        None => ProcState::Running,
                    },
                    None => ProcState::Running,
                };
                ProcInfo {
                    rank: rank as u32,
                    id: proc.to_string(),
                    host: known
                        .as_ref()
                        .map_or_else(|| "local".into(), |i| i.host.clone()),
                    pid: known.and_then(|i| i.pid),
                    state,
                }
            })
            .collect();
        Ok(infos)
    }

    async fn kill(
        &mut self,
        this: Resource<ProcMeshHandle>,
        rank: u32,
        signal: i32,
    ) -> wasmtime::Result<Result<(), String>> {
        let mesh = self.table.get(&this)?;
        let Some(proc) = mesh.procs.get(rank as usize).cloned() else {
            return Ok(Err(format!(
                "rank {rank} is outside this proc mesh of {} procs",
                mesh.procs.len()
            )));
        };
        if !mesh.owned {
            return Ok(Err(format!(
                "proc {proc} belongs to a persistent mesh, not to this program; only procs the program started may be killed"
            )));
        }
        if !(1..=64).contains(&signal) {
            return Ok(Err(format!("{signal} is not a signal number (1-64)")));
        }
        let client = match self.cluster.client() {
            Ok(client) => client.clone(),
            Err(e) => return Ok(Err(e)),
        };
        if client.proc_info(&proc).is_none() {
            return Ok(Err(format!("proc {proc} was not started by this program")));
        }
        Ok(client.kill(&proc, signal).map_err(|e| e.to_string()))
    }

    async fn stop(&mut self, this: Resource<ProcMeshHandle>) -> wasmtime::Result<()> {
        // What the procs own stops first (the actor meshes on them), then
        // the procs themselves.
        let procs = self.table.get(&this)?.procs.clone();
        let on_them = |m: &Arc<MeshBase>| m.procs.iter().any(|p| procs.contains(p));
        let meshes: Vec<Arc<MeshBase>> = self
            .spawned
            .iter()
            .filter(|m| on_them(m))
            .cloned()
            .collect();
        for mesh in &meshes {
            mesh.state().stopped = Some(format!(
                "the actor mesh `{}` was stopped with its procs",
                mesh.name
            ));
        }
        self.spawned.retain(|m| !on_them(m));
        self.stopped_procs.extend(procs.iter().cloned());
        if let Ok(client) = self.cluster.client() {
            let stops = meshes.iter().map(|mesh| {
                self.cluster
                    .stop_actors(client, mesh, Duration::from_secs(5))
            });
            futures::future::join_all(stops).await;
            if self.cluster.job.attached.is_none() {
                client.stop_procs(&procs);
            }
        }
        Ok(())
    }

    async fn spawn_persistent(
        &mut self,
        this: Resource<ProcMeshHandle>,
        name: String,
        class: String,
        init: Vec<u8>,
        options: SpawnOptions,
        replace: bool,
    ) -> wasmtime::Result<Result<Resource<ActorMeshHandle>, String>> {
        let what = if replace { "respawn" } else { "spawn" };
        let fail = |e: String| {
            Ok(Err(format!(
                "cannot {what} the persistent actor mesh `{name}`: {e}"
            )))
        };
        if let Err(e) = check_spawn_options(&options) {
            return fail(e);
        }
        if let Err(e) = validate_persistent_name(&name) {
            return fail(e);
        }
        let registry = match self.persistent_actors() {
            Ok(registry) => registry,
            Err(e) => return fail(e),
        };
        let owned = self.table.get(&this)?.owned;
        let Some(attached) = self.cluster.job.attached.clone().filter(|_| !owned) else {
            return fail(
                "persist needs procs that outlive this job: run it on a server's persistent mesh (submit --mesh NAME)"
                    .into(),
            );
        };
        if registry
            .get(&name)
            .is_some_and(|mesh| !self.may_use_actor_mesh(&mesh))
        {
            return fail("that name is another principal's persistent actor mesh".into());
        }
        let old = match registry.claim(&name, replace) {
            Ok(old) => old,
            Err(e) => return fail(e),
        };
        if let Some(old) = old {
            let why = format!(
                "the persistent actor mesh `{name}` was replaced by `respawn`; its actors' state was lost"
            );
            crate::mesh::stop_persistent(&old, &why).await;
            (self.cluster.log)(&format!("[{}] {why}", self.who));
        }
        let spawned = self
            .spawn_mesh_with(
                this,
                name.clone(),
                class.clone(),
                init,
                options.per_proc,
                options.handler_timeout_ms,
                true,
            )
            .await;
        let made = match &spawned {
            Ok(Ok(handle)) => {
                let handle = self.table.get(handle)?;
                let client = self.cluster.client().map_err(wasmtime::Error::msg)?;
                Some(Arc::new(PersistentActorMesh {
                    name: name.clone(),
                    class,
                    proc_mesh: attached.mesh.clone(),
                    spawned_by: match attached.scope.strip_prefix('j') {
                        Some(job) => format!("job {}", job.trim_end_matches('.')),
                        None => attached.scope.trim_end_matches('.').to_string(),
                    },
                    base: handle.base.clone(),
                    extent: handle.extent.clone(),
                    client: client.clone(),
                }))
            }
            _ => None,
        };
        registry.release(&name, made);
        match spawned {
            Ok(Err(e)) => fail(e),
            other => other,
        }
    }

    async fn drop(&mut self, this: Resource<ProcMeshHandle>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

/// Checks the spawn options a guest gave.
fn check_spawn_options(options: &SpawnOptions) -> Result<(), String> {
    if !options.per_proc.is_empty()
        && let Err(e) = validate_extent(&options.per_proc)
    {
        return Err(format!("per-proc extent: {e}"));
    }
    if options.handler_timeout_ms == Some(0) {
        return Err("a handler timeout of 0 ms lets no handler run; leave it out for none".into());
    }
    Ok(())
}

/// How long the actors of a persistent actor mesh may run: they outlive
/// the job that spawned them, so its deadline is not theirs.
const PERSISTENT_LIFETIME: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

impl HostState {
    /// The server's persistent actor meshes, or why there are none here.
    fn may_use_actor_mesh(&self, mesh: &PersistentActorMesh) -> bool {
        self.cluster
            .job
            .observer
            .as_ref()
            .is_none_or(|o| o.may_use_actor_mesh(mesh))
    }

    fn persistent_actors(&self) -> Result<Arc<PersistentActorMeshes>, String> {
        self.cluster
            .job
            .observer
            .as_ref()
            .and_then(|o| o.persistent_actors())
            .ok_or_else(|| {
                "persistent actor meshes are kept by a server (`monarch-host serve`) for the controllers of its jobs and sessions; this is a plain run or an actor, which has none".to_string()
            })
    }

    /// Spawns an actor mesh on `this`'s procs. A persistent one (`persist`)
    /// is named `p.<name>` on them, lives past the job's deadline, and is
    /// not the instance's: it is not stopped with it, and its failures are
    /// the server's, not the instance's.
    #[allow(clippy::too_many_arguments)]
    async fn spawn_mesh_with(
        &mut self,
        this: Resource<ProcMeshHandle>,
        name: String,
        class: String,
        init: Vec<u8>,
        per_proc: Vec<Dim>,
        handler_timeout_ms: Option<u64>,
        persist: bool,
    ) -> wasmtime::Result<Result<Resource<ActorMeshHandle>, String>> {
        if let Err(e) = hyperactor::id::validate_name(&name) {
            return Ok(Err(e.to_string()));
        }
        if self.cluster.pre.is_none() && !class.contains('/') {
            return Ok(Err(format!(
                "cannot spawn `{name}`: this program is of the `controller` world and defines no actor classes; build it for the `program` world"
            )));
        }
        let name = match &self.cluster.job.attached {
            _ if persist => persistent_actor_name(&name),
            Some(attached) => format!("{}{name}", attached.scope),
            None => name,
        };
        let (mut extent, procs) = {
            let mesh = self.table.get(&this)?;
            (mesh.extent.clone(), mesh.procs.clone())
        };
        if per_proc
            .iter()
            .any(|d| extent.iter().any(|e| e.name == d.name))
        {
            return Ok(Err(
                "a per-proc dimension has the name of a proc dimension".into()
            ));
        }
        // Sizes are the guest's: a product past a rank's range (u32) is
        // refused, not wrapped (EX-1 of `mesh`).
        let per = checked_extent_size(&per_proc).unwrap_or(0).max(1);
        extent.extend(per_proc);
        if checked_extent_size(&extent).is_none() {
            return Ok(Err(format!(
                "cannot spawn `{name}`: {} actors is more than a mesh can hold",
                extent
                    .iter()
                    .map(|d| d.size.to_string())
                    .collect::<Vec<_>>()
                    .join(" x ")
            )));
        }
        // A stopped mesh's name may be used again.
        self.spawned.retain(|m| m.state().stopped.is_none());
        if !persist
            && self
                .spawned
                .iter()
                .any(|m| m.name == name && m.procs.iter().any(|p| procs.contains(p)))
        {
            return Ok(Err(format!(
                "an actor mesh named `{name}` already runs on these procs"
            )));
        }
        let client = match self.cluster.client() {
            Ok(client) => client.clone(),
            Err(e) => return Ok(Err(e)),
        };
        // `NAME/Class` is a class of the actor library NAME (another
        // program, perhaps in another language); anything else is this
        // program's own.
        let (program, class) = match class.split_once('/') {
            Some((library, library_class)) => match self.cluster.job.libraries.get(library) {
                Some(program) => (program, library_class.to_string()),
                None => {
                    let known: Vec<&str> = self
                        .cluster
                        .job
                        .libraries
                        .keys()
                        .map(String::as_str)
                        .collect();
                    return Ok(Err(format!(
                        "cannot spawn `{name}`: no actor library `{library}` (class `{class}`); give it with `monarch-host run --actors {library}=PATH`{}",
                        if known.is_empty() {
                            String::new()
                        } else {
                            format!("; the libraries are {}", known.join(", "))
                        }
                    )));
                }
            },
            None => (&self.cluster.program, class),
        };
        let shipped = match program.bytes() {
            Ok(bytes) => client
                .put_blob(&program.sha256, bytes)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        if let Err(e) = shipped {
            return Ok(Err(format!("cannot ship the program to its hosts: {e}")));
        }
        let params = WasmSpawnParams {
            sha256: program.sha256.clone(),
            class: class.clone(),
            init,
            memory_bytes: self.cluster.sandbox.memory_bytes,
            deadline_ms: match persist {
                true => PERSISTENT_LIFETIME.as_millis() as u64,
                false => self
                    .cluster
                    .deadline
                    .saturating_duration_since(Instant::now())
                    .as_millis() as u64,
            },
            call_timeout_ms: self.cluster.sandbox.call_timeout.as_millis() as u64,
            fanout: self.cluster.sandbox.fanout,
            handler_timeout_ms: handler_timeout_ms.or_else(|| {
                self.cluster
                    .sandbox
                    .handler_timeout
                    .map(|t| t.as_millis().max(1) as u64)
            }),
            grants: self.cluster.sandbox.grants.clone(),
            max_procs: self.cluster.sandbox.max_procs,
            max_instances: self.cluster.sandbox.max_instances,
            dumps: self.cluster.sandbox.dumps.clone(),
            // A job's debug hub ends with it.
            debug: match persist {
                true => None,
                false => self.cluster.sandbox.debug.clone(),
            },
            debug_engine: self.cluster.sandbox.debug_engine,
        };
        let dims: Vec<(String, u32)> = extent.iter().map(|d| (d.name.clone(), d.size)).collect();
        let timeout = self
            .cluster
            .deadline
            .saturating_duration_since(Instant::now());
        let spawned = client
            .spawn_actors(
                &procs,
                &ActorSpec {
                    kind: crate::mesh::WASM_KIND.into(),
                    name: name.clone(),
                    extent: dims,
                    params: params.encode(),
                    per_proc: per,
                },
                timeout,
            )
            .await;
        if let Err(e) = spawned {
            return Ok(Err(e.replace(
                "did not start",
                &format!("of class `{class}` did not start"),
            )));
        }
        if persist {
            let base = MeshBase {
                persistent: true,
                ..MeshBase::new(name, procs, per)
            };
            let ranks = (0..extent_size(&extent) as u32).collect();
            let handle = ActorMeshHandle::new(Arc::new(base), extent, ranks);
            return Ok(Ok(self.push(handle)?));
        }
        if let Some(observer) = &self.cluster.job.observer {
            observer.actors_spawned(&name, &class, &procs, per);
        }
        let base = Arc::new(MeshBase::new(name, procs, per));
        self.spawned.push(base.clone());
        let ranks = (0..extent_size(&extent) as u32).collect();
        Ok(Ok(self.push(ActorMeshHandle::new(base, extent, ranks))?))
    }
}

impl mesh::HostActorMesh for HostState {
    async fn name(&mut self, this: Resource<ActorMeshHandle>) -> wasmtime::Result<String> {
        Ok(self.table.get(&this)?.name().to_string())
    }

    async fn extent(&mut self, this: Resource<ActorMeshHandle>) -> wasmtime::Result<Vec<Dim>> {
        Ok(self.table.get(&this)?.extent.clone())
    }

    async fn slice(
        &mut self,
        this: Resource<ActorMeshHandle>,
        dims: Vec<SliceDim>,
    ) -> wasmtime::Result<Result<Resource<ActorMeshHandle>, String>> {
        let mesh = self.table.get(&this)?;
        match slice(&mesh.extent, &mesh.ranks, &dims) {
            Ok((extent, ranks)) => {
                let sliced = ActorMeshHandle::new(mesh.base.clone(), extent, ranks);
                Ok(Ok(self.push(sliced)?))
            }
            Err(e) => Ok(Err(e)),
        }
    }

    async fn call(
        &mut self,
        this: Resource<ActorMeshHandle>,
        endpoint: String,
        message: Vec<u8>,
        reduce: Option<Reducer>,
    ) -> wasmtime::Result<u64> {
        let mode = match reduce {
            Some(reducer) => Mode::Reduce(reducer),
            None => Mode::Gather,
        };
        // LK-8: a guest that casts faster than the mesh takes it waits.
        self.caster.ready().await;
        self.request(this, endpoint, message, mode, |mesh| {
            if mesh.ranks.is_empty() && matches!(mode, Mode::Reduce(_)) {
                return Err("nothing to reduce: the mesh is empty".into());
            }
            Ok(None)
        })
    }

    async fn call_one(
        &mut self,
        this: Resource<ActorMeshHandle>,
        endpoint: String,
        message: Vec<u8>,
    ) -> wasmtime::Result<u64> {
        // LK-8: a guest that casts faster than the mesh takes it waits.
        self.caster.ready().await;
        self.request(this, endpoint, message, Mode::Single, |mesh| {
            if mesh.ranks.len() == 1 {
                Ok(Some(vec![0]))
            } else {
                Err(format!(
                    "call-one needs a mesh of exactly one actor; this one has {}",
                    mesh.ranks.len()
                ))
            }
        })
    }

    async fn choose(
        &mut self,
        this: Resource<ActorMeshHandle>,
        endpoint: String,
        message: Vec<u8>,
    ) -> wasmtime::Result<u64> {
        // LK-8: a guest that casts faster than the mesh takes it waits.
        self.caster.ready().await;
        self.request(this, endpoint, message, Mode::Single, |mesh| {
            // A live actor with the fewest calls in flight; a rank known to
            // have failed only when every one has (the call then fails at
            // once with its failure).
            let state = mesh.base.state();
            let index = (0..mesh.ranks.len())
                .min_by_key(|&i| {
                    let failed = state.failed.contains_key(&mesh.ranks[i]);
                    (failed, mesh.in_flight[i].load(Ordering::Relaxed))
                })
                .ok_or_else(|| "choose needs a mesh with at least one actor".to_string())?;
            Ok(Some(vec![index]))
        })
    }

    async fn stream(
        &mut self,
        this: Resource<ActorMeshHandle>,
        endpoint: String,
        message: Vec<u8>,
    ) -> wasmtime::Result<u64> {
        // LK-8: a guest that casts faster than the mesh takes it waits.
        self.caster.ready().await;
        self.request(this, endpoint, message, Mode::Stream, |mesh| {
            if mesh.ranks.is_empty() {
                return Err("stream needs a mesh with at least one actor".into());
            }
            Ok(None)
        })
    }

    async fn broadcast(
        &mut self,
        this: Resource<ActorMeshHandle>,
        endpoint: String,
        message: Vec<u8>,
    ) -> wasmtime::Result<Result<(), CallError>> {
        if let Some(error) = too_large(&endpoint, &message) {
            return Ok(Err(error));
        }
        let mesh = self.table.get(&this)?.clone();
        if let Some(error) = self.refused(&mesh, None, &endpoint) {
            return Ok(Err(error));
        }
        // LK-8: a guest that broadcasts faster than the mesh takes it waits.
        self.caster.ready().await;
        self.start(&mesh, None, endpoint, message, Mode::Broadcast);
        Ok(Ok(()))
    }

    async fn stop(&mut self, this: Resource<ActorMeshHandle>) -> wasmtime::Result<()> {
        let base = self.table.get(&this)?.base.clone();
        if base.persistent {
            // It belongs to the server: only its DELETE stops it.
            let name = base.name.strip_prefix("p.").unwrap_or(&base.name);
            (self.cluster.log)(&format!(
                "[{}] `stop` leaves the persistent actor mesh `{name}` running: it belongs to the server; DELETE /v1/meshes/{name} stops it (warning)",
                self.who
            ));
            return Ok(());
        }
        base.state().stopped = Some(format!("the actor mesh `{}` was stopped", base.name));
        if let Ok(client) = self.cluster.client() {
            self.cluster
                .stop_actors(client, &base, Duration::from_secs(5))
                .await;
        }
        Ok(())
    }

    async fn to_ref(&mut self, this: Resource<ActorMeshHandle>) -> wasmtime::Result<Vec<u8>> {
        Ok(self.table.get(&this)?.to_ref())
    }

    async fn from_ref(
        &mut self,
        reference: Vec<u8>,
    ) -> wasmtime::Result<Result<Resource<ActorMeshHandle>, String>> {
        match ActorMeshHandle::from_ref(&reference) {
            Ok(mut mesh) => {
                // A reference to a mesh this instance spawned shares what
                // the instance knows of it (MS-1).
                if let Some(base) = self
                    .spawned
                    .iter()
                    .find(|b| b.name == mesh.base.name && b.procs == mesh.base.procs)
                {
                    mesh.base = base.clone();
                } else if let Some(persistent) = mesh
                    .base
                    .name
                    .strip_prefix("p.")
                    .and_then(|name| self.persistent_actors().ok()?.get(name))
                    .filter(|p| p.base.procs == mesh.base.procs)
                {
                    // So is one to a persistent actor mesh of the server.
                    mesh.base = persistent.base.clone();
                } else if mesh
                    .base
                    .procs
                    .iter()
                    .any(|p| self.stopped_procs.contains(p))
                {
                    // One to a mesh whose procs this instance stopped.
                    mesh.base.state().stopped = Some(format!(
                        "the actor mesh `{}` was stopped with its procs",
                        mesh.base.name
                    ));
                }
                Ok(Ok(self.push(mesh)?))
            }
            Err(e) => Ok(Err(e)),
        }
    }

    async fn drop(&mut self, this: Resource<ActorMeshHandle>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl HostState {
    fn request(
        &mut self,
        this: Resource<ActorMeshHandle>,
        endpoint: String,
        message: Vec<u8>,
        mode: Mode,
        select: impl FnOnce(&ActorMeshHandle) -> Result<Option<Vec<usize>>, String>,
    ) -> wasmtime::Result<u64> {
        if self.pending.len() + self.ready.len() >= MAX_IN_FLIGHT {
            wasmtime::bail!("{}", too_many_requests());
        }
        if let Some(error) = too_large(&endpoint, &message) {
            return Ok(self.refuse(error));
        }
        let mesh = self.table.get(&this)?.clone();
        let positions = match select(&mesh) {
            Ok(positions) => positions,
            Err(reason) => return Ok(self.refuse(errors::invalid(reason))),
        };
        if matches!(mode, Mode::Stream) && mesh.base.state().stopped.is_none() {
            return Ok(self.stream_around_failures(&mesh, endpoint, message));
        }
        match self.refused(&mesh, positions.as_deref(), &endpoint) {
            Some(error) => Ok(self.refuse(error)),
            None => Ok(self.start(&mesh, positions, endpoint, message, mode)),
        }
    }

    /// A stream to a mesh with failed ranks: each failed rank's item is
    /// its failure, at once, and the live ranks get the request (MS-1).
    fn stream_around_failures(
        &mut self,
        mesh: &ActorMeshHandle,
        endpoint: String,
        message: Vec<u8>,
    ) -> u64 {
        let failed: Vec<(usize, CallError)> = {
            let state = mesh.base.state();
            mesh.ranks
                .iter()
                .enumerate()
                .filter_map(|(at, rank)| {
                    let failure = state.failed.get(rank)?;
                    Some((at, errors::from_failure(failure, &endpoint)))
                })
                .collect()
        };
        if failed.is_empty() {
            return self.start(mesh, None, endpoint, message, Mode::Stream);
        }
        let live: Vec<usize> = (0..mesh.ranks.len())
            .filter(|at| !failed.iter().any(|(f, _)| f == at))
            .collect();
        let id = if live.is_empty() {
            self.request_id()
        } else {
            self.start(mesh, Some(live.clone()), endpoint, message, Mode::Stream)
        };
        // Queued now, so they come before any live rank's reply.
        for (at, error) in failed {
            let rank = mesh.ranks[at];
            self.finish_now(id, EventKind::Item((rank, Err(error))));
        }
        if live.is_empty() {
            self.finish_now(id, EventKind::End);
        }
        id
    }

    /// Ends a new request at once with `error`; returns its id.
    fn refuse(&mut self, error: CallError) -> u64 {
        let id = self.request_id();
        self.finish_now(id, EventKind::Done(Err(error)));
        id
    }

    /// The error a request to the ranks at `positions` of `mesh` (all of
    /// them when None) gets at once, without being sent, because the mesh
    /// was stopped or one of those ranks failed (MS-1).
    fn refused(
        &self,
        mesh: &ActorMeshHandle,
        positions: Option<&[usize]>,
        endpoint: &str,
    ) -> Option<CallError> {
        let state = mesh.base.state();
        if let Some(why) = &state.stopped {
            let rank = mesh.ranks.first().copied().unwrap_or(0);
            return Some(errors::at_rank(
                ErrorKind::Stopped,
                mesh.name(),
                rank,
                Some(endpoint),
                why.clone(),
            ));
        }
        if state.failed.is_empty() {
            return None;
        }
        let ranks: Vec<u32> = match positions {
            None => mesh.ranks.clone(),
            Some(positions) => positions
                .iter()
                .filter_map(|&p| mesh.ranks.get(p).copied())
                .collect(),
        };
        ranks
            .iter()
            .filter_map(|r| state.failed.get(r))
            .min_by_key(|f| f.rank)
            .map(|failure| errors::from_failure(failure, endpoint))
    }
}

#[cfg(test)]
mod tests {
    use wasmtime::ResourceLimiter;

    use super::*;

    /// HG-4: a message that would not fit a frame is refused, naming its
    /// size and the limit; one that fits is not.
    #[test]
    fn hg_4_a_message_past_a_frame_is_refused_with_its_size() {
        let payload = vec![0; MAX_MESSAGE];
        assert!(too_large("", &payload).is_none());
        let error = too_large("sink", &payload).expect("refused");
        assert!(matches!(error.kind, ErrorKind::Invalid));
        assert!(
            error.message.contains(&format!(
                "of {} bytes exceeds the limit of {MAX_MESSAGE} bytes",
                MAX_MESSAGE + 4
            )),
            "{}",
            error.message
        );
    }

    /// HG-1: a refused table growth is remembered, so that the trap after
    /// it is reported as out of memory, naming the table.
    #[test]
    fn hg_1_a_refused_table_growth_is_remembered() {
        let mut limits = Limits::new(64 << 20);
        assert!(limits.table_growing(1, 1_000, Some(20_000)).unwrap());
        assert_eq!(limits.out_of_memory(), None);
        assert!(!limits.table_growing(1, 20_001, Some(20_000)).unwrap());
        let why = limits.out_of_memory().expect("remembered");
        assert!(
            why.contains("growing a table to 20001 elements was refused")
                && why.contains("the most it may hold is 20000"),
            "{why}"
        );
        limits.clear();
        assert_eq!(limits.out_of_memory(), None);
    }
}

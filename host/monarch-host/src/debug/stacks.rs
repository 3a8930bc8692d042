//! `monarch-host stacks`: each actor's current stack, sampled at its next
//! epoch tick without stopping it.
//!
//! A guest that computes reaches an epoch check at least every
//! [`EPOCH_TICK`] (function entries and loop headers), and the host's
//! epoch callback runs there, on the guest's own thread, with the guest's
//! Wasm frames on the stack. So a stack can be had without a signal, a
//! debugger or a pause: every instance carries a [`Probe`]; a request
//! raises the probe's flag, and the instance's next epoch callback
//! captures its Wasm backtrace into the probe and lets the guest go on
//! (the callback yields, as on every tick). An instance that waits in a
//! host call (`next-events`, a sleep, a breakpoint) runs no guest code and
//! has no tick: it is reported as waiting in the host, with no frames,
//! after [`SAMPLE_WAIT`]. An instance that handles no message is idle, at
//! once.
//!
//! Probes are kept per process, each naming the proc it lives on. Every
//! proc's agent answers a probe of its actors (the mesh layer's
//! [`ProbeActors`](hyperactor_mesh::agent::ProbeActors), with [`answer`] as
//! the hook), so [`collect`] reaches the actors of a run wherever they run:
//! in the run's process, in child procs, on other hosts, and on the procs
//! an actor spawned itself.
//!
//! - ST-1: while nobody asks, a tick costs one relaxed atomic load.
//! - ST-2: sampling does not stop the guest: the callback yields as it
//!   does on every tick, and the guest goes on from where it was.
//! - ST-3: a running guest is sampled at its next tick; an actor waiting
//!   in the host is reported within [`SAMPLE_WAIT`]; a proc that does not
//!   answer within [`PROC_TIMEOUT`] is named, and never holds the answer.
//!
//! A Python actor's stack is the Wasm stack of its interpreter (the
//! CPython functions evaluating it), not its Python frames: reading those
//! needs the interpreter's cooperation, which a guest cannot give at an
//! arbitrary epoch tick.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use hyperactor::ProcId;
use hyperactor_mesh::agent::BoxFuture;
use hyperactor_mesh::client::MeshClient;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::engine::EPOCH_TICK;
use crate::host::Cluster;

/// How long an instance in an endpoint has to reach its next epoch tick
/// before it is reported as waiting in the host (ST-3).
pub const SAMPLE_WAIT: Duration = EPOCH_TICK.saturating_mul(3);

/// How long the frames of a sampled stack may take to be named (wasmtime
/// reads the program's DWARF for each), once the instance has ticked.
const NAMING_WAIT: Duration = Duration::from_millis(500);

/// How long a proc has to answer a probe (ST-3).
pub const PROC_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the procs an actor spawned have to answer: less than their
/// owner's proc has, so that its answer still comes in time.
const NESTED_TIMEOUT: Duration = Duration::from_millis(600);

/// What the agents are asked.
const QUERY: &str = "stacks";

/// What one instance shows of its stack when asked; see the module docs.
pub struct Probe {
    /// The actor mesh, or `controller`.
    mesh: String,
    /// The actor's rank; None for the controller.
    rank: Option<u32>,
    /// The proc the instance lives on.
    proc: ProcId,
    /// The instance's cluster: for a controller, which run it is; for an
    /// actor, the procs it spawned, if any.
    cluster: Weak<Cluster>,
    /// The endpoint being handled and since when; None: idle.
    busy: Mutex<Option<Busy>>,
    /// Raised by a request, taken by the next epoch callback (ST-1).
    wanted: AtomicBool,
    /// The latest sample.
    sample: Mutex<Option<Sample>>,
    /// Woken with each sample.
    sampled: tokio::sync::Notify,
}

#[derive(Clone)]
struct Busy {
    endpoint: Arc<str>,
    since: Instant,
}

struct Sample {
    /// The tick the stack is of.
    at: Instant,
    /// Its frames, once named; None while the callback names them.
    frames: Option<Vec<Frame>>,
    /// How long the guest was held to capture and name them.
    held: Duration,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe")
            .field("mesh", &self.mesh)
            .field("rank", &self.rank)
            .field("proc", &self.proc)
            .finish_non_exhaustive()
    }
}

/// The live probes of this process.
static PROBES: Mutex<Vec<Weak<Probe>>> = Mutex::new(Vec::new());

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The live probes of this process that `keep` selects.
fn probes(keep: impl Fn(&Probe) -> bool) -> Vec<Arc<Probe>> {
    lock(&PROBES)
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|probe| keep(probe))
        .collect()
}

impl Probe {
    fn register(probe: Probe) -> Arc<Probe> {
        let probe = Arc::new(probe);
        let mut probes = lock(&PROBES);
        probes.retain(|p| p.strong_count() > 0);
        probes.push(Arc::downgrade(&probe));
        probe
    }

    fn new(mesh: &str, rank: Option<u32>, proc: &ProcId, cluster: &Arc<Cluster>) -> Probe {
        Probe {
            mesh: mesh.to_string(),
            rank,
            proc: proc.clone(),
            cluster: Arc::downgrade(cluster),
            busy: Mutex::new(None),
            wanted: AtomicBool::new(false),
            sample: Mutex::new(None),
            sampled: tokio::sync::Notify::new(),
        }
    }

    /// The probe of actor `mesh[rank]` on `proc`, registered in this
    /// process until the instance (its store) is dropped.
    pub(crate) fn actor(
        mesh: &str,
        rank: u32,
        proc: &ProcId,
        cluster: &Arc<Cluster>,
    ) -> Arc<Probe> {
        Self::register(Self::new(mesh, Some(rank), proc, cluster))
    }

    /// The probe of a run's controller, whose mesh client's proc is
    /// `proc`: it is in `run` from now on.
    pub(crate) fn controller(proc: &ProcId, cluster: &Arc<Cluster>) -> Arc<Probe> {
        let probe = Self::new("controller", None, proc, cluster);
        *lock(&probe.busy) = Some(Busy {
            endpoint: "run".into(),
            since: Instant::now(),
        });
        Self::register(probe)
    }

    /// Marks the instance as handling `endpoint` until the guard drops.
    pub(crate) fn enter(self: &Arc<Self>, endpoint: &str, since: Instant) -> InEndpoint {
        *lock(&self.busy) = Some(Busy {
            endpoint: endpoint.into(),
            since,
        });
        InEndpoint(self.clone())
    }

    /// Whether a stack was asked for: the epoch callback's only cost while
    /// nobody asks (ST-1).
    #[inline]
    pub(crate) fn wanted(&self) -> bool {
        self.wanted.load(Ordering::Relaxed)
    }

    /// Captures the guest's Wasm stack, from the epoch callback; the guest
    /// goes on after (ST-2).
    pub(crate) fn take_sample(&self, store: impl wasmtime::AsContext) {
        if !self.wanted.swap(false, Ordering::Relaxed) {
            return;
        }
        // The stack is the one at this tick. Naming its frames (wasmtime
        // reads the program's DWARF for each) takes longer: whoever waits
        // hears of the tick first, and then of the frames.
        let at = Instant::now();
        *lock(&self.sample) = Some(Sample {
            at,
            frames: None,
            held: Duration::ZERO,
        });
        self.sampled.notify_waiters();
        let trace = wasmtime::WasmBacktrace::force_capture(store);
        let frames = frames_of(&trace);
        *lock(&self.sample) = Some(Sample {
            at,
            frames: Some(frames),
            held: at.elapsed(),
        });
        self.sampled.notify_waiters();
    }

    /// A sample taken at or after `since`: when, its frames once named,
    /// and how long naming them held the guest.
    fn sample_since(&self, since: Instant) -> Option<(Instant, Option<Vec<Frame>>, Duration)> {
        lock(&self.sample)
            .as_ref()
            .filter(|sample| sample.at >= since)
            .map(|sample| (sample.at, sample.frames.clone(), sample.held))
    }

    /// What the instance is doing now: idle at once; in an endpoint, with
    /// its stack taken at its next tick, or waiting in the host when no
    /// tick comes within [`SAMPLE_WAIT`] (ST-3).
    async fn report(&self) -> ActorStack {
        let requested = Instant::now();
        let busy = lock(&self.busy).clone();
        let mut stack = ActorStack {
            mesh: self.mesh.clone(),
            rank: self.rank,
            state: ActorState::Idle,
            endpoint: None,
            for_s: None,
            sampled_after_ms: None,
            held_ms: None,
            frames: Vec::new(),
            proc: self.proc.to_string(),
            proc_index: None,
            host: None,
            pid: Some(std::process::id()),
            owner: None,
        };
        let Some(busy) = busy else {
            return stack;
        };
        self.wanted.store(true, Ordering::Relaxed);
        let mut until = requested + SAMPLE_WAIT;
        let sample = loop {
            let notified = self.sampled.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            match self.sample_since(requested) {
                Some(sample @ (_, Some(_), _)) => break Some(sample),
                // It ticked: its frames are being named.
                Some(_) => until = requested + NAMING_WAIT,
                None => {}
            }
            let until = tokio::time::Instant::from_std(until);
            if tokio::time::timeout_at(until, notified).await.is_err() {
                break self.sample_since(requested);
            }
        };
        let now = lock(&self.busy).clone();
        let still = now.as_ref().is_some_and(|b| b.since == busy.since);
        match sample {
            Some((at, frames, held)) => {
                stack.state = ActorState::Running;
                stack.sampled_after_ms = Some(millis(at.duration_since(requested)));
                stack.held_ms = frames.is_some().then(|| millis(held));
                stack.frames = frames.unwrap_or_default();
            }
            None if still => stack.state = ActorState::Waiting,
            // It finished the endpoint meanwhile.
            None => return stack,
        }
        stack.endpoint = Some(busy.endpoint.to_string());
        stack.for_s = Some(busy.since.elapsed().as_secs_f64());
        stack
    }
}

/// Marks an instance as in an endpoint while it lives; see [`Probe::enter`].
pub(crate) struct InEndpoint(Arc<Probe>);

impl Drop for InEndpoint {
    fn drop(&mut self) {
        *lock(&self.0.busy) = None;
    }
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// One frame of a stack, innermost first; functions inlined into a Wasm
/// function are frames of their own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Frame {
    /// The function, demangled.
    pub function: String,
    /// The core module's name, when it has one.
    pub module: Option<String>,
    /// The source file, where the program carries DWARF line tables.
    pub file: Option<String>,
    /// The line in it.
    pub line: Option<u32>,
    /// The column.
    pub column: Option<u32>,
}

/// The frames of a Wasm backtrace, inlined functions expanded.
fn frames_of(trace: &wasmtime::WasmBacktrace) -> Vec<Frame> {
    let mut frames = Vec::new();
    for frame in trace.frames() {
        let module = frame.module().name().map(str::to_string);
        let raw = || match frame.func_name() {
            Some(name) => demangle(name),
            None => format!("<wasm function {}>", frame.func_index()),
        };
        if frame.symbols().is_empty() {
            frames.push(Frame {
                function: raw(),
                module,
                file: None,
                line: None,
                column: None,
            });
            continue;
        }
        for (i, symbol) in frame.symbols().iter().enumerate() {
            let function = match symbol.name() {
                Some(name) => demangle(name),
                None if i == 0 => raw(),
                None => "<inlined function>".to_string(),
            };
            frames.push(Frame {
                function,
                module: module.clone(),
                file: symbol.file().map(str::to_string),
                line: symbol.line(),
                column: symbol.column(),
            });
        }
    }
    frames
}

/// A Rust symbol without its mangling, hash and LTO suffix (`.llvm.NNN`,
/// or ` (.llvm.NNN)` where the linker demangled the name section); other
/// names as they are.
fn demangle(name: &str) -> String {
    let name = name
        .split_once(" (.llvm.")
        .or_else(|| name.split_once(".llvm."))
        .map_or(name, |(name, _)| name);
    format!("{:#}", rustc_demangle::demangle(name))
}

/// What an actor was doing when asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ActorState {
    /// Handling no message.
    Idle,
    /// In an endpoint, running guest code: `frames` is where.
    Running,
    /// In an endpoint, waiting in a host call (for events, a sleep, a
    /// breakpoint): no guest frames to sample.
    Waiting,
}

/// One actor's stack.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ActorStack {
    /// The actor mesh (`controller` for the run's controller).
    pub mesh: String,
    /// The rank; none for the controller.
    pub rank: Option<u32>,
    /// Idle, running or waiting in the host.
    pub state: ActorState,
    /// The endpoint it is in (`run` for the controller).
    pub endpoint: Option<String>,
    /// For how long, in seconds.
    pub for_s: Option<f64>,
    /// How long after the request the stack was sampled (its next epoch
    /// tick), in milliseconds.
    pub sampled_after_ms: Option<f64>,
    /// How long the guest was held at that tick to capture the stack and
    /// name its frames, in milliseconds.
    pub held_ms: Option<f64>,
    /// Innermost first; empty unless running.
    pub frames: Vec<Frame>,
    /// Its proc's id.
    pub proc: String,
    /// Its proc's place among the procs its owner started.
    pub proc_index: Option<usize>,
    /// The host its proc runs on.
    pub host: Option<String>,
    /// Its OS process.
    pub pid: Option<u32>,
    /// The actor that spawned its proc (`mesh[rank]`), when an actor did.
    pub owner: Option<String>,
}

impl ActorStack {
    /// `mesh[rank]`, or the mesh alone for the controller.
    pub fn name(&self) -> String {
        match self.rank {
            Some(rank) => format!("{}[{rank}]", self.mesh),
            None => self.mesh.clone(),
        }
    }

    /// Whether it has been in one endpoint longer than `limit` (the
    /// controller's `run` does not count).
    pub fn stuck(&self, limit: Duration) -> bool {
        self.rank.is_some()
            && self.state != ActorState::Idle
            && self.for_s.is_some_and(|s| s > limit.as_secs_f64())
    }
}

/// A proc asked for its actors' stacks.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProcReport {
    /// Its id.
    pub proc: String,
    /// Its place among the procs its owner started.
    pub index: usize,
    /// The host it runs on.
    pub host: String,
    /// Its OS process, when it has one of its own.
    pub pid: Option<u32>,
    /// How many actors it reported.
    pub actors: usize,
    /// Why it gave no answer, if it did not.
    pub error: Option<String>,
    /// The actor that spawned it (`mesh[rank]`), when an actor did.
    pub owner: Option<String>,
}

/// The stacks of a run: its controller, and every actor on its procs.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Report {
    /// The controller.
    pub controller: Option<ActorStack>,
    /// Every actor that answered, by mesh and rank.
    pub actors: Vec<ActorStack>,
    /// Every live proc asked.
    pub procs: Vec<ProcReport>,
    /// The epoch tick, in milliseconds: a running actor is sampled within one.
    pub epoch_tick_ms: u64,
}

/// A proc's answer to [`QUERY`].
#[derive(Serialize, Deserialize)]
struct ProcAnswer {
    actors: Vec<ActorStack>,
    /// The procs its actors spawned.
    procs: Vec<ProcReport>,
}

/// The probe hook of this process's procs: the stacks of the actors on
/// `proc`, and of those on the procs they spawned, as JSON.
pub(crate) fn answer(proc: &ProcId, query: &str) -> BoxFuture<Vec<u8>> {
    if query != QUERY {
        let error = json!({ "error": format!("unknown probe `{query}`") });
        return Box::pin(async move { error.to_string().into_bytes() });
    }
    let here = probes(|probe| probe.rank.is_some() && &probe.proc == proc);
    Box::pin(async move {
        let mut answer = ProcAnswer {
            actors: Vec::new(),
            procs: Vec::new(),
        };
        let (actors, nested) = futures::future::join(
            futures::future::join_all(here.iter().map(|probe| probe.report())),
            futures::future::join_all(here.iter().filter_map(|probe| {
                let client = probe.cluster.upgrade()?.client().ok()?.clone();
                let owner = match probe.rank {
                    Some(rank) => format!("{}[{rank}]", probe.mesh),
                    None => probe.mesh.clone(),
                };
                Some(gather(client, Some(owner), NESTED_TIMEOUT))
            })),
        )
        .await;
        answer.actors = actors;
        for (actors, procs) in nested {
            answer.actors.extend(actors);
            answer.procs.extend(procs);
        }
        serde_json::to_vec(&answer).unwrap_or_default()
    })
}

/// The actors on every live proc `client` started, and each proc's
/// report; `owner` is the actor that owns the client, if one does.
fn gather(
    client: Arc<MeshClient>,
    owner: Option<String>,
    timeout: Duration,
) -> BoxFuture<(Vec<ActorStack>, Vec<ProcReport>)> {
    Box::pin(async move {
        let mut actors = Vec::new();
        let mut procs = Vec::new();
        for answer in client.probe_procs(QUERY, timeout).await {
            let mut report = ProcReport {
                proc: answer.proc.to_string(),
                index: answer.index,
                host: answer.host.clone(),
                pid: answer.pid,
                actors: 0,
                error: None,
                owner: owner.clone(),
            };
            let parsed = answer.answer.and_then(|bytes| {
                serde_json::from_slice::<ProcAnswer>(&bytes).map_err(|e| {
                    match serde_json::from_slice::<Value>(&bytes)
                        .ok()
                        .and_then(|v| v["error"].as_str().map(str::to_string))
                    {
                        Some(error) => error,
                        None => format!("answered what this host cannot read: {e}"),
                    }
                })
            });
            match parsed {
                Ok(answer_of_proc) => {
                    let ProcAnswer {
                        actors: found,
                        procs: nested,
                    } = answer_of_proc;
                    report.actors = found.len();
                    for mut actor in found {
                        // The proc's own actors; those of the procs they
                        // spawned say where they are already.
                        if actor.proc_index.is_none() {
                            actor.proc_index = Some(answer.index);
                            actor.host = Some(answer.host.clone());
                            actor.pid = answer.pid.or(actor.pid);
                            actor.owner = owner.clone();
                        }
                        actors.push(actor);
                    }
                    procs.push(report);
                    procs.extend(nested);
                }
                Err(error) => {
                    report.error = Some(error);
                    procs.push(report);
                }
            }
        }
        (actors, procs)
    })
}

/// The stacks of a live run: its controller and every actor on its procs,
/// wherever they run (ST-3). An error is `{"error": ...}`.
pub async fn collect(cluster: &Arc<Cluster>) -> Value {
    let client = match cluster.client() {
        Ok(client) => client.clone(),
        Err(e) => return json!({ "error": e }),
    };
    let controller = probes(|probe| {
        probe.rank.is_none() && std::ptr::eq(probe.cluster.as_ptr(), Arc::as_ptr(cluster))
    });
    let (controller, (mut actors, procs)) = futures::future::join(
        async {
            match controller.first() {
                Some(probe) => Some(probe.report().await),
                None => None,
            }
        },
        gather(client, None, PROC_TIMEOUT),
    )
    .await;
    // A job on a persistent mesh sees its own actors only, by their names
    // without its scope.
    if let Some(attached) = &cluster.job.attached {
        actors.retain(|actor| actor.owner.is_some() || actor.mesh.starts_with(&attached.scope));
        for actor in actors.iter_mut().filter(|a| a.owner.is_none()) {
            actor.mesh = actor.mesh[attached.scope.len()..].to_string();
        }
    }
    actors.sort_by(|a, b| {
        (a.owner.is_some(), &a.mesh, a.rank).cmp(&(b.owner.is_some(), &b.mesh, b.rank))
    });
    let report = Report {
        controller,
        actors,
        procs,
        epoch_tick_ms: EPOCH_TICK.as_millis() as u64,
    };
    serde_json::to_value(&report).unwrap_or_else(|e| json!({ "error": e.to_string() }))
}

/// `monarch-host stacks`.
#[derive(Debug, clap::Args)]
pub struct StacksArgs {
    /// The run (its id, as its record names it; default: the newest live
    /// run on this machine), or with --server the job id.
    #[arg(value_name = "RUN|JOB")]
    target: Option<String>,
    /// Prints the stacks as JSON.
    #[arg(long)]
    json: bool,
    /// Exits with status 1 when an actor has been in one handler longer
    /// than this many seconds.
    #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = parse_seconds)]
    stuck_after: Duration,
    /// Asks this server (http://HOST:PORT) for the stacks of job JOB,
    /// instead of a run on this machine.
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// A file holding the server's bearer token.
    #[arg(long, env = "MONARCH_TOKEN_FILE")]
    token_file: Option<PathBuf>,
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("`{text}` is not a number of seconds"))
}

/// Runs `monarch-host stacks`: 0 when no actor is stuck, 1 when one has
/// been in a handler longer than `--stuck-after`, 2 on errors.
pub fn command(args: StacksArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return failed(format!("cannot start the runtime: {e}")),
    };
    let stacks = runtime.block_on(fetch(&args)).and_then(|value| {
        serde_json::from_value::<Report>(value)
            .map_err(|e| format!("the run answered what this command cannot read: {e}"))
    });
    let report = match stacks {
        Ok(report) => report,
        Err(e) => return failed(e),
    };
    let text = match args.json {
        true => serde_json::to_string_pretty(&report).unwrap_or_default() + "\n",
        false => render(&report),
    };
    // A reader that stops early (`| head`) is no error.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    match report.actors.iter().any(|a| a.stuck(args.stuck_after)) {
        true => ExitCode::from(1),
        false => ExitCode::SUCCESS,
    }
}

fn failed(error: String) -> ExitCode {
    eprintln!("monarch-host stacks: error: {error}");
    ExitCode::from(2)
}

/// The stacks, from the run on this machine or the job on the server.
async fn fetch(args: &StacksArgs) -> Result<Value, String> {
    let Some(server) = &args.server else {
        let record = super::runs::find(args.target.as_deref())?;
        return super::hub::request(&record, json!({ "op": "stacks" })).await;
    };
    let job = args
        .target
        .as_deref()
        .ok_or("with --server, give the job id: monarch-host stacks --server URL JOB")?;
    let job: u64 = job.parse().map_err(|_| {
        format!("`{job}` is not a job id (a number, as `monarch-host jobs` lists them)")
    })?;
    let token = match &args.token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    let client = crate::serve::client::ApiClient::new(server, token, Duration::from_secs(30))?;
    client.stacks(job).await
}

/// Whether `frame` is Rust's standard library (`core`, `std`, `alloc`),
/// which the text folds.
pub fn is_std(frame: &Frame) -> bool {
    let function = frame.function.trim_start_matches('<');
    ["core::", "std::", "alloc::"]
        .iter()
        .any(|prefix| function.starts_with(prefix))
        || frame
            .file
            .as_deref()
            .is_some_and(|f| f.starts_with("/rustc/"))
}

/// A source path as a reader wants it: relative to the current directory
/// when under it, a registry crate's from the crate's directory.
fn short_path(path: &str) -> String {
    if let Ok(dir) = std::env::current_dir()
        && let Some(rest) = path.strip_prefix(&format!("{}/", dir.display()))
    {
        return rest.to_string();
    }
    if let Some((_, rest)) = path.split_once("/.cargo/registry/src/")
        && let Some((_, rest)) = rest.split_once('/')
    {
        return rest.to_string();
    }
    path.to_string()
}

/// `function (file:line)`, or the function alone.
fn describe(frame: &Frame) -> String {
    match (&frame.file, frame.line) {
        (Some(file), Some(line)) => format!("{} ({}:{line})", frame.function, short_path(file)),
        (Some(file), None) => format!("{} ({})", frame.function, short_path(file)),
        _ => frame.function.clone(),
    }
}

/// Where an actor is, in words.
fn whereabouts(actor: &ActorStack) -> String {
    let mut place = Vec::new();
    if let Some(host) = &actor.host {
        place.push(format!("host {host}"));
    }
    match (actor.proc_index, &actor.owner) {
        (Some(index), Some(owner)) => place.push(format!("proc {index} of {owner}")),
        (Some(index), None) => place.push(format!("proc {index}")),
        _ => {}
    }
    if actor.rank.is_none()
        && let Some(pid) = actor.pid
    {
        place.push(format!("pid {pid}"));
    }
    format!("{} ({})", actor.name(), place.join(", "))
}

/// The line that stands for `count` folded std/core frames.
fn fold(out: &mut String, count: usize) {
    match count {
        0 => {}
        1 => out.push_str("      ... 1 std/core frame\n"),
        n => out.push_str(&format!("      ... {n} std/core frames\n")),
    }
}

fn render_actor(out: &mut String, actor: &ActorStack) {
    use std::fmt::Write as _;
    let who = whereabouts(actor);
    let (endpoint, seconds) = (
        actor.endpoint.as_deref().unwrap_or("?"),
        actor.for_s.unwrap_or_default(),
    );
    match actor.state {
        ActorState::Idle => {
            let _ = writeln!(out, "{who}: idle");
        }
        ActorState::Waiting => {
            let _ = writeln!(
                out,
                "{who}: in `{endpoint}` for {seconds:.1} s, waiting in the host"
            );
        }
        ActorState::Running => {
            let at = actor
                .frames
                .iter()
                .find(|f| !is_std(f))
                .or(actor.frames.first())
                .map(|f| format!(" at {}", describe(f)))
                .unwrap_or_default();
            let _ = writeln!(out, "{who}: in `{endpoint}` for {seconds:.1} s{at}");
            let mut folded = 0;
            for frame in &actor.frames {
                if is_std(frame) {
                    folded += 1;
                    continue;
                }
                fold(out, std::mem::take(&mut folded));
                let _ = writeln!(out, "      {}", describe(frame));
            }
            fold(out, folded);
        }
    }
}

/// The report as text: the controller, each actor with its frames, and
/// each proc that gave no answer.
pub fn render(report: &Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if let Some(controller) = &report.controller {
        render_actor(&mut out, controller);
    }
    for actor in &report.actors {
        render_actor(&mut out, actor);
    }
    for proc in report.procs.iter().filter(|p| p.error.is_some()) {
        let mut place = vec![format!("host {}", proc.host)];
        if let Some(pid) = proc.pid {
            place.push(format!("pid {pid}"));
        }
        let of = proc
            .owner
            .as_ref()
            .map(|owner| format!(" of {owner}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "proc {}{of} ({}): {}",
            proc.index,
            place.join(", "),
            proc.error.as_deref().unwrap_or_default()
        );
    }
    if report.controller.is_none() && report.actors.is_empty() && report.procs.is_empty() {
        out.push_str("no actors\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, file: &str, line: u32) -> Frame {
        Frame {
            function: function.into(),
            module: None,
            file: Some(file.into()),
            line: Some(line),
            column: None,
        }
    }

    fn actor(rank: u32, state: ActorState, for_s: Option<f64>) -> ActorStack {
        ActorStack {
            mesh: "workers".into(),
            rank: Some(rank),
            state,
            endpoint: for_s.map(|_| "spin".into()),
            for_s,
            sampled_after_ms: None,
            held_ms: None,
            frames: Vec::new(),
            proc: "local:p,proc1".into(),
            proc_index: Some(1),
            host: Some("h".into()),
            pid: Some(7),
            owner: None,
        }
    }

    #[test]
    fn a_running_actor_is_named_with_its_innermost_own_frame_and_std_frames_fold() {
        let mut running = actor(2, ActorState::Running, Some(4.21));
        running.frames = vec![
            frame(
                "core::hint::black_box",
                "/rustc/abc/library/core/src/hint.rs",
                3,
            ),
            frame("examples::spin", "/nowhere/src/lib.rs", 31),
            frame(
                "std::panicking::try",
                "/rustc/abc/library/std/src/panicking.rs",
                9,
            ),
            frame(
                "<core::pin::Pin<P> as core::future::Future>::poll",
                "/rustc/abc/x.rs",
                1,
            ),
            frame("examples::handle", "/nowhere/src/lib.rs", 12),
        ];
        let report = Report {
            controller: None,
            actors: vec![running, actor(0, ActorState::Idle, None)],
            procs: Vec::new(),
            epoch_tick_ms: 10,
        };
        let text = render(&report);
        assert_eq!(
            text,
            "workers[2] (host h, proc 1): in `spin` for 4.2 s at examples::spin (/nowhere/src/lib.rs:31)\n\
             \x20     ... 1 std/core frame\n\
             \x20     examples::spin (/nowhere/src/lib.rs:31)\n\
             \x20     ... 2 std/core frames\n\
             \x20     examples::handle (/nowhere/src/lib.rs:12)\n\
             workers[0] (host h, proc 1): idle\n"
        );
    }

    #[test]
    fn stuck_counts_actors_in_a_handler_past_the_limit_but_not_the_controller() {
        let limit = Duration::from_secs(60);
        assert!(actor(0, ActorState::Running, Some(61.0)).stuck(limit));
        assert!(actor(0, ActorState::Waiting, Some(61.0)).stuck(limit));
        assert!(!actor(0, ActorState::Running, Some(59.0)).stuck(limit));
        assert!(!actor(0, ActorState::Idle, None).stuck(limit));
        let mut controller = actor(0, ActorState::Waiting, Some(600.0));
        controller.rank = None;
        assert!(!controller.stuck(limit));
    }

    #[test]
    fn rust_symbols_are_demangled_without_their_hash() {
        assert_eq!(
            demangle("_ZN4spin12spin_forever17h0123456789abcdefE"),
            "spin::spin_forever"
        );
        assert_eq!(
            demangle("_PyEval_EvalFrameDefault"),
            "_PyEval_EvalFrameDefault"
        );
        assert_eq!(
            demangle("_ZN4spin12spin_forever17h0123456789abcdefE.llvm.7361082068688346257"),
            "spin::spin_forever"
        );
        assert_eq!(
            demangle("<a::B as c::D>::call (.llvm.7361082068688346257)"),
            "<a::B as c::D>::call"
        );
    }
}

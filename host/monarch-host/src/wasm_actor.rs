//! A Wasm actor: one instance of the program component inside a hyperactor
//! actor, on any proc of a mesh.
//!
//! Actors are spawned by the proc agent of their proc through the `wasm`
//! actor factory ([`registry`]): its parameters name the program by sha256,
//! and the factory finds the compiled program in this process, or loads it
//! from the host's blob store through the compile cache (so a host
//! compiles a program once, and its procs deserialize it). The instance is
//! made in the actor's `init`, which also calls the component's `create`.
//! Each [`MeshCall`] runs the component's `handle`. An endpoint error is a
//! reply; a trap fails the actor, and hyperactor's supervision turns it
//! into a failure for every pending caller.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::anyhow;
use hyperactor::{Actor, Context, Exports, Handler, Mailbox, PortRef};
use hyperactor_mesh::MeshCall;
use hyperactor_mesh::agent::{MeshEvent, Registry, SpawnArgs, SpawnedActor, blob_path};
use tokio::sync::OnceCell;
use wasmtime::Store;

use crate::bindings::{Dim, Program, ProgramPre};
use crate::engine::{self, Sandbox};
use crate::host::{Cluster, HostState, LogSink, ProgramBytes, linker, new_store};
use crate::mesh::{WASM_KIND, WasmSpawnParams};

/// A Wasm actor; see the module docs.
pub struct WasmActor {
    cluster: Arc<Cluster>,
    mesh: String,
    class: String,
    init: Vec<u8>,
    rank: u32,
    extent: Vec<Dim>,
    instance: Option<(Store<HostState>, Program)>,
    /// Set by the proc's agent when it stops the actor (see `HostState`).
    interrupt: Arc<AtomicBool>,
}

impl Actor for WasmActor {
    fn exports(exports: &mut Exports<Self>) {
        exports.handle::<MeshCall>();
    }

    async fn init(&mut self, cx: &Context<Self>) -> anyhow::Result<()> {
        let who = format!("{}[{}]", self.mesh, self.rank);
        let mailbox: Mailbox = (**cx).clone();
        let mut state = HostState::new(self.cluster.clone(), &mailbox, who);
        state.interrupt = self.interrupt.clone();
        let mut store = new_store(&self.cluster, state);
        let pre = self
            .cluster
            .pre
            .as_ref()
            .ok_or_else(|| anyhow!("the program defines no actor classes"))?;
        let program = pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| anyhow!("instantiating the program: {e:?}"))?;
        let created = program
            .monarch_host_actor_class()
            .call_create(&mut store, &self.class, &self.init, self.rank, &self.extent)
            .await
            .map_err(|trap| {
                tracing::info!(actor = %cx.actor_id(), "trap in create: {trap:?}");
                anyhow!("`create` trapped: {}", trap_reason(&trap))
            })?;
        created.map_err(|error| anyhow!("`create` of class `{}` failed: {error}", self.class))?;
        self.instance = Some((store, program));
        Ok(())
    }
}

impl Handler<MeshCall> for WasmActor {
    async fn handle(&mut self, cx: &Context<Self>, call: MeshCall) -> anyhow::Result<()> {
        let (store, program) = self
            .instance
            .as_mut()
            .ok_or_else(|| anyhow!("the actor has no instance"))?;
        let result = program
            .monarch_host_actor_class()
            .call_handle(&mut *store, &call.endpoint, &call.message)
            .await;
        match result {
            Ok(reply) => {
                call.reply.send(cx, reply);
                Ok(())
            }
            // A trap is fatal: hyperactor fails the actor and every caller
            // waiting on it, this one included. Callers get the trap's
            // reason; the Wasm backtrace goes to the host's log.
            Err(trap) => {
                tracing::info!(actor = %cx.actor_id(), endpoint = %call.endpoint, "trap: {trap:?}");
                Err(anyhow!(
                    "trapped in `{}`: {}",
                    call.endpoint,
                    trap_reason(&trap)
                ))
            }
        }
    }
}

/// The reason of a trap without its backtrace: "wasm `unreachable`
/// instruction executed", "out of bounds memory access"...
pub(crate) fn trap_reason(error: &wasmtime::Error) -> String {
    match error.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        // Not a Trap (memory growth refused, a deadline): the innermost
        // cause says why; the outer layers are the backtrace.
        None => error.root_cause().to_string(),
    }
}

/// A program compiled in this process: what every actor of it shares,
/// whichever run spawned it.
struct Compiled {
    engine: wasmtime::Engine,
    pre: ProgramPre<HostState>,
    program: ProgramBytes,
}

/// The programs this process has compiled, by sha256. A proc of a
/// persistent mesh runs many jobs: each spawn gets a cluster of its own
/// (its deadline, memory cap, call timeout) around the shared compiled form.
type Programs = Arc<Mutex<HashMap<String, Arc<OnceCell<Arc<Compiled>>>>>>;

/// Log sinks by the events port they send to: one mailbox per controller.
type LogSinks = Arc<Mutex<HashMap<String, LogSink>>>;

/// A registry with the `wasm` kind, keeping blobs in `blob_dir`. `known`
/// is a program this process already runs (the controller's), so that
/// actors in this process share its compiled form.
pub fn registry(blob_dir: std::path::PathBuf, known: Option<Arc<Cluster>>) -> Registry {
    let programs: Programs = Arc::default();
    let compiled_here = known.is_some();
    let sinks: LogSinks = Arc::default();
    // In-process actors of the controller's program log as the controller
    // does.
    let known_log = known
        .as_ref()
        .map(|c| (c.program.sha256.clone(), c.log.clone()));
    if let Some(cluster) = known
        && let Some(pre) = &cluster.pre
    {
        let compiled = Compiled {
            engine: cluster.engine.clone(),
            pre: pre.clone(),
            program: cluster.program.clone(),
        };
        let cell = OnceCell::new_with(Some(Arc::new(compiled)));
        programs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cluster.program.sha256.clone(), Arc::new(cell));
    }
    let mut registry = Registry::new(blob_dir);
    registry.register(
        WASM_KIND,
        Arc::new(move |args: SpawnArgs| {
            let programs = programs.clone();
            let sinks = sinks.clone();
            let known_log = known_log.clone();
            Box::pin(async move {
                let params: WasmSpawnParams = serde_json::from_slice(&args.params)
                    .map_err(|e| format!("bad wasm spawn parameters: {e}"))?;
                let cell = programs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(params.sha256.clone())
                    .or_default()
                    .clone();
                let compiled = cell
                    .get_or_try_init(|| load_program(&args, &params))
                    .await?
                    .clone();
                let log = match known_log {
                    Some((sha, log)) if sha == params.sha256 => log,
                    _ => log_to(&sinks, &args.proc, &args.events)?,
                };
                let sandbox = Sandbox {
                    memory_bytes: params.memory_bytes,
                    deadline: Duration::from_millis(params.deadline_ms),
                    call_timeout: Duration::from_millis(params.call_timeout_ms),
                    max_procs: 0,
                    fanout: params.fanout,
                    ..Sandbox::default()
                };
                let cluster = Cluster::new(
                    compiled.engine.clone(),
                    Some(compiled.pre.clone()),
                    sandbox,
                    log,
                    compiled.program.clone(),
                );
                let actor = WasmActor {
                    cluster,
                    mesh: args.name.clone(),
                    class: params.class,
                    init: params.init,
                    rank: args.rank,
                    extent: args
                        .extent
                        .iter()
                        .map(|(name, size)| Dim {
                            name: name.clone(),
                            size: *size,
                        })
                        .collect(),
                    instance: None,
                    interrupt: Arc::default(),
                };
                let interrupt = actor.interrupt.clone();
                let spawned = SpawnedActor::start(&args, actor).await?;
                Ok(spawned.on_stop(move || interrupt.store(true, Ordering::Relaxed)))
            })
        }),
    );
    // Every proc can hold the shards of a program's tensor engines and its
    // RDMA buffers.
    monarch_tensor::mesh::register(&mut registry);
    monarch_rdma::mesh::register(&mut registry);
    // A host compiles a program when it arrives, once for all its procs;
    // the process that runs the controller has compiled it already.
    if !compiled_here {
        registry.on_blob(Arc::new(|path| {
            let engine = worker_engine()?;
            engine::load(&engine, path)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }));
    }
    registry
}

/// This process's engine for programs it did not start itself. One proc
/// runs actors of many runs (a persistent mesh of the server), each with
/// its own memory cap, which the stores' limits enforce; the engine's pool
/// takes up to the most a 32-bit memory can grow to, as much address space
/// as each slot reserves anyway.
fn worker_engine() -> Result<wasmtime::Engine, String> {
    static ENGINE: OnceLock<Result<wasmtime::Engine, String>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let engine = engine::new_engine(4 << 30).map_err(|e| format!("{e:#}"))?;
            engine::start_epoch_ticker(&engine);
            Ok(engine)
        })
        .clone()
}

/// Loads a program from the host's blob store, through the compile cache.
async fn load_program(args: &SpawnArgs, params: &WasmSpawnParams) -> Result<Arc<Compiled>, String> {
    let path = blob_path(&args.blob_dir, &params.sha256)?;
    let engine = worker_engine()?;
    let loaded = {
        let (engine, path) = (engine.clone(), path.clone());
        tokio::task::spawn_blocking(move || engine::load(&engine, &path))
            .await
            .map_err(|e| format!("loading the program panicked: {e}"))?
            .map_err(|e| e.to_string())?
    };
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let linker = linker(&engine).map_err(|e| format!("{e:#}"))?;
    let pre = linker
        .instantiate_pre(&loaded.component)
        .and_then(ProgramPre::new)
        .map_err(|e| format!("the program does not fit this host: {e:#}"))?;
    Ok(Arc::new(Compiled {
        engine,
        pre,
        program: ProgramBytes {
            sha256: params.sha256.clone(),
            bytes: Arc::new(bytes),
        },
    }))
}

/// A log sink that sends each line to the controller whose events port is
/// `events`; one per port, made once.
fn log_to(
    sinks: &LogSinks,
    proc: &hyperactor::Proc,
    events: &PortRef<MeshEvent>,
) -> Result<LogSink, String> {
    let key = events.id().to_string();
    let mut sinks = sinks.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(sink) = sinks.get(&key) {
        return Ok(sink.clone());
    }
    let (mailbox, _undeliverable) = proc
        .attach(&format!("log{}", sinks.len()))
        .map_err(|e| format!("cannot attach the log mailbox: {e}"))?;
    let events = events.clone();
    let sink: LogSink = Arc::new(move |line: &str| {
        events.send(
            &mailbox,
            MeshEvent::Log {
                line: line.to_string(),
            },
        )
    });
    sinks.insert(key, sink.clone());
    Ok(sink)
}

//! Running a program: the controller's store on one task, until `run`
//! returns, traps, or the deadline passes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use hyperactor_mesh::agent::Registry;
use hyperactor_mesh::alloc::{Allocator, BootstrapCommand, InProcessAllocator, LocalAllocator};
use hyperactor_mesh::client::MeshClient;
use hyperactor_mesh::remote::{RemoteAllocator, local_ip_towards};

use wasmtime::Engine;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, ComponentExportIndex, InstancePre, TypedFunc};

use crate::bindings::{Program, ProgramPre};
use crate::engine::{self, LoadError, Placement, PoolShape, Sandbox};
use crate::host::{
    AttachedProcs, Cluster, HostState, JobHooks, LogSink, MeshObserver, ProgramBytes, linker,
    new_store,
};

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The program could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The component is not a program of this host's world.
    #[error(
        "{path} is not a monarch-host program: {reason}. Programs target the WIT world `monarch:host/program` in wit/monarch.wit (exports `run` and `actor-class`), or `monarch:host/controller` (`run` alone)"
    )]
    WrongWorld {
        /// The file.
        path: String,
        /// What does not match.
        reason: String,
    },
    /// `run` returned an error.
    #[error("the program failed: {0}")]
    Failed(String),
    /// The controller trapped.
    #[error("the controller trapped: {0}")]
    Trap(String),
    /// The run took longer than its deadline.
    #[error("the run did not finish within {0:?} (--timeout)")]
    Timeout(std::time::Duration),
    /// The controller called `exit` with a status other than 0.
    #[error("the program exited with status {0}")]
    Exit(i32),
    /// The host failed.
    #[error("host error: {0}")]
    Host(String),
    /// The run was cancelled.
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// A session had no input for its idle TTL, and was closed.
    #[error("the session was idle for {} s (its idle TTL) and was closed", .0.as_secs_f64())]
    Idle(std::time::Duration),
}

/// Loads the program at `path` and runs its controller with `args`; guest
/// log lines go to `log`.
pub async fn run_program(
    path: &Path,
    args: &[String],
    sandbox: Sandbox,
    log: LogSink,
) -> Result<(), RunError> {
    run_program_with(path, &[], args, sandbox, log).await
}

/// [`run_program`] with actor libraries: other programs (components, in any
/// language) whose actor classes the program spawns as `NAME/Class`.
pub async fn run_program_with(
    path: &Path,
    libraries: &[(String, std::path::PathBuf)],
    args: &[String],
    sandbox: Sandbox,
    log: LogSink,
) -> Result<(), RunError> {
    let started = Instant::now();
    let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    // The pool is sized for this program: its instances (the controller and
    // in-process actors) take what it was read to need.
    let footprint = engine::inspect(path, &bytes)?;
    let shape = PoolShape::for_program(
        &footprint.needs,
        sandbox.max_instances,
        sandbox.memory_bytes,
    );
    // Under `--debug` a second, instrumented engine, used only for this
    // run (DE-1 of `debug::engine`).
    let engine = match sandbox.debug_engine {
        false => engine::pooled_engine(&shape),
        true => engine::pooled_debug_engine(&shape),
    }
    .map_err(|e| RunError::Host(format!("{e:#}")))?;
    engine::start_epoch_ticker(&engine);
    // Compiling takes seconds for a large program: off this thread, so
    // that the run's other tasks (its debug hub) answer meanwhile.
    let prepared = {
        let (engine, path) = (engine.clone(), path.to_path_buf());
        let libraries = libraries.to_vec();
        tokio::task::spawn_blocking(move || {
            let mut prepared = Prepared::new(&engine, &path, bytes)?;
            for (name, library) in &libraries {
                prepared.add_library(name, library)?;
            }
            Ok::<_, RunError>(prepared)
        })
        .await
        .map_err(|e| RunError::Host(format!("loading the program panicked: {e}")))??
    };
    tracing::info!(
        sha256 = %prepared.sha256(),
        cached = prepared.cached,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "program loaded"
    );
    prepared
        .run(
            args,
            sandbox,
            log,
            Mesh::Fresh,
            None,
            std::future::pending(),
        )
        .await
}

/// A program compiled and checked against the `program` world, ready to
/// run any number of times.
pub struct Prepared {
    engine: Engine,
    entry: Entry,
    program: ProgramBytes,
    libraries: std::collections::BTreeMap<String, ProgramBytes>,
    /// Whether the compiled form came from the cache.
    pub cached: bool,
    /// Whether it exports the `session` world's functions.
    session: bool,
    /// Its `tests` export (`monarch:host/tests`), if it has one.
    tests: Option<TestExports>,
}

/// The name of the interface a program's tests are exported as.
pub const TESTS_INTERFACE: &str = "monarch:host/tests@0.2.0";

/// Where a component's `tests` export's functions are.
#[derive(Clone, Copy)]
struct TestExports {
    list: ComponentExportIndex,
    run: ComponentExportIndex,
}

impl TestExports {
    /// The `tests` export of `component`, if it has one with both functions.
    fn of(component: &Component) -> Option<TestExports> {
        let (item, tests) = component.get_export(None, TESTS_INTERFACE)?;
        if !matches!(item, ComponentItem::ComponentInstance(_)) {
            return None;
        }
        Some(TestExports {
            list: component.get_export_index(Some(&tests), "list-tests")?,
            run: component.get_export_index(Some(&tests), "run-test")?,
        })
    }
}

/// The type of `list-tests`: `func() -> list<string>`.
type ListTestsFunc = TypedFunc<(), (Vec<String>,)>;

/// The type of `run-test`: `func(name: string) -> result<_, string>`.
type RunTestFunc = TypedFunc<(String,), (Result<(), String>,)>;

/// A call of the `tests` export.
enum TestCall {
    /// `list-tests`, whose names go to the sender.
    List(tokio::sync::oneshot::Sender<Vec<String>>),
    /// `run-test` of this name.
    Run(String),
}

/// What a failed call into the controller is: its `exit`, or a trap.
fn controller_error(e: &wasmtime::Error) -> RunError {
    match e.downcast_ref::<wasmtime_wasi::I32Exit>() {
        Some(exit) => RunError::Exit(exit.0),
        None => RunError::Trap(crate::wasm_actor::trap_text(e)),
    }
}

/// How a prepared component is entered.
enum Entry {
    /// The `program` world: `run` and actor classes.
    Program(ProgramPre<HostState>),
    /// The `controller` world: `run` only.
    Controller(InstancePre<HostState>),
    /// The `session` world: `init`, `on-input` and `prompt`, no `run`.
    Session(InstancePre<HostState>),
}

/// What a run does with its controller once it is instantiated.
pub enum Drive {
    /// Calls `run` with these arguments.
    Main(Vec<String>),
    /// Calls `init`, then `on-input` per line (the `session` world).
    Session(crate::session::SessionDriver),
    /// Calls the `tests` export's `run-test` with this test's name; its
    /// `Err` is [`RunError::Failed`].
    Test(String),
    /// Calls the `tests` export's `list-tests` and sends the names.
    ListTests(tokio::sync::oneshot::Sender<Vec<String>>),
}

/// Whether `component` exports a function `run` (the `controller` world).
fn exports_run(component: &Component) -> bool {
    exports_func(component, "run")
}

/// Whether `component` exports a function named `func`.
fn exports_func(component: &Component, func: &str) -> bool {
    let engine = component.engine();
    component
        .component_type()
        .exports(engine)
        .any(|(name, item)| name == func && matches!(item.ty, ComponentItem::ComponentFunc(_)))
}

/// The type of `run`: `func(args: list<string>) -> result<_, string>`.
type RunFunc = TypedFunc<(Vec<String>,), (Result<(), String>,)>;

/// Where a run's procs come from.
pub enum Mesh {
    /// Procs started for this run as its sandbox's placement says,
    /// stopped when it ends.
    Fresh,
    /// Procs of a persistent mesh, which outlive the run.
    Attached {
        /// The persistent mesh's client.
        client: Arc<MeshClient>,
        /// What the run may use of it.
        procs: AttachedProcs,
    },
}

impl Prepared {
    /// Makes the actor classes of the program at `path` (a component of
    /// the `program` or `actor` world, in any language) spawnable by this
    /// one as `name/Class`. Its actors run in their own instances of it,
    /// compiled where they run.
    pub fn add_library(&mut self, name: &str, path: &Path) -> Result<(), RunError> {
        if name.is_empty() || name.contains('/') {
            return Err(RunError::Host(format!(
                "actor library name `{name}`: give a name without `/` (NAME=PATH)"
            )));
        }
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let footprint = engine::inspect(path, &bytes)?;
        let sha256 = engine::sha256_hex(&bytes);
        self.libraries.insert(
            name.to_string(),
            ProgramBytes::in_memory(sha256, footprint.needs, bytes),
        );
        Ok(())
    }

    /// Compiles `bytes` (read from `path`, which names them in errors) in
    /// `engine`, through the compile cache, and checks its world.
    pub fn new(engine: &Engine, path: &Path, bytes: Vec<u8>) -> Result<Prepared, RunError> {
        let loaded = engine::load_bytes(engine, path, &bytes)?;
        let linker = linker(engine).map_err(|e| RunError::Host(format!("{e:#}")))?;
        let wrong_world = |e: wasmtime::Error| RunError::WrongWorld {
            path: path.display().to_string(),
            reason: format!("{e:#}"),
        };
        let pre = linker
            .instantiate_pre(&loaded.component)
            .map_err(wrong_world)?;
        // A `program` exports `run` and `actor-class`; a `controller` only
        // `run`.
        let session = exports_func(&loaded.component, "on-input");
        let entry = match ProgramPre::new(pre.clone()) {
            Ok(program) => Entry::Program(program),
            Err(_) if exports_run(&loaded.component) => Entry::Controller(pre),
            Err(_) if session => Entry::Session(pre),
            Err(e) => return Err(wrong_world(e)),
        };
        let tests = TestExports::of(&loaded.component);
        Ok(Prepared {
            engine: engine.clone(),
            entry,
            session,
            tests,
            program: ProgramBytes::in_memory(loaded.sha256, loaded.footprint.needs, bytes),
            cached: loaded.cached,
            libraries: Default::default(),
        })
    }

    /// The sha256 of the component's bytes.
    pub fn sha256(&self) -> &str {
        &self.program.sha256
    }

    /// The WIT world the component fits: `program`, `controller`,
    /// `session-program` or `session`.
    pub fn world(&self) -> &'static str {
        match (&self.entry, self.session) {
            (Entry::Program(_), false) => "program",
            (Entry::Program(_), true) => "session-program",
            (Entry::Controller(_), _) => "controller",
            (Entry::Session(_), _) => "session",
        }
    }

    /// Whether it is a session (the `session` world): `run_session`
    /// drives it.
    pub fn is_session(&self) -> bool {
        self.session
    }

    /// Whether it exports `monarch:host/tests` (a program built with the
    /// Rust SDK), which [`Prepared::list_tests`] and [`Prepared::run_test`]
    /// call.
    pub fn has_tests(&self) -> bool {
        self.tests.is_some()
    }

    /// The names of its tests: `list-tests` of an instance of it, as a
    /// controller on procs placed as `sandbox` says (none are started
    /// unless it spawns some).
    pub async fn list_tests(
        &self,
        sandbox: Sandbox,
        log: LogSink,
    ) -> Result<Vec<String>, RunError> {
        let (answer, names) = tokio::sync::oneshot::channel();
        self.drive(
            Drive::ListTests(answer),
            sandbox,
            log,
            Mesh::Fresh,
            None,
            std::future::pending(),
        )
        .await?;
        names
            .await
            .map_err(|_| RunError::Host("`list-tests` returned no names".into()))
    }

    /// Runs the test `name` as the controller, on a fresh mesh stopped
    /// when it ends, until `run-test` returns, the deadline passes or
    /// `cancel` completes. Its `Err` is [`RunError::Failed`]; a panic is a
    /// [`RunError::Trap`]. What the controller and its actors print goes
    /// to `log`, the controller's lines unprefixed.
    pub async fn run_test(
        &self,
        name: &str,
        sandbox: Sandbox,
        log: LogSink,
        cancel: impl std::future::Future<Output = String>,
    ) -> Result<(), RunError> {
        self.drive(
            Drive::Test(name.to_string()),
            sandbox,
            log,
            Mesh::Fresh,
            None,
            cancel,
        )
        .await
    }

    /// Runs the component as a session on `mesh`, driven by `driver`,
    /// until it is closed (every input sender dropped), idles out, traps,
    /// or `cancel` completes; what it spawned is stopped before this
    /// returns. See [`crate::session`].
    pub async fn run_session(
        &self,
        driver: crate::session::SessionDriver,
        sandbox: Sandbox,
        log: LogSink,
        mesh: Mesh,
        observer: Option<Arc<dyn MeshObserver>>,
        cancel: impl std::future::Future<Output = String>,
    ) -> Result<(), RunError> {
        if !self.session {
            return Err(RunError::WrongWorld {
                path: "the component".into(),
                reason: format!(
                    "it is a `{}`, not a session: it exports no `on-input` (the WIT world `monarch:host/session`)",
                    self.world()
                ),
            });
        }
        self.drive(Drive::Session(driver), sandbox, log, mesh, observer, cancel)
            .await
    }

    /// Runs the controller with `args` on `mesh`, until `run` returns, the
    /// deadline passes or `cancel` completes (at the controller's next host
    /// call or epoch tick). What it spawned is stopped before this returns.
    pub async fn run(
        &self,
        args: &[String],
        sandbox: Sandbox,
        log: LogSink,
        mesh: Mesh,
        observer: Option<Arc<dyn MeshObserver>>,
        cancel: impl std::future::Future<Output = String>,
    ) -> Result<(), RunError> {
        self.drive(
            Drive::Main(args.to_vec()),
            sandbox,
            log,
            mesh,
            observer,
            cancel,
        )
        .await
    }

    /// Instantiates the controller in `store` and makes `call` of its
    /// `tests` export.
    async fn call_tests(
        &self,
        store: &mut wasmtime::Store<HostState>,
        debugger: Option<&crate::debug::engine::Debugger>,
        call: TestCall,
    ) -> Result<(), RunError> {
        let tests = self.tests.ok_or_else(|| RunError::WrongWorld {
            path: "the component".into(),
            reason: format!("it does not export {TESTS_INTERFACE}"),
        })?;
        let wrong_type = |e: wasmtime::Error| RunError::WrongWorld {
            path: "the component".into(),
            reason: format!("its {TESTS_INTERFACE} functions do not have the WIT's types: {e:#}"),
        };
        let instance = match &self.entry {
            Entry::Program(pre) => pre.instance_pre().instantiate_async(&mut *store).await,
            Entry::Controller(pre) | Entry::Session(pre) => {
                pre.instantiate_async(&mut *store).await
            }
        }
        .map_err(|e| controller_error(&e))?;
        if let Some(debugger) = debugger {
            debugger.begin_export(store);
        }
        match call {
            TestCall::List(answer) => {
                let list: ListTestsFunc = instance
                    .get_typed_func(&mut *store, tests.list)
                    .map_err(wrong_type)?;
                let (names,) = list
                    .call_async(&mut *store, ())
                    .await
                    .map_err(|e| controller_error(&e))?;
                let _ = answer.send(names);
                Ok(())
            }
            TestCall::Run(name) => {
                let run: RunTestFunc = instance
                    .get_typed_func(&mut *store, tests.run)
                    .map_err(wrong_type)?;
                let (result,) = run
                    .call_async(&mut *store, (name,))
                    .await
                    .map_err(|e| controller_error(&e))?;
                result.map_err(RunError::Failed)
            }
        }
    }

    async fn drive(
        &self,
        drive: Drive,
        sandbox: Sandbox,
        log: LogSink,
        mesh: Mesh,
        observer: Option<Arc<dyn MeshObserver>>,
        cancel: impl std::future::Future<Output = String>,
    ) -> Result<(), RunError> {
        let deadline = sandbox.deadline;
        // A cap below the program's initial memory fails every instance;
        // say so before starting anything.
        if self.program.needs.initial_memory > sandbox.memory_bytes as u64 {
            return Err(RunError::Load(LoadError::MemoryCap {
                path: "the program".into(),
                needed: self.program.needs.initial_memory,
                cap: sandbox.memory_bytes,
            }));
        }
        // The controller's instance takes a place in its engine's pool, as
        // every actor's does.
        let slot = match engine::pool(&self.engine) {
            Some(pool) => Some(pool.reserve().map_err(RunError::Host)?),
            None => None,
        };
        let (attached, client) = match mesh {
            Mesh::Fresh => (None, None),
            Mesh::Attached { client, procs } => (Some(procs), Some(client)),
        };
        let placement = sandbox.placement.clone();
        let live = sandbox.live.clone();
        let actor_classes = match &self.entry {
            Entry::Program(pre) => Some(pre.clone()),
            Entry::Controller(_) | Entry::Session(_) => None,
        };
        let cluster = Cluster::for_job(
            self.engine.clone(),
            actor_classes,
            sandbox,
            log.clone(),
            self.program.clone(),
            JobHooks {
                attached,
                observer,
                libraries: Arc::new(self.libraries.clone()),
            },
        );
        let client = match client {
            Some(client) => client,
            None => start_client(&cluster, &placement, log)
                .await
                .map_err(RunError::Host)?,
        };
        cluster.set_client(client.clone());
        live.set(Some(cluster.clone()));
        // The observer hears what happens to the procs and actors of a
        // fresh mesh; a persistent mesh's owner watches it for every job.
        let fresh_observer = match cluster.job.attached {
            None => cluster.job.observer.clone(),
            Some(_) => None,
        };
        let watcher = fresh_observer.map(|observer| {
            let mut events = client.subscribe();
            tokio::spawn(async move {
                while let Some(event) = events.recv().await {
                    observer.mesh_event(&event);
                }
            })
        });
        let mailbox = client.mailbox().clone();
        // A server's job prints into its log; a run from the command line
        // prints to the terminal as any program does.
        let unprefixed = matches!(
            drive,
            Drive::Session(_) | Drive::Test(_) | Drive::ListTests(_)
        );
        let output = match (unprefixed, cluster.job.observer.is_some()) {
            // What a session prints is its user's output, shown as printed;
            // what a test prints is kept for its report.
            (true, _) => Some(String::new()),
            (false, true) => Some("[controller] ".to_string()),
            (false, false) => None,
        };
        let mut state = HostState::new(cluster.clone(), &mailbox, "controller".into(), output);
        state.watch(client.subscribe());
        state.slot = slot;
        state.probe = Some(crate::debug::stacks::Probe::controller(
            client.proc().id(),
            &cluster,
        ));
        state.debug.whoami.mesh = "controller".into();
        let mut store = new_store(&cluster, state);
        let debugger = crate::debug::engine::attach(&mut store, &cluster).await;
        let run = tokio::time::timeout(deadline, async {
            let trapped = |e: wasmtime::Error| controller_error(&e);
            let args = match drive {
                Drive::Main(args) => args,
                Drive::Session(driver) => {
                    let instance = match &self.entry {
                        Entry::Program(pre) => {
                            pre.instance_pre().instantiate_async(&mut store).await
                        }
                        Entry::Controller(pre) | Entry::Session(pre) => {
                            pre.instantiate_async(&mut store).await
                        }
                    }
                    .map_err(trapped)?;
                    return match crate::session::drive(&mut store, &instance, driver).await {
                        Ok(crate::session::Ended::Closed) => Ok(()),
                        Ok(crate::session::Ended::Idle(ttl)) => Err(RunError::Idle(ttl)),
                        Err(crate::session::LoopError::WrongWorld(reason)) => {
                            Err(RunError::WrongWorld {
                                path: "the component".into(),
                                reason,
                            })
                        }
                        Err(crate::session::LoopError::Init(e)) => Err(RunError::Failed(e)),
                        Err(crate::session::LoopError::Trap(trap)) => Err(trapped(trap)),
                    };
                }
                Drive::Test(name) => {
                    return self
                        .call_tests(&mut store, debugger.as_ref(), TestCall::Run(name))
                        .await;
                }
                Drive::ListTests(answer) => {
                    return self
                        .call_tests(&mut store, debugger.as_ref(), TestCall::List(answer))
                        .await;
                }
            };
            let result = match &self.entry {
                Entry::Program(pre) => {
                    let program: Program =
                        pre.instantiate_async(&mut store).await.map_err(trapped)?;
                    if let Some(debugger) = &debugger {
                        debugger.begin_export(&mut store);
                    }
                    program.call_run(&mut store, &args).await.map_err(trapped)?
                }
                Entry::Session(_) => {
                    return Err(RunError::WrongWorld {
                        path: "the component".into(),
                        reason: "it is a session (the WIT world `monarch:host/session`): it exports no `run`; open it with `monarch-host console`".into(),
                    });
                }
                Entry::Controller(pre) => {
                    let instance = pre.instantiate_async(&mut store).await.map_err(trapped)?;
                    let run: RunFunc = instance
                        .get_typed_func(&mut store, "run")
                        .map_err(|e| RunError::WrongWorld {
                            path: "the component".into(),
                            reason: format!("its `run` is not `func(args: list<string>) -> result<_, string>`: {e:#}"),
                        })?;
                    if let Some(debugger) = &debugger {
                        debugger.begin_export(&mut store);
                    }
                    let (result,) = run.call_async(&mut store, (args,)).await.map_err(trapped)?;
                    result
                }
            };
            result.map_err(RunError::Failed)
        });
        let outcome = tokio::select! {
            outcome = run => outcome.unwrap_or(Err(RunError::Timeout(deadline))),
            reason = cancel => Err(RunError::Cancelled(reason)),
        };
        // `exit(0)` is a success like returning `Ok`; a trap after its
        // memory could not grow says so first.
        let outcome = match outcome {
            Err(RunError::Exit(0)) => Ok(()),
            Err(RunError::Trap(trap)) => match store.data().limits.out_of_memory() {
                // Another of the host's limits names itself, even after a
                // refused growth (HG-2, HG-3, HG-5 of `host`).
                Some(_) if crate::wasm_actor::names_a_limit(&trap) => Err(RunError::Trap(trap)),
                Some(why) => Err(RunError::Trap(format!("out of memory: {why}: {trap}"))),
                None => Err(RunError::Trap(trap)),
            },
            other => other,
        };
        live.set(None);
        let spawned = store.data_mut().take_spawned();
        drop(store);
        cluster.stop_all(spawned).await;
        if let Some(watcher) = watcher {
            watcher.abort();
        }
        outcome
    }
}

impl Prepared {
    /// A native controller (`native.rs`) on a fresh cluster placed as
    /// `sandbox` says, whose actors are this program's classes: what
    /// `monarch-test` drives. Errors for a component with no actor
    /// classes.
    pub async fn native_controller(
        &self,
        sandbox: Sandbox,
        log: LogSink,
    ) -> Result<crate::native::NativeController, RunError> {
        let Entry::Program(pre) = &self.entry else {
            return Err(RunError::WrongWorld {
                path: "the component".into(),
                reason: "it defines no actor classes (it is not of the WIT world `program`)".into(),
            });
        };
        let placement = sandbox.placement.clone();
        let cluster = Cluster::for_job(
            self.engine.clone(),
            Some(pre.clone()),
            sandbox,
            log.clone(),
            self.program.clone(),
            JobHooks {
                attached: None,
                observer: None,
                libraries: Arc::new(self.libraries.clone()),
            },
        );
        let client = start_client(&cluster, &placement, log)
            .await
            .map_err(RunError::Host)?;
        cluster.set_client(client.clone());
        let mailbox = client.mailbox().clone();
        let mut state = HostState::new(
            cluster.clone(),
            &mailbox,
            "controller".into(),
            Some(String::new()),
        );
        state.watch(client.subscribe());
        Ok(crate::native::NativeController::new(state, cluster))
    }
}

/// The mesh client of a run: its allocator, and the controller's proc at
/// an address its procs can reach.
pub(crate) async fn start_client(
    cluster: &Arc<Cluster>,
    placement: &Placement,
    log: LogSink,
) -> Result<Arc<MeshClient>, String> {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let nth = RUNS.fetch_add(1, Ordering::Relaxed);
    let run = format!("run{}-{nth}", std::process::id());
    let blob_dir = blob_dir();
    let (addr, allocator): (String, Arc<dyn Allocator>) = match placement {
        Placement::InProcess => (
            format!("local:{run}"),
            Arc::new(InProcessAllocator::new(Arc::new(
                crate::wasm_actor::registry(blob_dir, Some(cluster.clone())),
            ))),
        ),
        Placement::Local { program } => {
            let command = BootstrapCommand {
                program: program.clone(),
                args: vec!["bootstrap".into()],
            };
            let allocator = LocalAllocator::new(command, Arc::new(Registry::new(blob_dir)))
                .map_err(|e| format!("cannot prepare child procs: {e}"))?;
            let socket = hyperactor_mesh::alloc::controller_socket(
                hyperactor_mesh::alloc::ControllerSocket::Run,
                nth as u64,
            );
            (format!("unix:{}", socket.display()), Arc::new(allocator))
        }
        Placement::Hosts {
            agents,
            token,
            liveness,
        } => remote_allocator(agents, token, *liveness).await?,
    };
    let addr = addr.parse().map_err(|e| format!("{e}"))?;
    let config = hyperactor::ProcConfig {
        cluster_token: match placement {
            Placement::Hosts { token, .. } => hyperactor::ClusterToken::new(token),
            _ => None,
        },
        ..hyperactor::ProcConfig::default()
    };
    MeshClient::with_config(addr, config, allocator, log)
        .await
        .map_err(|e| e.to_string())
}

/// An allocator over the agents at `agents`, and the address (on this
/// machine, reachable from them) where its mesh client should listen.
pub(crate) async fn remote_allocator(
    agents: &[hyperactor::ChannelAddr],
    token: &str,
    liveness: hyperactor_mesh::remote::Liveness,
) -> Result<(String, Arc<dyn Allocator>), String> {
    let first = agents.first().ok_or("no hosts given")?;
    let ip =
        local_ip_towards(first).ok_or_else(|| format!("no route from this machine to {first}"))?;
    let here = format!("tcp:{}", std::net::SocketAddr::new(ip, 0));
    let allocator = RemoteAllocator::new(
        here.parse().map_err(|e| format!("{e}"))?,
        agents.to_vec(),
        token.to_string(),
        liveness,
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok((here, Arc::new(allocator)))
}

/// Where this host keeps blobs: beside the compile cache, or in the
/// temporary directory.
pub fn blob_dir() -> PathBuf {
    engine::cache_dir()
        .unwrap_or_else(|| std::env::temp_dir().join("monarch-host"))
        .join("blobs")
}

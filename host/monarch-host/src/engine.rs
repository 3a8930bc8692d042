//! One wasmtime engine, and loading programs into it.
//!
//! Loading checks the bytes before compiling them, so that a wrong file
//! gets an error that says what it is: not WebAssembly, a core module
//! instead of a component. Compiled components are cached on disk by the
//! sha256 of their bytes and the engine's compatibility hash, so a program
//! is compiled once per machine and engine build.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the engine's epoch advances; a running guest yields at each
/// tick, so no guest holds a host thread for longer.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// What the sandbox allows one program.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// Linear memory per instance, in bytes.
    pub memory_bytes: usize,
    /// Wall-clock time the whole run may take.
    pub deadline: Duration,
    /// How long a call waits for its replies unless the program sets another
    /// timeout.
    pub call_timeout: Duration,
    /// The most procs the program may spawn.
    pub max_procs: usize,
    /// Where procs run.
    pub placement: Placement,
    /// The fan-out of the multicast trees that carry casts.
    pub fanout: u32,
    /// The most time one actor handler may take, unless a mesh or a call
    /// sets its own; None: no limit.
    pub handler_timeout: Option<Duration>,
    /// Directories and environment variables granted to the program and
    /// its actors.
    pub grants: Grants,
    /// Component instances one process holds at once: the controller and
    /// the actors of in-process procs, or the actors of one child proc.
    pub max_instances: u32,
    /// Where trapped actors write post-mortem records; None: nowhere.
    pub dumps: Option<crate::debug::dumps::DumpConfig>,
    /// How actors reach the run's debugger; None: breakpoints are no-ops.
    pub debug: Option<crate::debug::pause::DebugConfig>,
    /// Whether the program runs on the debug engine (`run --debug`): a
    /// second engine with guest-debug instrumentation, so that breakpoints
    /// by source line, stepping, traps and interrupts stop its instances
    /// for the debugger ([`crate::debug::engine`]). Slower: never the
    /// default.
    pub debug_engine: bool,
    /// Filled with the run's cluster while it runs, for debuggers.
    pub live: crate::debug::LiveRun,
}

/// What the operator grants a program: nothing unless named.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Grants {
    /// Preopened directories.
    #[serde(default)]
    pub dirs: Vec<DirGrant>,
    /// Environment variables.
    #[serde(default)]
    pub env: Vec<(String, String)>,
}

/// A directory of the host's, preopened for guests.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirGrant {
    /// The directory on the host (absolute).
    pub host: PathBuf,
    /// Where guests see it.
    pub guest: String,
    /// Whether guests may write in it (read-only unless `:rw`).
    pub writable: bool,
}

impl std::str::FromStr for DirGrant {
    type Err = String;

    /// `HOST[::GUEST][:ro|:rw]`: read-only unless `:rw`; guests see it at
    /// `GUEST`, or at `HOST` when no `::GUEST` is given.
    fn from_str(spec: &str) -> Result<DirGrant, String> {
        let (rest, writable) = if let Some(rest) = spec.strip_suffix(":rw") {
            (rest, true)
        } else {
            (spec.strip_suffix(":ro").unwrap_or(spec), false)
        };
        let (host, guest) = match rest.split_once("::") {
            Some((host, guest)) => (host, guest),
            None => (rest, rest),
        };
        if host.is_empty() || guest.is_empty() {
            return Err(format!(
                "`{spec}` is not HOST[::GUEST][:ro|:rw] (e.g. ./data::/data:ro)"
            ));
        }
        let canonical = std::fs::canonicalize(host)
            .map_err(|e| format!("cannot grant the directory `{host}`: {e}"))?;
        if !canonical.is_dir() {
            return Err(format!("cannot grant `{host}`: it is not a directory"));
        }
        Ok(DirGrant {
            host: canonical,
            guest: guest.to_string(),
            writable,
        })
    }
}

/// Parses `--env K=V`.
pub fn parse_env(spec: &str) -> Result<(String, String), String> {
    match spec.split_once('=') {
        Some((key, value)) if !key.is_empty() && !key.contains('\0') && !value.contains('\0') => {
            Ok((key.to_string(), value.to_string()))
        }
        _ => Err(format!("`{spec}` is not KEY=VALUE")),
    }
}

/// Where the procs of a program run.
#[derive(Debug, Clone)]
pub enum Placement {
    /// Inside the host's own process: cheapest, but one crash ends all.
    InProcess,
    /// Child processes of the host, started as `program bootstrap`
    /// (`program` is the `monarch-host` binary).
    Local {
        /// The `monarch-host` binary.
        program: PathBuf,
    },
    /// On other hosts, through their agents (`monarch-host agent`).
    Hosts {
        /// The agents' addresses (`tcp:IP:PORT`).
        agents: Vec<hyperactor::ChannelAddr>,
        /// The cluster token.
        token: String,
        /// Heartbeats and timeouts.
        liveness: hyperactor_mesh::remote::Liveness,
    },
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox {
            memory_bytes: 256 << 20,
            deadline: Duration::from_secs(300),
            call_timeout: Duration::from_secs(60),
            max_procs: 64,
            placement: Placement::InProcess,
            fanout: 16,
            handler_timeout: None,
            grants: Grants::default(),
            max_instances: DEFAULT_MAX_INSTANCES,
            dumps: None,
            debug: None,
            debug_engine: false,
            live: Default::default(),
        }
    }
}

/// Why a program could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The system's reason.
        source: std::io::Error,
    },
    /// The bytes are not WebAssembly at all.
    #[error(
        "{path} is not a WebAssembly file (it does not start with \\0asm); build the program with `cargo build --release --target wasm32-wasip2`"
    )]
    NotWasm {
        /// The file.
        path: PathBuf,
    },
    /// A core module, not a component.
    /// The file is compiled machine code (from `wasmtime compile` or a
    /// cache), which could do anything; only components are taken.
    #[error(
        "{path} is a precompiled artifact (native code, as `wasmtime compile` writes), not a component; give the .wasm component itself"
    )]
    Precompiled {
        /// The file.
        path: PathBuf,
    },
    #[error(
        "{path} is a core WebAssembly module, not a component; build it for the wasm32-wasip2 target, which makes components"
    )]
    CoreModule {
        /// The file.
        path: PathBuf,
    },
    /// The component's initial memory is larger than the cap.
    #[error(
        "{path} needs at least {needed_mib} MiB of linear memory (the initial size of its memory), more than the cap of {cap_mib} MiB per instance; raise --memory to {needed_mib} or more",
        needed_mib = needed.div_ceil(1 << 20),
        cap_mib = cap >> 20
    )]
    MemoryCap {
        /// The file.
        path: PathBuf,
        /// The bytes its largest memory starts with.
        needed: u64,
        /// The cap, in bytes.
        cap: usize,
    },
    /// The component's instances do not fit the engine's pool.
    #[error("{path} does not fit this host: {reason}")]
    Limits {
        /// The file.
        path: PathBuf,
        /// What does not fit.
        reason: String,
    },
    /// The component imports interfaces the host does not provide.
    #[error(
        "{path} imports {} this host does not provide: {}. monarch-host provides WASI 0.2 (cli, clocks, filesystem, io, random, sockets) and the interfaces of wit/monarch.wit; build the program without the others (for ComponentizeJS, `jco componentize -d http`)",
        if missing.len() == 1 { "an interface" } else { "interfaces" },
        missing.join(", ")
    )]
    Imports {
        /// The file.
        path: PathBuf,
        /// The interfaces, as the component names them.
        missing: Vec<String>,
    },
    /// The component does not compile.
    #[error("{path} does not compile: {reason}")]
    Compile {
        /// The file.
        path: PathBuf,
        /// wasmtime's reason.
        reason: String,
    },
}

/// A compiled program.
pub struct Loaded {
    /// The compiled component.
    pub component: Component,
    /// The sha256 of its bytes, hex.
    pub sha256: String,
    /// Whether it came from the cache.
    pub cached: bool,
    /// What an instance of it takes, and what it imports.
    pub footprint: Footprint,
}

/// Component instances one engine holds at once unless `--max-instances`
/// says otherwise: the controller and every actor in one process.
pub const DEFAULT_MAX_INSTANCES: u32 = 1200;

/// What an engine's pool holds: how many component instances, and what
/// each of them may allocate. Sized from the program where the program is
/// known ([`PoolShape::for_program`]), so that 1,200 instances of an
/// interpreter (componentize-py makes 14 core instances per component,
/// QuickJS 9) fit as well as 1,200 of a Rust program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PoolShape {
    /// Component instances at once.
    pub instances: u32,
    /// Core module instances per component instance.
    pub core_instances: u32,
    /// Linear memories per component instance.
    pub memories: u32,
    /// Tables per component instance.
    pub tables: u32,
    /// Elements of one table at most.
    pub table_elements: usize,
    /// Bytes of one linear memory at most.
    pub memory_bytes: usize,
}

impl PoolShape {
    /// Room for `instances` instances of a program that needs `needs`, each
    /// memory capped at `memory_bytes`. Counts are rounded up to powers of
    /// two, so that programs of one kind share a shape; core instances and
    /// tables get twice what was counted (wasmtime adds adapter modules
    /// between nested components, and neither costs anything unused),
    /// memories what was counted (each slot reserves 4 GiB of address space).
    pub fn for_program(needs: &Needs, instances: u32, memory_bytes: usize) -> PoolShape {
        let table_elements = usize::try_from(needs.initial_table)
            .unwrap_or(usize::MAX)
            .max(1)
            .next_power_of_two()
            .max(DEFAULT_TABLE_ELEMENTS);
        PoolShape {
            instances: instances.max(1),
            core_instances: needs
                .core_instances
                .saturating_mul(2)
                .next_power_of_two()
                .max(8),
            memories: needs.memories.max(1).next_power_of_two(),
            tables: needs.tables.saturating_mul(2).next_power_of_two().max(4),
            table_elements,
            memory_bytes,
        }
    }

    /// Room for `instances` instances of programs not known yet (a
    /// server's controllers): as much as the interpreters above need.
    pub fn any_program(instances: u32, memory_bytes: usize) -> PoolShape {
        PoolShape {
            instances: instances.max(1),
            core_instances: 32,
            memories: 2,
            tables: 8,
            table_elements: DEFAULT_TABLE_ELEMENTS,
            memory_bytes,
        }
    }

    /// Whether an instance of a program that needs `needs` fits in one of
    /// this pool's slots.
    pub fn fits(&self, needs: &Needs) -> bool {
        needs.core_instances <= self.core_instances
            && needs.memories <= self.memories
            && needs.tables <= self.tables
            && needs.initial_table <= self.table_elements as u64
    }
}

/// wasmtime's default for the elements of one pooled table.
const DEFAULT_TABLE_ELEMENTS: usize = 20_000;

/// An engine's pool: its shape, and the component instances taken from it
/// now, counted by [`Pool::reserve`] before an instance is made, so that a
/// full pool is refused with a message that names the limit.
#[derive(Debug)]
pub struct Pool {
    /// What the pool holds.
    pub shape: PoolShape,
    live: std::sync::atomic::AtomicU32,
}

/// One component instance's place in a [`Pool`], given back when dropped.
#[derive(Debug)]
pub struct Slot(Arc<Pool>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Pool {
    /// Takes a place for one more component instance, unless all
    /// [`PoolShape::instances`] are taken; the error says so, naming the
    /// limit and `--max-instances`.
    pub fn reserve(self: &Arc<Self>) -> Result<Slot, String> {
        self.try_reserve()
            .ok_or_else(|| pool_full(self.shape.instances))
    }

    /// Takes a place for one more component instance, or `None` when all
    /// [`PoolShape::instances`] are taken.
    pub fn try_reserve(self: &Arc<Self>) -> Option<Slot> {
        let limit = self.shape.instances;
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |live| {
                (live < limit).then_some(live + 1)
            })
            .ok()
            .map(|_| Slot(self.clone()))
    }

    /// The component instances taken now.
    pub fn live(&self) -> u32 {
        self.live.load(Ordering::Acquire)
    }
}

/// Why a process with room for `limit` component instances can take no
/// more.
pub fn pool_full(limit: u32) -> String {
    format!(
        "this process's instance pool is full: it holds {limit} component instances (the controller's and actors' in one process; set by --max-instances) and all are in use; spawn fewer actors per proc, or raise --max-instances"
    )
}

/// The pools of the engines [`pooled_engine`] made, by engine.
static POOLS: Mutex<Vec<(wasmtime::EngineWeak, Arc<Pool>)>> = Mutex::new(Vec::new());

/// The pool of `engine`, if [`pooled_engine`] made it.
pub fn pool(engine: &Engine) -> Option<Arc<Pool>> {
    let pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
    pools.iter().find_map(|(weak, pool)| {
        let other = weak.upgrade()?;
        Engine::same(&other, engine).then(|| pool.clone())
    })
}

/// An engine for programs not known yet, [`DEFAULT_MAX_INSTANCES`] of them
/// at once with `memory_bytes` of linear memory each
/// ([`PoolShape::any_program`]).
pub fn new_engine(memory_bytes: usize) -> wasmtime::Result<Engine> {
    pooled_engine(&PoolShape::any_program(DEFAULT_MAX_INSTANCES, memory_bytes))
}

/// An engine for the programs of this host, with a pool of instances of
/// `shape`, so that spawning an actor reuses prepared memory instead of
/// mapping it anew. The pool's limits are counters and address space
/// reserved up front (a memory slot takes 4 GiB of it, mostly unmapped);
/// only what instances touch is resident.
pub fn pooled_engine(shape: &PoolShape) -> wasmtime::Result<Engine> {
    pooled(shape, false)
}

/// [`pooled_engine`] with guest-debug instrumentation, for the debug
/// engine of `run --debug` ([`crate::debug::engine`]): every Wasm
/// instruction can take a breakpoint, every frame's locals can be read, and
/// traps stop before they unwind. It compiles about 3 times slower and runs
/// 2 to 6 times slower, so that it is a second engine, never the one a
/// normal run uses; its compiled forms are cached apart (the compatibility
/// hash covers the setting).
pub fn pooled_debug_engine(shape: &PoolShape) -> wasmtime::Result<Engine> {
    let engine = pooled(shape, true)?;
    crate::debug::engine::remember(&engine);
    Ok(engine)
}

fn pooled(shape: &PoolShape, guest_debug: bool) -> wasmtime::Result<Engine> {
    let n = shape.instances;
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(n)
        .total_core_instances(n.saturating_mul(shape.core_instances))
        .total_memories(n.saturating_mul(shape.memories))
        .total_tables(n.saturating_mul(shape.tables))
        .total_stacks(n)
        .table_elements(shape.table_elements)
        .max_memory_size(shape.memory_bytes);
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    // A trap carries a core dump of its store, and its backtrace names
    // files and lines where the program has DWARF, for post-mortem records
    // (`debug::dumps`). Neither costs anything until a trap; the line tables
    // are kept in the compiled form (part of the compile cache key).
    config.coredump_on_trap(true);
    config.wasm_backtrace_details(wasmtime::WasmBacktraceDetails::Enable);
    if guest_debug {
        config.guest_debug(true);
    }
    let engine = Engine::new(&config)?;
    let mut pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
    pools.retain(|(weak, _)| weak.upgrade().is_some());
    pools.push((
        engine.weak(),
        Arc::new(Pool {
            shape: *shape,
            live: Default::default(),
        }),
    ));
    Ok(engine)
}

/// Advances the engine's epoch every [`EPOCH_TICK`] on a thread of its own,
/// for as long as the engine lives.
///
/// The thread is a bare POSIX thread, not a `std::thread`: the standard
/// library sets up each thread it starts for stack overflows (an
/// alternate signal stack, mapped and guarded, and the C library's own
/// heap for that thread, made on the first `malloc` there), and the global
/// allocator sets up a heap of its own on the thread's first allocation;
/// for a loop that only adds to a counter and sleeps, that was 7 % of a
/// forked proc's CPU (docs/benchmarks.md, "Fresh meshes, 2026-12-07
/// (evening)"). The loop allocates nothing and cannot panic.
pub fn start_epoch_ticker(engine: &Engine) {
    extern "C" fn tick(weak: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: the box `start_epoch_ticker` leaked for this thread.
        let weak = unsafe { Box::from_raw(weak.cast::<wasmtime::EngineWeak>()) };
        // Named from within: naming another thread goes through
        // `/proc/self/task/TID/comm`, an open and a write, and leaves
        // dentries that whoever reaps the proc must clear.
        // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most
        // 16 bytes.
        unsafe { libc::prctl(libc::PR_SET_NAME, c"monarch-epoch".as_ptr()) };
        let pause = libc::timespec {
            tv_sec: EPOCH_TICK.as_secs() as libc::time_t,
            tv_nsec: EPOCH_TICK.subsec_nanos() as libc::c_long,
        };
        while let Some(engine) = weak.upgrade() {
            engine.increment_epoch();
            drop(engine);
            // SAFETY: nanosleep(2) with a valid duration; an early wake
            // (a signal) only makes this tick early.
            unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
        }
        std::ptr::null_mut()
    }
    let weak = Box::into_raw(Box::new(engine.weak())).cast::<libc::c_void>();
    // SAFETY: plain pthread calls on an attribute and a thread id this
    // frame owns; the thread takes `weak`, or it is freed here if the
    // thread could not start.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        let mut thread: libc::pthread_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        // Room for the engine's drop, should the last reference go here.
        libc::pthread_attr_setstacksize(&mut attr, 256 << 10);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        let started = libc::pthread_create(&mut thread, &attr, tick, weak);
        libc::pthread_attr_destroy(&mut attr);
        if started != 0 {
            drop(Box::from_raw(weak.cast::<wasmtime::EngineWeak>()));
        }
    }
}

/// Where compiled components are kept: `$MONARCH_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/monarch-host`, else `~/.cache/monarch-host`.
pub fn cache_dir() -> Option<PathBuf> {
    hyperactor_mesh::exe::cache_dir()
}

/// Reads, checks and compiles the program at `path`, through the cache.
/// The file is mapped, not read into the heap: a proc that loads a
/// program from its host's blob store keeps no copy of its bytes.
pub fn load(engine: &Engine, path: &Path) -> Result<Loaded, LoadError> {
    let read_error = |source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let bytes = Mapped::open(path).map_err(read_error)?;
    load_bytes(engine, path, &bytes)
}

/// Checks `bytes` (named `path` in errors) and compiles them, through the
/// cache. What can be told from the bytes is checked before compiling,
/// which takes seconds for an interpreter: that they are a component, that
/// its memories fit the engine's cap, that its instances fit the engine's
/// pool, and that the host provides every interface it imports.
pub fn load_bytes(engine: &Engine, path: &Path, bytes: &[u8]) -> Result<Loaded, LoadError> {
    let footprint = inspect(path, bytes)?;
    let linker = crate::host::linker(engine).map_err(|e| LoadError::Compile {
        path: path.to_path_buf(),
        reason: format!("the host's imports cannot be linked: {e:#}"),
    })?;
    let sha256 = hex(&Sha256::digest(bytes));
    load_inspected(engine, &linker, path, bytes, footprint, sha256)
}

/// [`load_bytes`] for bytes [`inspect`]ed already (`footprint`) whose
/// sha256 is known (a blob is named by its own), checking imports against
/// `linker`, this engine's: a proc that loads a program parses, hashes and
/// links it once, not twice.
pub fn load_inspected(
    engine: &Engine,
    linker: &Linker<crate::host::HostState>,
    path: &Path,
    bytes: &[u8],
    footprint: Footprint,
    sha256: String,
) -> Result<Loaded, LoadError> {
    if let Some(pool) = pool(engine) {
        check_fits(path, &footprint.needs, &pool.shape)?;
    }
    let cache_file = cache_file(engine, &sha256);
    if let Some(file) = &cache_file
        && let Some(component) = deserialize_cached(engine, file)
    {
        return Ok(Loaded {
            component,
            sha256,
            cached: true,
            footprint,
        });
    }
    // Only before compiling: a compiled form in the cache passed this
    // check when it was compiled, and probing costs a compile of its own
    // for each interface (a fresh proc's largest start-up cost, AL-6). A
    // program the host cannot link is still refused by `instantiate_pre`,
    // naming the import.
    let missing = missing_imports(linker, &footprint.interfaces);
    if !missing.is_empty() {
        return Err(LoadError::Imports {
            path: path.to_path_buf(),
            missing,
        });
    }
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |name| name.to_string_lossy().into_owned(),
    );
    let compiling = crate::progress::spinner(format!("compiling {name}"));
    let component = Component::new(engine, bytes).map_err(|e| LoadError::Compile {
        path: path.to_path_buf(),
        reason: format!("{e:#}"),
    })?;
    let summary = format!("compiled {name} in {} ms", compiling.elapsed().as_millis());
    compiling.finish(&summary);
    if let Some(file) = &cache_file {
        store_in_cache(&component, file);
    }
    Ok(Loaded {
        component,
        sha256,
        cached: false,
        footprint,
    })
}

/// [`load_inspected`] where the compiled form is in the cache, and `None`
/// where it is not: it never compiles, and so starts no thread (a fork
/// server loads programs so before it forks, AL-7).
pub fn load_cached(
    engine: &Engine,
    path: &Path,
    footprint: Footprint,
    sha256: String,
) -> Result<Option<Loaded>, LoadError> {
    if let Some(pool) = pool(engine) {
        check_fits(path, &footprint.needs, &pool.shape)?;
    }
    let Some(component) =
        cache_file(engine, &sha256).and_then(|file| deserialize_cached(engine, &file))
    else {
        return Ok(None);
    };
    Ok(Some(Loaded {
        component,
        sha256,
        cached: true,
        footprint,
    }))
}

/// Where the compiled form of the program `sha256` for `engine` is
/// cached: keyed by both, and by the engine's compatibility hash.
fn cache_file(engine: &Engine, sha256: &str) -> Option<PathBuf> {
    cache_dir().map(|dir| {
        let mut key = Sha256::new();
        key.update(sha256.as_bytes());
        std::hash::Hash::hash(
            &engine.precompile_compatibility_hash(),
            &mut HashWriter(&mut key),
        );
        dir.join(format!("{}.cwasm", hex(&key.finalize())))
    })
}

/// The compiled form in the cache `file`, if it is there and usable.
fn deserialize_cached(engine: &Engine, file: &Path) -> Option<Component> {
    if !file.exists() {
        return None;
    }
    // SAFETY: the cache holds only what `Component::serialize` of this
    // host wrote, keyed by the engine's compatibility hash; a file that
    // does not deserialize is compiled again and overwritten. The file is
    // mapped, so the procs of a host share its pages.
    match unsafe { Component::deserialize_file(engine, file) } {
        Ok(component) => Some(component),
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %e, "cached component unusable; compiling again");
            None
        }
    }
}

/// Checks that `bytes` are a component, and reads its [`Footprint`].
pub fn inspect(path: &Path, bytes: &[u8]) -> Result<Footprint, LoadError> {
    check_header(path, bytes)?;
    footprint(bytes).map_err(|reason| LoadError::Compile {
        path: path.to_path_buf(),
        reason,
    })
}

// Kept here, not in footprint.rs, which the fuzz targets share.
impl Footprint {
    /// The first line of a [`Footprint::to_note`].
    const NOTE: &'static str = "monarch-footprint 1";

    /// This footprint as a few lines of text: a header, the needs as five
    /// numbers, then one interface a line.
    pub fn to_note(&self) -> String {
        let n = &self.needs;
        let mut note = format!(
            "{}\n{} {} {} {} {}\n",
            Self::NOTE,
            n.core_instances,
            n.memories,
            n.tables,
            n.initial_memory,
            n.initial_table
        );
        for interface in &self.interfaces {
            note.push_str(interface);
            note.push('\n');
        }
        note
    }

    /// Reads a [`Footprint::to_note`] back; `None` for anything else.
    pub fn from_note(note: &str) -> Option<Footprint> {
        let mut lines = note.lines();
        if lines.next()? != Self::NOTE {
            return None;
        }
        let numbers: Vec<u64> = lines
            .next()?
            .split(' ')
            .map(|n| n.parse().ok())
            .collect::<Option<_>>()?;
        let [
            core_instances,
            memories,
            tables,
            initial_memory,
            initial_table,
        ] = numbers[..]
        else {
            return None;
        };
        let interfaces: Vec<String> = lines.map(String::from).collect();
        if !note.ends_with('\n') || interfaces.iter().any(|i| i.is_empty()) {
            return None;
        }
        Some(Footprint {
            needs: Needs {
                core_instances: u32::try_from(core_instances).ok()?,
                memories: u32::try_from(memories).ok()?,
                tables: u32::try_from(tables).ok()?,
                initial_memory,
                initial_table,
            },
            interfaces,
        })
    }
}

/// The [`Footprint`] of the blob at `path`, whose name is its sha256 and
/// whose bytes never change: read from the note beside it
/// (`SHA.footprint`) where a process of this host wrote one, else read
/// from `bytes` ([`inspect`]) and noted, so that a host's procs parse a
/// program once between them rather than once each (AL-6). A note that
/// cannot be read is ignored and written again.
pub fn inspect_blob(path: &Path, bytes: &[u8]) -> Result<Footprint, LoadError> {
    let note = path.with_extension("footprint");
    if let Some(footprint) = std::fs::read_to_string(&note)
        .ok()
        .and_then(|text| Footprint::from_note(&text))
    {
        return Ok(footprint);
    }
    let footprint = inspect(path, bytes)?;
    // Written whole under another name, then renamed: a reader sees the
    // whole note or none.
    let partial = note.with_extension(format!("footprint.{}", std::process::id()));
    let written = std::fs::write(&partial, footprint.to_note())
        .and_then(|()| std::fs::rename(&partial, &note));
    if let Err(e) = written {
        std::fs::remove_file(&partial).ok();
        tracing::debug!(note = %note.display(), error = %e, "cannot note a program's footprint");
    }
    Ok(footprint)
}

/// Refuses a program whose instances cannot be made in a pool of `shape`:
/// an initial memory larger than the cap (it would compile, then fail to
/// instantiate), or more core instances, memories or tables than a slot
/// holds.
pub fn check_fits(path: &Path, needs: &Needs, shape: &PoolShape) -> Result<(), LoadError> {
    if needs.initial_memory > shape.memory_bytes as u64 {
        return Err(LoadError::MemoryCap {
            path: path.to_path_buf(),
            needed: needs.initial_memory,
            cap: shape.memory_bytes,
        });
    }
    if !shape.fits(needs) {
        return Err(LoadError::Limits {
            path: path.to_path_buf(),
            reason: format!(
                "an instance of it makes {} core instances, {} memories and {} tables (the largest of {} elements); this host's pool gives an instance at most {}, {}, {} and {}",
                needs.core_instances,
                needs.memories,
                needs.tables,
                needs.initial_table,
                shape.core_instances,
                shape.memories,
                shape.tables,
                shape.table_elements
            ),
        });
    }
    Ok(())
}

/// The interfaces among `interfaces` that `linker` does not provide,
/// found without compiling the program: each name is imported, as a
/// function, by a probe component that has nothing else (it compiles in
/// microseconds). The linker's lookup follows its own rules (a 0.2.x
/// import finds the 0.2 interface the host has); then a name it has is
/// refused because it is an instance, not a function, and a name it lacks
/// because nothing implements it. Whether what it has matches the
/// program's types is left to `instantiate_pre` after compiling.
fn missing_imports<T>(linker: &Linker<T>, interfaces: &[String]) -> Vec<String> {
    interfaces
        .iter()
        .filter(|name| {
            let Ok(probe) = Component::new(linker.engine(), probe(name)) else {
                return false;
            };
            match linker.instantiate_pre(&probe) {
                Ok(_) => false,
                Err(e) => e
                    .root_cause()
                    .to_string()
                    .contains("implementation is missing"),
            }
        })
        .cloned()
        .collect()
}

/// A component that imports `name` as a function of no parameters and no
/// results, and has nothing else.
fn probe(name: &str) -> Vec<u8> {
    fn leb(out: &mut Vec<u8>, mut n: usize) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    // The header of a component; a type section with one type, `func()`.
    let mut out = b"\0asm\x0d\x00\x01\x00".to_vec();
    out.extend([7, 5, 1, 0x40, 0, 1, 0]);
    // An import section: `name`, a function of type 0.
    let mut imports = vec![1, 0];
    leb(&mut imports, name.len());
    imports.extend(name.as_bytes());
    imports.extend([0x01, 0]);
    out.push(10);
    leb(&mut out, imports.len());
    out.extend(imports);
    out
}

/// A file mapped read-only: its pages are the page cache's, shared with
/// every process that maps it, and no longer resident once unmapped.
pub(crate) struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only and owned; nothing aliases it mutably.
unsafe impl Send for Mapped {}
// SAFETY: as above; shared reads of read-only memory are safe.
unsafe impl Sync for Mapped {}

impl Mapped {
    pub(crate) fn open(path: &Path) -> std::io::Result<Mapped> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path)?;
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| std::io::Error::other("the file is too large to map"))?;
        if len == 0 {
            return Ok(Mapped {
                ptr: std::ptr::null_mut(),
                len,
            });
        }
        // SAFETY: a fresh private read-only mapping of a file we opened;
        // the blob store and the cache replace files by renaming, never
        // by writing them in place, so the mapped bytes do not change.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapped { ptr, len })
    }
}

impl std::ops::Deref for Mapped {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` maps `len` readable bytes for as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly what `open` mapped.
            unsafe { libc::munmap(self.ptr, self.len) };
        }
    }
}

mod footprint;
pub use footprint::{Footprint, Needs, footprint};

fn check_header(path: &Path, bytes: &[u8]) -> Result<(), LoadError> {
    if bytes.starts_with(b"\x7fELF") {
        return Err(LoadError::Precompiled {
            path: path.to_path_buf(),
        });
    }
    if bytes.len() < 8 || &bytes[0..4] != b"\0asm" {
        return Err(LoadError::NotWasm {
            path: path.to_path_buf(),
        });
    }
    // Core modules are version 1, layer 0; components carry layer 1.
    if bytes[6..8] == [0, 0] {
        return Err(LoadError::CoreModule {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

fn store_in_cache(component: &Component, file: &Path) {
    let written = component
        .serialize()
        .map_err(|e| e.to_string())
        .and_then(|bytes| {
            let dir = file.parent().ok_or("no cache directory")?;
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
            static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let nth = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let partial = file.with_extension(format!("partial-{}-{nth}", std::process::id()));
            std::fs::write(&partial, bytes).map_err(|e| e.to_string())?;
            std::fs::rename(&partial, file).map_err(|e| e.to_string())
        });
    if let Err(e) = written {
        tracing::warn!(file = %file.display(), error = %e, "could not cache the compiled component");
    }
}

/// The sha256 of `bytes`, hex: how programs are named to procs.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct HashWriter<'a>(&'a mut Sha256);

impl std::hash::Hasher for HashWriter<'_> {
    fn finish(&self) -> u64 {
        0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_core_modules_are_refused_by_name() {
        let engine = pooled_engine(&PoolShape::any_program(4, 64 << 20)).unwrap();
        let path = Path::new("app.wasm");
        assert!(matches!(
            load_bytes(&engine, path, b"hello, world").err(),
            Some(LoadError::NotWasm { .. })
        ));
        assert!(matches!(
            load_bytes(&engine, path, b"").err(),
            Some(LoadError::NotWasm { .. })
        ));
        let core = b"\0asm\x01\0\0\0";
        let err = load_bytes(&engine, path, core).err().unwrap();
        assert!(matches!(err, LoadError::CoreModule { .. }));
        assert!(err.to_string().contains("wasm32-wasip2"), "{err}");
    }
}

#[cfg(test)]
mod import_tests {
    use super::*;

    /// The linker provides WASI 0.2 (any 0.2.x) and monarch:host, and not
    /// wasi:http; what it lacks is named, in the program's order.
    /// AL-6: a blob's footprint is noted beside it once, and read from
    /// the note after; a note that is not one is read from the bytes again
    /// and rewritten.
    #[test]
    fn a_blobs_footprint_is_noted_once_and_read_back() {
        let dir = std::env::temp_dir().join(format!("monarch-footprint-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
        let blob = dir.join("abc.blob");
        let bytes = probe("wasi:cli/stdout@0.2.3");
        std::fs::write(&blob, &bytes).unwrap();
        let read = inspect_blob(&blob, &bytes).unwrap();
        assert_eq!(read, inspect(&blob, &bytes).unwrap());
        let note = dir.join("abc.footprint");
        assert_eq!(
            Footprint::from_note(&std::fs::read_to_string(&note).unwrap()),
            Some(read.clone())
        );
        let other = Footprint {
            needs: Needs {
                core_instances: 3,
                memories: 1,
                tables: 2,
                initial_memory: 1 << 20,
                initial_table: 7,
            },
            interfaces: vec![
                "wasi:io/streams@0.2.3".into(),
                "monarch:host/mesh@0.2.0".into(),
            ],
        };
        assert_eq!(Footprint::from_note(&other.to_note()), Some(other.clone()));
        std::fs::write(&note, other.to_note()).unwrap();
        assert_eq!(
            inspect_blob(&blob, &bytes).unwrap(),
            other,
            "the note is read, not the bytes"
        );
        for garbage in [
            "",
            "monarch-footprint 1\n1 2 3\n",
            "monarch-footprint 1\n1 2 3 4 x\n",
            "hello\n",
        ] {
            assert_eq!(Footprint::from_note(garbage), None, "{garbage:?}");
            std::fs::write(&note, garbage).unwrap();
            assert_eq!(inspect_blob(&blob, &bytes).unwrap(), read);
            assert_eq!(std::fs::read_to_string(&note).unwrap(), read.to_note());
        }
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 2, "no partial notes left: {left:?}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn imports_the_host_lacks_are_named_before_compiling() {
        let names: Vec<String> = [
            "wasi:cli/stdout@0.2.3",
            "wasi:http/types@0.2.3",
            "monarch:host/mesh@0.2.0",
            "wasi:io/streams@0.2.9",
            "wasi:http/outgoing-handler@0.2.3",
        ]
        .map(String::from)
        .into();
        let engine = new_engine(64 << 20).unwrap();
        let linker = crate::host::linker(&engine).unwrap();
        assert_eq!(
            missing_imports(&linker, &names),
            ["wasi:http/types@0.2.3", "wasi:http/outgoing-handler@0.2.3"]
        );
        let read = footprint(&probe(&names[1])).unwrap();
        assert!(read.interfaces.is_empty(), "a function is not an interface");
        assert_eq!(read.needs, Needs::default());
    }
}

#[cfg(test)]
mod cache_tests {
    use super::*;

    /// A host compiles a program once, whatever memory cap and pool its
    /// procs run with: neither may change the compiled form's cache key.
    #[test]
    fn the_memory_cap_and_pool_do_not_change_the_cache_key() {
        use std::hash::{Hash, Hasher};
        let key = |shape: PoolShape| {
            let engine = pooled_engine(&shape).unwrap();
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            engine.precompile_compatibility_hash().hash(&mut hasher);
            hasher.finish()
        };
        let python = Needs {
            core_instances: 14,
            memories: 1,
            tables: 2,
            initial_memory: 12 << 20,
            initial_table: 5726,
        };
        assert_eq!(
            key(PoolShape::any_program(8, 64 << 20)),
            key(PoolShape::any_program(8, 256 << 20))
        );
        assert_eq!(
            key(PoolShape::any_program(8, 64 << 20)),
            key(PoolShape::for_program(&python, 16, 64 << 20))
        );
    }
}

#[cfg(test)]
mod ticker_tests {
    use super::*;

    /// Threads of this process named `name`.
    fn named(name: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .map(|tasks| {
                tasks
                    .flatten()
                    .filter(|t| {
                        std::fs::read_to_string(t.path().join("comm"))
                            .is_ok_and(|comm| comm.trim_end() == name)
                    })
                    .count()
            })
            .unwrap_or(0)
    }

    /// The epoch ticker shows in `ps` and `top` as `monarch-epoch`, moves
    /// its engine's epoch, and ends once the engine is dropped.
    #[test]
    fn the_ticker_is_named_ticks_and_ends_with_its_engine() {
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        let engine = Engine::new(&config).unwrap();
        let before = named("monarch-epoch");
        start_epoch_ticker(&engine);
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while named("monarch-epoch") <= before {
            assert!(
                std::time::Instant::now() < until,
                "no thread named monarch-epoch"
            );
            std::thread::sleep(EPOCH_TICK);
        }
        // A store whose deadline is one tick away traps once it passes.
        let mut store = wasmtime::Store::new(&engine, ());
        store.set_epoch_deadline(1);
        // (module (func (export "spin") (loop (br 0))))
        let spin_module: &[u8] = &[
            0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
            0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type: () -> ()
            0x03, 0x02, 0x01, 0x00, // function 0 of type 0
            0x07, 0x08, 0x01, 0x04, b's', b'p', b'i', b'n', 0x00, 0x00, // export "spin"
            0x0a, 0x09, 0x01, 0x07, 0x00, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b, // loop br 0
        ];
        let module = wasmtime::Module::new(&engine, spin_module).unwrap();
        let instance = wasmtime::Instance::new(&mut store, &module, &[]).unwrap();
        let spin = instance
            .get_typed_func::<(), ()>(&mut store, "spin")
            .unwrap();
        assert!(
            spin.call(&mut store, ()).is_err(),
            "the spin was interrupted"
        );
        drop((instance, spin, store, module, engine));
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while named("monarch-epoch") > before {
            assert!(
                std::time::Instant::now() < until,
                "the ticker outlived its engine"
            );
            std::thread::sleep(EPOCH_TICK);
        }
    }
}

//! One wasmtime engine, and loading programs into it.
//!
//! Loading checks the bytes before compiling them, so that a wrong file
//! gets an error that says what it is: not WebAssembly, a core module
//! instead of a component. Compiled components are cached on disk by the
//! sha256 of their bytes and the engine's compatibility hash, so a program
//! is compiled once per machine and engine build.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
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
}

/// Instances one engine holds at once (the controller and every actor).
pub const MAX_INSTANCES: u32 = 1200;

/// The engine every program and actor of this host runs on. Instances come
/// from a pool sized for [`MAX_INSTANCES`] with `memory_bytes` of linear
/// memory each, so that spawning an actor reuses prepared memory instead
/// of mapping it anew.
pub fn new_engine(memory_bytes: usize) -> wasmtime::Result<Engine> {
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(MAX_INSTANCES)
        .total_core_instances(MAX_INSTANCES * 4)
        .total_memories(MAX_INSTANCES)
        .total_tables(MAX_INSTANCES * 4)
        .total_stacks(MAX_INSTANCES)
        .max_memory_size(memory_bytes);
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config)
}

/// Advances the engine's epoch every [`EPOCH_TICK`] on a thread of its own,
/// for as long as the engine lives.
pub fn start_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("monarch-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })
        .ok();
}

/// Where compiled components are kept: `$MONARCH_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/monarch-host`, else `~/.cache/monarch-host`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("MONARCH_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("monarch-host"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/monarch-host"))
}

/// Reads, checks and compiles the program at `path`, through the cache.
pub fn load(engine: &Engine, path: &Path) -> Result<Loaded, LoadError> {
    let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    load_bytes(engine, path, &bytes)
}

/// Checks and compiles `bytes` (named `path` in errors), through the cache.
pub fn load_bytes(engine: &Engine, path: &Path, bytes: &[u8]) -> Result<Loaded, LoadError> {
    check_header(path, bytes)?;
    let sha256 = hex(&Sha256::digest(bytes));
    let cache_file = cache_dir().map(|dir| {
        let mut key = Sha256::new();
        key.update(sha256.as_bytes());
        std::hash::Hash::hash(
            &engine.precompile_compatibility_hash(),
            &mut HashWriter(&mut key),
        );
        dir.join(format!("{}.cwasm", hex(&key.finalize())))
    });
    if let Some(file) = &cache_file
        && file.exists()
    {
        // SAFETY: the cache holds only what `Component::serialize` of this
        // host wrote, keyed by the engine's compatibility hash; a file that
        // does not deserialize is compiled again and overwritten.
        match unsafe { Component::deserialize_file(engine, file) } {
            Ok(component) => {
                return Ok(Loaded {
                    component,
                    sha256,
                    cached: true,
                });
            }
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "cached component unusable; compiling again")
            }
        }
    }
    let component = Component::new(engine, bytes).map_err(|e| LoadError::Compile {
        path: path.to_path_buf(),
        reason: format!("{e:#}"),
    })?;
    if let Some(file) = &cache_file {
        store_in_cache(&component, file);
    }
    Ok(Loaded {
        component,
        sha256,
        cached: false,
    })
}

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
        let engine = new_engine(64 << 20).unwrap();
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
mod cache_tests {
    use super::*;

    /// A host compiles a program once, whatever memory cap its procs run
    /// with: the cap must not change the compiled form's cache key.
    #[test]
    fn the_memory_cap_does_not_change_the_cache_key() {
        use std::hash::{Hash, Hasher};
        let key = |memory: usize| {
            let engine = new_engine(memory).unwrap();
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            engine.precompile_compatibility_hash().hash(&mut hasher);
            hasher.finish()
        };
        assert_eq!(key(64 << 20), key(256 << 20));
    }
}

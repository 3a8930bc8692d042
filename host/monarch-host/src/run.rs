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

use crate::bindings::{Program, ProgramPre};
use crate::engine::{self, LoadError, Placement, Sandbox};
use crate::host::{Cluster, HostState, LogSink, ProgramBytes, linker, new_store};

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The program could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The component is not a program of this host's world.
    #[error(
        "{path} is not a monarch-host program: {reason}. Programs target the WIT world `monarch:host/program` in wit/monarch.wit (exports `run` and `actor-class`)"
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
    /// The host failed.
    #[error("host error: {0}")]
    Host(String),
}

/// Loads the program at `path` and runs its controller with `args`; guest
/// log lines go to `log`.
pub async fn run_program(
    path: &Path,
    args: &[String],
    sandbox: Sandbox,
    log: LogSink,
) -> Result<(), RunError> {
    let engine =
        engine::new_engine(sandbox.memory_bytes).map_err(|e| RunError::Host(format!("{e:#}")))?;
    engine::start_epoch_ticker(&engine);
    let started = Instant::now();
    let loaded = engine::load(&engine, path)?;
    tracing::info!(
        sha256 = %loaded.sha256,
        cached = loaded.cached,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "program loaded"
    );
    let linker = linker(&engine).map_err(|e| RunError::Host(format!("{e:#}")))?;
    let wrong_world = |e: wasmtime::Error| RunError::WrongWorld {
        path: path.display().to_string(),
        reason: format!("{e:#}"),
    };
    let pre = linker
        .instantiate_pre(&loaded.component)
        .map_err(wrong_world)?;
    let pre = ProgramPre::new(pre).map_err(wrong_world)?;
    let deadline = sandbox.deadline;
    let program = ProgramBytes {
        sha256: loaded.sha256.clone(),
        bytes: Arc::new(std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        })?),
    };
    let placement = sandbox.placement.clone();
    let cluster = Cluster::new(engine, pre, sandbox, log.clone(), program, None);
    let client = start_client(&cluster, &placement, log)
        .await
        .map_err(RunError::Host)?;
    cluster.set_client(client.clone());
    let mailbox = client.mailbox().clone();
    let mut state = HostState::new(cluster.clone(), &mailbox, "controller".into());
    state.watch(client.subscribe());
    let mut store = new_store(&cluster, state);
    let outcome = tokio::time::timeout(deadline, async {
        let program: Program = cluster
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| RunError::Trap(format!("{e:?}")))?;
        program
            .call_run(&mut store, args)
            .await
            .map_err(|trap| RunError::Trap(format!("{trap:?}")))?
            .map_err(RunError::Failed)
    })
    .await
    .unwrap_or(Err(RunError::Timeout(deadline)));
    let spawned = store.data_mut().take_spawned();
    drop(store);
    cluster.stop_all(spawned).await;
    outcome
}

/// The mesh client of a run: its allocator, and the controller's proc at
/// an address its procs can reach.
async fn start_client(
    cluster: &Arc<Cluster>,
    placement: &Placement,
    log: LogSink,
) -> Result<Arc<MeshClient>, String> {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let run = format!(
        "run{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    );
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
            let socket = std::env::temp_dir().join(format!("monarch-{run}.sock"));
            (format!("unix:{}", socket.display()), Arc::new(allocator))
        }
        Placement::Hosts {
            agents,
            token,
            liveness,
        } => {
            let first = agents.first().ok_or("no hosts given")?;
            let ip = local_ip_towards(first)
                .ok_or_else(|| format!("no route from this machine to {first}"))?;
            let here = |port: u16| format!("tcp:{}", std::net::SocketAddr::new(ip, port));
            let allocator = RemoteAllocator::new(
                here(0).parse().map_err(|e| format!("{e}"))?,
                agents.clone(),
                token.clone(),
                *liveness,
            )
            .await
            .map_err(|e| e.to_string())?;
            (here(0), Arc::new(allocator))
        }
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

/// Where this host keeps blobs: beside the compile cache, or in the
/// temporary directory.
pub fn blob_dir() -> PathBuf {
    engine::cache_dir()
        .unwrap_or_else(|| std::env::temp_dir().join("monarch-host"))
        .join("blobs")
}

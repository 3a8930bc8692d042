//! Running a program: the controller's store on one task, until `run`
//! returns, traps, or the deadline passes.

use std::path::Path;
use std::time::Instant;

use crate::bindings::{Program, ProgramPre};
use crate::engine::{self, LoadError, Sandbox};
use crate::host::{Cluster, HostState, LogSink, linker, new_store};

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
    let cluster = Cluster::new(engine, pre, sandbox, log);
    let proc = cluster
        .controller_proc()
        .await
        .map_err(|e| RunError::Host(format!("{e:#}")))?;
    let (mailbox, _undeliverable) = proc
        .attach("main")
        .map_err(|e| RunError::Host(e.to_string()))?;
    let state = HostState::new(cluster.clone(), mailbox, "controller".into());
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
    cluster.stop_all();
    drop(store);
    outcome
}

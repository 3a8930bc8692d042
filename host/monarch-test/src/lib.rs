//! Test a monarch-host program's actors from native `cargo test`.
//!
//! `monarch-test` loads a component, spawns its actor classes on a
//! cluster inside the test process, calls their endpoints with typed
//! payloads (serde, in the encoding of `wit/ENCODING.md`), makes faults
//! on purpose, and hands back replies, errors, failure events and log
//! lines to assert on. It is the machinery of `monarch-host test`
//! (`monarch_host::native`: the host's own implementation of the WIT
//! imports, driven natively), as a library.
//!
//! ```no_run
//! use std::time::Duration;
//! use monarch_test::{ErrorKind, KillMode, Program};
//!
//! #[derive(serde::Serialize)]
//! struct Add(i64);
//!
//! # async fn example() -> Result<(), String> {
//! let program = Program::load("target/wasm32-wasip2/release/counter.wasm")?;
//! let mut cluster = program.cluster().await?;
//! let procs = cluster.spawn_procs(&[("procs", 3)]).await?;
//! let counters = cluster.spawn(&procs, "counters", "Counter", &1i64).await?;
//! let totals: Vec<i64> = cluster.call(&counters, "add", &Add(5)).await.map_err(|e| e.message)?;
//! assert_eq!(totals, [6, 6, 6]);
//! cluster.kill(&procs, 2, KillMode::Crash).await?;
//! let failure = cluster.next_failure(Duration::from_secs(10)).await.expect("reported");
//! assert_eq!((failure.rank, failure.kind), (2, ErrorKind::ProcLost));
//! cluster.stop().await;
//! # Ok(()) }
//! ```
//!
//! The cluster's procs run inside the test process (`Placement::InProcess`),
//! so a test needs no `monarch-host` binary; a killed proc crashes as under
//! `monarch-host test --sim` (`Proc::crash`).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use monarch_host::bindings::monarch::host::faults::KillMode;
pub use monarch_host::bindings::{ErrorKind, SupervisionFailure as Failure};
pub use monarch_host::native::CallError;
use monarch_host::native::{ActorMeshId, NativeController, ProcMeshId};
use monarch_host::{Prepared, Sandbox};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A compiled program, ready to spawn clusters.
pub struct Program {
    prepared: Prepared,
}

impl Program {
    /// Loads and compiles the component at `path` (through the cache), with
    /// 256 MiB of linear memory per instance.
    pub fn load(path: impl AsRef<Path>) -> Result<Program, String> {
        let prepared =
            monarch_host::test_runner::load(path.as_ref(), 256 << 20).map_err(|e| e.to_string())?;
        Ok(Program { prepared })
    }

    /// A fresh cluster inside this process whose actors are the program's
    /// classes; calls wait up to 60 s.
    pub async fn cluster(&self) -> Result<Cluster, String> {
        self.cluster_with(Duration::from_secs(60)).await
    }

    /// [`Program::cluster`] whose calls wait up to `call_timeout`.
    pub async fn cluster_with(&self, call_timeout: Duration) -> Result<Cluster, String> {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = {
            let logs = logs.clone();
            Arc::new(move |line: &str| {
                if let Ok(mut logs) = logs.lock() {
                    logs.push(line.to_string());
                }
            })
        };
        let sandbox = Sandbox {
            call_timeout,
            ..Sandbox::default()
        };
        let controller = self
            .prepared
            .native_controller(sandbox, sink)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Cluster { controller, logs })
    }
}

/// Procs a [`Cluster`] spawned.
#[derive(Debug, Clone, Copy)]
pub struct Procs {
    id: ProcMeshId,
}

/// An actor mesh a [`Cluster`] spawned.
#[derive(Debug, Clone, Copy)]
pub struct Actors {
    id: ActorMeshId,
}

/// A cluster of procs inside the test process; see the crate docs.
pub struct Cluster {
    controller: NativeController,
    logs: Arc<Mutex<Vec<String>>>,
}

/// An argument list of one value, as the SDKs write a message or an init.
pub fn encode_args<T: Serialize>(value: &T) -> Vec<u8> {
    let mut bytes = Vec::new();
    ciborium::into_writer(&(value,), &mut bytes).expect("a value serde can write");
    bytes
}

/// A reply read as `R`; the error says what did not fit.
pub fn decode<R: DeserializeOwned>(bytes: &[u8]) -> Result<R, String> {
    ciborium::from_reader(bytes).map_err(|e| format!("the reply is not of the type asked: {e}"))
}

/// A call's error, boxed: the WIT record is large.
pub type CallFailed = Box<CallError>;

fn decode_reply<R: DeserializeOwned>(bytes: &[u8]) -> Result<R, CallFailed> {
    decode(bytes).map_err(|message| {
        Box::new(CallError {
            kind: ErrorKind::Invalid,
            origin: None,
            message,
            type_name: None,
            backtrace: None,
        })
    })
}

impl Cluster {
    /// Spawns procs in the shape `extent`, such as `[("procs", 3)]`.
    pub async fn spawn_procs(&mut self, extent: &[(&str, u32)]) -> Result<Procs, String> {
        let id = self.controller.spawn_procs(extent).await?;
        Ok(Procs { id })
    }

    /// Spawns the program's class `class` as the mesh `name`, one actor
    /// on every proc of `procs`, each made from `init`.
    pub async fn spawn<I: Serialize>(
        &mut self,
        procs: &Procs,
        name: &str,
        class: &str,
        init: &I,
    ) -> Result<Actors, String> {
        let id = self
            .controller
            .spawn(procs.id, name, class, encode_args(init))
            .await?;
        Ok(Actors { id })
    }

    /// Calls `endpoint` of every actor with `message`: the replies in rank
    /// order, or the first rank's error.
    pub async fn call<M: Serialize, R: DeserializeOwned>(
        &mut self,
        actors: &Actors,
        endpoint: &str,
        message: &M,
    ) -> Result<Vec<R>, CallFailed> {
        let replies = self
            .controller
            .call(actors.id, endpoint, encode_args(message))
            .await
            .map_err(Box::new)?;
        replies
            .into_iter()
            .map(|reply| match reply {
                Ok(bytes) => decode_reply(&bytes),
                Err(e) => Err(Box::new(e)),
            })
            .collect()
    }

    /// Calls `endpoint` of the actor at `rank` alone.
    pub async fn call_one<M: Serialize, R: DeserializeOwned>(
        &mut self,
        actors: &Actors,
        rank: u32,
        endpoint: &str,
        message: &M,
    ) -> Result<R, CallFailed> {
        let bytes = self
            .controller
            .call_one(actors.id, rank, endpoint, encode_args(message))
            .await
            .map_err(Box::new)?;
        decode_reply(&bytes)
    }

    /// Ends the proc at `rank` of `procs` as `mode` says.
    pub async fn kill(&mut self, procs: &Procs, rank: u32, mode: KillMode) -> Result<(), String> {
        self.controller.kill(procs.id, rank, mode).await
    }

    /// Cuts the procs at `ranks` off from the rest and from the test for
    /// `duration`; what they send and are sent is held until then.
    pub async fn partition(
        &mut self,
        procs: &Procs,
        ranks: &[u32],
        duration: Duration,
    ) -> Result<(), String> {
        self.controller.partition(procs.id, ranks, duration).await
    }

    /// Ends every fault among `procs` and the test now.
    pub async fn heal(&mut self, procs: &Procs) -> Result<(), String> {
        self.controller.heal(procs.id).await
    }

    /// The next failure of an actor the test spawned, waiting up to
    /// `timeout`.
    pub async fn next_failure(&mut self, timeout: Duration) -> Option<Failure> {
        self.controller.next_failure(timeout).await
    }

    /// What the actors printed so far, each line prefixed with its mesh
    /// and rank.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Stops every proc and actor the test spawned.
    pub async fn stop(self) {
        self.controller.stop().await;
    }
}

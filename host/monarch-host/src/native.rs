//! A controller written in native Rust rather than Wasm: the host's own
//! implementation of the WIT imports (`HostState`), driven from a native
//! program with no guest in between. `monarch-test` builds on it, so that a
//! user's `cargo test` can spawn a component's actor classes, call them,
//! fault them and watch their failures with the same machinery as
//! `monarch-host test`.
//!
//! - NC-1: everything a controller could do through the WIT, a native one
//!   does through the same code (the `mesh` and `faults` imports), so what
//!   it sees (replies, errors, failure events) is what a guest would see.
//! - NC-2: [`NativeController::stop`] stops what it spawned, as the end of
//!   a run does; dropping it without stopping leaves that to the cluster's
//!   own drop.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::Resource;

use crate::bindings::monarch::host::faults::{self, KillMode};
use crate::bindings::monarch::host::mesh::{self, HostActorMesh, HostProcMesh};
use crate::bindings::{Dim, Event, EventKind, Reducer, Reply, SupervisionFailure};
use crate::host::{Cluster, HostState};
use crate::mesh::{ActorMeshHandle, ProcMeshHandle};

pub use crate::bindings::CallError;

/// A proc mesh a native controller spawned (its handle's number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcMeshId(u32);

/// An actor mesh a native controller spawned (its handle's number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActorMeshId(u32);

/// What a call came to: each rank's reply (payload bytes, in the
/// encoding of `wit/ENCODING.md`) or error, in rank order.
pub type Replies = Vec<Result<Vec<u8>, CallError>>;

/// See the module docs.
pub struct NativeController {
    state: HostState,
    cluster: Arc<Cluster>,
    /// Events that came while waiting for another request's.
    pending: VecDeque<Event>,
    failures: VecDeque<SupervisionFailure>,
}

fn wasm_error(e: wasmtime::Error) -> String {
    format!("{e:#}")
}

impl NativeController {
    pub(crate) fn new(state: HostState, cluster: Arc<Cluster>) -> NativeController {
        NativeController {
            state,
            cluster,
            pending: VecDeque::new(),
            failures: VecDeque::new(),
        }
    }

    /// Spawns procs in the shape `extent` (`[("procs", 3)]`).
    pub async fn spawn_procs(&mut self, extent: &[(&str, u32)]) -> Result<ProcMeshId, String> {
        let extent = extent
            .iter()
            .map(|(name, size)| Dim {
                name: name.to_string(),
                size: *size,
            })
            .collect();
        let procs = mesh::Host::spawn_procs(&mut self.state, extent)
            .await
            .map_err(wasm_error)??;
        Ok(ProcMeshId(procs.rep()))
    }

    /// Spawns one actor of the program's class `class` on every proc of
    /// `procs`, each made from `init` (an argument list in the payload
    /// encoding), as the mesh `name`.
    pub async fn spawn(
        &mut self,
        procs: ProcMeshId,
        name: &str,
        class: &str,
        init: Vec<u8>,
    ) -> Result<ActorMeshId, String> {
        let this = Resource::<ProcMeshHandle>::new_borrow(procs.0);
        let actors = HostProcMesh::spawn(&mut self.state, this, name.into(), class.into(), init)
            .await
            .map_err(wasm_error)??;
        Ok(ActorMeshId(actors.rep()))
    }

    /// Calls `endpoint` of every actor of `actors` with `message` (an
    /// argument list in the payload encoding) and waits for every rank.
    pub async fn call(
        &mut self,
        actors: ActorMeshId,
        endpoint: &str,
        message: Vec<u8>,
    ) -> Result<Replies, CallError> {
        let this = Resource::<ActorMeshHandle>::new_borrow(actors.0);
        let id = HostActorMesh::call(
            &mut self.state,
            this,
            endpoint.into(),
            message,
            None::<Reducer>,
        )
        .await
        .map_err(|e| host_error(&e))?;
        match self.done(id).await? {
            Reply::Gathered(values) => Ok(values.values.into_iter().map(Ok).collect()),
            Reply::Single(value) => Ok(vec![Ok(value)]),
        }
    }

    /// Calls `endpoint` of the actor at `rank` of `actors` alone.
    pub async fn call_one(
        &mut self,
        actors: ActorMeshId,
        rank: u32,
        endpoint: &str,
        message: Vec<u8>,
    ) -> Result<Vec<u8>, CallError> {
        let this = Resource::<ActorMeshHandle>::new_borrow(actors.0);
        let extent = HostActorMesh::extent(&mut self.state, Resource::new_borrow(actors.0))
            .await
            .map_err(|e| host_error(&e))?;
        let (dim, size) = match extent.as_slice() {
            [dim] => (dim.name.clone(), dim.size),
            _ => {
                return Err(invalid(format!(
                    "call_one takes a mesh of one dimension; this one has {}",
                    extent.len()
                )));
            }
        };
        if rank >= size {
            return Err(invalid(format!(
                "rank {rank} is outside this mesh of {size} actors"
            )));
        }
        let slice = HostActorMesh::slice(
            &mut self.state,
            this,
            vec![crate::bindings::SliceDim {
                dim,
                select: crate::bindings::Selector::Index(rank),
            }],
        )
        .await
        .map_err(|e| host_error(&e))?
        .map_err(invalid)?;
        let one = Resource::<ActorMeshHandle>::new_borrow(slice.rep());
        let id = HostActorMesh::call_one(&mut self.state, one, endpoint.into(), message)
            .await
            .map_err(|e| host_error(&e))?;
        let reply = self.done(id).await;
        let _ = HostActorMesh::drop(&mut self.state, slice).await;
        match reply? {
            Reply::Single(value) => Ok(value),
            Reply::Gathered(mut values) if values.values.len() == 1 => Ok(values.values.remove(0)),
            Reply::Gathered(values) => Err(invalid(format!(
                "expected one reply, got {}",
                values.values.len()
            ))),
        }
    }

    /// Kills the proc at `rank` of `procs` as `mode` says (`faults.kill`).
    pub async fn kill(
        &mut self,
        procs: ProcMeshId,
        rank: u32,
        mode: KillMode,
    ) -> Result<(), String> {
        let this = Resource::<ProcMeshHandle>::new_borrow(procs.0);
        faults::Host::kill(&mut self.state, this, rank, mode)
            .await
            .map_err(wasm_error)?
    }

    /// Cuts the procs at `ranks` off from the rest of `procs` and from
    /// this controller for `duration` (`faults.partition`).
    pub async fn partition(
        &mut self,
        procs: ProcMeshId,
        ranks: &[u32],
        duration: Duration,
    ) -> Result<(), String> {
        let this = Resource::<ProcMeshHandle>::new_borrow(procs.0);
        let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        faults::Host::partition(&mut self.state, this, ranks.to_vec(), ms)
            .await
            .map_err(wasm_error)?
    }

    /// Ends every fault among `procs` and this controller (`faults.heal`).
    pub async fn heal(&mut self, procs: ProcMeshId) -> Result<(), String> {
        let this = Resource::<ProcMeshHandle>::new_borrow(procs.0);
        faults::Host::heal(&mut self.state, this)
            .await
            .map_err(wasm_error)?
    }

    /// The next failure of an actor this controller spawned, waiting up
    /// to `timeout` for one.
    pub async fn next_failure(&mut self, timeout: Duration) -> Option<SupervisionFailure> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(failure) = self.failures.pop_front() {
                return Some(failure);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            let events = mesh::Host::next_events(&mut self.state, 64, left.as_millis() as u64)
                .await
                .ok()?;
            self.sort(events);
        }
    }

    /// Stops everything this controller spawned (NC-2).
    pub async fn stop(mut self) {
        let spawned = self.state.take_spawned();
        self.cluster.stop_all(spawned).await;
    }

    fn sort(&mut self, events: Vec<Event>) {
        for event in events {
            match event.kind {
                EventKind::Failure(failure) => self.failures.push_back(failure),
                _ => self.pending.push_back(event),
            }
        }
    }

    /// Waits for the `done` event of request `id`.
    async fn done(&mut self, id: u64) -> Result<Reply, CallError> {
        loop {
            if let Some(at) = self.pending.iter().position(|e| e.id == id) {
                let event = self.pending.remove(at).expect("found");
                if let EventKind::Done(result) = event.kind {
                    return result;
                }
                continue;
            }
            let events = mesh::Host::next_events(&mut self.state, 64, 1_000)
                .await
                .map_err(|e| host_error(&e))?;
            self.sort(events);
        }
    }
}

fn invalid(message: String) -> CallError {
    CallError {
        kind: crate::bindings::ErrorKind::Invalid,
        origin: None,
        message,
        type_name: None,
        backtrace: None,
    }
}

fn host_error(e: &wasmtime::Error) -> CallError {
    CallError {
        kind: crate::bindings::ErrorKind::Stopped,
        origin: None,
        message: format!("the host ended the request: {e:#}"),
        type_name: None,
        backtrace: None,
    }
}

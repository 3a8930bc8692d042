//! Buffers on meshes: registered buffers that live on the procs of an actor
//! mesh, driven from a controller that holds only their handles.
//!
//! # The model
//!
//! Every proc that hosts RDMA buffers runs one **rdma actor** (kind
//! [`RDMA_KIND`], registered with [`register`]) and one process-wide
//! [`RdmaManager`] ([`process_manager`]), which the rdma actor and every other
//! user in the proc (the tensor workers of `monarch-tensor`) share, so that
//! a buffer registered by one can be the local side of another's transfer.
//!
//! A controller spawns the actors with [`RdmaMesh::spawn`] (one rank per
//! proc) and then, from any number of tasks at once (every method takes
//! `&self`, the mesh is `Clone + Send + Sync`, and requests are independent):
//!
//! - [`RdmaMesh::alloc`] a zeroed buffer on a rank: a [`RemoteBuffer`]
//!   (rank, proc and [`BufferHandle`]) that can travel inside payloads
//!   ([`RemoteBuffer::to_bytes`] / [`RemoteBuffer::from_bytes`]);
//! - [`RdmaMesh::write`] bytes into it and [`RdmaMesh::read`] them out
//!   (the bytes pass through the controller: for putting data in and
//!   checking it, not for bulk);
//! - [`RdmaMesh::read_into`]: the destination's proc READs the source
//!   buffer, one-sided; [`RdmaMesh::write_from`]: the source's proc WRITEs
//!   into the destination. The bytes move between the two procs' managers
//!   (memory copy in one process, ibverbs or TCP between processes); the
//!   controller sends one small command and gets one small reply;
//! - [`RdmaMesh::free`] a buffer, and [`RdmaMesh::stop`] the actors (which
//!   frees every buffer they allocated).
//!
//! A transfer names buffers by handle, so a buffer allocated through
//! another `RdmaMesh` (or decoded from a payload) works as long as its proc
//! is one of this mesh's procs.
//!
//! # Invariants
//!
//! - RM-1: every request ends with a result or an [`RdmaMeshError`] within
//!   its timeout ([`RdmaMeshOptions::timeout`] plus a grace for the hops):
//!   a dead proc fails the requests waiting on it at once, naming the rank,
//!   the proc and its exit.
//! - RM-2: the rdma actor never panics on a message: commands are
//!   validated rkyv archives ([`command::RdmaCommand::decode`]), handles are
//!   validated ([`BufferHandle::from_bytes`]), and garbage, a wrong
//!   endpoint, a buffer of another proc or an unknown buffer are error
//!   replies.
//! - RM-3: a freed buffer is deregistered at once: later transfers from or
//!   into it fail with the buffer's id (a transfer already running keeps the
//!   memory alive until it ends, RD-6).
//! - RM-4: transfers run on the process runtime ([`process_transfer`]),
//!   so the manager's listener and pooled connections outlive the runtime
//!   of any one caller (a test's, an actor's).

mod actor;
mod client;
// The fields of rkyv's archived form of the commands carry no docs.
#[allow(missing_docs)]
pub mod command;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::runtime::Runtime;
use tokio::sync::OnceCell;

use crate::{Buffer, BufferHandle, Direction, RdmaConfig, RdmaError, RdmaManager, Transfer};

pub use actor::{RDMA_KIND, RdmaActor, register};
pub use client::{RdmaMesh, RdmaMeshError, RdmaMeshOptions, RemoteBuffer};

/// The runtime that hosts the process manager's listener and every
/// transfer started through [`process_transfer`] (RM-4). It lives as long
/// as the process.
fn process_runtime() -> Result<&'static Runtime, RdmaError> {
    static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let threads = std::thread::available_parallelism()
                .map(|n| n.get().min(4))
                .unwrap_or(2);
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .thread_name("monarch-rdma")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|reason| RdmaError::Io {
            what: "starting the RDMA runtime".into(),
            reason: reason.clone(),
        })
}

/// This process's [`RdmaManager`], made on first use with
/// [`RdmaConfig::default`] and shared by every caller (clones share it).
/// It runs on a runtime of its own that lives as long as the process, so
/// it serves peers whichever runtime first asked for it. A failure to
/// start is returned and the next call tries again.
pub async fn process_manager() -> Result<RdmaManager, RdmaError> {
    static MANAGER: OnceCell<RdmaManager> = OnceCell::const_new();
    MANAGER
        .get_or_try_init(|| async {
            let runtime = process_runtime()?;
            runtime
                .spawn(RdmaManager::new(RdmaConfig::default()))
                .await
                .map_err(|e| RdmaError::Io {
                    what: "starting the process RDMA manager".into(),
                    reason: e.to_string(),
                })?
        })
        .await
        .cloned()
}

/// A transfer whose local buffer is shared, so that it can run on another
/// task: see [`process_transfer`].
#[derive(Debug, Clone)]
pub struct OwnedTransfer {
    /// READ (remote into local) or WRITE (local into remote).
    pub direction: Direction,
    /// The local buffer; it must be registered with [`process_manager`].
    pub local: Arc<Buffer>,
    /// Where in the local buffer.
    pub local_offset: u64,
    /// The remote buffer.
    pub remote: BufferHandle,
    /// Where in the remote buffer.
    pub remote_offset: u64,
    /// How many bytes.
    pub len: u64,
    /// How long it may take (default: the manager's `op_timeout`, 60 s).
    pub timeout: Option<Duration>,
}

/// Runs `transfer` with the process manager, on the process runtime
/// (RM-4), and returns the bytes moved. The local buffer stays alive until
/// the transfer ends, even if this future is dropped first (the transfer
/// then runs on until it ends or times out).
pub async fn process_transfer(transfer: OwnedTransfer) -> Result<u64, RdmaError> {
    let manager = process_manager().await?;
    let runtime = process_runtime()?;
    runtime
        .spawn(async move {
            manager
                .transfer(Transfer {
                    direction: transfer.direction,
                    local: &transfer.local,
                    local_offset: transfer.local_offset,
                    remote: &transfer.remote,
                    remote_offset: transfer.remote_offset,
                    len: transfer.len,
                    timeout: transfer.timeout,
                })
                .await
        })
        .await
        .map_err(|e| RdmaError::Io {
            what: "running a transfer".into(),
            reason: e.to_string(),
        })?
}

/// The buffers rdma actors allocated in this process, by buffer id (ids
/// are never reused by a manager, and there is one manager per process).
static BUFFERS: LazyLock<Mutex<HashMap<u64, Arc<Buffer>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn insert_buffer(buffer: Buffer) -> BufferHandle {
    let handle = buffer.handle();
    BUFFERS.lock().insert(handle.id(), Arc::new(buffer));
    handle
}

/// The buffer of this process that `handle` names, if the handle is
/// exactly the one it was registered with (same manager, id and key).
fn lookup_buffer(manager: &RdmaManager, handle: &BufferHandle) -> Result<Arc<Buffer>, String> {
    if handle.owner() != manager.id() {
        return Err(format!(
            "buffer {} belongs to manager {}, not to this proc's manager {}: send the request to the proc that allocated it",
            handle.id(),
            handle.owner(),
            manager.id()
        ));
    }
    match BUFFERS.lock().get(&handle.id()) {
        Some(buffer) if buffer.handle() == *handle => Ok(Arc::clone(buffer)),
        Some(_) => Err(format!(
            "buffer {}: the handle does not match the buffer (wrong key or length)",
            handle.id()
        )),
        None => Err(format!(
            "buffer {} is not allocated on this proc (freed, or never allocated)",
            handle.id()
        )),
    }
}

/// Forgets (and so deregisters) buffer `id`; whether it was there.
fn remove_buffer(id: u64) -> bool {
    // Dropped outside the lock: dropping deregisters.
    let removed = BUFFERS.lock().remove(&id);
    removed.is_some()
}

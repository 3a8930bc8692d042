//! The controller's side: [`RdmaMesh`], [`RemoteBuffer`] and the casts
//! behind them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hyperactor::ProcId;
use hyperactor_mesh::agent::MeshEvent;
use hyperactor_mesh::client::{ActorSpec, MeshClient};
use hyperactor_mesh::comm::DEFAULT_FANOUT;
use hyperactor_mesh::{CastMode, CastTarget, Caster, Outcome, RankError};
use parking_lot::Mutex;
use rkyv::rancor;
use tokio::sync::{mpsc, oneshot};

use super::actor::RDMA_KIND;
use super::command::RdmaCommand;
use crate::BufferHandle;

/// How much longer than a transfer's own timeout the controller waits for
/// its reply: the actor reports the timeout itself, and the reply needs
/// the hops back.
const TRANSFER_GRACE: Duration = Duration::from_secs(2);

/// Why a request of an [`RdmaMesh`] failed. Every variant names the rank
/// (and where it matters the buffer) it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaMeshError {
    /// The proc of the rank that had to act ended.
    #[error("rank {rank}: proc {proc} died: {reason}")]
    ProcDied {
        /// The rank.
        rank: usize,
        /// The proc.
        proc: String,
        /// Its exit status or signal, or how it was lost.
        reason: String,
    },
    /// The rank's rdma actor failed (its proc lives on).
    #[error("rank {rank}: the rdma actor failed: {reason}")]
    ActorFailed {
        /// The rank.
        rank: usize,
        /// Why.
        reason: String,
    },
    /// No reply came in time.
    #[error("rank {rank}: {what}: no reply within {after:?}")]
    Timeout {
        /// The rank.
        rank: usize,
        /// The request, with the buffers it names.
        what: String,
        /// How long the controller waited.
        after: Duration,
    },
    /// The rank refused the request or it failed there: an unknown or
    /// freed buffer, a handle of another proc, a range past the end, or a
    /// transfer that failed (the reason is the RDMA layer's).
    #[error("rank {rank}: {what} failed: {reason}")]
    Failed {
        /// The rank.
        rank: usize,
        /// The request, with the buffers it names.
        what: String,
        /// Why.
        reason: String,
    },
    /// Bytes that should hold a [`RemoteBuffer`] do not.
    #[error("invalid remote buffer encoding: {0}")]
    BadHandle(String),
    /// A whole-buffer transfer between buffers of different lengths.
    #[error(
        "sizes differ: buffer {src} on rank {src_rank} has {src_len} bytes, buffer {dst} on rank {dst_rank} has {dst_len}"
    )]
    SizeMismatch {
        /// The source's rank.
        src_rank: usize,
        /// The source's buffer id.
        src: u64,
        /// Its length.
        src_len: u64,
        /// The destination's rank.
        dst_rank: usize,
        /// The destination's buffer id.
        dst: u64,
        /// Its length.
        dst_len: u64,
    },
    /// A range that does not fit in a buffer.
    #[error(
        "rank {rank}: offset {offset} + length {len} exceeds buffer {buffer}'s {buffer_len} bytes"
    )]
    OutOfRange {
        /// The buffer's rank.
        rank: usize,
        /// The buffer's id.
        buffer: u64,
        /// The offset asked for.
        offset: u64,
        /// The length asked for.
        len: u64,
        /// The buffer's length.
        buffer_len: u64,
    },
    /// The buffer lives on a proc this mesh has no actor on.
    #[error("buffer {buffer} lives on proc {proc}, which is not a proc of this rdma mesh")]
    NotOnMesh {
        /// The buffer's id.
        buffer: u64,
        /// Its proc.
        proc: String,
    },
    /// A rank past the end of the mesh.
    #[error("rank {rank} is out of range; the rdma mesh has {ranks} ranks")]
    NoSuchRank {
        /// The rank asked for.
        rank: usize,
        /// How many there are.
        ranks: usize,
    },
    /// The mesh was stopped.
    #[error("the rdma mesh {0} was stopped")]
    Stopped(String),
    /// The actors could not be spawned.
    #[error("cannot start the rdma actors: {0}")]
    Spawn(String),
}

/// A buffer on a rank of a mesh: the rank, its proc, and the buffer's
/// [`BufferHandle`]. Plain data: clone it, send it inside payloads
/// ([`to_bytes`](Self::to_bytes)); it frees nothing when dropped (see
/// [`RdmaMesh::free`]). Whoever holds it can read and write the buffer.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteBuffer {
    rank: usize,
    proc: ProcId,
    handle: BufferHandle,
}

/// [`RemoteBuffer`] on the wire.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct WireRemoteBuffer {
    rank: u64,
    proc: ProcId,
    handle: Vec<u8>,
}

impl RemoteBuffer {
    /// The rank that allocated it, in the mesh that allocated it.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The proc whose memory holds it.
    pub fn proc(&self) -> &ProcId {
        &self.proc
    }

    /// The buffer's handle.
    pub fn handle(&self) -> &BufferHandle {
        &self.handle
    }

    /// The buffer's id (unique in its proc, never reused).
    pub fn id(&self) -> u64 {
        self.handle.id()
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.handle.len()
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.handle.is_empty()
    }

    /// Encodes it as an rkyv archive, for payloads.
    pub fn to_bytes(&self) -> Vec<u8> {
        let wire = WireRemoteBuffer {
            rank: self.rank as u64,
            proc: self.proc.clone(),
            handle: self.handle.to_bytes(),
        };
        // Serializing into a Vec cannot fail: it only grows the Vec.
        rkyv::api::high::to_bytes_in::<_, rancor::Error>(&wire, Vec::with_capacity(256))
            .unwrap_or_default()
    }

    /// Decodes and validates [`to_bytes`](Self::to_bytes)'s archive; any
    /// bytes are accepted, garbage is [`RdmaMeshError::BadHandle`].
    pub fn from_bytes(bytes: &[u8]) -> Result<RemoteBuffer, RdmaMeshError> {
        let wire = <WireRemoteBuffer as hyperactor::RemoteMessage>::decode(bytes)
            .map_err(|e| RdmaMeshError::BadHandle(e.to_string()))?;
        let handle = BufferHandle::from_bytes(&wire.handle)
            .map_err(|e| RdmaMeshError::BadHandle(e.to_string()))?;
        let rank = usize::try_from(wire.rank)
            .map_err(|_| RdmaMeshError::BadHandle(format!("rank {} is too large", wire.rank)))?;
        Ok(RemoteBuffer {
            rank,
            proc: wire.proc,
            handle,
        })
    }
}

impl std::fmt::Debug for RemoteBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteBuffer")
            .field("rank", &self.rank)
            .field("proc", &self.proc.to_string())
            .field("id", &self.handle.id())
            .field("len", &self.handle.len())
            .finish()
    }
}

/// Settings of an [`RdmaMesh`].
#[derive(Debug, Clone)]
pub struct RdmaMeshOptions {
    /// How long a request may take on its rank (default 60 s). A transfer
    /// gets this as its own timeout, and the controller waits a little
    /// longer for the rank to report it.
    pub timeout: Duration,
    /// The most bytes one message of [`RdmaMesh::write`] and
    /// [`RdmaMesh::read`] carries (default 8 MiB): larger ranges move in
    /// several messages, under the channels' frame limit.
    pub chunk_bytes: usize,
    /// The fan-out of the multicast trees (default
    /// [`hyperactor_mesh::comm::DEFAULT_FANOUT`]).
    pub fanout: u32,
    /// How long spawning (and stopping) the actors may take (default 30 s).
    pub spawn_timeout: Duration,
}

impl Default for RdmaMeshOptions {
    fn default() -> Self {
        RdmaMeshOptions {
            timeout: Duration::from_secs(60),
            chunk_bytes: 8 << 20,
            fanout: DEFAULT_FANOUT,
            spawn_timeout: Duration::from_secs(30),
        }
    }
}

type CastResult = Result<Vec<Vec<u8>>, (u32, RankError)>;

/// One cast for the driver.
struct DriverRequest {
    rank: usize,
    endpoint: &'static str,
    message: Vec<u8>,
    timeout: Duration,
    reply: oneshot::Sender<CastResult>,
}

/// What the driver and the callers share.
struct Shared {
    name: String,
    procs: Vec<ProcId>,
    client: Arc<MeshClient>,
    /// Our procs that ended, with why.
    dead: Mutex<HashMap<ProcId, String>>,
    /// Our ranks whose actor failed, with why.
    failed: Mutex<HashMap<u32, String>>,
}

impl Shared {
    /// Why `rank` cannot answer, if it cannot.
    fn down(&self, rank: usize) -> Option<RdmaMeshError> {
        let proc = &self.procs[rank];
        let dead = self.dead.lock().get(proc).cloned();
        if let Some(reason) = dead.or_else(|| self.client.dead(proc)) {
            return Some(RdmaMeshError::ProcDied {
                rank,
                proc: proc.to_string(),
                reason,
            });
        }
        let failed = self.failed.lock().get(&(rank as u32)).cloned();
        failed.map(|reason| RdmaMeshError::ActorFailed { rank, reason })
    }
}

struct Inner {
    shared: Arc<Shared>,
    requests: mpsc::UnboundedSender<DriverRequest>,
    options: RdmaMeshOptions,
    stopped: AtomicBool,
}

/// RDMA buffers on the procs of a mesh, one rdma actor per proc; see the
/// module docs of [`crate::mesh`]. Cheap to clone (clones share the
/// actors); every method takes `&self` and may run concurrently with the
/// others. Dropping the last clone leaves the actors (and their buffers)
/// running: [`stop`](Self::stop) them.
#[derive(Clone)]
pub struct RdmaMesh {
    inner: Arc<Inner>,
}

impl RdmaMesh {
    /// Spawns an rdma actor on each of `procs` (rank `i` on `procs[i]`),
    /// with default options. Every proc's registry needs the
    /// [`RDMA_KIND`] factory ([`super::register`]).
    pub async fn spawn(
        client: Arc<MeshClient>,
        procs: &[ProcId],
    ) -> Result<RdmaMesh, RdmaMeshError> {
        RdmaMesh::spawn_with(client, procs, RdmaMeshOptions::default()).await
    }

    /// [`RdmaMesh::spawn`] with `options`.
    pub async fn spawn_with(
        client: Arc<MeshClient>,
        procs: &[ProcId],
        options: RdmaMeshOptions,
    ) -> Result<RdmaMesh, RdmaMeshError> {
        static MESHES: AtomicU64 = AtomicU64::new(0);
        if procs.is_empty() {
            return Err(RdmaMeshError::Spawn("no procs to spawn on".into()));
        }
        let events = client.subscribe();
        let name = format!("rdma{}", MESHES.fetch_add(1, Ordering::Relaxed));
        let spec = ActorSpec {
            kind: RDMA_KIND.into(),
            name: name.clone(),
            extent: vec![("procs".into(), procs.len() as u32)],
            params: Vec::new(),
            per_proc: 1,
        };
        client
            .spawn_actors(procs, &spec, options.spawn_timeout)
            .await
            .map_err(RdmaMeshError::Spawn)?;
        let caster = Caster::new(client.mailbox(), options.fanout);
        let shared = Arc::new(Shared {
            name,
            procs: procs.to_vec(),
            client,
            dead: Mutex::new(HashMap::new()),
            failed: Mutex::new(HashMap::new()),
        });
        let (requests, requests_rx) = mpsc::unbounded_channel();
        tokio::spawn(drive(caster, requests_rx, events, Arc::clone(&shared)));
        Ok(RdmaMesh {
            inner: Arc::new(Inner {
                shared,
                requests,
                options,
                stopped: AtomicBool::new(false),
            }),
        })
    }

    /// The actor mesh's name (its actors are `name[rank]`).
    pub fn name(&self) -> &str {
        &self.inner.shared.name
    }

    /// The procs, in rank order.
    pub fn procs(&self) -> &[ProcId] {
        &self.inner.shared.procs
    }

    /// How many ranks (one per proc).
    pub fn len(&self) -> usize {
        self.inner.shared.procs.len()
    }

    /// Whether the mesh has no ranks (never: spawning refuses that).
    pub fn is_empty(&self) -> bool {
        self.inner.shared.procs.is_empty()
    }

    /// Allocates a zeroed buffer of `len` bytes on `rank`.
    pub async fn alloc(&self, rank: usize, len: u64) -> Result<RemoteBuffer, RdmaMeshError> {
        if rank >= self.len() {
            return Err(RdmaMeshError::NoSuchRank {
                rank,
                ranks: self.len(),
            });
        }
        let what = || format!("alloc of {len} bytes");
        let bytes = self
            .call(rank, RdmaCommand::Alloc { len }, None, &what)
            .await?;
        let handle = BufferHandle::from_bytes(&bytes).map_err(|e| RdmaMeshError::Failed {
            rank,
            what: what(),
            reason: format!("the reply is not a buffer handle: {e}"),
        })?;
        Ok(RemoteBuffer {
            rank,
            proc: self.inner.shared.procs[rank].clone(),
            handle,
        })
    }

    /// Copies `bytes` into `buffer` at `offset`, through the controller
    /// (in messages of at most `chunk_bytes`).
    pub async fn write(
        &self,
        buffer: &RemoteBuffer,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), RdmaMeshError> {
        let rank = self.rank_of(buffer)?;
        check_range(rank, buffer, offset, bytes.len() as u64)?;
        let chunk = self.inner.options.chunk_bytes.max(1);
        let handle = buffer.handle.to_bytes();
        let mut writes = Vec::new();
        let mut start = 0;
        // At least one message, so that an empty write still checks the buffer.
        loop {
            let end = (start + chunk).min(bytes.len());
            let command = RdmaCommand::WriteBytes {
                buffer: handle.clone(),
                offset: offset + start as u64,
                bytes: bytes[start..end].to_vec(),
            };
            let what =
                move || format!("write of {} bytes into buffer {}", end - start, buffer.id());
            writes.push(async move { self.call(rank, command, None, &what).await });
            start = end;
            if start >= bytes.len() {
                break;
            }
        }
        futures::future::try_join_all(writes).await?;
        Ok(())
    }

    /// `len` bytes of `buffer` from `offset`, through the controller.
    pub async fn read(
        &self,
        buffer: &RemoteBuffer,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, RdmaMeshError> {
        let rank = self.rank_of(buffer)?;
        check_range(rank, buffer, offset, len)?;
        let chunk = self.inner.options.chunk_bytes.max(1) as u64;
        let handle = buffer.handle.to_bytes();
        let mut reads = Vec::new();
        let mut start = 0;
        loop {
            let part = chunk.min(len - start);
            let command = RdmaCommand::ReadBytes {
                buffer: handle.clone(),
                offset: offset + start,
                len: part,
            };
            let what = move || format!("read of {part} bytes of buffer {}", buffer.id());
            reads.push(async move { self.call(rank, command, None, &what).await });
            start += part;
            if start >= len {
                break;
            }
        }
        let parts = futures::future::try_join_all(reads).await?;
        Ok(parts.concat())
    }

    /// `dst`'s proc READs the whole of `src` into `dst` (one-sided: `src`'s
    /// proc only serves the bytes). Both must have the same length.
    pub async fn read_into(
        &self,
        src: &RemoteBuffer,
        dst: &RemoteBuffer,
    ) -> Result<(), RdmaMeshError> {
        check_sizes(src, dst)?;
        self.read_into_range(src, 0, dst, 0, src.len()).await
    }

    /// `dst`'s proc READs `len` bytes of `src` from `src_offset` into `dst`
    /// at `dst_offset`. Only `dst` must be on this mesh: `src` may be any
    /// buffer, of any mesh, whose handle this proc can reach.
    pub async fn read_into_range(
        &self,
        src: &RemoteBuffer,
        src_offset: u64,
        dst: &RemoteBuffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), RdmaMeshError> {
        let src_rank = src.rank();
        let rank = self.rank_of(dst)?;
        check_range(src_rank, src, src_offset, len)?;
        check_range(rank, dst, dst_offset, len)?;
        let command = RdmaCommand::ReadInto {
            local: dst.handle.to_bytes(),
            local_offset: dst_offset,
            remote: src.handle.to_bytes(),
            remote_offset: src_offset,
            len,
            timeout_ms: self.transfer_timeout_ms(),
        };
        let what = || {
            format!(
                "read of {len} bytes of buffer {} (rank {src_rank}) into buffer {}",
                src.id(),
                dst.id()
            )
        };
        self.call(rank, command, Some(TRANSFER_GRACE), &what)
            .await
            .map(|_| ())
    }

    /// `src`'s proc WRITEs the whole of `src` into `dst` (one-sided: `dst`'s
    /// proc only takes the bytes). Both must have the same length.
    pub async fn write_from(
        &self,
        dst: &RemoteBuffer,
        src: &RemoteBuffer,
    ) -> Result<(), RdmaMeshError> {
        check_sizes(src, dst)?;
        self.write_from_range(dst, 0, src, 0, src.len()).await
    }

    /// `src`'s proc WRITEs `len` bytes of `src` from `src_offset` into
    /// `dst` at `dst_offset`. Only `src` must be on this mesh.
    pub async fn write_from_range(
        &self,
        dst: &RemoteBuffer,
        dst_offset: u64,
        src: &RemoteBuffer,
        src_offset: u64,
        len: u64,
    ) -> Result<(), RdmaMeshError> {
        let rank = self.rank_of(src)?;
        let dst_rank = dst.rank();
        check_range(rank, src, src_offset, len)?;
        check_range(dst_rank, dst, dst_offset, len)?;
        let command = RdmaCommand::WriteFrom {
            local: src.handle.to_bytes(),
            local_offset: src_offset,
            remote: dst.handle.to_bytes(),
            remote_offset: dst_offset,
            len,
            timeout_ms: self.transfer_timeout_ms(),
        };
        let what = || {
            format!(
                "write of {len} bytes of buffer {} into buffer {} (rank {dst_rank})",
                src.id(),
                dst.id()
            )
        };
        self.call(rank, command, Some(TRANSFER_GRACE), &what)
            .await
            .map(|_| ())
    }

    /// Frees `buffer` on its proc: later transfers from or into it fail
    /// (RM-3).
    pub async fn free(&self, buffer: RemoteBuffer) -> Result<(), RdmaMeshError> {
        let rank = self.rank_of(&buffer)?;
        let command = RdmaCommand::Free {
            buffer: buffer.handle.to_bytes(),
        };
        let what = || format!("free of buffer {}", buffer.id());
        self.call(rank, command, None, &what).await.map(|_| ())
    }

    /// Stops the actors, which frees every buffer they allocated; the
    /// procs live on. Every clone's later requests fail with
    /// [`RdmaMeshError::Stopped`].
    pub async fn stop(&self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        let shared = &self.inner.shared;
        shared
            .client
            .stop_actors(
                &shared.procs,
                &shared.name,
                self.inner.options.spawn_timeout,
            )
            .await;
    }

    // ---- helpers -----------------------------------------------------

    fn transfer_timeout_ms(&self) -> u64 {
        self.inner.options.timeout.as_millis().max(1) as u64
    }

    /// The rank of this mesh on `buffer`'s proc.
    fn rank_of(&self, buffer: &RemoteBuffer) -> Result<usize, RdmaMeshError> {
        self.inner
            .shared
            .procs
            .iter()
            .position(|p| *p == buffer.proc)
            .ok_or_else(|| RdmaMeshError::NotOnMesh {
                buffer: buffer.id(),
                proc: buffer.proc.to_string(),
            })
    }

    /// Casts `command` to `rank` and waits for its one reply (RM-1).
    async fn call(
        &self,
        rank: usize,
        command: RdmaCommand,
        grace: Option<Duration>,
        what: &(dyn Fn() -> String + Sync),
    ) -> Result<Vec<u8>, RdmaMeshError> {
        let shared = &self.inner.shared;
        if self.inner.stopped.load(Ordering::SeqCst) {
            return Err(RdmaMeshError::Stopped(shared.name.clone()));
        }
        if let Some(down) = shared.down(rank) {
            return Err(down);
        }
        let timeout = self.inner.options.timeout + grace.unwrap_or_default();
        let (reply, result) = oneshot::channel();
        let request = DriverRequest {
            rank,
            endpoint: command.endpoint(),
            message: command.encode(),
            timeout,
            reply,
        };
        let lost = || RdmaMeshError::Failed {
            rank,
            what: what(),
            reason: "the mesh's driver task ended (its runtime shut down)".into(),
        };
        self.inner.requests.send(request).map_err(|_| lost())?;
        match result.await {
            Ok(Ok(mut values)) => Ok(values.pop().unwrap_or_default()),
            Ok(Err((_, error))) => Err(match error {
                RankError::Endpoint(reason) | RankError::Invalid(reason) => RdmaMeshError::Failed {
                    rank,
                    what: what(),
                    reason,
                },
                RankError::Timeout(_) => RdmaMeshError::Timeout {
                    rank,
                    what: what(),
                    after: timeout,
                },
                RankError::Failed(reason)
                | RankError::Stopped(reason)
                | RankError::Lost(reason) => shared
                    .down(rank)
                    .unwrap_or(RdmaMeshError::ActorFailed { rank, reason }),
            }),
            Err(_) => Err(lost()),
        }
    }
}

fn check_range(
    rank: usize,
    buffer: &RemoteBuffer,
    offset: u64,
    len: u64,
) -> Result<(), RdmaMeshError> {
    match offset.checked_add(len) {
        Some(end) if end <= buffer.len() => Ok(()),
        _ => Err(RdmaMeshError::OutOfRange {
            rank,
            buffer: buffer.id(),
            offset,
            len,
            buffer_len: buffer.len(),
        }),
    }
}

fn check_sizes(src: &RemoteBuffer, dst: &RemoteBuffer) -> Result<(), RdmaMeshError> {
    if src.len() == dst.len() {
        return Ok(());
    }
    Err(RdmaMeshError::SizeMismatch {
        src_rank: src.rank(),
        src: src.id(),
        src_len: src.len(),
        dst_rank: dst.rank(),
        dst: dst.id(),
        dst_len: dst.len(),
    })
}

/// Runs the mesh's casts: takes requests, casts them, hands each result
/// to its caller, and tells the caster of every proc of ours that dies
/// (so that the casts waiting on it fail at once). Ends when the last
/// clone of the mesh is dropped.
async fn drive(
    mut caster: Caster,
    mut requests: mpsc::UnboundedReceiver<DriverRequest>,
    mut events: mpsc::UnboundedReceiver<MeshEvent>,
    shared: Arc<Shared>,
) {
    let mut waiting: HashMap<u64, oneshot::Sender<CastResult>> = HashMap::new();
    loop {
        tokio::select! {
            request = requests.recv() => {
                let Some(request) = request else { break };
                let proc = shared.procs[request.rank].clone();
                // Procs stopped by their owner are not announced to subscribers.
                if let Some(reason) = shared.client.dead(&proc)
                    && !shared.dead.lock().contains_key(&proc)
                {
                    caster.proc_died(&proc, &reason);
                    shared.dead.lock().insert(proc.clone(), reason);
                }
                let target = CastTarget {
                    mesh: shared.name.clone(),
                    procs: vec![proc],
                    ranks: vec![vec![request.rank as u32]],
                };
                let seq = caster.cast(
                    target,
                    request.endpoint,
                    request.message,
                    CastMode::Gather,
                    request.timeout,
                );
                waiting.insert(seq, request.reply);
            }
            Some(outcome) = caster.next(), if !caster.is_idle() => {
                if let Outcome::Done { seq, result } = outcome
                    && let Some(reply) = waiting.remove(&seq)
                {
                    // The caller may have given up; nothing to do then.
                    let _ = reply.send(result);
                }
            }
            Some(event) = events.recv() => match event {
                MeshEvent::ProcStopped { proc, reason } => {
                    if shared.procs.contains(&proc) && !shared.dead.lock().contains_key(&proc) {
                        tracing::info!(mesh = %shared.name, %proc, %reason, "a proc of an rdma mesh ended");
                        caster.proc_died(&proc, &reason);
                        shared.dead.lock().insert(proc, reason);
                    }
                }
                MeshEvent::ActorFailed { actor, reason } => {
                    if actor.name() == shared.name && shared.procs.contains(actor.proc_id()) {
                        shared.failed.lock().insert(actor.rank(), reason);
                    }
                }
                MeshEvent::Log { .. } => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_send_sync<T: Send + Sync>() {}

    // Compile-time checks: the WIT layer runs each request on its own
    // task, so every request's future is Send.
    #[allow(dead_code)]
    fn futures_are_send(mesh: &RdmaMesh, a: &RemoteBuffer, b: &RemoteBuffer) {
        fn send<F: Send>(_: F) {}
        send(mesh.alloc(0, 1));
        send(mesh.write(a, 0, b"x"));
        send(mesh.read(a, 0, 1));
        send(mesh.read_into(a, b));
        send(mesh.write_from(a, b));
        send(mesh.free(b.clone()));
        send(mesh.stop());
    }

    #[test]
    fn an_rdma_mesh_is_clone_send_and_sync() {
        is_send_sync::<RdmaMesh>();
        is_send_sync::<RemoteBuffer>();
        is_send_sync::<RdmaMeshError>();
    }

    #[test]
    fn garbage_is_not_a_remote_buffer() {
        assert!(matches!(
            RemoteBuffer::from_bytes(b"garbage"),
            Err(RdmaMeshError::BadHandle(_))
        ));
        assert!(RemoteBuffer::from_bytes(&[]).is_err());
    }
}

//! The controller's side: [`TensorMesh`], the handles ([`TensorRef`]) and
//! the casts behind them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hyperactor::ProcId;
use hyperactor_mesh::agent::MeshEvent;
use hyperactor_mesh::client::{ActorSpec, MeshClient};
use hyperactor_mesh::comm::DEFAULT_FANOUT;
use hyperactor_mesh::{CastMode, CastTarget, Caster, Outcome, RankError, Reducer};
use tokio::sync::mpsc;

use super::command::{BinaryOp, Command, Init, UnaryOp};
use super::sharding::{self, MeshShape, Meta, Sharding};
use super::worker::TENSOR_KIND;
use crate::{DType, Device, Tensor};

mod ring;
mod send_shard;

/// Why a mesh tensor operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MeshError {
    /// The tensor could not be made: an op that produced it (or one of its
    /// inputs) failed. The reason names that op.
    #[error("tensor {id} is poisoned{}: {reason}", on_rank(*.rank))]
    Poisoned {
        /// The tensor asked for.
        id: u64,
        /// The rank that reported it; `None` when the controller found the
        /// op invalid before sending it.
        rank: Option<u32>,
        /// Why.
        reason: String,
    },
    /// A rank could not answer: its proc died, its actor failed, it did
    /// not reply in time, or it refused a command.
    #[error("rank {rank}: {reason}")]
    Failed {
        /// The rank.
        rank: u32,
        /// Why.
        reason: String,
    },
    /// The request itself is not valid (a dimension or rank out of range,
    /// a layout that cannot be all-reduced...).
    #[error("{0}")]
    Invalid(String),
    /// The workers could not be spawned.
    #[error("cannot start the tensor workers: {0}")]
    Spawn(String),
    /// Assembling a fetched tensor failed.
    #[error(transparent)]
    Tensor(#[from] crate::Error),
}

fn on_rank(rank: Option<u32>) -> String {
    rank.map(|r| format!(" on rank {r}")).unwrap_or_default()
}

/// A handle to a tensor on a mesh: its id and what the controller knows of
/// it. Cheap to clone; dropping it frees nothing (see [`TensorMesh::drop`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRef {
    id: u64,
    meta: Meta,
}

impl TensorRef {
    /// The id the workers know it by.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The global dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.meta.dims
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.meta.dtype
    }

    /// The device of every shard.
    pub fn device(&self) -> Device {
        self.meta.device
    }

    /// The layout over the mesh.
    pub fn sharding(&self) -> Sharding {
        self.meta.sharding
    }

    /// Shape, dtype, device and sharding together.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }
}

/// Settings of a [`TensorMesh`].
#[derive(Debug, Clone)]
pub struct TensorMeshOptions {
    /// The fan-out of the multicast trees (default
    /// [`hyperactor_mesh::comm::DEFAULT_FANOUT`]).
    pub fanout: u32,
    /// How long each rank has to answer a command, counted from when the
    /// command reaches its proc, so including the time it waits behind the
    /// commands before it (default 300 s). Also how long the controller
    /// keeps a fire-and-forget command to hand a dead proc's subtree over.
    pub timeout: Duration,
    /// The most bytes one message of `fetch`, `upload` and `all_reduce`
    /// carries (default 1 MiB); larger shards move in chunks, which also
    /// keeps every message under the channels' frame limit (64 MiB). A
    /// chunk is copied several times on its way (encoded, written, read,
    /// decoded, summed); small enough to stay in the CPU's caches between
    /// those copies, it moves faster: a 64 MiB all-reduce over child
    /// procs took 0.75 x as long in chunks of 1 MiB as of 8 MiB (see
    /// docs/tensor.md).
    pub chunk_bytes: usize,
    /// How many chunks `all_reduce` and `upload` keep in flight (default
    /// 4); in a ring all-reduce, how many of a rank's own chunks it sends
    /// ahead of what it received.
    pub window: usize,
    /// The smallest CPU shard, in bytes, that `all_reduce` sums round a
    /// ring of the workers instead of through the controller's tree
    /// (default 256 KiB; `usize::MAX` never uses the ring, 0 always does
    /// on the CPU). See [`TensorMesh::all_reduce`].
    pub ring_min_bytes: usize,
    /// How long spawning the workers may take (default 30 s).
    pub spawn_timeout: Duration,
}

impl Default for TensorMeshOptions {
    fn default() -> Self {
        TensorMeshOptions {
            fanout: DEFAULT_FANOUT,
            timeout: Duration::from_secs(300),
            chunk_bytes: 1 << 20,
            window: 4,
            ring_min_bytes: 256 << 10,
            spawn_timeout: Duration::from_secs(30),
        }
    }
}

type CastResult = Result<Vec<Vec<u8>>, (u32, RankError)>;

/// Tensors on the procs of a mesh, driven from the controller; see the
/// module docs of [`crate::mesh`].
pub struct TensorMesh {
    client: Arc<MeshClient>,
    name: String,
    procs: Vec<ProcId>,
    extent: Vec<(String, u32)>,
    per_proc: usize,
    mesh: MeshShape,
    caster: Caster,
    events: mpsc::UnboundedReceiver<MeshEvent>,
    options: TensorMeshOptions,
    next_id: u64,
    /// Ids the controller poisoned itself (invalid ops, failed
    /// all-reduces): never sent, so no worker knows them.
    poisoned: HashMap<u64, String>,
    /// Our procs that ended, with why.
    dead: HashMap<ProcId, String>,
    /// Our ranks whose actor failed, with why.
    failed: HashMap<u32, String>,
    /// Errors of fire-and-forget commands not yet reported.
    errors: Vec<(u32, String)>,
    /// Results that arrived while another was awaited.
    done: HashMap<u64, CastResult>,
    /// Every rank's ring port, once asked for ([`ring`]).
    ring_ports: Option<Vec<hyperactor::PortId>>,
    /// The number of the next ring all-reduce run.
    next_ring_op: u64,
}

/// The most errors of fire-and-forget commands kept until a `sync`.
const MAX_ERRORS: usize = 64;

impl TensorMesh {
    /// Spawns a tensor worker for every rank of `extent` on `procs` (the
    /// ranks split evenly over them, in order) with default options.
    pub async fn spawn(
        client: Arc<MeshClient>,
        procs: &[ProcId],
        extent: Vec<(String, u32)>,
    ) -> Result<TensorMesh, MeshError> {
        TensorMesh::spawn_with(client, procs, extent, TensorMeshOptions::default()).await
    }

    /// [`TensorMesh::spawn`] with `options`.
    pub async fn spawn_with(
        client: Arc<MeshClient>,
        procs: &[ProcId],
        extent: Vec<(String, u32)>,
        options: TensorMeshOptions,
    ) -> Result<TensorMesh, MeshError> {
        static MESHES: AtomicU64 = AtomicU64::new(0);
        let mesh = MeshShape::of_extent(&extent);
        if procs.is_empty() || mesh.is_empty() || !mesh.len().is_multiple_of(procs.len()) {
            return Err(MeshError::Invalid(format!(
                "an extent of {} ranks does not split evenly over {} procs",
                mesh.len(),
                procs.len()
            )));
        }
        let per_proc = mesh.len() / procs.len();
        let events = client.subscribe();
        let name = format!("tensor{}", MESHES.fetch_add(1, Ordering::Relaxed));
        let spec = ActorSpec {
            kind: TENSOR_KIND.into(),
            name: name.clone(),
            extent: extent.clone(),
            params: Vec::new(),
            per_proc: per_proc as u32,
        };
        client
            .spawn_actors(procs, &spec, options.spawn_timeout)
            .await
            .map_err(MeshError::Spawn)?;
        let caster = Caster::new(client.mailbox(), options.fanout);
        Ok(TensorMesh {
            client,
            name,
            procs: procs.to_vec(),
            extent,
            per_proc,
            mesh,
            caster,
            events,
            options,
            next_id: 1,
            poisoned: HashMap::new(),
            dead: HashMap::new(),
            failed: HashMap::new(),
            errors: Vec::new(),
            done: HashMap::new(),
            ring_ports: None,
            next_ring_op: 1,
        })
    }

    /// The actor mesh's name (its actors are `name[rank]`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The extent.
    pub fn extent(&self) -> &[(String, u32)] {
        &self.extent
    }

    /// The shape of the mesh.
    pub fn shape(&self) -> &MeshShape {
        &self.mesh
    }

    /// How many ranks.
    pub fn len(&self) -> usize {
        self.mesh.len()
    }

    /// Whether the mesh has no ranks (never: spawning refuses that).
    pub fn is_empty(&self) -> bool {
        self.mesh.is_empty()
    }

    /// The procs, in order.
    pub fn procs(&self) -> &[ProcId] {
        &self.procs
    }

    /// Stops the workers (and so frees every tensor); the procs live on.
    pub async fn stop(self) {
        self.client
            .stop_actors(&self.procs, &self.name, self.options.spawn_timeout)
            .await;
    }

    // ---- ops: fire and forget ---------------------------------------

    /// Creates a tensor of global `dims`, laid out by `sharding`, filled by
    /// `init`. Random inits give the same global tensor whatever the
    /// sharding. [`Init::FromBytes`] carries the whole tensor to every
    /// rank in one message; for more than a few MiB use
    /// [`TensorMesh::upload`].
    pub fn create(
        &mut self,
        init: Init,
        dims: &[usize],
        dtype: DType,
        device: Device,
        sharding: Sharding,
    ) -> TensorRef {
        let meta = Meta {
            dims: dims.to_vec(),
            dtype,
            device,
            sharding,
        };
        let mut check = self.mesh.check(sharding, dims.len());
        if let Init::FromBytes(bytes) = &init {
            let expected = dims
                .iter()
                .try_fold(dtype.size_of(), |n, &d| n.checked_mul(d));
            if check.is_ok() && expected != Some(bytes.len()) {
                check = Err(format!(
                    "{} bytes do not hold a {dtype} tensor of shape {dims:?}",
                    bytes.len()
                ));
            }
        }
        let wire_dims = dims.iter().map(|&d| d as u64).collect();
        self.op(&[], check.map(|()| meta.clone()), meta, "create", |id| {
            Command::Create {
                id,
                init,
                dims: wire_dims,
                dtype: dtype.into(),
                device: device.into(),
                sharding,
            }
        })
    }

    /// `a op b`, elementwise on local shards: equal shapes, dtypes and
    /// shardings; of partial sums only `add` and `sub`.
    pub fn binary(&mut self, op: BinaryOp, a: &TensorRef, b: &TensorRef) -> TensorRef {
        let linear = matches!(op, BinaryOp::Add | BinaryOp::Sub);
        let meta = sharding::binary_meta(op.name(), linear, &a.meta, &b.meta);
        let label = format!("{}({}, {})", op.name(), a.id, b.id);
        let (a_id, b_id) = (a.id, b.id);
        self.op(&[a, b], meta, a.meta.clone(), &label, |out| {
            Command::Binary {
                out,
                op,
                a: a_id,
                b: b_id,
            }
        })
    }

    /// `a op value`, elementwise; of a partial sum only `mul` and `div`.
    pub fn scalar(&mut self, op: BinaryOp, a: &TensorRef, value: f64) -> TensorRef {
        let linear = matches!(op, BinaryOp::Mul | BinaryOp::Div);
        let meta = sharding::elementwise_meta(op.name(), linear, &a.meta);
        let label = format!("{}({}, {value})", op.name(), a.id);
        let a_id = a.id;
        self.op(&[a], meta, a.meta.clone(), &label, |out| Command::Scalar {
            out,
            op,
            a: a_id,
            value,
        })
    }

    /// `op(a)`, elementwise; of a partial sum only `neg`.
    pub fn unary(&mut self, op: UnaryOp, a: &TensorRef) -> TensorRef {
        let meta = sharding::elementwise_meta(op.name(), op == UnaryOp::Neg, &a.meta);
        let label = format!("{}({})", op.name(), a.id);
        let a_id = a.id;
        self.op(&[a], meta, a.meta.clone(), &label, |out| Command::Unary {
            out,
            op,
            a: a_id,
        })
    }

    /// `a b` on local shards, for the layouts
    /// [`sharding::matmul_meta`] lists (rows of `a` split, columns of `b`
    /// split, or the inner dimension split on both, which leaves partial
    /// sums).
    pub fn matmul(&mut self, a: &TensorRef, b: &TensorRef) -> TensorRef {
        let meta = sharding::matmul_meta(&a.meta, &b.meta);
        let label = format!("matmul({}, {})", a.id, b.id);
        let (a_id, b_id) = (a.id, b.id);
        self.op(&[a, b], meta, a.meta.clone(), &label, |out| {
            Command::Matmul {
                out,
                a: a_id,
                b: b_id,
            }
        })
    }

    /// `aᵀ` (2-D); a split dimension moves with it.
    pub fn transpose(&mut self, a: &TensorRef) -> TensorRef {
        let meta = sharding::transpose_meta(&a.meta);
        let label = format!("transpose({})", a.id);
        let a_id = a.id;
        self.op(&[a], meta, a.meta.clone(), &label, |out| {
            Command::Transpose { out, a: a_id }
        })
    }

    /// The local sum of `a`, of everything (`None`) or along `dim`. Summing
    /// over the split dimension leaves partial sums: all-reduce them.
    pub fn sum(&mut self, a: &TensorRef, dim: Option<usize>) -> TensorRef {
        let meta = sharding::sum_meta(&a.meta, dim);
        let label = match dim {
            None => format!("sum({})", a.id),
            Some(d) => format!("sum({}, dim {d})", a.id),
        };
        let a_id = a.id;
        self.op(&[a], meta, a.meta.clone(), &label, |out| Command::Sum {
            out,
            a: a_id,
            dim: dim.map(|d| d as u64),
        })
    }

    /// A copy of `a` under a new id.
    pub fn copy(&mut self, a: &TensorRef) -> TensorRef {
        let label = format!("copy({})", a.id);
        let a_id = a.id;
        self.op(&[a], Ok(a.meta.clone()), a.meta.clone(), &label, |out| {
            Command::Copy { out, a: a_id }
        })
    }

    /// `y += alpha * x`, in place on every rank (equal shapes and
    /// shardings). A failure poisons `y`.
    pub fn axpy(&mut self, y: &TensorRef, alpha: f64, x: &TensorRef) {
        let meta = sharding::in_place_meta("axpy", &y.meta, &x.meta);
        let label = format!("tensor {} += {alpha} * tensor {} (axpy)", y.id, x.id);
        self.in_place(
            y,
            x,
            meta,
            &label,
            Command::Axpy {
                y: y.id,
                alpha,
                x: x.id,
            },
        );
    }

    /// Copies `src`'s elements into `dst`, in place (equal shapes and
    /// shardings; `dst` keeps its storage). A failure poisons `dst`.
    pub fn assign(&mut self, dst: &TensorRef, src: &TensorRef) {
        let meta = sharding::in_place_meta("assign", &dst.meta, &src.meta);
        let label = format!("tensor {} := tensor {} (assign)", dst.id, src.id);
        self.in_place(
            dst,
            src,
            meta,
            &label,
            Command::Assign {
                dst: dst.id,
                src: src.id,
            },
        );
    }

    /// A handle that is poisoned from the start with `reason`: nothing is
    /// sent, and every op that reads it, and every wait on it, reports
    /// `reason`. For layers above that find a request invalid before it
    /// reaches the mesh (an unknown mesh dimension, a failed upload).
    pub fn poisoned(&mut self, meta: Meta, reason: String) -> TensorRef {
        let id = self.next_id;
        self.next_id += 1;
        self.poisoned.insert(id, reason);
        TensorRef { id, meta }
    }

    /// Frees these tensors on every rank.
    pub fn drop(&mut self, tensors: &[&TensorRef]) {
        let ids: Vec<u64> = tensors.iter().map(|t| t.id).collect();
        for id in &ids {
            self.poisoned.remove(id);
        }
        self.broadcast(Command::Drop { ids });
    }

    fn in_place(
        &mut self,
        target: &TensorRef,
        source: &TensorRef,
        meta: Result<Meta, String>,
        label: &str,
        command: Command,
    ) {
        if self.poisoned.contains_key(&target.id) {
            return;
        }
        if let Some(reason) = self.poisoned.get(&source.id).cloned() {
            self.poisoned.insert(target.id, reason);
            return;
        }
        match meta {
            Ok(_) => self.broadcast(command),
            Err(e) => {
                self.poisoned.insert(target.id, format!("{label}: {e}"));
            }
        }
    }

    /// Allocates an output id and sends `make(id)` to every rank, unless
    /// an input is poisoned here (the output inherits its reason) or the
    /// op is invalid (the output is poisoned with why).
    fn op(
        &mut self,
        inputs: &[&TensorRef],
        meta: Result<Meta, String>,
        fallback: Meta,
        label: &str,
        make: impl FnOnce(u64) -> Command,
    ) -> TensorRef {
        let id = self.next_id;
        self.next_id += 1;
        let inherited = inputs
            .iter()
            .find_map(|input| self.poisoned.get(&input.id).cloned());
        let meta = match (inherited, meta) {
            (Some(reason), _) => {
                self.poisoned.insert(id, reason);
                fallback
            }
            (None, Err(e)) => {
                self.poisoned
                    .insert(id, format!("tensor {id} = {label}: {e}"));
                fallback
            }
            (None, Ok(meta)) => {
                self.broadcast(make(id));
                meta
            }
        };
        TensorRef { id, meta }
    }

    /// Sends `command` to every rank, fire and forget (CA-5): the workers
    /// handle it in order after everything sent before.
    fn broadcast(&mut self, command: Command) {
        self.poll();
        let target = self.target(0..self.mesh.len());
        self.caster.cast(
            target,
            command.endpoint(),
            command.encode(),
            CastMode::Broadcast,
            self.options.timeout,
        );
    }

    // ---- waits -------------------------------------------------------

    /// Creates a tensor holding `tensor` (global), laid out by `sharding`:
    /// every rank is sent only its own shard, in chunks, and this returns
    /// once every rank has it.
    pub async fn upload(
        &mut self,
        tensor: &Tensor,
        sharding: Sharding,
    ) -> Result<TensorRef, MeshError> {
        self.mesh
            .check(sharding, tensor.rank())
            .map_err(MeshError::Invalid)?;
        let dims = tensor.dims().to_vec();
        let t = self.create(
            Init::Zeros,
            &dims,
            tensor.dtype(),
            tensor.device(),
            sharding,
        );
        let host = tensor.to_device(Device::Cpu)?;
        // Which ranks get which block of the global tensor.
        let blocks: Vec<(Vec<usize>, Tensor)> = match sharding {
            Sharding::Replicate => vec![((0..self.mesh.len()).collect(), host)],
            Sharding::Partial { mesh_dim } => {
                let ranks = self.ranks_at(mesh_dim, 0);
                vec![(ranks, host)]
            }
            Sharding::Shard {
                mesh_dim,
                tensor_dim,
            } => {
                let parts = self.mesh.sizes()[mesh_dim];
                let mut blocks = Vec::with_capacity(parts);
                for c in 0..parts {
                    let (start, len) = sharding::block(dims[tensor_dim], parts, c);
                    blocks.push((
                        self.ranks_at(mesh_dim, c),
                        host.narrow(tensor_dim, start, len)?,
                    ));
                }
                blocks
            }
        };
        let size = tensor.dtype().size_of();
        let chunk = (self.options.chunk_bytes / size).max(1);
        let mut jobs = VecDeque::new();
        for (ranks, block) in &blocks {
            let bytes = block.as_bytes()?;
            for start in (0..block.numel()).step_by(chunk) {
                let end = (start + chunk).min(block.numel());
                jobs.push_back((ranks, start, &bytes[start * size..end * size]));
            }
        }
        let mut in_flight = HashSet::new();
        let mut first_error = None;
        loop {
            while first_error.is_none() && in_flight.len() < self.options.window.max(1) {
                let Some((ranks, start, bytes)) = jobs.pop_front() else {
                    break;
                };
                let command = Command::Write {
                    id: t.id,
                    start: start as u64,
                    bytes: bytes.to_vec(),
                };
                in_flight.insert(self.request(ranks.iter().copied(), command, CastMode::Gather));
            }
            if in_flight.is_empty() {
                break;
            }
            let (seq, result) = self.wait_any(&in_flight).await;
            in_flight.remove(&seq);
            if let Err(e) = result {
                first_error.get_or_insert(self.rank_error(Some(t.id), e));
            }
        }
        match first_error {
            Some(e) => {
                self.poisoned
                    .insert(t.id, format!("tensor {} = upload: {e}", t.id));
                Err(e)
            }
            None => Ok(t),
        }
    }

    /// Sums `t` over `mesh_dim`, in place: afterwards every rank of each
    /// group of ranks that differ only in `mesh_dim` holds the group's sum.
    /// Partial sums over `mesh_dim` become the replicated total; a tensor
    /// split over `mesh_dim` is refused.
    ///
    /// CPU shards of at least [`TensorMeshOptions::ring_min_bytes`] go
    /// round a ring of each group's workers (see [`crate::mesh`], "All-reduce").
    /// Otherwise, for each group and each chunk of the local tensor, a
    /// `fetch` is cast to the group with the elementwise reducer of the
    /// dtype (`sum-f32s`...), so the chunk is summed at every hop of the
    /// multicast tree and one sum comes back; a `write` then casts the sum
    /// to the group. Up to `window` chunks are in flight. A failure after
    /// any rank may have written a sum poisons the tensor.
    pub async fn all_reduce(
        &mut self,
        t: &mut TensorRef,
        mesh_dim: usize,
    ) -> Result<(), MeshError> {
        if let Some(reason) = self.poisoned.get(&t.id) {
            return Err(MeshError::Poisoned {
                id: t.id,
                rank: None,
                reason: reason.clone(),
            });
        }
        let meta =
            sharding::all_reduce_meta(&t.meta, mesh_dim, &self.mesh).map_err(MeshError::Invalid)?;
        self.poll();
        if self.ring_fits(t, mesh_dim) {
            self.ring_all_reduce(t, mesh_dim).await?;
            t.meta = meta;
            return Ok(());
        }
        let reducer = match t.meta.dtype {
            DType::F32 => Reducer::SumF32s,
            DType::F64 => Reducer::SumF64s,
            DType::I64 => Reducer::SumI64s,
        };
        let chunk = (self.options.chunk_bytes / t.meta.dtype.size_of()).max(1);
        let mut jobs = VecDeque::new();
        for group in self.mesh.groups(mesh_dim) {
            let local = self
                .mesh
                .local_dims(&t.meta.dims, t.meta.sharding, group[0]);
            let numel: usize = local.iter().product();
            let group = Arc::new(group);
            for start in (0..numel).step_by(chunk) {
                jobs.push_back((group.clone(), start, chunk.min(numel - start)));
            }
        }
        let mut fetching: HashMap<u64, (Arc<Vec<usize>>, usize)> = HashMap::new();
        let mut writing: HashSet<u64> = HashSet::new();
        let mut wrote = false;
        let mut first_error = None;
        loop {
            while first_error.is_none() && fetching.len() < self.options.window.max(1) {
                let Some((group, start, len)) = jobs.pop_front() else {
                    break;
                };
                let command = Command::Fetch {
                    id: t.id,
                    start: start as u64,
                    len: len as u64,
                };
                let seq = self.request(group.iter().copied(), command, CastMode::Reduce(reducer));
                fetching.insert(seq, (group, start));
            }
            if fetching.is_empty() && writing.is_empty() {
                break;
            }
            let wanted: HashSet<u64> = fetching.keys().chain(writing.iter()).copied().collect();
            let (seq, result) = self.wait_any(&wanted).await;
            if let Some((group, start)) = fetching.remove(&seq) {
                match result {
                    Ok(mut sum) if first_error.is_none() => {
                        let command = Command::Write {
                            id: t.id,
                            start: start as u64,
                            bytes: sum.pop().unwrap_or_default(),
                        };
                        writing.insert(self.request(
                            group.iter().copied(),
                            command,
                            CastMode::Gather,
                        ));
                        wrote = true;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        first_error.get_or_insert(self.rank_error(Some(t.id), e));
                    }
                }
            } else {
                writing.remove(&seq);
                if let Err(e) = result {
                    first_error.get_or_insert(self.rank_error(Some(t.id), e));
                }
            }
        }
        if let Some(e) = first_error {
            if wrote {
                // Some ranks hold sums, others not: the tensor is neither.
                let reason = format!(
                    "tensor {}: all_reduce over mesh dim {mesh_dim} failed: {e}",
                    t.id
                );
                self.poisoned.insert(t.id, reason);
            }
            return Err(e);
        }
        t.meta = meta;
        Ok(())
    }

    /// The shard `rank` holds of `t`, on the CPU.
    pub async fn fetch_shard(&mut self, t: &TensorRef, rank: usize) -> Result<Tensor, MeshError> {
        self.check_poison(t)?;
        self.poll();
        let pending = self.start_fetch(t, rank)?;
        self.finish_fetch(t, pending).await
    }

    /// The whole global tensor, on the CPU, assembled from shards: a
    /// replica from the lowest live rank that has one; the blocks of a
    /// split tensor joined; partial sums summed.
    pub async fn fetch(&mut self, t: &TensorRef) -> Result<Tensor, MeshError> {
        self.check_poison(t)?;
        self.poll();
        let (ranks, tensor_dim) = match t.meta.sharding {
            Sharding::Replicate => (vec![self.live_rank(0..self.mesh.len())?], None),
            Sharding::Shard {
                mesh_dim,
                tensor_dim,
            } => {
                let ranks = (0..self.mesh.sizes()[mesh_dim])
                    .map(|c| self.live_rank(self.ranks_at(mesh_dim, c)))
                    .collect::<Result<Vec<_>, _>>()?;
                (ranks, Some(tensor_dim))
            }
            Sharding::Partial { mesh_dim } => {
                let ranks = (0..self.mesh.sizes()[mesh_dim])
                    .map(|c| self.live_rank(self.ranks_at(mesh_dim, c)))
                    .collect::<Result<Vec<_>, _>>()?;
                (ranks, None)
            }
        };
        let mut pending = Vec::with_capacity(ranks.len());
        for &rank in &ranks {
            pending.push(self.start_fetch(t, rank)?);
        }
        let mut shards = Vec::with_capacity(ranks.len());
        for p in pending {
            shards.push(self.finish_fetch(t, p).await?);
        }
        let mut shards = shards.into_iter();
        let first = shards
            .next()
            .ok_or_else(|| MeshError::Invalid("the mesh has no ranks".into()))?;
        Ok(match tensor_dim {
            Some(dim) => {
                let rest: Vec<Tensor> = shards.collect();
                let all: Vec<&Tensor> = std::iter::once(&first).chain(&rest).collect();
                Tensor::cat(&all, dim)?
            }
            None => {
                let mut total = first;
                for part in shards {
                    total.add_assign(&part)?;
                }
                total
            }
        })
    }

    /// Waits until every command sent so far has run on every rank, and
    /// reports the first failure: of `tensors` (poisoned or missing), or
    /// of a fire-and-forget command that could not be delivered.
    pub async fn sync(&mut self, tensors: &[&TensorRef]) -> Result<(), MeshError> {
        for t in tensors {
            self.check_poison(t)?;
        }
        self.poll();
        if !self.errors.is_empty() {
            let (rank, reason) = self.errors.remove(0);
            return Err(MeshError::Failed { rank, reason });
        }
        let ids = tensors.iter().map(|t| t.id).collect();
        let seq = self.request(0..self.mesh.len(), Command::Sync { ids }, CastMode::Gather);
        let result = self.wait(seq).await;
        result.map(|_| ()).map_err(|e| self.rank_error(None, e))
    }

    // ---- helpers -----------------------------------------------------

    fn check_poison(&self, t: &TensorRef) -> Result<(), MeshError> {
        match self.poisoned.get(&t.id) {
            Some(reason) => Err(MeshError::Poisoned {
                id: t.id,
                rank: None,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// The ranks whose coordinate on `mesh_dim` is `c`, in order.
    fn ranks_at(&self, mesh_dim: usize, c: usize) -> Vec<usize> {
        (0..self.mesh.len())
            .filter(|&r| self.mesh.coords(r)[mesh_dim] == c)
            .collect()
    }

    /// Why `rank` cannot answer, if it cannot.
    fn down(&self, rank: usize) -> Option<String> {
        let proc = &self.procs[rank / self.per_proc];
        if let Some(reason) = self.dead.get(proc) {
            return Some(format!("proc {proc} died: {reason}"));
        }
        self.failed
            .get(&(rank as u32))
            .map(|reason| format!("actor {}[{rank}] failed: {reason}", self.name))
    }

    /// The first of `ranks` that can answer, or the first one's trouble.
    fn live_rank(&self, ranks: impl IntoIterator<Item = usize>) -> Result<usize, MeshError> {
        let mut first_down = None;
        for rank in ranks {
            match self.down(rank) {
                None => return Ok(rank),
                Some(reason) => {
                    first_down.get_or_insert(MeshError::Failed {
                        rank: rank as u32,
                        reason,
                    });
                }
            }
        }
        Err(first_down.unwrap_or_else(|| MeshError::Invalid("no rank holds that block".into())))
    }

    fn start_fetch(&mut self, t: &TensorRef, rank: usize) -> Result<PendingFetch, MeshError> {
        if rank >= self.mesh.len() {
            return Err(MeshError::Invalid(format!(
                "rank {rank} is out of range; the mesh has {} ranks",
                self.mesh.len()
            )));
        }
        if let Some(reason) = self.down(rank) {
            return Err(MeshError::Failed {
                rank: rank as u32,
                reason,
            });
        }
        let dims = self.mesh.local_dims(&t.meta.dims, t.meta.sharding, rank);
        let numel: usize = dims.iter().product();
        let chunk = (self.options.chunk_bytes / t.meta.dtype.size_of()).max(1);
        let mut seqs = Vec::new();
        let mut start = 0;
        // At least one fetch, so that an empty shard still reports poison.
        loop {
            let len = chunk.min(numel - start);
            let command = Command::Fetch {
                id: t.id,
                start: start as u64,
                len: len as u64,
            };
            seqs.push(self.request([rank], command, CastMode::Gather));
            start += len;
            if start >= numel {
                break;
            }
        }
        Ok(PendingFetch { dims, seqs })
    }

    async fn finish_fetch(
        &mut self,
        t: &TensorRef,
        pending: PendingFetch,
    ) -> Result<Tensor, MeshError> {
        let size = t.meta.dtype.size_of();
        let numel: usize = pending.dims.iter().product();
        let mut bytes = Vec::with_capacity(numel * size);
        let mut first_error = None;
        for seq in pending.seqs {
            match self.wait(seq).await {
                Ok(values) => {
                    for value in values {
                        bytes.extend_from_slice(&value);
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(self.rank_error(Some(t.id), e));
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok(Tensor::from_le_bytes(
            &bytes,
            &pending.dims,
            t.meta.dtype,
            Device::Cpu,
        )?)
    }

    /// What a rank's failure means to the caller; endpoint errors about
    /// tensor `id` are its poison.
    fn rank_error(&self, id: Option<u64>, (rank, error): (u32, RankError)) -> MeshError {
        match (error, id) {
            (RankError::Endpoint(reason), Some(id)) => MeshError::Poisoned {
                id,
                rank: Some(rank),
                reason,
            },
            (RankError::Endpoint(reason), None) => MeshError::Failed { rank, reason },
            (error, _) => {
                let reason = match self.down(rank as usize) {
                    Some(down) => down,
                    None => error.to_string(),
                };
                MeshError::Failed { rank, reason }
            }
        }
    }

    /// The cast target of `ranks`: every proc of the mesh, in order (so the
    /// tree, and with it the order of commands, is the same for every
    /// cast: CA-1), with the ranks selected on each.
    fn target(&self, ranks: impl IntoIterator<Item = usize>) -> CastTarget {
        let mut selected = vec![Vec::new(); self.procs.len()];
        for rank in ranks {
            selected[rank / self.per_proc].push(rank as u32);
        }
        CastTarget {
            mesh: self.name.clone(),
            procs: self.procs.clone(),
            ranks: selected,
        }
    }

    /// Casts `command` to `ranks`, waiting for replies in `mode`.
    fn request(
        &mut self,
        ranks: impl IntoIterator<Item = usize>,
        command: Command,
        mode: CastMode,
    ) -> u64 {
        self.request_with(ranks, command.endpoint(), command.encode(), mode)
    }

    /// Casts the archive `message` to `endpoint` of `ranks`.
    fn request_with(
        &mut self,
        ranks: impl IntoIterator<Item = usize>,
        endpoint: &str,
        message: Vec<u8>,
        mode: CastMode,
    ) -> u64 {
        let target = self.target(ranks);
        self.caster
            .cast(target, endpoint, message, mode, self.options.timeout)
    }

    /// Takes what has arrived without waiting: proc deaths, failed actors,
    /// outcomes.
    fn poll(&mut self) {
        while let Ok(event) = self.events.try_recv() {
            self.take_event(event);
        }
        // Procs stopped by their owner are not announced to subscribers.
        for proc in &self.procs {
            if !self.dead.contains_key(proc)
                && let Some(reason) = self.client.dead(proc)
            {
                self.dead.insert(proc.clone(), reason.clone());
                self.caster.proc_died(proc, &reason);
            }
        }
        while let Some(outcome) = self.caster.try_next() {
            self.take_outcome(outcome);
        }
    }

    fn take_event(&mut self, event: MeshEvent) {
        match event {
            MeshEvent::ProcStopped { proc, reason } => {
                if self.procs.contains(&proc) && !self.dead.contains_key(&proc) {
                    tracing::info!(mesh = %self.name, %proc, %reason, "a proc of a tensor mesh ended");
                    self.caster.proc_died(&proc, &reason);
                    self.dead.insert(proc, reason);
                }
            }
            MeshEvent::ActorFailed { actor, reason } => {
                if actor.name() == self.name && self.procs.contains(actor.proc_id()) {
                    self.failed.insert(actor.rank(), reason);
                }
            }
            MeshEvent::Log { .. } => {}
        }
    }

    fn take_outcome(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Done { seq, result } => {
                self.done.insert(seq, result);
            }
            Outcome::Failed { rank, error, .. } => {
                // A dead rank's loss is reported once, by its fetches.
                if self.down(rank as usize).is_none() && self.errors.len() < MAX_ERRORS {
                    self.errors.push((rank, error.to_string()));
                }
            }
            Outcome::Item { .. } | Outcome::End { .. } => {}
        }
    }

    async fn wait(&mut self, seq: u64) -> CastResult {
        self.wait_any(&HashSet::from([seq])).await.1
    }

    /// The first result of `seqs` to arrive, meanwhile telling the caster
    /// of every proc that dies.
    async fn wait_any(&mut self, seqs: &HashSet<u64>) -> (u64, CastResult) {
        loop {
            if let Some(&seq) = seqs.iter().find(|s| self.done.contains_key(s))
                && let Some(result) = self.done.remove(&seq)
            {
                return (seq, result);
            }
            tokio::select! {
                outcome = self.caster.next() => match outcome {
                    Some(outcome) => self.take_outcome(outcome),
                    None => {
                        // Nothing in flight: the cast was already reported.
                        let seq = seqs.iter().copied().min().unwrap_or(0);
                        let lost = RankError::Invalid(format!("cast {seq} ended without a result"));
                        return (seq, Err((0, lost)));
                    }
                },
                Some(event) = self.events.recv() => {
                    self.take_event(event);
                    self.poll();
                }
            }
        }
    }
}

struct PendingFetch {
    dims: Vec<usize>,
    seqs: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;

    // Compile-time checks: a controller can drive a mesh from a spawned
    // task, so the mesh, its handles and the futures of its waits are Send.
    fn is_send<T: Send>() {}

    #[allow(dead_code)]
    fn all_reduce_is_send<'a>(
        mesh: &'a mut TensorMesh,
        t: &'a mut TensorRef,
    ) -> impl Future<Output = Result<(), MeshError>> + Send + 'a {
        mesh.all_reduce(t, 0)
    }

    #[allow(dead_code)]
    fn fetch_is_send<'a>(
        mesh: &'a mut TensorMesh,
        t: &'a TensorRef,
    ) -> impl Future<Output = Result<Tensor, MeshError>> + Send + 'a {
        mesh.fetch(t)
    }

    #[test]
    fn a_tensor_mesh_and_its_handles_are_send() {
        is_send::<TensorMesh>();
        is_send::<TensorRef>();
        is_send::<MeshError>();
    }
}

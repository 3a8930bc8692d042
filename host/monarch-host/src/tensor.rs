//! The host side of the WIT `tensor` interface: tensor engines and the
//! handles a controller holds.
//!
//! An engine is a [`TensorMesh`] (one native tensor worker per proc of a
//! proc mesh) owned by a **driver** task. Every WIT call on an engine or a
//! tensor becomes one [`Job`] on the driver's queue, in the order the guest
//! made them, and returns at once:
//!
//! - ops (`binary`, `matmul`...) name their output by a handle the host
//!   picks here, so the guest gets its tensor before the driver has run the
//!   op; the driver maps handles to the mesh's [`TensorRef`]s as it goes;
//! - waits (`all-reduce`, `fetch`, `fetch-shard`, `sync`, `send-shard`)
//!   carry a request id; the driver awaits them in turn and posts the
//!   request's `done` event to the instance's completion queue, which
//!   `next-events` hands to the guest.
//!
//! Invariants:
//!
//! - TE-1: jobs run in the order the guest made them, so an op made after a
//!   wait sees the wait's effect (an all-reduced tensor is replicated).
//! - TE-2: every wait ends with exactly one `done` event, also when the
//!   engine's procs die or the guest drops every handle meanwhile.
//! - TE-3: a request the host finds invalid before it reaches the mesh (an
//!   unknown mesh dimension, operands of two engines) poisons its output
//!   with why, as an op that fails on a rank does; nothing traps.
//! - TE-4: the workers stop when the engine and every tensor of it are
//!   dropped, or with the program's procs.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use monarch_tensor::mesh::{
    BinaryOp, Init, MeshError, MeshShape, Meta, Sharding, TensorMesh, TensorRef, UnaryOp,
    sharding as rules,
};
use monarch_tensor::{DType, Device, Tensor};
use tokio::sync::mpsc;

use crate::bindings::monarch::host::tensor as wit;
use crate::bindings::{CallError, Completions, ErrorKind, Event, EventKind, Reply};
use crate::errors;

/// Byte initializers larger than this go to each rank as its own shard in
/// chunks ([`TensorMesh::upload`]) instead of whole in one message.
const UPLOAD_ABOVE: usize = 1 << 20;

/// What the engine and its tensors share: the driver's queue and the mesh's
/// shape.
pub(crate) struct EngineCore {
    jobs: mpsc::UnboundedSender<Job>,
    next_handle: AtomicU64,
    /// The mesh's dimensions, by name, for shardings and all-reduces.
    dims: Vec<String>,
    shape: MeshShape,
}

impl EngineCore {
    fn handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    fn send(&self, job: Job) {
        // The driver lives while any handle does (each holds a sender), so
        // this fails only when the driver ended because the runtime is
        // shutting down; the guest is being torn down too.
        let _ = self.jobs.send(job);
    }

    fn mesh_dim(&self, name: &str) -> Result<usize, String> {
        self.dims.iter().position(|d| d == name).ok_or_else(|| {
            format!(
                "the engine's mesh has no dimension `{name}`; its dimensions are {:?}",
                self.dims
            )
        })
    }
}

/// A tensor engine, as the guest holds it.
pub struct EngineHandle {
    core: Arc<EngineCore>,
}

/// A tensor, as the guest holds it: a handle the driver knows, and what the
/// controller computed of its layout.
pub struct TensorHandle {
    core: Arc<EngineCore>,
    handle: u64,
    meta: Meta,
}

impl Drop for TensorHandle {
    fn drop(&mut self) {
        self.core.send(Job::Drop(self.handle));
    }
}

/// An op the driver runs on the mesh.
enum Op {
    Create {
        init: Init,
        dims: Vec<usize>,
        dtype: DType,
        device: Device,
        sharding: Sharding,
    },
    Binary(BinaryOp, u64, u64),
    Scalar(BinaryOp, u64, f64),
    Unary(UnaryOp, u64),
    Matmul(u64, u64),
    Transpose(u64),
    Sum(u64, Option<usize>),
    Copy(u64),
    /// Refused by the host before it reached the mesh.
    Refused(String),
}

/// A wait the driver runs, whose result becomes request `id`'s event.
enum Wait {
    AllReduce(u64, usize),
    Fetch(u64),
    FetchShard(u64, usize),
    Sync(Option<u64>),
    SendShard {
        src: u64,
        from: usize,
        dst: u64,
        to: usize,
    },
}

enum Job {
    Op {
        out: u64,
        meta: Meta,
        op: Op,
    },
    Axpy(u64, f64, u64),
    Assign(u64, u64),
    Drop(u64),
    Wait {
        id: u64,
        wait: Wait,
        done: Completions,
    },
}

impl EngineHandle {
    /// Spawns the workers on `procs` (the proc mesh's extent) and starts the
    /// driver.
    pub(crate) async fn spawn(
        client: Arc<hyperactor_mesh::client::MeshClient>,
        procs: &[hyperactor::ProcId],
        extent: Vec<(String, u32)>,
        options: monarch_tensor::mesh::TensorMeshOptions,
    ) -> Result<EngineHandle, String> {
        let mesh = TensorMesh::spawn_with(client, procs, extent.clone(), options)
            .await
            .map_err(|e| e.to_string())?;
        let (jobs, queue) = mpsc::unbounded_channel();
        let core = Arc::new(EngineCore {
            jobs,
            next_handle: AtomicU64::new(1),
            dims: extent.iter().map(|(name, _)| name.clone()).collect(),
            shape: MeshShape::of_extent(&extent),
        });
        tokio::spawn(drive(mesh, queue));
        Ok(EngineHandle { core })
    }

    /// `create`: a new tensor; an invalid request is a poisoned one.
    pub(crate) fn create(
        &self,
        dims: Vec<u64>,
        dtype: wit::Dtype,
        device: wit::Device,
        sharding: wit::Sharding,
        init: wit::Init,
    ) -> TensorHandle {
        let dtype = dtype_of(dtype);
        let device = device_of(device);
        let dims_usize: Result<Vec<usize>, String> = dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d} is too large")))
            .collect();
        let sharding_of = sharding_of(&self.core, &sharding);
        let meta = Meta {
            dims: dims_usize.clone().unwrap_or_default(),
            dtype,
            device,
            sharding: sharding_of.clone().unwrap_or(Sharding::Replicate),
        };
        let op = match (dims_usize, sharding_of) {
            (Err(e), _) | (_, Err(e)) => Op::Refused(format!("create: {e}")),
            (Ok(dims), Ok(sharding)) => Op::Create {
                init: init_of(init),
                dims,
                dtype,
                device,
                sharding,
            },
        };
        new_tensor(&self.core, meta, op)
    }

    /// `sync` of the whole engine.
    pub(crate) fn sync(&self, id: u64, done: Completions) {
        let wait = Wait::Sync(None);
        self.core.send(Job::Wait { id, wait, done });
    }
}

fn new_tensor(core: &Arc<EngineCore>, meta: Meta, op: Op) -> TensorHandle {
    let out = core.handle();
    core.send(Job::Op {
        out,
        meta: meta.clone(),
        op,
    });
    TensorHandle {
        core: core.clone(),
        handle: out,
        meta,
    }
}

impl TensorHandle {
    /// What the guest's `layout` returns.
    pub(crate) fn layout(&self) -> wit::Layout {
        let core = &self.core;
        let name = |d: usize| core.dims.get(d).cloned().unwrap_or_default();
        wit::Layout {
            dims: self.meta.dims.iter().map(|&d| d as u64).collect(),
            dtype: match self.meta.dtype {
                DType::F32 => wit::Dtype::Float32,
                DType::F64 => wit::Dtype::Float64,
                DType::I64 => wit::Dtype::Int64,
            },
            device: match self.meta.device {
                Device::Cpu => wit::Device::Cpu,
                Device::Cuda(n) => wit::Device::Cuda(n as u32),
            },
            sharding: match self.meta.sharding {
                Sharding::Replicate => wit::Sharding::Replicate,
                Sharding::Shard {
                    mesh_dim,
                    tensor_dim,
                } => wit::Sharding::Shard(wit::ShardSpec {
                    mesh_dim: name(mesh_dim),
                    tensor_dim: tensor_dim as u32,
                }),
                Sharding::Partial { mesh_dim } => wit::Sharding::Partial(name(mesh_dim)),
            },
        }
    }

    /// Checks that `other` is of this tensor's engine.
    fn same_engine(&self, op: &str, other: &TensorHandle) -> Result<(), String> {
        if Arc::ptr_eq(&self.core, &other.core) {
            Ok(())
        } else {
            Err(format!(
                "{op}: the operands belong to different tensor engines; move data between engines with fetch and from-bytes"
            ))
        }
    }

    /// A new tensor from this one (and maybe `other`), or a poisoned one
    /// when the operands are of different engines.
    fn derive(
        &self,
        label: &str,
        other: Option<&TensorHandle>,
        meta: Result<Meta, String>,
        op: Op,
    ) -> TensorHandle {
        let checked = other.map_or(Ok(()), |o| self.same_engine(label, o));
        // The layout a failed op's output reports is its first operand's,
        // as the mesh does.
        let meta_or = meta.unwrap_or_else(|_| self.meta.clone());
        match checked {
            Ok(()) => new_tensor(&self.core, meta_or, op),
            Err(e) => new_tensor(&self.core, meta_or, Op::Refused(e)),
        }
    }

    pub(crate) fn binary(&self, op: wit::BinaryOp, other: &TensorHandle) -> TensorHandle {
        let op = binary_of(op);
        let linear = matches!(op, BinaryOp::Add | BinaryOp::Sub);
        let meta = rules::binary_meta(op.name(), linear, &self.meta, &other.meta);
        let job = Op::Binary(op, self.handle, other.handle);
        self.derive(op.name(), Some(other), meta, job)
    }

    pub(crate) fn scalar(&self, op: wit::BinaryOp, value: f64) -> TensorHandle {
        let op = binary_of(op);
        let linear = matches!(op, BinaryOp::Mul | BinaryOp::Div);
        let meta = rules::elementwise_meta(op.name(), linear, &self.meta);
        self.derive(op.name(), None, meta, Op::Scalar(op, self.handle, value))
    }

    pub(crate) fn unary(&self, op: wit::UnaryOp) -> TensorHandle {
        let op = match op {
            wit::UnaryOp::Neg => UnaryOp::Neg,
            wit::UnaryOp::Relu => UnaryOp::Relu,
            wit::UnaryOp::Exp => UnaryOp::Exp,
        };
        let meta = rules::elementwise_meta(op.name(), op == UnaryOp::Neg, &self.meta);
        self.derive(op.name(), None, meta, Op::Unary(op, self.handle))
    }

    pub(crate) fn matmul(&self, other: &TensorHandle) -> TensorHandle {
        let meta = rules::matmul_meta(&self.meta, &other.meta);
        let job = Op::Matmul(self.handle, other.handle);
        self.derive("matmul", Some(other), meta, job)
    }

    pub(crate) fn transpose(&self) -> TensorHandle {
        let meta = rules::transpose_meta(&self.meta);
        self.derive("transpose", None, meta, Op::Transpose(self.handle))
    }

    pub(crate) fn sum(&self, dim: Option<u32>) -> TensorHandle {
        let dim = dim.map(|d| d as usize);
        let meta = rules::sum_meta(&self.meta, dim);
        self.derive("sum", None, meta, Op::Sum(self.handle, dim))
    }

    pub(crate) fn copy(&self) -> TensorHandle {
        self.derive("copy", None, Ok(self.meta.clone()), Op::Copy(self.handle))
    }

    /// `axpy` and `assign` change `self` in place; operands of another
    /// engine poison it.
    pub(crate) fn axpy(&self, alpha: f64, x: &TensorHandle) {
        match self.same_engine("axpy", x) {
            Ok(()) => self.core.send(Job::Axpy(self.handle, alpha, x.handle)),
            Err(e) => self.poison_in_place(e),
        }
    }

    pub(crate) fn assign(&self, src: &TensorHandle) {
        match self.same_engine("assign", src) {
            Ok(()) => self.core.send(Job::Assign(self.handle, src.handle)),
            Err(e) => self.poison_in_place(e),
        }
    }

    /// Poisons `self` where it stands: the driver replaces its handle's
    /// tensor by a poisoned one.
    fn poison_in_place(&self, reason: String) {
        self.core.send(Job::Op {
            out: self.handle,
            meta: self.meta.clone(),
            op: Op::Refused(reason),
        });
    }

    /// `all-reduce`: the layout becomes what it will be once the sum is in
    /// (ops made from now on run after it, TE-1).
    pub(crate) fn all_reduce(&mut self, mesh_dim: &str, id: u64, done: Completions) {
        match self.core.mesh_dim(mesh_dim) {
            Ok(dim) => {
                if let Ok(meta) = rules::all_reduce_meta(&self.meta, dim, &self.core.shape) {
                    self.meta = meta;
                }
                self.wait(id, Wait::AllReduce(self.handle, dim), done);
            }
            Err(e) => refuse(id, &done, format!("all-reduce: {e}")),
        }
    }

    pub(crate) fn fetch(&self, id: u64, done: Completions) {
        self.wait(id, Wait::Fetch(self.handle), done);
    }

    pub(crate) fn fetch_shard(&self, rank: u32, id: u64, done: Completions) {
        self.wait(id, Wait::FetchShard(self.handle, rank as usize), done);
    }

    pub(crate) fn sync(&self, id: u64, done: Completions) {
        self.wait(id, Wait::Sync(Some(self.handle)), done);
    }

    pub(crate) fn send_shard(
        &self,
        from: u32,
        dst: &TensorHandle,
        to: u32,
        id: u64,
        done: Completions,
    ) {
        if let Err(e) = self.same_engine("send-shard", dst) {
            return refuse(id, &done, e);
        }
        let wait = Wait::SendShard {
            src: self.handle,
            from: from as usize,
            dst: dst.handle,
            to: to as usize,
        };
        self.wait(id, wait, done);
    }

    fn wait(&self, id: u64, wait: Wait, done: Completions) {
        self.core.send(Job::Wait { id, wait, done });
    }
}

/// Ends request `id` at once with `invalid`.
fn refuse(id: u64, done: &Completions, reason: String) {
    let _ = done.send(Event {
        id,
        kind: EventKind::Done(Err(errors::invalid(reason))),
    });
}

fn dtype_of(dtype: wit::Dtype) -> DType {
    match dtype {
        wit::Dtype::Float32 => DType::F32,
        wit::Dtype::Float64 => DType::F64,
        wit::Dtype::Int64 => DType::I64,
    }
}

fn device_of(device: wit::Device) -> Device {
    match device {
        wit::Device::Cpu => Device::Cpu,
        wit::Device::Cuda(n) => Device::Cuda(n as usize),
    }
}

fn binary_of(op: wit::BinaryOp) -> BinaryOp {
    match op {
        wit::BinaryOp::Add => BinaryOp::Add,
        wit::BinaryOp::Sub => BinaryOp::Sub,
        wit::BinaryOp::Mul => BinaryOp::Mul,
        wit::BinaryOp::Div => BinaryOp::Div,
    }
}

fn init_of(init: wit::Init) -> Init {
    match init {
        wit::Init::Zeros => Init::Zeros,
        wit::Init::Ones => Init::Ones,
        wit::Init::Full(value) => Init::Full(value),
        wit::Init::Uniform(u) => Init::Uniform {
            low: u.low,
            high: u.high,
            seed: u.seed,
        },
        wit::Init::Normal(n) => Init::Normal {
            mean: n.mean,
            std: n.std,
            seed: n.seed,
        },
        wit::Init::FromBytes(bytes) => Init::FromBytes(bytes),
    }
}

fn sharding_of(core: &EngineCore, sharding: &wit::Sharding) -> Result<Sharding, String> {
    Ok(match sharding {
        wit::Sharding::Replicate => Sharding::Replicate,
        wit::Sharding::Shard(spec) => Sharding::Shard {
            mesh_dim: core.mesh_dim(&spec.mesh_dim)?,
            tensor_dim: spec.tensor_dim as usize,
        },
        wit::Sharding::Partial(dim) => Sharding::Partial {
            mesh_dim: core.mesh_dim(dim)?,
        },
    })
}

/// The driver: runs the jobs of one engine in order (TE-1), then stops the
/// workers once every handle is gone (TE-4).
async fn drive(mut mesh: TensorMesh, mut queue: mpsc::UnboundedReceiver<Job>) {
    let name = mesh.name().to_string();
    let mut tensors: HashMap<u64, TensorRef> = HashMap::new();
    while let Some(job) = queue.recv().await {
        match job {
            Job::Op { out, meta, op } => {
                let made = run_op(&mut mesh, &tensors, meta, op).await;
                if let Some(old) = tensors.insert(out, made) {
                    // `out` was poisoned in place: free what it held.
                    mesh.drop(&[&old]);
                }
            }
            Job::Axpy(y, alpha, x) => {
                if let (Some(y), Some(x)) = (tensors.get(&y), tensors.get(&x)) {
                    mesh.axpy(y, alpha, x);
                }
            }
            Job::Assign(dst, src) => {
                if let (Some(dst), Some(src)) = (tensors.get(&dst), tensors.get(&src)) {
                    mesh.assign(dst, src);
                }
            }
            Job::Drop(handle) => {
                if let Some(t) = tensors.remove(&handle) {
                    mesh.drop(&[&t]);
                }
            }
            Job::Wait { id, wait, done } => {
                let result = run_wait(&mut mesh, &mut tensors, wait).await;
                let kind =
                    EventKind::Done(result.map(Reply::Single).map_err(|e| call_error(&name, e)));
                // The guest may be gone; its event goes with it.
                let _ = done.send(Event { id, kind });
            }
        }
    }
    mesh.stop().await;
}

fn lookup(tensors: &HashMap<u64, TensorRef>, handle: u64) -> Result<&TensorRef, String> {
    tensors
        .get(&handle)
        .ok_or_else(|| format!("internal: tensor handle {handle} is unknown to its engine"))
}

async fn run_op(
    mesh: &mut TensorMesh,
    tensors: &HashMap<u64, TensorRef>,
    meta: Meta,
    op: Op,
) -> TensorRef {
    let one = |h: u64| lookup(tensors, h);
    let made = match op {
        Op::Create {
            init: Init::FromBytes(bytes),
            dims,
            dtype,
            device: Device::Cpu,
            sharding,
        } if bytes.len() > UPLOAD_ABOVE => {
            match Tensor::from_le_bytes(&bytes, &dims, dtype, Device::Cpu) {
                Ok(tensor) => mesh
                    .upload(&tensor, sharding)
                    .await
                    .map_err(|e| format!("create from bytes: {e}")),
                Err(e) => Err(format!("create from bytes: {e}")),
            }
        }
        Op::Create {
            init,
            dims,
            dtype,
            device,
            sharding,
        } => Ok(mesh.create(init, &dims, dtype, device, sharding)),
        Op::Binary(op, a, b) => one(a)
            .and_then(|a| Ok((a, one(b)?)))
            .map(|(a, b)| mesh.binary(op, a, b)),
        Op::Scalar(op, a, value) => one(a).map(|a| mesh.scalar(op, a, value)),
        Op::Unary(op, a) => one(a).map(|a| mesh.unary(op, a)),
        Op::Matmul(a, b) => one(a)
            .and_then(|a| Ok((a, one(b)?)))
            .map(|(a, b)| mesh.matmul(a, b)),
        Op::Transpose(a) => one(a).map(|a| mesh.transpose(a)),
        Op::Sum(a, dim) => one(a).map(|a| mesh.sum(a, dim)),
        Op::Copy(a) => one(a).map(|a| mesh.copy(a)),
        Op::Refused(reason) => Err(reason),
    };
    match made {
        Ok(t) => t,
        Err(reason) => mesh.poisoned(meta, reason),
    }
}

/// Runs a wait; `Ok` is the payload of its `done` event.
async fn run_wait(
    mesh: &mut TensorMesh,
    tensors: &mut HashMap<u64, TensorRef>,
    wait: Wait,
) -> Result<Vec<u8>, MeshError> {
    let one = |h: u64| lookup(tensors, h).map_err(MeshError::Invalid);
    match wait {
        Wait::AllReduce(h, dim) => {
            let mut t = one(h)?.clone();
            let result = mesh.all_reduce(&mut t, dim).await;
            // The handle now names the tensor with its new layout.
            tensors.insert(h, t);
            result.map(|()| Vec::new())
        }
        Wait::Fetch(h) => Ok(mesh.fetch(one(h)?).await?.to_le_bytes()?),
        Wait::FetchShard(h, rank) => Ok(mesh.fetch_shard(one(h)?, rank).await?.to_le_bytes()?),
        Wait::Sync(h) => {
            let t = match h {
                Some(h) => vec![one(h)?],
                None => Vec::new(),
            };
            mesh.sync(&t).await.map(|()| Vec::new())
        }
        Wait::SendShard { src, from, dst, to } => mesh
            .send_shard(one(src)?, from, one(dst)?, to)
            .await
            .map(|()| Vec::new()),
    }
}

/// A mesh error as the guest's `call-error`: a poisoned tensor a rank
/// reported is an endpoint error of that rank, a rank that could not take
/// a command lost its proc, anything else was refused by the controller.
fn call_error(mesh: &str, error: MeshError) -> CallError {
    match &error {
        MeshError::Poisoned {
            rank: Some(rank), ..
        } => errors::at_rank(ErrorKind::Endpoint, mesh, *rank, None, error.to_string()),
        MeshError::Failed { rank, reason } => {
            errors::at_rank(ErrorKind::ProcLost, mesh, *rank, None, reason.clone())
        }
        _ => errors::invalid(error.to_string()),
    }
}

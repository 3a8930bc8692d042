//! Sharded tensors on meshes: tensors that live on the procs of an actor
//! mesh, driven from the controller, which holds only handles.
//!
//! # The model
//!
//! A [`TensorMesh`] spawns one **tensor worker** ([`worker`], actor kind
//! [`TENSOR_KIND`]) per rank of an extent on a set of procs. A global
//! tensor is laid out over the ranks by a [`Sharding`]: replicated, split
//! along one tensor dimension over one mesh dimension, or held as partial
//! sums. Each worker holds its rank's shards in a map from **id** to
//! tensor; the controller holds [`TensorRef`]s: an id, the global shape,
//! dtype, device and sharding.
//!
//! - **Pipelining.** The controller chooses every id, so an op that names
//!   the output of the op before it need not wait for it: ops
//!   ([`TensorMesh::binary`], [`TensorMesh::matmul`]...) are casts in
//!   broadcast mode that return at once, and every worker runs them in the
//!   order they were sent (the casts' per-actor FIFO, CA-1). Only
//!   [`TensorMesh::fetch`], [`TensorMesh::sync`], [`TensorMesh::upload`],
//!   [`TensorMesh::all_reduce`] and [`TensorMesh::send_shard`] wait.
//! - **Moving shards.** [`TensorMesh::send_shard`] copies one rank's shard
//!   into another rank's, proc to proc through `monarch-rdma`: the source
//!   worker registers its shard in place with the process's RDMA manager,
//!   the destination worker READs it into its own shard's storage, and the
//!   source takes it back ([`command::ShardCommand`], `worker/shard.rs`).
//! - **Poisoning.** An op that fails on a worker (a shape mismatch, an
//!   integer division by zero) stores its reason under its output id; an
//!   op that reads a poisoned id poisons its output with the same reason,
//!   as Monarch does. The controller checks layouts before it sends (the
//!   rules in [`sharding`]), and an op it finds invalid poisons its output
//!   the same way without being sent. Either way the error surfaces, naming
//!   the op that failed, when the controller fetches or syncs.
//! - **Failures.** A proc that dies (the [`hyperactor_mesh::client::MeshClient`]'s
//!   events) fails the casts waiting on it (CA-3); a fetch from one of its
//!   ranks fails with the reason, and so does a sync. Its tensors are
//!   gone.
//!
//! # All-reduce
//!
//! [`TensorMesh::all_reduce`] sums a tensor over one mesh dimension, for
//! each group of ranks that differ only in that dimension, by one of two
//! paths chosen by size:
//!
//! - **A ring of the workers** for CPU shards of at least
//!   [`TensorMeshOptions::ring_min_bytes`] (256 KiB): the controller casts
//!   one command to each rank of the group and the workers do the rest
//!   among themselves, a reduce-scatter then an all-gather in chunks
//!   (`worker/ring.rs`, RG-1..RG-4), each rank sending `2 (n - 1) / n` of
//!   its shard to the next; none of the bulk bytes pass through the
//!   controller. When a rank fails, the controller aborts its ring.
//! - **The multicast tree** otherwise (small or device shards): for each
//!   chunk of the local tensor, a `fetch` is cast to the group with the
//!   dtype's elementwise reducer (`sum-f32s`, `sum-f64s`, `sum-i64s`,
//!   hyperactor-mesh's RD-5), so replies are summed at every hop and one
//!   sum per chunk reaches the controller; a `write` casts it back to the
//!   group. Fewer hops than a ring, so less latency for small tensors.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo(client: std::sync::Arc<hyperactor_mesh::client::MeshClient>,
//! #               procs: Vec<hyperactor::ProcId>) -> Result<(), monarch_tensor::mesh::MeshError> {
//! use monarch_tensor::mesh::{BinaryOp, Init, Sharding, TensorMesh};
//! use monarch_tensor::{DType, Device};
//!
//! let mut mesh = TensorMesh::spawn(client, &procs, vec![("gpus".into(), 4)]).await?;
//! let rows = Sharding::Shard { mesh_dim: 0, tensor_dim: 0 };
//! let x = mesh.create(Init::Normal { mean: 0.0, std: 1.0, seed: 1 }, &[256, 8], DType::F32, Device::Cpu, rows);
//! let w = mesh.create(Init::Ones, &[8, 1], DType::F32, Device::Cpu, Sharding::Replicate);
//! let y = mesh.matmul(&x, &w);                 // [256, 1], split by rows
//! let xt = mesh.transpose(&x);                 // [8, 256], split by columns
//! let mut g = mesh.matmul(&xt, &y);            // [8, 1], partial sums
//! mesh.all_reduce(&mut g, 0).await?;           // now replicated
//! mesh.axpy(&w, -0.01, &g);                    // w -= 0.01 g, in place
//! let w_now = mesh.fetch(&w).await?;           // a CPU tensor
//! # let _ = (w_now, BinaryOp::Add); Ok(()) }
//! ```

mod client;
pub mod command;
pub mod sharding;
pub mod worker;

pub use client::{MeshError, TensorMesh, TensorMeshOptions, TensorRef};
pub use command::{BinaryOp, Command, Init, UnaryOp};
pub use sharding::{MeshShape, Meta, Sharding};
pub use worker::{TENSOR_KIND, TensorWorker, register};

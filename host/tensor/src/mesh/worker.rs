//! The tensor worker: the mesh actor (kind [`TENSOR_KIND`]) that holds one
//! rank's shards and runs the controller's commands on them.
//!
//! Each worker keeps a map from tensor id to `Result<Tensor, String>`: a
//! tensor, or the reason it could not be made (a **poisoned** id). Ops
//! always reply empty; their failures are stored, inherited by the ops
//! that read them, and come back at `fetch` or `sync`. Only a message
//! that is not a valid command, or sent to the wrong endpoint, is an error
//! reply at once.
//!
//! - TW-1: a worker never panics on a message: every archive is validated,
//!   every tensor operation is checked (the tensor crate's T-6).
//! - TW-2: an op with a poisoned input poisons its output with the input's
//!   reason, unchanged; a failed op poisons its output with a reason that
//!   names the op, its operands and the tensor crate's error.
//! - TW-3: random and byte-initialized tensors are built whole from the
//!   seed or bytes and cut to the rank's shard, so the global tensor is the
//!   same whatever the sharding (at the cost of building the whole tensor
//!   on every rank).

use std::collections::HashMap;
use std::sync::Arc;

use hyperactor::{Actor, Context, Exports, Handler};
use hyperactor_mesh::MeshCall;
use hyperactor_mesh::agent::{Registry, SpawnArgs, SpawnedActor};

use super::command::{ArchivedCommand, BinaryOp, Command, Init, UnaryOp};
use super::sharding::{MeshShape, Sharding};
use crate::{DType, Device, Tensor};

mod ring;
mod shard;

/// The actor kind of tensor workers in a [`Registry`].
pub const TENSOR_KIND: &str = "tensor";

/// Registers the [`TENSOR_KIND`] factory: every proc whose registry has it
/// can hold the shards of a [`super::TensorMesh`].
pub fn register(registry: &mut Registry) {
    registry.register(
        TENSOR_KIND,
        Arc::new(|args: SpawnArgs| {
            Box::pin(async move {
                let worker = TensorWorker::new(args.rank, MeshShape::of_extent(&args.extent));
                SpawnedActor::start(&args, worker).await
            })
        }),
    );
}

/// One rank's shards; see the module docs.
pub struct TensorWorker {
    rank: u32,
    mesh: MeshShape,
    tensors: HashMap<u64, Result<Tensor, String>>,
    /// Shards registered for RDMA transfers, by lease ([`shard`]).
    lent: HashMap<u64, shard::Lent>,
    /// Where the rank before this one in a ring all-reduce sends its
    /// chunks ([`ring`]); opened on the first ask.
    ring: Option<ring::RingPort>,
}

impl Actor for TensorWorker {
    fn exports(exports: &mut Exports<Self>) {
        exports.handle::<MeshCall>();
    }
}

impl Handler<MeshCall> for TensorWorker {
    async fn handle(&mut self, cx: &Context<Self>, call: MeshCall) -> anyhow::Result<()> {
        let reply = match self.call_shard(&call.endpoint, &call.message).await {
            Some(reply) => reply,
            None => match self.call_ring(cx, &call.endpoint, &call.message).await {
                Some(reply) => reply,
                None => self.call(&call.endpoint, &call.message),
            },
        };
        if let Err(error) = &reply {
            tracing::debug!(actor = %cx.actor_id(), endpoint = %call.endpoint, %error, "tensor command refused");
        }
        call.reply.send(cx, reply);
        Ok(())
    }
}

type Reply = Result<Vec<u8>, String>;

/// A message after validation: a command to run, or a write already done.
enum Decoded {
    Command(Command),
    Replied(Reply),
}

impl TensorWorker {
    /// The worker of `rank` in a mesh of this shape.
    pub fn new(rank: u32, mesh: MeshShape) -> TensorWorker {
        TensorWorker {
            rank,
            mesh,
            tensors: HashMap::new(),
            lent: HashMap::new(),
            ring: None,
        }
    }

    /// How many ids it holds (tensors and poisoned ids).
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether it holds no ids.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Handles one call: `endpoint` and its message. The reply is empty for
    /// ops, bytes for `fetch`; an error only for a bad message, or for
    /// `fetch`, `write` and `sync` on poisoned or missing tensors.
    pub fn call(&mut self, endpoint: &str, message: &[u8]) -> Reply {
        if !super::command::ENDPOINTS.contains(&endpoint) {
            return Err(format!(
                "no endpoint `{endpoint}`; a tensor worker has {}",
                super::command::ENDPOINTS.join(", ")
            ));
        }
        // One validation; writes, which carry bulk bytes, are read in place
        // from the archive, everything else is decoded.
        let decoded = Command::with_archived(message, |archived| match archived {
            ArchivedCommand::Write { id, start, bytes } => Decoded::Replied(
                check_endpoint(endpoint, "tensor.write")
                    .and_then(|()| self.write(id.to_native(), start.to_native(), bytes.as_slice())),
            ),
            other => match rkyv::deserialize::<Command, rkyv::rancor::Error>(other) {
                Ok(command) => Decoded::Command(command),
                Err(e) => Decoded::Replied(Err(format!(
                    "the message is not a valid tensor command: {e}"
                ))),
            },
        })?;
        match decoded {
            Decoded::Replied(reply) => reply,
            Decoded::Command(command) => {
                check_endpoint(endpoint, command.endpoint())?;
                self.run(command)
            }
        }
    }

    fn run(&mut self, command: Command) -> Reply {
        match command {
            Command::Create {
                id,
                init,
                dims,
                dtype,
                device,
                sharding,
            } => {
                let result = self.create(init, &dims, dtype.into(), device.into(), sharding);
                let result = result.map_err(|e| format!("tensor {id} = create: {e}"));
                self.tensors.insert(id, result);
            }
            Command::Binary { out, op, a, b } => {
                let label = format!("tensor {out} = {}({a}, {b})", op.name());
                let result = self.with2(a, b, &label, |x, y| match op {
                    BinaryOp::Add => x.add(y),
                    BinaryOp::Sub => x.sub(y),
                    BinaryOp::Mul => x.mul(y),
                    BinaryOp::Div => x.div(y),
                });
                self.tensors.insert(out, result);
            }
            Command::Scalar { out, op, a, value } => {
                let label = format!("tensor {out} = {}({a}, {value})", op.name());
                let result = self.with1(a, &label, |x| match op {
                    BinaryOp::Add => x.add_scalar(value),
                    BinaryOp::Sub => x.sub_scalar(value),
                    BinaryOp::Mul => x.mul_scalar(value),
                    BinaryOp::Div => x.div_scalar(value),
                });
                self.tensors.insert(out, result);
            }
            Command::Unary { out, op, a } => {
                let label = format!("tensor {out} = {}({a})", op.name());
                let result = self.with1(a, &label, |x| match op {
                    UnaryOp::Neg => x.neg(),
                    UnaryOp::Relu => x.relu(),
                    UnaryOp::Exp => x.exp(),
                });
                self.tensors.insert(out, result);
            }
            Command::Matmul { out, a, b } => {
                let label = format!("tensor {out} = matmul({a}, {b})");
                let result = self.with2(a, b, &label, Tensor::matmul);
                self.tensors.insert(out, result);
            }
            Command::Transpose { out, a } => {
                let label = format!("tensor {out} = transpose({a})");
                let result = self.with1(a, &label, Tensor::transpose);
                self.tensors.insert(out, result);
            }
            Command::Sum { out, a, dim } => {
                let result = match dim {
                    None => self.with1(a, &format!("tensor {out} = sum({a})"), Tensor::sum),
                    Some(d) => {
                        let label = format!("tensor {out} = sum({a}, dim {d})");
                        self.with1(a, &label, |x| {
                            x.sum_dim(usize::try_from(d).unwrap_or(usize::MAX))
                        })
                    }
                };
                self.tensors.insert(out, result);
            }
            Command::Axpy { y, alpha, x } => self.axpy(y, alpha, x),
            Command::Copy { out, a } => {
                let label = format!("tensor {out} = copy({a})");
                let result = self.with1(a, &label, Tensor::try_clone);
                self.tensors.insert(out, result);
            }
            Command::Assign { dst, src } => self.assign(dst, src),
            Command::Drop { ids } => {
                for id in ids {
                    self.tensors.remove(&id);
                }
            }
            Command::Fetch { id, start, len } => return self.fetch(id, start, len),
            Command::Write { id, start, bytes } => return self.write(id, start, &bytes),
            Command::Sync { ids } => {
                for id in ids {
                    self.get(id)?;
                }
            }
        }
        Ok(Vec::new())
    }

    /// Tensor `id`, or why not: its poison reason, or that it is missing.
    fn get(&self, id: u64) -> Result<&Tensor, String> {
        match self.tensors.get(&id) {
            Some(Ok(tensor)) => Ok(tensor),
            Some(Err(reason)) => Err(reason.clone()),
            None => Err(format!(
                "tensor {id} does not exist on rank {} (never created, or dropped)",
                self.rank
            )),
        }
    }

    fn with1(
        &self,
        a: u64,
        label: &str,
        f: impl FnOnce(&Tensor) -> crate::Result<Tensor>,
    ) -> Result<Tensor, String> {
        f(self.get(a)?).map_err(|e| format!("{label}: {e}"))
    }

    fn with2(
        &self,
        a: u64,
        b: u64,
        label: &str,
        f: impl FnOnce(&Tensor, &Tensor) -> crate::Result<Tensor>,
    ) -> Result<Tensor, String> {
        let (a, b) = (self.get(a)?, self.get(b)?);
        f(a, b).map_err(|e| format!("{label}: {e}"))
    }

    fn create(
        &self,
        init: Init,
        dims: &[u64],
        dtype: DType,
        device: Device,
        sharding: Sharding,
    ) -> Result<Tensor, String> {
        let dims: Vec<usize> = dims
            .iter()
            .map(|&d| {
                usize::try_from(d).map_err(|_| format!("dimension {d} does not fit in memory"))
            })
            .collect::<Result<_, _>>()?;
        self.mesh.check(sharding, dims.len())?;
        let rank = self.rank as usize;
        if let Sharding::Partial { mesh_dim } = sharding
            && self.mesh.coords(rank)[mesh_dim] != 0
        {
            // The global tensor is the sum over `mesh_dim`: the first rank
            // holds it, the others add nothing.
            return Tensor::zeros(&dims, dtype, device).map_err(|e| e.to_string());
        }
        let local = self.mesh.local_dims(&dims, sharding, rank);
        let shard = |whole: Tensor| -> crate::Result<Tensor> {
            match (sharding, self.mesh.shard_range(&dims, sharding, rank)) {
                (Sharding::Shard { tensor_dim, .. }, Some((start, len))) => {
                    whole.narrow(tensor_dim, start, len)?.to_device(device)
                }
                _ => whole.to_device(device),
            }
        };
        let tensor = match init {
            Init::Zeros => Tensor::zeros(&local, dtype, device),
            Init::Ones => Tensor::ones(&local, dtype, device),
            Init::Full(value) => Tensor::full(&local, value, dtype, device),
            // TW-3: the same global tensor whatever the sharding.
            Init::Uniform { low, high, seed } => {
                Tensor::rand_uniform(&dims, low, high, seed, dtype, Device::Cpu).and_then(shard)
            }
            Init::Normal { mean, std, seed } => {
                Tensor::rand_normal(&dims, mean, std, seed, dtype, Device::Cpu).and_then(shard)
            }
            Init::FromBytes(bytes) => {
                Tensor::from_le_bytes(&bytes, &dims, dtype, Device::Cpu).and_then(shard)
            }
        };
        tensor.map_err(|e| e.to_string())
    }

    fn axpy(&mut self, y: u64, alpha: f64, x: u64) {
        let label = format!("tensor {y} += {alpha} * tensor {x} (axpy)");
        let addend = match self.get(x) {
            Ok(_) if x != y => None,
            Ok(t) => Some(t.try_clone().map_err(|e| format!("{label}: {e}"))),
            Err(reason) => Some(Err(reason)),
        };
        let target = match self.tensors.remove(&y) {
            Some(Ok(target)) => Ok(target),
            Some(Err(reason)) => Err(reason),
            None => Err(format!(
                "tensor {y} does not exist on rank {} (never created, or dropped)",
                self.rank
            )),
        };
        let result = target.and_then(|mut target| {
            let outcome = match &addend {
                Some(Err(reason)) => return Err(reason.clone()),
                Some(Ok(copy)) => target.axpy(alpha, copy),
                None => match self.get(x) {
                    Ok(x) => target.axpy(alpha, x),
                    Err(reason) => return Err(reason),
                },
            };
            outcome
                .map(|()| target)
                .map_err(|e| format!("{label}: {e}"))
        });
        self.tensors.insert(y, result);
    }

    fn assign(&mut self, dst: u64, src: u64) {
        if dst == src {
            return;
        }
        let label = format!("tensor {dst} := tensor {src} (assign)");
        let target = match self.tensors.remove(&dst) {
            Some(Ok(target)) => Ok(target),
            Some(Err(reason)) => Err(reason),
            None => Err(format!(
                "tensor {dst} does not exist on rank {} (never created, or dropped)",
                self.rank
            )),
        };
        let result = target.and_then(|mut target| {
            let source = self.get(src)?;
            assign_into(&mut target, source)
                .map(|()| target)
                .map_err(|e| format!("{label}: {e}"))
        });
        self.tensors.insert(dst, result);
    }

    fn fetch(&self, id: u64, start: u64, len: u64) -> Reply {
        let tensor = self.get(id)?;
        let (start, len) =
            element_range(tensor, start, len).map_err(|e| format!("fetch of tensor {id}: {e}"))?;
        let size = tensor.dtype().size_of();
        if let Ok(bytes) = tensor.as_bytes() {
            return Ok(bytes[start * size..(start + len) * size].to_vec());
        }
        // Not on the CPU: copy the range out through a flat view.
        let flat = tensor
            .reshape(&[tensor.numel()])
            .and_then(|flat| flat.narrow(0, start, len))
            .and_then(|part| part.to_le_bytes());
        flat.map_err(|e| format!("fetch of tensor {id}: {e}"))
    }

    fn write(&mut self, id: u64, start: u64, bytes: &[u8]) -> Reply {
        let mut tensor = match self.tensors.remove(&id) {
            Some(Ok(tensor)) => tensor,
            Some(Err(reason)) => {
                self.tensors.insert(id, Err(reason.clone()));
                return Err(reason);
            }
            None => {
                return Err(format!(
                    "tensor {id} does not exist on rank {} (never created, or dropped)",
                    self.rank
                ));
            }
        };
        let result = write_into(&mut tensor, start, bytes);
        match result {
            Ok(()) => {
                self.tensors.insert(id, Ok(tensor));
                Ok(Vec::new())
            }
            Err(e) => {
                // A tensor written in part is neither the old nor the new one.
                let reason = format!("write to tensor {id}: {e}");
                self.tensors.insert(id, Err(reason.clone()));
                Err(reason)
            }
        }
    }
}

fn check_endpoint(endpoint: &str, expected: &str) -> Result<(), String> {
    if endpoint == expected {
        Ok(())
    } else {
        Err(format!(
            "endpoint `{endpoint}` got a `{expected}` command; send each command to its own endpoint"
        ))
    }
}

/// Elements `start .. start + len` of `tensor`, checked, as `usize`s.
fn element_range(tensor: &Tensor, start: u64, len: u64) -> Result<(usize, usize), String> {
    let numel = tensor.numel();
    match (usize::try_from(start), usize::try_from(len)) {
        (Ok(s), Ok(l)) if s.checked_add(l).is_some_and(|end| end <= numel) => Ok((s, l)),
        _ => Err(format!(
            "elements {start}..{} are out of range for a shard of {numel} elements",
            start.saturating_add(len)
        )),
    }
}

/// Overwrites elements of `tensor` from `start` with little-endian `bytes`.
fn write_into(tensor: &mut Tensor, start: u64, bytes: &[u8]) -> Result<(), String> {
    let size = tensor.dtype().size_of();
    if !bytes.len().is_multiple_of(size) {
        return Err(format!(
            "{} bytes are not a whole number of {} elements",
            bytes.len(),
            tensor.dtype()
        ));
    }
    let (start, len) = element_range(tensor, start, (bytes.len() / size) as u64)?;
    if tensor.device().is_cpu() {
        let storage = tensor.as_bytes_mut().map_err(|e| e.to_string())?;
        storage[start * size..(start + len) * size].copy_from_slice(bytes);
        return Ok(());
    }
    // On a device: through the host, whole (slow; see the docs).
    let device = tensor.device();
    let mut host = tensor.to_device(Device::Cpu).map_err(|e| e.to_string())?;
    let storage = host.as_bytes_mut().map_err(|e| e.to_string())?;
    storage[start * size..(start + len) * size].copy_from_slice(bytes);
    *tensor = host.to_device(device).map_err(|e| e.to_string())?;
    Ok(())
}

/// Copies `source` into `target`'s storage (equal shapes and dtypes).
fn assign_into(target: &mut Tensor, source: &Tensor) -> crate::Result<()> {
    if target.dims() != source.dims() {
        return Err(crate::Error::ShapeMismatch {
            op: "assign",
            lhs: target.shape().clone(),
            rhs: source.shape().clone(),
        });
    }
    if target.dtype() != source.dtype() {
        return Err(crate::Error::DTypeMismatch {
            op: "assign",
            lhs: target.dtype(),
            rhs: source.dtype(),
        });
    }
    if target.device().is_cpu() && source.device().is_cpu() {
        target.as_bytes_mut()?.copy_from_slice(source.as_bytes()?);
    } else {
        *target = source.to_device(target.device())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::command::WireDType;

    fn create(id: u64, init: Init, dims: &[u64], sharding: Sharding) -> Command {
        Command::Create {
            id,
            init,
            dims: dims.to_vec(),
            dtype: WireDType::F64,
            device: Device::Cpu.into(),
            sharding,
        }
    }

    fn send(worker: &mut TensorWorker, command: Command) -> Reply {
        worker.call(command.endpoint(), &command.encode())
    }

    fn fetch_all(worker: &mut TensorWorker, id: u64, len: u64) -> Reply {
        send(worker, Command::Fetch { id, start: 0, len })
    }

    #[test]
    fn tw1_garbage_and_wrong_endpoints_are_error_replies() {
        let mut worker = TensorWorker::new(0, MeshShape::new(vec![2]));
        let error = worker.call("tensor.create", b"garbage").unwrap_err();
        assert!(error.contains("not a valid tensor command"), "{error}");
        let error = worker.call("tensor.nope", &[]).unwrap_err();
        assert!(error.contains("no endpoint `tensor.nope`"), "{error}");
        let sync = Command::Sync { ids: vec![] }.encode();
        let error = worker.call("tensor.fetch", &sync).unwrap_err();
        assert!(error.contains("got a `tensor.sync` command"), "{error}");
        let write = Command::Write {
            id: 1,
            start: 0,
            bytes: vec![],
        }
        .encode();
        assert!(worker.call("tensor.sync", &write).is_err());
        assert!(worker.is_empty(), "nothing was run");
    }

    #[test]
    fn tw2_poison_names_the_op_and_spreads_unchanged() {
        let mut worker = TensorWorker::new(0, MeshShape::new(vec![1]));
        send(
            &mut worker,
            create(1, Init::Ones, &[2, 3], Sharding::Replicate),
        )
        .unwrap();
        send(
            &mut worker,
            create(2, Init::Ones, &[3, 2], Sharding::Replicate),
        )
        .unwrap();
        let add = Command::Binary {
            out: 3,
            op: BinaryOp::Add,
            a: 1,
            b: 2,
        };
        assert_eq!(send(&mut worker, add), Ok(Vec::new()), "ops never fail");
        let reason = fetch_all(&mut worker, 3, 6).unwrap_err();
        assert!(
            reason.starts_with("tensor 3 = add(1, 2): add: shapes differ"),
            "{reason}"
        );
        send(
            &mut worker,
            Command::Unary {
                out: 4,
                op: UnaryOp::Exp,
                a: 3,
            },
        )
        .unwrap();
        assert_eq!(fetch_all(&mut worker, 4, 6).unwrap_err(), reason);
        send(
            &mut worker,
            Command::Axpy {
                y: 1,
                alpha: 1.0,
                x: 4,
            },
        )
        .unwrap();
        assert_eq!(
            send(&mut worker, Command::Sync { ids: vec![2, 1] }).unwrap_err(),
            reason
        );
        let missing = send(&mut worker, Command::Sync { ids: vec![9] }).unwrap_err();
        assert!(missing.contains("tensor 9 does not exist"), "{missing}");
    }

    #[test]
    fn tw3_random_shards_are_cut_from_the_same_global_tensor() {
        let dims = [5u64, 3];
        let init = Init::Uniform {
            low: -1.0,
            high: 1.0,
            seed: 11,
        };
        let whole = Tensor::rand_uniform(&[5, 3], -1.0, 1.0, 11, DType::F64, Device::Cpu).unwrap();
        let split = Sharding::Shard {
            mesh_dim: 0,
            tensor_dim: 0,
        };
        let mut parts = Vec::new();
        for rank in 0..2 {
            let mut worker = TensorWorker::new(rank, MeshShape::new(vec![2]));
            send(&mut worker, create(1, init.clone(), &dims, split)).unwrap();
            let rows = if rank == 0 { 3 } else { 2 };
            let bytes = fetch_all(&mut worker, 1, rows * 3).unwrap();
            parts.push(
                Tensor::from_le_bytes(&bytes, &[rows as usize, 3], DType::F64, Device::Cpu)
                    .unwrap(),
            );
        }
        let joined = Tensor::cat(&[&parts[0], &parts[1]], 0).unwrap();
        assert_eq!(
            joined.to_vec::<f64>().unwrap(),
            whole.to_vec::<f64>().unwrap()
        );
    }

    #[test]
    fn writes_land_in_place_and_bad_ranges_poison() {
        let mut worker = TensorWorker::new(0, MeshShape::new(vec![1]));
        send(
            &mut worker,
            create(1, Init::Zeros, &[4], Sharding::Replicate),
        )
        .unwrap();
        let bytes: Vec<u8> = [7.0f64, 8.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let write = Command::Write {
            id: 1,
            start: 1,
            bytes: bytes.clone(),
        };
        send(&mut worker, write).unwrap();
        let fetched = fetch_all(&mut worker, 1, 4).unwrap();
        let values = Tensor::from_le_bytes(&fetched, &[4], DType::F64, Device::Cpu).unwrap();
        assert_eq!(values.to_vec::<f64>().unwrap(), vec![0.0, 7.0, 8.0, 0.0]);
        let past_the_end = Command::Write {
            id: 1,
            start: 3,
            bytes,
        };
        let error = send(&mut worker, past_the_end).unwrap_err();
        assert!(error.contains("out of range"), "{error}");
        assert_eq!(fetch_all(&mut worker, 1, 4).unwrap_err(), error);
        let error = fetch_all(&mut worker, 9, 1).unwrap_err();
        assert!(error.contains("does not exist"), "{error}");
    }
}

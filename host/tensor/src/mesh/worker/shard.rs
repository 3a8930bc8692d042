//! Moving shards between procs through RDMA buffers: the worker's side of
//! [`crate::mesh::TensorMesh::send_shard`] ([`ShardCommand`]s).
//!
//! - **Lend** registers a shard with the process's RDMA manager
//!   ([`monarch_rdma::mesh::process_manager`], shared with the proc's rdma
//!   actor). A CPU shard is registered **in place** (zero-copy, per the
//!   contract in `docs/tensor.md`, "The contract for RDMA"): the tensor
//!   moves out of the map into the region's keep-alive value, and the map
//!   holds a poison reason meanwhile ("tensor 3 is lent to an RDMA
//!   transfer..."), so nothing reads or writes the storage while a peer
//!   may. A shard on a device is copied to a registered host region.
//! - **ReadInto** reads a whole shard from a handle, one-sided, into the
//!   tensor's own storage (registered for the read and deregistered
//!   after, the tensor held by the keep-alive meanwhile), or through a host
//!   region for a device shard. A failed read poisons the tensor: some
//!   bytes may have landed.
//! - **Release** deregisters the lease (waiting until no access runs,
//!   RD-6) and puts the tensor back, unless its id was given to another
//!   tensor meanwhile.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use monarch_rdma::mesh::{OwnedTransfer, process_manager, process_transfer};
use monarch_rdma::{Buffer, BufferHandle, Direction, RdmaManager, Region};

use super::{Reply, TensorWorker, check_endpoint};
use crate::mesh::command::{SHARD_ENDPOINTS, ShardCommand};
use crate::{Device, Tensor};

/// How long a release waits for the RDMA layer to let go of a shard's
/// memory after deregistering it (it lets go when its last access ends,
/// which deregistration already waited for).
const RECLAIM_WAIT: Duration = Duration::from_secs(2);

/// A shard registered for a transfer.
pub(in crate::mesh) struct Lent {
    id: u64,
    buffer: Buffer,
    /// When the tensor's own storage is registered (none for a copy): the
    /// tensor, and the poison reason the map holds under `id` while the
    /// tensor is out of it.
    in_place: Option<(Arc<Held>, String)>,
}

/// A tensor whose storage is registered: the region's keep-alive value.
/// The mutex is never locked while registered (only to give the tensor
/// back); it makes the holder `Sync`.
struct Held(Mutex<Tensor>);

impl TensorWorker {
    /// Handles a [`ShardCommand`]; `None` when `endpoint` is not one of
    /// [`SHARD_ENDPOINTS`].
    pub(super) async fn call_shard(&mut self, endpoint: &str, message: &[u8]) -> Option<Reply> {
        if !SHARD_ENDPOINTS.contains(&endpoint) {
            return None;
        }
        Some(self.run_shard(endpoint, message).await)
    }

    async fn run_shard(&mut self, endpoint: &str, message: &[u8]) -> Reply {
        let command = ShardCommand::decode(message)?;
        check_endpoint(endpoint, command.endpoint())?;
        match command {
            ShardCommand::Lend { id, lease } => self.lend(id, lease).await,
            ShardCommand::ReadInto {
                id,
                handle,
                timeout_ms,
            } => {
                let timeout = Duration::from_millis(timeout_ms.max(1));
                self.read_shard(id, &handle, timeout).await
            }
            ShardCommand::Release { lease } => {
                self.release(lease).await;
                Ok(Vec::new())
            }
        }
    }

    /// How many shards are registered for transfers.
    pub fn lent(&self) -> usize {
        self.lent.len()
    }

    async fn manager(&self, id: u64) -> Result<RdmaManager, String> {
        process_manager()
            .await
            .map_err(|e| format!("tensor {id}: this proc has no RDMA manager: {e}"))
    }

    /// Takes tensor `id` out of the map, or says why not (leaving poison
    /// in place).
    fn take(&mut self, id: u64) -> Result<Tensor, String> {
        match self.tensors.remove(&id) {
            Some(Ok(tensor)) => Ok(tensor),
            Some(Err(reason)) => {
                self.tensors.insert(id, Err(reason.clone()));
                Err(reason)
            }
            None => Err(format!(
                "tensor {id} does not exist on rank {} (never created, or dropped)",
                self.rank
            )),
        }
    }

    async fn lend(&mut self, id: u64, lease: u64) -> Reply {
        if self.lent.contains_key(&lease) {
            return Err(format!(
                "lease {lease} is already in use on rank {}",
                self.rank
            ));
        }
        let manager = self.manager(id).await?;
        let label = |e: &dyn std::fmt::Display| format!("lending tensor {id}: {e}");
        let tensor = self.take(id)?;
        if !tensor.device().is_cpu() {
            // No device pointers yet: lend a host copy; the shard stays.
            let copy = copy_to_region(&tensor);
            self.tensors.insert(id, Ok(tensor));
            let buffer = manager.register(copy?).map_err(|e| label(&e))?;
            let handle = buffer.handle();
            let lent = Lent {
                id,
                buffer,
                in_place: None,
            };
            self.lent.insert(lease, lent);
            return Ok(handle.to_bytes());
        }
        let (region, held) = register_in_place(tensor);
        match manager.register(region) {
            Ok(buffer) => {
                let handle = buffer.handle();
                let lent_reason = format!(
                    "tensor {id} is lent to an RDMA transfer on rank {} (lease {lease}) and not released",
                    self.rank
                );
                self.tensors.insert(id, Err(lent_reason.clone()));
                let lent = Lent {
                    id,
                    buffer,
                    in_place: Some((held, lent_reason)),
                };
                self.lent.insert(lease, lent);
                Ok(handle.to_bytes())
            }
            Err(e) => {
                // Nothing was registered: the tensor goes back unchanged.
                let restored = reclaim(held).await;
                self.tensors.insert(id, restored);
                Err(label(&e))
            }
        }
    }

    async fn release(&mut self, lease: u64) {
        let Some(lent) = self.lent.remove(&lease) else {
            return;
        };
        lent.buffer.deregister().await;
        let Some((held, lent_reason)) = lent.in_place else {
            return;
        };
        let restored = reclaim(held).await;
        // Unless the id was given to another tensor meanwhile.
        if matches!(self.tensors.get(&lent.id), Some(Err(reason)) if *reason == lent_reason) {
            self.tensors.insert(lent.id, restored);
        }
    }

    async fn read_shard(&mut self, id: u64, handle: &[u8], timeout: Duration) -> Reply {
        let handle = BufferHandle::from_bytes(handle)
            .map_err(|e| format!("reading into tensor {id}: the source buffer's handle: {e}"))?;
        let manager = self.manager(id).await?;
        let tensor = self.take(id)?;
        if tensor.byte_len() as u64 != handle.len() {
            let reason = format!(
                "reading into tensor {id}: its shard {:?} has {} bytes, the source buffer {} has {}",
                tensor.dims(),
                tensor.byte_len(),
                handle.id(),
                handle.len()
            );
            self.tensors.insert(id, Ok(tensor));
            return Err(reason);
        }
        if handle.is_empty() {
            self.tensors.insert(id, Ok(tensor));
            return Ok(Vec::new());
        }
        let label = format!(
            "tensor {id} = read of buffer {} (from manager {})",
            handle.id(),
            handle.owner()
        );
        let (dims, dtype, device) = (tensor.dims().to_vec(), tensor.dtype(), tensor.device());
        if device.is_cpu() {
            let (region, held) = register_in_place(tensor);
            let buffer = match manager.register(region) {
                Ok(buffer) => buffer,
                Err(e) => {
                    let restored = reclaim(held).await;
                    self.tensors.insert(id, restored);
                    return Err(format!("{label}: {e}"));
                }
            };
            let moved = read(buffer, handle, timeout).await;
            let restored = reclaim(held).await;
            return match (moved, restored) {
                (Ok(()), Ok(tensor)) => {
                    self.tensors.insert(id, Ok(tensor));
                    Ok(Vec::new())
                }
                (Err(e), _) => self.poison(id, format!("{label}: {e}")),
                (Ok(()), Err(reason)) => self.poison(id, reason),
            };
        }
        // On a device: through a host region, then back to the device.
        let staged = Region::new(tensor.byte_len())
            .and_then(|region| manager.register(region))
            .map_err(|e| format!("{label}: {e}"));
        let staged = match staged {
            Ok(buffer) => buffer,
            Err(reason) => {
                self.tensors.insert(id, Ok(tensor));
                return Err(reason);
            }
        };
        let region = staged.region().clone();
        if let Err(e) = read(staged, handle, timeout).await {
            return self.poison(id, format!("{label}: {e}"));
        }
        let result = Tensor::from_le_bytes(&region.to_vec(), &dims, dtype, Device::Cpu)
            .and_then(|host| host.to_device(device));
        match result {
            Ok(tensor) => {
                self.tensors.insert(id, Ok(tensor));
                Ok(Vec::new())
            }
            Err(e) => self.poison(id, format!("{label}: {e}")),
        }
    }

    fn poison(&mut self, id: u64, reason: String) -> Reply {
        self.tensors.insert(id, Err(reason.clone()));
        Err(reason)
    }
}

/// Reads the whole of `remote` into `local` with the process manager,
/// then deregisters `local` (waiting until no access to it runs).
async fn read(
    local: Buffer,
    remote: BufferHandle,
    timeout: Duration,
) -> Result<(), monarch_rdma::RdmaError> {
    let local = Arc::new(local);
    let len = remote.len();
    let result = process_transfer(OwnedTransfer {
        direction: Direction::Read,
        local: Arc::clone(&local),
        local_offset: 0,
        remote,
        remote_offset: 0,
        len,
        timeout: Some(timeout),
    })
    .await;
    // The transfer's task has ended (it was awaited), so this is the last
    // clone unless the runtime dropped the task; then dropping deregisters.
    if let Ok(buffer) = Arc::try_unwrap(local) {
        buffer.deregister().await;
    }
    result.map(|_| ())
}

/// A CPU tensor's storage as a region, the tensor held by the region's
/// keep-alive value.
fn register_in_place(mut tensor: Tensor) -> (Region, Arc<Held>) {
    // `as_bytes_mut` only fails off the CPU, which callers have ruled
    // out; an empty slice would then register nothing.
    let (ptr, len) = match tensor.as_bytes_mut() {
        Ok(bytes) => (bytes.as_mut_ptr(), bytes.len()),
        Err(_) => (std::ptr::null_mut(), 0),
    };
    let held = Arc::new(Held(Mutex::new(tensor)));
    let keep_alive: Arc<dyn std::any::Any + Send + Sync> = held.clone();
    // SAFETY: `(ptr, len)` is the tensor's storage, which stays valid and
    // in place until the tensor is dropped or consumed (T-3; moving the
    // `Tensor` value does not move it). The tensor lives in `held`, which
    // the region keeps alive, and nobody touches it while the region is
    // registered: it is out of the worker's map, and it is only taken
    // back (`reclaim`) once the buffer is deregistered and the region is
    // gone. A null pointer comes only with `len == 0`.
    let region = unsafe { Region::from_raw_parts(ptr, len, keep_alive) };
    (region, held)
}

/// The tensor back from its holder, once the RDMA layer has let go of the
/// region (normally at once: deregistering waited for every access).
async fn reclaim(mut held: Arc<Held>) -> Result<Tensor, String> {
    let deadline = tokio::time::Instant::now() + RECLAIM_WAIT;
    loop {
        match Arc::try_unwrap(held) {
            Ok(Held(tensor)) => {
                return Ok(tensor.into_inner().unwrap_or_else(|e| e.into_inner()));
            }
            Err(shared) if tokio::time::Instant::now() < deadline => {
                held = shared;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(_) => {
                return Err(format!(
                    "the shard's storage was still held by the RDMA layer {RECLAIM_WAIT:?} after its transfer; it is lost"
                ));
            }
        }
    }
}

/// A copy of a (device) tensor in a new host region.
fn copy_to_region(tensor: &Tensor) -> Result<Region, String> {
    let host = tensor.to_device(Device::Cpu).map_err(|e| e.to_string())?;
    let bytes = host.as_bytes().map_err(|e| e.to_string())?;
    let region = Region::new(bytes.len()).map_err(|e| e.to_string())?;
    region.write(0, bytes).map_err(|e| e.to_string())?;
    Ok(region)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;
    use crate::mesh::command::{Command, Init, WireDType};
    use crate::mesh::sharding::{MeshShape, Sharding};

    fn worker_with(id: u64, values: &[f64]) -> TensorWorker {
        let mut worker = TensorWorker::new(0, MeshShape::new(vec![1]));
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let create = Command::Create {
            id,
            init: Init::FromBytes(bytes),
            dims: vec![values.len() as u64],
            dtype: WireDType::F64,
            device: Device::Cpu.into(),
            sharding: Sharding::Replicate,
        };
        worker.call(create.endpoint(), &create.encode()).unwrap();
        worker
    }

    async fn send(worker: &mut TensorWorker, command: ShardCommand) -> Reply {
        let reply = worker
            .call_shard(command.endpoint(), &command.encode())
            .await;
        reply.unwrap_or_else(|| Err("not a shard endpoint".into()))
    }

    fn fetch(worker: &mut TensorWorker, id: u64, len: u64) -> Result<Vec<f64>, String> {
        let command = Command::Fetch { id, start: 0, len };
        let bytes = worker.call(command.endpoint(), &command.encode())?;
        let t = Tensor::from_le_bytes(&bytes, &[len as usize], DType::F64, Device::Cpu).unwrap();
        Ok(t.to_vec::<f64>().unwrap())
    }

    #[tokio::test]
    async fn a_lent_shard_is_out_of_use_until_released_and_reads_land_in_place() {
        let mut owner = worker_with(1, &[1.0, 2.0, 3.0, 4.0]);
        let mut reader = worker_with(5, &[0.0; 4]);
        let handle = send(&mut owner, ShardCommand::Lend { id: 1, lease: 9 })
            .await
            .unwrap();
        assert_eq!(owner.lent(), 1);
        let error = fetch(&mut owner, 1, 4).unwrap_err();
        assert!(
            error.contains("tensor 1 is lent to an RDMA transfer"),
            "{error}"
        );
        let error = send(&mut owner, ShardCommand::Lend { id: 1, lease: 9 })
            .await
            .unwrap_err();
        assert!(error.contains("lease 9 is already in use"), "{error}");

        let read = ShardCommand::ReadInto {
            id: 5,
            handle: handle.clone(),
            timeout_ms: 10_000,
        };
        send(&mut reader, read.clone()).await.unwrap();
        assert_eq!(fetch(&mut reader, 5, 4).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);

        send(&mut owner, ShardCommand::Release { lease: 9 })
            .await
            .unwrap();
        assert_eq!(owner.lent(), 0);
        assert_eq!(fetch(&mut owner, 1, 4).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        // Releasing twice is harmless.
        send(&mut owner, ShardCommand::Release { lease: 9 })
            .await
            .unwrap();

        // The released buffer is gone: a read from it fails and poisons.
        let error = send(&mut reader, read).await.unwrap_err();
        assert!(error.contains("deregistered"), "{error}");
        assert_eq!(fetch(&mut reader, 5, 4).unwrap_err(), error);
    }

    #[tokio::test]
    async fn shard_commands_refuse_garbage_and_mismatched_lengths() {
        let mut owner = worker_with(1, &[1.0, 2.0]);
        let mut reader = worker_with(2, &[0.0; 3]);
        let error = reader
            .call_shard("tensor.read_into", b"garbage")
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            error.contains("not a valid tensor shard command"),
            "{error}"
        );
        let lend = ShardCommand::Lend { id: 1, lease: 1 }.encode();
        let error = owner
            .call_shard("tensor.release", &lend)
            .await
            .unwrap()
            .unwrap_err();
        assert!(error.contains("got a `tensor.lend` command"), "{error}");
        assert!(owner.call_shard("tensor.fetch", &lend).await.is_none());
        let error = send(&mut owner, ShardCommand::Lend { id: 7, lease: 1 })
            .await
            .unwrap_err();
        assert!(error.contains("tensor 7 does not exist"), "{error}");

        let handle = send(&mut owner, ShardCommand::Lend { id: 1, lease: 1 })
            .await
            .unwrap();
        let read = ShardCommand::ReadInto {
            id: 2,
            handle,
            timeout_ms: 10_000,
        };
        let error = send(&mut reader, read).await.unwrap_err();
        assert!(error.contains("has 24 bytes, the source buffer"), "{error}");
        assert_eq!(fetch(&mut reader, 2, 3).unwrap(), vec![0.0; 3], "unchanged");
        send(&mut owner, ShardCommand::Release { lease: 1 })
            .await
            .unwrap();
        assert_eq!(fetch(&mut owner, 1, 2).unwrap(), vec![1.0, 2.0]);
    }
}

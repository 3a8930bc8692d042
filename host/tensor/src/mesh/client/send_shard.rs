//! [`TensorMesh::send_shard`]: one rank's shard into another rank's,
//! through RDMA buffers.

use hyperactor_mesh::CastMode;

use super::{MeshError, TensorMesh, TensorRef};
use crate::mesh::command::{Command, ShardCommand};

impl TensorMesh {
    /// Overwrites rank `to`'s shard of `dst` with the bytes of rank
    /// `from`'s shard of `src` (same dtype, equal shard byte lengths; the
    /// shapes may differ). The bytes go from proc to proc, one-sided,
    /// never through the controller:
    ///
    /// 1. the worker of `from` registers its shard with its process's RDMA
    ///    manager, in place for a CPU shard, and replies with the buffer
    ///    handle (`tensor.lend`);
    /// 2. the worker of `to` READs that buffer into its shard's storage
    ///    (`tensor.read_into`);
    /// 3. the worker of `from` deregisters it and takes the shard back
    ///    (`tensor.release`, fire and forget).
    ///
    /// These are casts like every other command, so they run in order with
    /// the ops sent before and after (CA-1). A poisoned `src` (here or on
    /// `from`) is reported as [`MeshError::Poisoned`] and leaves `dst`
    /// unchanged; a read that fails on `to` poisons `dst`'s shard there.
    /// Dropping the future after step 1 leaves the source shard lent: ops
    /// that read it on `from` report that it was not released.
    pub async fn send_shard(
        &mut self,
        src: &TensorRef,
        from: usize,
        dst: &TensorRef,
        to: usize,
    ) -> Result<(), MeshError> {
        for rank in [from, to] {
            if rank >= self.mesh.len() {
                return Err(MeshError::Invalid(format!(
                    "send_shard: rank {rank} is out of range; the mesh has {} ranks",
                    self.mesh.len()
                )));
            }
        }
        self.check_poison(src)?;
        self.check_poison(dst)?;
        let src_dims = self
            .mesh
            .local_dims(&src.meta.dims, src.meta.sharding, from);
        let dst_dims = self.mesh.local_dims(&dst.meta.dims, dst.meta.sharding, to);
        let bytes =
            |dims: &[usize], t: &TensorRef| dims.iter().product::<usize>() * t.meta.dtype.size_of();
        let (src_bytes, dst_bytes) = (bytes(&src_dims, src), bytes(&dst_dims, dst));
        if src.meta.dtype != dst.meta.dtype || src_bytes != dst_bytes {
            return Err(MeshError::Invalid(format!(
                "send_shard: rank {from}'s shard of tensor {} is {} {src_dims:?} ({src_bytes} bytes), rank {to}'s shard of tensor {} is {} {dst_dims:?} ({dst_bytes} bytes): the dtypes and byte lengths must be equal",
                src.id, src.meta.dtype, dst.id, dst.meta.dtype
            )));
        }
        self.poll();
        for rank in [from, to] {
            if let Some(reason) = self.down(rank) {
                return Err(MeshError::Failed {
                    rank: rank as u32,
                    reason,
                });
            }
        }
        if from == to && src.id == dst.id {
            // Nothing moves; still report the source's poison, in order.
            let seq = self.request(
                [from],
                Command::Sync { ids: vec![src.id] },
                CastMode::Gather,
            );
            let result = self.wait(seq).await;
            return result
                .map(|_| ())
                .map_err(|e| self.rank_error(Some(src.id), e));
        }
        let lease = self.next_id;
        self.next_id += 1;
        let lend = self.shard_request(
            from,
            ShardCommand::Lend { id: src.id, lease },
            CastMode::Gather,
        );
        let handle = match self.wait(lend).await {
            Ok(mut replies) => replies.pop().unwrap_or_default(),
            Err(e) => return Err(self.rank_error(Some(src.id), e)),
        };
        let read = ShardCommand::ReadInto {
            id: dst.id,
            handle,
            timeout_ms: self.options.timeout.as_millis().max(1) as u64,
        };
        let read = self.shard_request(to, read, CastMode::Gather);
        let result = self.wait(read).await;
        // Whatever the read did, the source goes back: before any later
        // command to `from`, which follows it in the same order.
        self.shard_request(from, ShardCommand::Release { lease }, CastMode::Broadcast);
        result
            .map(|_| ())
            .map_err(|e| self.rank_error(Some(dst.id), e))
    }

    /// Casts a [`ShardCommand`] to `rank` through the mesh's tree (the same
    /// as every command's, so in order with them).
    fn shard_request(&mut self, rank: usize, command: ShardCommand, mode: CastMode) -> u64 {
        let target = self.target([rank]);
        self.caster.cast(
            target,
            command.endpoint(),
            command.encode(),
            mode,
            self.options.timeout,
        )
    }
}

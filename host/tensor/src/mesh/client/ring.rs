//! The controller's side of the ring all-reduce (`worker/ring.rs`): it
//! learns every worker's ring port once, then starts each group's ring
//! with one command per rank and waits for them all, aborting a group's
//! ring when one of its ranks fails.

use std::collections::HashMap;

use hyperactor::{PortId, RemoteMessage};
use hyperactor_mesh::CastMode;

use super::{MeshError, TensorMesh, TensorRef};
use crate::mesh::command::{RingCommand, RingMessage};

impl TensorMesh {
    /// Whether [`TensorMesh::all_reduce`] of `t` goes round a ring: CPU
    /// shards of at least [`super::TensorMeshOptions::ring_min_bytes`].
    pub(super) fn ring_fits(&self, t: &TensorRef, mesh_dim: usize) -> bool {
        if !t.meta.device.is_cpu() || self.mesh.sizes().get(mesh_dim).is_none_or(|&n| n < 2) {
            return false;
        }
        let local = self.mesh.local_dims(&t.meta.dims, t.meta.sharding, 0);
        let bytes = local.iter().product::<usize>() * t.meta.dtype.size_of();
        bytes >= self.options.ring_min_bytes
    }

    /// The ring all-reduce of `t` over `mesh_dim`: every group of ranks
    /// that differ only in `mesh_dim` is one ring. On failure the tensor
    /// is poisoned here too, since some ranks may hold sums and others not.
    pub(super) async fn ring_all_reduce(
        &mut self,
        t: &TensorRef,
        mesh_dim: usize,
    ) -> Result<(), MeshError> {
        let ports = self.ring_ports().await?;
        let dtype = t.meta.dtype.into();
        // Per cast: its group's index. Per group: its run and its ranks.
        let mut pending = HashMap::new();
        let mut runs = Vec::new();
        for group in self.mesh.groups(mesh_dim) {
            let local = self
                .mesh
                .local_dims(&t.meta.dims, t.meta.sharding, group[0]);
            let numel = local.iter().product::<usize>() as u64;
            let op = self.next_ring_op;
            self.next_ring_op += 1;
            let ring: Vec<PortId> = group.iter().map(|&r| ports[r].clone()).collect();
            for (position, &rank) in group.iter().enumerate() {
                let command = RingCommand::AllReduce {
                    id: t.id,
                    op,
                    numel,
                    dtype,
                    position: position as u32,
                    ports: ring.clone(),
                    chunk_bytes: self.options.chunk_bytes as u64,
                    window: self.options.window.max(1) as u32,
                    timeout_ms: self.options.timeout.as_millis() as u64,
                };
                let seq = self.ring_request(rank, &command, CastMode::Gather);
                pending.insert(seq, runs.len());
            }
            runs.push((op, group, false));
        }
        let mut first_error = None;
        while !pending.is_empty() {
            let wanted = pending.keys().copied().collect();
            let (seq, result) = self.wait_any(&wanted).await;
            let Some(run) = pending.remove(&seq) else {
                continue;
            };
            let Err(error) = result else {
                continue;
            };
            let error = self.rank_error(Some(t.id), error);
            let (op, group, aborted) = &mut runs[run];
            if !*aborted {
                // A rank that died or failed cannot pass an abort on: tell
                // every live rank of its ring (RG-2).
                *aborted = true;
                let reason = error_text(&error);
                for &rank in group.iter() {
                    if self.down(rank).is_none() {
                        self.client.mailbox().post(
                            &ports[rank],
                            RingMessage::Abort {
                                op: *op,
                                reason: reason.clone(),
                            },
                        );
                    }
                }
            }
            first_error.get_or_insert(error);
        }
        match first_error {
            Some(error) => {
                let reason = format!(
                    "tensor {}: all_reduce over mesh dim {mesh_dim} failed: {error}",
                    t.id
                );
                self.poisoned.insert(t.id, reason);
                Err(error)
            }
            None => Ok(()),
        }
    }

    /// Every rank's ring port, asked for once.
    async fn ring_ports(&mut self) -> Result<Vec<PortId>, MeshError> {
        if let Some(ports) = &self.ring_ports {
            return Ok(ports.clone());
        }
        let seq = self.request_with(
            0..self.mesh.len(),
            RingCommand::Port.endpoint(),
            RingCommand::Port.encode(),
            CastMode::Gather,
        );
        let replies = self.wait(seq).await.map_err(|e| self.rank_error(None, e))?;
        let ports = replies
            .iter()
            .enumerate()
            .map(|(rank, bytes)| {
                <PortId as RemoteMessage>::decode(bytes).map_err(|e| MeshError::Failed {
                    rank: rank as u32,
                    reason: format!("its ring port's id does not decode: {e}"),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if ports.len() != self.mesh.len() {
            return Err(MeshError::Invalid(format!(
                "{} ranks of {} named their ring ports",
                ports.len(),
                self.mesh.len()
            )));
        }
        self.ring_ports = Some(ports.clone());
        Ok(ports)
    }

    /// Casts a [`RingCommand`] to `rank` through the mesh's tree (the same
    /// as every command's, so in order with them).
    fn ring_request(&mut self, rank: usize, command: &RingCommand, mode: CastMode) -> u64 {
        self.request_with([rank], command.endpoint(), command.encode(), mode)
    }
}

/// A rank's error as the reason of the abort the others reply.
fn error_text(error: &MeshError) -> String {
    match error {
        MeshError::Poisoned { reason, .. } => reason.clone(),
        MeshError::Failed { rank, reason } => format!("rank {rank}: {reason}"),
        other => other.to_string(),
    }
}

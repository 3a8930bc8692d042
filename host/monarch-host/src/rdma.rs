//! The host side of the WIT `rdma` interface: buffers in host memory on
//! procs, as the guest holds them.
//!
//! The procs that hold a program's buffers run native RDMA actors
//! ([`monarch_rdma::mesh`]), a mesh of them per proc mesh, started the
//! first time the program allocates there (or opens a reference to a
//! buffer there). A buffer resource is the actors' mesh and the buffer's
//! [`RemoteBuffer`]; transfers run on the proc that holds the local side
//! (the destination of `read-into`, the source of `write-from`), which
//! reaches the other buffer through its handle, whatever mesh made it. Every request (a write, a read, a
//! transfer, a free) runs as its own task and posts exactly one `done`
//! event, within the program's call timeout:
//!
//! - RB-1: every request ends with one `done` event: the bytes, an empty
//!   payload, or an error naming the buffer and what went wrong.
//! - RB-2: the guest's memory is never registered: bytes enter and leave a
//!   buffer only as copies made by `write` and `read`.
//! - RB-3: dropping a handle frees nothing (references to the buffer may be
//!   out in payloads); `free` does, and the program's end does.

use std::sync::Arc;
use std::time::Duration;

use hyperactor::ProcId;
use hyperactor_mesh::client::MeshClient;
use monarch_rdma::mesh::{RdmaMesh, RdmaMeshOptions, RemoteBuffer};

use crate::bindings::{Completions, ErrorKind, Event, EventKind, Reply};
use crate::errors;

/// The RDMA actors of one instance: a mesh of them per proc mesh the
/// program allocates on, started on first use, so that errors name ranks of
/// that proc mesh.
#[derive(Default)]
pub(crate) struct RdmaMeshes {
    meshes: Vec<RdmaMesh>,
}

impl Drop for RdmaMeshes {
    /// The program ended: its RDMA actors stop and free their buffers
    /// (RB-3), also on a persistent mesh's procs, which outlive the job.
    fn drop(&mut self) {
        let meshes = std::mem::take(&mut self.meshes);
        if meshes.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                futures::future::join_all(meshes.iter().map(RdmaMesh::stop)).await;
            });
        }
    }
}

impl RdmaMeshes {
    async fn spawn(
        &mut self,
        client: Arc<MeshClient>,
        procs: &[ProcId],
        timeout: Duration,
    ) -> Result<RdmaMesh, String> {
        let options = RdmaMeshOptions {
            timeout,
            ..RdmaMeshOptions::default()
        };
        let mesh = RdmaMesh::spawn_with(client, procs, options)
            .await
            .map_err(|e| format!("cannot start the RDMA actors: {e}"))?;
        self.meshes.push(mesh.clone());
        Ok(mesh)
    }

    /// `buffer.allocate`: `size` bytes on the proc at `rank` of `procs`.
    pub(crate) async fn allocate(
        &mut self,
        client: Arc<MeshClient>,
        procs: &[ProcId],
        rank: u32,
        size: u64,
        timeout: Duration,
    ) -> Result<BufferHandle, String> {
        if rank as usize >= procs.len() {
            return Err(format!(
                "rank {rank} is out of range: the proc mesh has {} procs",
                procs.len()
            ));
        }
        let mesh = match self.meshes.iter().find(|m| m.procs() == procs) {
            Some(mesh) => mesh.clone(),
            None => self.spawn(client, procs, timeout).await?,
        };
        let buffer = tokio::time::timeout(timeout, mesh.alloc(rank as usize, size))
            .await
            .map_err(|_| {
                format!("allocating {size} bytes on rank {rank} took longer than the call timeout ({timeout:?})")
            })?
            .map_err(|e| format!("cannot allocate {size} bytes on rank {rank}: {e}"))?;
        Ok(BufferHandle { mesh, buffer })
    }

    /// `buffer.from-ref`: the buffer a reference names, served by an RDMA
    /// actor on its proc.
    pub(crate) async fn open_ref(
        &mut self,
        client: Arc<MeshClient>,
        reference: &[u8],
        timeout: Duration,
    ) -> Result<BufferHandle, String> {
        let buffer = RemoteBuffer::from_bytes(reference).map_err(|e| {
            tracing::debug!(error = %e, "a buffer reference did not decode");
            format!(
                "{} bytes are not a buffer reference (make one with to-ref)",
                reference.len()
            )
        })?;
        let proc = buffer.proc();
        let mesh = match self.meshes.iter().find(|m| m.procs().contains(proc)) {
            Some(mesh) => mesh.clone(),
            None => {
                self.spawn(client, std::slice::from_ref(proc), timeout)
                    .await?
            }
        };
        Ok(BufferHandle { mesh, buffer })
    }
}

/// A buffer as the guest holds it.
pub struct BufferHandle {
    mesh: RdmaMesh,
    buffer: RemoteBuffer,
}

impl BufferHandle {
    pub(crate) fn size(&self) -> u64 {
        self.buffer.len()
    }

    pub(crate) fn to_ref(&self) -> Vec<u8> {
        self.buffer.to_bytes()
    }

    pub(crate) fn write(
        &self,
        offset: u64,
        bytes: Vec<u8>,
        timeout: Duration,
        id: u64,
        done: Completions,
    ) {
        let (mesh, buffer) = (self.mesh.clone(), self.buffer.clone());
        finish(id, done, timeout, "write", async move {
            mesh.write(&buffer, offset, &bytes)
                .await
                .map(|_| Vec::new())
        });
    }

    pub(crate) fn read(
        &self,
        offset: u64,
        len: u64,
        timeout: Duration,
        id: u64,
        done: Completions,
    ) {
        let (mesh, buffer) = (self.mesh.clone(), self.buffer.clone());
        finish(id, done, timeout, "read", async move {
            mesh.read(&buffer, offset, len).await
        });
    }

    /// `src.read-into(dst)`: dst's proc reads src.
    pub(crate) fn read_into(
        src: &BufferHandle,
        dst: &BufferHandle,
        timeout: Duration,
        id: u64,
        done: Completions,
    ) {
        let (mesh, src, dst) = (dst.mesh.clone(), src.buffer.clone(), dst.buffer.clone());
        finish(id, done, timeout, "read-into", async move {
            mesh.read_into(&src, &dst).await.map(|_| Vec::new())
        });
    }

    /// `dst.write-from(src)`: src's proc writes into dst.
    pub(crate) fn write_from(
        dst: &BufferHandle,
        src: &BufferHandle,
        timeout: Duration,
        id: u64,
        done: Completions,
    ) {
        let (mesh, src, dst) = (src.mesh.clone(), src.buffer.clone(), dst.buffer.clone());
        finish(id, done, timeout, "write-from", async move {
            mesh.write_from(&dst, &src).await.map(|_| Vec::new())
        });
    }

    pub(crate) fn free(&self, timeout: Duration, id: u64, done: Completions) {
        let (mesh, buffer) = (self.mesh.clone(), self.buffer.clone());
        finish(id, done, timeout, "free", async move {
            mesh.free(buffer).await.map(|_| Vec::new())
        });
    }
}

/// Runs `work` on its own task and posts its `done` event (RB-1).
fn finish<E: std::fmt::Display>(
    id: u64,
    done: Completions,
    timeout: Duration,
    what: &'static str,
    work: impl Future<Output = Result<Vec<u8>, E>> + Send + 'static,
) {
    tokio::spawn(async move {
        let result = match tokio::time::timeout(timeout, work).await {
            Ok(Ok(bytes)) => Ok(Reply::Single(bytes)),
            Ok(Err(e)) => Err(errors::invalid(format!("{what}: {e}"))),
            Err(_) => Err(errors::unattributed(
                ErrorKind::Timeout,
                format!(
                    "{what}: no answer within {} ms (the call timeout)",
                    timeout.as_millis()
                ),
            )),
        };
        let _ = done.send(Event {
            id,
            kind: EventKind::Done(result),
        });
    });
}

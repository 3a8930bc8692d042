//! The rdma actor: the mesh actor (kind [`RDMA_KIND`]) that allocates,
//! fills, reads, transfers and frees its proc's buffers for a controller.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use hyperactor::{Actor, Context, Exports, Handler};
use hyperactor_mesh::MeshCall;
use hyperactor_mesh::agent::{Registry, SpawnArgs, SpawnedActor};

use super::command::{ENDPOINTS, RdmaCommand};
use super::{
    OwnedTransfer, insert_buffer, lookup_buffer, process_manager, process_transfer, remove_buffer,
};
use crate::{BufferHandle, Direction, RdmaManager};

/// The actor kind of rdma actors in a [`Registry`].
pub const RDMA_KIND: &str = "rdma";

/// Registers the [`RDMA_KIND`] factory: every proc whose registry has it
/// can hold the buffers of a [`super::RdmaMesh`].
pub fn register(registry: &mut Registry) {
    registry.register(
        RDMA_KIND,
        Arc::new(|args: SpawnArgs| {
            Box::pin(async move { SpawnedActor::start(&args, RdmaActor::new(args.rank)).await })
        }),
    );
}

/// One proc's rdma actor; see the module docs of [`crate::mesh`]. The
/// buffers it allocated are freed when it stops.
pub struct RdmaActor {
    rank: u32,
    allocated: HashSet<u64>,
}

impl Actor for RdmaActor {
    fn exports(exports: &mut Exports<Self>) {
        exports.handle::<MeshCall>();
    }
}

impl Drop for RdmaActor {
    fn drop(&mut self) {
        for id in self.allocated.drain() {
            remove_buffer(id);
        }
    }
}

type Reply = Result<Vec<u8>, String>;

/// What a command comes to: a reply now, or a transfer to run first.
enum Step {
    Reply(Reply),
    Transfer(OwnedTransfer),
}

impl Handler<MeshCall> for RdmaActor {
    async fn handle(&mut self, cx: &Context<Self>, call: MeshCall) -> anyhow::Result<()> {
        match self.start(&call.endpoint, &call.message).await {
            Step::Reply(reply) => {
                if let Err(error) = &reply {
                    tracing::debug!(actor = %cx.actor_id(), endpoint = %call.endpoint, %error, "rdma command refused");
                }
                call.reply.send(cx, reply);
            }
            Step::Transfer(transfer) => {
                // The transfer runs beside the actor, which takes the next
                // command meanwhile; the reply goes from the task.
                let mailbox = (**cx).clone();
                let port = call.reply;
                let (rank, endpoint) = (self.rank, call.endpoint);
                tokio::spawn(async move {
                    let reply = process_transfer(transfer)
                        .await
                        .map(|moved| moved.to_le_bytes().to_vec())
                        .map_err(|e| e.to_string());
                    if let Err(error) = &reply {
                        tracing::debug!(rank, %endpoint, %error, "rdma transfer failed");
                    }
                    port.send(&mailbox, reply);
                });
            }
        }
        Ok(())
    }
}

impl RdmaActor {
    /// The actor of `rank`.
    pub fn new(rank: u32) -> RdmaActor {
        RdmaActor {
            rank,
            allocated: HashSet::new(),
        }
    }

    /// How many buffers it allocated and has not freed.
    pub fn len(&self) -> usize {
        self.allocated.len()
    }

    /// Whether it holds no buffers it allocated.
    pub fn is_empty(&self) -> bool {
        self.allocated.is_empty()
    }

    /// Handles one call up to its reply, or up to the transfer it asks for.
    async fn start(&mut self, endpoint: &str, message: &[u8]) -> Step {
        match self.prepare(endpoint, message).await {
            Ok(step) => step,
            Err(reason) => Step::Reply(Err(reason)),
        }
    }

    async fn prepare(&mut self, endpoint: &str, message: &[u8]) -> Result<Step, String> {
        if !ENDPOINTS.contains(&endpoint) {
            return Err(format!(
                "no endpoint `{endpoint}`; an rdma actor has {}",
                ENDPOINTS.join(", ")
            ));
        }
        let command = RdmaCommand::decode(message)?;
        if command.endpoint() != endpoint {
            return Err(format!(
                "endpoint `{endpoint}` got a `{}` command; send each command to its own endpoint",
                command.endpoint()
            ));
        }
        let manager = process_manager()
            .await
            .map_err(|e| format!("this proc has no RDMA manager: {e}"))?;
        let reply = match command {
            RdmaCommand::Alloc { len } => {
                let size = usize::try_from(len)
                    .map_err(|_| format!("cannot allocate {len} bytes: too large"))?;
                let buffer = manager
                    .alloc(size)
                    .map_err(|e| format!("cannot allocate a buffer of {len} bytes: {e}"))?;
                let handle = insert_buffer(buffer);
                self.allocated.insert(handle.id());
                handle.to_bytes()
            }
            RdmaCommand::WriteBytes {
                buffer,
                offset,
                bytes,
            } => {
                let (handle, buffer) = local(&manager, &buffer)?;
                let at = usize::try_from(offset).unwrap_or(usize::MAX);
                buffer
                    .region()
                    .write(at, &bytes)
                    .map_err(|e| format!("write to buffer {}: {e}", handle.id()))?;
                Vec::new()
            }
            RdmaCommand::ReadBytes {
                buffer,
                offset,
                len,
            } => {
                let (handle, buffer) = local(&manager, &buffer)?;
                let fits = offset
                    .checked_add(len)
                    .is_some_and(|end| end <= buffer.len());
                if !fits {
                    return Err(format!(
                        "read of buffer {}: offset {offset} + length {len} exceeds its {} bytes",
                        handle.id(),
                        buffer.len()
                    ));
                }
                // Both fit in the buffer, which is in memory.
                let mut out = vec![0; len as usize];
                buffer
                    .region()
                    .read(offset as usize, &mut out)
                    .map_err(|e| format!("read of buffer {}: {e}", handle.id()))?;
                out
            }
            RdmaCommand::ReadInto {
                local: local_bytes,
                local_offset,
                remote,
                remote_offset,
                len,
                timeout_ms,
            }
            | RdmaCommand::WriteFrom {
                local: local_bytes,
                local_offset,
                remote,
                remote_offset,
                len,
                timeout_ms,
            } => {
                let direction = if endpoint == ENDPOINTS[3] {
                    Direction::Read
                } else {
                    Direction::Write
                };
                let (_, local_buffer) = local(&manager, &local_bytes)?;
                let remote = BufferHandle::from_bytes(&remote)
                    .map_err(|e| format!("the remote buffer's handle: {e}"))?;
                return Ok(Step::Transfer(OwnedTransfer {
                    direction,
                    local: local_buffer,
                    local_offset,
                    remote,
                    remote_offset,
                    len,
                    timeout: Some(Duration::from_millis(timeout_ms.max(1))),
                }));
            }
            RdmaCommand::Free { buffer } => {
                let (handle, _) = local(&manager, &buffer)?;
                remove_buffer(handle.id());
                self.allocated.remove(&handle.id());
                Vec::new()
            }
        };
        Ok(Step::Reply(Ok(reply)))
    }
}

/// The buffer of this proc named by handle bytes, validated.
fn local(
    manager: &RdmaManager,
    bytes: &[u8],
) -> Result<(BufferHandle, Arc<crate::Buffer>), String> {
    let handle =
        BufferHandle::from_bytes(bytes).map_err(|e| format!("the buffer's handle: {e}"))?;
    let buffer = lookup_buffer(manager, &handle)?;
    Ok((handle, buffer))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn call(actor: &mut RdmaActor, command: &RdmaCommand) -> Reply {
        match actor.start(command.endpoint(), &command.encode()).await {
            Step::Reply(reply) => reply,
            Step::Transfer(transfer) => process_transfer(transfer)
                .await
                .map(|n| n.to_le_bytes().to_vec())
                .map_err(|e| e.to_string()),
        }
    }

    #[tokio::test]
    async fn rm2_garbage_wrong_endpoints_and_unknown_buffers_are_error_replies() {
        let mut actor = RdmaActor::new(0);
        let Step::Reply(Err(error)) = actor.start("rdma.alloc", b"garbage").await else {
            panic!("garbage must be refused");
        };
        assert!(error.contains("not a valid rdma command"), "{error}");
        let Step::Reply(Err(error)) = actor.start("rdma.nope", &[]).await else {
            panic!("an unknown endpoint must be refused");
        };
        assert!(error.contains("no endpoint `rdma.nope`"), "{error}");
        let alloc = RdmaCommand::Alloc { len: 4 }.encode();
        let Step::Reply(Err(error)) = actor.start("rdma.free", &alloc).await else {
            panic!("a command on the wrong endpoint must be refused");
        };
        assert!(error.contains("got a `rdma.alloc` command"), "{error}");
        let bad_handle = RdmaCommand::Free {
            buffer: vec![1, 2, 3],
        };
        let error = call(&mut actor, &bad_handle).await.unwrap_err();
        assert!(error.contains("invalid buffer handle"), "{error}");
        assert!(actor.is_empty(), "nothing was allocated");
    }

    #[tokio::test]
    async fn rm3_bytes_go_in_and_out_and_a_freed_buffer_is_gone() {
        let mut actor = RdmaActor::new(0);
        let handle = call(&mut actor, &RdmaCommand::Alloc { len: 8 })
            .await
            .unwrap();
        assert_eq!(actor.len(), 1);
        let write = RdmaCommand::WriteBytes {
            buffer: handle.clone(),
            offset: 2,
            bytes: b"abc".to_vec(),
        };
        call(&mut actor, &write).await.unwrap();
        let read = RdmaCommand::ReadBytes {
            buffer: handle.clone(),
            offset: 0,
            len: 8,
        };
        assert_eq!(call(&mut actor, &read).await.unwrap(), b"\0\0abc\0\0\0");
        let past_the_end = RdmaCommand::ReadBytes {
            buffer: handle.clone(),
            offset: 6,
            len: u64::MAX,
        };
        let error = call(&mut actor, &past_the_end).await.unwrap_err();
        assert!(error.contains("exceeds its 8 bytes"), "{error}");
        let free = RdmaCommand::Free {
            buffer: handle.clone(),
        };
        call(&mut actor, &free).await.unwrap();
        assert!(actor.is_empty());
        let id = BufferHandle::from_bytes(&handle).unwrap().id();
        let error = call(&mut actor, &read).await.unwrap_err();
        assert_eq!(
            error,
            format!("buffer {id} is not allocated on this proc (freed, or never allocated)")
        );
    }
}

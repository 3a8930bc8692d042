//! The owner's side: the listener and one task per accepted connection.
//!
//! Each connection serves requests one after another. A request that is
//! well formed but refused (unknown buffer, wrong key, range) gets a status
//! and the connection stays open; a write's data is read and thrown away
//! first so the stream stays in step. A bad frame closes the connection
//! (RD-3). Data moves between the socket and the region's memory with no
//! buffer in between (RD-4).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::wire::{FrameError, Op, REQUEST_LEN, Request, Response, Status};
use super::{configure_stream, stopped};
use crate::ibverbs::IbvState;
use crate::ibverbs::handshake::{HANDSHAKE_LEN, QpInfo};
use crate::registry::{AccessRequest, Registry};

/// What every connection task of one manager shares.
pub(crate) struct ServerContext {
    pub(crate) registry: Arc<Registry>,
    pub(crate) ibverbs: Option<Arc<IbvState>>,
    pub(crate) socket_buffer_size: Option<usize>,
    #[cfg(test)]
    pub(crate) gate: Option<Arc<ServeGate>>,
}

/// Accepts connections until the manager shuts down.
pub(crate) fn spawn_listener(
    listener: TcpListener,
    context: Arc<ServerContext>,
    shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        let accept = async {
            loop {
                match listener.accept().await {
                    Ok((stream, peer)) => {
                        let context = Arc::clone(&context);
                        let shutdown = shutdown.clone();
                        tokio::spawn(async move {
                            tokio::select! {
                                () = serve_connection(stream, peer, &context) => {}
                                () = stopped(shutdown) => {}
                            }
                        });
                    }
                    Err(err) => {
                        // Out of file descriptors and the like: wait a little
                        // rather than spin, and keep listening.
                        tracing::warn!(error = %err, "rdma listener: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                }
            }
        };
        tokio::select! {
            () = accept => {}
            () = stopped(shutdown.clone()) => {}
        }
    });
}

#[derive(Debug, thiserror::Error)]
enum ServeError {
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    #[error("the stream ended inside a request")]
    Truncated,
    #[error("buffer {0} was deregistered while a chunk was being copied")]
    Revoked(u64),
    #[error("{0}")]
    Io(#[from] io::Error),
}

async fn serve_connection(mut stream: TcpStream, peer: SocketAddr, context: &ServerContext) {
    configure_stream(&stream, context.socket_buffer_size);
    match serve_requests(&mut stream, context).await {
        Ok(()) => tracing::trace!(%peer, "rdma connection closed by peer"),
        Err(ServeError::Io(err)) => tracing::debug!(%peer, error = %err, "rdma connection lost"),
        Err(err @ ServeError::Revoked(_)) => {
            tracing::debug!(%peer, "closing rdma connection: {err}")
        }
        Err(err) => tracing::warn!(%peer, error = %err, "closing rdma connection"),
    }
}

/// Reads a request header; `Ok(None)` when the peer closed between requests.
async fn read_header(stream: &mut TcpStream) -> Result<Option<Request>, ServeError> {
    let mut header = [0u8; REQUEST_LEN];
    let mut filled = 0;
    while filled < REQUEST_LEN {
        let n = stream.read(&mut header[filled..]).await?;
        if n == 0 {
            return if filled == 0 {
                Ok(None)
            } else {
                Err(ServeError::Truncated)
            };
        }
        filled += n;
    }
    Ok(Some(Request::decode(&header)?))
}

async fn serve_requests(stream: &mut TcpStream, context: &ServerContext) -> Result<(), ServeError> {
    while let Some(request) = read_header(stream).await? {
        #[cfg(test)]
        if let Some(gate) = &context.gate {
            gate.before_request().await;
        }
        match request.op {
            Op::Read => serve_read(stream, context, &request).await?,
            Op::Write => serve_write(stream, context, &request).await?,
            Op::IbvConnect => serve_ibv_connect(stream, context, &request).await?,
        }
        #[cfg(test)]
        if let Some(gate) = &context.gate {
            gate.served();
        }
    }
    Ok(())
}

fn access_request(request: &Request) -> AccessRequest<'_> {
    AccessRequest {
        owner: request.owner,
        buffer: request.buffer,
        key: &request.key,
        offset: request.offset,
        len: request.len,
    }
}

async fn respond(stream: &mut TcpStream, status: Status, value: u64) -> io::Result<()> {
    stream.write_all(&Response { status, value }.encode()).await
}

async fn serve_read(
    stream: &mut TcpStream,
    context: &ServerContext,
    request: &Request,
) -> Result<(), ServeError> {
    let guard = match context.registry.access(&access_request(request)) {
        Ok(guard) => guard,
        Err((status, value)) => return Ok(respond(stream, status, value).await?),
    };
    stream
        .write_all(&Response::ok(request.len).encode())
        .await?;
    // SAFETY: `access` checked the range against the region; the guard keeps
    // the region alive until the copy ends; concurrent writers of the same
    // bytes are the caller's data race (see `Region`).
    let data = unsafe {
        guard
            .entry
            .region
            .slice(request.offset as usize, request.len as usize)
    };
    // A chunk cannot be cut short in the protocol: if the buffer is
    // deregistered meanwhile the connection closes (RD-6).
    tokio::select! {
        copied = stream.write_all(data) => copied?,
        () = guard.entry.wait_revoked() => return Err(ServeError::Revoked(request.buffer)),
    }
    Ok(())
}

async fn serve_write(
    stream: &mut TcpStream,
    context: &ServerContext,
    request: &Request,
) -> Result<(), ServeError> {
    let guard = match context.registry.access(&access_request(request)) {
        Ok(guard) => guard,
        Err((status, value)) => {
            // Read the refused data so the next request header is in step.
            // The header's length is bounded by MAX_CHUNK_SIZE.
            let mut rest = (&mut *stream).take(request.len);
            tokio::io::copy(&mut rest, &mut tokio::io::sink()).await?;
            if rest.limit() > 0 {
                return Err(ServeError::Truncated);
            }
            return Ok(respond(stream, status, value).await?);
        }
    };
    // SAFETY: the range was checked; this connection is the only writer of
    // these bytes the crate knows of (concurrent accesses to overlapping
    // bytes are the caller's data race, see `Region`).
    let data = unsafe {
        guard
            .entry
            .region
            .slice_mut(request.offset as usize, request.len as usize)
    };
    tokio::select! {
        copied = stream.read_exact(data) => { copied?; }
        () = guard.entry.wait_revoked() => return Err(ServeError::Revoked(request.buffer)),
    }
    drop(guard);
    Ok(respond(stream, Status::Ok, request.len).await?)
}

async fn serve_ibv_connect(
    stream: &mut TcpStream,
    context: &ServerContext,
    request: &Request,
) -> Result<(), ServeError> {
    let mut message = [0u8; HANDSHAKE_LEN];
    stream.read_exact(&mut message).await?;
    // The handshake needs a valid handle of this manager (RD-10): only
    // holders of a key can connect a queue pair.
    let check = AccessRequest {
        offset: 0,
        len: 0,
        ..access_request(request)
    };
    if let Err((status, value)) = context.registry.access(&check) {
        return Ok(respond(stream, status, value).await?);
    }
    let Some(ibverbs) = &context.ibverbs else {
        return Ok(respond(stream, Status::NoIbverbs, 0).await?);
    };
    let initiator = match QpInfo::decode(&message) {
        Ok(info) => info,
        Err(err) => {
            tracing::warn!(error = %err, "refusing an ibverbs handshake");
            return Ok(respond(stream, Status::HandshakeFailed, 0).await?);
        }
    };
    match ibverbs.accept(&initiator) {
        Ok(ours) => {
            stream
                .write_all(&Response::ok(HANDSHAKE_LEN as u64).encode())
                .await?;
            stream.write_all(&ours.encode()).await?;
        }
        Err(err) => {
            tracing::warn!(peer = %initiator.manager, error = %err, "ibverbs handshake failed");
            respond(stream, Status::HandshakeFailed, 0).await?;
        }
    }
    Ok(())
}

/// A test hook that holds requests at the server until the test lets them
/// through, so that "in the middle of a transfer" is a place a test can stop at.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct ServeGate {
    permits: tokio::sync::Semaphore,
    served: watch::Sender<u64>,
}

#[cfg(test)]
impl ServeGate {
    pub(crate) fn new() -> Arc<ServeGate> {
        Arc::new(ServeGate {
            permits: tokio::sync::Semaphore::new(0),
            served: watch::Sender::new(0),
        })
    }

    /// Lets `n` more requests through.
    pub(crate) fn allow(&self, n: usize) {
        self.permits.add_permits(n);
    }

    /// Waits until `n` requests have been served in all.
    pub(crate) async fn wait_served(&self, n: u64) {
        let mut served = self.served.subscribe();
        let _ = served.wait_for(|&count| count >= n).await;
    }

    async fn before_request(&self) {
        if let Ok(permit) = self.permits.acquire().await {
            permit.forget();
        }
    }

    fn served(&self) {
        self.served.send_modify(|count| *count += 1);
    }
}

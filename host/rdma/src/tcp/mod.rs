//! The TCP backend: the default everywhere and the fallback for every pair.
//!
//! Every manager listens on a TCP address (`listen_addr`). An initiator
//! splits a transfer into chunks of `chunk_size` bytes and hands them to up
//! to `connections_per_peer` workers; each worker takes a pooled connection
//! to the owner (or opens one) for each chunk, sends one request and reads
//! one response (`wire`), and returns the connection to the pool. Chunks of
//! one transfer, and of concurrent transfers to the same peer, therefore move
//! in parallel over at most `connections_per_peer` connections.
//!
//! No bytes are copied beyond the socket's own (RD-4): the sender writes
//! straight from the source region's memory and the receiver reads straight
//! into the destination region's memory. Sockets have `TCP_NODELAY` set, and
//! optionally fixed buffer sizes.

pub(crate) mod client;
pub(crate) mod server;
pub(crate) mod wire;

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

use crate::error::RdmaError;

/// Binds the listener with the configured socket buffer sizes (accepted
/// sockets inherit the receive buffer, which must be set before `listen`
/// for the window scale to match).
pub(crate) fn bind(
    addr: SocketAddr,
    socket_buffer_size: Option<usize>,
) -> Result<TcpListener, RdmaError> {
    let io_error = |what: &str, err: std::io::Error| RdmaError::Io {
        what: format!("{what} {addr}"),
        reason: err.to_string(),
    };
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|err| io_error("creating a socket for", err))?;
    socket
        .set_reuseaddr(true)
        .map_err(|err| io_error("setting SO_REUSEADDR on", err))?;
    if let Some(size) = socket_buffer_size {
        set_buffer_sizes(&socket, size);
    }
    socket.bind(addr).map_err(|err| io_error("binding", err))?;
    socket
        .listen(1024)
        .map_err(|err| io_error("listening on", err))
}

/// Opens a transfer connection.
pub(crate) async fn connect(
    addr: SocketAddr,
    socket_buffer_size: Option<usize>,
) -> std::io::Result<TcpStream> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(size) = socket_buffer_size {
        set_buffer_sizes(&socket, size);
    }
    let stream = socket.connect(addr).await?;
    configure_stream(&stream, socket_buffer_size);
    Ok(stream)
}

fn set_buffer_sizes(socket: &TcpSocket, size: usize) {
    let size = u32::try_from(size).unwrap_or(u32::MAX);
    // The kernel caps these at its maximum; a refusal is not worth failing for.
    if let Err(err) = socket.set_send_buffer_size(size) {
        tracing::debug!(error = %err, "cannot set SO_SNDBUF");
    }
    if let Err(err) = socket.set_recv_buffer_size(size) {
        tracing::debug!(error = %err, "cannot set SO_RCVBUF");
    }
}

/// Sets `TCP_NODELAY` and the buffer sizes on a connected stream.
pub(crate) fn configure_stream(stream: &TcpStream, socket_buffer_size: Option<usize>) {
    if let Err(err) = stream.set_nodelay(true) {
        tracing::debug!(error = %err, "cannot set TCP_NODELAY");
    }
    if let Some(size) = socket_buffer_size {
        let socket = socket2::SockRef::from(stream);
        if let Err(err) = socket.set_send_buffer_size(size) {
            tracing::debug!(error = %err, "cannot set SO_SNDBUF");
        }
        if let Err(err) = socket.set_recv_buffer_size(size) {
            tracing::debug!(error = %err, "cannot set SO_RCVBUF");
        }
    }
}

/// Resolves when the manager shuts down (or is dropped).
pub(crate) async fn stopped(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|&stop| stop).await;
}

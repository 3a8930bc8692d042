//! The crate's error type.
//!
//! Every operation ends with `Ok` or one of these. Errors that come from the
//! peer (a wrong key, an unknown buffer, a range past the end) name the buffer
//! and the manager that refused; errors of the transport name the peer's
//! address and say what happened to the connection.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use crate::handle::ManagerId;

/// Which buffer of a transfer a range error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The buffer of the manager that runs the operation.
    Local,
    /// The buffer named by the handle.
    Remote,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Local => "local",
            Side::Remote => "remote",
        })
    }
}

/// What went wrong with a registration, a handle or a transfer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaError {
    /// `offset + len` runs past the end of a buffer (or overflows).
    #[error(
        "{side} range out of bounds: offset {offset} + length {len} exceeds the buffer's {buffer_len} bytes"
    )]
    OutOfRange {
        /// Which buffer.
        side: Side,
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// The buffer's length.
        buffer_len: u64,
    },
    /// The owner has never registered a buffer with this id.
    #[error("unknown buffer {id} on manager {owner}: it was never registered there")]
    UnknownBuffer {
        /// The owning manager.
        owner: ManagerId,
        /// The buffer id from the handle.
        id: u64,
    },
    /// The buffer existed but has been deregistered (dropped) by its owner.
    #[error("buffer {id} on manager {owner} has been deregistered")]
    Deregistered {
        /// The owning manager.
        owner: ManagerId,
        /// The buffer id from the handle.
        id: u64,
    },
    /// The handle's access key does not match the buffer's.
    #[error("access to buffer {id} on manager {owner} denied: the handle's key does not match")]
    WrongKey {
        /// The owning manager.
        owner: ManagerId,
        /// The buffer id from the handle.
        id: u64,
    },
    /// The manager listening at the handle's address is not the one that
    /// made the handle: its proc restarted, or the handle was altered.
    #[error(
        "stale handle: the manager at {addr} is not manager {owner} (its proc restarted, or the handle came from elsewhere)"
    )]
    StaleHandle {
        /// The manager the handle names.
        owner: ManagerId,
        /// The address it was sent to.
        addr: SocketAddr,
    },
    /// The operation did not finish within its timeout.
    #[error("operation timed out after {0:?}")]
    Timeout(Duration),
    /// A connection to the peer could not be made, or broke during the operation.
    #[error("connection to {addr} failed: {reason}")]
    Connection {
        /// The peer's address.
        addr: SocketAddr,
        /// What happened.
        reason: String,
    },
    /// The peer answered with something that breaks the protocol.
    #[error("protocol error from {addr}: {reason}")]
    Protocol {
        /// The peer's address.
        addr: SocketAddr,
        /// What was wrong.
        reason: String,
    },
    /// No RDMA device could be opened (or the crate was built without the
    /// `ibverbs` feature).
    #[error("no RDMA device: {0}")]
    NoDevice(String),
    /// An ibverbs call or work completion failed.
    #[error("ibverbs: {0}")]
    Ibverbs(String),
    /// Allocating a region failed.
    #[error("failed to allocate {0} bytes for a region")]
    Alloc(usize),
    /// The configuration cannot work; the message says which field.
    #[error("invalid RDMA configuration: {0}")]
    Config(String),
    /// The local buffer was registered with a different manager.
    #[error("buffer {id} belongs to manager {owner}, not to the manager running this operation")]
    ForeignBuffer {
        /// The manager the buffer belongs to.
        owner: ManagerId,
        /// Its id.
        id: u64,
    },
    /// A socket operation outside a transfer failed (binding the listener).
    #[error("{what}: {reason}")]
    Io {
        /// What was being done.
        what: String,
        /// The operating system's reason.
        reason: String,
    },
    /// The manager was shut down while the operation ran or before it started.
    #[error("the RDMA manager has shut down")]
    Shutdown,
    /// Bytes that should hold a buffer handle do not.
    #[error("invalid buffer handle encoding: {0}")]
    BadHandle(String),
    /// The peer refused a request it understood (for example an ibverbs
    /// handshake when it has no device).
    #[error("peer {addr} refused: {reason}")]
    Refused {
        /// The peer's address.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
}

impl RdmaError {
    pub(crate) fn connection(addr: SocketAddr, reason: impl fmt::Display) -> Self {
        RdmaError::Connection {
            addr,
            reason: reason.to_string(),
        }
    }

    pub(crate) fn protocol(addr: SocketAddr, reason: impl fmt::Display) -> Self {
        RdmaError::Protocol {
            addr,
            reason: reason.to_string(),
        }
    }
}

/// Checks that `offset..offset + len` lies inside a buffer of `buffer_len` bytes.
pub(crate) fn check_range(
    side: Side,
    offset: u64,
    len: u64,
    buffer_len: u64,
) -> Result<(), RdmaError> {
    match offset.checked_add(len) {
        Some(end) if end <= buffer_len => Ok(()),
        _ => Err(RdmaError::OutOfRange {
            side,
            offset,
            len,
            buffer_len,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_that_overflow_or_pass_the_end_are_rejected() {
        assert!(check_range(Side::Local, 0, 10, 10).is_ok());
        assert!(check_range(Side::Local, 10, 0, 10).is_ok());
        assert!(check_range(Side::Local, 4, 7, 10).is_err());
        assert!(check_range(Side::Remote, 11, 0, 10).is_err());
        let err = check_range(Side::Remote, u64::MAX, 2, 10).unwrap_err();
        assert_eq!(
            err.to_string(),
            "remote range out of bounds: offset 18446744073709551615 + length 2 exceeds the buffer's 10 bytes"
        );
    }
}

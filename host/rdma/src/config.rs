//! Settings of an [`RdmaManager`](crate::RdmaManager).

use std::net::SocketAddr;
use std::time::Duration;

use crate::error::RdmaError;

/// The smallest chunk a transfer is split into.
pub const MIN_CHUNK_SIZE: usize = 4 * 1024;
/// The largest chunk a manager sends or accepts. A request for more is a bad
/// frame, whatever the receiving manager's own `chunk_size`.
pub const MAX_CHUNK_SIZE: usize = 64 * 1024 * 1024;
/// The most connections a manager opens to one peer.
pub const MAX_CONNECTIONS_PER_PEER: usize = 64;

/// Settings of an [`RdmaManager`](crate::RdmaManager). `Default` gives the
/// values in the table of `docs/rdma.md`.
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// Where the TCP listener binds (default `127.0.0.1:0`: loopback, any free port).
    pub listen_addr: SocketAddr,
    /// The address put in handles. Defaults to the bound address, which must
    /// then not be unspecified (`0.0.0.0`): peers need an address they can dial.
    pub advertise_addr: Option<SocketAddr>,
    /// Transfers over TCP are split into chunks of this many bytes (default
    /// 512 KiB; between [`MIN_CHUNK_SIZE`] and [`MAX_CHUNK_SIZE`]).
    pub chunk_size: usize,
    /// How many TCP connections a manager keeps to one peer, and so how many
    /// chunks move at once (default 4; at most [`MAX_CONNECTIONS_PER_PEER`]).
    pub connections_per_peer: usize,
    /// `SO_SNDBUF`/`SO_RCVBUF` for transfer sockets. `None` (the default)
    /// leaves the kernel's automatic sizing on, which on Linux grows larger
    /// than a fixed size can be set without privileges.
    pub socket_buffer_size: Option<usize>,
    /// How long an operation may take before it fails with
    /// [`RdmaError::Timeout`] (default 60 s). Per operation with
    /// [`RdmaManager::transfer`](crate::RdmaManager::transfer).
    pub op_timeout: Duration,
    /// The ibverbs backend.
    pub ibverbs: IbverbsConfig,
    #[cfg(test)]
    pub(crate) serve_gate: Option<std::sync::Arc<crate::tcp::server::ServeGate>>,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise_addr: None,
            chunk_size: 512 * 1024,
            connections_per_peer: 4,
            socket_buffer_size: None,
            op_timeout: Duration::from_secs(60),
            ibverbs: IbverbsConfig::default(),
            #[cfg(test)]
            serve_gate: None,
        }
    }
}

impl RdmaConfig {
    pub(crate) fn validate(&self) -> Result<(), RdmaError> {
        if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&self.chunk_size) {
            return Err(RdmaError::Config(format!(
                "chunk_size {} is outside {MIN_CHUNK_SIZE}..={MAX_CHUNK_SIZE}",
                self.chunk_size
            )));
        }
        if !(1..=MAX_CONNECTIONS_PER_PEER).contains(&self.connections_per_peer) {
            return Err(RdmaError::Config(format!(
                "connections_per_peer {} is outside 1..={MAX_CONNECTIONS_PER_PEER}",
                self.connections_per_peer
            )));
        }
        if self.op_timeout.is_zero() {
            return Err(RdmaError::Config("op_timeout must not be zero".into()));
        }
        if self.socket_buffer_size == Some(0) {
            return Err(RdmaError::Config(
                "socket_buffer_size must not be zero (use None for the kernel's default)".into(),
            ));
        }
        if let Some(addr) = self.advertise_addr
            && (addr.ip().is_unspecified() || addr.port() == 0)
        {
            return Err(RdmaError::Config(format!(
                "advertise_addr {addr} is not an address a peer can dial"
            )));
        }
        if self.ibverbs.queue_depth == 0 {
            return Err(RdmaError::Config(
                "ibverbs.queue_depth must not be zero".into(),
            ));
        }
        Ok(())
    }
}

/// Settings of the ibverbs backend. They matter only when the crate is built
/// with the `ibverbs` feature.
#[derive(Debug, Clone)]
pub struct IbverbsConfig {
    /// Try to open an RDMA device (default `true`). When this is on and no
    /// device opens, transfers use TCP and each peer is warned about once.
    pub enabled: bool,
    /// The device to open, by name (`mlx5_0`); default: the first one.
    pub device: Option<String>,
    /// The device port, from 1 (default 1).
    pub port: u8,
    /// The GID index; default: a RoCE v2 IPv4 GID if there is one, else the
    /// first non-zero GID, else 0 (InfiniBand).
    pub gid_index: Option<u8>,
    /// Work requests a queue pair may have outstanding (default 128).
    pub queue_depth: u32,
}

impl Default for IbverbsConfig {
    fn default() -> Self {
        IbverbsConfig {
            enabled: true,
            device: None,
            port: 1,
            gid_index: None,
            queue_depth: 128,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_field() {
        RdmaConfig::default().validate().unwrap();
        let bad = RdmaConfig {
            chunk_size: 1,
            ..RdmaConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("chunk_size")
        );
        let bad = RdmaConfig {
            connections_per_peer: 0,
            ..RdmaConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("connections_per_peer")
        );
        let bad = RdmaConfig {
            advertise_addr: Some("0.0.0.0:80".parse().unwrap()),
            ..RdmaConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("advertise_addr")
        );
    }
}

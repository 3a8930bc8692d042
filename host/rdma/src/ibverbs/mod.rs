//! The ibverbs backend: one-sided RDMA READ and WRITE through libibverbs.
//!
//! Built with the `ibverbs` cargo feature, on the `sideway` crate, which
//! loads libibverbs when the program runs: one binary works with or without
//! RDMA hardware. Without a device (or without the feature) opening fails
//! with [`RdmaError::NoDevice`] and every pair of managers uses TCP.
//!
//! How it works (`device.rs`):
//! - a manager opens one device, allocates a protection domain and a
//!   completion queue, and registers every buffer's memory with
//!   `ibv_reg_mr` (local write, remote read, remote write). The handle
//!   carries the buffer's address and rkey, and the port's GID and LID;
//! - the first transfer to a peer creates a reliable-connected queue pair
//!   and exchanges a handshake message ([`handshake`]) with the owner over
//!   its TCP listener. The handshake request carries a valid handle, so only
//!   holders of a key can connect (RD-10). The owner creates its own queue
//!   pair for the initiator, and both move theirs to ready-to-send. The queue
//!   pair is cached per peer and replaced when it fails;
//! - a transfer posts one signaled work request per chunk (RDMA READ or
//!   WRITE, with the remote address and rkey from the handle) and waits for
//!   their completions, which a polling thread per manager hands back. A
//!   failed completion fails the transfer and retires the queue pair.
//!
//! None of this has run on RDMA hardware: the machines this crate was written
//! on have no RDMA devices. What is tested is everything that needs none.

pub(crate) mod handshake;

#[cfg(feature = "ibverbs")]
mod device;

use std::sync::Arc;

#[cfg(feature = "ibverbs")]
pub(crate) use device::{IbvState, Registration};
#[cfg(not(feature = "ibverbs"))]
pub(crate) use disabled::{IbvState, Registration};

use crate::backend::{Backend, BackendKind, Job, TransferFuture};
use crate::tcp::client::TcpBackend;

/// The ibverbs backend of one manager: the device state, and the TCP
/// backend for handshakes.
pub(crate) struct IbverbsBackend {
    pub(crate) state: Arc<IbvState>,
    pub(crate) tcp: Arc<TcpBackend>,
}

impl Backend for IbverbsBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Ibverbs
    }

    fn transfer(&self, job: Job) -> TransferFuture<'_> {
        Box::pin(self.state.transfer(job, &self.tcp))
    }
}

#[cfg(not(feature = "ibverbs"))]
mod disabled {
    //! Stand-ins when the feature is off: the state cannot be constructed,
    //! so every method is unreachable by construction.

    use std::sync::Arc;

    use tokio::time::Instant;

    use super::handshake::QpInfo;
    use crate::backend::Job;
    use crate::config::IbverbsConfig;
    use crate::error::RdmaError;
    use crate::handle::{BufferHandle, IbvRemote, ManagerId};
    use crate::region::Region;
    use crate::tcp::client::TcpBackend;

    /// An open device; none can exist in this build.
    pub(crate) enum IbvState {}

    /// A memory registration; none can exist in this build.
    pub(crate) enum Registration {}

    impl IbvState {
        pub(crate) fn open(
            _config: &IbverbsConfig,
            _manager: ManagerId,
        ) -> Result<Arc<IbvState>, RdmaError> {
            Err(RdmaError::NoDevice(
                "this build has no ibverbs support (build monarch-rdma with the `ibverbs` feature)"
                    .into(),
            ))
        }

        pub(crate) fn register(
            &self,
            _region: &Region,
        ) -> Result<(Registration, IbvRemote), RdmaError> {
            match *self {}
        }

        pub(crate) fn accept(&self, _initiator: &QpInfo) -> Result<QpInfo, RdmaError> {
            match *self {}
        }

        pub(crate) async fn connect(
            &self,
            _remote: &BufferHandle,
            _tcp: &TcpBackend,
            _deadline: Instant,
        ) -> Result<(), RdmaError> {
            match *self {}
        }

        pub(crate) async fn transfer(
            &self,
            _job: Job,
            _tcp: &TcpBackend,
        ) -> Result<u64, RdmaError> {
            match *self {}
        }
    }
}

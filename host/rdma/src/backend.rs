//! Backends, and which one carries a transfer between two managers.
//!
//! A backend moves bytes between a local buffer and a remote one named by a
//! handle. There are three:
//!
//! - **local**: the handle names a buffer of the same manager; the bytes are
//!   copied in memory (after the same checks a peer would make);
//! - **ibverbs**: one-sided RDMA READ/WRITE on a reliable-connected queue
//!   pair per peer, used when both managers advertise it (the local one has
//!   opened a device, the handle carries an rkey) and the local buffer is
//!   registered with the device;
//! - **TCP**: chunked, pipelined requests over pooled connections; every
//!   manager listens, so it is the fallback for every pair.
//!
//! Invariants (tested in `tests.rs` and below):
//! - RD-7: a pair of managers that could want RDMA but ends up on TCP is
//!   warned about once (`tracing::warn!`), the first time a transfer between
//!   them falls back, never per transfer.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::error::RdmaError;
use crate::handle::{BufferHandle, ManagerId};
use crate::registry::Entry;

/// Which backend carries a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Both buffers belong to one manager: a memory copy.
    Local,
    /// TCP connections to the owner's listener.
    Tcp,
    /// RDMA READ/WRITE through libibverbs.
    Ibverbs,
}

/// Which way a transfer moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// One-sided READ: remote bytes are copied into the local buffer.
    Read,
    /// One-sided WRITE: local bytes are copied into the remote buffer.
    Write,
}

/// One validated transfer, as a backend receives it: both ranges have been
/// checked against the buffers' lengths (the remote one against the handle;
/// the owner checks again).
pub(crate) struct Job {
    pub(crate) direction: Direction,
    pub(crate) local: Arc<Entry>,
    pub(crate) local_offset: u64,
    pub(crate) remote: BufferHandle,
    pub(crate) remote_offset: u64,
    pub(crate) len: u64,
    /// When the operation fails with [`RdmaError::Timeout`].
    pub(crate) deadline: Instant,
    /// The timeout the deadline came from, for the error message.
    pub(crate) timeout: Duration,
}

pub(crate) type TransferFuture<'a> =
    Pin<Box<dyn Future<Output = Result<u64, RdmaError>> + Send + 'a>>;

/// A way to move bytes between a local buffer and a remote one.
///
/// A transfer ends with the number of bytes moved or an error no later than
/// the job's deadline (RD-1), and when it ends with an error none of its
/// work still writes into local memory (RD-8), except when the future is
/// dropped before it ends.
pub(crate) trait Backend: Send + Sync {
    fn kind(&self) -> BackendKind;
    fn transfer(&self, job: Job) -> TransferFuture<'_>;
}

/// The local manager's ibverbs state, as selection sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LocalIbverbs {
    /// Turned off in the configuration: TCP is what was asked for.
    Disabled,
    /// Wanted, but no device opened; the reason.
    Unavailable(String),
    /// A device is open.
    Available,
}

/// What selection decided for one transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Selection {
    Local,
    Ibverbs,
    /// TCP; with the reason when RDMA was wanted by either side.
    Tcp {
        fallback: Option<String>,
    },
}

/// Everything selection looks at, so it can be tested with any inputs.
pub(crate) struct SelectionInput<'a> {
    pub(crate) local_manager: ManagerId,
    pub(crate) local_ibverbs: &'a LocalIbverbs,
    /// Whether the local buffer is registered with the device.
    pub(crate) local_buffer_registered: bool,
    pub(crate) remote: &'a BufferHandle,
    /// Why ibverbs failed earlier with this peer, if it did.
    pub(crate) pair_failed: Option<&'a str>,
}

pub(crate) fn select(input: &SelectionInput<'_>) -> Selection {
    if input.remote.owner == input.local_manager {
        return Selection::Local;
    }
    let remote_has_it = input.remote.ibverbs.is_some();
    let fallback = match input.local_ibverbs {
        LocalIbverbs::Disabled => {
            return Selection::Tcp { fallback: None };
        }
        LocalIbverbs::Unavailable(reason) => reason.clone(),
        LocalIbverbs::Available if !remote_has_it => {
            "the peer did not advertise an RDMA device".to_string()
        }
        LocalIbverbs::Available if !input.local_buffer_registered => {
            "the local buffer is not registered with the RDMA device".to_string()
        }
        LocalIbverbs::Available => match input.pair_failed {
            Some(reason) => format!("connecting a queue pair failed earlier: {reason}"),
            None => return Selection::Ibverbs,
        },
    };
    Selection::Tcp {
        fallback: Some(fallback),
    }
}

/// Remembers which peers have been warned about a fallback to TCP.
#[derive(Default)]
pub(crate) struct FallbackLog {
    warned: Mutex<HashSet<ManagerId>>,
}

impl FallbackLog {
    /// True the first time it is asked about `peer`, false after.
    pub(crate) fn first_time(&self, peer: ManagerId) -> bool {
        self.warned.lock().insert(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::tests::sample_handle;

    fn input<'a>(
        local_ibverbs: &'a LocalIbverbs,
        remote: &'a BufferHandle,
        pair_failed: Option<&'a str>,
    ) -> SelectionInput<'a> {
        SelectionInput {
            local_manager: ManagerId([0xee; 16]),
            local_ibverbs,
            local_buffer_registered: true,
            remote,
            pair_failed,
        }
    }

    #[test]
    fn ibverbs_is_chosen_only_when_both_sides_have_it() {
        let with_rdma = sample_handle();
        let without_rdma = BufferHandle {
            ibverbs: None,
            ..sample_handle()
        };
        let available = LocalIbverbs::Available;
        let unavailable = LocalIbverbs::Unavailable("no RDMA device: none found".into());

        assert_eq!(
            select(&input(&available, &with_rdma, None)),
            Selection::Ibverbs
        );
        assert!(matches!(
            select(&input(&available, &without_rdma, None)),
            Selection::Tcp { fallback: Some(reason) } if reason.contains("peer did not advertise")
        ));
        assert!(matches!(
            select(&input(&unavailable, &with_rdma, None)),
            Selection::Tcp { fallback: Some(reason) } if reason.contains("no RDMA device")
        ));
        assert!(matches!(
            select(&input(&available, &with_rdma, Some("port down"))),
            Selection::Tcp { fallback: Some(reason) } if reason.contains("port down")
        ));
        let unregistered = SelectionInput {
            local_buffer_registered: false,
            ..input(&available, &with_rdma, None)
        };
        assert!(matches!(
            select(&unregistered),
            Selection::Tcp { fallback: Some(_) }
        ));
        // Turned off on purpose: TCP without a warning.
        assert_eq!(
            select(&input(&LocalIbverbs::Disabled, &with_rdma, None)),
            Selection::Tcp { fallback: None }
        );
        // Same manager: a memory copy whatever the devices.
        let own = BufferHandle {
            owner: ManagerId([0xee; 16]),
            ..sample_handle()
        };
        assert_eq!(select(&input(&unavailable, &own, None)), Selection::Local);
    }

    #[test]
    fn rd7_fallback_is_reported_once_per_peer() {
        let log = FallbackLog::default();
        assert!(log.first_time(ManagerId([1; 16])));
        assert!(!log.first_time(ManagerId([1; 16])));
        assert!(log.first_time(ManagerId([2; 16])));
        assert!(!log.first_time(ManagerId([2; 16])));
    }
}

//! Faults made on purpose, so that a program's tests can check that it
//! survives them (`monarch-host test`, `docs/testing.md`). The program
//! sees each fault as it would see the real one: a killed proc's actors
//! fail with kind [`ProcLost`](crate::ErrorKind::ProcLost) and the owner's
//! supervision hears of it; a cut network holds messages until it heals,
//! and a message held past the host's delivery timeout fails as
//! undeliverable; a delay makes calls slower, and a call timeout fires as
//! it would.
//!
//! ```
//! # async fn example() -> Result<(), monarch_guest::MeshError> {
//! use std::time::Duration;
//! use monarch_guest::faults::{self, KillMode};
//! use monarch_guest::prelude::*;
//!
//! let procs = spawn_procs(&extent!(procs = 3))?;
//! // Ranks 0 and 1 are cut off from rank 2 and from this controller.
//! faults::partition(&procs, &[0, 1], Duration::from_secs(2))?;
//! faults::heal(&procs)?;
//! faults::kill(&procs, 2, KillMode::Crash)?;
//! # Ok(()) }
//! ```
//!
//! Only procs the program started may be faulted (not a persistent
//! mesh's); a proc inside the host's process (`run --in-process`, `test
//! --sim`) is killed by crashing it. Ranks are the proc mesh's. When a
//! call returns `Ok`, the fault is in place.

use std::time::Duration;

use crate::MeshError;
use crate::bindings::monarch::host::faults as wit;
use crate::mesh::ProcMesh;

/// How [`kill`] ends a proc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillMode {
    /// Its process is killed at once (SIGKILL), as by a crash.
    Crash,
    /// Its process exits by itself with status 0, as if its main returned.
    Exit,
    /// Its host is lost: every proc of that host ends at once, of whatever
    /// mesh, and each is reported "lost with its host".
    HostLost,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Ends the proc at `rank` of `procs` as `mode` says.
pub fn kill(procs: &ProcMesh, rank: u32, mode: KillMode) -> Result<(), MeshError> {
    let wit_mode = match mode {
        KillMode::Crash => wit::KillMode::Crash,
        KillMode::Exit => wit::KillMode::Exit,
        KillMode::HostLost => wit::KillMode::HostLost,
    };
    wit::kill(procs.raw(), rank, wit_mode)
        .map_err(|e| MeshError::new(format!("killing proc {rank} ({mode:?})"), e))
}

/// For `duration`, every message between the procs at ranks `a` and `b`,
/// either way, arrives `delay` later than it would; order is kept.
pub fn delay(
    procs: &ProcMesh,
    a: u32,
    b: u32,
    delay: Duration,
    duration: Duration,
) -> Result<(), MeshError> {
    wit::delay(procs.raw(), a, b, millis(delay), millis(duration)).map_err(|e| {
        MeshError::new(
            format!("delaying messages between procs {a} and {b} by {delay:?}"),
            e,
        )
    })
}

/// For `duration`, the network between the procs at ranks `a` and `b` is
/// down: messages either way are held and go on, in order, when it is up
/// again; one held past the delivery timeout fails as undeliverable.
pub fn drop_messages(
    procs: &ProcMesh,
    a: u32,
    b: u32,
    duration: Duration,
) -> Result<(), MeshError> {
    wit::drop_messages(procs.raw(), a, b, millis(duration)).map_err(|e| {
        MeshError::new(
            format!("dropping messages between procs {a} and {b} for {duration:?}"),
            e,
        )
    })
}

/// For `duration`, the procs at `ranks` are cut off, as by
/// [`drop_messages`], from the other procs of `procs` and from the caller.
pub fn partition(procs: &ProcMesh, ranks: &[u32], duration: Duration) -> Result<(), MeshError> {
    wit::partition(procs.raw(), ranks, millis(duration))
        .map_err(|e| MeshError::new(format!("partitioning procs {ranks:?} for {duration:?}"), e))
}

/// Ends every delay, drop and partition among `procs` and the caller now;
/// held messages go on at once, in order.
pub fn heal(procs: &ProcMesh) -> Result<(), MeshError> {
    wit::heal(procs.raw()).map_err(|e| MeshError::new("healing the network between procs", e))
}

//! monarch-rdma: registered buffers and one-sided transfers between procs.
//!
//! The host owns RDMA transfers so that a controller can move data it never
//! holds. This crate is the host side of that: each process runs one
//! [`RdmaManager`]; memory is wrapped in a [`Region`] (bytes the crate
//! allocates, or a tensor's storage given as a pointer, a length and a
//! keep-alive value) and registered with the manager as a [`Buffer`]. A
//! buffer's [`BufferHandle`] is plain data (serde, or rkyv with bytecheck)
//! that can travel inside any payload; any manager holding it can then
//!
//! - [`read_into`](RdmaManager::read_into) one of its own buffers from the
//!   remote one (a one-sided READ), or
//! - [`write_from`](RdmaManager::write_from) one of its own buffers into the
//!   remote one (a one-sided WRITE),
//!
//! without the owner's program taking part: the owner's manager serves the
//! request. A handle carries a random 128-bit key; the owner checks it, and
//! the buffer id and the range, on every request.
//!
//! ```
//! use monarch_rdma::{RdmaConfig, RdmaManager};
//!
//! # #[tokio::main] async fn main() -> Result<(), monarch_rdma::RdmaError> {
//! let owner = RdmaManager::new(RdmaConfig::default()).await?;
//! let reader = RdmaManager::new(RdmaConfig::default()).await?;
//!
//! let source = owner.alloc(11)?;
//! source.region().write(0, b"hello world")?;
//! let handle = source.handle(); // send this to the reader in a message
//!
//! let destination = reader.alloc(5)?;
//! let moved = reader.read_into(&destination, 0, &handle, 6, 5).await?;
//! assert_eq!(moved, 5);
//! assert_eq!(destination.region().to_vec(), b"world");
//! # Ok(()) }
//! ```
//!
//! # Design
//!
//! - [`Region`] (`region.rs`): memory that stays in place while registered.
//! - [`RdmaManager`] (`manager.rs`): owns a table of registered buffers
//!   (`registry.rs`), a TCP listener that serves them (`tcp/server.rs`),
//!   and the backends that run this process's transfers.
//! - [`BufferHandle`] (`handle.rs`): the data a peer needs; the owner checks
//!   its manager id, buffer id, key and range on every request (RD-2).
//! - Backends (an internal object-safe `Backend` trait, `backend.rs`): which
//!   one carries a transfer ([`BackendKind`]) is chosen per pair of
//!   managers. A handle of the same manager is a memory copy. ibverbs RDMA
//!   READ/WRITE (`ibverbs/`, cargo feature `ibverbs`) is used when both
//!   managers advertise an RDMA device. Otherwise TCP, which every manager
//!   listens for; a pair that falls back to TCP is warned about once.
//! - The TCP backend (`tcp/`) cuts a transfer into chunks (`chunk_size`,
//!   default 512 KiB) and moves them over a pool of connections per peer
//!   (`connections_per_peer`, default 4), two requests in flight on each,
//!   with a small binary frame protocol (`tcp/wire.rs`); bytes go straight
//!   between the socket and the regions' memory.
//! - The ibverbs backend registers every buffer with the device, connects
//!   one reliable-connected queue pair per peer through a handshake over the
//!   owner's TCP listener (`ibverbs/handshake.rs`), and posts one-sided
//!   work requests with the handle's address and rkey. It has not run on
//!   RDMA hardware (none was available); see `docs/rdma.md`.
//!
//! - [`mesh`]: buffers on the procs of a mesh, for a controller: one
//!   manager per process ([`mesh::process_manager`]), an rdma actor per
//!   proc (kind [`mesh::RDMA_KIND`]) and [`mesh::RdmaMesh`] on the
//!   controller (alloc, write, read, read-into, write-from, free).
//!
//! Every transfer ends with the bytes moved or an [`RdmaError`] within its
//! timeout ([`RdmaConfig::op_timeout`], or per transfer with
//! [`RdmaManager::transfer`]).
//!
//! # Invariants
//!
//! Numbered as in `docs/rdma.md`; tests carry the number they check.
//!
//! - RD-1: every operation ends with `Ok` or an error within its timeout:
//!   a peer that is gone, a connection reset, a buffer deregistered in the
//!   middle, a peer that stops answering all become errors.
//! - RD-2: a handle is validated on every use (manager, buffer id, key,
//!   range); a bad one gets an error that says which, and touches no memory.
//! - RD-3: bytes from the network never panic the process: a bad frame closes
//!   its connection, and the listener keeps serving.
//! - RD-4: the TCP backend copies no data beyond the socket's own.
//! - RD-5: a transfer touches no byte outside its two ranges.
//! - RD-6: after [`Buffer::deregister`] returns, no access to the buffer's
//!   memory runs or starts; after a drop none starts. Memory stays alive
//!   while an access runs.
//! - RD-7: a pair of managers that falls back to TCP is warned about once.
//! - RD-8: a failed transfer leaves no work writing into local memory.
//! - RD-9: at most `connections_per_peer` connections per peer carry chunks
//!   at once; connections are reused.
//! - RD-10: an ibverbs queue pair is connected only for a holder of a valid
//!   handle, with a validated handshake message.
//!
//! # Memory safety contract
//!
//! Transfers access a region's memory from other tasks (and, with ibverbs,
//! from the network card) while the program keeps its own references, as
//! RDMA hardware does. While a transfer runs, the program must not touch the
//! bytes it reads or writes; see [`Region`] and [`Region::from_raw_parts`].

#![warn(missing_docs)]

mod backend;
mod config;
mod error;
mod handle;
mod ibverbs;
mod manager;
pub mod mesh;
mod region;
mod registry;
mod tcp;

#[cfg(test)]
mod tests;

pub use backend::{BackendKind, Direction};
pub use config::{
    IbverbsConfig, MAX_CHUNK_SIZE, MAX_CONNECTIONS_PER_PEER, MIN_CHUNK_SIZE, RdmaConfig,
};
pub use error::{RdmaError, Side};
pub use handle::{BufferHandle, IbvEndpoint, IbvRemote, ManagerId};
pub use manager::{Buffer, RdmaManager, Transfer};
pub use region::{REGION_ALIGN, Region};

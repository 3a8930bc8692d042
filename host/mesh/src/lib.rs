//! hyperactor-mesh: meshes of procs and actors on the hyperactor runtime.
//!
//! - **shapes** ([`shape`]): named dimensions (an extent), slices of ranks
//!   and selections;
//! - **casting** ([`comm`], [`cast`]): a message to many actors travels down
//!   a multicast tree of per-proc comm actors, and the replies come back up
//!   the same tree, folded at each hop by host-native reducers ([`reduce`]);
//! - **procs** ([`agent`], [`alloc`]): every proc of a mesh runs a proc
//!   agent (spawns and stops actors, keeps content-addressed blobs) and a
//!   comm actor; allocators start procs in this process, as child processes,
//!   or through remote agents; child procs run a copy of the binary the
//!   kernel can map with 2 MiB pages where that helps ([`exe`]);
//! - **supervision** ([`client`]): the controller's view of its procs, which
//!   turns exits, signals and lost hosts into events; [`fault`] keeps the
//!   kind, origin and backtrace of a failure across procs.
//!
//! This crate knows nothing of Wasm or HTTP: what actors run is up to the
//! actor factories the binary registers ([`agent::Registry`]).

pub mod agent;
pub mod alloc;
pub mod cast;
pub mod cbor;
pub mod client;
pub mod comm;
pub mod exe;
pub mod fault;
pub mod fork;
pub mod reduce;
pub mod remote;
pub mod shape;
pub mod testing;
pub mod trace;

pub use cast::{CastTarget, Caster, Outcome};
pub use comm::{CastMode, MeshCall};
pub use fault::{Fault, FaultKind};
pub use reduce::{RankError, Reducer};

//! monarch-host: runs a sandboxed WebAssembly controller program, and the
//! actor classes it defines, on the hyperactor runtime.
//!
//! A *program* is one component built against the WIT world
//! `monarch:host/program` (`wit/monarch.wit`). The host:
//!
//! 1. loads it ([`engine`]): refuses what is not a component, compiles it
//!    once and caches the compiled form by the component's sha256 and the
//!    engine's compatibility hash;
//! 2. instantiates it as the controller and calls its `run` export
//!    ([`run_program`]), on one task that owns the controller's store;
//! 3. answers the controller's `mesh` imports ([`host`]) through the mesh
//!    layer (`hyperactor-mesh`): procs are child processes (or procs in this
//!    process), every actor of a mesh is its own instance of the same
//!    component, inside a hyperactor actor ([`wasm_actor`]) on its proc,
//!    and calls are casts down a multicast tree whose folded replies
//!    arrive as events in the caller's event queue.
//!
//! The sandbox grants nothing the operator did not: no preopened
//! directories or environment unless granted (`--dir`, `--env`), no
//! sockets; a memory cap per instance; an epoch deadline that makes a
//! spinning guest yield and, past its wall clock deadline, trap; and
//! handler deadlines that interrupt an actor stuck in one message.

/// mimalloc, not glibc's malloc, in every binary built on this crate
/// (`monarch-host`, `monarch-bench`, the procs they start): a message's
/// trip through a proc makes and frees a few dozen small objects, and
/// glibc's allocator spent a quarter of a proc's time on them
/// (docs/benchmarks.md, "Allocation").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod bindings;
pub mod build;
pub mod console;
pub mod debug;
pub mod engine;
mod errors;
pub mod host;
pub mod mesh;
pub mod native;
pub mod observe;
mod output;
pub mod proc_log;
pub mod progress;
pub mod rdma;
pub mod tensor;
pub mod test_runner;
pub mod traces;
pub mod wasm_actor;

mod run;

pub mod serve;
pub mod session;

pub use engine::{DirGrant, Grants, LoadError, Loaded, Placement, Sandbox, parse_env};
pub use host::{AttachedProcs, MeshObserver};
pub use run::{Mesh, Prepared, RunError, blob_dir, run_program, run_program_with};

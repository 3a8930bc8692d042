//! Rust bindings of the WIT world `monarch:host/program`.
//!
//! Imports are async (the controller waits for events without blocking a
//! thread) and trappable (a host-side failure, such as a full resource
//! table, traps the guest instead of being invented as a value).

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "program",
    imports: { default: async | trappable },
    exports: { default: async },
    additional_derives: [PartialEq],
    with: {
        "monarch:host/mesh.proc-mesh": crate::mesh::ProcMeshHandle,
        "monarch:host/mesh.actor-mesh": crate::mesh::ActorMeshHandle,
        "monarch:host/tensor.engine": crate::tensor::EngineHandle,
        "monarch:host/tensor.tensor": crate::tensor::TensorHandle,
        "monarch:host/rdma.buffer": crate::rdma::BufferHandle,
    },
});

pub use monarch::host::types::{
    CallError, Dim, EndpointError, ErrorKind, Event, EventKind, Origin, ProcInfo, ProcState,
    Reducer, Reply, Selector, SliceDim, SpawnOptions, SupervisionFailure, ValueMesh,
};

/// Where a data-plane wait (a tensor fetch, an RDMA transfer) posts its
/// `done` event: the instance's completion queue, which `next-events`
/// drains.
pub(crate) type Completions = tokio::sync::mpsc::UnboundedSender<Event>;

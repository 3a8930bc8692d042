//! Proc and actor meshes as the guest holds them: shapes, slices and refs.
//!
//! A mesh handle is a shape (an extent) and its members in row-major rank
//! order. Slicing keeps the members at the chosen coordinates: an index
//! drops its dimension, a range keeps it. A slice is again a mesh.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use hyperactor::ProcId;
use hyperactor_mesh::CastTarget;

use hyperactor_mesh::shape::{Extent, Selector, Shape};

use crate::bindings::{Dim, Selector as WitSelector, SliceDim};

/// A proc mesh: procs in an extent.
pub struct ProcMeshHandle {
    pub(crate) extent: Vec<Dim>,
    pub(crate) procs: Vec<ProcId>,
    /// Whether the instance started these procs (and so may kill them);
    /// false for a persistent mesh's procs lent to a job.
    pub(crate) owned: bool,
}

/// An actor mesh as spawned: its procs in order, and how many actors each
/// proc holds (rank `r` lives on proc `r / per_proc`).
#[derive(Debug)]
pub struct MeshBase {
    pub(crate) name: String,
    pub(crate) procs: Vec<ProcId>,
    pub(crate) per_proc: u32,
    /// What its owner knows happened to it (MS-1).
    pub(crate) state: std::sync::Mutex<MeshState>,
}

/// What happened to an actor mesh, as its owner heard it. A request to a
/// stopped mesh, or to a failed rank, fails at once with this (MS-1),
/// instead of waiting for the call timeout.
#[derive(Debug, Default)]
pub struct MeshState {
    /// Why the mesh was stopped, once it was.
    pub(crate) stopped: Option<String>,
    /// The failure of each rank that failed.
    pub(crate) failed: std::collections::BTreeMap<u32, crate::bindings::SupervisionFailure>,
}

impl MeshBase {
    /// A mesh nobody has heard anything of yet.
    pub(crate) fn new(name: String, procs: Vec<ProcId>, per_proc: u32) -> Self {
        MeshBase {
            name,
            procs,
            per_proc,
            state: Default::default(),
        }
    }

    /// The state, even if a panic poisoned its lock.
    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, MeshState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An actor mesh, or a slice of one.
#[derive(Clone)]
pub struct ActorMeshHandle {
    pub(crate) base: Arc<MeshBase>,
    pub(crate) extent: Vec<Dim>,
    /// The ranks in the mesh as spawned, in this view's row-major order.
    pub(crate) ranks: Vec<u32>,
    /// Calls in flight per rank of this view, for `choose`.
    pub(crate) in_flight: Arc<Vec<AtomicUsize>>,
}

impl ActorMeshHandle {
    pub(crate) fn new(base: Arc<MeshBase>, extent: Vec<Dim>, ranks: Vec<u32>) -> Self {
        let in_flight = Arc::new(ranks.iter().map(|_| AtomicUsize::new(0)).collect());
        ActorMeshHandle {
            base,
            extent,
            ranks,
            in_flight,
        }
    }

    /// The mesh's name.
    pub fn name(&self) -> &str {
        &self.base.name
    }

    /// Where a cast to the ranks at `positions` of this view goes (all of
    /// them when `None`): every proc of the mesh, in order, so that the
    /// tree does not depend on the selection (CA-1).
    pub(crate) fn target(&self, positions: Option<&[usize]>) -> CastTarget {
        let mut ranks: Vec<Vec<u32>> = vec![Vec::new(); self.base.procs.len()];
        let mut add = |rank: u32| {
            if let Some(on) = ranks.get_mut((rank / self.base.per_proc.max(1)) as usize) {
                on.push(rank);
            }
        };
        match positions {
            None => self.ranks.iter().copied().for_each(&mut add),
            Some(positions) => positions
                .iter()
                .filter_map(|&p| self.ranks.get(p).copied())
                .for_each(&mut add),
        }
        CastTarget {
            mesh: self.base.name.clone(),
            procs: self.base.procs.clone(),
            ranks,
        }
    }

    /// A reference that can travel inside a payload.
    pub(crate) fn to_ref(&self) -> Vec<u8> {
        let value = serde_json::json!({
            "monarch": "actor-mesh",
            "version": 1,
            "name": self.base.name,
            "procs": self.base.procs.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            "per_proc": self.base.per_proc,
            "extent": self.extent.iter().map(|d| (d.name.clone(), d.size)).collect::<Vec<_>>(),
            "ranks": self.ranks,
        });
        value.to_string().into_bytes()
    }

    /// The mesh a reference names.
    pub(crate) fn from_ref(bytes: &[u8]) -> Result<Self, String> {
        #[derive(serde::Deserialize)]
        struct Wire {
            monarch: Option<String>,
            version: Option<u32>,
            name: String,
            procs: Vec<String>,
            per_proc: u32,
            extent: Vec<(String, u32)>,
            ranks: Vec<u32>,
        }
        let wire: Wire = serde_json::from_slice(bytes)
            .map_err(|e| format!("not an actor mesh reference: {e}"))?;
        if wire.monarch.as_deref().is_some_and(|m| m != "actor-mesh")
            || wire.version.unwrap_or(1) != 1
        {
            return Err("not an actor mesh reference of version 1 (see wit/README.md)".into());
        }
        hyperactor::id::validate_name(&wire.name)
            .map_err(|e| format!("actor mesh reference: {e}"))?;
        let extent: Vec<Dim> = wire
            .extent
            .into_iter()
            .map(|(name, size)| Dim { name, size })
            .collect();
        if extent_size(&extent) != wire.ranks.len() || wire.per_proc == 0 {
            return Err("actor mesh reference: extent and ranks disagree".into());
        }
        let procs = wire
            .procs
            .iter()
            .map(|p| {
                p.parse::<ProcId>()
                    .map_err(|e| format!("actor mesh reference: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let limit = procs.len() as u64 * wire.per_proc as u64;
        if wire.ranks.iter().any(|&r| r as u64 >= limit) {
            return Err("actor mesh reference: a rank is outside the mesh".into());
        }
        let base = Arc::new(MeshBase::new(wire.name, procs, wire.per_proc));
        Ok(ActorMeshHandle::new(base, extent, wire.ranks))
    }
}

/// The actor kind of Wasm actors in a proc agent's registry.
pub const WASM_KIND: &str = "wasm";

/// What the `wasm` factory needs to make one actor.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WasmSpawnParams {
    /// The program's sha256.
    pub sha256: String,
    /// The actor class.
    pub class: String,
    /// The bytes for `create`.
    pub init: Vec<u8>,
    /// Linear memory per instance.
    pub memory_bytes: usize,
    /// How long the run has left, in milliseconds.
    pub deadline_ms: u64,
    /// The default call timeout of the actor's own requests.
    pub call_timeout_ms: u64,
    /// The fan-out of the actor's casts.
    pub fanout: u32,
    /// The actor's handler deadline (spawn option, else the run's
    /// default), in milliseconds.
    #[serde(default)]
    pub handler_timeout_ms: Option<u64>,
    /// What the run grants its guests.
    #[serde(default)]
    pub grants: crate::engine::Grants,
    /// The most procs the actor may itself spawn.
    #[serde(default)]
    pub max_procs: usize,
    /// Component instances one proc holds at once (`--max-instances`).
    #[serde(default = "default_max_instances")]
    pub max_instances: u32,
    /// Where a trapped actor writes its post-mortem record.
    #[serde(default)]
    pub dumps: Option<crate::debug::dumps::DumpConfig>,
    /// How the actor reaches the run's debugger at a breakpoint.
    #[serde(default)]
    pub debug: Option<crate::debug::pause::DebugConfig>,
    /// Whether the actor runs on the debug engine (`run --debug`).
    #[serde(default)]
    pub debug_engine: bool,
}

fn default_max_instances() -> u32 {
    crate::engine::DEFAULT_MAX_INSTANCES
}

impl WasmSpawnParams {
    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The number of points of an extent.
pub fn extent_size(extent: &[Dim]) -> usize {
    extent.iter().map(|d| d.size as usize).product()
}

/// The mesh layer's extent for a WIT extent, checked: at least one
/// dimension, no size 0, no name twice.
fn to_extent(extent: &[Dim]) -> Result<Extent, String> {
    Extent::new(extent.iter().map(|d| (d.name.clone(), d.size as usize))).map_err(|e| e.to_string())
}

/// Checks an extent a guest asked for.
pub fn validate_extent(extent: &[Dim]) -> Result<(), String> {
    to_extent(extent).map(|_| ())
}

/// Selects from `items`, laid out row-major in `extent`, the points that
/// `dims` keep (through `hyperactor_mesh::shape`: an index drops its
/// dimension, a range keeps it); returns the new extent and the kept items
/// in order.
pub fn slice<T: Clone>(
    extent: &[Dim],
    items: &[T],
    dims: &[SliceDim],
) -> Result<(Vec<Dim>, Vec<T>), String> {
    let shape = Shape::new(&to_extent(extent)?);
    let selections: Vec<(&str, Selector)> = dims
        .iter()
        .map(|d| {
            let selector = match d.select {
                WitSelector::Index(i) => Selector::Index(i as usize),
                WitSelector::Range((start, end, step)) => Selector::Range {
                    start: start as usize,
                    end: end as usize,
                    step: step as usize,
                },
            };
            (d.dim.as_str(), selector)
        })
        .collect();
    let sliced = shape.select_many(&selections).map_err(|e| e.to_string())?;
    let picked = sliced
        .ranks()
        .into_iter()
        .map(|rank| items.get(rank).cloned())
        .collect::<Option<Vec<T>>>()
        .ok_or_else(|| "mesh members do not fill its extent".to_string())?;
    let new_extent = sliced
        .extent()
        .dims()
        .iter()
        .map(|d| Dim {
            name: d.name.clone(),
            size: d.size as u32,
        })
        .collect();
    Ok((new_extent, picked))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(spec: &[(&str, u32)]) -> Vec<Dim> {
        spec.iter()
            .map(|(name, size)| Dim {
                name: name.to_string(),
                size: *size,
            })
            .collect()
    }

    #[test]
    fn an_index_drops_a_dimension_and_a_range_keeps_it() {
        let extent = dims(&[("hosts", 2), ("gpus", 4)]);
        let ranks: Vec<u32> = (0..8).collect();
        let (ext, kept) = slice(
            &extent,
            &ranks,
            &[SliceDim {
                dim: "hosts".into(),
                select: WitSelector::Index(1),
            }],
        )
        .unwrap();
        assert_eq!(ext, dims(&[("gpus", 4)]));
        assert_eq!(kept, vec![4, 5, 6, 7]);

        let (ext, kept) = slice(
            &extent,
            &ranks,
            &[SliceDim {
                dim: "gpus".into(),
                select: WitSelector::Range((1, 4, 2)),
            }],
        )
        .unwrap();
        assert_eq!(ext, dims(&[("hosts", 2), ("gpus", 2)]));
        assert_eq!(kept, vec![1, 3, 5, 7]);
    }

    #[test]
    fn bad_slices_say_what_is_wrong() {
        let extent = dims(&[("gpus", 4)]);
        let ranks: Vec<u32> = (0..4).collect();
        let err = |d: &str, s: WitSelector| {
            slice(
                &extent,
                &ranks,
                &[SliceDim {
                    dim: d.into(),
                    select: s,
                }],
            )
            .unwrap_err()
        };
        assert!(err("hosts", WitSelector::Index(0)).contains("no dimension `hosts`"));
        assert!(err("gpus", WitSelector::Index(4)).contains("outside"));
        assert!(err("gpus", WitSelector::Range((3, 2, 1))).contains("selects nothing"));
        assert!(err("gpus", WitSelector::Range((0, 2, 0))).contains("step 0"));
        assert!(validate_extent(&dims(&[("a", 2), ("a", 3)])).is_err());
        assert!(validate_extent(&dims(&[("a", 0)])).is_err());
    }

    #[test]
    fn refs_round_trip_and_garbage_is_refused() {
        let proc: ProcId = "local:x,p".parse().unwrap();
        let base = Arc::new(MeshBase::new("greeter".into(), vec![proc.clone(), proc], 2));
        let mesh = ActorMeshHandle::new(base, dims(&[("gpus", 2)]), vec![1, 3]);
        let back = ActorMeshHandle::from_ref(&mesh.to_ref()).unwrap();
        assert_eq!(back.name(), "greeter");
        assert_eq!(back.ranks, vec![1, 3]);
        let target = back.target(Some(&[1]));
        assert_eq!(target.ranks, vec![vec![], vec![3]]);
        assert!(ActorMeshHandle::from_ref(b"nonsense").is_err());
    }
}

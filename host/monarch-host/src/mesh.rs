//! Proc and actor meshes as the guest holds them: shapes, slices and refs.
//!
//! A mesh handle is a shape (an extent) and its members in row-major rank
//! order. Slicing keeps the members at the chosen coordinates: an index
//! drops its dimension, a range keeps it. A slice is again a mesh.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use hyperactor::ProcId;
use hyperactor_mesh::CastTarget;

use crate::bindings::{Dim, Selector, SliceDim};

/// A proc mesh: procs in an extent.
pub struct ProcMeshHandle {
    pub(crate) extent: Vec<Dim>,
    pub(crate) procs: Vec<ProcId>,
}

/// An actor mesh as spawned: its procs in order, and how many actors each
/// proc holds (rank `r` lives on proc `r / per_proc`).
#[derive(Debug)]
pub struct MeshBase {
    pub(crate) name: String,
    pub(crate) procs: Vec<ProcId>,
    pub(crate) per_proc: u32,
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
            name: String,
            procs: Vec<String>,
            per_proc: u32,
            extent: Vec<(String, u32)>,
            ranks: Vec<u32>,
        }
        let wire: Wire = serde_json::from_slice(bytes)
            .map_err(|e| format!("not an actor mesh reference: {e}"))?;
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
        let base = Arc::new(MeshBase {
            name: wire.name,
            procs,
            per_proc: wire.per_proc,
        });
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

/// Checks an extent a guest asked for.
pub fn validate_extent(extent: &[Dim]) -> Result<(), String> {
    if extent.is_empty() {
        return Err("an extent needs at least one dimension".into());
    }
    for (i, dim) in extent.iter().enumerate() {
        if dim.size == 0 {
            return Err(format!("dimension `{}` has size 0", dim.name));
        }
        if extent[..i].iter().any(|other| other.name == dim.name) {
            return Err(format!("dimension `{}` appears twice", dim.name));
        }
    }
    Ok(())
}

/// Selects from `items`, laid out row-major in `extent`, the points that
/// `dims` keep; returns the new extent and the kept items in order.
pub fn slice<T: Clone>(
    extent: &[Dim],
    items: &[T],
    dims: &[SliceDim],
) -> Result<(Vec<Dim>, Vec<T>), String> {
    for (i, d) in dims.iter().enumerate() {
        if !extent.iter().any(|e| e.name == d.dim) {
            let known: Vec<&str> = extent.iter().map(|e| e.name.as_str()).collect();
            return Err(format!(
                "no dimension `{}` (the mesh has {})",
                d.dim,
                known.join(", ")
            ));
        }
        if dims[..i].iter().any(|other| other.dim == d.dim) {
            return Err(format!("dimension `{}` sliced twice", d.dim));
        }
    }
    // For every dimension: the coordinates kept, and whether it stays.
    let mut choices: Vec<(Vec<u32>, bool)> = Vec::with_capacity(extent.len());
    for dim in extent {
        let choice = match dims.iter().find(|d| d.dim == dim.name) {
            None => ((0..dim.size).collect(), true),
            Some(d) => match d.select {
                Selector::Index(i) => {
                    if i >= dim.size {
                        return Err(format!(
                            "index {i} is outside `{}` (size {})",
                            dim.name, dim.size
                        ));
                    }
                    (vec![i], false)
                }
                Selector::Range((start, end, step)) => {
                    if step == 0 {
                        return Err(format!("range on `{}` has step 0", dim.name));
                    }
                    let end = end.min(dim.size);
                    if start >= end {
                        return Err(format!(
                            "range {start}..{end} on `{}` (size {}) is empty",
                            dim.name, dim.size
                        ));
                    }
                    ((start..end).step_by(step as usize).collect(), true)
                }
            },
        };
        choices.push(choice);
    }
    let mut strides = vec![1usize; extent.len()];
    for i in (0..extent.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * extent[i + 1].size as usize;
    }
    let new_extent: Vec<Dim> = extent
        .iter()
        .zip(&choices)
        .filter(|(_, (_, kept))| *kept)
        .map(|(dim, (coords, _))| Dim {
            name: dim.name.clone(),
            size: coords.len() as u32,
        })
        .collect();
    let mut picked = Vec::with_capacity(extent_size(&new_extent));
    let mut cursor = vec![0usize; extent.len()];
    loop {
        let index: usize = cursor
            .iter()
            .enumerate()
            .map(|(d, &c)| choices[d].0[c] as usize * strides[d])
            .sum();
        let item = items
            .get(index)
            .ok_or_else(|| "mesh members do not fill its extent".to_string())?;
        picked.push(item.clone());
        // Advance the row-major cursor over the chosen coordinates.
        let mut d = extent.len();
        loop {
            if d == 0 {
                return Ok((new_extent, picked));
            }
            d -= 1;
            cursor[d] += 1;
            if cursor[d] < choices[d].0.len() {
                break;
            }
            cursor[d] = 0;
        }
    }
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
                select: Selector::Index(1),
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
                select: Selector::Range((1, 4, 2)),
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
        let err = |d: &str, s: Selector| {
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
        assert!(err("hosts", Selector::Index(0)).contains("no dimension `hosts`"));
        assert!(err("gpus", Selector::Index(4)).contains("outside"));
        assert!(err("gpus", Selector::Range((3, 2, 1))).contains("empty"));
        assert!(err("gpus", Selector::Range((0, 2, 0))).contains("step 0"));
        assert!(validate_extent(&dims(&[("a", 2), ("a", 3)])).is_err());
        assert!(validate_extent(&dims(&[("a", 0)])).is_err());
    }

    #[test]
    fn refs_round_trip_and_garbage_is_refused() {
        let proc: ProcId = "local:x,p".parse().unwrap();
        let base = Arc::new(MeshBase {
            name: "greeter".into(),
            procs: vec![proc.clone(), proc],
            per_proc: 2,
        });
        let mesh = ActorMeshHandle::new(base, dims(&[("gpus", 2)]), vec![1, 3]);
        let back = ActorMeshHandle::from_ref(&mesh.to_ref()).unwrap();
        assert_eq!(back.name(), "greeter");
        assert_eq!(back.ranks, vec![1, 3]);
        let target = back.target(Some(&[1]));
        assert_eq!(target.ranks, vec![vec![], vec![3]]);
        assert!(ActorMeshHandle::from_ref(b"nonsense").is_err());
    }
}

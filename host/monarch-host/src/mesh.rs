//! Proc and actor meshes as the guest holds them: shapes, slices and refs.
//!
//! A mesh handle is a shape (an extent) and its members in row-major rank
//! order. Slicing keeps the members at the chosen coordinates: an index
//! drops its dimension, a range keeps it. A slice is again a mesh.
//!
//! - EX-1: sizes from a guest (an extent, a reference's fields) are
//!   multiplied with overflow checks; a reference whose extent does not
//!   hold exactly its ranks, or names a dimension twice, is refused.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use hyperactor::ProcId;
use hyperactor_mesh::agent::MeshEvent;
use hyperactor_mesh::client::MeshClient;
use hyperactor_mesh::{CastTarget, FaultKind};

use hyperactor_mesh::shape::{Extent, Selector, Shape};

use crate::bindings::{Dim, Selector as WitSelector, SliceDim};

pub(crate) mod reference;

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
    /// Whether it is a persistent actor mesh, which belongs to the server
    /// and which only `DELETE /v1/meshes/NAME` stops.
    pub(crate) persistent: bool,
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
            persistent: false,
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

    /// A reference that can travel inside a payload (`reference`).
    pub(crate) fn to_ref(&self) -> Vec<u8> {
        reference::encode(&reference::MeshRef {
            name: self.base.name.clone(),
            procs: self.base.procs.clone(),
            per_proc: self.base.per_proc,
            extent: self
                .extent
                .iter()
                .map(|d| (d.name.clone(), d.size))
                .collect(),
            ranks: self.ranks.clone(),
        })
    }

    /// The mesh a reference names, checked (MR-1 of `reference`).
    pub(crate) fn from_ref(bytes: &[u8]) -> Result<Self, String> {
        let parsed = reference::parse(bytes)?;
        let extent = parsed
            .extent
            .into_iter()
            .map(|(name, size)| Dim { name, size })
            .collect();
        let base = Arc::new(MeshBase::new(parsed.name, parsed.procs, parsed.per_proc));
        Ok(ActorMeshHandle::new(base, extent, parsed.ranks))
    }
}

/// The on-proc name of the persistent actor mesh `name`: `p.<name>`. A
/// job's actor meshes on a persistent mesh's procs are `j<job>.<name>`, and
/// a persistent name has no `.`, so the two never collide.
pub(crate) fn persistent_actor_name(name: &str) -> String {
    format!("p.{name}")
}

/// Checks the name of a persistent actor mesh: 1 to 64 letters, digits,
/// `-` and `_` (so that `DELETE /v1/meshes/NAME` can name it), not starting
/// with `job-` (a job's fresh mesh).
pub fn validate_persistent_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !name.starts_with("job-");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "bad persistent actor mesh name `{}`: use 1 to 64 letters, digits, `-` and `_`, not starting with `job-`",
            name.escape_debug()
        ))
    }
}

/// An actor mesh that belongs to the server, not to the job or session
/// that spawned it (`spawn-persistent`): it runs on the procs of a
/// persistent proc mesh until `DELETE /v1/meshes/NAME`, the deletion of its
/// proc mesh, a `respawn`, or the server's stop.
pub struct PersistentActorMesh {
    /// The name it was spawned and is looked up under.
    pub name: String,
    /// Its actor class.
    pub class: String,
    /// The persistent proc mesh its actors run on.
    pub proc_mesh: String,
    /// Who spawned it: `job 7`.
    pub spawned_by: String,
    /// Its actors; their failures are recorded in its state (MS-1), which
    /// every handle to it shares.
    pub(crate) base: Arc<MeshBase>,
    pub(crate) extent: Vec<Dim>,
    /// The proc mesh's client, which stops its actors.
    pub(crate) client: Arc<MeshClient>,
}

/// What became of one rank of a persistent actor mesh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistentRank {
    /// The actor's rank.
    pub rank: u32,
    /// The rank of its proc in the proc mesh.
    pub proc: u32,
    /// `running`, `failed` or `stopped`.
    pub state: &'static str,
    /// Why it failed or stopped.
    pub reason: Option<String>,
}

impl std::fmt::Debug for PersistentActorMesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistentActorMesh")
            .field("name", &self.name)
            .field("class", &self.class)
            .field("proc_mesh", &self.proc_mesh)
            .field("base", &self.base)
            .finish()
    }
}

impl PersistentActorMesh {
    /// A handle to the whole mesh, sharing what is known of it.
    pub(crate) fn handle(&self) -> ActorMeshHandle {
        let ranks = (0..extent_size(&self.extent) as u32).collect();
        ActorMeshHandle::new(self.base.clone(), self.extent.clone(), ranks)
    }

    /// The mesh's shape, as `name=size` pairs.
    pub fn extent(&self) -> Vec<(String, u32)> {
        self.extent
            .iter()
            .map(|d| (d.name.clone(), d.size))
            .collect()
    }

    /// `running`, `failed` (a rank failed) or `stopped`, and why.
    pub fn state(&self) -> (&'static str, Option<String>) {
        let state = self.base.state();
        if let Some(why) = &state.stopped {
            return ("stopped", Some(why.clone()));
        }
        match state.failed.values().next() {
            Some(failure) => (
                "failed",
                Some(format!("rank {}: {}", failure.rank, failure.reason)),
            ),
            None => ("running", None),
        }
    }

    /// Each rank's state.
    pub fn ranks(&self) -> Vec<PersistentRank> {
        let state = self.base.state();
        let count = extent_size(&self.extent) as u32;
        (0..count)
            .map(|rank| {
                let (state, reason) = match (&state.stopped, state.failed.get(&rank)) {
                    (_, Some(failure)) => ("failed", Some(failure.reason.clone())),
                    (Some(why), None) => ("stopped", Some(why.clone())),
                    (None, None) => ("running", None),
                };
                PersistentRank {
                    rank,
                    proc: rank / self.base.per_proc.max(1),
                    state,
                    reason,
                }
            })
            .collect()
    }

    /// Records the failure of `rank` (once), unless the mesh was stopped.
    fn fail(&self, rank: u32, fault: hyperactor_mesh::Fault) {
        let failure = crate::errors::failure(&self.base.name, rank, fault);
        let mut state = self.base.state();
        if state.stopped.is_some() || state.failed.contains_key(&rank) {
            return;
        }
        tracing::warn!(
            mesh = %self.name,
            proc_mesh = %self.proc_mesh,
            rank,
            reason = %failure.reason,
            "an actor of a persistent actor mesh failed; no job fails for it (DELETE /v1/meshes/{} stops the mesh)",
            self.name
        );
        state.failed.insert(rank, failure);
    }
}

/// The persistent actor meshes of a server, by name, which every job and
/// session it runs reaches (through its [`crate::host::MeshObserver`]).
#[derive(Default)]
pub struct PersistentActorMeshes {
    inner: std::sync::Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    meshes: std::collections::BTreeMap<String, Arc<PersistentActorMesh>>,
    /// Names being spawned.
    spawning: std::collections::BTreeSet<String>,
    /// The names of the server's persistent proc meshes, which an actor
    /// mesh may not take (`DELETE /v1/meshes/NAME` names either).
    proc_meshes: std::collections::BTreeSet<String>,
}

impl PersistentActorMeshes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The mesh `name`.
    pub fn get(&self, name: &str) -> Option<Arc<PersistentActorMesh>> {
        self.lock().meshes.get(name).cloned()
    }

    /// Every mesh, by name.
    pub fn list(&self) -> Vec<Arc<PersistentActorMesh>> {
        self.lock().meshes.values().cloned().collect()
    }

    /// Notes that the persistent proc mesh `name` exists (or no longer).
    pub fn set_proc_mesh(&self, name: &str, exists: bool) {
        let mut registry = self.lock();
        match exists {
            true => registry.proc_meshes.insert(name.to_string()),
            false => registry.proc_meshes.remove(name),
        };
    }

    /// Claims `name` for a spawn. A mesh of that name fails it, naming
    /// `respawn`, unless `replace`: then the mesh is taken out and returned,
    /// for the caller to stop.
    pub(crate) fn claim(
        &self,
        name: &str,
        replace: bool,
    ) -> Result<Option<Arc<PersistentActorMesh>>, String> {
        let mut registry = self.lock();
        if registry.proc_meshes.contains(name) {
            return Err(format!(
                "the name `{name}` is a persistent proc mesh's; give the persistent actor mesh another"
            ));
        }
        if registry.spawning.contains(name) {
            return Err(format!(
                "the persistent actor mesh `{name}` is being spawned by another job"
            ));
        }
        let old = match registry.meshes.get(name) {
            Some(old) if !replace => {
                return Err(format!(
                    "a persistent actor mesh named `{name}` exists (class {}, on the mesh `{}`); look it up with `lookup_actor_mesh(\"{name}\")`, or replace it with `respawn`, which loses its actors' state",
                    old.class, old.proc_mesh
                ));
            }
            Some(_) => registry.meshes.remove(name),
            None => None,
        };
        registry.spawning.insert(name.to_string());
        Ok(old)
    }

    /// Ends the spawn that claimed `name`: adds the mesh it made, if any.
    pub(crate) fn release(&self, name: &str, made: Option<Arc<PersistentActorMesh>>) {
        let mut registry = self.lock();
        registry.spawning.remove(name);
        if let Some(mesh) = made {
            registry.meshes.insert(name.to_string(), mesh);
        }
    }

    /// Takes the mesh `name` out, marks it stopped for `why`, and stops
    /// its actors.
    pub async fn stop(&self, name: &str, why: &str) -> Option<Arc<PersistentActorMesh>> {
        let mesh = self.lock().meshes.remove(name)?;
        stop_persistent(&mesh, why).await;
        Some(mesh)
    }

    /// Takes out the meshes on the proc mesh `proc_mesh` (whose procs
    /// stop), marking them stopped for `why`.
    pub fn forget_on(&self, proc_mesh: &str, why: &str) -> Vec<Arc<PersistentActorMesh>> {
        let mut registry = self.lock();
        let names: Vec<String> = registry
            .meshes
            .iter()
            .filter(|(_, m)| m.proc_mesh == proc_mesh)
            .map(|(name, _)| name.clone())
            .collect();
        let gone: Vec<Arc<PersistentActorMesh>> = names
            .iter()
            .filter_map(|name| registry.meshes.remove(name))
            .collect();
        drop(registry);
        for mesh in &gone {
            mesh.base
                .state()
                .stopped
                .get_or_insert_with(|| why.to_string());
            tracing::info!(mesh = %mesh.name, proc_mesh, "persistent actor mesh stopped with its procs");
        }
        gone
    }

    /// Takes an event of the proc mesh `proc_mesh`'s client: a failure of
    /// an actor or a proc of a persistent actor mesh is logged and recorded
    /// in the mesh's state (requests to the rank then fail at once). It
    /// fails no job.
    pub fn take_event(&self, proc_mesh: &str, event: &MeshEvent) {
        let meshes: Vec<Arc<PersistentActorMesh>> = self
            .lock()
            .meshes
            .values()
            .filter(|m| m.proc_mesh == proc_mesh)
            .cloned()
            .collect();
        match event {
            MeshEvent::ActorFailed { actor, reason } => {
                let proc = actor.proc_id();
                if let Some(mesh) = meshes
                    .iter()
                    .find(|m| m.base.name == actor.name() && m.base.procs.iter().any(|p| p == proc))
                {
                    let fault = hyperactor_mesh::Fault::decode(reason, FaultKind::Trap);
                    mesh.fail(actor.rank(), fault);
                }
            }
            MeshEvent::ProcStopped { proc, reason } => {
                for mesh in &meshes {
                    if let Some(at) = mesh.base.procs.iter().position(|p| p == proc) {
                        let first = at as u32 * mesh.base.per_proc;
                        for rank in first..first + mesh.base.per_proc {
                            let why = format!("proc {proc} {reason}");
                            mesh.fail(rank, hyperactor_mesh::Fault::new(FaultKind::ProcLost, why));
                        }
                    }
                }
            }
            MeshEvent::Log { .. } => {}
        }
    }
}

/// Marks `mesh` stopped for `why` and stops its actors.
pub(crate) async fn stop_persistent(mesh: &PersistentActorMesh, why: &str) {
    mesh.base.state().stopped = Some(why.to_string());
    mesh.client
        .stop_actors(
            &mesh.base.procs,
            &mesh.base.name,
            std::time::Duration::from_secs(5),
        )
        .await;
    tracing::info!(mesh = %mesh.name, proc_mesh = %mesh.proc_mesh, "persistent actor mesh stopped: {why}");
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

/// The number of points of an extent; `usize::MAX` when the product
/// overflows (a guest may name any sizes: EX-1).
pub fn extent_size(extent: &[Dim]) -> usize {
    extent
        .iter()
        .try_fold(1usize, |size, d| size.checked_mul(d.size as usize))
        .unwrap_or(usize::MAX)
}

/// The number of points of an extent, if it fits a rank (`u32`).
pub fn checked_extent_size(extent: &[Dim]) -> Option<u32> {
    extent
        .iter()
        .try_fold(1u32, |size, d| size.checked_mul(d.size))
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
    fn persistent_names_are_checked_and_claimed_once() {
        assert!(validate_persistent_name("counter-1_b").is_ok());
        for bad in ["", "a.b", "a/b", "job-7", &"x".repeat(65)] {
            assert!(validate_persistent_name(bad).is_err(), "{bad}");
        }
        assert_eq!(persistent_actor_name("counter"), "p.counter");
        let registry = PersistentActorMeshes::default();
        assert!(registry.claim("counter", false).unwrap().is_none());
        let busy = registry.claim("counter", true).unwrap_err();
        assert!(busy.contains("being spawned"), "{busy}");
        registry.release("counter", None);
        assert!(registry.get("counter").is_none());
        assert!(registry.claim("counter", false).unwrap().is_none());
        registry.release("counter", None);
        registry.set_proc_mesh("workers", true);
        let taken = registry.claim("workers", false).unwrap_err();
        assert!(taken.contains("persistent proc mesh"), "{taken}");
        registry.set_proc_mesh("workers", false);
        assert!(registry.claim("workers", false).is_ok());
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

    use super::reference::tests::forged;

    #[test]
    fn ex_1_forged_extents_are_refused_without_overflow() {
        let big = u32::MAX;
        let overflow = forged(&format!(r#"[["a",{big}],["b",{big}],["c",{big}]]"#), "[]");
        let error = ActorMeshHandle::from_ref(&overflow).err().unwrap();
        assert!(error.contains("extent and ranks disagree"), "{error}");
        // 2^64 wraps to 0 in unchecked arithmetic, which would match no ranks.
        let wraps = forged(r#"[["a",65536],["b",65536],["c",65536],["d",65536]]"#, "[]");
        assert!(ActorMeshHandle::from_ref(&wraps).is_err());
        let twice = forged(r#"[["x",1],["x",1]]"#, "[0]");
        let error = ActorMeshHandle::from_ref(&twice).err().unwrap();
        assert!(error.contains("named twice"), "{error}");
        let outside = forged(r#"[["x",2]]"#, "[0,7]");
        let error = ActorMeshHandle::from_ref(&outside).err().unwrap();
        assert!(error.contains("outside the mesh"), "{error}");
        // A slice down to one actor has no dimensions left, and is fine.
        assert!(ActorMeshHandle::from_ref(&forged("[]", "[0]")).is_ok());
        let huge = dims(&[("a", big), ("b", big), ("c", big)]);
        assert_eq!(extent_size(&huge), usize::MAX);
        assert_eq!(checked_extent_size(&huge), None);
    }
}

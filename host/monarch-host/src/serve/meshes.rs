//! Meshes as the server sees them: persistent meshes, whose procs outlive
//! jobs, and the fresh meshes of running jobs. A [`MeshView`] follows what
//! jobs spawn and stop on a mesh (as a [`MeshObserver`]) and what happens to
//! its procs and actors (the mesh client's events).

use std::sync::{Arc, Mutex};

use hyperactor::ProcId;
use hyperactor_mesh::agent::MeshEvent;
use hyperactor_mesh::client::MeshClient;

use super::api::{ActorMeshInfo, ActorsInfo, MeshInfo, ProcInfo, RankInfo};
use crate::host::MeshObserver;
use crate::mesh::{PersistentActorMesh, PersistentActorMeshes};

/// What the server knows of one mesh.
pub(crate) struct MeshView {
    name: String,
    job: Option<u64>,
    state: Mutex<ViewState>,
}

#[derive(Default)]
struct ViewState {
    procs: Vec<(ProcId, Option<String>)>,
    actors: Vec<ActorView>,
}

struct ActorView {
    name: String,
    job: u64,
    class: String,
    procs: Vec<ProcId>,
    per_proc: u32,
    /// Why each rank failed or stopped; None while it runs.
    ended: Vec<Option<(String, String)>>,
}

impl MeshView {
    /// A view of the mesh `name` (a fresh mesh names its `job`).
    pub(crate) fn new(name: String, job: Option<u64>, procs: Vec<ProcId>) -> Arc<MeshView> {
        Arc::new(MeshView {
            name,
            job,
            state: Mutex::new(ViewState {
                procs: procs.into_iter().map(|p| (p, None)).collect(),
                actors: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ViewState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The mesh's procs, in rank order.
    pub(crate) fn procs(&self) -> Vec<ProcId> {
        self.lock().procs.iter().map(|(p, _)| p.clone()).collect()
    }

    /// Takes an event of the mesh's client.
    pub(crate) fn take_event(&self, event: &MeshEvent) {
        let mut state = self.lock();
        match event {
            MeshEvent::ProcStopped { proc, reason } => {
                for (p, ended) in &mut state.procs {
                    if p == proc && ended.is_none() {
                        *ended = Some(reason.clone());
                    }
                }
                for actors in &mut state.actors {
                    for (rank, ended) in actors.ended.iter_mut().enumerate() {
                        let on = &actors.procs[rank / actors.per_proc.max(1) as usize];
                        if on == proc && ended.is_none() {
                            *ended = Some(("stopped".into(), format!("proc {reason}")));
                        }
                    }
                }
            }
            MeshEvent::ActorFailed { actor, reason } => {
                for actors in &mut state.actors {
                    if actors.name != actor.name() {
                        continue;
                    }
                    if let Some(ended) = actors.ended.get_mut(actor.rank() as usize)
                        && ended.is_none()
                    {
                        *ended = Some(("failed".into(), reason.clone()));
                    }
                }
            }
            MeshEvent::Log { .. } => {}
        }
    }

    /// The mesh as the API shows it.
    pub(crate) fn info(&self, persistent: bool) -> MeshInfo {
        let state = self.lock();
        let index = |proc: &ProcId| {
            state
                .procs
                .iter()
                .position(|(p, _)| p == proc)
                .unwrap_or(usize::MAX) as u32
        };
        MeshInfo {
            name: self.name.clone(),
            persistent,
            job: self.job,
            procs: state
                .procs
                .iter()
                .enumerate()
                .map(|(rank, (proc, ended))| ProcInfo {
                    rank: rank as u32,
                    id: proc.to_string(),
                    state: if ended.is_some() {
                        "stopped"
                    } else {
                        "running"
                    }
                    .into(),
                    reason: ended.clone(),
                })
                .collect(),
            actors: state
                .actors
                .iter()
                .map(|actors| ActorsInfo {
                    name: actors.name.clone(),
                    job: actors.job,
                    class: actors.class.clone(),
                    ranks: actors
                        .ended
                        .iter()
                        .enumerate()
                        .map(|(rank, ended)| {
                            let proc = &actors.procs[rank / actors.per_proc.max(1) as usize];
                            let (state, reason) = match ended {
                                None => ("running".to_string(), None),
                                Some((state, reason)) => (state.clone(), Some(reason.clone())),
                            };
                            RankInfo {
                                rank: rank as u32,
                                proc: index(proc),
                                state,
                                reason,
                            }
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// What job `job` does on this mesh, as an observer; it reaches the
    /// server's persistent actor meshes through `persistent`.
    pub(crate) fn observer(
        self: &Arc<Self>,
        job: u64,
        persistent: Arc<PersistentActorMeshes>,
    ) -> Arc<dyn MeshObserver> {
        Arc::new(JobObserver {
            view: self.clone(),
            job,
            persistent,
        })
    }

    /// Forgets the actor meshes of `job` (it ended).
    pub(crate) fn forget_job(&self, job: u64) {
        self.lock().actors.retain(|a| a.job != job);
    }
}

struct JobObserver {
    view: Arc<MeshView>,
    job: u64,
    persistent: Arc<PersistentActorMeshes>,
}

impl MeshObserver for JobObserver {
    fn procs_spawned(&self, procs: &[ProcId]) {
        let mut state = self.view.lock();
        for proc in procs {
            if !state.procs.iter().any(|(p, _)| p == proc) {
                state.procs.push((proc.clone(), None));
            }
        }
    }

    fn actors_spawned(&self, name: &str, class: &str, procs: &[ProcId], per_proc: u32) {
        let mut state = self.view.lock();
        state.actors.retain(|a| a.name != name);
        state.actors.push(ActorView {
            name: name.to_string(),
            job: self.job,
            class: class.to_string(),
            procs: procs.to_vec(),
            per_proc: per_proc.max(1),
            ended: vec![None; procs.len() * per_proc.max(1) as usize],
        });
    }

    fn actors_stopped(&self, name: &str) {
        self.view.lock().actors.retain(|a| a.name != name);
    }

    fn mesh_event(&self, event: &MeshEvent) {
        self.view.take_event(event);
    }

    fn persistent_actors(&self) -> Option<Arc<PersistentActorMeshes>> {
        Some(self.persistent.clone())
    }
}

/// A persistent actor mesh as the API shows it.
pub(crate) fn actor_mesh_info(mesh: &PersistentActorMesh) -> ActorMeshInfo {
    let (state, reason) = mesh.state();
    ActorMeshInfo {
        name: mesh.name.clone(),
        class: mesh.class.clone(),
        mesh: mesh.proc_mesh.clone(),
        spawned_by: mesh.spawned_by.clone(),
        extent: mesh.extent(),
        state: state.into(),
        reason,
        ranks: mesh
            .ranks()
            .into_iter()
            .map(|r| RankInfo {
                rank: r.rank,
                proc: r.proc,
                state: r.state.into(),
                reason: r.reason,
            })
            .collect(),
    }
}

/// A mesh whose procs outlive jobs.
pub(crate) struct PersistentMesh {
    pub(crate) client: Arc<MeshClient>,
    pub(crate) view: Arc<MeshView>,
}

/// Checks a mesh name: letters, digits, `-` and `_`, 1 to 64 of them.
pub(crate) fn validate_mesh_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok && !name.starts_with("job-") {
        Ok(())
    } else {
        Err(format!(
            "bad mesh name `{}`: use 1 to 64 letters, digits, `-` and `_`, not starting with `job-`",
            name.escape_debug()
        ))
    }
}

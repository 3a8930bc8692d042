//! Meshes as the server sees them: persistent meshes, whose procs outlive
//! jobs, and the fresh meshes of running jobs. A [`MeshView`] follows what
//! jobs spawn and stop on a mesh (as a [`MeshObserver`]) and what happens to
//! its procs and actors (the mesh client's events).
//!
//! Persistent meshes survive what happens to their procs and to the server:
//! - PM-1: a persistent proc mesh (`serve --mesh`, `POST /v1/meshes`) is
//!   recorded in the database and started again, with new procs, at each
//!   start of the server until it is deleted; the jobs that were running
//!   on it when the server died are failed, saying its procs are new.
//!   Persistent actor meshes on it are not restored (their state was in
//!   the procs' memory): the server records which live, and lists those a
//!   restart lost as `lost` until they are spawned again or deleted.
//! - PM-2: a proc of a persistent mesh that dies (killed, crashed) is
//!   replaced by a new proc at its rank, with a log line; the mesh's info
//!   counts replacements and shows the latest. Jobs holding the dead proc
//!   see its failure; later jobs get the new one.
//! - PM-3: at most [`STORM_LIMIT`] replacements of one rank within
//!   [`STORM_WINDOW`]; a rank that dies once more is left dead, with a log
//!   line and its reason saying so.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyperactor::ProcId;
use hyperactor_mesh::agent::MeshEvent;
use hyperactor_mesh::client::MeshClient;

use super::api::{
    ActorMeshInfo, ActorsInfo, JobActorMesh, JobActorRank, MeshInfo, ProcInfo, RankInfo,
    Replacement,
};
use crate::host::MeshObserver;
use crate::mesh::{PersistentActorMesh, PersistentActorMeshes};

/// What the server knows of one mesh.
pub(crate) struct MeshView {
    name: String,
    job: Option<u64>,
    state: Mutex<ViewState>,
    /// Where jobs' actor meshes go as they stop, for
    /// `GET /v1/jobs/{id}/actors` after the fact; set by the server.
    archive: std::sync::OnceLock<Arc<ActorArchive>>,
}

/// The most jobs whose stopped actor meshes an [`ActorArchive`] keeps.
const ARCHIVED_JOBS: usize = 1000;

/// Jobs' actor meshes as they were when they stopped (a failed rank
/// stays failed, with its reason), for the newest [`ARCHIVED_JOBS`] jobs.
#[derive(Default)]
pub(crate) struct ActorArchive {
    jobs: Mutex<std::collections::BTreeMap<u64, Vec<JobActorMesh>>>,
}

impl ActorArchive {
    fn add(&self, job: u64, meshes: Vec<JobActorMesh>) {
        if meshes.is_empty() {
            return;
        }
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let kept = jobs.entry(job).or_default();
        for mesh in meshes {
            kept.retain(|m| m.mesh != mesh.mesh);
            kept.push(mesh);
        }
        while jobs.len() > ARCHIVED_JOBS {
            jobs.pop_first();
        }
    }

    /// The stopped actor meshes of `job`.
    pub(crate) fn get(&self, job: u64) -> Vec<JobActorMesh> {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&job)
            .cloned()
            .unwrap_or_default()
    }
}

#[derive(Default)]
struct ViewState {
    procs: Vec<(ProcId, Option<String>)>,
    /// Each rank's OS process, where known (a persistent mesh's).
    pids: Vec<Option<u32>>,
    /// The replacements of a persistent mesh's dead procs (PM-2), by rank.
    replacements: HashMap<u32, RankReplacements>,
    actors: Vec<ActorView>,
}

/// The replacements of one rank's proc.
#[derive(Default)]
struct RankReplacements {
    count: u32,
    /// Why the last one was needed, and when (ms since the epoch).
    last: Option<(String, i64)>,
    /// When the recent ones were, for the storm limit (PM-3).
    recent: VecDeque<Instant>,
    /// Set when the storm limit left the rank dead: why.
    given_up: Option<String>,
}

/// The most replacements of one rank within [`STORM_WINDOW`]; one more
/// death leaves the rank dead (PM-3).
pub(crate) const STORM_LIMIT: usize = 5;

/// The window of [`STORM_LIMIT`].
pub(crate) const STORM_WINDOW: Duration = Duration::from_secs(60);

/// Whether a dead proc of a persistent mesh is replaced.
#[derive(Debug, PartialEq)]
pub(crate) enum Replace {
    /// Replace the proc at this rank.
    Rank(u32),
    /// Not a proc of this mesh now (already replaced, or unknown).
    NotOurs,
    /// The rank died too often (PM-3): left dead.
    StormLimit(u32),
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

impl ActorView {
    /// The mesh as `GET /v1/jobs/{id}/actors` shows it, its scope
    /// (`j<job>.`) left out; ranks that run are shown `stopped` for
    /// `stopped` when it is given.
    fn snapshot(&self, stopped: Option<&str>) -> JobActorMesh {
        let scope = format!("j{}.", self.job);
        JobActorMesh {
            mesh: self
                .name
                .strip_prefix(&scope)
                .unwrap_or(&self.name)
                .to_string(),
            class: self.class.clone(),
            ranks: self
                .ended
                .iter()
                .enumerate()
                .map(|(rank, ended)| {
                    let proc = self
                        .procs
                        .get(rank / self.per_proc.max(1) as usize)
                        .map(ToString::to_string)
                        .unwrap_or_default();
                    let (state, reason) = match (ended, stopped) {
                        (Some((state, reason)), _) => (state.clone(), Some(reason.clone())),
                        (None, Some(why)) => ("stopped".to_string(), Some(why.to_string())),
                        (None, None) => ("running".to_string(), None),
                    };
                    JobActorRank {
                        rank: rank as u32,
                        proc,
                        state,
                        reason,
                        endpoint: None,
                        dump: None,
                    }
                })
                .collect(),
        }
    }
}

impl MeshView {
    /// A view of the mesh `name` (a fresh mesh names its `job`).
    pub(crate) fn new(name: String, job: Option<u64>, procs: Vec<ProcId>) -> Arc<MeshView> {
        Arc::new(MeshView {
            name,
            job,
            archive: std::sync::OnceLock::new(),
            state: Mutex::new(ViewState {
                pids: vec![None; procs.len()],
                procs: procs.into_iter().map(|p| (p, None)).collect(),
                ..ViewState::default()
            }),
        })
    }

    /// Keeps the actor meshes of jobs in `archive` as they stop.
    pub(crate) fn set_archive(&self, archive: Arc<ActorArchive>) {
        let _ = self.archive.set(archive);
    }

    /// The mesh's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Each rank's proc and OS process (where known).
    pub(crate) fn procs_and_pids(&self) -> Vec<(ProcId, Option<u32>)> {
        let state = self.lock();
        state
            .procs
            .iter()
            .enumerate()
            .map(|(rank, (proc, _))| (proc.clone(), state.pids.get(rank).copied().flatten()))
            .collect()
    }

    /// The actor meshes that `job` runs on this mesh now, each rank's
    /// reason as the mesh client gave it (an encoded fault, maybe).
    pub(crate) fn job_actors(&self, job: u64) -> Vec<JobActorMesh> {
        self.lock()
            .actors
            .iter()
            .filter(|a| a.job == job)
            .map(|a| a.snapshot(None))
            .collect()
    }

    /// Records each rank's OS process (a persistent mesh's procs).
    pub(crate) fn set_pids(&self, pids: Vec<Option<u32>>) {
        self.lock().pids = pids;
    }

    /// Decides whether the proc `proc`, which died, is replaced (PM-2,
    /// PM-3); a decision to replace counts against the rank's storm limit.
    pub(crate) fn should_replace(&self, proc: &ProcId, reason: &str, now: Instant) -> Replace {
        let mut state = self.lock();
        let Some(rank) = state.procs.iter().position(|(p, _)| p == proc) else {
            return Replace::NotOurs;
        };
        let rank = rank as u32;
        let history = state.replacements.entry(rank).or_default();
        while history
            .recent
            .front()
            .is_some_and(|at| now.duration_since(*at) > STORM_WINDOW)
        {
            history.recent.pop_front();
        }
        if history.recent.len() >= STORM_LIMIT {
            history.given_up = Some(format!(
                "died {} times within {} s (last: {reason}); left dead",
                STORM_LIMIT + 1,
                STORM_WINDOW.as_secs()
            ));
            return Replace::StormLimit(rank);
        }
        history.recent.push_back(now);
        Replace::Rank(rank)
    }

    /// Puts `new` (OS process `pid`) at `rank` in place of `old`, which
    /// died of `reason`; false when `old` is no longer there.
    pub(crate) fn replace(
        &self,
        rank: u32,
        old: &ProcId,
        new: ProcId,
        pid: Option<u32>,
        reason: &str,
    ) -> bool {
        let mut state = self.lock();
        let at = rank as usize;
        if state.procs.get(at).map(|(p, _)| p) != Some(old) {
            return false;
        }
        state.procs[at] = (new, None);
        if state.pids.len() <= at {
            state.pids.resize(at + 1, None);
        }
        state.pids[at] = pid;
        let history = state.replacements.entry(rank).or_default();
        history.count += 1;
        history.last = Some((reason.to_string(), super::db::now_ms()));
        true
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
        let replacement = |rank: u32| state.replacements.get(&rank);
        let last_replacement = state
            .replacements
            .iter()
            .filter_map(|(rank, r)| r.last.as_ref().map(|(reason, at)| (*rank, reason, *at)))
            .max_by_key(|(rank, _, at)| (*at, *rank))
            .map(|(rank, reason, at_ms)| Replacement {
                rank,
                reason: reason.clone(),
                at_ms,
            });
        MeshInfo {
            name: self.name.clone(),
            persistent,
            job: self.job,
            replaced: state
                .replacements
                .values()
                .map(|r| u64::from(r.count))
                .sum(),
            last_replacement,
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
                    reason: match (
                        ended,
                        replacement(rank as u32).and_then(|r| r.given_up.as_ref()),
                    ) {
                        (Some(ended), Some(given_up)) => Some(format!("{ended}; {given_up}")),
                        (ended, _) => ended.clone(),
                    },
                    pid: state.pids.get(rank).copied().flatten(),
                    replaced: replacement(rank as u32).map_or(0, |r| r.count),
                    last_replacement: replacement(rank as u32).and_then(|r| {
                        r.last.as_ref().map(|(reason, at_ms)| Replacement {
                            rank: rank as u32,
                            reason: reason.clone(),
                            at_ms: *at_ms,
                        })
                    }),
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
        access: ActorMeshAccess,
        trace: Option<std::path::PathBuf>,
    ) -> Arc<dyn MeshObserver> {
        Arc::new(JobObserver {
            view: self.clone(),
            job,
            persistent,
            access,
            trace,
        })
    }

    /// Forgets the actor meshes of `job` (it ended), keeping them in the
    /// archive.
    pub(crate) fn forget_job(&self, job: u64) {
        let mut gone = Vec::new();
        self.lock().actors.retain(|a| match a.job == job {
            true => {
                gone.push(a.snapshot(Some("the job ended")));
                false
            }
            false => true,
        });
        if let Some(archive) = self.archive.get() {
            archive.add(job, gone);
        }
    }
}

/// Which persistent actor meshes a job may look up or respawn: those its
/// principal may see over HTTP (HA-1).
pub(crate) type ActorMeshAccess = Arc<dyn Fn(&PersistentActorMesh) -> bool + Send + Sync>;

struct JobObserver {
    view: Arc<MeshView>,
    job: u64,
    persistent: Arc<PersistentActorMeshes>,
    access: ActorMeshAccess,
    /// The job's trace file (`serve --trace`).
    trace: Option<std::path::PathBuf>,
}

impl MeshObserver for JobObserver {
    fn trace_sink(&self) -> Option<hyperactor_mesh::cast::TraceSink> {
        self.trace.clone().map(crate::traces::append_sink)
    }

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
        let mut gone = Vec::new();
        self.view.lock().actors.retain(|a| match a.name == name {
            true => {
                gone.push(a.snapshot(Some("stopped by its controller or with its job")));
                false
            }
            false => true,
        });
        if let Some(archive) = self.view.archive.get() {
            archive.add(self.job, gone);
        }
    }

    fn job(&self) -> Option<u64> {
        Some(self.job)
    }

    fn mesh_event(&self, event: &MeshEvent) {
        self.view.take_event(event);
    }

    fn persistent_actors(&self) -> Option<Arc<PersistentActorMeshes>> {
        Some(self.persistent.clone())
    }

    fn may_use_actor_mesh(&self, mesh: &PersistentActorMesh) -> bool {
        (self.access)(mesh)
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

/// A persistent actor mesh that a restart lost, as the API shows it.
pub(crate) fn lost_actor_mesh_info(mesh: super::db::ActorMeshRecord) -> ActorMeshInfo {
    ActorMeshInfo {
        reason: Some(format!(
            "lost with the server's restart: its state was in the memory of the procs of `{}`, which were started anew; spawn it again, or DELETE /v1/meshes/{} to forget it",
            mesh.mesh, mesh.name
        )),
        name: mesh.name,
        class: mesh.class,
        mesh: mesh.mesh,
        spawned_by: mesh.spawned_by,
        extent: mesh.extent,
        state: "lost".into(),
        ranks: Vec::new(),
    }
}

/// A mesh whose procs outlive jobs.
pub(crate) struct PersistentMesh {
    pub(crate) client: Arc<MeshClient>,
    pub(crate) view: Arc<MeshView>,
    /// The principal that created it (`POST /v1/meshes`); None for the
    /// server's own (`serve --mesh`), which every principal may use.
    pub(crate) owner: Option<String>,
    /// How many procs it was started with, for its owner's quota.
    pub(crate) procs: u32,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn procs(n: usize) -> Vec<ProcId> {
        (0..n)
            .map(|i| format!("unix:/tmp/pm-test.sock,proc{i}").parse().unwrap())
            .collect()
    }

    #[test]
    fn pm_2_a_dead_proc_is_replaced_at_its_rank_and_counted() {
        let all = procs(3);
        let view = MeshView::new("workers".into(), None, all[..2].to_vec());
        view.set_pids(vec![Some(10), Some(11)]);
        let now = Instant::now();
        assert_eq!(
            view.should_replace(&all[2], "killed", now),
            Replace::NotOurs
        );
        assert_eq!(
            view.should_replace(&all[1], "killed", now),
            Replace::Rank(1)
        );
        assert!(view.replace(1, &all[1], all[2].clone(), Some(12), "killed by signal 9"));
        // The old proc is no longer at the rank: a second replace is refused.
        assert!(!view.replace(1, &all[1], all[0].clone(), None, "again"));
        let info = view.info(true);
        assert_eq!(info.replaced, 1);
        let last = info.last_replacement.unwrap();
        assert_eq!((last.rank, last.reason.as_str()), (1, "killed by signal 9"));
        assert_eq!(info.procs[1].id, all[2].to_string());
        assert_eq!(info.procs[1].pid, Some(12));
        assert_eq!(info.procs[1].state, "running");
        assert_eq!(info.procs[1].replaced, 1);
        assert_eq!(info.procs[0].replaced, 0);
        assert_eq!(view.procs(), vec![all[0].clone(), all[2].clone()]);
    }

    #[test]
    fn a_jobs_failed_rank_is_kept_after_its_actor_mesh_stops() {
        let all = procs(2);
        let view = MeshView::new("workers".into(), None, all.clone());
        let archive = Arc::new(ActorArchive::default());
        view.set_archive(archive.clone());
        let observer = view.observer(7, Arc::default(), Arc::new(|_| true), None);
        assert_eq!(observer.job(), Some(7));
        observer.actors_spawned("j7.echoers", "Echoer", &all, 1);
        let live = view.job_actors(7);
        assert_eq!(
            (live[0].mesh.as_str(), live[0].class.as_str()),
            ("echoers", "Echoer")
        );
        assert!(live[0].ranks.iter().all(|r| r.state == "running"));
        assert_eq!(live[0].ranks[1].proc, all[1].to_string());
        view.take_event(&MeshEvent::ActorFailed {
            actor: all[1].actor_id("j7.echoers", 1).unwrap(),
            reason: "trap: unreachable".into(),
        });
        observer.actors_stopped("j7.echoers");
        assert!(view.job_actors(7).is_empty());
        let kept = archive.get(7);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].ranks[0].state, "stopped");
        assert_eq!(kept[0].ranks[1].state, "failed");
        assert_eq!(
            kept[0].ranks[1].reason.as_deref(),
            Some("trap: unreachable")
        );
        // Another job's are its own; the archive keeps the newest jobs only.
        assert!(archive.get(8).is_empty());
        for job in 100..100 + ARCHIVED_JOBS as u64 {
            archive.add(job, kept.clone());
        }
        assert!(archive.get(7).is_empty());
        assert_eq!(archive.get(100).len(), 1);
    }

    #[test]
    fn pm_3_a_rank_that_dies_too_often_is_left_dead() {
        let all = procs(1);
        let view = MeshView::new("workers".into(), None, all.clone());
        let start = Instant::now();
        for n in 0..STORM_LIMIT {
            let at = start + Duration::from_secs(n as u64);
            assert_eq!(view.should_replace(&all[0], "crash", at), Replace::Rank(0));
        }
        let at = start + Duration::from_secs(STORM_LIMIT as u64);
        assert_eq!(
            view.should_replace(&all[0], "crash", at),
            Replace::StormLimit(0)
        );
        view.take_event(&MeshEvent::ProcStopped {
            proc: all[0].clone(),
            reason: "crash".into(),
        });
        let info = view.info(true);
        assert_eq!(info.procs[0].state, "stopped");
        let reason = info.procs[0].reason.clone().unwrap();
        assert!(reason.contains("left dead"), "{reason}");
        // Past the window, the rank is replaced again.
        let later = start + STORM_WINDOW + Duration::from_secs(STORM_LIMIT as u64 + 1);
        assert_eq!(
            view.should_replace(&all[0], "crash", later),
            Replace::Rank(0)
        );
    }
}

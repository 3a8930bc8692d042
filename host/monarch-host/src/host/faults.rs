//! The WIT `faults` import: faults a program makes on purpose, so that its
//! tests can check that it survives them. Each is the real fault, or the
//! mechanism the real one would trip, so the program sees what it would
//! see then:
//!
//! - `kill`: `crash` is SIGKILL, `exit` asks the proc's agent to exit its
//!   process with status 0, `host-lost` kills every proc of the host and
//!   reports each "lost with its host" (`MeshClient::lose_host`).
//! - `delay`, `drop-messages`, `partition`, `heal`: impairments of the
//!   procs' outgoing messages (hyperactor's `impair.rs`, IM-1..5), in both
//!   procs of each pair; a partition also cuts the ranks off from the
//!   caller's own proc (the controller, or the actor that spawned them).
//!
//! - FI-1: only procs the caller started may be faulted; a rank outside
//!   the mesh, a persistent mesh's procs, or a proc that has ended are
//!   refused with an error that names them, and nothing is faulted.
//! - FI-2: when a call returns Ok, the fault is in place in every proc it
//!   involves.

use std::sync::Arc;
use std::time::Duration;

use hyperactor::ProcId;
use hyperactor_mesh::agent::NetFault;
use hyperactor_mesh::client::MeshClient;
use wasmtime::component::Resource;

use super::HostState;
use crate::bindings::monarch::host::faults::{self, KillMode};
use crate::mesh::ProcMeshHandle;

/// The longest fault one call may make: a day.
const MAX_DURATION_MS: u64 = 86_400_000;

impl HostState {
    /// The procs of `this` at `ranks`, if the caller may fault them (FI-1).
    fn faultable(
        &self,
        this: &Resource<ProcMeshHandle>,
        ranks: &[u32],
    ) -> wasmtime::Result<Result<Vec<ProcId>, String>> {
        let mesh = self.table.get(this)?;
        if !mesh.owned {
            return Ok(Err(
                "these procs belong to a persistent mesh, not to this program; only procs the program started may be faulted".into(),
            ));
        }
        let client = match self.cluster.client() {
            Ok(client) => client,
            Err(e) => return Ok(Err(e)),
        };
        let mut procs = Vec::with_capacity(ranks.len());
        for &rank in ranks {
            let Some(proc) = mesh.procs.get(rank as usize) else {
                return Ok(Err(format!(
                    "rank {rank} is outside this proc mesh of {} procs",
                    mesh.procs.len()
                )));
            };
            if client.proc_info(proc).is_none() {
                return Ok(Err(format!("proc {proc} was not started by this program")));
            }
            if let Some(why) = client.dead(proc) {
                return Ok(Err(format!("rank {rank} (proc {proc}) has ended: {why}")));
            }
            procs.push(proc.clone());
        }
        Ok(Ok(procs))
    }

    /// The proc pairs to fault: those of each pair of ranks of `this`, and
    /// each rank in `to_caller` with the caller's own proc; with the
    /// client that faults them and how long it waits for the procs.
    fn impair_plan(
        &self,
        this: &Resource<ProcMeshHandle>,
        pairs: &[(u32, u32)],
        to_caller: &[u32],
    ) -> wasmtime::Result<Result<Plan, String>> {
        let ranks: Vec<u32> = pairs
            .iter()
            .flat_map(|&(a, b)| [a, b])
            .chain(to_caller.iter().copied())
            .collect();
        let procs = match self.faultable(this, &ranks)? {
            Ok(procs) => procs,
            Err(e) => return Ok(Err(e)),
        };
        let client = match self.cluster.client() {
            Ok(client) => client.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let mut proc_pairs: Vec<(ProcId, ProcId)> = procs[..pairs.len() * 2]
            .chunks(2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect();
        let own = client.proc().id().clone();
        proc_pairs.extend(
            procs[pairs.len() * 2..]
                .iter()
                .map(|p| (p.clone(), own.clone())),
        );
        Ok(Ok(Plan {
            client,
            pairs: proc_pairs,
            timeout: self.call_timeout,
        }))
    }
}

/// What [`HostState::impair_plan`] found to fault.
struct Plan {
    client: Arc<MeshClient>,
    pairs: Vec<(ProcId, ProcId)>,
    timeout: Duration,
}

/// Makes `fault` as `plan` says (FI-2).
async fn impair(
    plan: Result<Plan, String>,
    fault: NetFault,
) -> wasmtime::Result<Result<(), String>> {
    Ok(match plan {
        Ok(plan) => plan.client.impair(&plan.pairs, fault, plan.timeout).await,
        Err(e) => Err(e),
    })
}

fn duration(ms: u64, what: &str) -> Result<u64, String> {
    if ms > MAX_DURATION_MS {
        return Err(format!(
            "{what} of {ms} ms is longer than a day ({MAX_DURATION_MS} ms)"
        ));
    }
    Ok(ms)
}

impl faults::Host for HostState {
    async fn kill(
        &mut self,
        procs: Resource<ProcMeshHandle>,
        rank: u32,
        mode: KillMode,
    ) -> wasmtime::Result<Result<(), String>> {
        let proc = match self.faultable(&procs, &[rank])? {
            Ok(mut procs) => procs.remove(0),
            Err(e) => return Ok(Err(e)),
        };
        let client = match self.cluster.client() {
            Ok(client) => client.clone(),
            Err(e) => return Ok(Err(e)),
        };
        Ok(match mode {
            KillMode::Crash => client.kill(&proc, libc::SIGKILL).map_err(|e| e.to_string()),
            KillMode::Exit => client.exit_proc(&proc, self.call_timeout).await,
            KillMode::HostLost => client
                .lose_host(&proc)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        })
    }

    async fn delay(
        &mut self,
        procs: Resource<ProcMeshHandle>,
        a: u32,
        b: u32,
        delay_ms: u64,
        duration_ms: u64,
    ) -> wasmtime::Result<Result<(), String>> {
        let fault = match duration(delay_ms, "a delay").and(duration(duration_ms, "a duration")) {
            Ok(_) => NetFault::Delay {
                delay_ms,
                duration_ms,
            },
            Err(e) => return Ok(Err(e)),
        };
        impair(self.impair_plan(&procs, &[(a, b)], &[])?, fault).await
    }

    async fn drop_messages(
        &mut self,
        procs: Resource<ProcMeshHandle>,
        a: u32,
        b: u32,
        duration_ms: u64,
    ) -> wasmtime::Result<Result<(), String>> {
        let fault = match duration(duration_ms, "a duration") {
            Ok(duration_ms) => NetFault::Cut { duration_ms },
            Err(e) => return Ok(Err(e)),
        };
        impair(self.impair_plan(&procs, &[(a, b)], &[])?, fault).await
    }

    async fn partition(
        &mut self,
        procs: Resource<ProcMeshHandle>,
        ranks: Vec<u32>,
        duration_ms: u64,
    ) -> wasmtime::Result<Result<(), String>> {
        let fault = match duration(duration_ms, "a duration") {
            Ok(duration_ms) => NetFault::Cut { duration_ms },
            Err(e) => return Ok(Err(e)),
        };
        let size = self.table.get(&procs)?.procs.len() as u32;
        if let Some(rank) = ranks.iter().find(|&&r| r >= size) {
            return Ok(Err(format!(
                "rank {rank} is outside this proc mesh of {size} procs"
            )));
        }
        let others: Vec<u32> = (0..size).filter(|r| !ranks.contains(r)).collect();
        let pairs: Vec<(u32, u32)> = ranks
            .iter()
            .flat_map(|&a| others.iter().map(move |&b| (a, b)))
            .collect();
        impair(self.impair_plan(&procs, &pairs, &ranks)?, fault).await
    }

    async fn heal(
        &mut self,
        procs: Resource<ProcMeshHandle>,
    ) -> wasmtime::Result<Result<(), String>> {
        let (size, live) = {
            let mesh = self.table.get(&procs)?;
            let client = self.cluster.client().ok();
            let live: Vec<u32> = (0..mesh.procs.len() as u32)
                .filter(|&r| client.is_none_or(|c| c.dead(&mesh.procs[r as usize]).is_none()))
                .collect();
            (mesh.procs.len(), live)
        };
        if size == 0 || live.is_empty() {
            return Ok(Ok(()));
        }
        let pairs: Vec<(u32, u32)> = live
            .iter()
            .flat_map(|&a| live.iter().filter(move |&&b| b > a).map(move |&b| (a, b)))
            .collect();
        impair(self.impair_plan(&procs, &pairs, &live)?, NetFault::Heal).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_longer_than_a_day_is_refused_with_its_length() {
        assert_eq!(duration(5, "a delay"), Ok(5));
        let refused = duration(MAX_DURATION_MS + 1, "a duration").unwrap_err();
        assert!(refused.contains("86400001 ms"), "{refused}");
    }
}

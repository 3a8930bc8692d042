//! What the mesh tests share: waiting for a cast's outcome while feeding
//! proc deaths to the caster, and telling whether a process still runs.

#![allow(dead_code)]

use std::time::Duration;

use hyperactor_mesh::agent::MeshEvent;
use hyperactor_mesh::{Caster, Outcome};
use tokio::sync::mpsc;

/// The caster's next outcome, within `timeout`, telling it of every proc
/// that ends meanwhile (as the host does).
pub async fn next_outcome(
    events: &mut mpsc::UnboundedReceiver<MeshEvent>,
    caster: &mut Caster,
    timeout: Duration,
) -> Outcome {
    let wait = async {
        loop {
            tokio::select! {
                outcome = caster.next() => return outcome.expect("nothing in flight"),
                Some(event) = events.recv() => {
                    if let MeshEvent::ProcStopped { proc, reason } = event {
                        caster.proc_died(&proc, &reason);
                    }
                }
            }
        }
    };
    tokio::time::timeout(timeout, wait)
        .await
        .expect("an outcome within the test timeout")
}

/// Whether process `pid` runs (a zombie waiting to be reaped does not).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

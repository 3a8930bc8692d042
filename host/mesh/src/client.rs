//! The controller's side of its meshes: the procs it allocated, the
//! actors it spawned on them, and what happened to them.
//!
//! A [`MeshClient`] owns a proc of its own (the controller proc, reachable
//! by every proc it starts), an allocator, and an events port on which
//! procs report failed actors and log lines. Procs that end are reported
//! by the allocator. Every event goes to each subscriber.
//!
//! - SV-1: a proc that ends is marked dead once; every live comm actor is
//!   told, so that casts waiting on it fail its ranks and reach the rest
//!   (CA-3); subscribers get one [`MeshEvent::ProcStopped`].
//! - SV-2: spawning actors on a dead proc fails at once, naming the proc.
//! - SV-3: spawning a mesh is all or nothing.
//! - SV-4: a probe of the procs ([`MeshClient::probe_procs`]) ends within
//!   its timeout whatever the procs do, with one answer per live proc.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use hyperactor::{ChannelAddr, Mailbox, PortRef, Proc, ProcConfig, ProcId};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::agent::{
    ExitProc, Impair, MeshEvent, NetFault, ProbeActors, SpawnActors, StopActors, agent_port,
};
use crate::alloc::{AllocError, Allocated, Allocator};
use crate::comm::{ProcDied, comm_port};

/// Where log lines of actors go.
pub type LogSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How long a dropped client's event task waits for more events before it
/// ends.
const LINGER: Duration = Duration::from_millis(200);

#[derive(Default)]
struct ClientState {
    /// Every proc started, in order, with its host.
    procs: Vec<Allocated>,
    /// Procs that ended, with why.
    dead: HashMap<ProcId, String>,
    subscribers: Vec<mpsc::UnboundedSender<MeshEvent>>,
    /// Procs their owner stopped: their ends are not failures.
    stopping: HashSet<ProcId>,
    /// Procs ended with their host on purpose ([`MeshClient::lose_host`]):
    /// their end is reported with this reason.
    lost: HashMap<ProcId, String>,
    blobs: HashSet<String>,
    next_proc: usize,
}

/// An actor mesh to spawn.
#[derive(Debug, Clone)]
pub struct ActorSpec {
    /// The actor factory's kind.
    pub kind: String,
    /// The mesh's name; its actors are `name[rank]`.
    pub name: String,
    /// The mesh's extent.
    pub extent: Vec<(String, u32)>,
    /// The factory's parameters.
    pub params: Vec<u8>,
    /// Actors on each proc.
    pub per_proc: u32,
}

/// What the client knows of one proc it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    /// The host it runs on: an agent's address, or `local`.
    pub host: String,
    /// Its OS process, when it has one of its own.
    pub pid: Option<u32>,
    /// None while it runs; why it ended otherwise.
    pub ended: Option<String>,
    /// Whether its owner stopped it (an end that is not a failure).
    pub stopped: bool,
}

/// One proc's answer to a probe ([`MeshClient::probe_procs`]).
#[derive(Debug, Clone)]
pub struct ProbeAnswer {
    /// The proc.
    pub proc: ProcId,
    /// Its place among the procs the client started, from 0.
    pub index: usize,
    /// The host it runs on: an agent's address, or `local`.
    pub host: String,
    /// Its OS process, when it has one of its own.
    pub pid: Option<u32>,
    /// What its embedding answered; why there is no answer otherwise (no
    /// hook, no answer in time).
    pub answer: Result<Vec<u8>, String>,
}

/// The controller's view of its procs; see the module docs.
pub struct MeshClient {
    proc: Proc,
    mailbox: Mailbox,
    events: PortRef<MeshEvent>,
    stopped: mpsc::UnboundedSender<MeshEvent>,
    allocator: Arc<dyn Allocator>,
    state: Arc<Mutex<ClientState>>,
    /// Dropped with the client: ends its event task, which holds the
    /// client's proc (an actor's client comes and goes with the actor).
    _events_task: tokio::sync::oneshot::Sender<()>,
}

impl MeshClient {
    /// A client whose own proc serves on `addr` (reachable by the procs the
    /// allocator starts) and whose actors' log lines go to `log`.
    pub async fn new(
        addr: ChannelAddr,
        allocator: Arc<dyn Allocator>,
        log: LogSink,
    ) -> Result<Arc<MeshClient>, AllocError> {
        Self::with_config(addr, ProcConfig::default(), allocator, log).await
    }

    /// [`MeshClient::new`] with the settings of the client's proc, such as
    /// the cluster token of remote hosts.
    pub async fn with_config(
        addr: ChannelAddr,
        config: ProcConfig,
        allocator: Arc<dyn Allocator>,
        log: LogSink,
    ) -> Result<Arc<MeshClient>, AllocError> {
        let proc = Proc::serve_with_config("controller", addr, config)
            .await
            .map_err(|e| AllocError(format!("cannot start the controller proc: {e}")))?;
        let (mailbox, _undeliverable) =
            proc.attach("mesh").map_err(|e| AllocError(e.to_string()))?;
        let mut events_port = mailbox.open_port::<MeshEvent>();
        let events = events_port.bind();
        let (stopped, mut stopped_rx) = mpsc::unbounded_channel();
        let (events_task, mut dropped) = tokio::sync::oneshot::channel::<()>();
        let state: Arc<Mutex<ClientState>> = Arc::default();
        let client = Arc::new(MeshClient {
            proc,
            mailbox: mailbox.clone(),
            events,
            stopped,
            allocator,
            state: state.clone(),
            _events_task: events_task,
        });
        tokio::spawn(async move {
            // Once the client is dropped, what is still in flight (the last
            // log lines of its actors) is taken until the ports are quiet.
            let mut closing = false;
            loop {
                let event = tokio::select! {
                    Some(event) = events_port.recv() => event,
                    Some(event) = stopped_rx.recv() => event,
                    _ = &mut dropped, if !closing => {
                        closing = true;
                        continue;
                    }
                    _ = tokio::time::sleep(LINGER), if closing => break,
                    else => break,
                };
                handle_event(&mailbox, &state, &log, event);
            }
        });
        Ok(client)
    }

    /// The mailbox the controller sends from.
    pub fn mailbox(&self) -> &Mailbox {
        &self.mailbox
    }

    /// The controller's proc.
    pub fn proc(&self) -> &Proc {
        &self.proc
    }

    /// Events from now on: failed actors and ended procs.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<MeshEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut state = self.state.lock();
        state.subscribers.retain(|s| !s.is_closed());
        state.subscribers.push(tx);
        rx
    }

    /// Starts `count` procs, in parallel.
    pub async fn spawn_procs(&self, count: usize) -> Result<Vec<Allocated>, AllocError> {
        let names: Vec<String> = {
            let mut state = self.state.lock();
            let first = state.next_proc;
            state.next_proc += count;
            (first..first + count).map(|i| format!("proc{i}")).collect()
        };
        let allocated = self
            .allocator
            .allocate(names, self.events.clone(), self.stopped.clone())
            .await?;
        self.state.lock().procs.extend(allocated.iter().cloned());
        Ok(allocated)
    }

    /// How many procs started by this client still run.
    pub fn live_procs(&self) -> usize {
        let state = self.state.lock();
        state
            .procs
            .iter()
            .filter(|p| !state.dead.contains_key(&p.proc) && !state.stopping.contains(&p.proc))
            .count()
    }

    /// Where `proc` runs and whether it still does; None for a proc this
    /// client did not start.
    pub fn proc_info(&self, proc: &ProcId) -> Option<ProcInfo> {
        let state = self.state.lock();
        let allocated = state.procs.iter().find(|a| &a.proc == proc)?;
        let ended = state.dead.get(proc).cloned();
        Some(ProcInfo {
            host: self.allocator.host_name(allocated.host),
            pid: allocated.pid,
            stopped: ended.as_deref() == Some(crate::comm::STOPPED_BY_OWNER)
                || state.stopping.contains(proc),
            ended,
        })
    }

    /// Why `proc` ended, if it has.
    pub fn dead(&self, proc: &ProcId) -> Option<String> {
        self.state.lock().dead.get(proc).cloned()
    }

    /// The procs that ended so far, with why.
    pub fn dead_procs(&self) -> HashMap<ProcId, String> {
        self.state.lock().dead.clone()
    }

    /// Stores a blob on every host, once per client.
    pub async fn put_blob(&self, sha256: &str, bytes: Arc<Vec<u8>>) -> Result<(), AllocError> {
        if self.state.lock().blobs.contains(sha256) {
            return Ok(());
        }
        self.allocator.put_blob(sha256.to_string(), bytes).await?;
        self.state.lock().blobs.insert(sha256.to_string());
        Ok(())
    }

    /// Spawns the actors of `spec` on `procs`, `spec.per_proc` on each
    /// (ranks `i * per_proc ..` on the i-th proc), and waits until every
    /// one has started (SV-3).
    pub async fn spawn_actors(
        &self,
        procs: &[ProcId],
        spec: &ActorSpec,
        timeout: Duration,
    ) -> Result<(), String> {
        let ActorSpec {
            kind,
            name,
            extent,
            params,
            per_proc,
        } = spec;
        let (kind, name, per_proc) = (kind.as_str(), name.as_str(), *per_proc);
        for proc in procs {
            if let Some(reason) = self.dead(proc) {
                return Err(format!("proc {proc} has ended: {reason}")); // SV-2
            }
        }
        let calls = procs.iter().enumerate().map(|(i, proc)| {
            let ranks: Vec<u32> = (i as u32 * per_proc..(i as u32 + 1) * per_proc).collect();
            let port = agent_port::<SpawnActors>(proc);
            let (kind, name, extent, params) = (
                kind.to_string(),
                name.to_string(),
                extent.clone(),
                params.clone(),
            );
            let reply = port.map(|port| {
                self.mailbox.start_call(port.id(), |reply| SpawnActors {
                    kind,
                    name,
                    ranks,
                    extent,
                    params,
                    reply,
                })
            });
            async move {
                match reply {
                    None => Err(format!("proc {proc} has no valid agent name")),
                    Some(reply) => match reply.recv_timeout(timeout).await {
                        Ok(result) => result,
                        Err(e) => Err(format!("spawning on proc {proc}: {e}")),
                    },
                }
            }
        });
        let results = futures::future::join_all(calls).await;
        if let Some(error) = results.iter().find_map(|r| r.as_ref().err()) {
            let error = error.clone();
            self.stop_actors(procs, name, timeout).await;
            return Err(error);
        }
        Ok(())
    }

    /// Stops the actors `name[..]` on `procs` and waits until they end (or
    /// `timeout` passes).
    pub async fn stop_actors(&self, procs: &[ProcId], name: &str, timeout: Duration) {
        let dead = self.dead_procs();
        let calls = procs
            .iter()
            .filter(|p| !dead.contains_key(*p))
            .filter_map(agent_port::<StopActors>)
            .map(|port| {
                let name = name.to_string();
                self.mailbox
                    .start_call(port.id(), |reply| StopActors { name, reply })
                    .recv_timeout(timeout)
            });
        futures::future::join_all(calls).await;
    }

    /// Asks every live proc `query` through its agent, all at once (PA-4),
    /// and gives each one's answer, in the order the procs were started.
    /// A proc that does not answer within `timeout` is reported as such
    /// (SV-4).
    pub async fn probe_procs(&self, query: &str, timeout: Duration) -> Vec<ProbeAnswer> {
        let live: Vec<(usize, Allocated)> = {
            let state = self.state.lock();
            state
                .procs
                .iter()
                .enumerate()
                .filter(|(_, p)| {
                    !state.dead.contains_key(&p.proc) && !state.stopping.contains(&p.proc)
                })
                .map(|(index, p)| (index, p.clone()))
                .collect()
        };
        let calls = live.into_iter().map(|(index, allocated)| {
            let reply = agent_port::<ProbeActors>(&allocated.proc).map(|port| {
                let query = query.to_string();
                self.mailbox
                    .start_call(port.id(), |reply| ProbeActors { query, reply })
            });
            let host = self.allocator.host_name(allocated.host);
            async move {
                let answer = match reply {
                    None => Err("the proc has no valid agent name".to_string()),
                    Some(reply) => match reply.recv_timeout(timeout).await {
                        Ok(answer) => answer,
                        Err(hyperactor::CallError::Timeout(_)) => {
                            Err(format!("did not answer within {} ms", timeout.as_millis()))
                        }
                        Err(e) => Err(format!("did not answer: {e}")),
                    },
                };
                ProbeAnswer {
                    proc: allocated.proc,
                    index,
                    host,
                    pid: allocated.pid,
                    answer,
                }
            }
        });
        futures::future::join_all(calls).await
    }

    /// Sends `signal` to `proc`'s process (for tests and chaos drills).
    pub fn kill(&self, proc: &ProcId, signal: i32) -> Result<(), AllocError> {
        self.allocator.kill(proc, signal)
    }

    /// Makes `fault` between the procs of each pair, both ways (either may
    /// be this client's own proc): each proc holds or delays what it sends
    /// to the other (hyperactor's `Proc::cut_to`). A fault is in place in
    /// both procs when this returns; an error names a proc that did not
    /// answer within `timeout` or has ended.
    pub async fn impair(
        &self,
        pairs: &[(ProcId, ProcId)],
        fault: NetFault,
        timeout: Duration,
    ) -> Result<(), String> {
        let mut peers: HashMap<ProcId, Vec<ChannelAddr>> = HashMap::new();
        for (a, b) in pairs {
            if a == b {
                continue;
            }
            peers.entry(a.clone()).or_default().push(b.addr().clone());
            peers.entry(b.clone()).or_default().push(a.addr().clone());
        }
        let own = self.proc.id().clone();
        let mine = peers.remove(&own);
        let dead = self.dead_procs();
        if let Some(proc) = peers.keys().find(|p| dead.contains_key(*p)) {
            return Err(format!("proc {proc} has ended ({})", dead[proc]));
        }
        // A heal starts here, so that the requests to heal are not held by
        // this proc's own cuts; a cut or delay ends here, so that they are
        // not held either (the procs answer outside their faults, PA-5).
        let heal = fault == NetFault::Heal;
        if heal && let Some(mine) = &mine {
            crate::agent::impair(&self.proc, mine, &fault);
        }
        // In a fixed order, so that a simulation's trace does not depend
        // on the map's.
        let mut peers: Vec<(ProcId, Vec<ChannelAddr>)> = peers.into_iter().collect();
        peers.sort_by_key(|(proc, _)| proc.to_string());
        let calls = peers.into_iter().map(|(proc, addrs)| {
            let port = agent_port::<Impair>(&proc);
            let fault = fault.clone();
            let peers = addrs.iter().map(|a| a.to_string()).collect();
            let reply = port.map(|port| {
                self.mailbox
                    .start_call(port.id(), |reply| Impair {
                        peers,
                        fault,
                        reply,
                    })
                    .recv_timeout(timeout)
            });
            async move {
                match reply {
                    None => Err(format!("proc {proc} has no valid agent name")),
                    Some(reply) => match reply.await {
                        Ok(answer) => answer.map_err(|e| format!("proc {proc}: {e}")),
                        Err(e) => Err(format!("proc {proc} did not answer: {e}")),
                    },
                }
            }
        });
        let answers = futures::future::join_all(calls).await;
        if !heal && let Some(mine) = &mine {
            crate::agent::impair(&self.proc, mine, &fault);
        }
        answers.into_iter().collect::<Result<Vec<()>, String>>()?;
        Ok(())
    }

    /// Makes `proc` exit by itself with status 0, as if its main returned:
    /// its end is reported as a failure, as any end its owner did not ask
    /// for. A proc inside this process crashes and is reported so
    /// (`Allocator::exit`).
    pub async fn exit_proc(&self, proc: &ProcId, timeout: Duration) -> Result<(), String> {
        if let Some(done) = self.allocator.exit(proc) {
            return done.map_err(|e| e.to_string());
        }
        let port = agent_port::<ExitProc>(proc)
            .ok_or_else(|| format!("proc {proc} has no valid agent name"))?;
        match self
            .mailbox
            .start_call(port.id(), |reply| ExitProc { code: 0, reply })
            .recv_timeout(timeout)
            .await
        {
            Ok(answer) => answer.map_err(|e| format!("proc {proc}: {e}")),
            Err(e) => Err(format!("proc {proc} did not answer: {e}")),
        }
    }

    /// Loses the host of `proc`, on purpose: every live proc this client
    /// started on that host is killed at once, and reported "lost with
    /// its host" as when a host's agent stops answering. The procs lost.
    pub fn lose_host(&self, proc: &ProcId) -> Result<Vec<ProcId>, AllocError> {
        let doomed: Vec<ProcId> = {
            let mut state = self.state.lock();
            let host = state
                .procs
                .iter()
                .find(|p| &p.proc == proc)
                .map(|p| p.host)
                .ok_or_else(|| AllocError(format!("proc {proc} was not started here")))?;
            let name = self.allocator.host_name(host);
            let doomed: Vec<ProcId> = state
                .procs
                .iter()
                .filter(|p| p.host == host && !state.dead.contains_key(&p.proc))
                .map(|p| p.proc.clone())
                .collect();
            for p in &doomed {
                state.lost.insert(
                    p.clone(),
                    format!("lost with its host {name} (a fault made on purpose)"),
                );
            }
            doomed
        };
        for p in &doomed {
            self.allocator.kill(p, libc::SIGKILL)?;
        }
        Ok(doomed)
    }

    /// Stops `procs` (their owner is done with them): they end without
    /// failure events, and refuse new actors.
    pub fn stop_procs(&self, procs: &[ProcId]) {
        self.state.lock().stopping.extend(procs.iter().cloned());
        self.allocator.stop(procs);
    }

    /// Stops every proc.
    pub fn stop_all(&self) {
        self.allocator.stop_all();
    }
}

impl Drop for MeshClient {
    fn drop(&mut self) {
        self.allocator.stop_all();
    }
}

fn handle_event(
    mailbox: &Mailbox,
    state: &Arc<Mutex<ClientState>>,
    log: &LogSink,
    mut event: MeshEvent,
) {
    let mut state = state.lock();
    let mut lost_reason = None;
    match &event {
        MeshEvent::Log { line } => {
            log(line);
            return;
        }
        MeshEvent::ProcStopped { proc, reason } => {
            if state.dead.contains_key(proc) {
                return;
            }
            let stopped = state.stopping.remove(proc);
            let reason = if stopped {
                crate::comm::STOPPED_BY_OWNER.to_string()
            } else if let Some(lost) = state.lost.remove(proc) {
                lost_reason = Some(lost.clone());
                lost
            } else {
                reason.clone()
            };
            state.dead.insert(proc.clone(), reason.clone());
            tracing::info!(%proc, %reason, "proc ended");
            // What the link to it still holds fails now, not after the
            // delivery timeout (LK-6).
            mailbox
                .proc()
                .peer_ended(proc.addr(), &format!("proc {proc} {reason}"));
            // SV-1: every live comm actor hears of it.
            let died = ProcDied {
                proc: proc.clone(),
                reason: reason.clone(),
            };
            // Procs that are being stopped need not hear it; a message to
            // one would wait on its link until the delivery timeout.
            for other in &state.procs {
                if !state.dead.contains_key(&other.proc)
                    && !state.stopping.contains(&other.proc)
                    && let Some(port) = comm_port::<ProcDied>(&other.proc)
                {
                    port.send(mailbox, died.clone());
                }
            }
            if stopped {
                return;
            }
        }
        MeshEvent::ActorFailed { .. } => {}
    }
    if let (Some(lost), MeshEvent::ProcStopped { reason, .. }) = (lost_reason, &mut event) {
        *reason = lost;
    }
    state
        .subscribers
        .retain(|subscriber| subscriber.send(event.clone()).is_ok());
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::agent::Registry;
    use crate::alloc::InProcessAllocator;

    /// A client of `procs` procs in this process, spawning from `registry`.
    async fn client(registry: Registry, procs: usize) -> (Arc<MeshClient>, Vec<ProcId>) {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let addr = format!(
            "local:probe-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        )
        .parse()
        .unwrap();
        let allocator = Arc::new(InProcessAllocator::new(Arc::new(registry)));
        let client = MeshClient::new(addr, allocator, Arc::new(|_: &str| {}))
            .await
            .unwrap();
        let procs = client.spawn_procs(procs).await.unwrap();
        (client, procs.into_iter().map(|a| a.proc).collect())
    }

    fn blobs() -> std::path::PathBuf {
        std::env::temp_dir().join("mesh-test-blobs")
    }

    /// SV-4 and PA-4: every live proc answers, in start order; one whose
    /// hook never answers is named after the timeout, and holds up neither
    /// the others nor its own agent's spawns; a stopped proc is not asked.
    #[tokio::test]
    async fn sv4_a_probe_answers_per_live_proc_and_a_silent_proc_is_named_in_time() {
        let mut registry = crate::testing::echo_registry(blobs());
        registry.on_probe(Arc::new(|proc: &ProcId, query: &str| {
            let silent = proc.name() == "proc1";
            let answer = format!("{query} from {}", proc.name()).into_bytes();
            Box::pin(async move {
                if silent {
                    std::future::pending::<()>().await;
                }
                answer
            })
        }));
        let (client, procs) = client(registry, 3).await;
        let started = Instant::now();
        let answers = client
            .probe_procs("stacks", Duration::from_millis(300))
            .await;
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the probe took {:?}",
            started.elapsed()
        );
        let indexes: Vec<usize> = answers.iter().map(|a| a.index).collect();
        assert_eq!(indexes, vec![0, 1, 2]);
        assert_eq!(answers[0].answer, Ok(b"stacks from proc0".to_vec()));
        assert_eq!(answers[2].answer, Ok(b"stacks from proc2".to_vec()));
        assert_eq!(answers[1].host, "local");
        let silent = answers[1].answer.as_ref().unwrap_err();
        assert!(silent.contains("did not answer within 300 ms"), "{silent}");
        // PA-4: proc1's agent still spawns while its probe hangs.
        let spec = ActorSpec {
            kind: "echo".into(),
            name: "e".into(),
            extent: vec![("procs".into(), 1)],
            params: vec![],
            per_proc: 1,
        };
        client
            .spawn_actors(&procs[1..2], &spec, Duration::from_secs(5))
            .await
            .unwrap();
        client.stop_procs(&procs[2..]);
        let answers = client
            .probe_procs("stacks", Duration::from_millis(300))
            .await;
        let asked: Vec<&ProcId> = answers.iter().map(|a| &a.proc).collect();
        assert_eq!(asked, vec![&procs[0], &procs[1]]);
    }

    /// PA-4: a proc whose process set no hook says so at once.
    #[tokio::test]
    async fn pa4_a_proc_without_a_probe_hook_says_so() {
        let (client, _procs) = client(crate::testing::echo_registry(blobs()), 1).await;
        let answers = client.probe_procs("stacks", Duration::from_secs(5)).await;
        assert_eq!(answers.len(), 1);
        let error = answers[0].answer.as_ref().unwrap_err();
        assert!(error.contains("answers no probes"), "{error}");
    }
}

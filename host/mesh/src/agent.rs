//! The proc agent: the actor in every proc of a mesh that spawns and stops
//! the mesh's actors, keeps content-addressed blobs, and reports failures
//! to the controller.
//!
//! What an actor *is* stays outside this crate: the binary registers actor
//! factories by kind in a [`Registry`] (monarch-host registers `wasm`), and
//! a spawn request names the kind and carries the factory's parameters as
//! bytes.
//!
//! - PA-1: a spawn request spawns every rank it names or none: if one fails
//!   to start, the others are stopped and the error names the rank.
//! - PA-2: a blob is stored under the sha256 of its bytes, and only if the
//!   bytes match the name they were sent under.
//! - PA-3: every root actor of the proc that fails is reported to the
//!   controller as [`MeshEvent::ActorFailed`].
//! - PA-4: a probe ([`ProbeActors`]: a debugger asking what the proc's
//!   actors are doing) is answered beside the agent's other work, so a
//!   slow answer holds up no spawn or stop; a proc whose embedding set no
//!   hook ([`Registry::on_probe`]) answers with an error.
//! - PA-5: faults made on purpose ([`Impair`], [`ExitProc`]) are answered
//!   before they act, and a heal after it acts, so no answer is held by
//!   the fault it is about;
//!   only a proc that owns its process ([`Registry::owns_process`]) exits.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use hyperactor::{
    Actor, ActorHandle, ActorId, ActorStatus, Context, Exports, Handler, OncePortRef, PortRef,
    Proc, ProcError, ProcId,
};
use sha2::{Digest, Sha256};

use crate::comm::{COMM_ACTOR, CommActor};

/// The name of the proc agent in every proc of a mesh.
pub const AGENT_ACTOR: &str = "monarch.agent";

/// Names of the host's own actors on a proc start with this; actor meshes
/// may not take such a name (a user's mesh called `supervisor` once
/// collided with the supervision client).
pub const RESERVED_PREFIX: &str = "monarch.";

/// What the controller hears from its procs.
#[derive(Debug, Clone, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum MeshEvent {
    /// An actor failed (PA-3).
    ActorFailed {
        /// The actor.
        actor: ActorId,
        /// Why.
        reason: String,
    },
    /// A proc ended: its exit status or signal, or it was lost.
    ProcStopped {
        /// The proc.
        proc: ProcId,
        /// Why.
        reason: String,
    },
    /// A log line of an actor.
    Log {
        /// The line, prefixed with the actor's mesh and rank.
        line: String,
    },
}

/// The parameters of one actor to spawn.
#[derive(Clone)]
pub struct SpawnArgs {
    /// The proc to spawn on.
    pub proc: Proc,
    /// The mesh's name; the actor is `name[rank]`.
    pub name: String,
    /// The actor's rank in the mesh.
    pub rank: u32,
    /// The mesh's extent: dimension names and sizes.
    pub extent: Vec<(String, u32)>,
    /// The factory's parameters.
    pub params: Arc<Vec<u8>>,
    /// Where this host keeps blobs.
    pub blob_dir: PathBuf,
    /// Where the controller hears of failures and logs.
    pub events: PortRef<MeshEvent>,
}

/// A spawned, started actor, as the agent keeps it.
pub struct SpawnedActor {
    id: ActorId,
    stop: Box<dyn Fn() + Send + Sync>,
    join: Box<dyn Fn() -> BoxFuture<ActorStatus> + Send + Sync>,
}

/// A boxed future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl SpawnedActor {
    /// Spawns `actor` as `args.name[args.rank]` and waits until its `init`
    /// has run; a failed `init` is the error.
    pub async fn start<A: Actor>(args: &SpawnArgs, actor: A) -> Result<SpawnedActor, String> {
        let handle: ActorHandle<A> = args
            .proc
            .spawn(&args.name, args.rank, actor)
            .map_err(|e: ProcError| e.to_string())?;
        match handle.started().await {
            ActorStatus::Failed(event) => Err(event.reason),
            ActorStatus::Stopped => Err("stopped before it started".into()),
            _ => {
                let (stopper, joiner) = (handle.clone(), handle.clone());
                Ok(SpawnedActor {
                    id: handle.actor_id().clone(),
                    stop: Box::new(move || stopper.stop()),
                    join: Box::new(move || {
                        let joiner = joiner.clone();
                        Box::pin(async move { joiner.join().await })
                    }),
                })
            }
        }
    }

    /// The actor's id.
    pub fn id(&self) -> &ActorId {
        &self.id
    }

    /// Also runs `interrupt` when the actor is stopped: for an actor whose
    /// handler may not return on its own (a guest that spins), so that
    /// stopping it, and the agent waiting for it, ends.
    pub fn on_stop(self, interrupt: impl Fn() + Send + Sync + 'static) -> SpawnedActor {
        let stop = self.stop;
        SpawnedActor {
            id: self.id,
            stop: Box::new(move || {
                interrupt();
                stop();
            }),
            join: self.join,
        }
    }
}

/// Makes actors of one kind.
pub type Factory = Arc<dyn Fn(SpawnArgs) -> BoxFuture<Result<SpawnedActor, String>> + Send + Sync>;

/// Runs when a blob arrives on a host, say to compile it once for every
/// proc of the host: gets the blob's path and its sha256 (checked when it
/// was stored).
pub type BlobHook = Arc<dyn Fn(&Path, &str) -> Result<(), String> + Send + Sync>;

/// Answers a probe of a proc's actors ([`ProbeActors`]): gets the proc
/// and the question, and gives the answer in the embedding's own encoding
/// (monarch-host: JSON of each Wasm actor's stack). The mesh layer only
/// carries the bytes.
pub type ProbeHook = Arc<dyn Fn(&ProcId, &str) -> BoxFuture<Vec<u8>> + Send + Sync>;

/// The actor kinds a process can spawn, and where its host keeps blobs.
#[derive(Clone)]
pub struct Registry {
    factories: HashMap<String, Factory>,
    blob_dir: PathBuf,
    blob_hook: Option<BlobHook>,
    probe_hook: Option<ProbeHook>,
    owns_process: bool,
}

impl Registry {
    /// A registry with no kinds, keeping blobs in `blob_dir`.
    pub fn new(blob_dir: PathBuf) -> Registry {
        Registry {
            factories: HashMap::new(),
            blob_dir,
            blob_hook: None,
            probe_hook: None,
            owns_process: false,
        }
    }

    /// Registers the factory of actors of `kind`.
    pub fn register(&mut self, kind: &str, factory: Factory) -> &mut Self {
        self.factories.insert(kind.to_string(), factory);
        self
    }

    /// Sets what runs when a blob arrives.
    pub fn on_blob(&mut self, hook: BlobHook) -> &mut Self {
        self.blob_hook = Some(hook);
        self
    }

    /// Sets how this process's procs answer probes of their actors (PA-4).
    pub fn on_probe(&mut self, hook: ProbeHook) -> &mut Self {
        self.probe_hook = Some(hook);
        self
    }

    /// Says that each proc of this registry is alone in its OS process
    /// (a child proc, [`crate::alloc::bootstrap_main`]), so that it may
    /// exit when asked to ([`ExitProc`], PA-5).
    pub fn owns_process(&mut self) -> &mut Self {
        self.owns_process = true;
        self
    }

    /// Where blobs are kept.
    pub fn blob_dir(&self) -> &Path {
        &self.blob_dir
    }

    /// Stores `bytes` as the blob `sha256` (PA-2), unless it is there.
    pub fn put_blob(&self, sha256: &str, bytes: &[u8]) -> Result<PathBuf, String> {
        let path = blob_path(&self.blob_dir, sha256)?;
        if !path.exists() {
            let actual = hex(&Sha256::digest(bytes));
            if actual != sha256 {
                return Err(format!("blob named {sha256} has sha256 {actual}"));
            }
            std::fs::create_dir_all(&self.blob_dir)
                .map_err(|e| format!("cannot create {}: {e}", self.blob_dir.display()))?;
            // Unique per writer: several allocators of one process (tests
            // in threads, actors that spawn meshes) may store the same
            // blob at once, and each renames only its own file.
            static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let nth = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let partial = path.with_extension(format!("partial-{}-{nth}", std::process::id()));
            std::fs::write(&partial, bytes)
                .and_then(|()| std::fs::rename(&partial, &path))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        if let Some(hook) = &self.blob_hook {
            hook(&path, sha256)?;
        }
        Ok(path)
    }
}

/// The sha256 of `bytes`, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Where the blob `sha256` lives in `dir`; refuses names that are not a
/// sha256, so that no request names another path.
pub fn blob_path(dir: &Path, sha256: &str) -> Result<PathBuf, String> {
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("`{sha256}` is not a sha256"));
    }
    Ok(dir.join(format!("{sha256}.blob")))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Spawns actors of a mesh on this proc (PA-1).
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SpawnActors {
    /// The factory's kind.
    pub kind: String,
    /// The mesh's name.
    pub name: String,
    /// The ranks to spawn here.
    pub ranks: Vec<u32>,
    /// The mesh's extent.
    pub extent: Vec<(String, u32)>,
    /// The factory's parameters.
    pub params: Vec<u8>,
    /// Ok once every rank has started.
    pub reply: OncePortRef<Result<(), String>>,
}

/// Stops the actors of a mesh on this proc, and waits until they end.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct StopActors {
    /// The mesh's name.
    pub name: String,
    /// Answered when they have ended.
    pub reply: OncePortRef<()>,
}

/// Stores a blob on this proc's host.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct PutBlob {
    /// The sha256 of the bytes, hex.
    pub sha256: String,
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Ok once stored (and prepared, see [`Registry::on_blob`]).
    pub reply: OncePortRef<Result<(), String>>,
}

/// Asks what this proc's actors are doing, for a debugger (PA-4): the
/// question means what the embedding's [`ProbeHook`] makes of it.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ProbeActors {
    /// The question, such as `stacks`.
    pub query: String,
    /// The hook's answer, or why there is none.
    pub reply: OncePortRef<Result<Vec<u8>, String>>,
}

/// The proc agent; see the module docs.
/// A network fault between this proc and others, made on purpose.
#[derive(Debug, Clone, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum NetFault {
    /// Messages to the peers arrive `delay_ms` late, for `duration_ms`.
    Delay {
        /// The added delay.
        delay_ms: u64,
        /// How long it lasts.
        duration_ms: u64,
    },
    /// Messages to the peers are held for `duration_ms`, as over a cut.
    Cut {
        /// How long it lasts.
        duration_ms: u64,
    },
    /// The delays and cuts to the peers end now.
    Heal,
}

/// Makes `fault` on the messages this proc sends to `peers` (proc
/// addresses); answered first (PA-5).
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Impair {
    /// The peers' addresses.
    pub peers: Vec<String>,
    /// The fault.
    pub fault: NetFault,
    /// Ok once made; an error names a bad address.
    pub reply: OncePortRef<Result<(), String>>,
}

/// Makes this proc's process exit with `code`, as if its main returned;
/// answered first (PA-5).
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ExitProc {
    /// The exit status.
    pub code: i32,
    /// Ok: it exits now; an error says why it cannot.
    pub reply: OncePortRef<Result<(), String>>,
}

/// Applies `fault` to what `proc` sends to each of `peers`.
pub fn impair(proc: &Proc, peers: &[hyperactor::ChannelAddr], fault: &NetFault) {
    use std::time::Duration;
    for peer in peers {
        match fault {
            NetFault::Delay {
                delay_ms,
                duration_ms,
            } => proc.delay_to(
                peer,
                Duration::from_millis(*delay_ms),
                Duration::from_millis(*duration_ms),
            ),
            NetFault::Cut { duration_ms } => proc.cut_to(peer, Duration::from_millis(*duration_ms)),
            NetFault::Heal => proc.heal_to(Some(peer)),
        }
    }
}

pub struct ProcAgent {
    registry: Arc<Registry>,
    events: PortRef<MeshEvent>,
    meshes: HashMap<String, Vec<SpawnedActor>>,
}

impl ProcAgent {
    /// An agent that spawns from `registry` and reports to `events`.
    pub fn new(registry: Arc<Registry>, events: PortRef<MeshEvent>) -> Self {
        ProcAgent {
            registry,
            events,
            meshes: HashMap::new(),
        }
    }
}

impl Actor for ProcAgent {
    fn exports(exports: &mut Exports<Self>) {
        exports
            .handle::<SpawnActors>()
            .handle::<StopActors>()
            .handle::<PutBlob>()
            .handle::<ProbeActors>()
            .handle::<Impair>()
            .handle::<ExitProc>();
    }
}

impl Handler<SpawnActors> for ProcAgent {
    async fn handle(&mut self, cx: &Context<Self>, request: SpawnActors) -> anyhow::Result<()> {
        if request.name.starts_with(RESERVED_PREFIX) {
            request.reply.send(
                cx,
                Err(format!(
                    "the name `{}` is reserved: names starting with `{RESERVED_PREFIX}` are the host's",
                    request.name
                )),
            );
            return Ok(());
        }
        let Some(factory) = self.registry.factories.get(&request.kind).cloned() else {
            request.reply.send(
                cx,
                Err(format!(
                    "this proc cannot spawn actors of kind `{}`",
                    request.kind
                )),
            );
            return Ok(());
        };
        let params = Arc::new(request.params);
        let spawns = request.ranks.iter().map(|&rank| {
            factory(SpawnArgs {
                proc: cx.proc().clone(),
                name: request.name.clone(),
                rank,
                extent: request.extent.clone(),
                params: params.clone(),
                blob_dir: self.registry.blob_dir.clone(),
                events: self.events.clone(),
            })
        });
        let results = futures::future::join_all(spawns).await;
        let mut spawned = Vec::with_capacity(results.len());
        let mut first_error = None;
        for (rank, result) in request.ranks.iter().zip(results) {
            match result {
                Ok(actor) => spawned.push(actor),
                Err(e) if first_error.is_none() => {
                    first_error = Some(format!("{}[{rank}] did not start: {e}", request.name))
                }
                Err(_) => {}
            }
        }
        if let Some(error) = first_error {
            for actor in &spawned {
                (actor.stop)();
            }
            request.reply.send(cx, Err(error));
            return Ok(());
        }
        self.meshes
            .entry(request.name.clone())
            .or_default()
            .extend(spawned);
        request.reply.send(cx, Ok(()));
        Ok(())
    }
}

impl Handler<StopActors> for ProcAgent {
    async fn handle(&mut self, cx: &Context<Self>, request: StopActors) -> anyhow::Result<()> {
        let actors = self.meshes.remove(&request.name).unwrap_or_default();
        for actor in &actors {
            (actor.stop)();
        }
        futures::future::join_all(actors.iter().map(|a| (a.join)())).await;
        request.reply.send(cx, ());
        Ok(())
    }
}

impl Handler<PutBlob> for ProcAgent {
    async fn handle(&mut self, cx: &Context<Self>, request: PutBlob) -> anyhow::Result<()> {
        let registry = self.registry.clone();
        let result = tokio::task::spawn_blocking(move || {
            registry
                .put_blob(&request.sha256, &request.bytes)
                .map(|_| ())
        })
        .await
        .unwrap_or_else(|e| Err(format!("storing the blob panicked: {e}")));
        request.reply.send(cx, result);
        Ok(())
    }
}

impl Handler<ProbeActors> for ProcAgent {
    async fn handle(&mut self, cx: &Context<Self>, request: ProbeActors) -> anyhow::Result<()> {
        let Some(hook) = self.registry.probe_hook.clone() else {
            request
                .reply
                .send(cx, Err("this proc's host answers no probes".into()));
            return Ok(());
        };
        // PA-4: the answer may wait (for a running actor's next epoch
        // tick); the agent goes on with its other messages meanwhile.
        let answer = hook(cx.proc().id(), &request.query);
        let mailbox: hyperactor::Mailbox = (**cx).clone();
        tokio::spawn(async move { request.reply.send(&mailbox, Ok(answer.await)) });
        Ok(())
    }
}

/// Makes `proc` a mesh proc: starts its agent and comm actor, and reports
/// the failures of its root actors to `events` (PA-3).
impl Handler<Impair> for ProcAgent {
    async fn handle(&mut self, cx: &Context<Self>, request: Impair) -> anyhow::Result<()> {
        let peers: Result<Vec<hyperactor::ChannelAddr>, String> = request
            .peers
            .iter()
            .map(|p| {
                p.parse()
                    .map_err(|e| format!("bad peer address `{p}`: {e}"))
            })
            .collect();
        match peers {
            // A heal acts first: the answer would be held by the cut.
            Ok(peers) if request.fault == NetFault::Heal => {
                impair(cx.proc(), &peers, &request.fault);
                request.reply.send(cx, Ok(()));
            }
            Ok(peers) => {
                request.reply.send(cx, Ok(()));
                impair(cx.proc(), &peers, &request.fault);
            }
            Err(e) => request.reply.send(cx, Err(e)),
        }
        Ok(())
    }
}

impl Handler<ExitProc> for ProcAgent {
    async fn handle(&mut self, cx: &Context<Self>, request: ExitProc) -> anyhow::Result<()> {
        if !self.registry.owns_process {
            request.reply.send(
                cx,
                Err("this proc shares its process with others and cannot exit alone".into()),
            );
            return Ok(());
        }
        request.reply.send(cx, Ok(()));
        let code = request.code;
        tokio::spawn(async move {
            // The answer leaves first (PA-5).
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            tracing::info!(code, "exiting on purpose (a fault a program made)");
            std::process::exit(code);
        });
        Ok(())
    }
}

pub fn start_mesh_proc(
    proc: &Proc,
    registry: Arc<Registry>,
    events: PortRef<MeshEvent>,
) -> Result<(), ProcError> {
    let supervision = proc.supervision_events();
    proc.spawn(AGENT_ACTOR, 0, ProcAgent::new(registry, events.clone()))?;
    proc.spawn(COMM_ACTOR, 0, CommActor::default())?;
    if let Some(mut supervision) = supervision {
        let (mailbox, _undeliverable) = proc.attach("monarch.supervisor")?;
        tokio::spawn(async move {
            while let Some(event) = supervision.recv().await {
                events.send(
                    &mailbox,
                    MeshEvent::ActorFailed {
                        actor: event.actor_id,
                        reason: event.reason,
                    },
                );
            }
        });
    }
    Ok(())
}

/// The agent port of `proc` for messages of type `M`.
pub fn agent_port<M: hyperactor::RemoteMessage>(proc: &ProcId) -> Option<PortRef<M>> {
    let actor = proc.actor_id(AGENT_ACTOR, 0).ok()?;
    Some(PortRef::attest(
        actor.port_id(hyperactor::message::handler_port::<M>()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pa2_blobs_are_stored_by_their_hash_and_names_cannot_be_paths() {
        let dir = std::env::temp_dir().join(format!("mesh-blobs-{}", std::process::id()));
        let registry = Registry::new(dir.clone());
        let sha = sha256_hex(b"bytes");
        let path = registry.put_blob(&sha, b"bytes").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"bytes");
        assert!(registry.put_blob(&sha256_hex(b"other"), b"bytes").is_err());
        assert!(blob_path(&dir, "../../etc/passwd").is_err());
        std::fs::remove_dir_all(dir).ok();
    }

    /// PA-2 with writers racing: registries of one process that store the
    /// same new blob at once all succeed (each writes a file of its own and
    /// renames it into place).
    #[test]
    fn pa2_one_blob_stored_by_many_writers_at_once() {
        let dir = std::env::temp_dir().join(format!("mesh-blobs-race-{}", std::process::id()));
        let bytes = vec![7u8; 1 << 20];
        let sha = sha256_hex(&bytes);
        let writers: Vec<_> = (0..8)
            .map(|_| {
                let (dir, bytes, sha) = (dir.clone(), bytes.clone(), sha.clone());
                std::thread::spawn(move || Registry::new(dir).put_blob(&sha, &bytes))
            })
            .collect();
        for writer in writers {
            let path = writer.join().unwrap().expect("every writer succeeds");
            assert_eq!(std::fs::read(path).unwrap(), bytes);
        }
        std::fs::remove_dir_all(dir).ok();
    }
}

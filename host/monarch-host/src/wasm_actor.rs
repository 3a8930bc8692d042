//! A Wasm actor: one instance of the program component inside a hyperactor
//! actor, on any proc of a mesh.
//!
//! Actors are spawned by the proc agent of their proc through the `wasm`
//! actor factory ([`registry`]): its parameters name the program by sha256,
//! and the factory finds the compiled program in this process, or loads it
//! from the host's blob store through the compile cache (so a host
//! compiles a program once, and its procs deserialize it). The instance is
//! made in the actor's `init`, which also calls the component's `create`.
//! Each [`MeshCall`] runs the component's `handle`. An endpoint error is a
//! reply (and, after a broadcast, fails the actor); a trap fails the actor,
//! and hyperactor's supervision turns it into a failure for every pending
//! caller, carrying an encoded [`Fault`] (kind, endpoint, backtrace).
//!
//! Every export runs in `race` against its handler deadline and the
//! actor's stop, so no guest holds its actor past either. What the actor
//! spawns is its own (AO-1): failures of it reach the `supervise` export
//! between messages (AO-2, woken by [`OwnedMeshNews`]), and one the export
//! does not handle fails the actor with kind `supervision` (AO-3).
//!
//! - EP-1: a process's engines for actors come in tiers ([`tier_sizes`]):
//!   a pool of 32 instances first, then up to 256, then the rest of
//!   `--max-instances`; a tier's engine is made (and the program loaded
//!   into it) only once the tiers before it are full, so that a proc with
//!   a few actors does not pay for 1,200 fiber stacks. Together they hold
//!   `--max-instances`, and a spawn past them is refused naming it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::anyhow;
use hyperactor::message::handler_port;
use hyperactor::{Actor, Context, Exports, Handler, Mailbox, PortRef};
use hyperactor_mesh::agent::{MeshEvent, Registry, SpawnArgs, SpawnedActor, blob_path};
use hyperactor_mesh::{Fault, FaultKind, MeshCall};
use tokio::sync::OnceCell;
use wasmtime::Store;

use crate::bindings::{Dim, Program, ProgramPre};
use crate::debug::pause::{PauseClock, Whoami};
use crate::engine::{self, Placement, Sandbox};
use crate::host::{Cluster, HostState, Interrupt, LogSink, ProgramBytes, linker, new_store};
use crate::mesh::{WASM_KIND, WasmSpawnParams};

/// A Wasm actor; see the module docs.
pub struct WasmActor {
    cluster: Arc<Cluster>,
    mesh: String,
    class: String,
    init: Vec<u8>,
    rank: u32,
    extent: Vec<Dim>,
    instance: Option<(Store<HostState>, Program)>,
    /// The deadline of each handler unless a call names its own.
    handler_timeout: Option<Duration>,
    /// Raised by the proc's agent when it stops the actor (see `HostState`).
    interrupt: Arc<Interrupt>,
    /// The time its instance has spent paused at breakpoints.
    paused: Arc<PauseClock>,
    /// Tasks that wake the actor when a mesh it owns has news (AO-2);
    /// they end with it.
    watchers: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    /// Its place in the engine's pool, taken when it was spawned and handed
    /// to its instance's store in `init`.
    slot: Option<engine::Slot>,
    /// Its instance's debugger, on the debug engine (`run --debug`).
    debugger: Option<crate::debug::engine::Debugger>,
}

impl Drop for WasmActor {
    fn drop(&mut self) {
        for watcher in self
            .watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            watcher.abort();
        }
    }
}

/// Tells an actor that a mesh it owns has news (a failure), so that it
/// takes it between messages even while no handler runs (AO-2).
/// The news itself waits in the actor's host state.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct OwnedMeshNews;

/// How a guest export ended: returned, trapped, or was interrupted.
enum Ended<T> {
    Returned(T),
    Trapped(wasmtime::Error),
    /// Past its deadline, which was this long.
    Deadline(Duration),
    /// The actor was stopped while the guest ran.
    Stopped,
}

/// Runs a guest export until it returns, its deadline passes, or the actor
/// is stopped. A guest that spins yields at every epoch tick and one that
/// waits in a host call (a WASI sleep, `next-events`) is pending, so
/// either way the race is decided within a tick; the export's future is
/// dropped then, and the instance must not be used again.
async fn race<T>(
    export: impl std::future::Future<Output = wasmtime::Result<T>>,
    deadline: Option<Duration>,
    interrupt: &Interrupt,
    paused: &PauseClock,
    started: std::time::Instant,
) -> Ended<T> {
    // A stop that lands while the guest runs makes the epoch callback end
    // the export with an error: that is the stop, not a trap of the guest.
    let ended = |result: wasmtime::Result<T>| match result {
        Ok(value) => Ended::Returned(value),
        Err(_) if interrupt.is_raised() => Ended::Stopped,
        Err(trap) => Ended::Trapped(trap),
    };
    let started = tokio::time::Instant::from_std(started);
    let held_before = paused.paused();
    let mut export = std::pin::pin!(export);
    // Most exports return at their first poll: then neither the timer nor
    // the interrupt's waiter is ever set up.
    if let std::task::Poll::Ready(result) = futures::poll!(export.as_mut()) {
        return ended(result);
    }
    // Time paused at a breakpoint does not count against the deadline.
    let expired = async {
        let Some(after) = deadline else {
            return std::future::pending().await;
        };
        loop {
            let held = paused.paused().saturating_sub(held_before);
            let due = started + after + held;
            let now = tokio::time::Instant::now();
            if due <= now && !paused.is_paused() {
                return;
            }
            let wake = match paused.is_paused() {
                true => now + PAUSE_RECHECK,
                false => due,
            };
            tokio::time::sleep_until(wake).await;
        }
    };
    tokio::select! {
        biased;
        result = export.as_mut() => ended(result),
        _ = interrupt.raised() => Ended::Stopped,
        _ = expired => Ended::Deadline(deadline.unwrap_or_default()),
    }
}

/// How often a deadline that a pause holds is looked at again.
const PAUSE_RECHECK: Duration = Duration::from_millis(100);

impl Actor for WasmActor {
    fn exports(exports: &mut Exports<Self>) {
        exports.handle::<MeshCall>().handle::<OwnedMeshNews>();
    }

    async fn init(&mut self, cx: &Context<Self>) -> anyhow::Result<()> {
        let who = format!("{}[{}]", self.mesh, self.rank);
        let mailbox: Mailbox = (**cx).clone();
        let output = format!("[{} {}] ", self.mesh, self.rank);
        let mut state = HostState::new(self.cluster.clone(), &mailbox, who, Some(output));
        state.interrupt = self.interrupt.clone();
        state.slot = self.slot.take();
        state.probe = Some(crate::debug::stacks::Probe::actor(
            &self.mesh,
            self.rank,
            cx.proc().id(),
            &self.cluster,
        ));
        state.debug.clock = self.paused.clone();
        state.debug.whoami = Whoami {
            mesh: self.mesh.clone(),
            rank: self.rank,
            extent: self
                .extent
                .iter()
                .map(|d| (d.name.clone(), d.size))
                .collect(),
        };
        // What the actor spawns is its own: failures go to its `supervise`
        // export, between messages (AO-2).
        state.unsupervised = Some(Default::default());
        let news: PortRef<OwnedMeshNews> =
            PortRef::attest(cx.actor_id().port_id(handler_port::<OwnedMeshNews>()));
        let watchers = self.watchers.clone();
        let sender = mailbox.clone();
        state.on_client = Some(Box::new(move |client| {
            let mut events = client.subscribe();
            let (news, sender) = (news.clone(), sender.clone());
            let watcher = tokio::spawn(async move {
                while let Some(event) = events.recv().await {
                    match &event {
                        MeshEvent::Log { .. } => continue,
                        // This actor's casts to the lost proc fail at once.
                        MeshEvent::ProcStopped { proc, reason } => {
                            sender.proc().peer_ended(proc.addr(), reason);
                        }
                        MeshEvent::ActorFailed { .. } => {}
                    }
                    news.send(&sender, OwnedMeshNews);
                }
            });
            watchers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(watcher);
        }));
        let mut store = new_store(&self.cluster, state);
        self.debugger = crate::debug::engine::attach(&mut store, &self.cluster).await;
        let pre = self
            .cluster
            .pre
            .as_ref()
            .ok_or_else(|| anyhow!("the program defines no actor classes"))?;
        let program = pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| match e.downcast_ref::<wasmtime::PoolConcurrencyLimitError>() {
                // More instances than the pool was sized for (a program
                // that makes more core instances than it was read to).
                Some(full) => anyhow!(
                    "instantiating the program: this process's instance pool is exhausted ({full}); spawn fewer actors per proc, or raise --max-instances"
                ),
                None => anyhow!("instantiating the program: {}", trap_text(&e)),
            })?;
        if let Some(debugger) = &self.debugger {
            debugger.begin_export(&mut store);
        }
        let create = program.monarch_host_actor_class().call_create(
            &mut store,
            &self.class,
            &self.init,
            self.rank,
            &self.extent,
        );
        let created = match race(
            create,
            self.handler_timeout,
            &self.interrupt,
            &self.paused,
            std::time::Instant::now(),
        )
        .await
        {
            Ended::Returned(created) => created,
            Ended::Trapped(trap) => {
                tracing::info!(actor = %cx.actor_id(), "trap in create: {}", trap_text(&trap));
                let mut fault = trap_fault(&trap, "create", store.data().limits.out_of_memory());
                post_mortem(
                    &self.cluster,
                    &self.mesh,
                    self.rank,
                    &mut store,
                    &trap,
                    &mut fault,
                )
                .await;
                return Err(anyhow!("`create` trapped: {}", fault.message));
            }
            Ended::Deadline(after) => {
                return Err(anyhow!(
                    "`create` ran past the handler deadline of {} ms",
                    after.as_millis()
                ));
            }
            Ended::Stopped => return Err(anyhow!("the actor was stopped during `create`")),
        };
        created.map_err(|error| anyhow!("`create` of class `{}` failed: {error}", self.class))?;
        self.instance = Some((store, program));
        Ok(())
    }
}

impl Handler<MeshCall> for WasmActor {
    async fn handle(&mut self, cx: &Context<Self>, call: MeshCall) -> anyhow::Result<()> {
        let Some((store, program)) = self.instance.as_mut() else {
            let fault = Fault::new(
                FaultKind::Stopped,
                "the actor has no instance: it was stopped",
            );
            call.reply.send(cx, Err(fault.encode()));
            return Ok(());
        };
        let deadline = match call.handler_timeout_ms {
            0 => self.handler_timeout,
            ms => Some(Duration::from_millis(ms)),
        };
        store.data_mut().limits.clear();
        if let Some(debugger) = &self.debugger {
            debugger.begin_export(store);
        }
        // One reading of the clock: the deadline and the stacks probe.
        let started = std::time::Instant::now();
        let in_endpoint = (store.data().probe.as_ref()).map(|p| p.enter(&call.endpoint, started));
        let handle = program.monarch_host_actor_class().call_handle(
            &mut *store,
            &call.endpoint,
            &call.message,
        );
        let ended = race(handle, deadline, &self.interrupt, &self.paused, started).await;
        drop(in_endpoint);
        // A pause the handler opened ends with it.
        store.data_mut().debug.close();
        let endpoint = call.endpoint.as_str();
        // A reply too large for a frame would be dropped on its way back:
        // the caller gets why instead (HG-4 of `host`).
        let ended = match ended {
            Ended::Returned(Ok(reply)) if reply.len() > crate::host::MAX_MESSAGE => {
                Ended::Returned(Err(crate::bindings::EndpointError {
                    message: format!(
                        "a reply of {} bytes exceeds the limit of {} bytes for one message; send large data in parts",
                        reply.len(),
                        crate::host::MAX_MESSAGE
                    ),
                    type_name: None,
                    backtrace: None,
                }))
            }
            other => other,
        };
        match ended {
            Ended::Returned(Ok(reply)) => {
                call.reply.send(cx, Ok(reply));
                self.supervise_pending().await
            }
            Ended::Returned(Err(error)) => {
                let fault = Fault {
                    kind: FaultKind::Endpoint,
                    message: error.message,
                    endpoint: Some(endpoint.to_string()),
                    type_name: error.type_name,
                    backtrace: error.backtrace,
                };
                call.reply.send(cx, Err(fault.encode()));
                if !call.broadcast {
                    return self.supervise_pending().await;
                }
                // Nobody waits for a broadcast's reply: as in Monarch, the
                // error fails the actor, and its owner hears of it.
                let mut failed = fault;
                failed.message = format!(
                    "`{endpoint}` returned an error to a broadcast: {}",
                    Fault::readable(&failed.message)
                );
                Err(anyhow!(failed.encode()))
            }
            // A trap is fatal: hyperactor fails the actor and every caller
            // waiting on it, this one included, with the encoded fault.
            Ended::Trapped(trap) => {
                tracing::info!(actor = %cx.actor_id(), endpoint, "trap: {}", trap_text(&trap));
                let mut fault = trap_fault(&trap, endpoint, store.data().limits.out_of_memory());
                post_mortem(
                    &self.cluster,
                    &self.mesh,
                    self.rank,
                    store,
                    &trap,
                    &mut fault,
                )
                .await;
                self.instance = None;
                Err(anyhow!(fault.encode()))
            }
            Ended::Deadline(after) => {
                self.instance = None;
                let fault = Fault::new(
                    FaultKind::Deadline,
                    format!(
                        "the handler of `{endpoint}` ran past its deadline of {} ms and was interrupted",
                        after.as_millis()
                    ),
                )
                .at_endpoint(endpoint);
                Err(anyhow!(fault.encode()))
            }
            // Stopped by its owner: not a failure. The caller hears why;
            // the stop that follows in the queue ends the actor.
            Ended::Stopped => {
                self.instance = None;
                let fault = Fault::new(
                    FaultKind::Stopped,
                    format!("the actor was stopped while it handled `{endpoint}`"),
                )
                .at_endpoint(endpoint);
                call.reply.send(cx, Err(fault.encode()));
                Ok(())
            }
        }
    }
}

impl Handler<OwnedMeshNews> for WasmActor {
    async fn handle(&mut self, _cx: &Context<Self>, _news: OwnedMeshNews) -> anyhow::Result<()> {
        self.supervise_pending().await
    }
}

impl WasmActor {
    /// Offers each failure of the meshes this actor owns to its
    /// `supervise` export (AO-2). One it does not handle (false, a trap, a
    /// deadline) fails this actor with kind `supervision`, which goes on to
    /// its own owner (AO-3).
    async fn supervise_pending(&mut self) -> anyhow::Result<()> {
        loop {
            let Some((store, program)) = self.instance.as_mut() else {
                return Ok(());
            };
            let Some(failure) = store.data_mut().next_unsupervised() else {
                return Ok(());
            };
            store.data_mut().limits.clear();
            if let Some(debugger) = &self.debugger {
                debugger.begin_export(store);
            }
            let supervise = program
                .monarch_host_actor_class()
                .call_supervise(&mut *store, &failure);
            let ended = race(
                supervise,
                self.handler_timeout,
                &self.interrupt,
                &self.paused,
                std::time::Instant::now(),
            )
            .await;
            if self.debugger.is_some() {
                // A stop of the debug engine ends with the export.
                store.data_mut().debug.close();
            }
            let why = match ended {
                Ended::Returned(true) => continue,
                Ended::Returned(false) => "its `supervise` did not handle it".to_string(),
                Ended::Trapped(trap) => {
                    let out_of_memory = store.data().limits.out_of_memory();
                    let mut fault = trap_fault(&trap, "supervise", out_of_memory);
                    post_mortem(
                        &self.cluster,
                        &self.mesh,
                        self.rank,
                        store,
                        &trap,
                        &mut fault,
                    )
                    .await;
                    format!("its `supervise` trapped: {}", fault.message)
                }
                Ended::Deadline(after) => format!(
                    "its `supervise` ran past the handler deadline of {} ms",
                    after.as_millis()
                ),
                Ended::Stopped => return Ok(()),
            };
            self.instance = None;
            let endpoint = failure
                .endpoint
                .as_deref()
                .map(|e| format!(" in `{e}`"))
                .unwrap_or_default();
            let mut fault = Fault::new(
                FaultKind::Supervision,
                format!(
                    "{}[{}], which this actor owns, failed{endpoint} ({}: {}), and {why}",
                    failure.mesh,
                    failure.rank,
                    crate::errors::kind_name(failure.kind),
                    failure.reason
                ),
            );
            fault.backtrace = failure.backtrace;
            return Err(anyhow!(fault.encode()));
        }
    }
}

/// The reason of a trap without its backtrace: "wasm `unreachable`
/// instruction executed", "out of bounds memory access"...
pub(crate) fn trap_reason(error: &wasmtime::Error) -> String {
    if let Some(exit) = error.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return format!("the guest exited with status {}", exit.0);
    }
    let reason = match error.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        // Not a Trap (memory growth refused, a deadline): the innermost
        // cause says why; the outer layers are the backtrace.
        None => error.root_cause().to_string(),
    };
    match limit_hit(error) {
        Some(limit) if !reason.contains(&limit) => format!("{limit} ({reason})"),
        _ => reason,
    }
}

/// Which of the host's limits on a guest a trap ran into, in words, where
/// wasmtime's own message does not name it (HG-2, HG-3, HG-5 of `host`): the
/// Wasm stack, more data in one host call than the hostcall fuel, a list
/// or string whose pointer and length lie outside the guest's memory, a
/// full resource table (a WASI resource past the cap), too many requests.
/// None for any other trap.
pub(crate) fn limit_hit(error: &wasmtime::Error) -> Option<String> {
    for cause in error.chain() {
        let text = cause.to_string();
        if text.starts_with(crate::host::TOO_MANY_HANDLES) {
            return Some(crate::host::too_many_handles());
        }
        if text.starts_with(crate::host::TOO_MANY_REQUESTS) {
            return Some(crate::host::too_many_requests());
        }
        if let Some(wasmtime::Trap::StackOverflow) = cause.downcast_ref() {
            return Some(format!(
                "{STACK_OVERFLOW}the guest's calls nested deeper than its Wasm stack allows (unbounded recursion?)"
            ));
        }
        if let Some(wasmtime::component::ResourceTableError::Full) = cause.downcast_ref() {
            return Some(crate::host::too_many_handles());
        }
        if text.contains("fuel allocated for hostcalls has been exhausted") {
            return Some(crate::host::payload_too_large());
        }
        if text.starts_with("unknown handle index") {
            return Some(format!(
                "{BAD_ARGUMENT}the guest used a handle it had dropped or never had ({text})"
            ));
        }
        if text.contains("pointer/length out of bounds of memory") {
            return Some(format!(
                "{BAD_ARGUMENT}the guest handed the host a list or string whose pointer and length lie outside its memory"
            ));
        }
    }
    None
}

/// How [`limit_hit`]'s stack overflow starts.
const STACK_OVERFLOW: &str = "stack overflow: ";

/// How [`limit_hit`]'s out-of-bounds argument starts.
const BAD_ARGUMENT: &str = "bad argument: ";

/// Whether a trap's text, as [`trap_text`] wrote it, starts with one of
/// the host's limits ([`limit_hit`]).
pub(crate) fn names_a_limit(text: &str) -> bool {
    [
        STACK_OVERFLOW,
        BAD_ARGUMENT,
        crate::host::TOO_MANY_HANDLES,
        crate::host::TOO_MANY_REQUESTS,
        crate::host::PAYLOAD_TOO_LARGE,
    ]
    .iter()
    .any(|prefix| text.starts_with(prefix))
}

/// A trap as `{:?}` shows it (what wasmtime attached, outermost first,
/// then `Caused by:` and the causes), less the core dump that
/// `coredump_on_trap` attaches: its summary lists every module, instance,
/// memory and global of the store, which belongs in a post-mortem record
/// (`debug::dumps`), not in logs and error messages.
pub(crate) fn trap_text(error: &wasmtime::Error) -> String {
    let dump = error
        .downcast_ref::<wasmtime::WasmCoreDump>()
        .map(|dump| dump.to_string());
    let mut layers = error
        .chain()
        .map(|layer| layer.to_string())
        .filter(|layer| Some(layer) != dump.as_ref());
    let mut text = layers.next().unwrap_or_default();
    if let Some(limit) = limit_hit(error)
        && !text.contains(&limit)
    {
        text = format!("{limit}: {text}");
    }
    let causes: Vec<String> = layers.collect();
    if !causes.is_empty() {
        text.push_str("\n\nCaused by:\n");
    }
    for (i, cause) in causes.iter().enumerate() {
        match causes.len() {
            1 => text.push_str(&format!("    {cause}\n")),
            _ => text.push_str(&format!("{i: >5}: {cause}\n")),
        }
    }
    text
}

/// Writes the post-mortem record of a trap of the actor `mesh[rank]`, if
/// its sandbox asks for records, and names it in `fault`'s message.
async fn post_mortem(
    cluster: &Cluster,
    mesh: &str,
    rank: u32,
    store: &mut Store<HostState>,
    trap: &wasmtime::Error,
    fault: &mut Fault,
) {
    let who = crate::debug::dumps::Trapped {
        mesh,
        rank,
        program: &cluster.program.sha256,
    };
    crate::debug::dumps::record(cluster.sandbox.dumps.as_ref(), who, store, trap, fault).await;
}

/// What a trap in `endpoint` was, with its kind and the guest's Wasm
/// backtrace (symbolized where the program has names). `out_of_memory`
/// says why growing the guest's memory was refused during the call, if it
/// was: the trap that follows (a Rust allocator's abort, an interpreter's
/// unhandled `MemoryError`) is then of kind out-of-memory, unless the trap
/// was another of the host's limits ([`limit_hit`]), which names itself.
pub(crate) fn trap_fault(
    error: &wasmtime::Error,
    endpoint: &str,
    out_of_memory: Option<&str>,
) -> Fault {
    let out_of_memory = out_of_memory.filter(|_| limit_hit(error).is_none());
    let (kind, reason) = match out_of_memory {
        Some(why) => (
            FaultKind::OutOfMemory,
            format!("{why}, and then the guest trapped: {}", trap_reason(error)),
        ),
        None => (FaultKind::Trap, trap_reason(error)),
    };
    // The origin names the endpoint; the message is the trap itself.
    let mut fault = Fault::new(kind, reason).at_endpoint(endpoint);
    fault.backtrace = error
        .downcast_ref::<wasmtime::WasmBacktrace>()
        .map(|backtrace| backtrace.to_string())
        .filter(|text| !text.trim().is_empty());
    fault
}

/// A program compiled in this process: what every actor of it shares,
/// whichever run spawned it.
struct Compiled {
    engine: wasmtime::Engine,
    pre: ProgramPre<HostState>,
    program: ProgramBytes,
}

/// The programs this process has compiled, by sha256 and pool size. A
/// proc of a persistent mesh runs many jobs: each spawn gets a cluster of
/// its own (its deadline, memory cap, call timeout) around the shared
/// compiled form.
type Programs = Arc<Mutex<HashMap<String, Arc<ProgramTiers>>>>;

/// A program's compiled forms in this process, one per tier of engines
/// ([`tier_sizes`]): the first is loaded at the program's first spawn,
/// each further one only once the tiers before it are full (EP-1).
struct ProgramTiers {
    tiers: Vec<OnceCell<Arc<Compiled>>>,
}

impl ProgramTiers {
    /// Tiers for a pool of `max_instances`, none loaded yet.
    fn empty(max_instances: u32) -> ProgramTiers {
        ProgramTiers {
            tiers: tier_sizes(max_instances)
                .iter()
                .map(|_| OnceCell::new())
                .collect(),
        }
    }

    /// One tier, loaded already: the controller's program, in its engine.
    fn single(compiled: Compiled) -> ProgramTiers {
        ProgramTiers {
            tiers: vec![OnceCell::new_with(Some(Arc::new(compiled)))],
        }
    }
}

/// Component instances in the first tier of a process's engines for
/// actors, and in the first two together: a proc usually runs a few
/// actors, so that it starts with a pool of 32 (and 32 fiber stacks, each
/// an `mprotect` and a mapping of its own) instead of all
/// `--max-instances` of them.
const FIRST_TIER: u32 = 32;
const FIRST_TWO_TIERS: u32 = 256;

/// The sizes of a process's engine tiers for a pool of `max_instances`:
/// 32, then up to 256 in all, then the rest, so that they add up to
/// `max_instances` (EP-1).
fn tier_sizes(max_instances: u32) -> Vec<u32> {
    let max = max_instances.max(1);
    let mut sizes = Vec::new();
    let mut total = 0;
    for cumulative in [FIRST_TIER, FIRST_TWO_TIERS, max] {
        let end = cumulative.min(max);
        if end > total {
            sizes.push(end - total);
            total = end;
        }
    }
    sizes
}

/// Log sinks by the events port they send to: one mailbox per controller.
type LogSinks = Arc<Mutex<HashMap<String, LogSink>>>;

/// A registry with the `wasm` kind, keeping blobs in `blob_dir`. `known`
/// is a program this process already runs (the controller's), so that
/// actors in this process share its compiled form.
pub fn registry(blob_dir: std::path::PathBuf, known: Option<Arc<Cluster>>) -> Registry {
    let programs: Programs = Arc::default();
    let compiled_here = known.is_some();
    let in_process = known.is_some();
    let sinks: LogSinks = Arc::default();
    // In-process actors of the controller's program log as the controller
    // does.
    let known_log = known
        .as_ref()
        .map(|c| (c.program.sha256.clone(), c.log.clone()));
    if let Some(cluster) = known
        && let Some(pre) = &cluster.pre
    {
        let compiled = Compiled {
            engine: cluster.engine.clone(),
            pre: pre.clone(),
            program: cluster.program.clone(),
        };
        let tiers = ProgramTiers::single(compiled);
        let key = program_key(
            &cluster.program.sha256,
            cluster.sandbox.max_instances,
            cluster.sandbox.debug_engine,
        );
        programs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, Arc::new(tiers));
    }
    let mut registry = Registry::new(blob_dir);
    registry.register(
        WASM_KIND,
        Arc::new(move |args: SpawnArgs| {
            let programs = programs.clone();
            let sinks = sinks.clone();
            let known_log = known_log.clone();
            Box::pin(async move {
                let params: WasmSpawnParams = serde_json::from_slice(&args.params)
                    .map_err(|e| format!("bad wasm spawn parameters: {e}"))?;
                let tiers = programs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(program_key(
                        &params.sha256,
                        params.max_instances,
                        params.debug_engine,
                    ))
                    .or_insert_with(|| Arc::new(ProgramTiers::empty(params.max_instances)))
                    .clone();
                // A place in the pool, taken before the actor starts: the
                // actors of one spawn take theirs in rank order, so the
                // first that does not fit is the one the error names. The
                // first tier with room gives it; a tier is loaded only once
                // the ones before it are full.
                let mut placed = None;
                for (tier, cell) in tiers.tiers.iter().enumerate() {
                    let compiled = cell
                        .get_or_try_init(|| load_program(&args, &params, tier))
                        .await?;
                    match engine::pool(&compiled.engine) {
                        Some(pool) => {
                            if let Some(slot) = pool.try_reserve() {
                                placed = Some((compiled.clone(), Some(slot)));
                                break;
                            }
                        }
                        None => {
                            placed = Some((compiled.clone(), None));
                            break;
                        }
                    }
                }
                let (compiled, slot) = match placed {
                    Some(placed) => placed,
                    None => {
                        let limit = match tiers.tiers.len() {
                            1 => tiers.tiers[0]
                                .get()
                                .and_then(|c| engine::pool(&c.engine))
                                .map_or(params.max_instances, |p| p.shape.instances),
                            _ => params.max_instances,
                        };
                        return Err(engine::pool_full(limit));
                    }
                };
                let needs = &compiled.program.needs;
                if needs.initial_memory > params.memory_bytes as u64 {
                    return Err(engine::LoadError::MemoryCap {
                        path: "the program".into(),
                        needed: needs.initial_memory,
                        cap: params.memory_bytes,
                    }
                    .to_string());
                }
                let log = match known_log {
                    Some((sha, log)) if sha == params.sha256 => log,
                    _ => log_to(&sinks, &args.proc, &args.events)?,
                };
                let handler_timeout = params.handler_timeout_ms.map(Duration::from_millis);
                // What the actor spawns runs where it runs: in this process
                // when it is the controller's (procs in process), else in
                // child processes of this one (AO-1).
                let placement = match in_process {
                    true => Placement::InProcess,
                    false => Placement::Local {
                        program: hyperactor_mesh::exe::current_exe()
                            .map_err(|e| format!("cannot find this binary to start procs: {e}"))?,
                    },
                };
                let sandbox = Sandbox {
                    memory_bytes: params.memory_bytes,
                    deadline: Duration::from_millis(params.deadline_ms),
                    call_timeout: Duration::from_millis(params.call_timeout_ms),
                    max_procs: params.max_procs,
                    placement,
                    fanout: params.fanout,
                    handler_timeout,
                    grants: params.grants,
                    max_instances: params.max_instances,
                    dumps: params.dumps,
                    debug: params.debug,
                    debug_engine: params.debug_engine,
                    live: Default::default(),
                };
                let cluster = Cluster::for_actor(
                    compiled.engine.clone(),
                    Some(compiled.pre.clone()),
                    sandbox,
                    log,
                    compiled.program.clone(),
                );
                let actor = WasmActor {
                    cluster,
                    mesh: args.name.clone(),
                    class: params.class,
                    init: params.init,
                    rank: args.rank,
                    extent: args
                        .extent
                        .iter()
                        .map(|(name, size)| Dim {
                            name: name.clone(),
                            size: *size,
                        })
                        .collect(),
                    instance: None,
                    handler_timeout,
                    interrupt: Arc::default(),
                    paused: Arc::default(),
                    watchers: Arc::default(),
                    slot,
                    debugger: None,
                };
                let interrupt = actor.interrupt.clone();
                let spawned = SpawnedActor::start(&args, actor).await?;
                Ok(spawned.on_stop(move || interrupt.raise()))
            })
        }),
    );
    // Every proc can hold the shards of a program's tensor engines and its
    // RDMA buffers.
    monarch_tensor::mesh::register(&mut registry);
    monarch_rdma::mesh::register(&mut registry);
    // Every proc answers `monarch-host stacks` for its actors.
    registry.on_probe(Arc::new(crate::debug::stacks::answer));
    // A host compiles a program when it arrives, once for all its procs;
    // the process that runs the controller has compiled it already.
    if !compiled_here {
        // Mapped, parsed (or its footprint note read) and linked once, and
        // not hashed again: the blob is named by its sha256, checked when
        // it was stored.
        registry.on_blob(Arc::new(|path, sha256| {
            let bytes = engine::Mapped::open(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let footprint = engine::inspect_blob(path, &bytes).map_err(|e| e.to_string())?;
            let (engine, linker) =
                worker_engine(&footprint.needs, engine::DEFAULT_MAX_INSTANCES, 0, false)?;
            engine::load_inspected(&engine, &linker, path, &bytes, footprint, sha256.into())
                .map(|_| ())
                .map_err(|e| e.to_string())
        }));
    }
    registry
}

/// The key of a program compiled in this process: its sha256, the size
/// of the pool its instances come from, and whether it is compiled for the
/// debug engine.
fn program_key(sha256: &str, max_instances: u32, debug_engine: bool) -> String {
    match debug_engine {
        false => format!("{sha256}/{max_instances}"),
        true => format!("{sha256}/{max_instances}/debug"),
    }
}

/// The most linear memory an engine for programs this process did not
/// start allows one instance: as much as a 32-bit memory can grow to, as
/// much address space as each slot reserves anyway. One proc runs actors
/// of many runs (a persistent mesh of the server), each with its own memory
/// cap, which the stores' limits enforce.
const WORKER_MEMORY: usize = 4 << 30;

/// An engine for actors and the linker of its host functions.
type EngineAndLinker = (
    wasmtime::Engine,
    Arc<wasmtime::component::Linker<HostState>>,
);

/// One of this process's engines for actors, with the linker of its
/// host functions (built once per engine, not once per program).
struct WorkerEngine {
    engine: wasmtime::Engine,
    linker: Arc<wasmtime::component::Linker<HostState>>,
    /// The process whose epoch ticker advances this engine: threads do not
    /// survive a fork, so a proc forked with an engine its fork server made
    /// starts a ticker of its own on first use (AL-6).
    ticking_in: Option<u32>,
}

/// The pool shape of engine tier `tier` holding `instances` instances of
/// programs that need `needs`. The first tier is of one shape for every
/// program that fits [`engine::PoolShape::any_program`] (Rust, Python and
/// JavaScript programs alike), so that a fork server can make it before it
/// knows the program (AL-6); the other tiers are sized to the program.
fn tier_shape(needs: &engine::Needs, instances: u32, tier: usize) -> engine::PoolShape {
    let common = engine::PoolShape::any_program(instances, WORKER_MEMORY);
    match tier == 0 && common.fits(needs) {
        true => common,
        false => engine::PoolShape::for_program(needs, instances, WORKER_MEMORY),
    }
}

/// This process's engine of tier `tier` for instances of programs that
/// need `needs`, of a pool of `max_instances` in all ([`tier_sizes`]), and
/// its linker: one engine per pool shape and tier, made on first use and
/// kept (programs of one kind share a shape; see [`tier_shape`]).
/// With `debug_engine`, a debug engine ([`engine::pooled_debug_engine`]),
/// kept apart from the normal ones.
fn worker_engine(
    needs: &engine::Needs,
    max_instances: u32,
    tier: usize,
    debug_engine: bool,
) -> Result<EngineAndLinker, String> {
    worker_engine_ticking(needs, max_instances, tier, debug_engine, true)
}

/// [`worker_engine`]; with `tick` false, one whose epoch is not advanced
/// yet (a fork server's, which may start no thread).
fn worker_engine_ticking(
    needs: &engine::Needs,
    max_instances: u32,
    tier: usize,
    debug_engine: bool,
    tick: bool,
) -> Result<EngineAndLinker, String> {
    type Engines = Mutex<HashMap<(engine::PoolShape, usize, bool), WorkerEngine>>;
    static ENGINES: OnceLock<Engines> = OnceLock::new();
    let instances = *tier_sizes(max_instances)
        .get(tier)
        .ok_or_else(|| format!("no engine tier {tier} for a pool of {max_instances}"))?;
    // Keyed by the whole pool's shape and the tier: two tiers of one size
    // are two pools.
    let key = (tier_shape(needs, max_instances, tier), tier, debug_engine);
    let mut engines = ENGINES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let entry = match engines.entry(key) {
        std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
        std::collections::hash_map::Entry::Vacant(entry) => {
            let shape = tier_shape(needs, instances, tier);
            let engine = match debug_engine {
                false => engine::pooled_engine(&shape),
                true => engine::pooled_debug_engine(&shape),
            }
            .map_err(|e| format!("{e:#}"))?;
            let linker = Arc::new(linker(&engine).map_err(|e| format!("{e:#}"))?);
            entry.insert(WorkerEngine {
                engine,
                linker,
                ticking_in: None,
            })
        }
    };
    let here = std::process::id();
    if tick && entry.ticking_in != Some(here) {
        engine::start_epoch_ticker(&entry.engine);
        entry.ticking_in = Some(here);
    }
    Ok((entry.engine.clone(), entry.linker.clone()))
}

/// Makes, in a fork server before its first fork, what each proc it forks
/// would otherwise make first thing (AL-6): the engine of the first tier
/// for programs of the common shape ([`tier_shape`]) with the default
/// `--max-instances`, its pool's address space and fiber stacks mapped,
/// and its linker. A forked proc inherits them and starts only the
/// engine's epoch ticker. Starts no thread: the server must stay
/// single-threaded to fork. A failure is reported, and each proc makes
/// its own engine as a started one does.
pub fn prepare_forked_procs() {
    let common = engine::Needs::default();
    if let Err(e) = worker_engine_ticking(&common, engine::DEFAULT_MAX_INSTANCES, 0, false, false) {
        eprintln!("monarch fork server: cannot make the procs' engine ahead: {e}");
    }
}

/// Programs a fork server loaded before it forked (AL-7), by
/// [`program_key`]: a proc forked after inherits them and takes its
/// program from here instead of loading it. The latest few are kept.
static PRELOADED: Mutex<Vec<(String, Arc<Compiled>)>> = Mutex::new(Vec::new());

/// How many programs a fork server keeps loaded for its procs.
const PRELOADED_PROGRAMS: usize = 4;

/// Loads the blob `sha256` at `path` in a fork server, before it forks
/// the next procs (AL-7, `hyperactor_mesh::fork` FS-6): into the first
/// tier's engine for the default pool ([`prepare_forked_procs`]), from
/// the compile cache only (a compile starts threads, which a fork server
/// must not). A program not yet in the cache, or one that does not fit
/// the first tier, is left to its procs to load, as is every failure.
/// Starts no thread.
pub fn preload_forked_program(path: &std::path::Path, sha256: &str) {
    let key = program_key(sha256, engine::DEFAULT_MAX_INSTANCES, false);
    let mut preloaded = PRELOADED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(at) = preloaded.iter().position(|(k, _)| *k == key) {
        let entry = preloaded.remove(at);
        preloaded.push(entry);
        return;
    }
    let loaded = (|| {
        let bytes = engine::Mapped::open(path).ok()?;
        let footprint = engine::inspect_blob(path, &bytes).ok()?;
        let needs = footprint.needs;
        let (engine, linker) =
            worker_engine_ticking(&needs, engine::DEFAULT_MAX_INSTANCES, 0, false, false).ok()?;
        let loaded = engine::load_cached(&engine, path, footprint, sha256.to_string()).ok()??;
        let pre = linker
            .instantiate_pre(&loaded.component)
            .and_then(ProgramPre::new)
            .ok()?;
        Some(Compiled {
            engine,
            pre,
            program: ProgramBytes::in_file(sha256.to_string(), needs, path.to_path_buf()),
        })
    })();
    if let Some(compiled) = loaded {
        if preloaded.len() >= PRELOADED_PROGRAMS {
            preloaded.remove(0);
        }
        preloaded.push((key, Arc::new(compiled)));
    }
}

/// The program a fork server loaded for this proc (AL-7), if it did, in
/// the engine of tier 0 this proc gets, whose epoch ticker it starts.
fn preloaded(params: &WasmSpawnParams, tier: usize) -> Option<Arc<Compiled>> {
    if tier != 0 {
        return None;
    }
    let key = program_key(&params.sha256, params.max_instances, params.debug_engine);
    let compiled = PRELOADED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, compiled)| compiled.clone())?;
    let (engine, _) = worker_engine(
        &compiled.program.needs,
        params.max_instances,
        0,
        params.debug_engine,
    )
    .ok()?;
    wasmtime::Engine::same(&engine, &compiled.engine).then_some(compiled)
}

/// Loads a program from the host's blob store, through the compile cache,
/// into this process's engine of tier `tier`. The blob is mapped, not
/// read: the proc keeps no copy of its bytes.
async fn load_program(
    args: &SpawnArgs,
    params: &WasmSpawnParams,
    tier: usize,
) -> Result<Arc<Compiled>, String> {
    let path = blob_path(&args.blob_dir, &params.sha256)?;
    if let Some(compiled) = preloaded(params, tier) {
        tracing::debug!(sha256 = %params.sha256, "the program, as the fork server loaded it");
        return Ok(compiled);
    }
    let instances = params.max_instances;
    let debug_engine = params.debug_engine;
    let sha256 = params.sha256.clone();
    let (engine, pre, needs) = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || {
            // The blob is named by its sha256, checked when it was stored:
            // mapped, parsed and linked once here, not hashed again.
            let bytes = engine::Mapped::open(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let footprint = engine::inspect_blob(&path, &bytes).map_err(|e| e.to_string())?;
            let (engine, linker) = worker_engine(&footprint.needs, instances, tier, debug_engine)?;
            let loaded = engine::load_inspected(&engine, &linker, &path, &bytes, footprint, sha256)
                .map_err(|e| e.to_string())?;
            drop(bytes);
            let pre = linker
                .instantiate_pre(&loaded.component)
                .and_then(ProgramPre::new)
                .map_err(|e| format!("the program does not fit this host: {e:#}"))?;
            Ok::<_, String>((engine, pre, loaded.footprint.needs))
        })
        .await
        .map_err(|e| format!("loading the program panicked: {e}"))??
    };
    Ok(Arc::new(Compiled {
        engine,
        pre,
        program: ProgramBytes::in_file(params.sha256.clone(), needs, path),
    }))
}

/// A log sink that sends each line to the controller whose events port is
/// `events`; one per port, made once.
fn log_to(
    sinks: &LogSinks,
    proc: &hyperactor::Proc,
    events: &PortRef<MeshEvent>,
) -> Result<LogSink, String> {
    let key = events.id().to_string();
    let mut sinks = sinks.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(sink) = sinks.get(&key) {
        return Ok(sink.clone());
    }
    let (mailbox, _undeliverable) = proc
        .attach(&format!("log{}", sinks.len()))
        .map_err(|e| format!("cannot attach the log mailbox: {e}"))?;
    let events = events.clone();
    let sink: LogSink = Arc::new(move |line: &str| {
        events.send(
            &mailbox,
            MeshEvent::Log {
                line: line.to_string(),
            },
        )
    });
    sinks.insert(key, sink.clone());
    Ok(sink)
}

#[cfg(test)]
mod tests {
    use super::{WORKER_MEMORY, prepare_forked_procs, tier_shape, tier_sizes, worker_engine};
    use crate::engine::{DEFAULT_MAX_INSTANCES, Needs, PoolShape};

    /// EP-1: a proc's engines start with a pool of 32 and grow to 256, then
    /// to `--max-instances`: the tiers add up to the flag, and a pool of 32
    /// or fewer is one tier.
    #[test]
    fn ep1_engine_tiers_start_small_and_add_up_to_the_limit() {
        assert_eq!(tier_sizes(1200), [32, 224, 944]);
        assert_eq!(tier_sizes(256), [32, 224]);
        assert_eq!(tier_sizes(40), [32, 8]);
        assert_eq!(tier_sizes(32), [32]);
        assert_eq!(tier_sizes(1), [1]);
        assert_eq!(tier_sizes(0), [1]);
        for max in [1, 2, 31, 33, 255, 257, 1200, 100_000] {
            assert_eq!(tier_sizes(max).iter().sum::<u32>(), max, "{max}");
        }
    }

    /// AL-6: the first tier's engine is the same for every program that
    /// fits the common shape, so that the one a fork server makes ahead is
    /// the one each forked proc's first actor uses; a program that does not
    /// fit, and the later tiers, get pools sized to the program.
    #[test]
    fn al6_the_first_tier_is_one_engine_made_before_the_program_is_known() {
        let rust = Needs {
            core_instances: 4,
            memories: 1,
            tables: 1,
            initial_memory: 1 << 20,
            initial_table: 100,
        };
        let python = Needs {
            core_instances: 14,
            memories: 2,
            tables: 4,
            ..rust
        };
        let huge = Needs {
            core_instances: 40,
            ..rust
        };
        let common = PoolShape::any_program(32, WORKER_MEMORY);
        assert_eq!(tier_shape(&rust, 32, 0), common);
        assert_eq!(tier_shape(&python, 32, 0), common);
        assert_eq!(
            tier_shape(&huge, 32, 0),
            PoolShape::for_program(&huge, 32, WORKER_MEMORY)
        );
        assert_eq!(
            tier_shape(&rust, 224, 1),
            PoolShape::for_program(&rust, 224, WORKER_MEMORY)
        );

        prepare_forked_procs();
        let made_ahead = worker_engine(&Needs::default(), DEFAULT_MAX_INSTANCES, 0, false).unwrap();
        for needs in [rust, python] {
            let (engine, linker) = worker_engine(&needs, DEFAULT_MAX_INSTANCES, 0, false).unwrap();
            assert!(wasmtime::Engine::same(&engine, &made_ahead.0));
            assert!(std::sync::Arc::ptr_eq(&linker, &made_ahead.1));
        }
        let (own, _) = worker_engine(&huge, DEFAULT_MAX_INSTANCES, 0, false).unwrap();
        assert!(!wasmtime::Engine::same(&own, &made_ahead.0));
        let pool = crate::engine::pool(&own).expect("a pooled engine");
        assert_eq!(pool.shape, PoolShape::for_program(&huge, 32, WORKER_MEMORY));
    }
}

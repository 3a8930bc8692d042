//! The host side of the WIT imports, for the controller and for actors.
//!
//! Every instance, controller or actor, has a [`HostState`]: its resource
//! table, its sandbox limits, the mailbox it sends from, and its event
//! queue. A request (`call`, `stream`...) returns its id at once; a task
//! makes the hyperactor calls, gathers or reduces the replies, and queues
//! exactly one final event for the id, which `next-events` hands over.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use hyperactor::{ActorHandle, ActorId, ActorRef, Mailbox, Proc};
use wasmtime::component::{HasSelf, Linker, Resource, ResourceTable};
use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::bindings::monarch::host::{logging, mesh, types};
use crate::bindings::{
    CallError, Dim, Event, EventKind, ProgramPre, Reducer, Reply, SliceDim, SupervisionFailure,
    ValueMesh,
};
use crate::engine::Sandbox;
use crate::mesh::{ActorMeshHandle, Member, ProcMeshHandle, extent_size, slice, validate_extent};
use crate::wasm_actor::{WasmActor, WasmCall};

/// Where log lines of guests go.
pub type LogSink = Arc<dyn Fn(&str) + Send + Sync>;

/// What every instance of one run shares: the engine, the compiled
/// program, the procs, and the actors spawned on them.
pub struct Cluster {
    pub(crate) engine: Engine,
    pub(crate) pre: ProgramPre<HostState>,
    pub(crate) sandbox: Sandbox,
    pub(crate) log: LogSink,
    pub(crate) deadline: Instant,
    run_id: String,
    procs: Mutex<Vec<Proc>>,
    actors: Mutex<HashMap<ActorId, ActorHandle<WasmActor>>>,
}

impl Cluster {
    pub(crate) fn new(
        engine: Engine,
        pre: ProgramPre<HostState>,
        sandbox: Sandbox,
        log: LogSink,
    ) -> Arc<Self> {
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        let deadline = Instant::now() + sandbox.deadline;
        Arc::new(Cluster {
            engine,
            pre,
            sandbox,
            log,
            deadline,
            run_id: format!(
                "run{}-{}",
                std::process::id(),
                RUNS.fetch_add(1, Ordering::Relaxed)
            ),
            procs: Mutex::new(Vec::new()),
            actors: Mutex::new(HashMap::new()),
        })
    }

    /// A proc for the controller to send from.
    pub(crate) async fn controller_proc(&self) -> anyhow::Result<Proc> {
        let addr = format!("local:{}-controller", self.run_id).parse()?;
        Ok(Proc::serve("controller", addr).await?)
    }

    async fn spawn_procs(&self, count: usize) -> Result<Vec<Proc>, String> {
        let start = {
            let procs = lock(&self.procs);
            if procs.len() + count > self.sandbox.max_procs {
                return Err(format!(
                    "the host allows {} procs (--procs) and {} are running; {count} more asked for",
                    self.sandbox.max_procs,
                    procs.len()
                ));
            }
            procs.len()
        };
        let mut spawned = Vec::with_capacity(count);
        for i in start..start + count {
            let addr = format!("local:{}-proc{i}", self.run_id)
                .parse()
                .map_err(|e| format!("{e}"))?;
            let proc = Proc::serve(&format!("proc{i}"), addr)
                .await
                .map_err(|e| format!("cannot start a proc: {e}"))?;
            spawned.push(proc);
        }
        lock(&self.procs).extend(spawned.iter().cloned());
        Ok(spawned)
    }

    fn stop_actors(&self, ids: impl Iterator<Item = ActorId>) {
        let actors = lock(&self.actors);
        for id in ids {
            if let Some(handle) = actors.get(&id) {
                handle.stop();
            }
        }
    }

    /// Stops every actor of the run.
    pub(crate) fn stop_all(&self) {
        for handle in lock(&self.actors).values() {
            handle.stop();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The host state of one instance.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
    cluster: Arc<Cluster>,
    mailbox: Mailbox,
    /// Events ready for `next-events`.
    ready: VecDeque<Event>,
    /// Requests with replies outstanding, by id.
    requests: HashMap<u64, Request>,
    /// One future per outstanding reply, polled by `next-events`.
    replies: FuturesUnordered<RankFuture>,
    next_request: u64,
    call_timeout: Duration,
    who: String,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// How long `next-events` polls for an event before it sleeps.
const EVENT_SPIN: Duration = Duration::from_micros(50);

/// The most bytes a guest may hand the host in one call (a message, a
/// name), as large as the biggest frame a proc sends.
const HOSTCALL_FUEL: usize = 64 << 20;

/// Resources one instance may hold at once.
const MAX_RESOURCES: usize = 10_000;

impl HostState {
    /// The state of an instance that sends from `mailbox` and logs as `who`.
    pub(crate) fn new(cluster: Arc<Cluster>, mailbox: Mailbox, who: String) -> Self {
        // Nothing is granted: no preopened directories, no environment, no
        // network. Output goes to the host's stdout and stderr.
        let wasi = WasiCtx::builder().inherit_stdout().inherit_stderr().build();
        let limits = StoreLimitsBuilder::new()
            .memory_size(cluster.sandbox.memory_bytes)
            .instances(64)
            .tables(64)
            .memories(16)
            .trap_on_grow_failure(true)
            .build();
        let call_timeout = cluster.sandbox.call_timeout;
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        HostState {
            wasi,
            table,
            limits,
            cluster,
            mailbox,
            ready: VecDeque::new(),
            requests: HashMap::new(),
            replies: FuturesUnordered::new(),
            next_request: 1,
            call_timeout,
            who,
        }
    }

    fn push<T: Send + 'static>(&mut self, value: T) -> wasmtime::Result<Resource<T>> {
        Ok(self.table.push(value)?)
    }

    fn request_id(&mut self) -> u64 {
        let id = self.next_request;
        self.next_request += 1;
        id
    }

    fn finish_now(&mut self, id: u64, kind: EventKind) {
        self.ready.push_back(Event { id, kind });
    }
}

/// A store for one instance, with the sandbox's limits and deadline.
pub(crate) fn new_store(cluster: &Arc<Cluster>, state: HostState) -> Store<HostState> {
    let mut store = Store::new(&cluster.engine, state);
    store.limiter(|state| &mut state.limits);
    store.set_hostcall_fuel(HOSTCALL_FUEL);
    let deadline = cluster.deadline;
    store.epoch_deadline_callback(move |_| {
        if Instant::now() >= deadline {
            wasmtime::bail!("the run's deadline passed while the guest was running (--timeout)");
        }
        Ok(UpdateDeadline::Yield(1))
    });
    store.set_epoch_deadline(1);
    store
}

/// The linker with WASI (nothing granted) and the monarch imports.
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    crate::bindings::Program::add_to_linker::<HostState, HasSelf<HostState>>(
        &mut linker,
        |state| state,
    )?;
    Ok(linker)
}

/// How a request treats replies.
#[derive(Clone, Copy)]
enum Mode {
    Gather,
    Reduce(Reducer),
    Single,
    Stream,
    Broadcast,
}

fn failure(mesh: &str, rank: u32, reason: String) -> SupervisionFailure {
    SupervisionFailure {
        mesh: mesh.to_string(),
        rank,
        reason,
    }
}

/// One rank's answer as the guest sees it.
fn outcome(
    mesh: &str,
    rank: u32,
    result: Result<Result<Vec<u8>, String>, hyperactor::CallError>,
) -> Result<Vec<u8>, CallError> {
    match result {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(message)) => Err(CallError::Endpoint((rank, message))),
        Err(hyperactor::CallError::Timeout(after)) => {
            Err(CallError::Timeout(after.as_millis() as u64))
        }
        Err(hyperactor::CallError::Supervision(event)) => {
            Err(CallError::Supervision(failure(mesh, rank, event.reason)))
        }
        Err(other) => Err(CallError::Supervision(failure(
            mesh,
            rank,
            other.to_string(),
        ))),
    }
}

fn reduce(reducer: Reducer, replies: Vec<(u32, Vec<u8>)>) -> Result<Vec<u8>, CallError> {
    fn word(rank: u32, bytes: &[u8], what: &str) -> Result<[u8; 8], CallError> {
        bytes.try_into().map_err(|_| {
            CallError::Invalid(format!(
                "rank {rank} replied {} bytes; {what} needs 8",
                bytes.len()
            ))
        })
    }
    let ints = |name| -> Result<Vec<i64>, CallError> {
        replies
            .iter()
            .map(|(rank, b)| word(*rank, b, name).map(i64::from_le_bytes))
            .collect()
    };
    let floats = |name| -> Result<Vec<f64>, CallError> {
        replies
            .iter()
            .map(|(rank, b)| word(*rank, b, name).map(f64::from_le_bytes))
            .collect()
    };
    let empty = || CallError::Invalid("nothing to reduce: the mesh is empty".into());
    Ok(match reducer {
        Reducer::SumI64 => ints("sum-i64")?
            .into_iter()
            .fold(0i64, i64::wrapping_add)
            .to_le_bytes()
            .to_vec(),
        Reducer::MinI64 => ints("min-i64")?
            .into_iter()
            .min()
            .ok_or_else(empty)?
            .to_le_bytes()
            .to_vec(),
        Reducer::MaxI64 => ints("max-i64")?
            .into_iter()
            .max()
            .ok_or_else(empty)?
            .to_le_bytes()
            .to_vec(),
        Reducer::SumF64 => floats("sum-f64")?
            .into_iter()
            .sum::<f64>()
            .to_le_bytes()
            .to_vec(),
        Reducer::MinF64 => floats("min-f64")?
            .into_iter()
            .reduce(f64::min)
            .ok_or_else(empty)?
            .to_le_bytes()
            .to_vec(),
        Reducer::MaxF64 => floats("max-f64")?
            .into_iter()
            .reduce(f64::max)
            .ok_or_else(empty)?
            .to_le_bytes()
            .to_vec(),
        Reducer::Concat => replies.into_iter().flat_map(|(_, b)| b).collect(),
    })
}

/// One rank's reply as it arrives.
struct RankDone {
    id: u64,
    position: usize,
    index: usize,
    rank: u32,
    result: Result<Result<Vec<u8>, String>, hyperactor::CallError>,
}

type RankFuture = Pin<Box<dyn Future<Output = RankDone> + Send>>;

/// A request whose replies are still coming.
struct Request {
    mode: Mode,
    mesh: String,
    extent: Vec<Dim>,
    remaining: usize,
    replies: Vec<Option<(u32, Vec<u8>)>>,
    first_error: Option<(usize, CallError)>,
    in_flight: Arc<Vec<AtomicUsize>>,
}

impl HostState {
    /// Sends a request to `members` of `mesh` now; its replies are gathered
    /// while the guest waits in `next-events`, on the guest's own task, so
    /// that a reply wakes the waiting guest directly.
    fn start(
        &mut self,
        mesh: &ActorMeshHandle,
        members: Vec<(usize, Member)>,
        endpoint: String,
        message: Vec<u8>,
        mode: Mode,
    ) -> u64 {
        let id = self.request_id();
        let timeout = self.call_timeout;
        for (position, (index, member)) in members.iter().cloned().enumerate() {
            mesh.in_flight[index].fetch_add(1, Ordering::Relaxed);
            let actor: ActorRef<WasmActor> = ActorRef::attest(member.actor);
            let reply = actor.start_call(&self.mailbox, |reply| WasmCall {
                endpoint: endpoint.clone(),
                message: message.clone(),
                reply,
            });
            self.replies.push(Box::pin(async move {
                RankDone {
                    id,
                    position,
                    index,
                    rank: member.rank,
                    result: reply.recv_timeout(timeout).await,
                }
            }));
        }
        let request = Request {
            mode,
            mesh: mesh.name.clone(),
            extent: mesh.extent.clone(),
            remaining: members.len(),
            replies: vec![None; members.len()],
            first_error: None,
            in_flight: mesh.in_flight.clone(),
        };
        if members.is_empty() {
            self.finish(id, request);
        } else {
            self.requests.insert(id, request);
        }
        id
    }

    /// Takes one rank's reply into its request.
    fn take_reply(&mut self, done: RankDone) {
        let Some(request) = self.requests.get_mut(&done.id) else {
            return;
        };
        request.in_flight[done.index].fetch_sub(1, Ordering::Relaxed);
        request.remaining -= 1;
        let result = outcome(&request.mesh, done.rank, done.result);
        match (request.mode, result) {
            (Mode::Stream, item) => {
                let kind = EventKind::Item((done.rank, item));
                self.ready.push_back(Event { id: done.id, kind });
            }
            (Mode::Broadcast, Err(error)) => {
                let reason = match error {
                    CallError::Supervision(f) => f.reason,
                    CallError::Endpoint((_, message)) => format!("endpoint error: {message}"),
                    CallError::Timeout(ms) => format!("no reply within {ms} ms"),
                    CallError::Invalid(message) => message,
                };
                let kind = EventKind::Failure(failure(&request.mesh, done.rank, reason));
                self.ready.push_back(Event { id: 0, kind });
            }
            (Mode::Broadcast, Ok(_)) => {}
            (_, Ok(bytes)) => request.replies[done.position] = Some((done.rank, bytes)),
            (_, Err(error)) => {
                if request
                    .first_error
                    .as_ref()
                    .is_none_or(|(p, _)| done.position < *p)
                {
                    request.first_error = Some((done.position, error));
                }
            }
        }
        if request.remaining == 0
            && let Some(request) = self.requests.remove(&done.id)
        {
            self.finish(done.id, request);
        }
    }

    /// Queues the final event of a request whose replies are all in.
    fn finish(&mut self, id: u64, request: Request) {
        let kind = match request.mode {
            Mode::Broadcast => return,
            Mode::Stream => EventKind::End,
            mode => match request.first_error {
                Some((_, error)) => EventKind::Done(Err(error)),
                None => {
                    let replies: Vec<(u32, Vec<u8>)> =
                        request.replies.into_iter().flatten().collect();
                    EventKind::Done(match mode {
                        Mode::Reduce(reducer) => reduce(reducer, replies).map(Reply::Single),
                        Mode::Single => replies
                            .into_iter()
                            .next()
                            .map(|(_, bytes)| Reply::Single(bytes))
                            .ok_or_else(|| CallError::Invalid("no actor to call".into())),
                        _ => Ok(Reply::Gathered(ValueMesh {
                            extent: request.extent,
                            values: replies.into_iter().map(|(_, bytes)| bytes).collect(),
                        })),
                    })
                }
            },
        };
        self.ready.push_back(Event { id, kind });
    }
}

impl types::Host for HostState {}

impl logging::Host for HostState {
    async fn log(&mut self, level: logging::Level, message: String) -> wasmtime::Result<()> {
        let line = format!("[{}] {message}", self.who);
        match level {
            logging::Level::Trace | logging::Level::Debug => {
                tracing::debug!(target: "guest", "{line}")
            }
            logging::Level::Info => (self.cluster.log)(&line),
            logging::Level::Warn => (self.cluster.log)(&format!("{line} (warning)")),
            logging::Level::Error => (self.cluster.log)(&format!("{line} (error)")),
        }
        Ok(())
    }
}

impl mesh::Host for HostState {
    async fn spawn_procs(
        &mut self,
        extent: Vec<Dim>,
    ) -> wasmtime::Result<Result<Resource<ProcMeshHandle>, String>> {
        if let Err(e) = validate_extent(&extent) {
            return Ok(Err(e));
        }
        let procs = match self.cluster.spawn_procs(extent_size(&extent)).await {
            Ok(procs) => procs,
            Err(e) => return Ok(Err(e)),
        };
        Ok(Ok(self.push(ProcMeshHandle { extent, procs })?))
    }

    async fn next_events(&mut self, max: u32, timeout_ms: u64) -> wasmtime::Result<Vec<Event>> {
        let max = max.clamp(1, 65_536) as usize;
        let now = Instant::now();
        if now >= self.cluster.deadline {
            wasmtime::bail!("the run's deadline passed (--timeout)");
        }
        let until = (now + Duration::from_millis(timeout_ms)).min(self.cluster.deadline);
        // Poll briefly before sleeping: a reply from an in-process actor
        // comes within microseconds, and waking a sleeping thread costs more.
        let spin_until = (now + EVENT_SPIN).min(until);
        while self.ready.is_empty() && !self.replies.is_empty() {
            let done = if Instant::now() < spin_until {
                match self.replies.next().now_or_never() {
                    Some(done) => done,
                    None => {
                        tokio::task::yield_now().await;
                        continue;
                    }
                }
            } else {
                match tokio::time::timeout_at(until.into(), self.replies.next()).await {
                    Ok(done) => done,
                    Err(_) => break,
                }
            };
            match done {
                Some(done) => self.take_reply(done),
                None => break,
            }
        }
        // Take whatever else has already arrived, without waiting.
        while self.ready.len() < max {
            match self.replies.next().now_or_never() {
                Some(Some(done)) => self.take_reply(done),
                _ => break,
            }
        }
        let count = self.ready.len().min(max);
        Ok(self.ready.drain(..count).collect())
    }

    async fn set_call_timeout(&mut self, timeout_ms: u64) -> wasmtime::Result<()> {
        self.call_timeout = Duration::from_millis(timeout_ms.max(1));
        Ok(())
    }
}

impl mesh::HostProcMesh for HostState {
    async fn extent(&mut self, this: Resource<ProcMeshHandle>) -> wasmtime::Result<Vec<Dim>> {
        Ok(self.table.get(&this)?.extent.clone())
    }

    async fn slice(
        &mut self,
        this: Resource<ProcMeshHandle>,
        dims: Vec<SliceDim>,
    ) -> wasmtime::Result<Result<Resource<ProcMeshHandle>, String>> {
        let mesh = self.table.get(&this)?;
        let sliced = slice(&mesh.extent, &mesh.procs, &dims);
        match sliced {
            Ok((extent, procs)) => Ok(Ok(self.push(ProcMeshHandle { extent, procs })?)),
            Err(e) => Ok(Err(e)),
        }
    }

    async fn spawn(
        &mut self,
        this: Resource<ProcMeshHandle>,
        name: String,
        class: String,
        init: Vec<u8>,
    ) -> wasmtime::Result<Result<Resource<ActorMeshHandle>, String>> {
        if let Err(e) = hyperactor::id::validate_name(&name) {
            return Ok(Err(e.to_string()));
        }
        let (extent, procs) = {
            let mesh = self.table.get(&this)?;
            (mesh.extent.clone(), mesh.procs.clone())
        };
        let mut handles = Vec::with_capacity(procs.len());
        for (rank, proc) in procs.iter().enumerate() {
            let actor = WasmActor::new(
                self.cluster.clone(),
                name.clone(),
                class.clone(),
                init.clone(),
                rank as u32,
                extent.clone(),
            );
            match proc.spawn(&name, rank as u32, actor) {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    for handle in &handles {
                        handle.stop();
                    }
                    return Ok(Err(format!("cannot spawn `{name}`: {e}")));
                }
            }
        }
        // Every actor runs `create` in parallel; wait for all of them.
        let started = futures::future::join_all(handles.iter().map(|h| h.started())).await;
        for (rank, status) in started.into_iter().enumerate() {
            if let hyperactor::ActorStatus::Failed(event) = status {
                for handle in &handles {
                    handle.stop();
                }
                return Ok(Err(format!(
                    "{name}[{rank}] of class `{class}` did not start: {}",
                    event.reason
                )));
            }
        }
        let members = handles
            .iter()
            .enumerate()
            .map(|(rank, handle)| Member {
                actor: handle.actor_id().clone(),
                rank: rank as u32,
            })
            .collect();
        {
            let mut actors = lock(&self.cluster.actors);
            for handle in handles {
                actors.insert(handle.actor_id().clone(), handle);
            }
        }
        Ok(Ok(self.push(ActorMeshHandle::new(name, extent, members))?))
    }

    async fn stop(&mut self, this: Resource<ProcMeshHandle>) -> wasmtime::Result<()> {
        let procs: Vec<hyperactor::ProcId> = self
            .table
            .get(&this)?
            .procs
            .iter()
            .map(|p| p.id().clone())
            .collect();
        let on_procs: Vec<ActorId> = lock(&self.cluster.actors)
            .keys()
            .filter(|id| procs.contains(id.proc_id()))
            .cloned()
            .collect();
        self.cluster.stop_actors(on_procs.into_iter());
        Ok(())
    }

    async fn drop(&mut self, this: Resource<ProcMeshHandle>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl mesh::HostActorMesh for HostState {
    async fn name(&mut self, this: Resource<ActorMeshHandle>) -> wasmtime::Result<String> {
        Ok(self.table.get(&this)?.name.clone())
    }

    async fn extent(&mut self, this: Resource<ActorMeshHandle>) -> wasmtime::Result<Vec<Dim>> {
        Ok(self.table.get(&this)?.extent.clone())
    }

    async fn slice(
        &mut self,
        this: Resource<ActorMeshHandle>,
        dims: Vec<SliceDim>,
    ) -> wasmtime::Result<Result<Resource<ActorMeshHandle>, String>> {
        let mesh = self.table.get(&this)?;
        match slice(&mesh.extent, &mesh.members, &dims) {
            Ok((extent, members)) => {
                let sliced = ActorMeshHandle::new(mesh.name.clone(), extent, members);
                Ok(Ok(self.push(sliced)?))
            }
            Err(e) => Ok(Err(e)),
        }
    }

    async fn call(
        &mut self,
        this: Resource<ActorMeshHandle>,
        endpoint: String,
        message: Vec<u8>,
        reduce: Option<Reducer>,
    ) -> wasmtime::Result<u64> {
        let mode = reduce.map_or(Mode::Gather, Mode::Reduce);
        self.request(this, endpoint, message, mode, |members| {
            Ok(members.iter().cloned().enumerate().collect())
        })
    }

    async fn call_one(
        &mut self,
        this: Resource<ActorMeshHandle>,
        endpoint: String,
        message: Vec<u8>,
    ) -> wasmtime::Result<u64> {
        self.request(this, endpoint, message, Mode::Single, |members| {
            if members.len() == 1 {
                Ok(vec![(0, members[0].clone())])
            } else {
                Err(format!(
                    "call-one needs a mesh of exactly one actor; this one has {}",
                    members.len()
                ))
            }
        })
    }

    async fn choose(
        &mut self,
        this: Resource<ActorMeshHandle>,
        endpoint: String,
        message: Vec<u8>,
    ) -> wasmtime::Result<u64> {
        let in_flight = self.table.get(&this)?.in_flight.clone();
        self.request(this, endpoint, message, Mode::Single, move |members| {
            let index = (0..members.len())
                .min_by_key(|&i| in_flight[i].load(Ordering::Relaxed))
                .ok_or_else(|| "choose needs a mesh with at least one actor".to_string())?;
            Ok(vec![(index, members[index].clone())])
        })
    }

    async fn stream(
        &mut self,
        this: Resource<ActorMeshHandle>,
        endpoint: String,
        message: Vec<u8>,
    ) -> wasmtime::Result<u64> {
        self.request(this, endpoint, message, Mode::Stream, |members| {
            Ok(members.iter().cloned().enumerate().collect())
        })
    }

    async fn broadcast(
        &mut self,
        this: Resource<ActorMeshHandle>,
        endpoint: String,
        message: Vec<u8>,
    ) -> wasmtime::Result<()> {
        self.request(this, endpoint, message, Mode::Broadcast, |members| {
            Ok(members.iter().cloned().enumerate().collect())
        })?;
        Ok(())
    }

    async fn stop(&mut self, this: Resource<ActorMeshHandle>) -> wasmtime::Result<()> {
        let ids: Vec<ActorId> = self
            .table
            .get(&this)?
            .members
            .iter()
            .map(|m| m.actor.clone())
            .collect();
        self.cluster.stop_actors(ids.into_iter());
        Ok(())
    }

    async fn to_ref(&mut self, this: Resource<ActorMeshHandle>) -> wasmtime::Result<Vec<u8>> {
        Ok(self.table.get(&this)?.to_ref())
    }

    async fn from_ref(
        &mut self,
        reference: Vec<u8>,
    ) -> wasmtime::Result<Result<Resource<ActorMeshHandle>, String>> {
        match ActorMeshHandle::from_ref(&reference) {
            Ok(mesh) => Ok(Ok(self.push(mesh)?)),
            Err(e) => Ok(Err(e)),
        }
    }

    async fn drop(&mut self, this: Resource<ActorMeshHandle>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl HostState {
    fn request(
        &mut self,
        this: Resource<ActorMeshHandle>,
        endpoint: String,
        message: Vec<u8>,
        mode: Mode,
        select: impl FnOnce(&[Member]) -> Result<Vec<(usize, Member)>, String>,
    ) -> wasmtime::Result<u64> {
        let mesh = self.table.get(&this)?.clone();
        match select(&mesh.members) {
            Ok(members) => Ok(self.start(&mesh, members, endpoint, message, mode)),
            Err(reason) => {
                let id = self.request_id();
                self.finish_now(id, EventKind::Done(Err(CallError::Invalid(reason))));
                Ok(id)
            }
        }
    }
}

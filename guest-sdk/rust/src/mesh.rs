//! Meshes: [`ProcMesh`] (procs arranged in an extent) and [`ActorMesh`]
//! (actors of a class on the procs of a proc mesh: one on every proc, or
//! several with [`ProcMesh::spawn_with`]), and the ways to call an actor
//! mesh.
//!
//! Which call to make:
//!
//! | method | reaches | returns |
//! | --- | --- | --- |
//! | [`ActorMesh::call`] | every actor | a [`ValueMesh`] of replies in rank order |
//! | [`ActorMesh::sum_i64`] and the other reducers | every actor | one value, reduced by the host on the way back |
//! | [`ActorMesh::concat`] | every actor | the replies joined in rank order, without the extent |
//! | [`ActorMesh::call_one`] | the one actor of a single-actor mesh | its reply |
//! | [`ActorMesh::choose`] | the actor with the fewest calls in flight | its reply |
//! | [`ActorMesh::stream`] | every actor | each rank's reply as it arrives |
//! | [`ActorMesh::broadcast`] | every actor | only an error known at once; an actor's failure becomes a failure event ([`supervise`](crate::supervise), [`next_failure`](crate::next_failure)) |
//!
//! Each method sends the request before it returns. Handles are cheap to
//! clone: clones name the same mesh.
//!
//! # Deadlines
//!
//! Two limits apply to a request: the *call timeout*, how long the caller
//! waits for a reply (kind [`Timeout`](crate::ErrorKind::Timeout); the actor
//! lives on), and the *handler deadline*, how long an actor's handler may
//! run before it is interrupted and the actor fails (kind
//! [`Deadline`](crate::ErrorKind::Deadline)). Set them for a mesh when it is
//! spawned ([`SpawnOptions::handler_timeout`]), for every request from now
//! on ([`set_call_timeout`], [`set_handler_timeout`]), or for the requests
//! of one handle ([`ActorMesh::with_call_timeout`],
//! [`ActorMesh::with_handler_timeout`]):
//!
//! ```
//! # use monarch_guest::prelude::*;
//! # use serde::{Deserialize, Serialize};
//! # #[derive(Serialize, Deserialize)] struct Step;
//! # impl Message for Step { const ENDPOINT: &'static str = "step"; type Reply = (); }
//! # struct Worker;
//! # impl Actor for Worker {
//! #     const CLASS: &'static str = "Worker";
//! #     type Init = ();
//! #     fn create((): (), _cx: &Context) -> Result<Self, String> { Ok(Worker) }
//! #     fn endpoints(endpoints: &mut Endpoints<Self>) { endpoints.handle::<Step>(); }
//! # }
//! # impl Handler<Step> for Worker {
//! #     async fn handle(&mut self, _cx: &Context, _: Step) -> Result<(), EndpointError> { Ok(()) }
//! # }
//! use std::time::Duration;
//! use monarch_guest::SpawnOptions;
//!
//! # async fn example() -> Result<(), String> {
//! let procs = spawn_procs(&extent!(procs = 2))?;
//! let options = SpawnOptions::new().handler_timeout(Duration::from_secs(10));
//! let workers = procs.spawn_with::<Worker>("workers", &(), options)?;
//! workers.call(&Step).await?; // each handler gets 10 s
//! workers
//!     .with_handler_timeout(Duration::from_millis(300))
//!     .call(&Step)
//!     .await?; // this one request's handlers get 300 ms
//! # Ok(()) }
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::rc::Rc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::actor::{Actor, Handler, Message};
use crate::bindings::monarch::host::mesh as wit_mesh;
use crate::bindings::monarch::host::types as wit;
use crate::call::{self, Call, CallStream};
use crate::executor::with_reactor;
use crate::extent::to_wit_slice;
use crate::{CallError, Extent, MeshError, SliceDim, ValueMesh, codec};

/// Spawns procs in the shape `extent` on the host's allocator.
///
/// ```
/// # async fn example() -> Result<(), monarch_guest::MeshError> {
/// let procs = monarch_guest::spawn_procs(&monarch_guest::extent!(hosts = 1, gpus = 4))?;
/// # Ok(()) }
/// ```
pub fn spawn_procs(extent: &Extent) -> Result<ProcMesh, MeshError> {
    wit_mesh::spawn_procs(&wit::Extent::from(extent))
        .map(|raw| ProcMesh { raw: Rc::new(raw) })
        .map_err(|e| MeshError::new(format!("spawning procs ({extent})"), e))
}

/// The persistent actor mesh `name` ([`ProcMesh::spawn_persistent`]),
/// spawned by an earlier job or session of this server. Fails when there
/// is none of that name, or no server (`monarch-host run`). As with
/// [`ActorMesh::from_ref`], the class is not checked: calls to actors of
/// another class fail at the actors.
pub fn lookup_actor_mesh<A: Actor>(name: &str) -> Result<ActorMesh<A>, MeshError> {
    wit_mesh::lookup_actor_mesh(name)
        .map(ActorMesh::from_raw)
        .map_err(|e| {
            MeshError::new(
                format!(
                    "looking up the persistent actor mesh `{name}` ({})",
                    A::CLASS
                ),
                e,
            )
        })
}

/// Sets the timeout for the requests made from now on. A request with no
/// reply by then ends with a [`CallError`] of kind
/// [`Timeout`](crate::ErrorKind::Timeout). Until it is set, the host's
/// default applies (`monarch-host run --call-timeout`, 60 s unless given).
pub fn set_call_timeout(timeout: Duration) {
    with_reactor(|r| r.call_timeout = Some(timeout));
    wit_mesh::set_call_timeout(Some(millis(timeout)));
}

/// Sets the handler deadline of the requests made from now on: each
/// actor's handler for them must finish within it, or it is interrupted
/// and the actor fails with kind [`Deadline`](crate::ErrorKind::Deadline).
/// `None` leaves it to each mesh ([`SpawnOptions::handler_timeout`], else
/// the host's default).
pub fn set_handler_timeout(timeout: Option<Duration>) {
    with_reactor(|r| r.handler_timeout = timeout);
    wit_mesh::set_handler_timeout(timeout.map(millis));
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How an actor mesh is spawned ([`ProcMesh::spawn_with`]): actors per
/// proc, and a handler deadline.
///
/// ```
/// use std::time::Duration;
/// use monarch_guest::{SpawnOptions, extent};
///
/// let options = SpawnOptions::new()
///     .per_proc(extent!(gpus = 8))
///     .handler_timeout(Duration::from_secs(30));
/// assert_eq!(options.per_proc, extent!(gpus = 8));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpawnOptions {
    /// Actors on each proc, as an extent appended to the proc mesh's (with
    /// names of its own). Empty: one actor per proc.
    pub per_proc: Extent,
    /// The most time one handler (`create`, a message, `supervise`) may
    /// take; past it the handler is interrupted and the actor fails with
    /// kind [`Deadline`](crate::ErrorKind::Deadline). `None`: the host's
    /// default (`monarch-host run --handler-timeout`, none unless given).
    pub handler_timeout: Option<Duration>,
}

impl SpawnOptions {
    /// One actor per proc, the host's handler deadline.
    pub fn new() -> Self {
        Self::default()
    }

    /// An actor for every point of `per_proc` on every proc.
    pub fn per_proc(mut self, per_proc: Extent) -> Self {
        self.per_proc = per_proc;
        self
    }

    /// A handler deadline for every actor of the mesh.
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.handler_timeout = Some(timeout);
        self
    }
}

impl From<&SpawnOptions> for wit::SpawnOptions {
    fn from(o: &SpawnOptions) -> Self {
        Self {
            per_proc: (&o.per_proc).into(),
            handler_timeout_ms: o.handler_timeout.map(millis),
        }
    }
}

/// What is known of one proc of a proc mesh ([`ProcMesh::info`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    /// The proc's rank in the proc mesh.
    pub rank: u32,
    /// The proc's id (`name@address`).
    pub id: String,
    /// The host it runs on: the agent's address, or `local`.
    pub host: String,
    /// Its OS process id, when it has a process of its own.
    pub pid: Option<u32>,
    /// Whether it runs.
    pub state: ProcState,
}

/// Whether a proc runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcState {
    /// Running.
    Running,
    /// Stopped by its owner.
    Stopped,
    /// It exited, was killed, or its host was lost: why.
    Failed(String),
}

impl ProcState {
    /// `running`, `stopped` or `failed`.
    pub fn name(&self) -> &'static str {
        match self {
            ProcState::Running => "running",
            ProcState::Stopped => "stopped",
            ProcState::Failed(_) => "failed",
        }
    }
}

impl fmt::Display for ProcState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProcState::Failed(why) => write!(f, "failed: {why}"),
            other => f.write_str(other.name()),
        }
    }
}

impl From<wit::ProcInfo> for ProcInfo {
    fn from(p: wit::ProcInfo) -> Self {
        Self {
            rank: p.rank,
            id: p.id,
            host: p.host,
            pid: p.pid,
            state: match p.state {
                wit::ProcState::Running => ProcState::Running,
                wit::ProcState::Stopped => ProcState::Stopped,
                wit::ProcState::Failed(why) => ProcState::Failed(why),
            },
        }
    }
}

/// Procs arranged in an extent. Actors are spawned on them.
#[derive(Clone)]
pub struct ProcMesh {
    raw: Rc<wit_mesh::ProcMesh>,
}

impl ProcMesh {
    /// The WIT resource, for the other interfaces that take a proc mesh.
    pub(crate) fn raw(&self) -> &wit_mesh::ProcMesh {
        &self.raw
    }

    /// The mesh's shape.
    pub fn extent(&self) -> Extent {
        self.raw.extent().into()
    }

    /// A sub-mesh; see [`SliceDim`].
    pub fn slice(&self, dims: &[SliceDim]) -> Result<ProcMesh, MeshError> {
        self.raw
            .slice(&to_wit_slice(dims))
            .map(|raw| ProcMesh { raw: Rc::new(raw) })
            .map_err(|e| MeshError::new("slicing a proc mesh", e))
    }

    /// Spawns an actor of class `A` on every proc, each made by
    /// [`Actor::create`] from `init`. `name` names the new mesh in logs and
    /// failures.
    pub fn spawn<A: Actor>(&self, name: &str, init: &A::Init) -> Result<ActorMesh<A>, MeshError> {
        let what = || format!("spawning `{name}` (class {})", A::CLASS);
        let init = codec::encode_args(init).map_err(|e| MeshError::new(what(), e.to_string()))?;
        self.raw
            .spawn(name, A::CLASS, &init)
            .map(ActorMesh::from_raw)
            .map_err(|e| MeshError::new(what(), e))
    }

    /// Like [`spawn`](Self::spawn), with [`SpawnOptions`]: several actors
    /// per proc, a handler deadline.
    ///
    /// With a `per_proc` extent, there is an actor for every point of it on
    /// every proc (one per GPU of a host proc, say). The new mesh's extent
    /// is this mesh's dimensions followed by `per_proc`'s, whose names must
    /// differ from this mesh's. Ranks stay row-major, so the actors of one
    /// proc hold consecutive ranks: on procs `procs=2`, a `per_proc` of
    /// `workers=4` makes the mesh `procs=2, workers=4`, whose ranks 0..4
    /// live on the first proc and 4..8 on the second. Each actor's
    /// [`Context::extent`] and [`Context::rank`] are this whole extent and
    /// its rank in it.
    ///
    /// ```
    /// # use monarch_guest::prelude::*;
    /// # struct Worker;
    /// # impl Actor for Worker {
    /// #     const CLASS: &'static str = "Worker";
    /// #     type Init = ();
    /// #     fn create((): (), _cx: &Context) -> Result<Self, String> { Ok(Worker) }
    /// #     fn endpoints(_endpoints: &mut Endpoints<Self>) {}
    /// # }
    /// # fn example() -> Result<(), monarch_guest::MeshError> {
    /// use std::time::Duration;
    /// use monarch_guest::SpawnOptions;
    ///
    /// let procs = spawn_procs(&extent!(procs = 2))?;
    /// let options = SpawnOptions::new()
    ///     .per_proc(extent!(workers = 4))
    ///     .handler_timeout(Duration::from_secs(5));
    /// let workers = procs.spawn_with::<Worker>("workers", &(), options)?;
    /// assert_eq!(workers.extent(), extent!(procs = 2, workers = 4));
    /// # Ok(()) }
    /// ```
    ///
    /// [`Context::extent`]: crate::Context::extent
    /// [`Context::rank`]: crate::Context::rank
    pub fn spawn_with<A: Actor>(
        &self,
        name: &str,
        init: &A::Init,
        options: SpawnOptions,
    ) -> Result<ActorMesh<A>, MeshError> {
        let what = || {
            let mut what = format!("spawning `{name}` (class {}", A::CLASS);
            if !options.per_proc.dims().is_empty() {
                what += &format!(", {} per proc", options.per_proc);
            }
            if let Some(timeout) = options.handler_timeout {
                what += &format!(", handler deadline {} ms", timeout.as_millis());
            }
            what + ")"
        };
        let init = codec::encode_args(init).map_err(|e| MeshError::new(what(), e.to_string()))?;
        self.raw
            .spawn_with(name, A::CLASS, &init, &wit::SpawnOptions::from(&options))
            .map(ActorMesh::from_raw)
            .map_err(|e| MeshError::new(what(), e))
    }

    /// Spawns a persistent actor mesh: one that belongs to the server
    /// (`monarch-host serve`), not to this job or session. It outlives
    /// them; any later job or session finds it with
    /// [`lookup_actor_mesh`], and only `DELETE /v1/meshes/NAME` (or the
    /// server's stop) stops it. Its failures are logged and reported by
    /// the server (`GET /v1/meshes`); they fail no job.
    ///
    /// The procs must outlive this program too: those of a server's
    /// persistent mesh (a job submitted with `--mesh NAME`). A name in use
    /// fails, naming [`respawn`](Self::respawn). `name` is 1 to 64
    /// letters, digits, `-` and `_`.
    ///
    /// ```no_run
    /// # use monarch_guest::prelude::*;
    /// # struct Counter;
    /// # impl Actor for Counter {
    /// #     const CLASS: &'static str = "Counter";
    /// #     type Init = i64;
    /// #     fn create(_: i64, _cx: &Context) -> Result<Self, String> { Ok(Counter) }
    /// #     fn endpoints(_endpoints: &mut Endpoints<Self>) {}
    /// # }
    /// # fn example() -> Result<(), monarch_guest::MeshError> {
    /// let procs = spawn_procs(&extent!(procs = 1))?;
    /// let counter = procs.spawn_persistent::<Counter>("counter", &0)?;
    /// // A later job:
    /// let counter = monarch_guest::lookup_actor_mesh::<Counter>("counter")?;
    /// # Ok(()) }
    /// ```
    pub fn spawn_persistent<A: Actor>(
        &self,
        name: &str,
        init: &A::Init,
    ) -> Result<ActorMesh<A>, MeshError> {
        self.spawn_persistent_with(name, init, SpawnOptions::new(), false)
    }

    /// Like [`spawn_persistent`](Self::spawn_persistent), replacing the
    /// persistent actor mesh `name` if there is one: it is stopped first,
    /// and its actors' state is lost (the host logs so).
    pub fn respawn<A: Actor>(&self, name: &str, init: &A::Init) -> Result<ActorMesh<A>, MeshError> {
        self.spawn_persistent_with(name, init, SpawnOptions::new(), true)
    }

    /// [`spawn_persistent`](Self::spawn_persistent) with
    /// [`SpawnOptions`]; with `replace`, [`respawn`](Self::respawn).
    pub fn spawn_persistent_with<A: Actor>(
        &self,
        name: &str,
        init: &A::Init,
        options: SpawnOptions,
        replace: bool,
    ) -> Result<ActorMesh<A>, MeshError> {
        let verb = if replace { "respawning" } else { "spawning" };
        let what = || format!("{verb} the persistent `{name}` (class {})", A::CLASS);
        let init = codec::encode_args(init).map_err(|e| MeshError::new(what(), e.to_string()))?;
        self.raw
            .spawn_persistent(
                name,
                A::CLASS,
                &init,
                &wit::SpawnOptions::from(&options),
                replace,
            )
            .map(ActorMesh::from_raw)
            .map_err(|e| MeshError::new(what(), e))
    }

    /// [`spawn_with`](Self::spawn_with) with only
    /// [`per_proc`](SpawnOptions::per_proc) set: an actor for every point
    /// of `per_proc` on every proc.
    pub fn spawn_many<A: Actor>(
        &self,
        name: &str,
        init: &A::Init,
        per_proc: &Extent,
    ) -> Result<ActorMesh<A>, MeshError> {
        self.spawn_with(name, init, SpawnOptions::new().per_proc(per_proc.clone()))
    }

    /// Each proc's id, host, OS process id and state, in rank order.
    pub fn info(&self) -> Vec<ProcInfo> {
        self.raw.info().into_iter().map(ProcInfo::from).collect()
    }

    /// Sends `signal` (9 for SIGKILL, 15 for SIGTERM...) to the process of
    /// the proc at `rank`, to test a program's own fault handling: its
    /// actors fail with kind [`ProcLost`](crate::ErrorKind::ProcLost). Only
    /// procs this program started may be killed (not a persistent mesh's);
    /// a proc inside the host's process crashes instead, reported killed by
    /// that signal.
    pub fn kill(&self, rank: u32, signal: i32) -> Result<(), MeshError> {
        self.raw
            .kill(rank, signal)
            .map_err(|e| MeshError::new(format!("killing proc {rank} with signal {signal}"), e))
    }

    /// Stops the procs and every actor on them; requests to those actors
    /// fail at once with kind [`Stopped`](crate::ErrorKind::Stopped).
    pub fn stop(&self) {
        self.raw.stop();
    }
}

impl fmt::Debug for ProcMesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcMesh")
            .field("handle", &self.raw.handle())
            .finish()
    }
}

/// A host-native reducer: how the host combines the replies of a `call`.
///
/// The numeric ones read every reply as one number (a CBOR integer for the
/// `i64` ones; a float or an integer for the `f64` ones, see
/// `wit/ENCODING.md`), which is how the SDK encodes a reply of type `i64`
/// or `f64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reducer {
    /// Sum of `i64` replies.
    SumI64,
    /// Minimum of `i64` replies.
    MinI64,
    /// Maximum of `i64` replies.
    MaxI64,
    /// Sum of `f64` replies.
    SumF64,
    /// Minimum of `f64` replies.
    MinF64,
    /// Maximum of `f64` replies.
    MaxF64,
    /// The replies joined in rank order: a CBOR sequence.
    Concat,
}

impl From<Reducer> for wit::Reducer {
    fn from(r: Reducer) -> Self {
        match r {
            Reducer::SumI64 => wit::Reducer::SumI64,
            Reducer::MinI64 => wit::Reducer::MinI64,
            Reducer::MaxI64 => wit::Reducer::MaxI64,
            Reducer::SumF64 => wit::Reducer::SumF64,
            Reducer::MinF64 => wit::Reducer::MinF64,
            Reducer::MaxF64 => wit::Reducer::MaxF64,
            Reducer::Concat => wit::Reducer::Concat,
        }
    }
}

/// Actors of class `A` arranged in an extent: one per proc of the mesh they
/// were spawned on ([`ProcMesh::spawn`]), or one per point of a per-proc
/// extent on every proc ([`ProcMesh::spawn_with`]).
///
/// The call methods accept only the messages `A` handles (`A: Handler<M>`),
/// and decode replies as `M::Reply`.
pub struct ActorMesh<A> {
    raw: Rc<wit_mesh::ActorMesh>,
    /// Overrides for the requests made through this handle.
    options: CallOptions,
    class: PhantomData<fn() -> A>,
}

/// Per-handle overrides of the call timeout and handler deadline (see
/// [`ActorMesh::with_call_timeout`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct CallOptions {
    call_timeout: Option<Duration>,
    handler_timeout: Option<Duration>,
}

impl CallOptions {
    /// Makes one request with these overrides: sets them, runs `request`
    /// (which sends it), and restores the program's own values at once, so
    /// that later requests are not affected.
    fn around<R>(self, request: impl FnOnce() -> R) -> R {
        if self == CallOptions::default() {
            return request();
        }
        let (call_before, handler_before) = with_reactor(|r| (r.call_timeout, r.handler_timeout));
        if let Some(timeout) = self.call_timeout {
            wit_mesh::set_call_timeout(Some(millis(timeout)));
        }
        if let Some(timeout) = self.handler_timeout {
            wit_mesh::set_handler_timeout(Some(millis(timeout)));
        }
        let sent = request();
        if self.call_timeout.is_some() {
            // None puts back the host's own default (`--call-timeout`).
            wit_mesh::set_call_timeout(call_before.map(millis));
        }
        if self.handler_timeout.is_some() {
            wit_mesh::set_handler_timeout(handler_before.map(millis));
        }
        sent
    }
}

impl<A> Clone for ActorMesh<A> {
    fn clone(&self) -> Self {
        Self {
            raw: self.raw.clone(),
            options: self.options,
            class: PhantomData,
        }
    }
}

impl<A: Actor> fmt::Debug for ActorMesh<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActorMesh")
            .field("class", &A::CLASS)
            .field("handle", &self.raw.handle())
            .finish()
    }
}

impl<A: Actor> ActorMesh<A> {
    fn from_raw(raw: wit_mesh::ActorMesh) -> Self {
        Self {
            raw: Rc::new(raw),
            options: CallOptions::default(),
            class: PhantomData,
        }
    }

    /// A handle to the same mesh whose requests wait at most `timeout` for
    /// a reply (kind [`Timeout`](crate::ErrorKind::Timeout) after it),
    /// whatever [`set_call_timeout`] says. Other handles are unaffected.
    pub fn with_call_timeout(&self, timeout: Duration) -> Self {
        let mut mesh = self.clone();
        mesh.options.call_timeout = Some(timeout);
        mesh
    }

    /// A handle to the same mesh whose requests give each actor's handler
    /// at most `timeout` (kind [`Deadline`](crate::ErrorKind::Deadline),
    /// and the actor fails, after it), whatever the mesh's
    /// [`SpawnOptions::handler_timeout`] or [`set_handler_timeout`] say.
    /// Other handles are unaffected.
    ///
    /// ```
    /// # use monarch_guest::prelude::*;
    /// # use serde::{Deserialize, Serialize};
    /// # #[derive(Serialize, Deserialize)] struct Step;
    /// # impl Message for Step { const ENDPOINT: &'static str = "step"; type Reply = (); }
    /// # struct Worker;
    /// # impl Actor for Worker {
    /// #     const CLASS: &'static str = "Worker";
    /// #     type Init = ();
    /// #     fn create((): (), _cx: &Context) -> Result<Self, String> { Ok(Worker) }
    /// #     fn endpoints(endpoints: &mut Endpoints<Self>) { endpoints.handle::<Step>(); }
    /// # }
    /// # impl Handler<Step> for Worker {
    /// #     async fn handle(&mut self, _cx: &Context, _: Step) -> Result<(), EndpointError> { Ok(()) }
    /// # }
    /// # async fn example(workers: ActorMesh<Worker>) -> Result<(), CallError> {
    /// use std::time::Duration;
    /// let quick = workers.with_handler_timeout(Duration::from_millis(300));
    /// quick.call(&Step).await?;
    /// # Ok(()) }
    /// ```
    pub fn with_handler_timeout(&self, timeout: Duration) -> Self {
        let mut mesh = self.clone();
        mesh.options.handler_timeout = Some(timeout);
        mesh
    }

    /// The mesh's name.
    pub fn name(&self) -> String {
        self.raw.name()
    }

    /// The mesh's shape.
    pub fn extent(&self) -> Extent {
        self.raw.extent().into()
    }

    /// How many actors the mesh holds.
    pub fn len(&self) -> usize {
        self.extent().num_ranks()
    }

    /// Whether the mesh holds no actors.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A sub-mesh; see [`SliceDim`]. A slice sees its parent's failures.
    /// A slice keeps this handle's overrides
    /// ([`with_handler_timeout`](Self::with_handler_timeout)...).
    pub fn slice(&self, dims: &[SliceDim]) -> Result<ActorMesh<A>, MeshError> {
        let options = self.options;
        self.raw
            .slice(&to_wit_slice(dims))
            .map(|raw| ActorMesh {
                options,
                ..Self::from_raw(raw)
            })
            .map_err(|e| MeshError::new(format!("slicing `{}`", self.name()), e))
    }

    /// The sub-mesh at `index` of dimension `dim`, without that dimension:
    /// `counters.at("procs", 2)?` is the single actor at rank 2 of a
    /// one-dimensional mesh.
    pub fn at(&self, dim: &str, index: u32) -> Result<ActorMesh<A>, MeshError> {
        self.slice(&[SliceDim::index(dim, index)])
    }

    /// Calls `M`'s endpoint on every actor; the replies come back in rank
    /// order.
    pub fn call<M: Message>(&self, message: &M) -> Call<ValueMesh<M::Reply>>
    where
        A: Handler<M>,
    {
        match encode_message(message) {
            Ok(bytes) => Call::in_flight(
                self.options
                    .around(|| self.raw.call(M::ENDPOINT, &bytes, None)),
                call::decode_gathered::<M::Reply>,
            ),
            Err(e) => Call::refused(e),
        }
    }

    /// Calls `M`'s endpoint on every actor and sums the replies in the host.
    pub fn sum_i64<M: Message<Reply = i64>>(&self, message: &M) -> Call<i64>
    where
        A: Handler<M>,
    {
        self.reduced(message, Reducer::SumI64, call::decode_single::<i64>)
    }

    /// Like [`sum_i64`](Self::sum_i64), for the smallest reply.
    pub fn min_i64<M: Message<Reply = i64>>(&self, message: &M) -> Call<i64>
    where
        A: Handler<M>,
    {
        self.reduced(message, Reducer::MinI64, call::decode_single::<i64>)
    }

    /// Like [`sum_i64`](Self::sum_i64), for the largest reply.
    pub fn max_i64<M: Message<Reply = i64>>(&self, message: &M) -> Call<i64>
    where
        A: Handler<M>,
    {
        self.reduced(message, Reducer::MaxI64, call::decode_single::<i64>)
    }

    /// Calls `M`'s endpoint on every actor and sums the replies in the host.
    pub fn sum_f64<M: Message<Reply = f64>>(&self, message: &M) -> Call<f64>
    where
        A: Handler<M>,
    {
        self.reduced(message, Reducer::SumF64, call::decode_single::<f64>)
    }

    /// Like [`sum_f64`](Self::sum_f64), for the smallest reply.
    pub fn min_f64<M: Message<Reply = f64>>(&self, message: &M) -> Call<f64>
    where
        A: Handler<M>,
    {
        self.reduced(message, Reducer::MinF64, call::decode_single::<f64>)
    }

    /// Like [`sum_f64`](Self::sum_f64), for the largest reply.
    pub fn max_f64<M: Message<Reply = f64>>(&self, message: &M) -> Call<f64>
    where
        A: Handler<M>,
    {
        self.reduced(message, Reducer::MaxF64, call::decode_single::<f64>)
    }

    /// Calls `M`'s endpoint on every actor; the host joins the replies in
    /// rank order. Cheaper than [`call`](Self::call) for many small
    /// replies.
    pub fn concat<M: Message>(&self, message: &M) -> Call<Vec<M::Reply>>
    where
        A: Handler<M>,
    {
        self.reduced(message, Reducer::Concat, call::decode_concat::<M::Reply>)
    }

    /// Calls `M`'s endpoint on every actor with any [`Reducer`], leaving the
    /// reduced reply as bytes.
    pub fn call_reduce<M: Message>(&self, message: &M, reducer: Reducer) -> Call<Vec<u8>>
    where
        A: Handler<M>,
    {
        self.reduced(message, reducer, call::decode_raw)
    }

    fn reduced<M: Message, T>(
        &self,
        message: &M,
        reducer: Reducer,
        decode: fn(Result<wit::Reply, wit::CallError>) -> Result<T, CallError>,
    ) -> Call<T> {
        match encode_message(message) {
            Ok(bytes) => Call::in_flight(
                self.options
                    .around(|| self.raw.call(M::ENDPOINT, &bytes, Some(reducer.into()))),
                decode,
            ),
            Err(e) => Call::refused(e),
        }
    }

    /// Calls `M`'s endpoint on the mesh's only actor; a mesh of any other
    /// size ends the call with a [`CallError`] of kind
    /// [`Invalid`](crate::ErrorKind::Invalid). Use
    /// [`at`](Self::at) to pick one actor out of a mesh.
    pub fn call_one<M: Message>(&self, message: &M) -> Call<M::Reply>
    where
        A: Handler<M>,
    {
        match encode_message(message) {
            Ok(bytes) => Call::in_flight(
                self.options
                    .around(|| self.raw.call_one(M::ENDPOINT, &bytes)),
                call::decode_single::<M::Reply>,
            ),
            Err(e) => Call::refused(e),
        }
    }

    /// Calls `M`'s endpoint on one actor: the one with the fewest calls in
    /// flight.
    pub fn choose<M: Message>(&self, message: &M) -> Call<M::Reply>
    where
        A: Handler<M>,
    {
        match encode_message(message) {
            Ok(bytes) => Call::in_flight(
                self.options.around(|| self.raw.choose(M::ENDPOINT, &bytes)),
                call::decode_single::<M::Reply>,
            ),
            Err(e) => Call::refused(e),
        }
    }

    /// Calls `M`'s endpoint on every actor; the stream yields
    /// `(rank, reply)` as replies arrive, then ends.
    pub fn stream<M: Message>(&self, message: &M) -> CallStream<M::Reply>
    where
        A: Handler<M>,
    {
        match encode_message(message) {
            Ok(bytes) => {
                CallStream::start(self.options.around(|| self.raw.stream(M::ENDPOINT, &bytes)))
            }
            Err(e) => CallStream::refused(e),
        }
    }

    /// Sends `message` to every actor without waiting for replies. The
    /// error is one known at once: a message that cannot be encoded, a
    /// stopped mesh (kind [`Stopped`](crate::ErrorKind::Stopped)), a failed
    /// rank. An actor that fails handling it comes later as a failure event
    /// of the mesh's owner (see [`supervise`](crate::supervise) and
    /// [`next_failure`](crate::next_failure)); an endpoint that returns an
    /// error to a broadcast fails its actor (kind
    /// [`Endpoint`](crate::ErrorKind::Endpoint)), as in Monarch.
    pub fn broadcast<M: Message>(&self, message: &M) -> Result<(), CallError>
    where
        A: Handler<M>,
    {
        let bytes = encode_message(message)?;
        self.options
            .around(|| self.raw.broadcast(M::ENDPOINT, &bytes))
            .map_err(CallError::from)
    }

    /// A reference to this mesh that can travel inside a message, to be
    /// turned back into a mesh with [`from_ref`](Self::from_ref) by any
    /// actor of this program.
    pub fn to_ref(&self) -> MeshRef<A> {
        MeshRef {
            reference: self.raw.to_ref(),
            actor: PhantomData,
        }
    }

    /// The mesh a reference names. The reference does not say the class
    /// of its actors: a reference to a mesh of another class resolves, and
    /// its calls fail at the actors (no such endpoint, a message that does
    /// not decode).
    pub fn from_ref(reference: &MeshRef<A>) -> Result<Self, MeshError> {
        wit_mesh::ActorMesh::from_ref(&reference.reference)
            .map(Self::from_raw)
            .map_err(|e| {
                MeshError::new(
                    format!("resolving a reference to a mesh of {}", A::CLASS),
                    e,
                )
            })
    }

    /// Stops the actors: requests to them fail at once with kind
    /// [`Stopped`](crate::ErrorKind::Stopped), through this handle, its
    /// slices, and references.
    pub fn stop(&self) {
        self.raw.stop();
    }
}

fn encode_message<M: Message>(message: &M) -> Result<Vec<u8>, CallError> {
    codec::encode_args(message).map_err(|e| {
        CallError::invalid(format!(
            "cannot encode the message for `{}`: {e}",
            M::ENDPOINT
        ))
    })
}

/// A reference to an [`ActorMesh<A>`] that can travel inside a message: a
/// field of this type in a message or init value hands a mesh to another
/// actor. Get one with [`ActorMesh::to_ref`]; resolve it with
/// [`ActorMesh::from_ref`] or [`MeshRef::resolve`].
///
/// It travels as tag 40100 over the bytes of the WIT's `actor-mesh.to-ref`
/// (`wit/ENCODING.md`), as the other SDKs write mesh references, so a
/// Python or JavaScript program may hand one to a Rust actor and back.
pub struct MeshRef<A> {
    reference: Vec<u8>,
    actor: PhantomData<fn() -> A>,
}

impl<A: Actor> MeshRef<A> {
    /// The mesh this reference names.
    pub fn resolve(&self) -> Result<ActorMesh<A>, MeshError> {
        ActorMesh::from_ref(self)
    }
}

impl<A> Serialize for MeshRef<A> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        codec::serialize_tagged(codec::TAGGED_MESH, &self.reference, serializer)
    }
}

impl<'de, A> Deserialize<'de> for MeshRef<A> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self {
            reference: codec::deserialize_tagged(codec::TAGGED_MESH, deserializer)?,
            actor: PhantomData,
        })
    }
}

impl<A> Clone for MeshRef<A> {
    fn clone(&self) -> Self {
        Self {
            reference: self.reference.clone(),
            actor: PhantomData,
        }
    }
}

impl<A> fmt::Debug for MeshRef<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MeshRef")
            .field("bytes", &self.reference.len())
            .finish()
    }
}

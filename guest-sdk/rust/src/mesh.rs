//! Meshes: [`ProcMesh`] (procs arranged in an extent) and [`ActorMesh`]
//! (actors of a class on the procs of a proc mesh: one on every proc, or
//! several with [`ProcMesh::spawn_many`]), and the ways to call an actor
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
//! | [`ActorMesh::broadcast`] | every actor | nothing; a failure becomes a [`take_failures`](crate::take_failures) entry |
//!
//! Each method sends the request before it returns. Handles are cheap to
//! clone: clones name the same mesh.

use std::fmt;
use std::marker::PhantomData;
use std::rc::Rc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::actor::{Actor, Handler, Message};
use crate::bindings::monarch::host::mesh as wit_mesh;
use crate::bindings::monarch::host::types as wit;
use crate::call::{self, Call, CallStream};
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

/// Sets the timeout for the requests made from now on. A request with no
/// reply by then ends with [`CallError::Timeout`].
pub fn set_call_timeout(timeout: Duration) {
    wit_mesh::set_call_timeout(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
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
        let init = codec::encode(init).map_err(|e| MeshError::new(what(), e.to_string()))?;
        self.raw
            .spawn(name, A::CLASS, &init)
            .map(ActorMesh::from_raw)
            .map_err(|e| MeshError::new(what(), e))
    }

    /// Like [`spawn`](Self::spawn), with an actor for every point of
    /// `per_proc` on every proc: several actors of a class in each proc
    /// (one per GPU of a host proc, say).
    ///
    /// The new mesh's extent is this mesh's dimensions followed by
    /// `per_proc`'s, whose names must differ from this mesh's. Ranks stay
    /// row-major, so the actors of one proc hold consecutive ranks: on
    /// procs `procs=2`, a `per_proc` of `workers=4` makes the mesh
    /// `procs=2, workers=4`, whose ranks 0..4 live on the first proc and
    /// 4..8 on the second. Each actor's [`Context::extent`] and
    /// [`Context::rank`] are this whole extent and its rank in it. An
    /// empty `per_proc` is [`spawn`](Self::spawn).
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
    /// let procs = spawn_procs(&extent!(procs = 2))?;
    /// let workers = procs.spawn_many::<Worker>("workers", &(), &extent!(workers = 4))?;
    /// assert_eq!(workers.extent(), extent!(procs = 2, workers = 4));
    /// # Ok(()) }
    /// ```
    ///
    /// [`Context::extent`]: crate::Context::extent
    /// [`Context::rank`]: crate::Context::rank
    pub fn spawn_many<A: Actor>(
        &self,
        name: &str,
        init: &A::Init,
        per_proc: &Extent,
    ) -> Result<ActorMesh<A>, MeshError> {
        let what = || {
            format!(
                "spawning `{name}` (class {}, {per_proc} per proc)",
                A::CLASS
            )
        };
        let init = codec::encode(init).map_err(|e| MeshError::new(what(), e.to_string()))?;
        self.raw
            .spawn_many(name, A::CLASS, &init, &wit::Extent::from(per_proc))
            .map(ActorMesh::from_raw)
            .map_err(|e| MeshError::new(what(), e))
    }

    /// Stops the procs and every actor on them.
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
/// The numeric ones read every reply as one little-endian `i64` or `f64`,
/// which is how the SDK encodes a reply of exactly that type.
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
    /// The replies' bytes joined in rank order.
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
/// extent on every proc ([`ProcMesh::spawn_many`]).
///
/// The call methods accept only the messages `A` handles (`A: Handler<M>`),
/// and decode replies as `M::Reply`.
pub struct ActorMesh<A> {
    raw: Rc<wit_mesh::ActorMesh>,
    class: PhantomData<fn() -> A>,
}

impl<A> Clone for ActorMesh<A> {
    fn clone(&self) -> Self {
        Self {
            raw: self.raw.clone(),
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
            class: PhantomData,
        }
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
    pub fn slice(&self, dims: &[SliceDim]) -> Result<ActorMesh<A>, MeshError> {
        self.raw
            .slice(&to_wit_slice(dims))
            .map(Self::from_raw)
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
                self.raw.call(M::ENDPOINT, &bytes, None),
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
    /// rank order. Cheaper than [`call`](Self::call) for many small replies;
    /// a reply type that encodes as no bytes (like `()`) cannot be split
    /// back apart.
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
                self.raw.call(M::ENDPOINT, &bytes, Some(reducer.into())),
                decode,
            ),
            Err(e) => Call::refused(e),
        }
    }

    /// Calls `M`'s endpoint on the mesh's only actor; a mesh of any other
    /// size ends the call with [`CallError::Invalid`]. Use
    /// [`at`](Self::at) to pick one actor out of a mesh.
    pub fn call_one<M: Message>(&self, message: &M) -> Call<M::Reply>
    where
        A: Handler<M>,
    {
        match encode_message(message) {
            Ok(bytes) => Call::in_flight(
                self.raw.call_one(M::ENDPOINT, &bytes),
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
                self.raw.choose(M::ENDPOINT, &bytes),
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
            Ok(bytes) => CallStream::start(self.raw.stream(M::ENDPOINT, &bytes)),
            Err(e) => CallStream::refused(e),
        }
    }

    /// Sends `message` to every actor without waiting for replies. The only
    /// error is a message that cannot be encoded; a failure in the mesh
    /// comes later, through [`take_failures`](crate::take_failures).
    pub fn broadcast<M: Message>(&self, message: &M) -> Result<(), CallError>
    where
        A: Handler<M>,
    {
        let bytes = encode_message(message)?;
        self.raw.broadcast(M::ENDPOINT, &bytes);
        Ok(())
    }

    /// A reference to this mesh that can travel inside a message, to be
    /// turned back into a mesh with [`from_ref`](Self::from_ref) by any
    /// actor of this program.
    pub fn to_ref(&self) -> MeshRef<A> {
        MeshRef {
            class: A::CLASS.to_string(),
            reference: self.raw.to_ref(),
            actor: PhantomData,
        }
    }

    /// The mesh a reference names.
    pub fn from_ref(reference: &MeshRef<A>) -> Result<Self, MeshError> {
        let what = || format!("resolving a reference to a mesh of {}", A::CLASS);
        if reference.class != A::CLASS {
            return Err(MeshError::new(
                what(),
                format!("the reference names a mesh of {}", reference.class),
            ));
        }
        wit_mesh::ActorMesh::from_ref(&reference.reference)
            .map(Self::from_raw)
            .map_err(|e| MeshError::new(what(), e))
    }

    /// Stops the actors.
    pub fn stop(&self) {
        self.raw.stop();
    }
}

fn encode_message<M: Message>(message: &M) -> Result<Vec<u8>, CallError> {
    codec::encode(message).map_err(|e| {
        CallError::Invalid(format!(
            "cannot encode the message for `{}`: {e}",
            M::ENDPOINT
        ))
    })
}

/// A reference to an [`ActorMesh<A>`] that can travel inside a message: a
/// field of this type in a message or init value hands a mesh to another
/// actor. Get one with [`ActorMesh::to_ref`]; resolve it with
/// [`ActorMesh::from_ref`] or [`MeshRef::resolve`].
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct MeshRef<A> {
    class: String,
    reference: Vec<u8>,
    #[serde(skip)]
    actor: PhantomData<fn() -> A>,
}

impl<A: Actor> MeshRef<A> {
    /// The mesh this reference names.
    pub fn resolve(&self) -> Result<ActorMesh<A>, MeshError> {
        ActorMesh::from_ref(self)
    }
}

impl<A> Clone for MeshRef<A> {
    fn clone(&self) -> Self {
        Self {
            class: self.class.clone(),
            reference: self.reference.clone(),
            actor: PhantomData,
        }
    }
}

impl<A> fmt::Debug for MeshRef<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MeshRef")
            .field("class", &self.class)
            .field("bytes", &self.reference.len())
            .finish()
    }
}

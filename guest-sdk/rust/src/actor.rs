//! Actors: private state plus named endpoints, handling one message at a
//! time.
//!
//! An actor class is a type that implements [`Actor`]; each endpoint is a
//! message type that implements [`Message`] (which names the endpoint and
//! its reply type) and a [`Handler`] impl for it. [`Actor::endpoints`] lists
//! the handlers, so the SDK can route the host's `handle(endpoint, message)`
//! to them.
//!
//! Each actor is its own instance of the program's component: the host
//! calls `create` once on a fresh instance, then `handle` once per message.
//! A handler's `Err` is an [`EndpointError`]: a caller that waits for the
//! reply sees a [`CallError`](crate::CallError) of kind
//! [`Endpoint`](crate::ErrorKind::Endpoint) (with the error's type name, if
//! the handler gave one) and the actor lives on; after a `broadcast`, where
//! nobody waits, the actor fails instead. A panic traps the instance, which
//! fails the actor: callers see kind [`Trap`](crate::ErrorKind::Trap) and
//! the owner gets a [`SupervisionFailure`].

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{EndpointError, SupervisionFailure};
use crate::{Extent, block_on, codec};

/// A message type, and so an endpoint: its name on the wire and the type of
/// its reply.
///
/// ```
/// use monarch_guest::Message;
/// use serde::{Deserialize, Serialize};
///
/// /// Adds its amount to a counter; replies with the new total.
/// #[derive(Serialize, Deserialize)]
/// struct Add(i64);
///
/// impl Message for Add {
///     const ENDPOINT: &'static str = "add";
///     type Reply = i64;
/// }
/// ```
///
/// Messages and replies travel in the [encoding](crate::codec) every SDK
/// shares: a message as an argument list of one element, so that a program
/// in another language calls the endpoint with the message's fields (or
/// the newtype's value) as its arguments. A reply of type `i64` or `f64` is
/// what the host's numeric reducers read (see
/// [`ActorMesh::sum_i64`](crate::ActorMesh::sum_i64) and friends).
pub trait Message: Serialize + DeserializeOwned + 'static {
    /// The endpoint's name: the string that travels with the message.
    const ENDPOINT: &'static str;
    /// What the endpoint replies.
    type Reply: Serialize + DeserializeOwned + 'static;
}

/// An actor class.
///
/// ```
/// use monarch_guest::{Actor, Context, EndpointError, Endpoints, Handler, Message};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize)]
/// # struct Add(i64);
/// # impl Message for Add { const ENDPOINT: &'static str = "add"; type Reply = i64; }
///
/// struct Counter {
///     total: i64,
/// }
///
/// impl Actor for Counter {
///     const CLASS: &'static str = "Counter";
///     type Init = i64;
///
///     fn create(start: i64, _cx: &Context) -> Result<Self, String> {
///         Ok(Counter { total: start })
///     }
///
///     fn endpoints(endpoints: &mut Endpoints<Self>) {
///         endpoints.handle::<Add>();
///     }
/// }
///
/// impl Handler<Add> for Counter {
///     async fn handle(&mut self, _cx: &Context, Add(n): Add) -> Result<i64, EndpointError> {
///         if n < 0 {
///             let why = format!("cannot add {n}: counters only go up");
///             return Err(EndpointError::new(why).with_type("ValueError"));
///         }
///         self.total += n;
///         Ok(self.total)
///     }
/// }
/// ```
pub trait Actor: Sized + 'static {
    /// The class name the host knows this actor by. It must be unique
    /// within the program.
    const CLASS: &'static str;

    /// What [`ProcMesh::spawn`](crate::ProcMesh::spawn) passes to every
    /// actor of the new mesh.
    type Init: Serialize + DeserializeOwned + 'static;

    /// Makes the actor at `cx.rank()` from `init`. An error fails the spawn
    /// with its text. It runs before any message; to wait for calls here,
    /// use [`block_on`](crate::block_on).
    fn create(init: Self::Init, cx: &Context) -> Result<Self, String>;

    /// Lists the endpoints: one [`Endpoints::handle`] per message type.
    fn endpoints(endpoints: &mut Endpoints<Self>);

    /// A mesh this actor spawned has a failed actor. Return `true` if the
    /// actor dealt with it; `false` (the default) passes it on to the
    /// owner of this actor's mesh.
    fn supervise(&mut self, cx: &Context, failure: &SupervisionFailure) -> bool {
        let _ = (cx, failure);
        false
    }
}

/// Handles one message type. The SDK awaits the handler before it takes the
/// next message, so a handler may call other actors and await them (and
/// [`sleep`](crate::sleep)).
///
/// The error is an [`EndpointError`]. Text converts into one
/// (`Err("no such key".into())`, `Err(format!(..).into())`, `?` on a
/// `Result<_, String>`), and so does a failed call's [`CallError`](crate::CallError), so `?`
/// on a call passes the callee's error on; give it a type name with
/// [`EndpointError::with_type`]:
///
/// ```
/// # use monarch_guest::prelude::*;
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize)] struct Lookup(String);
/// # impl Message for Lookup { const ENDPOINT: &'static str = "lookup"; type Reply = u64; }
/// # struct Table(std::collections::HashMap<String, u64>);
/// # impl Actor for Table {
/// #     const CLASS: &'static str = "Table";
/// #     type Init = ();
/// #     fn create((): (), _cx: &Context) -> Result<Self, String> { Ok(Table(Default::default())) }
/// #     fn endpoints(endpoints: &mut Endpoints<Self>) { endpoints.handle::<Lookup>(); }
/// # }
/// impl Handler<Lookup> for Table {
///     async fn handle(&mut self, _cx: &Context, Lookup(key): Lookup) -> Result<u64, EndpointError> {
///         if key.is_empty() {
///             return Err("an empty key".into());
///         }
///         self.0.get(&key).copied().ok_or_else(|| {
///             EndpointError::new(format!("no key {key:?}")).with_type("KeyError")
///         })
///     }
/// }
/// ```
#[allow(async_fn_in_trait)] // Handlers run on this instance's one thread.
#[diagnostic::on_unimplemented(
    message = "actor class `{Self}` does not handle the message `{M}`",
    label = "no `Handler<{M}>` for `{Self}`",
    note = "implement `Handler<{M}>` for `{Self}` and list it in `Actor::endpoints`"
)]
pub trait Handler<M: Message>: Actor {
    /// Handles `message`. `Err` is an endpoint error: a caller sees it and
    /// the actor lives on (after a `broadcast`, the actor fails).
    async fn handle(&mut self, cx: &Context, message: M) -> Result<M::Reply, EndpointError>;
}

/// Where an actor's handlers are listed; see [`Actor::endpoints`].
pub struct Endpoints<A> {
    table: Vec<(&'static str, HandleFn<A>)>,
}

/// One endpoint's handler with the message and reply still encoded.
type HandleFn<A> = fn(&mut A, &Context, &[u8]) -> Result<Vec<u8>, EndpointError>;

impl<A: Actor> Endpoints<A> {
    pub(crate) fn of() -> Self {
        let mut endpoints = Self { table: Vec::new() };
        A::endpoints(&mut endpoints);
        endpoints
    }

    /// Routes the endpoint `M::ENDPOINT` to `A`'s [`Handler<M>`]. Listing a
    /// name twice keeps the last handler.
    pub fn handle<M: Message>(&mut self) -> &mut Self
    where
        A: Handler<M>,
    {
        self.table.retain(|(name, _)| *name != M::ENDPOINT);
        self.table.push((M::ENDPOINT, handle_encoded::<A, M>));
        self
    }

    /// The endpoint names, in the order they were listed.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.table.iter().map(|(name, _)| *name)
    }

    /// Runs the handler for `endpoint` on encoded bytes.
    pub(crate) fn dispatch(
        &self,
        actor: &mut A,
        cx: &Context,
        endpoint: &str,
        message: &[u8],
    ) -> Result<Vec<u8>, EndpointError> {
        match self.table.iter().find(|(name, _)| *name == endpoint) {
            Some((_, handle)) => handle(actor, cx, message),
            None => Err(EndpointError::new(format!(
                "actor class `{}` has no endpoint `{endpoint}`; it has: {}",
                A::CLASS,
                self.names().collect::<Vec<_>>().join(", ")
            ))),
        }
    }
}

fn handle_encoded<A: Handler<M>, M: Message>(
    actor: &mut A,
    cx: &Context,
    bytes: &[u8],
) -> Result<Vec<u8>, EndpointError> {
    let message: M = codec::decode_args(bytes)
        .map_err(|e| format!("endpoint `{}` cannot decode its message: {e}", M::ENDPOINT))?;
    let reply = block_on(actor.handle(cx, message))?;
    codec::encode(&reply)
        .map_err(|e| format!("endpoint `{}` cannot encode its reply: {e}", M::ENDPOINT).into())
}

/// Where an actor stands: its class, its rank and the shape of its mesh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    class: &'static str,
    rank: u32,
    extent: Extent,
}

impl Context {
    pub(crate) fn new(class: &'static str, rank: u32, extent: Extent) -> Self {
        Self {
            class,
            rank,
            extent,
        }
    }

    /// The actor's class name.
    pub fn class(&self) -> &'static str {
        self.class
    }

    /// The actor's rank in its mesh.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The shape of the actor's mesh.
    pub fn extent(&self) -> &Extent {
        &self.extent
    }

    /// The actor's coordinates in its mesh, one per dimension.
    pub fn coords(&self) -> Vec<u32> {
        self.extent.coords(self.rank).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extent;
    use serde::Deserialize;

    #[derive(Serialize, Deserialize)]
    struct Add(i64);
    impl Message for Add {
        const ENDPOINT: &'static str = "add";
        type Reply = i64;
    }

    #[derive(Serialize, Deserialize)]
    struct Where;
    impl Message for Where {
        const ENDPOINT: &'static str = "where";
        type Reply = (u32, Vec<u32>);
    }

    struct Counter(i64);

    impl Actor for Counter {
        const CLASS: &'static str = "Counter";
        type Init = i64;
        fn create(init: i64, _cx: &Context) -> Result<Self, String> {
            Ok(Counter(init))
        }
        fn endpoints(endpoints: &mut Endpoints<Self>) {
            endpoints.handle::<Add>().handle::<Where>();
        }
    }

    impl Handler<Add> for Counter {
        async fn handle(&mut self, _cx: &Context, Add(n): Add) -> Result<i64, EndpointError> {
            if n < 0 {
                return Err(EndpointError::new(format!("cannot add {n}")).with_type("ValueError"));
            }
            self.0 += n;
            Ok(self.0)
        }
    }

    impl Handler<Where> for Counter {
        async fn handle(
            &mut self,
            cx: &Context,
            _: Where,
        ) -> Result<(u32, Vec<u32>), EndpointError> {
            Ok((cx.rank(), cx.coords()))
        }
    }

    #[test]
    fn dispatch_routes_by_endpoint_name_and_encodes_the_reply() {
        let endpoints = Endpoints::<Counter>::of();
        let cx = Context::new("Counter", 3, extent!(hosts = 2, gpus = 2));
        let mut counter = Counter(10);
        let add = |counter: &mut Counter, n: i64| {
            endpoints.dispatch(counter, &cx, "add", &codec::encode_args(&Add(n)).unwrap())
        };
        assert_eq!(add(&mut counter, 5), Ok(vec![0x0f]), "15, a CBOR integer");
        assert_eq!(
            add(&mut counter, -1),
            Err(EndpointError::new("cannot add -1").with_type("ValueError"))
        );
        assert_eq!(
            counter.0, 15,
            "an endpoint error leaves the state as it was"
        );
        let reply = endpoints.dispatch(
            &mut counter,
            &cx,
            "where",
            &codec::encode_args(&Where).unwrap(),
        );
        assert_eq!(
            codec::decode::<(u32, Vec<u32>)>(&reply.unwrap()),
            Ok((3, vec![1, 1]))
        );
    }

    #[test]
    fn an_unknown_endpoint_or_a_bad_message_is_an_endpoint_error() {
        let endpoints = Endpoints::<Counter>::of();
        let cx = Context::new("Counter", 0, Extent::default());
        let err = endpoints
            .dispatch(&mut Counter(0), &cx, "sub", &[])
            .unwrap_err();
        assert_eq!(
            err,
            "actor class `Counter` has no endpoint `sub`; it has: add, where".into()
        );
        let err = endpoints
            .dispatch(&mut Counter(0), &cx, "add", &[])
            .unwrap_err();
        assert!(
            err.message()
                .starts_with("endpoint `add` cannot decode its message"),
            "{err}"
        );
    }
}

//! `monarch-guest`: write monarch-host programs in Rust.
//!
//! A monarch-host *program* is one WebAssembly component that holds a
//! controller (its `main`) and the actor classes it spawns, compiled for
//! `wasm32-wasip2` against the WIT package `monarch:host` (`wit/` in the
//! repository). The host runs `main` in one instance of the component and
//! every actor in an instance of its own. This crate is the typed layer over
//! the generated bindings:
//!
//! - **Actors and endpoints** ([`Actor`], [`Message`], [`Handler`]): a
//!   message type names its endpoint and its reply type; an actor class lists
//!   the messages it handles. Payloads are encoded for you (see [`codec`]).
//! - **Meshes** ([`spawn_procs`], [`ProcMesh`], [`ActorMesh`]): procs and
//!   actors in named dimensions, sliced with [`SliceDim`], called with
//!   `call` (a [`ValueMesh`] in rank order), the host's reducers
//!   (`sum_i64`...), `call_one`, `choose`, `stream` and `broadcast`. A
//!   [`MeshRef`] carries a mesh inside a message.
//! - **Errors as values**: every call ends with `Result<_, CallError>`; an
//!   endpoint's `Err` ([`EndpointError`], with an optional type name), a
//!   trapped actor, a handler past its deadline, a stopped mesh, a lost
//!   proc and a timeout are each a [`CallError`] of its own [`ErrorKind`],
//!   naming the mesh, rank and endpoint, never a trap in the caller.
//! - **Supervision**: an actor or proc of the program's meshes that fails
//!   (a trap, a deadline, an exit, a kill, a lost host, an error returned
//!   to a broadcast) is reported once, to the supervisor set with
//!   [`supervise`] or to a task awaiting [`next_failure`]; a failure nobody
//!   handles ends `main` with an error, as in Monarch.
//! - **Deadlines**: a handler deadline per mesh ([`SpawnOptions`]), per
//!   program ([`set_handler_timeout`]) or per handle
//!   ([`ActorMesh::with_handler_timeout`]); a call timeout likewise
//!   ([`set_call_timeout`], [`ActorMesh::with_call_timeout`]).
//! - **Async without threads**: calls are futures, driven by [`block_on`]
//!   over the host's event mailbox, so a controller can await thousands at
//!   once (`futures::future::join_all`), and a handler can call other
//!   actors and await them. [`sleep`], [`timeout`] and [`select!`] wait on
//!   the same loop, without busy-waiting.
//! - **Procs**: [`ProcMesh::info`] says where each proc runs and whether it
//!   does; [`ProcMesh::kill`] signals one, to test fault handling.
//! - **Tensors and RDMA buffers** that live on the procs, not in the
//!   program: [`tensor::TensorEngine`] makes sharded tensors on a proc mesh
//!   (ops queued without waiting, all-reduces across a mesh dimension,
//!   fetches, shards sent proc to proc), and [`rdma::Buffer`] holds bytes
//!   on one proc and moves them to another one-sided.
//! - **Logging** through the host: [`info!`], [`warn!`], [`error!`]...
//! - **Breakpoints**: [`breakpoint!`] pauses an actor for `monarch-host
//!   debug` when the run has debugging on, and does nothing otherwise.
//! - **Tests**: [`#[monarch_guest::test]`](test) marks an `async fn` that
//!   `monarch-host test` runs as the controller, on a cluster of its own.
//! - **[`program!`]** exports it all as the WIT world `test` (the world
//!   `program` and the `tests` export).
//!
//! # A whole program
//!
//! A `Greeter` class and a controller that spawns four of them, gathers
//! their greetings, sums a reply across the mesh in the host, and sees an
//! endpoint's error come back as a value:
//!
//! ```
//! # mod program {
//! use monarch_guest::prelude::*;
//! use serde::{Deserialize, Serialize};
//!
//! /// `greet`: replies with a greeting naming the actor's rank.
//! #[derive(Serialize, Deserialize)]
//! pub struct Greet {
//!     pub from: String,
//! }
//!
//! impl Message for Greet {
//!     const ENDPOINT: &'static str = "greet";
//!     type Reply = String;
//! }
//!
//! /// `rank`: replies with the actor's rank (an `i64`, so the host can sum it).
//! #[derive(Serialize, Deserialize)]
//! pub struct Rank;
//!
//! impl Message for Rank {
//!     const ENDPOINT: &'static str = "rank";
//!     type Reply = i64;
//! }
//!
//! pub struct Greeter {
//!     rank: u32,
//!     size: usize,
//! }
//!
//! impl Actor for Greeter {
//!     const CLASS: &'static str = "Greeter";
//!     type Init = ();
//!
//!     fn create((): (), cx: &Context) -> Result<Self, String> {
//!         Ok(Greeter { rank: cx.rank(), size: cx.extent().num_ranks() })
//!     }
//!
//!     fn endpoints(endpoints: &mut Endpoints<Self>) {
//!         endpoints.handle::<Greet>().handle::<Rank>();
//!     }
//! }
//!
//! impl Handler<Greet> for Greeter {
//!     async fn handle(&mut self, _cx: &Context, greet: Greet) -> Result<String, EndpointError> {
//!         if greet.from.is_empty() {
//!             return Err(EndpointError::new("greet whom? `from` is empty").with_type("ValueError"));
//!         }
//!         Ok(format!("hello {} from rank {} of {}", greet.from, self.rank, self.size))
//!     }
//! }
//!
//! impl Handler<Rank> for Greeter {
//!     async fn handle(&mut self, _cx: &Context, _: Rank) -> Result<i64, EndpointError> {
//!         Ok(i64::from(self.rank))
//!     }
//! }
//!
//! /// The controller: `run` calls it with the program's arguments.
//! async fn main(_args: Vec<String>) -> Result<(), String> {
//!     let procs = spawn_procs(&extent!(hosts = 1, gpus = 4))?;
//!     let greeters = procs.spawn::<Greeter>("greeters", &())?;
//!
//!     let greetings = greeters.call(&Greet { from: "main".into() }).await?;
//!     for (rank, greeting) in greetings.iter() {
//!         info!("rank {rank}: {greeting}");
//!     }
//!
//!     let total = greeters.sum_i64(&Rank).await?;
//!     info!("the ranks add up to {total}");
//!
//!     match greeters.at("gpus", 2)?.call_one(&Greet { from: String::new() }).await {
//!         // "the endpoint `greet` at greeters[2] returned an error: ValueError: greet whom?..."
//!         Err(err) if err.kind() == ErrorKind::Endpoint => info!("{err}"),
//!         other => return Err(format!("expected an endpoint error, got {other:?}")),
//!     }
//!     Ok(())
//! }
//!
//! monarch_guest::program! {
//!     main: main,
//!     actors: [Greeter],
//! }
//! # }
//! # fn main() {}
//! ```
//!
//! Build it as a `cdylib` for `wasm32-wasip2`
//! (`crate-type = ["cdylib"]`, then
//! `cargo build --release --target wasm32-wasip2`); the `.wasm` that cargo
//! writes is the component the host runs. The examples in `examples/` of the
//! repository are complete crates.
//!
//! # What the host sees
//!
//! - `run(args)` runs `main(args)` to completion in the controller instance;
//!   `main`'s error becomes the run's error text.
//! - `actor-class.create(class, init, rank, extent)` finds the class whose
//!   [`Actor::CLASS`] is `class` among those listed in `program!`, decodes
//!   `init` as its [`Actor::Init`] and calls [`Actor::create`].
//! - `handle(endpoint, message)` finds the handler listed for `endpoint`,
//!   decodes the message, awaits the handler and encodes its reply; the
//!   handler's [`EndpointError`] becomes the WIT `endpoint-error`. An
//!   unknown endpoint or undecodable message is an endpoint error.
//! - `supervise(failure)` calls [`Actor::supervise`].
//! - `list-tests()` names the functions marked [`#[monarch_guest::test]`](test),
//!   sorted; `run-test(name)` runs one as `run` runs `main`.
//!
//! # Building natively
//!
//! The crate compiles for the host target too, so that `cargo test` and
//! `cargo doc` work: the pure parts (routing events, decoding replies,
//! dispatching messages) are tested that way. Calling the host from a
//! native build panics, since there is no host to call; [`log`] writes to
//! standard error instead.

#![warn(missing_docs)]

// The paths that `#[monarch_guest::test]` expands to, inside this crate's
// own unit tests too.
extern crate self as monarch_guest;

mod actor;
mod call;
pub mod codec;
pub mod debug;
mod error;
mod executor;
mod extent;
pub mod faults;
pub mod log;
mod mesh;
mod program;
pub mod rdma;
pub mod tensor;
mod testing;
pub mod time;
mod value_mesh;

/// The bindings that `wit-bindgen` generates for the world `test` of
/// `wit/monarch.wit` (the world `program` and the export `tests`): the raw
/// imports, for what the typed API does not cover.
#[allow(missing_docs)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "test",
        pub_export_macro: true,
        export_macro_name: "__export",
        default_bindings_module: "monarch_guest::bindings",
    });
}

pub use actor::{Actor, Context, Endpoints, Handler, Message};
pub use call::{Call, CallStream, NO_RANK};
pub use error::{CallError, EndpointError, ErrorKind, MeshError, Origin, SupervisionFailure};
pub use executor::{NextFailure, block_on, next_failure, supervise, take_failures};
pub use extent::{Dim, Extent, Selector, SliceDim};
pub use mesh::{
    ActorMesh, MeshRef, ProcInfo, ProcMesh, ProcState, Reducer, SpawnOptions, lookup_actor_mesh,
    set_call_timeout, set_handler_timeout, spawn_procs,
};
pub use time::{Elapsed, Sleep, sleep, sleep_until, timeout};
pub use value_mesh::ValueMesh;

/// Marks a test of the program: `monarch-host test APP.wasm` lists and
/// runs it, as the controller, each test on a cluster of its own.
///
/// ```
/// # mod program {
/// use monarch_guest::prelude::*;
///
/// #[monarch_guest::test]
/// async fn spawns_three_procs() -> Result<(), String> {
///     let procs = spawn_procs(&extent!(gpus = 3))?;
///     assert_eq!(procs.extent().num_ranks(), 3);
///     procs.stop();
///     Ok(())
/// }
/// # }
/// # fn main() {}
/// ```
///
/// The function takes no arguments and returns `()` or
/// `Result<(), String>`; it may be `async` or not, and may sit in any module
/// of the program's crate. Its name (the function's, without the module)
/// is the test's name, so give each test a name of its own. It passes when
/// it returns `()` or `Ok(())`, and fails with the text of its `Err` or
/// with a panic's message and line (`assert!`, `assert_eq!`: a panic traps
/// the instance, and the host reports the trap). A failure of the
/// program's meshes that no supervisor handles fails it too, as it ends
/// `main`. Write the attribute as `#[monarch_guest::test]`, not as a bare
/// `#[test]`, which is Rust's own.
pub use monarch_guest_macros::test;

/// The `futures` crate, for combinators such as
/// [`join_all`](futures::future::join_all) and
/// [`StreamExt`](futures::StreamExt).
pub use futures;

/// Waits for the first of several futures: [`futures::select!`]. Each
/// branch's future must be a [`FusedFuture`](futures::future::FusedFuture):
/// a [`Call`] and a [`Sleep`] are; `.fuse()` (from
/// [`FutureExt`](futures::FutureExt)) makes any other one so.
///
/// ```
/// # async fn example() {
/// use std::time::Duration;
/// use monarch_guest::{select, sleep};
///
/// let winner = select! {
///     () = sleep(Duration::from_millis(50)) => "short",
///     () = sleep(Duration::from_secs(5)) => "long",
/// };
/// assert_eq!(winner, "short");
/// # }
/// ```
pub use futures::select;

/// [`select!`] that polls its branches in the order written:
/// [`futures::select_biased!`].
pub use futures::select_biased;

/// The names most programs use: `use monarch_guest::prelude::*;`. It also
/// brings [`StreamExt`](futures::StreamExt) into scope, to read a
/// [`CallStream`] with `.next().await`.
pub mod prelude {
    pub use futures::StreamExt as _;

    pub use crate::{
        Actor, ActorMesh, CallError, Context, EndpointError, Endpoints, ErrorKind, Extent, Handler,
        MeshRef, Message, ProcMesh, SliceDim, ValueMesh, block_on, debug, error, extent, info,
        sleep, spawn_procs, warn,
    };
}

/// Exports a program: its controller `main` and its actor classes.
///
/// ```text
/// monarch_guest::program! {
///     main: main,               // async fn main(args: Vec<String>) -> Result<(), E>, E: Display
///     actors: [Counter, Greeter], // each implements monarch_guest::Actor
/// }
/// ```
///
/// `main` and `actors` may come in either order; either may be left out
/// (a program without `main` fails `run`; one without actors makes none).
/// Invoke it once per crate, in a `cdylib` built for `wasm32-wasip2`. It
/// implements the WIT exports as follows:
///
/// - `run(args)`: [`block_on`]`(main(args))`, the error turned to text.
/// - `actor-class.create(class, init, rank, extent)`: the listed actor whose
///   [`Actor::CLASS`] is `class`, made by [`Actor::create`] from `init`
///   decoded as its [`Actor::Init`].
/// - `actor-class.handle(endpoint, message)`: the [`Handler`] that
///   [`Actor::endpoints`] listed for `endpoint`.
/// - `actor-class.supervise(failure)`: [`Actor::supervise`].
/// - `tests.list-tests()` and `tests.run-test(name)`: the crate's functions
///   marked [`#[monarch_guest::test]`](test), wherever they are.
#[macro_export]
macro_rules! program {
    (main: $main:path, actors: [$($actor:ty),* $(,)?] $(,)?) => {
        $crate::__program!(($main) [$($actor),*]);
    };
    (actors: [$($actor:ty),* $(,)?], main: $main:path $(,)?) => {
        $crate::__program!(($main) [$($actor),*]);
    };
    (main: $main:path $(,)?) => {
        $crate::__program!(($main) []);
    };
    (actors: [$($actor:ty),* $(,)?] $(,)?) => {
        $crate::__program!(() [$($actor),*]);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __program {
    (($($main:path)?) [$($actor:ty),*]) => {
        const _: () = {
            struct MonarchProgram;

            impl $crate::__private::Program for MonarchProgram {
                fn main(
                    args: ::std::vec::Vec<::std::string::String>,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    $crate::__program!(@main args $($main)?)
                }

                fn classes() -> ::std::vec::Vec<$crate::__private::Class> {
                    ::std::vec![$($crate::__private::class::<$actor>()),*]
                }
            }

            type MonarchComponent = $crate::__private::Component<MonarchProgram>;
            $crate::bindings::__export!(MonarchComponent with_types_in $crate::bindings);
        };
    };
    (@main $args:ident $main:path) => {
        $crate::__private::run_main($main($args))
    };
    (@main $args:ident) => {
        $crate::__private::no_main($args)
    };
}

/// What [`program!`] expands to; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::program::{Class, Component, Program, class, no_main, run_main};
    pub use crate::testing::{TestCase, TestFuture, TestOutput};
    pub use inventory;
}

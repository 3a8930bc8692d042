//! The bridge from the WIT exports to the program: what
//! [`program!`](crate::program!) expands to calls into this module.
//!
//! One component holds the controller and every actor class. The host
//! makes one instance for the controller, whose `run` export calls the
//! program's `main`, and one instance per actor, whose `actor-class.create`
//! picks the class by name and keeps the actor in this instance's [`SLOT`]
//! for the `handle` and `supervise` calls that follow. For `monarch-host
//! test`, the host makes one controller instance per test and calls
//! `run-test` in it instead of `run` (see [`crate::testing`]).

use std::cell::RefCell;
use std::fmt::Display;
use std::future::Future;
use std::marker::PhantomData;

use crate::actor::{Actor, Context, Endpoints};
use crate::bindings;
use crate::bindings::exports::monarch::host::{actor_class, tests as wit_tests};
use crate::bindings::monarch::host::types as wit;
use crate::error::{EndpointError, SupervisionFailure};
use crate::{Extent, block_on, codec};

/// What `program!` generates: the program's main and its actor classes.
pub trait Program: 'static {
    /// Runs the controller.
    fn main(args: Vec<String>) -> Result<(), String>;
    /// The actor classes, in the order `program!` lists them.
    fn classes() -> Vec<Class>;
}

/// One actor class as `create` finds it: its name and how to make it.
pub struct Class {
    name: &'static str,
    create: CreateFn,
}

/// Makes an actor from its encoded init value.
type CreateFn = fn(&[u8], Context) -> Result<Box<dyn HostedActor>, String>;

/// The [`Class`] entry for `A`.
pub fn class<A: Actor>() -> Class {
    Class {
        name: A::CLASS,
        create: create_hosted::<A>,
    }
}

/// Runs an async `main` to completion; its error becomes the run's error
/// text, and so does a failure nobody handled (see [`supervise`](crate::supervise)).
pub fn run_main<E: Display>(main: impl Future<Output = Result<(), E>>) -> Result<(), String> {
    use futures::future::{Either, select};
    block_on(async {
        let (main, unhandled) = (
            std::pin::pin!(main),
            std::pin::pin!(crate::executor::Unhandled),
        );
        match select(main, unhandled).await {
            Either::Left((result, _)) => result.map_err(|e| e.to_string()),
            Either::Right((failure, _)) => Err(format!(
                "unhandled failure: {failure} (handle failures with monarch_guest::supervise, or await them with next_failure)"
            )),
        }
    })
}

/// The `run` of a component that defines actor classes only.
pub fn no_main(_args: Vec<String>) -> Result<(), String> {
    Err("this component defines actor classes only; its `program!` names no `main`".into())
}

/// An actor with its class erased, as this instance holds it.
pub trait HostedActor {
    /// Handles one encoded message.
    fn handle(&mut self, endpoint: &str, message: &[u8]) -> Result<Vec<u8>, EndpointError>;
    /// Handles a failure in a mesh the actor owns.
    fn supervise(&mut self, failure: &SupervisionFailure) -> bool;
}

struct Hosted<A: Actor> {
    actor: A,
    cx: Context,
    endpoints: Endpoints<A>,
}

impl<A: Actor> HostedActor for Hosted<A> {
    fn handle(&mut self, endpoint: &str, message: &[u8]) -> Result<Vec<u8>, EndpointError> {
        self.endpoints
            .dispatch(&mut self.actor, &self.cx, endpoint, message)
    }

    fn supervise(&mut self, failure: &SupervisionFailure) -> bool {
        self.actor.supervise(&self.cx, failure)
    }
}

fn create_hosted<A: Actor>(init: &[u8], cx: Context) -> Result<Box<dyn HostedActor>, String> {
    let init: A::Init = codec::decode_args(init).map_err(|e| {
        format!(
            "actor class `{}` cannot decode its init value: {e}",
            A::CLASS
        )
    })?;
    let actor = A::create(init, &cx)?;
    Ok(Box::new(Hosted {
        actor,
        cx,
        endpoints: Endpoints::of(),
    }))
}

/// What this instance is, once `create` has run.
enum Slot {
    Empty,
    Actor(Box<dyn HostedActor>),
    /// A handler is running; the actor is out of the slot meanwhile.
    Busy,
}

thread_local! {
    static SLOT: RefCell<Slot> = const { RefCell::new(Slot::Empty) };
}

/// Makes this instance the actor of `class`.
fn create(
    classes: Vec<Class>,
    class: String,
    init: Vec<u8>,
    rank: u32,
    extent: Extent,
) -> Result<(), String> {
    if !SLOT.with_borrow(|slot| matches!(slot, Slot::Empty)) {
        return Err("this instance already holds an actor; the host calls `create` once".into());
    }
    let Some(entry) = classes.iter().find(|c| c.name == class) else {
        let known: Vec<_> = classes.iter().map(|c| c.name).collect();
        return Err(format!(
            "this program has no actor class `{class}`; it has: {} (list classes in `program!`)",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ));
    };
    let actor = (entry.create)(&init, Context::new(entry.name, rank, extent))?;
    SLOT.set(Slot::Actor(actor));
    Ok(())
}

/// Runs `f` on this instance's actor, with the actor out of the slot so
/// that nothing `f` does can reach it twice.
fn with_actor<R>(f: impl FnOnce(&mut dyn HostedActor) -> R) -> Result<R, String> {
    let mut actor = match SLOT.replace(Slot::Busy) {
        Slot::Actor(actor) => actor,
        other => {
            let why = match other {
                Slot::Busy => {
                    "this actor is already handling a message; the host calls one at a time"
                }
                _ => "this instance holds no actor yet; the host calls `create` first",
            };
            SLOT.set(other);
            return Err(why.into());
        }
    };
    let result = f(actor.as_mut());
    SLOT.set(Slot::Actor(actor));
    Ok(result)
}

/// The component: implements the WIT exports for the program `P`.
pub struct Component<P>(PhantomData<P>);

impl<P: Program> bindings::Guest for Component<P> {
    fn run(args: Vec<String>) -> Result<(), String> {
        log_panics();
        P::main(args)
    }
}

/// The tests are the crate's, wherever `#[monarch_guest::test]` marks them,
/// not the program's: every program exports `tests`, most listing none.
impl<P: Program> wit_tests::Guest for Component<P> {
    fn list_tests() -> Vec<String> {
        crate::testing::list_tests()
    }

    fn run_test(name: String) -> Result<(), String> {
        log_panics();
        crate::testing::run_test(&name)
    }
}

impl<P: Program> actor_class::Guest for Component<P> {
    fn create(class: String, init: Vec<u8>, rank: u32, extent: wit::Extent) -> Result<(), String> {
        log_panics();
        create(P::classes(), class, init, rank, extent.into())
    }

    fn handle(endpoint: String, message: Vec<u8>) -> Result<Vec<u8>, wit::EndpointError> {
        with_actor(|actor| actor.handle(&endpoint, &message))
            .map_err(EndpointError::new)?
            .map_err(Into::into)
    }

    fn supervise(failure: wit::SupervisionFailure) -> bool {
        with_actor(|actor| actor.supervise(&failure.into())).unwrap_or(false)
    }
}

/// Sends panic messages through the host's log, at error level, so that
/// the line that explains a trap carries the mesh and rank of the actor
/// that trapped (the trap itself only says `unreachable`).
fn log_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("(a panic without a message)");
            let at = info
                .location()
                .map(|l| format!(" at {}:{}:{}", l.file(), l.line(), l.column()))
                .unwrap_or_default();
            crate::log::log(
                crate::log::Level::Error,
                &format!("panicked{at}: {message}"),
            );
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Handler, Message, extent};
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    struct Hello;
    impl Message for Hello {
        const ENDPOINT: &'static str = "hello";
        type Reply = String;
    }

    struct Greeter {
        greeting: String,
    }
    impl Actor for Greeter {
        const CLASS: &'static str = "Greeter";
        type Init = String;
        fn create(greeting: String, cx: &Context) -> Result<Self, String> {
            if greeting.is_empty() {
                return Err("a greeting cannot be empty".into());
            }
            Ok(Greeter {
                greeting: format!(
                    "{greeting} from rank {} of {}",
                    cx.rank(),
                    cx.extent().num_ranks()
                ),
            })
        }
        fn endpoints(endpoints: &mut Endpoints<Self>) {
            endpoints.handle::<Hello>();
        }
        fn supervise(&mut self, _cx: &Context, failure: &SupervisionFailure) -> bool {
            failure.mesh == "children"
        }
    }
    impl Handler<Hello> for Greeter {
        async fn handle(&mut self, _cx: &Context, _: Hello) -> Result<String, EndpointError> {
            Ok(self.greeting.clone())
        }
    }

    struct TestProgram;
    impl Program for TestProgram {
        fn main(_args: Vec<String>) -> Result<(), String> {
            Ok(())
        }
        fn classes() -> Vec<Class> {
            vec![class::<Greeter>()]
        }
    }

    type Exports = Component<TestProgram>;
    use actor_class::Guest as _;

    fn wit_extent() -> wit::Extent {
        (&extent!(gpus = 4)).into()
    }

    // Each test runs on its own thread, so each has a fresh instance slot.

    #[test]
    fn create_then_handle_reaches_the_actor_of_that_class() {
        let init = codec::encode_args(&"hello".to_string()).unwrap();
        assert_eq!(
            Exports::create("Greeter".into(), init, 2, wit_extent()),
            Ok(())
        );
        let reply = Exports::handle("hello".into(), codec::encode_args(&Hello).unwrap()).unwrap();
        assert_eq!(
            codec::decode::<String>(&reply).unwrap(),
            "hello from rank 2 of 4"
        );
        let failure = |mesh: &str| wit::SupervisionFailure {
            mesh: mesh.into(),
            rank: 0,
            kind: wit::ErrorKind::Trap,
            endpoint: None,
            type_name: None,
            reason: "trapped".into(),
            backtrace: None,
        };
        assert!(Exports::supervise(failure("children")));
        assert!(!Exports::supervise(failure("others")));
    }

    #[test]
    fn create_names_the_classes_when_the_class_is_unknown() {
        let err = Exports::create("Nope".into(), vec![], 0, wit_extent()).unwrap_err();
        assert!(
            err.contains("no actor class `Nope`; it has: Greeter"),
            "{err}"
        );
        let err = Exports::handle("hello".into(), vec![]).unwrap_err();
        assert!(err.message.contains("holds no actor yet"), "{err:?}");
    }

    #[test]
    fn create_reports_the_actors_own_error_and_a_bad_init() {
        let empty = codec::encode_args(&String::new()).unwrap();
        let err = Exports::create("Greeter".into(), empty, 0, wit_extent()).unwrap_err();
        assert_eq!(err, "a greeting cannot be empty");
        let err = Exports::create("Greeter".into(), vec![9], 0, wit_extent()).unwrap_err();
        assert!(err.contains("cannot decode its init value"), "{err}");
    }

    #[test]
    fn create_runs_once_per_instance() {
        let init = || codec::encode_args(&"hi".to_string()).unwrap();
        assert_eq!(
            Exports::create("Greeter".into(), init(), 0, wit_extent()),
            Ok(())
        );
        let err = Exports::create("Greeter".into(), init(), 0, wit_extent()).unwrap_err();
        assert!(err.contains("already holds an actor"), "{err}");
    }
}

//! wrong-world: a component of the WIT world `monarch:host/actor` instead of
//! `monarch:host/program`. It exports `actor-class` but no `run`, the
//! mistake of building an actor library as if it were a program. The host
//! must refuse it before running anything, naming the missing `run`.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "actor",
});

use exports::monarch::host::actor_class::{
    EndpointError, Extent, Guest, Payload, SupervisionFailure,
};

struct ActorOnly;

impl Guest for ActorOnly {
    fn create(_class: String, _init: Payload, _rank: u32, _extent: Extent) -> Result<(), String> {
        Ok(())
    }

    fn handle(endpoint: String, _message: Payload) -> Result<Payload, EndpointError> {
        Err(EndpointError {
            message: format!("no endpoint `{endpoint}`"),
            type_name: None,
            backtrace: None,
        })
    }

    fn supervise(_failure: SupervisionFailure) -> bool {
        false
    }
}

export!(ActorOnly);

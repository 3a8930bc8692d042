//! controller-only: a component of the WIT world `monarch:host/controller`,
//! written against the bindings alone, as a language without the Rust SDK
//! would. It exports `run` and no actor classes: it logs its arguments,
//! then tries to spawn an actor mesh, which the host must refuse by name,
//! and fails with `fail` as its first argument.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "controller",
});

use monarch::host::logging::{Level, log};
use monarch::host::mesh::spawn_procs;
use monarch::host::types::Dim;

struct ControllerOnly;

impl Guest for ControllerOnly {
    fn run(args: Vec<String>) -> Result<(), String> {
        log(Level::Info, &format!("controller-only runs with {args:?}"));
        if args.first().map(String::as_str) == Some("fail") {
            return Err("asked to fail".into());
        }
        let procs = spawn_procs(&[Dim {
            name: "procs".into(),
            size: 1,
        }])?;
        match procs.spawn("nobody", "Nobody", &[]) {
            Ok(_) => Err("spawned actors of a class it does not define".into()),
            Err(e) => {
                log(Level::Info, &format!("spawn refused: {e}"));
                Ok(())
            }
        }
    }
}

export!(ControllerOnly);

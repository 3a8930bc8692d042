//! A Rust controller calling actors written in Python: the class `Greeter`
//! of `tests/programs/python/greeters.py`, loaded with `monarch-host run
//! polyglot.wasm --actors py=greeters.py`. The Rust side names the class
//! `py/Greeter` and declares the messages it sends; the payloads are the
//! shared encoding (`wit/ENCODING.md`), so Python reads them as arguments
//! and Rust reads Python's replies as its reply types. Prints one line per
//! check, `polyglot ok`, at the end.

use monarch_guest::prelude::*;
use serde::{Deserialize, Serialize};

/// `greet()`: Python's `def greet(self) -> str`.
#[derive(Serialize, Deserialize)]
struct Greet;

impl Message for Greet {
    const ENDPOINT: &'static str = "greet";
    type Reply = String;
}

/// `add(n)`: Python's `def add(self, n: int) -> int`.
#[derive(Serialize, Deserialize)]
struct Add(i64);

impl Message for Add {
    const ENDPOINT: &'static str = "add";
    type Reply = i64;
}

/// `refuse()`: Python raises `ValueError`.
#[derive(Serialize, Deserialize)]
struct Refuse;

impl Message for Refuse {
    const ENDPOINT: &'static str = "refuse";
    type Reply = ();
}

/// The Python class, as this program sees it: its actors run in the
/// library's instances, never as this type.
struct PyGreeter;

impl Actor for PyGreeter {
    const CLASS: &'static str = "py/Greeter";
    type Init = String;

    fn create(_: String, _cx: &Context) -> Result<Self, String> {
        Err("PyGreeter runs in Python".into())
    }

    fn endpoints(_: &mut Endpoints<Self>) {}
}

impl Handler<Greet> for PyGreeter {
    async fn handle(&mut self, _: &Context, _: Greet) -> Result<String, EndpointError> {
        Err(EndpointError::new("runs in Python"))
    }
}

impl Handler<Add> for PyGreeter {
    async fn handle(&mut self, _: &Context, _: Add) -> Result<i64, EndpointError> {
        Err(EndpointError::new("runs in Python"))
    }
}

impl Handler<Refuse> for PyGreeter {
    async fn handle(&mut self, _: &Context, _: Refuse) -> Result<(), EndpointError> {
        Err(EndpointError::new("runs in Python"))
    }
}

async fn main(_args: Vec<String>) -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = 2))?;
    let greeters = procs.spawn::<PyGreeter>("greeters", &"hi".to_string())?;

    for (rank, greeting) in greeters.call(&Greet).await?.iter() {
        info!("rank {rank} says: {greeting}");
    }
    let sum = greeters.sum_i64(&Add(20)).await?;
    info!("summed in the host: {sum}");
    if sum != 41 {
        return Err(format!("expected 20 + 21 = 41, got {sum}"));
    }
    match greeters.at("procs", 1)?.call_one(&Refuse).await {
        Err(e) if e.kind() == ErrorKind::Endpoint && e.type_name() == Some("ValueError") => {
            info!(
                "Python raised {}: {}",
                e.type_name().unwrap_or("-"),
                e.message()
            );
        }
        other => return Err(format!("expected a ValueError, got {other:?}")),
    }
    procs.stop();
    info!("polyglot ok");
    Ok(())
}

monarch_guest::program! {
    main: main,
}

//! failing-tests: a program whose tests (`#[monarch_guest::test]`) end
//! each way a test can, for the host's tests of `monarch-host test`.
//!
//! | test | how it ends |
//! | --- | --- |
//! | `passes` | ok: two `Echo` actors on two procs answer |
//! | `panics_on_an_assertion` | a trap: `assert_eq!(1 + 1, 3)` panics, and the panic hook logs `panicked at tests/programs/failing-tests/src/lib.rs:LINE:COL: assertion `left == right` failed` with `left: 2` and `right: 3` |
//! | `returns_an_error` | `Err("the value was 7, expected 8")`, after the line `returns_an_error says hello` on the controller's stdout and the log line `returns_an_error logs hello` |
//! | `never_finishes` | never: it sleeps in a loop, for the host's per-test timeout |
//!
//! Its `main` only says how to run the tests.

use std::time::Duration;

use monarch_guest::prelude::*;
use serde::{Deserialize, Serialize};

/// `echo`: replies with the text it was sent and the actor's rank.
#[derive(Serialize, Deserialize)]
struct Echo(String);

impl Message for Echo {
    const ENDPOINT: &'static str = "echo";
    type Reply = String;
}

/// Answers `echo`.
struct Echoer {
    rank: u32,
}

impl Actor for Echoer {
    const CLASS: &'static str = "Echoer";
    type Init = ();

    fn create((): (), cx: &Context) -> Result<Self, String> {
        Ok(Echoer { rank: cx.rank() })
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints.handle::<Echo>();
    }
}

impl Handler<Echo> for Echoer {
    async fn handle(&mut self, _cx: &Context, Echo(text): Echo) -> Result<String, EndpointError> {
        Ok(format!("{text} from rank {}", self.rank))
    }
}

#[monarch_guest::test]
async fn passes() -> Result<(), String> {
    let procs = spawn_procs(&extent!(gpus = 2))?;
    let echoers = procs.spawn::<Echoer>("echoers", &())?;
    let replies = echoers.call(&Echo("hi".into())).await?;
    assert_eq!(
        replies.values(),
        ["hi from rank 0".to_string(), "hi from rank 1".to_string()]
    );
    procs.stop();
    Ok(())
}

#[monarch_guest::test]
async fn panics_on_an_assertion() {
    assert_eq!(1 + 1, 3);
}

#[monarch_guest::test]
fn returns_an_error() -> Result<(), String> {
    println!("returns_an_error says hello");
    info!("returns_an_error logs hello");
    let value = 7;
    if value != 8 {
        return Err(format!("the value was {value}, expected 8"));
    }
    Ok(())
}

#[monarch_guest::test]
async fn never_finishes() {
    loop {
        sleep(Duration::from_millis(200)).await;
    }
}

async fn main(_args: Vec<String>) -> Result<(), String> {
    info!("failing-tests has only tests: run them with `monarch-host test failing_tests.wasm`");
    Ok(())
}

monarch_guest::program! {
    main: main,
    actors: [Echoer],
}

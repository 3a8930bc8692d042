//! hog: allocates memory until the host's memory cap (`--memory`) stops it,
//! logging how much it holds at every 4 MiB.
//!
//! - `hog`: the controller allocates. The run must fail with an error, and
//!   the host must not crash.
//! - `hog actor`: a `Hog` actor allocates inside its `eat` endpoint. The
//!   actor fails, the controller's call ends with the error of a failed
//!   actor (kind `out-of-memory`, from a host that tells it from a trap),
//!   and the controller returns Ok.

use monarch_guest::prelude::*;
use serde::{Deserialize, Serialize};

/// How much one allocation takes.
const CHUNK: usize = 1 << 20;

/// `eat`: allocates until the instance runs out of memory; never replies.
#[derive(Serialize, Deserialize)]
struct Eat;

impl Message for Eat {
    const ENDPOINT: &'static str = "eat";
    type Reply = ();
}

/// `ping`: answers at once.
#[derive(Serialize, Deserialize)]
struct Ping;

impl Message for Ping {
    const ENDPOINT: &'static str = "ping";
    type Reply = ();
}

struct Hog;

impl Actor for Hog {
    const CLASS: &'static str = "Hog";
    type Init = ();

    fn create((): (), _cx: &Context) -> Result<Self, String> {
        Ok(Hog)
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints.handle::<Eat>().handle::<Ping>();
    }
}

impl Handler<Ping> for Hog {
    async fn handle(&mut self, _cx: &Context, _: Ping) -> Result<(), EndpointError> {
        Ok(())
    }
}

impl Handler<Eat> for Hog {
    async fn handle(&mut self, cx: &Context, _: Eat) -> Result<(), EndpointError> {
        eat(&format!("hog {}", cx.rank()))
    }
}

/// Holds ever more memory, written to so that none of it can be elided.
fn eat(who: &str) -> ! {
    let mut held: Vec<Vec<u8>> = Vec::new();
    loop {
        held.push(core::hint::black_box(vec![0xA5; CHUNK]));
        let mib = held.len() * (CHUNK >> 20);
        if mib.is_multiple_of(4) {
            info!("{who} holds {mib} MiB");
        }
    }
}

async fn main(args: Vec<String>) -> Result<(), String> {
    match args.first().map(String::as_str) {
        None => eat("the controller"),
        Some("actor") => {
            monarch_guest::supervise(|_| true);
            let procs = spawn_procs(&extent!(procs = 1))?;
            let hogs = procs.spawn::<Hog>("hogs", &())?;
            match hogs.call_one(&Eat).await {
                Err(failure) if failure.kind().is_failure() => {
                    info!("the hog failed: {failure}");
                    procs.stop();
                    Ok(())
                }
                other => Err(format!("expected the hog to fail, got {other:?}")),
            }
        }
        // A failure nobody handles ends the run: crash a hog without a
        // supervisor, then keep waiting on the host until it is noticed.
        Some("unsupervised") => {
            let procs = spawn_procs(&extent!(procs = 2))?;
            let hogs = procs.spawn::<Hog>("hogs", &())?;
            hogs.at("procs", 0)?.broadcast(&Eat)?;
            let healthy = hogs.at("procs", 1)?;
            for _ in 0..100_000 {
                let _ = healthy.call_one(&Ping).await;
            }
            Err("the unhandled failure went unnoticed".into())
        }
        Some(other) => Err(format!(
            "usage: hog [actor|unsupervised]; unknown mode `{other}`"
        )),
    }
}

monarch_guest::program! {
    main: main,
    actors: [Hog],
}

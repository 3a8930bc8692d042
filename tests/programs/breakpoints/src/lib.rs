//! breakpoints: four `Trainer` ranks on two procs (`hosts=2, gpus=2`),
//! each pausing at a `breakpoint!` on a line of its own, for the tests of
//! `monarch-host debug` (tests/debugger.rs).
//!
//! - `breakpoints [CALL_TIMEOUT_MS]`: calls `step(7)` on every rank with
//!   that call timeout (default 60 s) and prints `results: [...]`, each
//!   rank's `7 * 10 + rank`, once the debugger has continued them.
//! - `breakpoints one [CALL_TIMEOUT_MS]`: rank 0 alone pauses; prints its
//!   result, or `failed: ...` with the call's error.

use std::time::Duration;

use monarch_guest::prelude::*;
use serde::{Deserialize, Serialize};

/// `step`: pauses, then replies `x * 10 + rank`.
#[derive(Serialize, Deserialize)]
struct Step {
    x: i64,
    /// Only rank 0 pauses.
    one: bool,
}

impl Message for Step {
    const ENDPOINT: &'static str = "step";
    type Reply = i64;
}

struct Trainer {
    rank: u32,
    lr: f64,
}

impl Actor for Trainer {
    const CLASS: &'static str = "Trainer";
    type Init = f64;

    fn create(lr: f64, cx: &Context) -> Result<Self, String> {
        Ok(Trainer {
            rank: cx.rank(),
            lr,
        })
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints.handle::<Step>();
    }
}

impl Handler<Step> for Trainer {
    async fn handle(&mut self, _cx: &Context, step: Step) -> Result<i64, EndpointError> {
        let x = step.x;
        let rank = self.rank;
        match (rank, step.one) {
            (_, true) if rank != 0 => {}
            (0, _) => monarch_guest::breakpoint!(x, rank, lr = self.lr),
            (1, _) => monarch_guest::breakpoint!(x, rank),
            (2, _) => monarch_guest::breakpoint!(x, rank, doubled = x * 2),
            _ => monarch_guest::breakpoint!(x, rank, name = "last"),
        }
        Ok(x * 10 + i64::from(rank))
    }
}

async fn main(args: Vec<String>) -> Result<(), String> {
    let one = args.first().map(String::as_str) == Some("one");
    let timeout_ms = args
        .iter()
        .find_map(|a| a.parse::<u64>().ok())
        .unwrap_or(60_000);
    monarch_guest::set_call_timeout(Duration::from_millis(timeout_ms));
    let procs = spawn_procs(&extent!(hosts = 2))?;
    let trainers = procs.spawn_with::<Trainer>(
        "trainers-v1",
        &0.5,
        monarch_guest::SpawnOptions::new().per_proc(extent!(gpus = 2)),
    )?;
    let started = std::time::Instant::now();
    match trainers.call(&Step { x: 7, one }).await {
        Ok(values) => {
            let values: Vec<i64> = values.values().to_vec();
            println!(
                "results: {values:?} after {:.1} s (call timeout {:.1} s)",
                started.elapsed().as_secs_f64(),
                timeout_ms as f64 / 1000.0
            );
            Ok(())
        }
        Err(e) => {
            println!("failed: {e}");
            Ok(())
        }
    }
}

monarch_guest::program! {
    main: main,
    actors: [Trainer],
}

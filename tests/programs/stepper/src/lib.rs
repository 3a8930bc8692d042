//! stepper: four `Worker` ranks on two procs (`hosts=2, gpus=2`) for the
//! tests of the debug engine (`monarch-host run --debug`,
//! tests/debug_engine.rs). Built unoptimized with full debug info (see
//! guest-sdk/Cargo.toml), so that each source line has code of its own
//! and each value a Wasm local.
//!
//! - `stepper`: calls `work(7)` on every rank, prints `results: [...]`
//!   (each rank's `compute(7, rank)`), prints `spinning` and calls `spin`
//!   on every rank: rank 0 spins until the run is killed.
//! - `stepper trap`: rank 1 indexes past the end of a vector and traps;
//!   prints `failed: ...` with the call's error.
//! - `stepper bench N`: every rank runs `busy(N)` and the controller
//!   prints `bench: N iterations in S s`.

use monarch_guest::prelude::*;
use serde::{Deserialize, Serialize};

/// `work`: replies `compute(x, rank)`.
#[derive(Serialize, Deserialize)]
struct Work {
    x: i64,
}

impl Message for Work {
    const ENDPOINT: &'static str = "work";
    type Reply = i64;
}

/// `spin`: rank 0 never replies; the others reply at once.
#[derive(Serialize, Deserialize)]
struct Spin;

impl Message for Spin {
    const ENDPOINT: &'static str = "spin";
    type Reply = u64;
}

/// `pick`: replies the `at`th of three values, trapping past the end.
#[derive(Serialize, Deserialize)]
struct Pick {
    at: usize,
}

impl Message for Pick {
    const ENDPOINT: &'static str = "pick";
    type Reply = u32;
}

/// `busy`: `n` rounds of arithmetic; replies the result.
#[derive(Serialize, Deserialize)]
struct Busy {
    n: u64,
}

impl Message for Busy {
    const ENDPOINT: &'static str = "busy";
    type Reply = u64;
}

struct Worker {
    rank: u32,
}

impl Actor for Worker {
    const CLASS: &'static str = "Worker";
    type Init = ();

    fn create((): (), cx: &Context) -> Result<Self, String> {
        Ok(Worker { rank: cx.rank() })
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints
            .handle::<Work>()
            .handle::<Spin>()
            .handle::<Pick>()
            .handle::<Busy>();
    }
}

// The tests find these lines by their text: keep each statement on a
// line of its own.
fn compute(x: i64, rank: u32) -> i64 {
    let total = x * 60606;
    let shifted = total + i64::from(rank);
    shifted * 10
}

fn spin_forever() -> u64 {
    let mut turns: u64 = 0;
    loop {
        turns = core::hint::black_box(turns.wrapping_add(1));
    }
}

fn pick(values: &[u32], at: usize) -> u32 {
    values[at]
}

fn busy(n: u64) -> u64 {
    let mut acc: u64 = 1;
    for i in 0..n {
        acc = acc.wrapping_mul(6364136223846793005).wrapping_add(i);
    }
    acc
}

impl Handler<Work> for Worker {
    async fn handle(&mut self, _cx: &Context, work: Work) -> Result<i64, EndpointError> {
        let result = compute(work.x, self.rank);
        Ok(result)
    }
}

impl Handler<Spin> for Worker {
    async fn handle(&mut self, _cx: &Context, _: Spin) -> Result<u64, EndpointError> {
        match self.rank {
            0 => Ok(spin_forever()),
            _ => Ok(0),
        }
    }
}

impl Handler<Pick> for Worker {
    async fn handle(&mut self, _cx: &Context, pick_at: Pick) -> Result<u32, EndpointError> {
        let values = vec![10, 20, 30];
        let at = match self.rank {
            1 => pick_at.at,
            _ => 0,
        };
        Ok(pick(&values, at))
    }
}

impl Handler<Busy> for Worker {
    async fn handle(&mut self, _cx: &Context, work: Busy) -> Result<u64, EndpointError> {
        Ok(busy(work.n))
    }
}

async fn main(args: Vec<String>) -> Result<(), String> {
    let procs = spawn_procs(&extent!(hosts = 2))?;
    let workers = procs.spawn_with::<Worker>(
        "stepper",
        &(),
        monarch_guest::SpawnOptions::new().per_proc(extent!(gpus = 2)),
    )?;
    match args.first().map(String::as_str) {
        Some("trap") => {
            match workers.call(&Pick { at: 7 }).await {
                Ok(values) => println!("picked: {:?}", values.values()),
                Err(e) => println!("failed: {e}"),
            }
            Ok(())
        }
        Some("bench") => {
            let n = args
                .get(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or(10_000_000);
            let started = std::time::Instant::now();
            workers.call(&Busy { n }).await.map_err(|e| e.to_string())?;
            println!(
                "bench: {n} iterations in {:.3} s",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        _ => {
            let values = workers
                .call(&Work { x: 7 })
                .await
                .map_err(|e| e.to_string())?;
            println!("results: {:?}", values.values());
            println!("spinning");
            monarch_guest::set_call_timeout(std::time::Duration::from_secs(3600));
            let _ = workers.call(&Spin).await;
            Ok(())
        }
    }
}

monarch_guest::program! {
    main: main,
    actors: [Worker],
}

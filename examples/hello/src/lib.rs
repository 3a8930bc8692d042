//! hello: spawns four procs, a `Greeter` on each, calls `greet` on all of
//! them and prints the value mesh of greetings, one line per rank:
//!
//! ```text
//! 4 greetings from a mesh shaped hosts=1, gpus=4:
//! rank 0: hello from rank 0 of 4
//! ...
//! ```
//!
//! Run with an argument to pick the number of procs: `hello 8`. Its tests
//! (`monarch-host test hello.wasm`) check every rank's greeting.

use monarch_guest::prelude::*;
use serde::{Deserialize, Serialize};

/// `greet`: replies with a greeting that names the actor's rank.
#[derive(Serialize, Deserialize)]
struct Greet;

impl Message for Greet {
    const ENDPOINT: &'static str = "greet";
    type Reply = String;
}

/// Knows where it stands in its mesh, and says so.
struct Greeter {
    rank: u32,
    size: usize,
}

impl Actor for Greeter {
    const CLASS: &'static str = "Greeter";
    type Init = ();

    fn create((): (), cx: &Context) -> Result<Self, String> {
        Ok(Greeter {
            rank: cx.rank(),
            size: cx.extent().num_ranks(),
        })
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints.handle::<Greet>();
    }
}

impl Handler<Greet> for Greeter {
    async fn handle(&mut self, _cx: &Context, _: Greet) -> Result<String, EndpointError> {
        Ok(format!("hello from rank {} of {}", self.rank, self.size))
    }
}

async fn main(args: Vec<String>) -> Result<(), String> {
    let gpus = match args.first() {
        None => 4,
        Some(n) => n
            .parse()
            .map_err(|_| format!("usage: hello [PROCS]; `{n}` is not a number of procs"))?,
    };
    let procs = spawn_procs(&extent!(hosts = 1, gpus = gpus))?;
    let greeters = procs.spawn::<Greeter>("greeters", &())?;

    let greetings = greeters.call(&Greet).await?;
    info!(
        "{} greetings from a mesh shaped {}:",
        greetings.len(),
        greetings.extent()
    );
    for (rank, greeting) in greetings.iter() {
        info!("rank {rank}: {greeting}");
    }

    procs.stop();
    Ok(())
}

/// What the greeters of a mesh of `n` say, in rank order.
fn greetings_of(n: usize) -> Vec<String> {
    (0..n)
        .map(|rank| format!("hello from rank {rank} of {n}"))
        .collect()
}

// The tests: `monarch-host test hello.wasm` runs each on a cluster of its own.

#[monarch_guest::test]
async fn every_rank_greets_with_its_rank() -> Result<(), String> {
    let procs = spawn_procs(&extent!(gpus = 3))?;
    let greeters = procs.spawn::<Greeter>("greeters", &())?;
    let greetings = greeters.call(&Greet).await?;
    assert_eq!(greetings.values(), greetings_of(3));
    procs.stop();
    Ok(())
}

#[monarch_guest::test]
async fn a_mesh_of_one_greets_once() -> Result<(), String> {
    let procs = spawn_procs(&extent!(hosts = 1, gpus = 1))?;
    let greeters = procs.spawn::<Greeter>("greeters", &())?;
    let greeting = greeters.at("gpus", 0)?.call_one(&Greet).await?;
    if greeting != "hello from rank 0 of 1" {
        return Err(format!("a mesh of one greeted with {greeting:?}"));
    }
    procs.stop();
    Ok(())
}

monarch_guest::program! {
    main: main,
    actors: [Greeter],
}

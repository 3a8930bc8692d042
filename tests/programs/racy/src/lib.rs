//! A deliberately racy program, for `monarch-host test --sim`: two writers
//! race to claim a name in a registry, and the racy test assumes that the
//! writer told first claims first. That holds on most runs, and fails
//! under the seeds whose latencies deliver writer 1's claim first; the
//! fixed test tells the writers one after the other, and passes under
//! every seed (tests/test_runner.rs, docs/testing.md "Simulation").

use monarch_guest::prelude::*;
use serde::{Deserialize, Serialize};

/// Claims the name for `writer`; true if it was the first.
#[derive(Serialize, Deserialize)]
struct Claim(u32);

impl Message for Claim {
    const ENDPOINT: &'static str = "claim";
    type Reply = bool;
}

/// Who claimed the name first; -1 for nobody.
#[derive(Serialize, Deserialize)]
struct Winner;

impl Message for Winner {
    const ENDPOINT: &'static str = "winner";
    type Reply = i64;
}

/// Tells a writer to claim the name in `registry`.
#[derive(Serialize, Deserialize)]
struct Go {
    registry: MeshRef<Registry>,
}

impl Message for Go {
    const ENDPOINT: &'static str = "go";
    type Reply = bool;
}

struct Registry {
    winner: Option<u32>,
}

impl Actor for Registry {
    const CLASS: &'static str = "Registry";
    type Init = ();

    fn create((): (), _cx: &Context) -> Result<Self, String> {
        Ok(Registry { winner: None })
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints.handle::<Claim>().handle::<Winner>();
    }
}

impl Handler<Claim> for Registry {
    async fn handle(&mut self, _cx: &Context, claim: Claim) -> Result<bool, EndpointError> {
        let first = self.winner.is_none();
        self.winner.get_or_insert(claim.0);
        Ok(first)
    }
}

impl Handler<Winner> for Registry {
    async fn handle(&mut self, _cx: &Context, _: Winner) -> Result<i64, EndpointError> {
        Ok(self.winner.map_or(-1, i64::from))
    }
}

struct Writer {
    rank: u32,
}

impl Actor for Writer {
    const CLASS: &'static str = "Writer";
    type Init = ();

    fn create((): (), cx: &Context) -> Result<Self, String> {
        Ok(Writer { rank: cx.rank() })
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints.handle::<Go>();
    }
}

impl Handler<Go> for Writer {
    async fn handle(&mut self, _cx: &Context, go: Go) -> Result<bool, EndpointError> {
        Ok(go.registry.resolve()?.call_one(&Claim(self.rank)).await?)
    }
}

/// A registry on a proc of its own, and two writers on two more.
fn cluster() -> Result<(ActorMesh<Registry>, ActorMesh<Writer>, Go), String> {
    let registry = spawn_procs(&extent!(procs = 1))?.spawn::<Registry>("registry", &())?;
    let writers = spawn_procs(&extent!(procs = 2))?.spawn::<Writer>("writers", &())?;
    let go = Go {
        registry: registry.to_ref(),
    };
    Ok((registry, writers, go))
}

/// Racy: both writers are told at once, and the test assumes rank 0,
/// told first, claims first.
#[monarch_guest::test]
async fn the_first_writer_told_claims_the_name() -> Result<(), String> {
    let (registry, writers, go) = cluster()?;
    writers.call(&go).await?;
    let winner = registry.call_one(&Winner).await?;
    assert_eq!(
        winner, 0,
        "writer 0 was told first, so it should have claimed first"
    );
    Ok(())
}

/// Fixed: writer 1 is told only once writer 0's claim is done.
#[monarch_guest::test]
async fn the_first_writer_done_claims_the_name() -> Result<(), String> {
    let (registry, writers, go) = cluster()?;
    assert!(writers.at("procs", 0)?.call_one(&go).await?);
    assert!(!writers.at("procs", 1)?.call_one(&go).await?);
    assert_eq!(registry.call_one(&Winner).await?, 0);
    Ok(())
}

async fn main(_args: Vec<String>) -> Result<(), String> {
    info!("racy has only tests: run them with `monarch-host test racy.wasm --sim --seeds 1..1000`");
    Ok(())
}

monarch_guest::program! {
    main: main,
    actors: [Registry, Writer],
}

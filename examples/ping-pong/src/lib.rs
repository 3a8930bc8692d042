//! ping-pong: two actor meshes, `pingers` and `pongers`, on the same two
//! procs. The controller hands each pinger a reference to the pongers
//! (`to_ref`, carried inside a message); each pinger resolves it and hits
//! the ponger of its own rank a few rounds, awaiting every reply inside its
//! handler. The controller then prints the counts both sides kept.

use monarch_guest::prelude::*;
use serde::{Deserialize, Serialize};

const PROCS: u32 = 2;
const ROUNDS: u32 = 3;

/// `serve`: play `rounds` rounds against the partner of the same rank;
/// replies with the number of pongs that came back.
#[derive(Serialize, Deserialize)]
struct Serve {
    partner: MeshRef<Ponger>,
    rounds: u32,
}

impl Message for Serve {
    const ENDPOINT: &'static str = "serve";
    type Reply = u32;
}

/// `ping`: one hit from the pinger at rank `from`; replies with the
/// ponger's running count of hits.
#[derive(Serialize, Deserialize)]
struct Ping {
    from: u32,
}

impl Message for Ping {
    const ENDPOINT: &'static str = "ping";
    type Reply = u32;
}

/// `hits`: how many pings a ponger has taken (an `i64`, so the host can
/// sum it across the mesh).
#[derive(Serialize, Deserialize)]
struct Hits;

impl Message for Hits {
    const ENDPOINT: &'static str = "hits";
    type Reply = i64;
}

struct Pinger {
    rank: u32,
}

impl Actor for Pinger {
    const CLASS: &'static str = "Pinger";
    type Init = ();

    fn create((): (), cx: &Context) -> Result<Self, String> {
        Ok(Pinger { rank: cx.rank() })
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints.handle::<Serve>();
    }
}

impl Handler<Serve> for Pinger {
    async fn handle(&mut self, _cx: &Context, serve: Serve) -> Result<u32, EndpointError> {
        let partner = serve.partner.resolve()?.at("procs", self.rank)?;
        let mut pongs = 0;
        for _ in 0..serve.rounds {
            let count = partner.call_one(&Ping { from: self.rank }).await?;
            info!("pinger {} hit, ponger counts {count}", self.rank);
            pongs += 1;
        }
        Ok(pongs)
    }
}

struct Ponger {
    hits: u32,
}

impl Actor for Ponger {
    const CLASS: &'static str = "Ponger";
    type Init = ();

    fn create((): (), _cx: &Context) -> Result<Self, String> {
        Ok(Ponger { hits: 0 })
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints.handle::<Ping>().handle::<Hits>();
    }
}

impl Handler<Ping> for Ponger {
    async fn handle(&mut self, cx: &Context, ping: Ping) -> Result<u32, EndpointError> {
        if ping.from != cx.rank() {
            return Err(format!("ponger {} was hit by pinger {}", cx.rank(), ping.from).into());
        }
        self.hits += 1;
        Ok(self.hits)
    }
}

impl Handler<Hits> for Ponger {
    async fn handle(&mut self, _cx: &Context, _: Hits) -> Result<i64, EndpointError> {
        Ok(i64::from(self.hits))
    }
}

async fn main(_args: Vec<String>) -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = PROCS))?;
    let pingers = procs.spawn::<Pinger>("pingers", &())?;
    let pongers = procs.spawn::<Ponger>("pongers", &())?;

    info!("{PROCS} pingers serve {ROUNDS} rounds each to {PROCS} pongers");
    let serve = Serve {
        partner: pongers.to_ref(),
        rounds: ROUNDS,
    };
    let pongs = pingers.call(&serve).await?;
    for (rank, pongs) in pongs.iter() {
        info!("pinger {rank} got {pongs} pongs back");
    }

    let hits = pongers.call(&Hits).await?;
    for (rank, hits) in hits.iter() {
        info!("ponger {rank} was hit {hits} times");
    }
    info!("total hits: {}", pongers.sum_i64(&Hits).await?);

    procs.stop();
    Ok(())
}

#[monarch_guest::test]
async fn each_pinger_hits_its_own_ponger_every_round() -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = PROCS))?;
    let pingers = procs.spawn::<Pinger>("pingers", &())?;
    let pongers = procs.spawn::<Ponger>("pongers", &())?;
    let serve = Serve {
        partner: pongers.to_ref(),
        rounds: 4,
    };
    assert_eq!(pingers.call(&serve).await?.values(), [4, 4]);
    assert_eq!(pongers.call(&Hits).await?.values(), [4, 4]);
    procs.stop();
    Ok(())
}

#[monarch_guest::test]
async fn a_ping_from_another_rank_is_an_endpoint_error() -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = PROCS))?;
    let pongers = procs.spawn::<Ponger>("pongers", &())?;
    let err = pongers
        .at("procs", 1)?
        .call_one(&Ping { from: 0 })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Endpoint, "{err}");
    assert_eq!(err.message(), "ponger 1 was hit by pinger 0");
    // The ponger lives on and counted nothing.
    assert_eq!(pongers.sum_i64(&Hits).await?, 0);
    procs.stop();
    Ok(())
}

monarch_guest::program! {
    main: main,
    actors: [Pinger, Ponger],
}

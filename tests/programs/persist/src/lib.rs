//! persist: persistent actor meshes, one step per job (`args[0]`), for
//! tests/persist.rs. Each step prints what it saw as `[controller]` lines.
//!
//! - `spawn NAME PROCS`: spawns the persistent counter `NAME` on PROCS
//!   procs (of the job's persistent mesh) and increments it 5 times.
//! - `read NAME`: looks `NAME` up and prints its totals.
//! - `respawn NAME PROCS`: replaces `NAME` with a fresh counter.
//! - `crash NAME`: makes rank 0 of `NAME` trap; the job goes on.
//! - `stop NAME`: `stop` through a looked-up handle, which leaves it running.
//! - `hold NAME`: calls `NAME` through a reference until a call fails
//!   (it was deleted); prints the error.
//! - `hold-spin NAME`: makes rank 0 of `NAME` spin in its handler until
//!   the mesh is deleted; prints the error the call ends with.
//! - `lookup NAME`: a lookup that must fail; prints why.
//! - `spawn-twice NAME PROCS`: a spawn under a name in use; prints why it
//!   failed.

use monarch_guest::prelude::*;
use serde::{Deserialize, Serialize};

/// `add`: adds an amount; replies with the new total.
#[derive(Serialize, Deserialize)]
struct Add(i64);

impl Message for Add {
    const ENDPOINT: &'static str = "add";
    type Reply = i64;
}

/// `get`: replies with the total.
#[derive(Serialize, Deserialize)]
struct Get;

impl Message for Get {
    const ENDPOINT: &'static str = "get";
    type Reply = i64;
}

/// `crash`: panics, which traps the actor's instance.
#[derive(Serialize, Deserialize)]
struct Crash;

impl Message for Crash {
    const ENDPOINT: &'static str = "crash";
    type Reply = ();
}

/// `spin`: computes until the actor is stopped; never replies.
#[derive(Serialize, Deserialize)]
struct Spin;

impl Message for Spin {
    const ENDPOINT: &'static str = "spin";
    type Reply = ();
}

struct Counter {
    total: i64,
}

impl Actor for Counter {
    const CLASS: &'static str = "Counter";
    type Init = i64;

    fn create(start: i64, _cx: &Context) -> Result<Self, String> {
        Ok(Counter { total: start })
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints
            .handle::<Add>()
            .handle::<Get>()
            .handle::<Crash>()
            .handle::<Spin>();
    }
}

impl Handler<Add> for Counter {
    async fn handle(&mut self, _cx: &Context, Add(amount): Add) -> Result<i64, EndpointError> {
        self.total += amount;
        Ok(self.total)
    }
}

impl Handler<Get> for Counter {
    async fn handle(&mut self, _cx: &Context, _: Get) -> Result<i64, EndpointError> {
        Ok(self.total)
    }
}

impl Handler<Crash> for Counter {
    async fn handle(&mut self, cx: &Context, _: Crash) -> Result<(), EndpointError> {
        panic!("persistent counter {} was asked to crash", cx.rank());
    }
}

impl Handler<Spin> for Counter {
    async fn handle(&mut self, cx: &Context, _: Spin) -> Result<(), EndpointError> {
        info!("counter {} spins", cx.rank());
        loop {
            core::hint::black_box(());
        }
    }
}

async fn totals(counter: &ActorMesh<Counter>) -> Result<Vec<i64>, String> {
    let totals = counter.call(&Get).await.map_err(|e| e.to_string())?;
    Ok(totals.values().to_vec())
}

async fn main(args: Vec<String>) -> Result<(), String> {
    let step = args.first().map(String::as_str).unwrap_or("");
    let name = args.get(1).map(String::as_str).unwrap_or("counter");
    let procs = || -> Result<ProcMesh, String> {
        let count: u32 = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(1);
        Ok(spawn_procs(&extent!(procs = count))?)
    };
    match step {
        "spawn" => {
            let counter = procs()?.spawn_persistent::<Counter>(name, &0)?;
            for _ in 0..5 {
                counter.call(&Add(1)).await.map_err(|e| e.to_string())?;
            }
            info!(
                "spawned {} at {:?}",
                counter.name(),
                totals(&counter).await?
            );
        }
        "respawn" => {
            let counter = procs()?.respawn::<Counter>(name, &0)?;
            info!("respawned {name} at {:?}", totals(&counter).await?);
        }
        "read" => {
            let counter = monarch_guest::lookup_actor_mesh::<Counter>(name)?;
            info!("{name} reads {:?}", totals(&counter).await?);
        }
        "crash" => {
            let counter = monarch_guest::lookup_actor_mesh::<Counter>(name)?;
            let first = counter.slice(&[SliceDim::index("procs", 0)])?;
            match first.call(&Crash).await {
                Err(e) => info!("crash: {} ({e})", e.kind()),
                Ok(_) => return Err("the crash returned".into()),
            }
            // Its failure is the server's: it comes to no supervisor here,
            // and the job carries on.
            sleep(std::time::Duration::from_millis(300)).await;
            let failures = monarch_guest::take_failures();
            info!("failures reported to this job: {}", failures.len());
            match counter.call(&Get).await {
                Err(e) => info!("after the crash: {} ({e})", e.kind()),
                Ok(totals) => info!("after the crash: {:?}", totals.values()),
            }
        }
        "stop" => {
            let counter = monarch_guest::lookup_actor_mesh::<Counter>(name)?;
            counter.stop();
            info!("{name} after stop reads {:?}", totals(&counter).await?);
        }
        "hold" => {
            // Resolves a reference afresh for each call: once the mesh is
            // deleted, nothing the server knew of it is shared, and the
            // call goes to the procs, where its actors are gone.
            let reference = monarch_guest::lookup_actor_mesh::<Counter>(name)?.to_ref();
            monarch_guest::set_call_timeout(std::time::Duration::from_secs(5));
            info!("holding {name}");
            loop {
                let counter = reference.resolve()?;
                match counter.call(&Get).await {
                    Ok(_) => sleep(std::time::Duration::from_millis(50)).await,
                    Err(e) => {
                        info!("after the delete: {} ({e})", e.kind());
                        break;
                    }
                }
            }
        }
        "hold-spin" => {
            let counter = monarch_guest::lookup_actor_mesh::<Counter>(name)?.to_ref();
            monarch_guest::set_call_timeout(std::time::Duration::from_secs(30));
            let first = counter.resolve()?.at("procs", 0)?;
            info!("spinning {name}");
            match first.call_one(&Spin).await {
                Err(e) => info!("after the delete: {} ({e})", e.kind()),
                Ok(()) => return Err("the spin returned".into()),
            }
        }
        "lookup" => match monarch_guest::lookup_actor_mesh::<Counter>(name) {
            Ok(_) => return Err(format!("{name} was found")),
            Err(e) => info!("lookup failed: {e}"),
        },
        "spawn-twice" => match procs()?.spawn_persistent::<Counter>(name, &0) {
            Ok(_) => return Err(format!("{name} was spawned again")),
            Err(e) => info!("spawn failed: {e}"),
        },
        other => return Err(format!("unknown step `{other}`")),
    }
    Ok(())
}

monarch_guest::program! {
    main: main,
    actors: [Counter],
}

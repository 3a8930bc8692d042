//! The guest half of `monarch-bench controller`. The controller measures
//! with the monotonic clock WASI grants every program and logs one line per
//! metric, `BENCH <metric> <value> <unit>`, which the host side prints as
//! JSON.
//!
//! Arguments: `quick` for a smoke run with few iterations.

use std::time::{Duration, Instant};

use monarch_guest::futures::future::join_all;
use monarch_guest::prelude::*;
use monarch_guest::set_call_timeout;
use serde::{Deserialize, Serialize};

/// `echo`: replies with the payload.
#[derive(Serialize, Deserialize)]
struct Echo(Vec<u8>);

impl Message for Echo {
    const ENDPOINT: &'static str = "echo";
    type Reply = Vec<u8>;
}

/// Echoes.
struct Echoer;

impl Actor for Echoer {
    const CLASS: &'static str = "Echoer";
    type Init = ();

    fn create((): (), _cx: &Context) -> Result<Self, String> {
        Ok(Echoer)
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints.handle::<Echo>();
    }
}

impl Handler<Echo> for Echoer {
    async fn handle(&mut self, _cx: &Context, echo: Echo) -> Result<Vec<u8>, String> {
        Ok(echo.0)
    }
}

fn report(metric: &str, value: f64, unit: &str) {
    info!("BENCH {metric} {value} {unit}");
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

struct Sizes {
    hostcalls: u32,
    warmup: u32,
    rtt_samples: u32,
    concurrent_rounds: u32,
    instantiations: u32,
    spawn_actors: u32,
}

async fn main(args: Vec<String>) -> Result<(), String> {
    let quick = args.iter().any(|a| a == "quick");
    let sizes = if quick {
        Sizes {
            hostcalls: 10_000,
            warmup: 100,
            rtt_samples: 1_000,
            concurrent_rounds: 2,
            instantiations: 10,
            spawn_actors: 1_000,
        }
    } else {
        Sizes {
            hostcalls: 1_000_000,
            warmup: 2_000,
            rtt_samples: 20_000,
            concurrent_rounds: 10,
            instantiations: 100,
            spawn_actors: 1_000,
        }
    };

    // A host call that does nothing but cross the boundary and store a value.
    let started = Instant::now();
    for _ in 0..sizes.hostcalls {
        set_call_timeout(Duration::from_secs(60));
    }
    report(
        "hostcall_ns",
        started.elapsed().as_nanos() as f64 / f64::from(sizes.hostcalls),
        "ns",
    );

    let procs = spawn_procs(&extent!(procs = 1))?;
    let echo = procs.spawn::<Echoer>("echo", &())?;
    let payload = Echo(vec![7; 64]);
    for _ in 0..sizes.warmup {
        echo.call_one(&payload).await?;
    }
    let mut samples = Vec::with_capacity(sizes.rtt_samples as usize);
    for _ in 0..sizes.rtt_samples {
        let started = Instant::now();
        echo.call_one(&payload).await?;
        samples.push(started.elapsed());
    }
    report(
        "controller_call_rtt_us",
        median(samples).as_secs_f64() * 1e6,
        "us",
    );

    let mut rates = Vec::new();
    for _ in 0..sizes.concurrent_rounds {
        let started = Instant::now();
        let replies = join_all((0..1000).map(|_| echo.call_one(&payload))).await;
        let elapsed = started.elapsed();
        for reply in replies {
            reply?;
        }
        rates.push(Duration::from_secs_f64(elapsed.as_secs_f64() / 1000.0));
    }
    report(
        "controller_calls_per_s",
        1.0 / median(rates).as_secs_f64(),
        "calls/s",
    );
    echo.stop();

    // One actor: a pooled, precompiled instance plus its `create`.
    let mut samples = Vec::new();
    for i in 0..sizes.instantiations {
        let started = Instant::now();
        let actor = procs.spawn::<Echoer>(&format!("single{i}"), &())?;
        samples.push(started.elapsed());
        actor.stop();
    }
    report(
        "actor_instantiate_us",
        median(samples).as_secs_f64() * 1e6,
        "us",
    );
    procs.stop();

    let many = spawn_procs(&extent!(procs = sizes.spawn_actors))?;
    let started = Instant::now();
    let actors = many.spawn::<Echoer>("many", &())?;
    let spawned = started.elapsed();
    let replies = actors.call(&Echo(vec![1])).await?;
    if replies.len() != sizes.spawn_actors as usize {
        return Err(format!(
            "{} of {} actors answered",
            replies.len(),
            sizes.spawn_actors
        ));
    }
    report("spawn_1000_actors_ms", spawned.as_secs_f64() * 1e3, "ms");
    many.stop();
    Ok(())
}

monarch_guest::program! {
    main: main,
    actors: [Echoer],
}

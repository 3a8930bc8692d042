//! The Rust side of `monarch-bench anylang`: the same measurements as
//! `host/bench/programs/python/anylang.py` and `programs/js/anylang.js`,
//! timed with the monotonic clock WASI grants every program and logged as
//! `BENCH <metric> <value> <unit>` lines that the driver reads.
//!
//! ```text
//! anylang hello                          spawn a proc and an actor, one call
//! anylang bench CALLS WARMUP REPS N...   call round trips (a 0 us and a 20 us
//!                                        handler), then REPS times: a fresh
//!                                        proc, a mesh of N actors on it for each N
//! ```

use std::time::{Duration, Instant};

use monarch_guest::prelude::*;

use crate::{Echoer, Ping, Spin, report};

/// Runs the mode named by `args` (what follows `anylang`).
pub async fn main(args: &[String]) -> Result<(), String> {
    let usage =
        || format!("usage: anylang hello | anylang bench CALLS WARMUP REPS N...; got {args:?}");
    match args.first().map(String::as_str) {
        Some("hello") => hello().await,
        Some("bench") if args.len() >= 4 => {
            let numbers = args[1..]
                .iter()
                .map(|a| a.parse::<u32>())
                .collect::<Result<Vec<u32>, _>>()
                .map_err(|_| usage())?;
            bench(numbers[0], numbers[1], numbers[2], &numbers[3..]).await
        }
        _ => Err(usage()),
    }
}

async fn hello() -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = 1))?;
    let echo = procs.spawn::<Echoer>("echo", &())?;
    if echo.call_one(&Ping(7)).await? != 7 {
        return Err("hello: wrong reply".into());
    }
    procs.stop();
    info!("hello ok");
    Ok(())
}

/// The `q`-quantile of sorted samples, nearest rank.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted
        .get((q * (sorted.len().saturating_sub(1)) as f64).round() as usize)
        .copied()
        .unwrap_or_default()
}

/// Sequential `call_one` round trips of `message`, after `warmup` untimed
/// ones; sorted, in microseconds.
async fn round_trips<M>(
    actor: &ActorMesh<Echoer>,
    message: &M,
    calls: u32,
    warmup: u32,
) -> Result<Vec<f64>, String>
where
    M: Message,
    Echoer: Handler<M>,
{
    for _ in 0..warmup {
        actor.call_one(message).await?;
    }
    let mut micros = Vec::with_capacity(calls as usize);
    for _ in 0..calls {
        let started = Instant::now();
        actor.call_one(message).await?;
        micros.push(started.elapsed().as_secs_f64() * 1e6);
    }
    micros.sort_by(f64::total_cmp);
    Ok(micros)
}

fn spread(metric: &str, us: &[f64]) {
    info!(
        "SPREAD {metric} n={} p10={:.1} p50={:.1} p90={:.1} p99={:.1} us",
        us.len(),
        quantile(us, 0.1),
        quantile(us, 0.5),
        quantile(us, 0.9),
        quantile(us, 0.99)
    );
}

async fn bench(calls: u32, warmup: u32, reps: u32, sizes: &[u32]) -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = 1))?;
    let echo = procs.spawn::<Echoer>("echo", &())?;
    let us = round_trips(&echo, &Ping(1), calls, warmup).await?;
    spread("call_rtt_us", &us);
    report("call_rtt_us", quantile(&us, 0.5), "us");
    let us = round_trips(&echo, &Spin(20), calls, warmup).await?;
    spread("call_rtt_20us_handler_us", &us);
    report("call_rtt_20us_handler_us", quantile(&us, 0.5), "us");
    procs.stop();

    let mut spawns: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
    for rep in 0..reps {
        let fresh = spawn_procs(&extent!(procs = 1))?;
        // The proc loads the program with its first actor: outside the
        // timings.
        fresh
            .spawn::<Echoer>("warm", &())?
            .call_one(&Ping(0))
            .await?;
        for (&n, ms) in sizes.iter().zip(&mut spawns) {
            let started = Instant::now();
            let mesh =
                fresh.spawn_many::<Echoer>(&format!("many{rep}x{n}"), &(), &extent!(actors = n))?;
            let took = started.elapsed();
            let replies = mesh.call(&Ping(1)).await?;
            if replies.len() != n as usize {
                return Err(format!("{} of {n} actors answered", replies.len()));
            }
            mesh.stop();
            ms.push(took.as_secs_f64() * 1e3);
        }
        fresh.stop();
    }
    for (n, ms) in sizes.iter().zip(spawns) {
        if ms.is_empty() {
            continue;
        }
        let runs: Vec<String> = ms.iter().map(|v| format!("{v:.2}")).collect();
        info!("SPREAD spawn_{n}_ms runs={}", runs.join(" "));
        let mut sorted = ms;
        sorted.sort_by(f64::total_cmp);
        report(&format!("spawn_{n}_ms"), quantile(&sorted, 0.5), "ms");
    }
    Ok(())
}

/// Busy-waits on the clock for `micros` microseconds: a handler that
/// computes.
pub fn spin(micros: u64) {
    let end = Instant::now() + Duration::from_micros(micros);
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

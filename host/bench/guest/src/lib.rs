//! The guest half of `monarch-bench controller`, `monarch-bench mesh` and
//! (for Rust) `monarch-bench anylang`.
//! The controller measures with the monotonic clock WASI grants every
//! program and logs one line per metric, `BENCH <metric> <value> <unit>`,
//! which the host side prints as JSON.
//!
//! Arguments: `mesh` for the mesh suite (procs, gathers, broadcasts and
//! reductions over many procs) instead of the controller suite; `quick`
//! for a smoke run with few iterations; `anylang ...` for the Rust side of
//! `monarch-bench anylang` (see [`anylang`]).

mod anylang;
mod scale;

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

/// `ping`: replies with the integer, as the peers' benchmarks echo one.
#[derive(Serialize, Deserialize)]
struct Ping(i64);

impl Message for Ping {
    const ENDPOINT: &'static str = "ping";
    type Reply = i64;
}

/// `spin`: busy-waits on the clock for the given microseconds, then
/// replies with them.
#[derive(Serialize, Deserialize)]
struct Spin(u64);

impl Message for Spin {
    const ENDPOINT: &'static str = "spin";
    type Reply = u64;
}

/// `bump`: counts one more; sent with `broadcast`.
#[derive(Serialize, Deserialize)]
struct Bump;

impl Message for Bump {
    const ENDPOINT: &'static str = "bump";
    type Reply = ();
}

/// `count`: replies with how many `bump`s arrived so far.
#[derive(Serialize, Deserialize)]
struct Count;

impl Message for Count {
    const ENDPOINT: &'static str = "count";
    type Reply = i64;
}

/// Echoes, and counts `bump`s.
struct Echoer {
    bumps: i64,
}

impl Actor for Echoer {
    const CLASS: &'static str = "Echoer";
    type Init = ();

    fn create((): (), _cx: &Context) -> Result<Self, String> {
        Ok(Echoer { bumps: 0 })
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints
            .handle::<Echo>()
            .handle::<Ping>()
            .handle::<Spin>()
            .handle::<Bump>()
            .handle::<Count>();
    }
}

impl Handler<Echo> for Echoer {
    async fn handle(&mut self, _cx: &Context, echo: Echo) -> Result<Vec<u8>, EndpointError> {
        Ok(echo.0)
    }
}

impl Handler<Ping> for Echoer {
    async fn handle(&mut self, _cx: &Context, ping: Ping) -> Result<i64, EndpointError> {
        Ok(ping.0)
    }
}

impl Handler<Spin> for Echoer {
    async fn handle(&mut self, _cx: &Context, spin: Spin) -> Result<u64, EndpointError> {
        anylang::spin(spin.0);
        Ok(spin.0)
    }
}

impl Handler<Bump> for Echoer {
    async fn handle(&mut self, _cx: &Context, Bump: Bump) -> Result<(), EndpointError> {
        self.bumps += 1;
        Ok(())
    }
}

impl Handler<Count> for Echoer {
    async fn handle(&mut self, _cx: &Context, Count: Count) -> Result<i64, EndpointError> {
        Ok(self.bumps)
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
    if args.first().is_some_and(|a| a == "anylang") {
        return anylang::main(&args[1..]).await;
    }
    if args.first().is_some_and(|a| a == "scale") {
        return scale::main(&args[1..]).await;
    }
    if args
        .first()
        .is_some_and(|a| a == "gather-loop" || a == "broadcast-loop")
    {
        return profile_loop(&args).await;
    }
    let quick = args.iter().any(|a| a == "quick");
    if args.iter().any(|a| a == "mesh") {
        return mesh_suite(quick).await;
    }
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
    // The raw import, not the SDK's wrapper, which also keeps the value.
    for _ in 0..sizes.hostcalls {
        monarch_guest::bindings::monarch::host::mesh::set_call_timeout(Some(60_000));
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

/// How much the mesh suite measures.
struct MeshSizes {
    /// Timed spawns (fresh procs each) per proc count.
    spawn_reps: usize,
    /// Untimed gathers before the timed ones, per mesh.
    gather_warmup: usize,
    /// Timed gathers per mesh.
    gather_samples: usize,
    /// Timed runs of 100 broadcasts and a call.
    broadcast_reps: usize,
    /// Untimed reduced calls to the 1,024 actors.
    reduce_warmup: usize,
    /// Timed reduced calls to the 1,024 actors.
    reduce_samples: usize,
}

/// Procs in the larger meshes.
const PROCS: u32 = 16;
/// Actors per proc in `cast_reduce_1024_us`.
const ACTORS_PER_PROC: u32 = 64;
/// Broadcasts before the call in `broadcast_100_then_call_16_ms`.
const BROADCASTS: i64 = 100;

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Logs every sample of a metric, for the spreads on the host's stderr.
fn samples_line(metric: &str, samples: &[Duration], unit: fn(Duration) -> f64) {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let at = |q: f64| {
        sorted
            .get(((sorted.len().saturating_sub(1)) as f64 * q).round() as usize)
            .map(|d| unit(*d))
            .unwrap_or_default()
    };
    info!(
        "SPREAD {metric} n={} p10={:.1} p50={:.1} p90={:.1} max={:.1}",
        sorted.len(),
        at(0.1),
        at(0.5),
        at(0.9),
        at(1.0)
    );
}

/// Spawns `count` procs, an actor on each and makes a first gathered call;
/// returns the time all that took and the meshes.
async fn spawn_and_call(
    count: u32,
    name: &str,
) -> Result<(Duration, ProcMesh, ActorMesh<Echoer>), String> {
    let started = Instant::now();
    let procs = spawn_procs(&extent!(procs = count))?;
    let actors = procs.spawn::<Echoer>(name, &())?;
    let replies = actors.call(&Ping(1)).await?;
    let elapsed = started.elapsed();
    if replies.len() != count as usize {
        return Err(format!("{} of {count} actors answered", replies.len()));
    }
    Ok((elapsed, procs, actors))
}

/// Latencies of `samples` sequential gathered calls to `actors`, after
/// `warmup` untimed ones.
async fn gathers(
    actors: &ActorMesh<Echoer>,
    warmup: usize,
    samples: usize,
) -> Result<Vec<Duration>, String> {
    let expected = actors.len();
    for i in 0..warmup {
        actors.call(&Ping(i as i64)).await?;
    }
    let mut timed = Vec::with_capacity(samples);
    for i in 0..samples {
        let started = Instant::now();
        let replies = actors.call(&Ping(i as i64)).await?;
        timed.push(started.elapsed());
        if replies.len() != expected {
            return Err(format!("{} of {expected} actors answered", replies.len()));
        }
        if let Some((rank, wrong)) = replies.iter().find(|(_, v)| **v != i as i64) {
            return Err(format!("actor {rank} echoed {wrong} for {i}"));
        }
    }
    Ok(timed)
}

/// Median latency of sequential gathered calls to `actors`.
async fn gather_metric(
    metric: &str,
    actors: &ActorMesh<Echoer>,
    sizes: &MeshSizes,
) -> Result<(), String> {
    let samples = gathers(actors, sizes.gather_warmup, sizes.gather_samples).await?;
    samples_line(metric, &samples, micros);
    report(metric, micros(median(samples)), "us");
    Ok(())
}

/// Logs how a gather's latency grows with the procs it reaches, over
/// slices of `actors` (no metric: a reading aid).
async fn gather_scaling(actors: &ActorMesh<Echoer>, sizes: &MeshSizes) -> Result<(), String> {
    let mut line = String::from("SCALE call_gather_us by procs:");
    for procs in [1, 2, 4, 8] {
        let slice = actors.slice(&[SliceDim::range("procs", 0..procs)])?;
        let samples = gathers(&slice, sizes.gather_warmup / 4, sizes.gather_samples / 4).await?;
        line.push_str(&format!(" {procs}={:.1}", micros(median(samples))));
    }
    info!("{line}");
    Ok(())
}

/// A workload of the mesh suite in a loop, for profilers (`perf record
/// -a`, `perf sched`): `gather-loop [PROCS [SLICE [SECONDS]]]` makes
/// gathered calls to the first SLICE of PROCS procs (16 and all by
/// default) for SECONDS (10 by default), `broadcast-loop` runs 100
/// broadcasts and a call over 16 procs; the mean time of one goes to the
/// log. Run it as `monarch-host run
/// controller_bench.wasm -- gather-loop 16`.
async fn profile_loop(args: &[String]) -> Result<(), String> {
    let arg = |at: usize, default: u32| {
        args.get(at)
            .map(|a| a.parse::<u32>().map_err(|e| format!("`{a}`: {e}")))
            .unwrap_or(Ok(default))
    };
    let procs = arg(1, PROCS)?;
    let slice = arg(2, procs)?.min(procs);
    let seconds = arg(3, 10)?;
    let (_, _procs, all) = spawn_and_call(procs, "loop").await?;
    let actors = all.slice(&[SliceDim::range("procs", 0..slice)])?;
    let started = Instant::now();
    let mut count = 0u64;
    while started.elapsed() < Duration::from_secs(seconds.into()) {
        if args[0] == "broadcast-loop" {
            for _ in 0..BROADCASTS {
                actors.broadcast(&Bump).map_err(|e| e.to_string())?;
            }
            actors.call(&Count).await?;
        } else {
            actors.call(&Ping(count as i64)).await?;
        }
        count += 1;
    }
    let what = match args[0].as_str() {
        "broadcast-loop" => format!("{BROADCASTS} broadcasts and a call over {slice} procs"),
        _ => format!("gathers over {slice} of {procs} procs"),
    };
    info!(
        "LOOP {count} x {what} in {:.1} s: {:.1} us each",
        started.elapsed().as_secs_f64(),
        micros(started.elapsed()) / count.max(1) as f64
    );
    Ok(())
}

/// The mesh suite; see `host/bench/src/mesh.rs` for what each metric is.
async fn mesh_suite(quick: bool) -> Result<(), String> {
    let sizes = if quick {
        MeshSizes {
            spawn_reps: 1,
            gather_warmup: 10,
            gather_samples: 50,
            broadcast_reps: 2,
            reduce_warmup: 3,
            reduce_samples: 10,
        }
    } else {
        MeshSizes {
            spawn_reps: 5,
            gather_warmup: 200,
            gather_samples: 2_000,
            broadcast_reps: 21,
            reduce_warmup: 20,
            reduce_samples: 300,
        }
    };
    set_call_timeout(Duration::from_secs(60));

    // The calls are timed on the meshes of the first timed spawns, before
    // the other spawns, so that no other procs share the CPUs with them
    // (not even ones still on their way out after a stop).
    let mut spawned8 = Vec::new();
    let (elapsed, procs8, actors8) = spawn_and_call(8, "spawn8x0").await?;
    spawned8.push(elapsed);
    gather_metric("call_gather_8_us", &actors8, &sizes).await?;
    actors8.stop();
    procs8.stop();

    let mut spawned16 = Vec::new();
    let (elapsed, procs, actors) = spawn_and_call(PROCS, "spawn16x0").await?;
    spawned16.push(elapsed);
    gather_metric("call_gather_16_us", &actors, &sizes).await?;
    gather_scaling(&actors, &sizes).await?;

    // 100 broadcasts, then one gathered call: per-sender FIFO puts the
    // call behind every broadcast, so its replies mean all have landed.
    let before = actors.call(&Count).await?;
    let mut samples = Vec::new();
    for rep in 0..sizes.broadcast_reps.max(1) as i64 {
        let started = Instant::now();
        for _ in 0..BROADCASTS {
            actors.broadcast(&Bump).map_err(|e| e.to_string())?;
        }
        let counts = actors.call(&Count).await?;
        samples.push(started.elapsed());
        for (rank, (count, start)) in counts.values().iter().zip(before.values()).enumerate() {
            if *count != start + BROADCASTS * (rep + 1) {
                return Err(format!(
                    "actor {rank} counted {} broadcasts, expected {}",
                    count - start,
                    BROADCASTS * (rep + 1)
                ));
            }
        }
    }
    let failures = monarch_guest::take_failures();
    if !failures.is_empty() {
        return Err(format!("broadcasts failed: {failures:?}"));
    }
    samples_line("broadcast_100_then_call_16_ms", &samples, millis);
    report(
        "broadcast_100_then_call_16_ms",
        millis(median(samples)),
        "ms",
    );
    actors.stop();

    // 64 actors on each of the 16 procs, a call summed in the host.
    let started = Instant::now();
    let many = procs.spawn_many::<Echoer>("reduce", &(), &extent!(actors = ACTORS_PER_PROC))?;
    let total = (PROCS * ACTORS_PER_PROC) as i64;
    let sum = many.sum_i64(&Ping(1)).await?;
    info!(
        "spawned {total} actors on {PROCS} procs and called them in {:.1} ms",
        millis(started.elapsed())
    );
    if sum != total {
        return Err(format!("the sum over {total} actors was {sum}"));
    }
    for _ in 0..sizes.reduce_warmup {
        many.sum_i64(&Ping(1)).await?;
    }
    let mut samples = Vec::with_capacity(sizes.reduce_samples);
    for _ in 0..sizes.reduce_samples {
        let started = Instant::now();
        let sum = many.sum_i64(&Ping(1)).await?;
        samples.push(started.elapsed());
        if sum != total {
            return Err(format!("the sum over {total} actors was {sum}"));
        }
    }
    samples_line("cast_reduce_1024_us", &samples, micros);
    report("cast_reduce_1024_us", micros(median(samples)), "us");
    many.stop();
    procs.stop();

    // The rest of the timed spawns, each of fresh procs, stopped after.
    for (count, samples) in [(8, &mut spawned8), (PROCS, &mut spawned16)] {
        for rep in 1..sizes.spawn_reps {
            let (elapsed, procs, actors) =
                spawn_and_call(count, &format!("spawn{count}x{rep}")).await?;
            samples.push(elapsed);
            actors.stop();
            procs.stop();
        }
        let metric = format!("spawn_procs_{count}_ms");
        samples_line(&metric, samples, millis);
        report(&metric, millis(median(samples.clone())), "ms");
    }
    Ok(())
}

monarch_guest::program! {
    main: main,
    actors: [Echoer],
}

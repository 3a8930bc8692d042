//! The guest half of `monarch-bench scale`: actor meshes of growing size on
//! one set of procs (one proc a simulated host), a timed spawn and timed
//! cast-and-reduce calls at each size.
//!
//! Arguments after `scale`: `procs=P sizes=K1,K2,.. reps=R warmup=W`; at
//! each size `K` the mesh holds `P x K` actors (`spawn_many` with
//! `actors = K` on every proc).
//!
//! Besides `BENCH` lines it logs `MARK <moment> <actors>` lines at the
//! moments the host samples memory, CPU time and message counters (the
//! host's log sink sees each line as it is logged, so a sample is taken
//! before the program goes on), and `SAMPLES <metric> <us> ..` with every
//! timed call, from which the host takes the median and the spread.

use std::time::{Duration, Instant};

use monarch_guest::prelude::*;
use monarch_guest::set_call_timeout;

use crate::{Echoer, Ping, report};

/// What the host asked for.
struct Plan {
    procs: u32,
    sizes: Vec<u32>,
    reps: usize,
    warmup: usize,
}

fn parse(args: &[String]) -> Result<Plan, String> {
    let mut plan = Plan {
        procs: 0,
        sizes: Vec::new(),
        reps: 0,
        warmup: 0,
    };
    for arg in args {
        let (key, value) = arg
            .split_once('=')
            .ok_or_else(|| format!("scale: argument {arg:?} is not KEY=VALUE"))?;
        let number = |v: &str| {
            v.parse::<u32>()
                .map_err(|_| format!("scale: {key}={v} is not a number"))
        };
        match key {
            "procs" => plan.procs = number(value)?,
            "reps" => plan.reps = number(value)? as usize,
            "warmup" => plan.warmup = number(value)? as usize,
            "sizes" => {
                plan.sizes = value.split(',').map(number).collect::<Result<_, _>>()?;
            }
            other => return Err(format!("scale: unknown argument {other}")),
        }
    }
    if plan.procs == 0 || plan.reps == 0 || plan.sizes.is_empty() || plan.sizes.contains(&0) {
        return Err("scale: needs procs=P sizes=K,.. reps=R, all above 0".into());
    }
    Ok(plan)
}

fn mark(moment: &str, actors: u32) {
    info!("MARK {moment} {actors}");
}

/// The scale suite; see `host/bench/src/scale.rs` for what each metric is.
pub async fn main(args: &[String]) -> Result<(), String> {
    let plan = parse(args)?;
    set_call_timeout(Duration::from_secs(120));

    let started = Instant::now();
    let procs = spawn_procs(&extent!(procs = plan.procs))?;
    // One actor on each proc and a gathered call: every proc is up.
    let probe = procs.spawn::<Echoer>("probe", &())?;
    let replies = probe.call(&Ping(1)).await?;
    if replies.len() != plan.procs as usize {
        return Err(format!(
            "{} of {} procs answered",
            replies.len(),
            plan.procs
        ));
    }
    report(
        "spawn_procs_ms",
        started.elapsed().as_secs_f64() * 1e3,
        "ms",
    );
    probe.stop();
    mark("procs", 0);

    for (i, &per_proc) in plan.sizes.iter().enumerate() {
        let total = plan.procs * per_proc;
        let expected = i64::from(total);
        mark("before", total);
        let started = Instant::now();
        let mesh =
            procs.spawn_many::<Echoer>(&format!("scale{i}"), &(), &extent!(actors = per_proc))?;
        let sum = mesh.sum_i64(&Ping(1)).await?;
        let spawned = started.elapsed();
        if sum != expected {
            return Err(format!("the first sum over {total} actors was {sum}"));
        }
        mark("spawned", total);
        report(
            &format!("spawn_actors_ms_{total}"),
            spawned.as_secs_f64() * 1e3,
            "ms",
        );
        for _ in 0..plan.warmup {
            let sum = mesh.sum_i64(&Ping(1)).await?;
            if sum != expected {
                return Err(format!("a sum over {total} actors was {sum}"));
            }
        }
        mark("casts", total);
        let mut samples = Vec::with_capacity(plan.reps);
        for _ in 0..plan.reps {
            let started = Instant::now();
            let sum = mesh.sum_i64(&Ping(1)).await?;
            samples.push(started.elapsed());
            if sum != expected {
                return Err(format!("a sum over {total} actors was {sum}"));
            }
        }
        mark("casted", total);
        let line: Vec<String> = samples
            .iter()
            .map(|d| format!("{:.1}", d.as_secs_f64() * 1e6))
            .collect();
        info!("SAMPLES cast_reduce_us_{total} {}", line.join(" "));
        mesh.stop();
    }
    procs.stop();
    Ok(())
}

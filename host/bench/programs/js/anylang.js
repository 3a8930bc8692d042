// The JavaScript side of `monarch-bench anylang`: the same measurements as
// the Rust guest's `anylang` mode (host/bench/guest) and
// programs/python/anylang.py, timed with performance.now() (the WASI
// monotonic clock) and printed as `BENCH <metric> <value> <unit>` lines
// that the driver reads.
//
//   hello                          spawn a proc and an actor, one call
//   bench CALLS WARMUP REPS N...   call round trips (a 0 us and a 20 us
//                                  handler), then REPS times: a fresh proc,
//                                  a mesh of N actors on it for each N

import { Actor, thisHost } from "monarch";

export class Echoer extends Actor {
  static endpoints = ["ping", "spin"];

  ping(x) {
    return x;
  }

  /** Busy-waits on the clock: a handler that computes for `us` us. */
  spin(us) {
    const end = performance.now() + us / 1000;
    while (performance.now() < end) {
      // spin
    }
    return us;
  }
}

function quantile(sorted, q) {
  return sorted[Math.round(q * (sorted.length - 1))];
}

function rtt(actor, endpoint, arg, calls, warmup) {
  const ep = actor.endpoint(endpoint);
  for (let i = 0; i < warmup; i++) ep.callOne(arg).get();
  const us = [];
  for (let i = 0; i < calls; i++) {
    const started = performance.now();
    ep.callOne(arg).get();
    us.push((performance.now() - started) * 1000);
  }
  return us.sort((a, b) => a - b);
}

function report(metric, value, unit) {
  console.log(`BENCH ${metric} ${value} ${unit}`);
}

function spread(metric, us) {
  const q = (p) => quantile(us, p).toFixed(1);
  console.log(`SPREAD ${metric} n=${us.length} p10=${q(0.1)} p50=${q(0.5)} p90=${q(0.9)} p99=${q(0.99)} us`);
}

function hello() {
  const procs = thisHost().spawnProcs({ procs: 1 });
  const echo = procs.spawn("echo", Echoer);
  if (echo.ping.callOne(7).get() !== 7) throw new Error("hello: wrong reply");
  procs.stop();
  console.log("hello ok");
}

function bench(calls, warmup, reps, sizes) {
  const procs = thisHost().spawnProcs({ procs: 1 });
  const echo = procs.spawn("echo", Echoer);
  for (const [metric, endpoint, arg] of [
    ["call_rtt_us", "ping", 1],
    ["call_rtt_20us_handler_us", "spin", 20],
  ]) {
    const us = rtt(echo, endpoint, arg, calls, warmup);
    spread(metric, us);
    report(metric, quantile(us, 0.5), "us");
  }
  procs.stop();

  const spawns = new Map(sizes.map((n) => [n, []]));
  for (let rep = 0; rep < reps; rep++) {
    const fresh = thisHost().spawnProcs({ procs: 1 });
    // The proc loads the program with its first actor: outside the timings.
    fresh.spawn("warm", Echoer).ping.callOne(0).get();
    for (const n of sizes) {
      const started = performance.now();
      const mesh = fresh.spawnWith(`many${rep}x${n}`, Echoer, { perProc: { actors: n } });
      const took = performance.now() - started;
      const replies = mesh.ping.call(1).get();
      if (replies.length !== n) throw new Error(`${replies.length} of ${n} actors answered`);
      mesh.stop();
      spawns.get(n).push(took);
    }
    fresh.stop();
  }
  for (const n of sizes) {
    const ms = spawns.get(n);
    if (ms.length === 0) continue;
    console.log(`SPREAD spawn_${n}_ms runs=${ms.map((v) => v.toFixed(2)).join(" ")}`);
    report(`spawn_${n}_ms`, quantile([...ms].sort((a, b) => a - b), 0.5), "ms");
  }
}

export function main(args) {
  if (args[0] === "hello") return hello();
  if (args[0] === "bench" && args.length >= 4) {
    const [calls, warmup, reps, ...sizes] = args.slice(1).map(Number);
    return bench(calls, warmup, reps, sizes);
  }
  throw new Error(`usage: anylang.js hello | bench CALLS WARMUP REPS N...; got ${JSON.stringify(args)}`);
}

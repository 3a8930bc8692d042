"""The Python side of `monarch-bench anylang`: the same measurements as the
Rust guest's `anylang` mode (host/bench/guest) and programs/js/anylang.js,
timed with the WASI monotonic clock (time.perf_counter_ns) and printed as
`BENCH <metric> <value> <unit>` lines that the driver reads.

    hello                          spawn a proc and an actor, one call
    bench CALLS WARMUP REPS N...   call round trips (a 0 us and a 20 us
                                   handler), then REPS times: a fresh proc,
                                   a mesh of N actors on it for each N
"""

import sys
import time

from monarch.actor import Actor, endpoint, this_host


class Echoer(Actor):
    @endpoint
    def ping(self, x):
        return x

    @endpoint
    def spin(self, us):
        # Busy-waits on the clock: a handler that computes for `us` us.
        end = time.perf_counter_ns() + us * 1000
        while time.perf_counter_ns() < end:
            pass
        return us


def spawn_many(procs, name, n):
    """A mesh of `n` actors on every proc of `procs`.

    The Python SDK's `ProcMesh.spawn` puts one actor on each proc (as
    Monarch's does) and has no per-proc extent, so this goes through the
    WIT's `spawn-with`, as `procs.spawnWith(..., {perProc})` does in
    JavaScript and `spawn_many` in Rust.
    """
    from monarch import _runtime
    from wit_world.imports import types as wt

    init = _runtime._encode_args((), {})
    options = wt.SpawnOptions([wt.Dim("actors", n)], None)
    handle = procs._handle.spawn_with(name, _runtime.class_key(Echoer), init, options)
    return _runtime.ActorMesh(handle, Echoer, _runtime._extent_of(handle.extent()), name)


def quantile(sorted_samples, q):
    return sorted_samples[round(q * (len(sorted_samples) - 1))]


def rtt(actor, endpoint_name, arg, calls, warmup):
    ep = getattr(actor, endpoint_name)
    for _ in range(warmup):
        ep.call_one(arg).get()
    samples = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        ep.call_one(arg).get()
        samples.append(time.perf_counter_ns() - started)
    samples.sort()
    return [s / 1000 for s in samples]


def report(metric, value, unit):
    print(f"BENCH {metric} {value} {unit}")


def spread(metric, us):
    print(f"SPREAD {metric} n={len(us)} p10={quantile(us, 0.1):.1f} p50={quantile(us, 0.5):.1f} "
          f"p90={quantile(us, 0.9):.1f} p99={quantile(us, 0.99):.1f} us")


def hello():
    procs = this_host().spawn_procs(per_host={"procs": 1})
    echo = procs.spawn("echo", Echoer)
    if echo.ping.call_one(7).get() != 7:
        raise SystemExit("hello: wrong reply")
    procs.stop()
    print("hello ok")


def bench(calls, warmup, reps, sizes):
    procs = this_host().spawn_procs(per_host={"procs": 1})
    echo = procs.spawn("echo", Echoer)
    for metric, name, arg in [("call_rtt_us", "ping", 1), ("call_rtt_20us_handler_us", "spin", 20)]:
        us = rtt(echo, name, arg, calls, warmup)
        spread(metric, us)
        report(metric, quantile(us, 0.5), "us")
    procs.stop()

    spawns = {n: [] for n in sizes}
    for rep in range(reps):
        fresh = this_host().spawn_procs(per_host={"procs": 1})
        # The proc loads the program with its first actor: outside the timings.
        fresh.spawn("warm", Echoer).ping.call_one(0).get()
        for n in sizes:
            started = time.perf_counter_ns()
            mesh = spawn_many(fresh, f"many{rep}x{n}", n)
            took = time.perf_counter_ns() - started
            replies = mesh.ping.call(1).get().values()
            if len(replies) != n:
                raise SystemExit(f"{len(replies)} of {n} actors answered")
            mesh.stop()
            spawns[n].append(took / 1e6)
        fresh.stop()
    for n in sizes:
        if spawns[n]:
            ms = sorted(spawns[n])
            print(f"SPREAD spawn_{n}_ms runs={' '.join(f'{v:.2f}' for v in spawns[n])}")
            report(f"spawn_{n}_ms", quantile(ms, 0.5), "ms")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["hello"]:
        hello()
    elif args[:1] == ["bench"] and len(args) >= 4:
        bench(int(args[1]), int(args[2]), int(args[3]), [int(n) for n in args[4:]])
    else:
        raise SystemExit(f"usage: anylang.py hello | bench CALLS WARMUP REPS N...; got {args}")

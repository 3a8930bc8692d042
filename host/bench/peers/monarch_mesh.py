"""The workloads of `monarch-bench mesh`, on PyTorch Monarch 0.7.0.

Run by `monarch-bench mesh --peers` (or by hand, from any directory):

    target/peers-venv/bin/python host/bench/peers/monarch_mesh.py [--quick]

Prints one JSON object a line on stdout and nothing else:

    {"suite":"mesh","metric":"call_gather_8_us","peer":"monarch-0.7.0","value":2671.06,"unit":"us"}

Logs, spreads and repetition counts go to stderr. Everything runs on the
local machine: `this_host().spawn_procs` starts every proc as a child
process of this one, as `monarch-bench mesh` starts its procs.

The workloads follow the guest program of the suite (`host/bench/guest`,
`mesh_suite`) in the same order, with fewer repetitions so that the whole
script stays under a minute on two cores:

- `spawn_procs_{8,16}_ms`: spawn N procs, one actor on each, and gather a
  first call from all of them; median of SPAWN_REPS, each of fresh procs.
- `call_gather_{8,16}_us`: sequential `call`s of an integer echo to one
  actor in each of N procs, every reply gathered and checked; median of
  GATHER_SAMPLES after GATHER_WARMUP untimed calls.
- `broadcast_100_then_call_16_ms`: 100 `broadcast`s (fire and forget) of a
  counter bump to 16 actors, then one gathered `call` that reads the
  counters (checked: every actor saw every bump); median of
  BROADCAST_REPS.
- `cast_reduce_1024_us`: 1,024 actors, 64 on each of the 16 procs. A Monarch
  0.7.0 actor mesh has one actor per proc, so these are 64 actor meshes of
  16; a call is sent to all 64 at once and the 1,024 replies summed here,
  in the client (Monarch's `Accumulator` folds in the client too); median
  of REDUCE_SAMPLES after REDUCE_WARMUP.
"""

import json
import os
import statistics
import sys
import time

PEER = "monarch-0.7.0"
SUITE = "mesh"

# Stdout carries records only: keep the real stdout for them and send
# everything else written to fd 1 (this process's prints, Monarch's banner,
# the procs it forks, which inherit fd 1) to stderr.
_RECORDS = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)

QUICK = "--quick" in sys.argv[1:]
SPAWN_REPS = 1 if QUICK else 5
GATHER_WARMUP = 10 if QUICK else 50
GATHER_SAMPLES = 30 if QUICK else 500
BROADCAST_REPS = 2 if QUICK else 11
BROADCASTS = 100
REDUCE_WARMUP = 2 if QUICK else 5
REDUCE_SAMPLES = 5 if QUICK else 30
PROCS = 16
ACTORS_PER_PROC = 64

from monarch.actor import Actor, endpoint, this_host  # noqa: E402


class Echo(Actor):
    """An integer echo and a counter, like the guest's `Echoer`."""

    def __init__(self) -> None:
        self.bumps = 0

    @endpoint
    def echo(self, x: int) -> int:
        return x

    @endpoint
    def bump(self) -> None:
        self.bumps += 1

    @endpoint
    def count(self) -> int:
        return self.bumps


def log(msg: str) -> None:
    print(f"[{PEER}] {msg}", file=sys.stderr, flush=True)


def report(metric: str, value: float, unit: str) -> None:
    record = {
        "suite": SUITE,
        "metric": metric,
        "peer": PEER,
        "value": round(value, 2),
        "unit": unit,
    }
    _RECORDS.write(json.dumps(record, separators=(",", ":")) + "\n")
    _RECORDS.flush()


def spread(metric: str, samples: list, unit: str) -> None:
    s = sorted(samples)

    def at(q: float) -> float:
        return s[round((len(s) - 1) * q)]

    log(
        f"SPREAD {metric} n={len(s)} p10={at(0.1):.1f} p50={at(0.5):.1f} "
        f"p90={at(0.9):.1f} max={s[-1]:.1f} {unit}"
    )


def values(value_mesh) -> list:
    return [v for _, v in value_mesh.items()]


def spawn_and_call(host, count: int, name: str):
    started = time.perf_counter()
    procs = host.spawn_procs(per_host={"procs": count})
    actors = procs.spawn(name, Echo)
    replies = values(actors.echo.call(1).get())
    elapsed = time.perf_counter() - started
    if replies != [1] * count:
        raise RuntimeError(f"{len(replies)} of {count} actors answered: {replies}")
    return elapsed * 1e3, procs, actors


def gathers(actors, count: int) -> list:
    for i in range(GATHER_WARMUP):
        actors.echo.call(i).get()
    samples = []
    for i in range(GATHER_SAMPLES):
        started = time.perf_counter()
        replies = values(actors.echo.call(i).get())
        samples.append((time.perf_counter() - started) * 1e6)
        if replies != [i] * count:
            raise RuntimeError(f"call {i} gathered {replies}")
    return samples


def gather_metric(metric: str, actors, count: int) -> None:
    samples = gathers(actors, count)
    spread(metric, samples, "us")
    report(metric, statistics.median(samples), "us")


def main() -> None:
    began = time.perf_counter()
    log(
        f"spawn reps {SPAWN_REPS}, gathers {GATHER_WARMUP} + {GATHER_SAMPLES}, "
        f"broadcast reps {BROADCAST_REPS}, reduce {REDUCE_WARMUP} + {REDUCE_SAMPLES}"
    )
    host = this_host()

    spawned8 = []
    elapsed, procs8, actors8 = spawn_and_call(host, 8, "spawn8x0")
    spawned8.append(elapsed)
    gather_metric("call_gather_8_us", actors8, 8)
    procs8.stop().get()

    spawned16 = []
    elapsed, procs, actors = spawn_and_call(host, PROCS, "spawn16x0")
    spawned16.append(elapsed)
    gather_metric("call_gather_16_us", actors, PROCS)

    before = values(actors.count.call().get())
    samples = []
    for rep in range(BROADCAST_REPS):
        started = time.perf_counter()
        for _ in range(BROADCASTS):
            actors.bump.broadcast()
        counts = values(actors.count.call().get())
        samples.append((time.perf_counter() - started) * 1e3)
        expected = [b + BROADCASTS * (rep + 1) for b in before]
        if counts != expected:
            raise RuntimeError(f"counted {counts} broadcasts, expected {expected}")
    spread("broadcast_100_then_call_16_ms", samples, "ms")
    report("broadcast_100_then_call_16_ms", statistics.median(samples), "ms")

    started = time.perf_counter()
    meshes = [procs.spawn(f"reduce{k}", Echo) for k in range(ACTORS_PER_PROC)]
    total = PROCS * ACTORS_PER_PROC

    def reduce_once() -> int:
        futures = [mesh.echo.call(1) for mesh in meshes]
        return sum(sum(values(f.get())) for f in futures)

    got = reduce_once()
    log(
        f"spawned {total} actors ({ACTORS_PER_PROC} meshes of {PROCS}) and "
        f"called them in {(time.perf_counter() - started) * 1e3:.1f} ms"
    )
    if got != total:
        raise RuntimeError(f"the sum over {total} actors was {got}")
    for _ in range(REDUCE_WARMUP):
        reduce_once()
    samples = []
    for _ in range(REDUCE_SAMPLES):
        started = time.perf_counter()
        got = reduce_once()
        samples.append((time.perf_counter() - started) * 1e6)
        if got != total:
            raise RuntimeError(f"the sum over {total} actors was {got}")
    spread("cast_reduce_1024_us", samples, "us")
    report("cast_reduce_1024_us", statistics.median(samples), "us")
    procs.stop().get()

    for count, spawned in ((8, spawned8), (PROCS, spawned16)):
        for rep in range(1, SPAWN_REPS):
            elapsed, procs, _ = spawn_and_call(host, count, f"spawn{count}x{rep}")
            spawned.append(elapsed)
            procs.stop().get()
        metric = f"spawn_procs_{count}_ms"
        spread(metric, spawned, "ms")
        report(metric, statistics.median(spawned), "ms")

    log(f"done in {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
    # Monarch's runtime threads can keep the interpreter alive at exit.
    sys.stderr.flush()
    _RECORDS.flush()
    os._exit(0)

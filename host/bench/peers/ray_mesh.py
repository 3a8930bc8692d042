"""The workloads of `monarch-bench mesh`, on Ray 2.60.0.

Run by `monarch-bench mesh --peers` (or by hand, from any directory):

    target/peers-venv/bin/python host/bench/peers/ray_mesh.py [--quick]

Prints one JSON object a line on stdout and nothing else:

    {"suite":"mesh","metric":"call_gather_8_us","peer":"ray-2.60.0","value":4280.42,"unit":"us"}

Logs, spreads and repetition counts go to stderr. `ray.init()` starts a
local Ray instance on this machine (untimed; it detects the CPUs itself).
Ray has no proc mesh: every actor is a worker process of its own, so "N
procs, one actor on each" is N actors, and a gathered call is
`ray.get([a.echo.remote(i) for a in actors])`.

The workloads follow the guest program of the suite (`host/bench/guest`,
`mesh_suite`) in the same order, with fewer repetitions so that the whole
script stays under a minute on two cores:

- `spawn_procs_{8,16}_ms`: create N actors (N worker processes) and gather
  a first call from all of them; median of SPAWN_REPS, each of fresh
  actors (the previous ones are killed, and given SETTLE_S to go, untimed).
- `call_gather_{8,16}_us`: sequential gathered calls of an integer echo to
  the N actors, replies checked; median of GATHER_SAMPLES after
  GATHER_WARMUP untimed calls.
- `broadcast_100_then_call_16_ms`: 100 rounds of a counter bump sent to
  each of 16 actors without waiting for the results (Ray has no broadcast:
  1,600 submissions), then one gathered call that reads the counters
  (checked: every actor ran every bump); median of BROADCAST_REPS.
- `cast_reduce_1024_us` is skipped: it needs 1,024 actors on 16 processes,
  and a Ray actor is a process of its own; 1,024 Python worker processes do
  not fit in a minute (nor in the memory) of a two-core machine.
"""

import json
import os
import statistics
import sys
import time

PEER = "ray-2.60.0"
SUITE = "mesh"

# Stdout carries records only: keep the real stdout for them and send
# everything else written to fd 1 (this process's prints, Ray's messages,
# the processes it starts, which inherit fd 1) to stderr.
_RECORDS = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)

QUICK = "--quick" in sys.argv[1:]
SPAWN_REPS = 1 if QUICK else 3
GATHER_WARMUP = 10 if QUICK else 50
GATHER_SAMPLES = 30 if QUICK else 300
BROADCAST_REPS = 2 if QUICK else 11
BROADCASTS = 100
PROCS = 16
SETTLE_S = 0.5

import ray  # noqa: E402


@ray.remote
class Echo:
    """An integer echo and a counter, like the guest's `Echoer`."""

    def __init__(self) -> None:
        self.bumps = 0

    def echo(self, x: int) -> int:
        return x

    def bump(self) -> None:
        self.bumps += 1

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


def spawn_and_call(count: int):
    started = time.perf_counter()
    actors = [Echo.remote() for _ in range(count)]
    replies = ray.get([a.echo.remote(1) for a in actors])
    elapsed = time.perf_counter() - started
    if replies != [1] * count:
        raise RuntimeError(f"{len(replies)} of {count} actors answered: {replies}")
    return elapsed * 1e3, actors


def kill(actors: list) -> None:
    for a in actors:
        ray.kill(a)
    time.sleep(SETTLE_S)


def gather_metric(metric: str, actors: list) -> None:
    for i in range(GATHER_WARMUP):
        ray.get([a.echo.remote(i) for a in actors])
    samples = []
    for i in range(GATHER_SAMPLES):
        started = time.perf_counter()
        replies = ray.get([a.echo.remote(i) for a in actors])
        samples.append((time.perf_counter() - started) * 1e6)
        if replies != [i] * len(actors):
            raise RuntimeError(f"call {i} gathered {replies}")
    spread(metric, samples, "us")
    report(metric, statistics.median(samples), "us")


def main() -> None:
    began = time.perf_counter()
    log(
        f"spawn reps {SPAWN_REPS}, gathers {GATHER_WARMUP} + {GATHER_SAMPLES}, "
        f"broadcast reps {BROADCAST_REPS}"
    )
    ray.init(include_dashboard=False, log_to_driver=False)
    log(f"ray.init took {time.perf_counter() - began:.1f} s (untimed)")

    spawned8 = []
    elapsed, actors8 = spawn_and_call(8)
    spawned8.append(elapsed)
    gather_metric("call_gather_8_us", actors8)
    kill(actors8)

    spawned16 = []
    elapsed, actors = spawn_and_call(PROCS)
    spawned16.append(elapsed)
    gather_metric("call_gather_16_us", actors)

    before = ray.get([a.count.remote() for a in actors])
    samples = []
    for rep in range(BROADCAST_REPS):
        started = time.perf_counter()
        for _ in range(BROADCASTS):
            for a in actors:
                a.bump.remote()
        counts = ray.get([a.count.remote() for a in actors])
        samples.append((time.perf_counter() - started) * 1e3)
        expected = [b + BROADCASTS * (rep + 1) for b in before]
        if counts != expected:
            raise RuntimeError(f"counted {counts} bumps, expected {expected}")
    spread("broadcast_100_then_call_16_ms", samples, "ms")
    report("broadcast_100_then_call_16_ms", statistics.median(samples), "ms")
    kill(actors)

    log(
        "cast_reduce_1024_us skipped: 1,024 actors on 16 processes cannot be "
        "expressed (a Ray actor is a worker process of its own), and 1,024 "
        "worker processes do not fit the time budget on 2 cores"
    )

    for count, spawned in ((8, spawned8), (PROCS, spawned16)):
        for _ in range(1, SPAWN_REPS):
            elapsed, actors = spawn_and_call(count)
            spawned.append(elapsed)
            kill(actors)
        metric = f"spawn_procs_{count}_ms"
        spread(metric, spawned, "ms")
        report(metric, statistics.median(spawned), "ms")

    ray.shutdown()
    log(f"done in {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()

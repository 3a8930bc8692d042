"""The host's checks for interpreted guests (tests/anylang_host.rs), written
against the raw WIT bindings that componentize-py makes (no SDK), so that
what is tested is the host.

The controller's modes (the first argument):

- `spawn PROCS PER_PROC HOLD_S`: spawns PER_PROC `Echo` actors on each of
  PROCS procs, calls them all, prints `READY <replies>`, waits HOLD_S
  seconds (for the test to measure memory) and prints `DONE`.
- `oom`: one actor allocates until the host refuses its memory, catches the
  `MemoryError`, frees and carries on; then one lets `MemoryError` escape,
  which fails it with kind out-of-memory.
- `rtt SAMPLES BUSY_US...`: the median round trip of a call to one actor
  whose handler spins BUSY_US microseconds, for each BUSY_US.

Actor state is module-global: componentize-py makes a new object of the
export class for every call.
"""

import gc
import time

import wit_world
from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import mesh, types

ACTOR = {}


def wait(request):
    """The final event of `request`."""
    while True:
        for event in mesh.next_events(64, 60_000):
            if event.id == request:
                return event.kind


def done(kind):
    """The reply of a `done` event, or raises with its error."""
    result = kind.value
    if isinstance(result, Err):
        error = result.value
        raise RuntimeError(f"{error.kind.name}: {error.message}")
    return result.value


def spawn(name, procs, per_proc):
    proc_mesh = mesh.spawn_procs([types.Dim("procs", procs)])
    per = [types.Dim("actors", per_proc)] if per_proc > 1 else []
    return proc_mesh.spawn_with(name, "Echo", b"", types.SpawnOptions(per, None))


def spawn_mode(args):
    procs, per_proc, hold = int(args[0]), int(args[1]), float(args[2])
    actors = spawn("many", procs, per_proc)
    reply = done(wait(actors.call("ping", b"", None)))
    print("READY", len(reply.value.values), flush=True)
    mesh.next_events(1, int(hold * 1000))
    print("DONE", flush=True)


def oom_mode(_args):
    actors = spawn("hog", 1, 1)
    reply = done(wait(actors.call_one("eat", b"")))
    print("CAUGHT", reply.value.decode(), flush=True)
    reply = done(wait(actors.call_one("ping", b"")))
    print("ALIVE", reply.value.decode(), flush=True)
    kind = wait(actors.call_one("eat-uncaught", b""))
    error = kind.value.value
    print("UNCAUGHT", error.kind.name, error.message, flush=True)


def rtt_mode(args):
    samples = int(args[0])
    actors = spawn("rtt", 1, 1)
    for busy in args[1:]:
        message = busy.encode()
        for _ in range(100):
            wait(actors.call_one("busy", message))
        times = []
        for _ in range(samples):
            started = time.perf_counter_ns()
            wait(actors.call_one("busy", message))
            times.append(time.perf_counter_ns() - started)
        times.sort()
        median = times[len(times) // 2] / 1000
        print(f"RTT {busy} {median:.1f}", flush=True)


class WitWorld(wit_world.WitWorld):
    def run(self, args):
        modes = {"spawn": spawn_mode, "oom": oom_mode, "rtt": rtt_mode}
        modes[args[0]](args[1:])


def eat():
    """Holds ever more 1 MiB blocks until the allocator has none."""
    held = []
    try:
        while True:
            held.append(bytearray(1 << 20))
    finally:
        ACTOR["held"] = len(held)


class ActorClass(exports.ActorClass):
    def create(self, class_, init, rank, extent):
        ACTOR["rank"] = rank

    def handle(self, endpoint, message):
        if endpoint == "ping":
            return b"pong %d" % ACTOR["rank"]
        if endpoint == "busy":
            until = time.perf_counter_ns() + int(message) * 1000
            while time.perf_counter_ns() < until:
                pass
            return message
        if endpoint == "eat":
            try:
                eat()
            except MemoryError:
                gc.collect()
            # Memory is there again once the blocks are collected.
            again = bytearray(4 << 20)
            return b"held %d MiB, then %d MiB again" % (ACTOR["held"], len(again) >> 20)
        if endpoint == "eat-uncaught":
            eat()
        raise Err(types.EndpointError(f"no endpoint {endpoint}", None, None))

    def supervise(self, failure):
        return True

"""counter: a mesh of counters, and what happens when one of them fails.
Endpoint errors come back as exceptions of their own type and the actor
lives on; a crashed actor is a failure, reported to the controller's
fault hook, and calls to it raise SupervisionError. The Python twin of
examples/counter.

    monarch-host run examples/python/counter.py
    monarch-host test examples/python/counter.py

The `test_*` functions at the end are its tests (`monarch-host test`, see
docs/testing.md): each runs on a cluster of its own, one of them kills a
proc on purpose (`monarch.faults`) and checks that `ResilientCounters`
recovers.
"""

import asyncio
import os
import time

import monarch.actor
from monarch import faults
from monarch.actor import Actor, SupervisionError, endpoint, this_host


class Counter(Actor):
    def __init__(self, start: int):
        self.total = start

    @endpoint
    def add(self, amount: int) -> int:
        if amount < 0:
            raise ValueError(f"cannot add {amount}: counters only count up")
        self.total += amount
        return self.total

    @endpoint
    def get(self) -> int:
        return self.total

    @endpoint
    def crash(self) -> None:
        # Ends the actor's instance without unwinding, as a segfault would.
        os.abort()




class ResilientCounters:
    """Counters on `n` procs, all given the same amounts, that survive
    losing a proc: when a call fails because an actor is gone, it spawns
    the counters again on fresh procs, at the last total it saw, and
    calls again."""

    def __init__(self, n: int, start: int = 0):
        self.n = n
        self.total = start
        self.respawns = 0
        self.lost = []  # the SupervisionErrors it recovered from
        self._spawn()

    def _spawn(self):
        self.procs = this_host().spawn_procs(per_host={"procs": self.n})
        self.mesh = self.procs.spawn(f"counters-{self.respawns}", Counter, self.total)

    def add(self, amount: int) -> list:
        try:
            totals = self.mesh.add.call(amount).get().values()
        except SupervisionError as e:
            self.lost.append(e)
            self.procs.stop()
            self.respawns += 1
            self._spawn()
            totals = self.mesh.add.call(amount).get().values()
        self.total = totals[0]
        return totals


def main():
    procs = this_host().spawn_procs(per_host={"procs": 3})
    counters = procs.spawn("counters", Counter, 0)

    print("step 1: add 5 to every counter")
    for point, total in counters.add.call(5).get().items():
        print(f"  counter {point.rank}: {total}")

    print("step 2: add -1 to counter 1")
    try:
        counters.slice(procs=1).add.call_one(-1).get()
    except ValueError as e:
        print(f"  {type(e).__name__}: {e.message}")
    print(f"  counter 1 lives on, still at {counters.slice(procs=1).get.call_one().get()}")

    def carry_on(failure):
        print(f"  fault hook: {failure.mesh_name}[{failure.rank}] failed ({failure.kind}); carrying on")

    monarch.actor.unhandled_fault_hook = carry_on

    print("step 3: crash counter 2")
    try:
        counters.slice(procs=2).crash.call_one().get()
    except SupervisionError as e:
        print(f"  SupervisionError, kind {e.kind}")

    print("step 4: carry on")
    print(f"  counter 0 still counts: {counters.slice(procs=0).add.call_one(10).get()}")
    try:
        counters.get.call().get()
    except SupervisionError as e:
        print(f"  a call to the whole mesh fails: {e}")
    for fut in counters.get.stream():
        try:
            print(f"  stream: a counter at {fut.get()}")
        except SupervisionError as e:
            print(f"  stream: {e}")

    fresh = procs.slice(procs=slice(0, 2)).spawn("fresh-counters", Counter, 100)
    print(f"  fresh counters on the live procs: {fresh.get.call().get().values()}")
    procs.stop()


# Tests: `monarch-host test examples/python/counter.py` runs each on a
# cluster of its own.


def test_counters_count_up():
    procs = this_host().spawn_procs(per_host={"procs": 2})
    counters = procs.spawn("counters", Counter, 10)
    assert counters.add.call(5).get().values() == [15, 15]
    assert counters.slice(procs=1).add.call_one(1).get() == 16
    assert counters.get.call().get().values() == [15, 16]
    procs.stop()


def test_a_negative_amount_raises_value_error_and_the_counter_lives_on():
    procs = this_host().spawn_procs(per_host={"procs": 1})
    counter = procs.spawn("counter", Counter, 3)
    try:
        counter.add.call_one(-1).get()
    except ValueError as e:
        assert "counters only count up" in e.message
    else:
        raise AssertionError("add(-1) did not raise")
    assert counter.get.call_one().get() == 3
    procs.stop()


def wait_for(condition, seconds=10.0):
    """Lets the SDK's event loop run (failure events arrive through it)
    until `condition()` holds or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        asyncio.run(asyncio.sleep(0.05))
    return condition()


def test_a_crashed_proc_is_seen_and_the_counters_recover():
    failures = []
    monarch.actor.unhandled_fault_hook = failures.append
    counters = ResilientCounters(3)
    assert counters.add(5) == [5, 5, 5]

    faults.kill(counters.procs, 1)  # mode="crash": SIGKILL, as a segfault

    # The next call fails on the lost proc; ResilientCounters respawns the
    # counters at the last total and calls again.
    assert counters.add(2) == [7, 7, 7]
    assert counters.respawns == 1
    assert [e.kind for e in counters.lost] == ["proc-lost"]
    # The controller heard of the failure too, as in a real crash.
    assert wait_for(lambda: failures), "no failure reached unhandled_fault_hook"
    assert ("counters-0", 1, "proc-lost") in [(f.mesh_name, f.rank, f.kind) for f in failures]
    assert counters.add(1) == [8, 8, 8]
    counters.procs.stop()


async def test_a_partitioned_proc_answers_once_the_partition_ends():
    procs = this_host().spawn_procs(per_host={"procs": 2})
    counters = procs.spawn("counters", Counter, 0)
    assert (await counters.add.call(1)).values() == [1, 1]
    started = time.monotonic()
    faults.partition(procs, [1], duration=1.0)
    # Messages to rank 1 are held, not lost: the call completes late.
    assert await counters.slice(procs=1).add.call_one(1) == 2
    assert time.monotonic() - started >= 0.9
    procs.stop()


if __name__ == "__main__":
    main()

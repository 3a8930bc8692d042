"""counter: a mesh of counters, and what happens when one of them fails.
Endpoint errors come back as exceptions of their own type and the actor
lives on; a crashed actor is a failure, reported to the controller's
fault hook, and calls to it raise SupervisionError. The Python twin of
examples/counter.

    monarch-host run examples/python/counter.py
"""

import os

import monarch.actor
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

"""Every feature of the Python SDK that tests/python.rs checks: each check
prints `ok <name>` (or `FAIL <name>: why`), and the program ends with
`done <count>`."""

import asyncio
import dataclasses
import os
import sys

import monarch.actor
from monarch.actor import (
    Actor,
    ActorError,
    MeshFailure,
    SupervisionError,
    ValueMesh,
    context,
    current_rank,
    current_size,
    endpoint,
    this_host,
    this_proc,
)

passed = []


def check(name, condition, detail=""):
    if condition:
        passed.append(name)
        print(f"ok {name}")
    else:
        print(f"FAIL {name}: {detail}")
        sys.exit(1)


class Custom(Exception):
    pass


@dataclasses.dataclass
class Config:
    lr: float
    steps: int


class Worker(Actor):
    def __init__(self, base, *, scale=1):
        self.base = base
        self.scale = scale
        self.count = 0

    @endpoint
    def add(self, x, y=0):
        return (self.base + x + y) * self.scale

    @endpoint
    def rank(self):
        return current_rank().rank

    @endpoint
    def where(self):
        return dict(current_rank()), current_size(), context().actor_instance.rank.rank

    @endpoint
    def bump(self):
        self.count += 1

    @endpoint
    def count_(self):
        return self.count

    @endpoint
    async def slow_double(self, x):
        await asyncio.sleep(0.01)
        return 2 * x

    @endpoint
    def fail_value(self):
        raise ValueError("bad value from a worker")

    @endpoint
    def fail_custom(self):
        raise Custom("custom trouble")

    @endpoint
    def echo(self, value):
        return value

    @endpoint
    def say(self, text):
        print(f"worker {current_rank().rank} says {text}")
        return True

    @endpoint
    def crash(self):
        os.abort()

    @endpoint
    def ratio(self):
        return 0.5 * (current_rank().rank + 1)


class Relay(Actor):
    """Holds a mesh passed to it, slices it by its own rank, and calls it."""

    def __init__(self, workers):
        self.mine = workers.slice(**context().actor_instance.rank)

    @endpoint
    def through(self, x):
        return self.mine.add.call_one(x).get()

    @endpoint
    async def through_async(self, x):
        return await self.mine.add.call_one(x)


class Supervisor(Actor):
    """Owns a mesh whose actors it crashes; handles their failures."""

    def __init__(self):
        self.failures = []
        self.procs = this_host().spawn_procs(per_host={"procs": 2})
        self.children = self.procs.spawn("children", Worker, 0)

    @endpoint
    def break_child(self):
        try:
            self.children.slice(procs=1).crash.call_one().get()
        except SupervisionError as e:
            return e.kind
        return "no error"

    @endpoint
    def seen(self):
        return [(f.mesh_name, f.rank, f.kind) for f in self.failures]

    def __supervise__(self, failure):
        self.failures.append(failure)
        return True


procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
check("proc extent", dict(procs.extent) == {"hosts": 2, "gpus": 2}, procs.extent)
workers = procs.spawn("workers", Worker, 10, scale=2)

values = workers.add.call(1, y=2).get()
check("call gathers a ValueMesh", isinstance(values, ValueMesh) and values.values() == [26] * 4, values)
check("ValueMesh items", [dict(p) for p, _ in values.items()][3] == {"hosts": 1, "gpus": 1})
ranks = workers.rank.call().get()
check("ValueMesh slice", ranks.slice(gpus=1).values() == [1, 3], ranks.slice(gpus=1))
check("ValueMesh item", ranks.item(hosts=1, gpus=0) == 2)
check("call_one on a slice", workers.slice(hosts=1, gpus=1).rank.call_one().get() == 3)
check("choose", workers.rank.choose().get() in range(4))
where = workers.slice(hosts=0, gpus=1).where.call_one().get()
check("current_rank and current_size", where[0] == {"hosts": 0, "gpus": 1} and where[1] == {"hosts": 2, "gpus": 2}
      and where[2] == 1, where)
check("reduce sum", workers.rank.call(reduce="sum").get() == 6)
check("reduce max", workers.rank.reduce("max").get() == 3)
check("reduce sum_f64", workers.ratio.reduce("sum_f64").get() == 5.0)
check("reduce concat", workers.rank.reduce("concat").get() == [0, 1, 2, 3])
streamed = sorted(f.get() for f in workers.rank.stream())
check("stream", streamed == [0, 1, 2, 3], streamed)

workers.bump.broadcast()
workers.slice(gpus=0).bump.broadcast()
counts = workers.count_.call().get().values()
check("broadcast in order before call", counts == [2, 1, 2, 1], counts)

value = {"a": [1, 2.5, None, True], "b": b"\x00\x01", (1, 2): "tuple key", "c": "π"}
check("payload values round trip", workers.slice(hosts=0, gpus=0).echo.call_one(value).get() == value)
config = Config(lr=0.1, steps=3)
check("pickled objects round trip", workers.slice(hosts=0, gpus=0).echo.call_one(config).get() == config)

try:
    workers.slice(hosts=0, gpus=0).fail_value.call_one().get()
    check("builtin exception", False, "no error")
except ValueError as e:
    check("builtin exception", isinstance(e, ActorError) and "bad value from a worker" in str(e)
          and "fail_value" in (e.traceback or ""), repr(e))
try:
    workers.slice(hosts=0, gpus=0).fail_custom.call_one().get()
    check("custom exception", False, "no error")
except ActorError as e:
    check("custom exception", e.exception_type.endswith("Custom") and "custom trouble" in e.message, e.exception_type)


async def main():
    doubled = await workers.slow_double.call(21)
    together = await asyncio.gather(*(workers.slice(hosts=0, gpus=0).add.call_one(i) for i in range(3)))
    try:
        async with asyncio.timeout(0.05):
            await asyncio.sleep(5)
        late = False
    except TimeoutError:
        late = True
    return doubled.values(), together, late


doubled, together, late = asyncio.run(main())
check("async endpoints and await", doubled == [42] * 4 and together == [20, 22, 24], (doubled, together))
check("asyncio timeout", late)

relays = procs.spawn("relays", Relay, workers)
check("mesh passed to a constructor and sliced there", relays.through.call(1).get().values() == [22] * 4)
check("await inside an actor", relays.through_async.call(2).get().values() == [24] * 4)

check("print in an actor", all(workers.say.call("hello").get().values()))
local = this_proc().spawn("local", Worker, 1)
check("this_proc spawn", local.add.call_one(1).get() == 2)

sup = this_proc().spawn("supervisor", Supervisor)
check("SupervisionError for a crashed actor", sup.break_child.call_one().get() == "trap")


async def failures_seen():
    # The failed call and the failure's event come apart: the event reaches
    # __supervise__ between the supervisor's messages, perhaps after this
    # call's, so wait for it a while.
    for _ in range(250):
        got = await sup.seen.call_one()
        if got:
            return got
        await asyncio.sleep(0.02)
    return got


got = asyncio.run(failures_seen())
check("__supervise__ saw the failure", got == [["children", 1, "trap"]], got)

seen = []
monarch.actor.unhandled_fault_hook = lambda failure: seen.append(failure)
victims = this_host().spawn_procs(per_host={"procs": 2})
doomed = victims.spawn("doomed", Worker, 0)
try:
    doomed.slice(procs=0).crash.call_one().get()
except SupervisionError as e:
    check("a crash raises SupervisionError in the caller", e.kind == "trap", e.kind)
# The failure event may come after the call's error: wait on the loop.
for _ in range(50):
    if seen:
        break
    asyncio.run(asyncio.sleep(0.1))
check("unhandled_fault_hook replaced", len(seen) == 1 and isinstance(seen[0], MeshFailure)
      and seen[0].mesh_name == "doomed" and seen[0].kind == "trap", seen)
if victims.info()[1]["pid"] is not None:  # child procs (not --in-process)
    victims.kill(1)
    try:
        doomed.slice(procs=1).rank.call_one().get()
    except SupervisionError as e:
        check("a call to a killed proc raises SupervisionError", e.kind == "proc-lost", e.kind)

many = this_host().spawn_procs(per_host={"procs": 1}).spawn_with("many", Worker, args=(0,), per_proc={"actors": 50})
check("spawn_with per_proc", dict(many.extent) == {"procs": 1, "actors": 50}
      and many.rank.call(reduce="sum").get() == sum(range(50)), many.extent)

print(f"done {len(passed)}")

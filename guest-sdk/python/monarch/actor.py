"""Actors, meshes, endpoints and their adverbs, with Monarch's names:

    from monarch.actor import Actor, endpoint, this_host

    class Counter(Actor):
        def __init__(self, start: int):
            self.value = start

        @endpoint
        def increment(self) -> None:
            self.value += 1

        @endpoint
        def get_value(self) -> int:
            return self.value

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    counters = procs.spawn("counters", Counter, 0)
    counters.increment.broadcast()
    print(counters.get_value.call().get())
"""

import sys

from ._errors import ActorError, MeshFailure, SupervisionError
from ._runtime import (
    Actor,
    ActorMesh,
    Context,
    Endpoint,
    Future,
    HostMesh,
    ProcMesh,
    context,
    current_rank,
    current_size,
    endpoint,
    lookup_actor_mesh,
    this_host,
    this_proc,
)
from ._shape import Extent, Point, ValueMesh


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """Called when a failure of a mesh the controller owns is not handled.
    The default writes it to stderr and exits with status 1, as in Monarch;
    assign another function to ``monarch.actor.unhandled_fault_hook`` to
    change that (returning normally drops the failure)."""
    sys.stderr.write(f"Unhandled monarch error on the root actor: {failure.report()}\n")
    sys.stderr.flush()
    sys.exit(1)


__all__ = [
    "Actor",
    "ActorError",
    "ActorMesh",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "MeshFailure",
    "Point",
    "ProcMesh",
    "SupervisionError",
    "ValueMesh",
    "context",
    "current_rank",
    "current_size",
    "endpoint",
    "lookup_actor_mesh",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]

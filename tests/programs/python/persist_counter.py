"""persist_counter: persistent actor meshes from Python, one step per job
(tests/persist.rs), as tests/programs/persist does from Rust:

    spawn NAME    spawns the persistent counter NAME and increments it 5 times
    read NAME     looks NAME up and prints its value
    respawn NAME  replaces NAME with a fresh counter
    again NAME    a spawn under a name in use, which fails naming respawn
    lookup NAME   a lookup that fails
"""

import sys

from monarch.actor import Actor, endpoint, lookup_actor_mesh, this_host


class Counter(Actor):
    def __init__(self, initial_value: int):
        self.value = initial_value

    @endpoint
    def increment(self) -> None:
        self.value += 1

    @endpoint
    def get_value(self) -> int:
        return self.value


def main(args):
    step, name = args[0], args[1]
    if step == "spawn":
        procs = this_host().spawn_procs(per_host={"procs": 1})
        counter = procs.spawn(name, Counter, 0, persist=True)
        for _ in range(5):
            counter.increment.call_one().get()
        print(f"spawned {name} at {counter.get_value.call_one().get()}")
    elif step == "read":
        counter = lookup_actor_mesh(name, Counter)
        print(f"{name} reads {counter.get_value.call_one().get()}")
    elif step == "respawn":
        procs = this_host().spawn_procs(per_host={"procs": 1})
        counter = procs.respawn(name, Counter, 0)
        print(f"respawned {name} at {counter.get_value.call_one().get()}")
    elif step == "again":
        procs = this_host().spawn_procs(per_host={"procs": 1})
        try:
            procs.spawn_with(name, Counter, (0,), persist=True)
            sys.exit(f"{name} was spawned twice")
        except RuntimeError as e:
            print(f"spawn failed: {e}")
    elif step == "lookup":
        try:
            lookup_actor_mesh(name)
            sys.exit(f"{name} was found")
        except RuntimeError as e:
            print(f"lookup failed: {e}")
    else:
        sys.exit(f"unknown step {step!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""hello: spawns procs, a Greeter on each, calls `greet` on all of them and
prints the greetings, one line per rank. The Python twin of
examples/hello (Rust) and examples/js/hello.js.

    monarch-host run examples/python/hello.py -- 8
    monarch-host test examples/python/hello.py
"""

import sys

from monarch.actor import Actor, current_rank, current_size, endpoint, this_host


class Greeter(Actor):
    """Knows where it stands in its mesh, and says so."""

    @endpoint
    def greet(self) -> str:
        rank = current_rank()
        return f"hello from rank {rank.rank} of {_size()}"


def _size():
    n = 1
    for size in current_size().values():
        n *= size
    return n


def main(args):
    try:
        gpus = int(args[0]) if args else 4
    except ValueError:
        sys.exit(f"usage: hello [PROCS]; `{args[0]}` is not a number of procs")
    procs = this_host().spawn_procs(per_host={"hosts": 1, "gpus": gpus})
    greeters = procs.spawn("greeters", Greeter)

    greetings = greeters.greet.call().get()
    print(f"{len(greetings)} greetings from a mesh shaped {dict(greetings.extent)}:")
    for point, greeting in greetings.items():
        print(f"rank {point.rank}: {greeting}")
    procs.stop()



# Tests: `monarch-host test examples/python/hello.py` (docs/testing.md).


def test_every_rank_greets_with_its_rank_and_the_mesh_size():
    procs = this_host().spawn_procs(per_host={"hosts": 1, "gpus": 3})
    greetings = procs.spawn("greeters", Greeter).greet.call().get()
    assert dict(greetings.extent) == {"hosts": 1, "gpus": 3}
    assert greetings.values() == [f"hello from rank {r} of 3" for r in range(3)]
    procs.stop()


if __name__ == "__main__":
    main(sys.argv[1:])

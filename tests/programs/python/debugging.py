"""debugging: two Trainer ranks that each stop in pdb at `breakpoint()`,
for the tests of `monarch-host debug` (tests/debugger.rs).

    monarch-host run tests/programs/python/debugging.py --debug-listen 127.0.0.1:0
"""

import sys

from monarch.actor import Actor, endpoint, this_host


class Trainer(Actor):
    def __init__(self, lr):
        self.lr = lr

    @endpoint
    def step(self, x):
        y = x * 2
        breakpoint()
        z = y + 1
        return z * 10


def main(args):
    procs = this_host().spawn_procs(per_host={"hosts": 2})
    trainers = procs.spawn("py-trainers", Trainer, 0.5)
    values = trainers.step.call(7).get()
    print("results:", [value for _, value in values.items()])


if __name__ == "__main__":
    main(sys.argv[1:])

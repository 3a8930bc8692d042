"""ping-pong: pingers and pongers on the same procs; each pinger is handed
the whole ponger mesh in a message, slices out the ponger on its own proc,
and pings it a few times. The Python twin of examples/ping-pong.

    monarch-host run examples/python/ping_pong.py
"""

from monarch.actor import Actor, current_rank, endpoint, this_host

PROCS = 2
ROUNDS = 3


class Ponger(Actor):
    def __init__(self):
        self.hits = 0

    @endpoint
    def ping(self, sender: int) -> int:
        me = current_rank().rank
        if sender != me:
            raise ValueError(f"ponger {me} was hit by pinger {sender}")
        self.hits += 1
        return self.hits

    @endpoint
    def hits_(self) -> int:
        return self.hits


class Pinger(Actor):
    @endpoint
    def serve(self, partners, rounds: int) -> int:
        me = current_rank().rank
        partner = partners.slice(procs=me)
        pongs = 0
        for _ in range(rounds):
            count = partner.ping.call_one(me).get()
            print(f"pinger {me} hit, ponger counts {count}")
            pongs += 1
        return pongs


procs = this_host().spawn_procs(per_host={"procs": PROCS})
pingers = procs.spawn("pingers", Pinger)
pongers = procs.spawn("pongers", Ponger)

print(f"{PROCS} pingers serve {ROUNDS} rounds each to {PROCS} pongers")
for point, pongs in pingers.serve.call(pongers, ROUNDS).get().items():
    print(f"pinger {point.rank} got {pongs} pongs back")
for point, hits in pongers.hits_.call().get().items():
    print(f"ponger {point.rank} was hit {hits} times")
print(f"total hits: {pongers.hits_.call(reduce='sum').get()}")
procs.stop()

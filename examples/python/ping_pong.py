"""ping-pong: pingers and pongers on the same procs; each pinger is handed
the whole ponger mesh in a message, slices out the ponger on its own proc,
and pings it a few times. The Python twin of examples/ping-pong.

    monarch-host run examples/python/ping_pong.py
    monarch-host test examples/python/ping_pong.py
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


def main():
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


# Tests: `monarch-host test examples/python/ping_pong.py` runs each on a
# fresh cluster of its own.


def test_each_pinger_hits_its_own_ponger_every_round():
    procs = this_host().spawn_procs(per_host={"procs": PROCS})
    pingers = procs.spawn("pingers", Pinger)
    pongers = procs.spawn("pongers", Ponger)
    assert pingers.serve.call(pongers, 4).get().values() == [4, 4]
    assert pongers.hits_.call().get().values() == [4, 4]
    procs.stop()


def test_a_ping_from_another_rank_is_refused_and_counts_nothing():
    procs = this_host().spawn_procs(per_host={"procs": PROCS})
    pongers = procs.spawn("pongers", Ponger)
    try:
        pongers.slice(procs=1).ping.call_one(0).get()
    except ValueError as e:
        assert "ponger 1 was hit by pinger 0" in e.message
    else:
        raise AssertionError("a ping from pinger 0 to ponger 1 was accepted")
    assert pongers.hits_.call(reduce="sum").get() == 0
    procs.stop()


if __name__ == "__main__":
    main()

"""cross-language: a Python controller driving actors written in Rust.
The Counter class is examples/counter's (Rust); monarch-host loads it as
the actor library `rust`, and the payloads (wit/ENCODING.md) read the same
in both languages.

    (cd guest-sdk && cargo build --release --target wasm32-wasip2)
    monarch-host run examples/python/cross_language.py \\
        --actors rust=guest-sdk/target/wasm32-wasip2/release/counter.wasm
"""

from monarch.actor import Actor, ActorError, endpoint, this_host


class Summer(Actor):
    """A Python actor that calls the Rust counters it is handed."""

    @endpoint
    def total(self, counters) -> int:
        return sum(counters.get.call().get().values())


procs = this_host().spawn_procs(per_host={"procs": 3})
counters = procs.spawn("counters", "rust/Counter", 10)  # Counter::Init is an i64

print("Rust counters after adding 5:", counters.add.call(5).get().values())
print("Rust counters summed in the host:", counters.get.call(reduce="sum").get())
try:
    counters.slice(procs=0).add.call_one(-1).get()
except ValueError as e:  # the Rust endpoint's error names its type ValueError
    print("Rust said no:", isinstance(e, ActorError), e.message)

summer = procs.slice(procs=0).spawn("summer", Summer)
print("a Python actor summed the Rust counters:", summer.total.call_one(counters).get())
procs.stop()

"""A Monarch program as a Monarch user writes it (the getting-started
guide's actor parts: a counter in this proc, 8 procs of counters,
broadcast, slices, trainers with data loaders passed as a mesh, an
endpoint error). It runs unchanged under Monarch (`python3
monarch_style.py`) and monarch-host (`monarch-host run monarch_style.py`);
`monarch-bench anylang --peers` times both."""

from monarch.actor import Actor, context, endpoint, this_host, this_proc


class Counter(Actor):
    def __init__(self, initial_value: int):
        self.value = initial_value

    @endpoint
    def increment(self) -> None:
        self.value += 1

    @endpoint
    def get_value(self) -> int:
        return self.value


counter = this_proc().spawn("counter", Counter, initial_value=0)
print(f"Counter value: {counter.get_value.call_one().get()}")

procs = this_host().spawn_procs(per_host={"gpus": 8})
counters = procs.spawn("counters", Counter, 0)
counters.increment.broadcast()
counters.slice(gpus=slice(0, 4)).increment.broadcast()
print(sorted(counters.get_value.call().get().values()))


class DataLoader(Actor):
    def __init__(self):
        self.i = 0

    @endpoint
    def example(self):
        self.i += 1
        return f"<fake data {self.i}>"


class Trainer(Actor):
    def __init__(self, dataloader):
        my_rank = context().actor_instance.rank
        self.dataloader = dataloader.slice(**my_rank)

    @endpoint
    def step(self, input=None):
        data = self.dataloader.example.call_one().get()
        return f"Step with data {data} and input = {input}"


dataloaders = procs.spawn("dataloader", DataLoader)
trainers = procs.spawn("trainers", Trainer, dataloaders)
print(len(trainers.step.call().get().values()), "trainers stepped")


class Errorful(Actor):
    @endpoint
    def say_hello(self):
        raise Exception("I don't want to")


e = this_proc().spawn("errorful", Errorful)
try:
    e.say_hello.call_one().get()
except Exception:
    print("It didn't say hello")

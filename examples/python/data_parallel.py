"""data-parallel: linear regression trained data-parallel on tensors that
live on the procs. The examples are split by rows over the procs; each
step computes the gradient on every shard, all-reduces it across the
procs, and updates the replicated weights. The loss falls every step, as
in the Rust twin (examples/data-parallel).

    monarch-host run examples/python/data_parallel.py -- --procs 4 --steps 20
    monarch-host test examples/python/data_parallel.py
"""

import argparse

from monarch.actor import this_host
from monarch.tensor import Normal, Replicate, Shard, TensorEngine, Zeros


def options(argv=None):
    """The settings, from the program's arguments."""
    parser = argparse.ArgumentParser(prog="data_parallel")
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--device", default="cpu")
    o = parser.parse_args(argv)
    problem = check(o)
    if problem:
        parser.error(problem)
    return o


def check(o):
    """Why these settings cannot train, or None."""
    if o.procs < 1 or o.steps < 1 or o.features < 1:
        return "--procs, --steps and --features must be at least 1"
    if o.rows < o.procs:
        return f"--rows ({o.rows}) must be at least --procs ({o.procs}): every rank needs examples"
    return None


def train(o):
    """Trains as the settings say; the loss after each step, and the
    largest difference between the learned and the true weights."""
    procs = this_host().spawn_procs(per_host={"procs": o.procs})
    engine = TensorEngine.spawn(procs)
    print(f"training linear regression on {o.rows} examples x {o.features} features, "
          f"split by rows over {o.procs} procs, on {o.device}")

    rows = Shard("procs", 0)
    x = engine.create([o.rows, o.features], "float32", o.device, rows, Normal(0.0, 1.0, seed=42))
    truth = [i * 0.25 - 1.0 for i in range(o.features)]
    w_true = engine.from_list(truth, [o.features, 1], "float32", o.device, Replicate())
    y = x @ w_true  # [rows, 1], split by rows like x
    xt = x.t()  # [features, rows], split by columns
    w = engine.create([o.features, 1], "float32", o.device, Replicate(), Zeros())

    losses = []
    for step in range(1, o.steps + 1):
        residual = x @ w - y
        gradient = xt @ residual  # partial sums over `procs`
        loss = (residual * residual).sum() / o.rows
        reduced, loss_reduced = gradient.all_reduce("procs"), loss.all_reduce("procs")
        w.axpy_(-o.lr / o.rows, gradient)
        reduced.get()
        loss_reduced.get()
        value = loss.item().get()
        print(f"step {step} loss {value:.4e}")
        losses.append(value)

    learned = w.fetch().get()
    error = max(abs(a - b) for a, b in zip(learned, truth))
    procs.stop()
    return losses, error


def fell_every_step(losses):
    """The first pair of steps where the loss did not fall, or None.
    Below a floor the loss is at float32's precision and may wobble."""
    floor = losses[0] * 1e-8
    for before, after in zip(losses, losses[1:]):
        if after >= before and before > floor:
            return before, after
    return None


def main():
    o = options()
    losses, error = train(o)
    print(f"learned w is within {error:.2e} of the true w (largest difference)")
    rise = fell_every_step(losses)
    if rise:
        raise SystemExit(f"the loss did not fall: {rise[0]:.4e} then {rise[1]:.4e}")
    print(f"the loss fell every step, from {losses[0]:.4e} to {losses[-1]:.4e}")


# Tests: `monarch-host test examples/python/data_parallel.py`.


def test_training_over_two_procs_lowers_the_loss_every_step():
    losses, error = train(options(["--procs", "2", "--steps", "6", "--rows", "512"]))
    assert len(losses) == 6
    assert fell_every_step(losses) is None
    assert losses[-1] < losses[0]


def test_settings_that_cannot_train_are_refused_by_name():
    assert check(options([])) is None
    o = options([])
    o.rows, o.procs = 2, 4
    assert check(o) == "--rows (2) must be at least --procs (4): every rank needs examples"
    o = options([])
    o.steps = 0
    assert "--procs, --steps and --features" in check(o)


if __name__ == "__main__":
    main()

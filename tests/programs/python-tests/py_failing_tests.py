"""Tests that end every way a Python test can, for tests/python_tests.rs:
one passes, one fails an assert (its values and line are in the report),
one raises. `monarch-host test` runs them; the run exits 1."""

from monarch.actor import Actor, endpoint, this_host


class Adder(Actor):
    @endpoint
    def add(self, a: int, b: int) -> int:
        return a + b


def test_passes():
    print("test_passes says hello")
    assert 2 + 2 == 4


def test_assert_fails():
    procs = this_host().spawn_procs(per_host={"procs": 1})
    adder = procs.spawn("adders", Adder)
    print("test_assert_fails asks an actor")
    total = adder.add.call_one(1, 2).get()
    assert total == 4


def test_raises():
    print("test_raises is about to raise")
    raise ValueError("no such widget: 'sprocket'")


if __name__ == "__main__":
    raise SystemExit("run me with `monarch-host test`")

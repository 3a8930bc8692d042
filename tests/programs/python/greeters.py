"""Actors in Python for a Rust controller (tests/programs/polyglot): the
class `Greeter`, spawned from Rust as `py/Greeter`."""

from monarch.actor import Actor, current_rank, endpoint


class Greeter(Actor):
    def __init__(self, greeting: str):
        self.greeting = greeting

    @endpoint
    def greet(self) -> str:
        return f"{self.greeting} from Python rank {current_rank().rank}"

    @endpoint
    def add(self, n: int) -> int:
        return n + current_rank().rank

    @endpoint
    def refuse(self) -> None:
        raise ValueError("Python will not")


if __name__ == "__main__":
    print("greeters.py defines actors for tests/programs/polyglot; it has no main of its own")

"""monarch.faults over fake bindings: what each function asks the host
(the WIT ``faults`` interface: ranks, milliseconds, the kill mode), the
checks it makes first, and the error a refusal raises."""

import enum

import pytest

from monarch import faults


class KillMode(enum.Enum):
    CRASH = 0
    EXIT = 1
    HOST_LOST = 2


class FakeErr(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value


class FakeFaults:
    """Stands in for ``wit_world.imports.faults``: records each call, and
    refuses those that ``refuse`` names."""

    KillMode = KillMode

    def __init__(self):
        self.calls = []
        self.refuse = None

    def _record(self, name, *args):
        self.calls.append((name, *args))
        if self.refuse:
            raise FakeErr(self.refuse)

    def kill(self, procs, rank, mode):
        self._record("kill", procs, rank, mode)

    def delay(self, procs, a, b, delay_ms, duration_ms):
        self._record("delay", procs, a, b, delay_ms, duration_ms)

    def drop_messages(self, procs, a, b, duration_ms):
        self._record("drop_messages", procs, a, b, duration_ms)

    def partition(self, procs, ranks, duration_ms):
        self._record("partition", procs, ranks, duration_ms)

    def heal(self, procs):
        self._record("heal", procs)


class ProcMesh:
    """The SDK's ProcMesh, as far as faults read it: its WIT handle."""

    def __init__(self):
        self._handle = object()

    def __repr__(self):
        return "ProcMesh({'procs': 3})"


@pytest.fixture
def host(monkeypatch):
    fake = FakeFaults()
    monkeypatch.setattr(faults, "_wit", fake)
    monkeypatch.setattr(faults, "_Err", FakeErr)
    return fake


def test_kill_sends_the_rank_and_mode(host):
    procs = ProcMesh()
    faults.kill(procs, 1)
    faults.kill(procs, 2, mode="exit")
    faults.kill(procs, 0, "host-lost")
    assert host.calls == [
        ("kill", procs._handle, 1, KillMode.CRASH),
        ("kill", procs._handle, 2, KillMode.EXIT),
        ("kill", procs._handle, 0, KillMode.HOST_LOST),
    ]


def test_durations_are_seconds_sent_as_milliseconds_rounded_up(host):
    procs = ProcMesh()
    faults.delay(procs, 0, 1, delay=0.25, duration=2)
    faults.drop_messages(procs, 1, 2, duration=0.0001)
    faults.partition(procs, (0, 2), duration=1.5)
    faults.heal(procs)
    assert host.calls == [
        ("delay", procs._handle, 0, 1, 250, 2000),
        ("drop_messages", procs._handle, 1, 2, 1),
        ("partition", procs._handle, [0, 2], 1500),
        ("heal", procs._handle),
    ]


@pytest.mark.parametrize(
    "call, error, text",
    [
        (lambda p: faults.kill(p, 1, mode="segfault"), ValueError, "mode must be one of 'crash', 'exit', 'host-lost'"),
        (lambda p: faults.kill(p, -1), ValueError, "rank must be a rank"),
        (lambda p: faults.kill(p, 1.0), TypeError, "rank must be an int"),
        (lambda p: faults.kill(p, True), TypeError, "rank must be an int"),
        (lambda p: faults.delay(p, 0, 1, delay=-1, duration=1), ValueError, "delay must be 0 or more seconds"),
        (lambda p: faults.delay(p, 0, 1, delay=1, duration=float("inf")), ValueError, "duration must be"),
        (lambda p: faults.drop_messages(p, 0, 1, duration="1s"), TypeError, "duration is in seconds"),
        (lambda p: faults.partition(p, 1, duration=1), TypeError, "ranks must be a list"),
        (lambda p: faults.kill("procs", 1), TypeError, "faults take a ProcMesh"),
    ],
)
def test_bad_arguments_are_refused_before_the_host_is_asked(host, call, error, text):
    procs = ProcMesh()
    with pytest.raises(error, match=text):
        call(procs)
    assert host.calls == []


def test_a_refusal_of_the_host_raises_fault_error_saying_what_and_why(host):
    host.refuse = "rank 7 is out of range: the mesh has 3 procs"
    with pytest.raises(faults.FaultError) as caught:
        faults.kill(ProcMesh(), 7)
    assert isinstance(caught.value, RuntimeError)
    assert str(caught.value) == (
        "kill rank 7 (crash) of ProcMesh({'procs': 3}): rank 7 is out of range: the mesh has 3 procs"
    )


def test_outside_a_component_faults_say_where_they_work(monkeypatch):
    monkeypatch.setattr(faults, "_wit", None)
    with pytest.raises(RuntimeError, match="inside a monarch-host program"):
        faults.heal(ProcMesh())

"""Faults made on purpose, so that a test can check that its program
survives them (``monarch-host test``; docs/testing.md). The same API as
the Rust SDK's ``monarch_guest::faults``, over the WIT ``faults``
interface:

    from monarch import faults

    procs = this_host().spawn_procs(per_host={"procs": 3})
    faults.kill(procs, 1)                      # rank 1 crashes (SIGKILL)
    faults.kill(procs, 2, mode="host-lost")    # its host is lost
    faults.delay(procs, 0, 1, delay=0.2, duration=5.0)
    faults.drop_messages(procs, 0, 2, duration=1.0)
    faults.partition(procs, [0, 1], duration=2.0)
    faults.heal(procs)

The program sees each as it would see the real fault: a killed proc's
actors fail with kind ``proc-lost`` (their owner's ``__supervise__``, or
``monarch.actor.unhandled_fault_hook`` in the controller, hears of it, and
calls to them raise ``SupervisionError``); delayed and dropped messages
come late, or time out. ``procs`` is a ``ProcMesh`` this program spawned
(``this_host().spawn_procs(...)``); ranks are its ranks; durations are in
seconds. Only procs the caller started may be faulted (not a persistent
mesh's); a proc inside the host's process (``run --in-process``, ``test
--sim``) is killed by crashing it.
"""

import math

try:
    from componentize_py_types import Err as _Err
    from wit_world.imports import faults as _wit
except ImportError:  # pytest on the host's CPython: no bindings there
    _wit = None

    class _Err(Exception):
        pass


#: The ways ``kill`` ends a proc.
KILL_MODES = ("crash", "exit", "host-lost")


class FaultError(RuntimeError):
    """The host refused to make a fault (a rank out of range, procs that
    may not be faulted...); the message says why."""


def _handle(procs):
    handle = getattr(procs, "_handle", None)
    if handle is None or type(procs).__name__ != "ProcMesh":
        raise TypeError(
            f"faults take a ProcMesh (what this_host().spawn_procs(...) returns), not {type(procs).__name__}"
        )
    return handle


def _rank(value, what="rank"):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not 0 <= value < 2**32:
        raise ValueError(f"{what} must be a rank of the proc mesh (0 or more), not {value}")
    return value


def _millis(seconds, what):
    """``seconds`` (an int or float) as whole milliseconds, rounded up so
    that a short but nonzero time stays nonzero."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} is in seconds (an int or a float), not {type(seconds).__name__}")
    if math.isnan(seconds) or seconds < 0 or math.isinf(seconds):
        raise ValueError(f"{what} must be 0 or more seconds, and finite, not {seconds}")
    return math.ceil(seconds * 1000)


def _mode(mode):
    if mode not in KILL_MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, KILL_MODES))}, not {mode!r}")
    kinds = _bindings().KillMode
    return {"crash": kinds.CRASH, "exit": kinds.EXIT, "host-lost": kinds.HOST_LOST}[mode]


def _bindings():
    if _wit is None:
        raise RuntimeError("monarch.faults works inside a monarch-host program (monarch-host run or test)")
    return _wit


def _call(what, fn, *args):
    from . import _program

    _program.check_not_building(what)
    try:
        fn(*args)
    except _Err as e:
        raise FaultError(f"{what}: {e.value}") from None


def kill(procs, rank, mode="crash"):
    """Ends the proc at ``rank`` of ``procs``: ``"crash"`` kills its process
    at once (SIGKILL; reported "killed by signal 9"), ``"exit"`` makes it
    exit by itself with status 0, ``"host-lost"`` loses its host (every
    proc of that host ends, of whatever mesh). Its actors fail with kind
    ``proc-lost``."""
    handle = _handle(procs)
    rank = _rank(rank)
    kind = _mode(mode)
    _call(f"kill rank {rank} ({mode}) of {procs!r}", _bindings().kill, handle, rank, kind)


def delay(procs, a, b, delay, duration):
    """For the next ``duration`` seconds, every message between the procs
    at ranks ``a`` and ``b``, either way, arrives ``delay`` seconds later
    than it would; order is kept."""
    handle = _handle(procs)
    a, b = _rank(a, "a"), _rank(b, "b")
    delay_ms, duration_ms = _millis(delay, "delay"), _millis(duration, "duration")
    _call(
        f"delay messages between ranks {a} and {b} of {procs!r}",
        _bindings().delay,
        handle,
        a,
        b,
        delay_ms,
        duration_ms,
    )


def drop_messages(procs, a, b, duration):
    """For the next ``duration`` seconds the network between the procs at
    ranks ``a`` and ``b`` is down: messages either way are held, and go on
    in order when it is up again; one held past the delivery timeout fails
    as undeliverable, as over a real cut."""
    handle = _handle(procs)
    a, b = _rank(a, "a"), _rank(b, "b")
    duration_ms = _millis(duration, "duration")
    _call(
        f"drop messages between ranks {a} and {b} of {procs!r}",
        _bindings().drop_messages,
        handle,
        a,
        b,
        duration_ms,
    )


def partition(procs, ranks, duration):
    """For the next ``duration`` seconds the procs at ``ranks`` are cut off,
    as by ``drop_messages``, from the other procs of ``procs`` and from the
    caller."""
    handle = _handle(procs)
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
        raise TypeError(f"ranks must be a list of ranks, not {type(ranks).__name__}")
    ranks = [_rank(r) for r in ranks]
    duration_ms = _millis(duration, "duration")
    _call(f"partition ranks {ranks} of {procs!r}", _bindings().partition, handle, ranks, duration_ms)


def heal(procs):
    """Ends every delay, drop and partition among ``procs`` and the caller
    now; held messages go on at once, in order."""
    handle = _handle(procs)
    _call(f"heal {procs!r}", _bindings().heal, handle)


__all__ = ["FaultError", "KILL_MODES", "delay", "drop_messages", "heal", "kill", "partition"]

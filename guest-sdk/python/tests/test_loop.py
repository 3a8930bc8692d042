"""The asyncio event loop over a host event source (monarch._loop), driven
by a fake source with a fake clock: waiting on the host advances the clock
instead of sleeping, so these tests take no real time."""

import asyncio
import contextvars
import heapq
import itertools
import sys
import warnings

import pytest

from monarch._loop import Deadlock, HostLoop, HostLoopPolicy


class FakeHost:
    """Stands in for ``mesh.next-events``: requests in flight, each
    answered by a callback at a time on a fake clock."""

    def __init__(self):
        self.now = 1000.0
        self._events = []  # heap of (when, seq, callback)
        self._seq = itertools.count()
        self.waits = []  # the timeouts the loop waited with

    def clock(self):
        return self.now

    def reply_after(self, delay, callback):
        heapq.heappush(self._events, (self.now + delay, next(self._seq), callback))

    def pending(self):
        return bool(self._events)

    def wait(self, timeout):
        self.waits.append(timeout)
        if timeout is None:
            assert self._events, "waited forever with nothing in flight"
            deadline = self._events[0][0]
        else:
            deadline = self.now + timeout
            if self._events and self._events[0][0] < deadline:
                deadline = self._events[0][0]  # woken early by an event
        self.now = max(self.now, deadline)
        while self._events and self._events[0][0] <= self.now:
            _, _, callback = heapq.heappop(self._events)
            callback()


@pytest.fixture
def host():
    return FakeHost()


@pytest.fixture
def loop(host):
    loop = HostLoop(host)
    loop.time = host.clock  # the loop's clock is the fake one
    yield loop
    assert not loop.is_running()
    loop.close()


def host_reply(loop, host, delay, value):
    """A future that the host resolves after ``delay`` seconds, as a call's
    reply."""
    fut = loop.create_future()
    host.reply_after(delay, lambda: fut.done() or fut.set_result(value))
    return fut


# -- sleeping and timers ------------------------------------------------------

def test_sleep_ordering(loop, host):
    order = []

    async def sleeper(delay, name):
        await asyncio.sleep(delay)
        order.append((name, round(loop.time() - 1000.0, 6)))

    async def main():
        await asyncio.gather(sleeper(0.3, "c"), sleeper(0.1, "a"), sleeper(0.2, "b"), sleeper(0, "now"))

    loop.run_until_complete(main())
    assert order == [("now", 0.0), ("a", 0.1), ("b", 0.2), ("c", 0.3)]
    # Timers are waited for on the host, never busy-waited.
    assert len(host.waits) == 3
    assert all(t is not None and t > 0 for t in host.waits)


def test_sleep_zero_yields(loop):
    order = []

    async def a():
        order.append("a1")
        await asyncio.sleep(0)
        order.append("a2")

    async def b():
        order.append("b1")
        await asyncio.sleep(0)
        order.append("b2")

    async def main():
        await asyncio.gather(a(), b())

    loop.run_until_complete(main())
    assert order == ["a1", "b1", "a2", "b2"]


def test_call_later_call_at_and_cancel(loop, host):
    fired = []
    loop.call_later(0.2, fired.append, "late")
    loop.call_at(loop.time() + 0.1, fired.append, "early")
    cancelled = loop.call_later(0.15, fired.append, "cancelled")
    loop.call_soon(fired.append, "soon")
    cancelled.cancel()
    loop.run_until_complete(asyncio.sleep(0.3))
    assert fired == ["soon", "early", "late"]
    # A negative delay is "now".
    loop.call_later(-5, fired.append, "negative")
    loop.run_until_complete(asyncio.sleep(0))
    assert fired[-1] == "negative"


def test_call_soon_runs_in_order_with_args_and_context(loop):
    var = contextvars.ContextVar("var", default="outer")
    seen = []
    ctx = contextvars.copy_context()
    ctx.run(var.set, "inner")
    loop.call_soon(seen.append, 1)
    loop.call_soon(lambda: seen.append(var.get()), context=ctx)
    loop.call_soon(lambda: seen.append(var.get()))
    loop.run_until_complete(asyncio.sleep(0))
    assert seen == [1, "inner", "outer"]


# -- tasks --------------------------------------------------------------------

def test_gather_returns_results_in_order(loop, host):
    async def main():
        return await asyncio.gather(
            host_reply(loop, host, 0.3, "x"),
            host_reply(loop, host, 0.1, "y"),
            asyncio.sleep(0.2, result="z"),
        )

    assert loop.run_until_complete(main()) == ["x", "y", "z"]
    assert loop.time() - 1000.0 == pytest.approx(0.3)


def test_gather_return_exceptions(loop):
    async def bad():
        raise ValueError("bad")

    async def main():
        return await asyncio.gather(bad(), asyncio.sleep(0, result=1), return_exceptions=True)

    result = loop.run_until_complete(main())
    assert isinstance(result[0], ValueError) and result[1] == 1


def test_create_task(loop):
    async def child(x):
        await asyncio.sleep(0.01)
        return x * 2

    async def main():
        t = loop.create_task(child(21), name="child")
        assert t.get_name() == "child"
        assert asyncio.current_task() is not t
        t2 = asyncio.create_task(child(1))
        return await t, await t2

    assert loop.run_until_complete(main()) == (42, 2)


def test_create_task_with_context(loop):
    var = contextvars.ContextVar("var", default="default")
    ctx = contextvars.copy_context()
    ctx.run(var.set, "given")

    async def read():
        return var.get()

    assert loop.run_until_complete(loop.create_task(read(), context=ctx)) == "given"
    assert loop.run_until_complete(loop.create_task(read())) == "default"


def test_run_until_complete_returns_and_raises(loop):
    async def ok():
        return 7

    async def bad():
        await asyncio.sleep(0)
        raise KeyError("k")

    assert loop.run_until_complete(ok()) == 7
    with pytest.raises(KeyError):
        loop.run_until_complete(bad())
    # The loop is usable after an error.
    assert loop.run_until_complete(ok()) == 7


def test_running_loop_is_set_while_running(loop):
    async def main():
        assert asyncio.get_running_loop() is loop
        assert loop.is_running()
        return True

    assert not loop.is_running()
    assert loop.run_until_complete(main())
    assert not loop.is_running()
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


def test_cancel_a_task(loop):
    async def forever():
        await asyncio.sleep(3600)

    async def main():
        t = asyncio.create_task(forever())
        await asyncio.sleep(0.01)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        return t.cancelled()

    assert loop.run_until_complete(main())
    # The hour-long timer was cancelled, not waited for.
    assert loop.time() - 1000.0 < 1


def test_queue_and_event(loop):
    async def main():
        q = asyncio.Queue()
        ev = asyncio.Event()

        async def producer():
            for i in range(3):
                await asyncio.sleep(0.01)
                await q.put(i)
            ev.set()

        asyncio.create_task(producer())
        await ev.wait()
        return [q.get_nowait() for _ in range(q.qsize())]

    assert loop.run_until_complete(main()) == [0, 1, 2]


# -- timeouts -----------------------------------------------------------------

def test_asyncio_timeout(loop, host):
    async def main():
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await host_reply(loop, host, 10, "too late")
        return loop.time()

    start = loop.time()
    assert loop.run_until_complete(main()) - start == pytest.approx(0.5)


def test_asyncio_timeout_not_reached(loop, host):
    async def main():
        async with asyncio.timeout(5):
            return await host_reply(loop, host, 0.1, "in time")

    assert loop.run_until_complete(main()) == "in time"


def test_wait_for(loop, host):
    async def main():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(10), 0.1)
        return await asyncio.wait_for(host_reply(loop, host, 0.1, "ok"), 1)

    assert loop.run_until_complete(main()) == "ok"


# -- waiting on the host ----------------------------------------------------------

def test_waits_on_the_host_for_a_reply(loop, host):
    fut = host_reply(loop, host, 2.0, "reply")
    assert loop.run_until_complete(fut) == "reply"
    # Nothing else to wake for: the loop waits on the host without a timeout.
    assert host.waits == [None]


def test_host_events_are_picked_up_while_tasks_are_busy(loop, host):
    # A task that never sleeps must not starve replies already waiting.
    fut = host_reply(loop, host, 0.0, "reply")
    spins = []

    async def busy():
        while not fut.done():
            spins.append(1)
            await asyncio.sleep(0)
        return fut.result()

    assert loop.run_until_complete(busy()) == "reply"
    assert 0.0 in host.waits  # polled without blocking
    assert len(spins) < 5


# -- deadlock and nesting -------------------------------------------------------

def test_deadlock_when_nothing_can_progress(loop, host):
    never = loop.create_future()
    with pytest.raises(Deadlock, match="can never come"):
        loop.run_until_complete(never)
    assert isinstance(Deadlock(), RuntimeError)
    assert not loop.is_running()
    assert host.waits == []


def test_deadlock_in_a_coroutine(loop):
    async def main():
        await asyncio.sleep(0.1)
        await loop.create_future()

    with pytest.raises(Deadlock):
        loop.run_until_complete(main())


def test_no_deadlock_while_a_request_is_in_flight(loop, host):
    never = loop.create_future()
    host.reply_after(1.0, lambda: never.set_result("late"))
    assert loop.run_until_complete(never) == "late"


def test_nested_run_until_complete_is_refused(loop):
    ran = []

    async def inner():
        ran.append("inner")
        return 1

    async def outer():
        coro = inner()
        with pytest.raises(RuntimeError, match="already running") as info:
            loop.run_until_complete(coro)
        assert "await" in str(info.value)
        coro.close()
        await asyncio.sleep(0.01)
        return "outer done"

    assert loop.run_until_complete(outer()) == "outer done"
    # The refused coroutine did not run anyway, behind the caller's back.
    assert ran == []
    assert loop.is_running() is False


def test_run_forever_and_stop(loop, host):
    seen = []
    loop.call_later(0.1, seen.append, "timer")
    loop.call_later(0.2, loop.stop)
    loop.run_forever()
    assert seen == ["timer"]
    assert not loop.is_running()
    with pytest.raises(Deadlock):
        loop.run_forever()


# -- asyncio.run through the policy ----------------------------------------------

def test_policy_makes_asyncio_run_use_the_loop(host):
    made = []

    def make():
        loop = HostLoop(host)
        loop.time = host.clock
        made.append(loop)
        return loop

    async def main():
        await asyncio.sleep(0.5)
        reply = await host_reply(asyncio.get_running_loop(), host, 1, "via host")
        return asyncio.get_running_loop(), reply

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # policies are deprecated in 3.14
        old = asyncio.get_event_loop_policy()
        asyncio.set_event_loop_policy(HostLoopPolicy(make))
        try:
            running, reply = asyncio.run(main())
            assert asyncio.new_event_loop() is made[-1]
        finally:
            asyncio.set_event_loop_policy(old)
    assert running is made[0]
    assert reply == "via host"
    assert made[0].is_closed()  # asyncio.run closes its loop
    assert host.now - 1000.0 == pytest.approx(1.5)


def test_policy_with_a_shared_loop(loop):
    # As the runtime does: one loop for every asyncio.run of a program.
    loop.close = lambda: None

    async def main(x):
        return asyncio.get_running_loop(), x

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = asyncio.get_event_loop_policy()
        asyncio.set_event_loop_policy(HostLoopPolicy(lambda: loop))
        try:
            assert asyncio.run(main(1)) == (loop, 1)
            assert asyncio.run(main(2)) == (loop, 2)
        finally:
            asyncio.set_event_loop_policy(old)


# -- errors -------------------------------------------------------------------

def test_exception_in_a_callback_goes_to_the_handler(loop):
    seen = []
    loop.set_exception_handler(lambda lp, ctx: seen.append((lp, ctx)))
    assert loop.get_exception_handler() is not None

    def boom():
        raise ValueError("in a callback")

    after = []
    loop.call_soon(boom)
    loop.call_soon(after.append, "still running")
    loop.run_until_complete(asyncio.sleep(0.01))
    assert after == ["still running"]
    assert len(seen) == 1
    lp, ctx = seen[0]
    assert lp is loop
    assert isinstance(ctx["exception"], ValueError)
    assert "message" in ctx and "handle" in ctx


def test_exception_in_a_timer_callback_goes_to_the_handler(loop):
    seen = []
    loop.set_exception_handler(lambda lp, ctx: seen.append(ctx["exception"]))
    loop.call_later(0.1, lambda: 1 / 0)
    loop.run_until_complete(asyncio.sleep(0.2))
    assert len(seen) == 1 and isinstance(seen[0], ZeroDivisionError)


def test_default_exception_handler_writes_to_stderr(loop, capsys):
    def boom():
        raise RuntimeError("default handler")

    loop.call_soon(boom)
    loop.run_until_complete(asyncio.sleep(0))
    err = capsys.readouterr().err
    assert "RuntimeError: default handler" in err
    assert "Traceback" in err
    loop.call_exception_handler({"message": "just a message"})
    assert capsys.readouterr().err == "just a message\n"
    loop.set_exception_handler(None)
    assert loop.get_exception_handler() is None


def test_an_exception_in_a_task_goes_to_its_awaiter_not_the_handler(loop):
    seen = []
    loop.set_exception_handler(lambda lp, ctx: seen.append(ctx))

    async def bad():
        raise ValueError("to the awaiter")

    async def main():
        with pytest.raises(ValueError):
            await asyncio.create_task(bad())

    loop.run_until_complete(main())
    assert seen == []


def test_run_in_executor_is_not_available(loop):
    with pytest.raises(NotImplementedError, match="no threads"):
        loop.run_in_executor(None, print)


def test_debug_flag_and_close(host):
    loop = HostLoop(host)
    assert not loop.get_debug()
    loop.set_debug(True)
    assert loop.get_debug()
    loop.call_soon(print)
    assert not loop.is_closed()
    loop.close()
    assert loop.is_closed()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="TaskGroup is 3.11+")
def test_task_group(loop, host):
    async def main():
        async with asyncio.TaskGroup() as tg:
            async def reply():
                return await host_reply(loop, host, 0.2, "a")

            a = tg.create_task(reply())
            b = tg.create_task(asyncio.sleep(0.1, result="b"))
        return a.result(), b.result()

    assert loop.run_until_complete(main()) == ("a", "b")

"""An asyncio event loop over the host's event mailbox.

A Wasm instance has one thread and no selector; what it can wait on is
``mesh.next-events(max, timeout-ms)``. This loop runs ready callbacks,
then waits on the host until the next timer is due, so ``await`` on a
call, ``asyncio.sleep``, ``asyncio.gather`` and ``asyncio.timeout`` work in
the controller and in actors without busy-waiting.

Pure Python: the host is reached through the ``source`` given to the loop
(an object with ``wait(timeout_s)`` and ``pending()``), so pytest drives the
loop with a fake one.
"""

import asyncio
import asyncio.events as events
import collections
import heapq
import time


class Deadlock(RuntimeError):
    """Nothing can make progress: no ready callback, no timer, and no
    request in flight, yet the awaited future is not done."""


class HostLoop(asyncio.AbstractEventLoop):
    def __init__(self, source):
        self._source = source
        self._ready = collections.deque()
        self._timers = []
        self._running = False
        self._closed = False
        self._debug = False
        self._exception_handler = None
        self._stopping = False

    # -- scheduling -----------------------------------------------------
    def time(self):
        return time.monotonic()

    def call_soon(self, callback, *args, context=None):
        handle = events.Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    call_soon_threadsafe = call_soon

    def call_later(self, delay, callback, *args, context=None):
        return self.call_at(self.time() + max(0.0, delay), callback, *args, context=context)

    def call_at(self, when, callback, *args, context=None):
        timer = events.TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._timers, timer)
        timer._scheduled = True
        return timer

    def _timer_handle_cancelled(self, handle):
        pass

    def create_future(self):
        return asyncio.Future(loop=self)

    def create_task(self, coro, *, name=None, context=None, **kwargs):
        if context is None:
            return asyncio.Task(coro, loop=self, name=name)
        return asyncio.Task(coro, loop=self, name=name, context=context)

    # -- running ----------------------------------------------------------
    def is_running(self):
        return self._running

    def is_closed(self):
        return self._closed

    def close(self):
        self._ready.clear()
        self._timers.clear()
        self._closed = True

    def stop(self):
        self._stopping = True

    def get_debug(self):
        return self._debug

    def set_debug(self, enabled):
        self._debug = enabled

    def run_forever(self):
        self._stopping = False
        self._enter()
        try:
            while not self._stopping:
                if not self._step(None):
                    raise Deadlock("the event loop has nothing left to run")
        finally:
            self._leave()

    def run_until_complete(self, future):
        # Refused before a task is made of ``future``: a refused coroutine
        # must not run later anyway.
        self._enter()
        try:
            future = asyncio.ensure_future(future, loop=self)
            while not future.done():
                if not self._step(future):
                    raise Deadlock(
                        "waiting for a result that can never come: no request is in "
                        "flight, no timer is set and no task is ready"
                    )
        finally:
            self._leave()
        return future.result()

    def _enter(self):
        if self._running:
            raise RuntimeError(
                "the event loop is already running: inside an async function use "
                "`await fut` instead of `fut.get()`"
            )
        self._previous = events._get_running_loop()
        events._set_running_loop(self)
        self._running = True

    def _leave(self):
        self._running = False
        events._set_running_loop(self._previous)

    def _step(self, future):
        """Runs what is ready, else waits for a timer or a host event.
        False when nothing can ever happen again."""
        now = self.time()
        timers = self._timers
        while timers and (timers[0]._cancelled or timers[0]._when <= now):
            timer = heapq.heappop(timers)
            if not timer._cancelled:
                timer._scheduled = False
                self._ready.append(timer)
        if self._ready:
            ready, self._ready = self._ready, collections.deque()
            try:
                # Host events may already be waiting: pick them up without
                # blocking so replies are not starved by busy tasks.
                if self._source.pending():
                    self._source.wait(0.0)
                while ready:
                    handle = ready.popleft()
                    if not handle._cancelled:
                        handle._run()
            except BaseException:
                # A KeyboardInterrupt (a session's Ctrl-C) or SystemExit
                # leaves the loop: what was ready stays ready, first, for
                # the next time it runs.
                ready.extend(self._ready)
                self._ready = ready
                raise
            return True
        while timers and timers[0]._cancelled:
            heapq.heappop(timers)
        if timers:
            timeout = max(0.0, timers[0]._when - self.time())
        elif self._source.pending():
            timeout = None
        else:
            return False
        self._source.wait(timeout)
        return True

    # -- errors -------------------------------------------------------------
    def set_exception_handler(self, handler):
        self._exception_handler = handler

    def get_exception_handler(self):
        return self._exception_handler

    def default_exception_handler(self, context):
        import sys
        message = context.get("message", "an error in the event loop")
        exc = context.get("exception")
        if exc is not None:
            import traceback
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            sys.stderr.write(f"{message}\n{text}")
        else:
            sys.stderr.write(f"{message}\n")

    def call_exception_handler(self, context):
        if self._exception_handler is None:
            self.default_exception_handler(context)
        else:
            self._exception_handler(self, context)

    # -- not available in a Wasm instance ---------------------------------
    def run_in_executor(self, executor, func, *args):
        raise NotImplementedError("a Wasm instance has no threads: call the function directly")

    async def shutdown_asyncgens(self):
        pass

    async def shutdown_default_executor(self, timeout=None):
        pass


class HostLoopPolicy(events._BaseDefaultEventLoopPolicy if hasattr(events, "_BaseDefaultEventLoopPolicy")
                     else events.BaseDefaultEventLoopPolicy):
    """Makes ``asyncio.run`` and ``asyncio.new_event_loop`` use the host's
    loop."""

    def __init__(self, make_loop):
        super().__init__()
        self._make_loop = make_loop

    def new_event_loop(self):
        return self._make_loop()

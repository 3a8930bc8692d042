"""``breakpoint()`` on monarch-host: real pdb on the actor that calls it.

The SDK sets ``sys.breakpointhook``. With debugging off (no ``run
--debug-listen``) a breakpoint does nothing, so one left in a program never
hangs it. With it on, the hook opens a pause at the host (the run's debug
hub lists it; ``monarch-host debug`` attaches to it) and starts pdb on the
caller's frame, with pdb's input and output carried by the host. The pause
ends when pdb continues (``c``) or quits, or when the endpoint returns.
"""

import pdb
import sys

from wit_world.imports import debug as _wdebug

# Frames of these modules are the SDK's and the runtime's, not the user's:
# pdb does not stop in them.
_SKIP = ["monarch", "monarch.*", "asyncio", "asyncio.*", "wit_world", "wit_world.*", "componentize_py*", "_monarch*", "monarch_program", "monarch_session"]


class _Input:
    """pdb's stdin: the lines the debugger sends this pause."""

    def readline(self):
        return _wdebug.read_line() + "\n"


class _Output:
    """pdb's stdout: to the debugger of this pause."""

    def write(self, text):
        _wdebug.write(text)
        return len(text)

    def flush(self):
        pass


class _Pdb(pdb.Pdb):
    def __init__(self):
        super().__init__(stdin=_Input(), stdout=_Output(), skip=_SKIP, nosigint=True)
        self.use_rawinput = False

    def set_continue(self):
        super().set_continue()
        # With no breakpoints set pdb stops tracing: the pause is over.
        if not self.breaks:
            _end_pause()

    def set_quit(self):
        super().set_quit()
        _end_pause()


_active = None


def _end_pause():
    global _active
    if _active is not None:
        _active = None
        _wdebug.resume()


def _hook(*args, **kwargs):
    """``sys.breakpointhook``: pdb on the caller's frame, if debugging is on."""
    global _active
    if not _wdebug.enabled():
        return
    frame = sys._getframe(1)
    code = frame.f_code
    where = f"{code.co_filename}:{frame.f_lineno}"
    if not _wdebug.pause(code.co_qualname, where, "breakpoint"):
        return
    _active = _Pdb()
    _active.set_trace(frame)


def end():
    """After each export: the host has ended any pause with it; stop tracing."""
    global _active
    if _active is not None:
        _active = None
        sys.settrace(None)


sys.breakpointhook = _hook

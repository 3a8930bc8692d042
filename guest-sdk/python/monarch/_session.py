"""The built-in Python session (``monarch-host console``): a REPL whose
inputs run in the controller, one at a time, in one namespace that lives
as long as the session.

What it does, as Python's own REPL does:

- each line joins a buffer that is compiled as the REPL compiles
  (``codeop``, mode ``single``): an incomplete block asks for more (the
  prompt becomes ``... ``), an empty line ends a block;
- an expression's value is shown by its ``repr`` (``None`` is not), and
  kept in ``_``;
- an exception is shown as its traceback, from the input's frame down,
  the SDK's frames left out, the input's file named ``<console>``; a
  syntax error as the caret message. The session goes on.

And what a session needs beyond that:

- **Ctrl-C.** The host raises a flag (``console.interrupted``) and
  returns early from ``mesh.next-events``. While an input runs, the SDK
  reads the flag after each wait on the host (``_runtime``), between the
  50 ms slices of ``time.sleep``, and every ``CHECK_EVERY`` jumps of
  Python code (``sys.monitoring``, so that ``while True: pass`` stops
  too), and raises ``KeyboardInterrupt``.
- **Actor classes defined in the session.** A program's classes are in its
  component, built with it; a session's are typed after the component was
  built, so its actors (fresh instances of the same component) do not
  have them. So the session records, for every input that ran without an
  error, its *definitions*: the top-level imports, ``def``s, ``class``es
  and assignments that call nothing, in order. A class defined in the
  session is spawned by the key ``__session__:QUALNAME`` with an init
  that carries the definitions (``wrap_init``); the actor's instance runs
  them in a fresh ``__main__`` module, then makes the class from the real
  init. Redefining a class in a later input redefines it for later spawns.

The pure parts (``Console``, ``definitions_of``, ``format_exception``,
``wrap_init``/``unwrap_init``, ``define``) are tested with pytest on the
host's CPython; what needs the host's bindings is imported where it is
used.
"""

import ast
import builtins
import codeop
import io
import os
import sys
import time
import traceback
import types
import __future__

from . import _codec

try:  # the host's Ctrl-C flag; only a session's component imports it
    from wit_world.imports import console as _wconsole
except ImportError:  # pytest, on the host's CPython
    _wconsole = None

#: The file name of the session's inputs, in tracebacks.
CONSOLE = "<console>"
#: The prompts: a new input, and the rest of a block.
PS1 = ">>> "
PS2 = "... "
#: What ``exit()``, ``quit()`` and ``SystemExit`` say in a session.
CLOSE_HINT = "use :close to end the session, or Ctrl-D to detach"

#: How an actor class defined in a session is named to the host:
#: ``__session__:QUALNAME``.
SESSION_KEY_PREFIX = "__session__:"

#: How many jumps of Python code run between two reads of the Ctrl-C flag.
CHECK_EVERY = 20_000
#: The longest slice of ``time.sleep`` between two reads of the flag (s).
SLEEP_SLICE = 0.05


# ---------------------------------------------------------------------------
# Shipping the session's classes to its actors.

def session_key(qualname):
    """The class key of a session's class (see ``SESSION_KEY_PREFIX``)."""
    return SESSION_KEY_PREFIX + qualname


def wrap_init(definitions, init):
    """The init payload of a session's class: a CBOR array of two items,
    the definitions (an array of ``[line, source]`` pairs, an integer and a
    text string each: the statement's first line in its input, and its
    source) and the class's own init (a byte string: the argument list
    that ``create`` decodes, as for any class). The one place the wrapping
    is defined; ``unwrap_init`` reads it."""
    return _codec.Encoder(allow_pickle=False).encode(
        [[[int(line), str(text)] for line, text in definitions], bytes(init)]
    )


def unwrap_init(payload):
    """``(definitions, init)`` from ``wrap_init``'s payload."""
    value = _codec.Decoder(allow_pickle=False).decode(payload)
    if (type(value) is not list or len(value) != 2 or type(value[0]) is not list
            or type(value[1]) is not bytes):
        raise _codec.EncodingError("a session class's init must be [definitions, init]")
    definitions = []
    for item in value[0]:
        if type(item) is not list or len(item) != 2 or type(item[0]) is not int or type(item[1]) is not str:
            raise _codec.EncodingError("a session definition must be [line, source]")
        definitions.append((item[0], item[1]))
    return definitions, value[1]


#: The compiler flags of every ``from __future__ import``.
_FUTURE_MASK = 0
for _name in __future__.all_feature_names:
    _FUTURE_MASK |= getattr(__future__, _name).compiler_flag


def _future_flags(code):
    """The ``__future__`` flags that ``code`` was compiled with."""
    return code.co_flags & _FUTURE_MASK


def define(definitions, namespace):
    """Runs recorded definitions in ``namespace``, each on its own with its
    own line numbers (so that tracebacks in the actor name the lines the
    user typed), output muted; one that fails is skipped, as when a
    program's classes are defined at build time. Returns the failures, as
    ``(line, "Type: message")``."""
    failures = []
    flags = 0
    saved = sys.stdout, sys.stderr
    try:
        for line, text in definitions:
            sys.stdout = sys.stderr = io.StringIO()
            try:
                code = compile("\n" * max(0, line - 1) + text, CONSOLE, "exec", flags=flags, dont_inherit=True)
                flags |= _future_flags(code)
                exec(code, namespace)
            except BaseException as e:  # noqa: BLE001 - needs what an undefined input made
                failures.append((line, f"{type(e).__name__}: {e}"))
    finally:
        sys.stdout, sys.stderr = saved
    return failures


# ---------------------------------------------------------------------------
# Definitions: the statements an actor must run to have the session's
# classes.

_DEFINES = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _runs_code(node):
    """Whether evaluating ``node`` calls anything (a lambda's body is not
    evaluated; its defaults are)."""
    if isinstance(node, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom)):
        return True
    if isinstance(node, ast.Lambda):
        args = node.args
        return any(_runs_code(d) for d in [*args.defaults, *args.kw_defaults] if d is not None)
    return any(_runs_code(child) for child in ast.iter_child_nodes(node))


def is_definition(stmt):
    """Whether a top-level statement is one an actor reruns: an import, a
    ``def``, a ``class``, or an assignment whose value calls nothing."""
    if isinstance(stmt, _DEFINES):
        return True
    type_alias = getattr(ast, "TypeAlias", None)
    if type_alias is not None and isinstance(stmt, type_alias):
        return True
    if isinstance(stmt, ast.Assign):
        return not any(_runs_code(n) for n in [stmt.value, *stmt.targets])
    if isinstance(stmt, ast.AnnAssign):
        return not any(_runs_code(n) for n in [stmt.target, stmt.value] if n is not None)
    return False


def definitions_of(source, tree=None):
    """The definitions of one input: ``[(line, source)]`` for each
    top-level statement that ``is_definition``, in order. ``line`` is the
    statement's first line (its first decorator's) in the input."""
    if tree is None:
        tree = ast.parse(source, CONSOLE, "exec")
    lines = source.splitlines(True)
    out = []
    for stmt in tree.body:
        if not is_definition(stmt):
            continue
        if isinstance(stmt, _COMPOUND):
            # A compound statement owns its lines: its decorators', its
            # own, and its body's.
            first = min([stmt.lineno, *(d.lineno for d in stmt.decorator_list)])
            text = "".join(lines[first - 1:stmt.end_lineno])
        else:
            # A simple one may share its line (`import os; x = 1`).
            first = stmt.lineno
            text = ast.get_source_segment(source, stmt)
        if text:
            out.append((first, text))
    return out


def defined_names(stmt):
    """The top-level names a definition binds."""
    if isinstance(stmt, _COMPOUND):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"]
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None) or getattr(stmt, "name", None)]
    names = []
    for target in targets:
        if target is None:
            continue
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                names.append(node.id)
    return names


# ---------------------------------------------------------------------------
# Tracebacks.

def _package_dir(module_file):
    return os.path.dirname(module_file) + os.sep


#: Directories whose frames are the SDK's (this package's, asyncio's): left
#: out of tracebacks, and where a Ctrl-C waits for the SDK's next check.
_SDK_PREFIXES = (_package_dir(__file__),)
try:
    import asyncio as _asyncio

    _SDK_PREFIXES += (_package_dir(_asyncio.__file__),)
except Exception:  # noqa: BLE001
    pass
#: Files whose frames are the SDK's (``monarch_session`` adds itself).
_SDK_FILES = set()


def add_sdk_file(path):
    """Marks ``path`` (the component's entry module) as the SDK's."""
    _SDK_FILES.add(path)


def is_sdk_file(filename):
    """Whether a frame of ``filename`` is the SDK's."""
    return filename in _SDK_FILES or filename.startswith(_SDK_PREFIXES)


def _strip(te, seen):
    if te is None or id(te) in seen:
        return
    seen.add(id(te))
    frames = list(te.stack)
    if any(f.filename == CONSOLE for f in frames):
        # From the input's frame down: what ran it is the session's.
        while frames[0].filename != CONSOLE:
            frames.pop(0)
    frames = [f for f in frames if not is_sdk_file(f.filename)]
    te.stack = traceback.StackSummary.from_list(frames)
    _strip(te.__cause__, seen)
    _strip(te.__context__, seen)
    for sub in getattr(te, "exceptions", None) or []:
        _strip(sub, seen)


def format_exception(e):
    """An exception as the REPL shows it: its traceback from the input's
    frame down, without the SDK's frames (chained exceptions too)."""
    te = traceback.TracebackException(type(e), e, e.__traceback__, compact=True)
    _strip(te, set())
    return "".join(te.format()).rstrip("\n")


def format_syntax_error(e):
    """A syntax error as the REPL shows it: file, line, the line and a caret."""
    return "".join(traceback.format_exception_only(type(e), e)).rstrip("\n")


# ---------------------------------------------------------------------------
# Ctrl-C.

#: ``console.interrupted`` in a session's controller (``init`` sets it).
_host_interrupted = None
#: Whether an input runs now: the flag is only read then.
_input_running = False
#: A Ctrl-C read by the jump hook in the SDK's code, for the SDK's next check.
_pending = False
_countdown = CHECK_EVERY
_monitoring_tool = None


def interrupted():
    """True, once, when the user pressed Ctrl-C while the current input
    runs. Always false outside a session's input (in actors, in programs)."""
    global _pending
    if not _input_running or _host_interrupted is None:
        return False
    if _pending:
        _pending = False
        return True
    return bool(_host_interrupted())


def check_interrupt():
    """Raises ``KeyboardInterrupt`` when ``interrupted()``."""
    if interrupted():
        raise KeyboardInterrupt


def _on_jump(code, instruction_offset, destination_offset):
    # sys.monitoring's JUMP callback: the hot path is the countdown.
    global _countdown, _pending
    _countdown -= 1
    if _countdown > 0:
        return
    _countdown = CHECK_EVERY
    if not _input_running or _host_interrupted is None:
        return
    if not (_pending or _host_interrupted()):
        return
    if is_sdk_file(code.co_filename):
        # Not inside the SDK (a reply half-dispatched would be lost): its
        # next wait raises, or the next jump outside it.
        _pending = True
        _countdown = 1
        return
    _pending = False
    raise KeyboardInterrupt


def _start_monitoring():
    """Chooses a sys.monitoring tool id for the jump hook (CPython 3.12+)."""
    global _monitoring_tool
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is None or _monitoring_tool is not None:
        return
    for tool in (4, 3, 5, 2, 1):
        if monitoring.get_tool(tool) is None:
            monitoring.use_tool_id(tool, "monarch-session-interrupt")
            monitoring.register_callback(tool, monitoring.events.JUMP, _on_jump)
            _monitoring_tool = tool
            return


def _set_monitoring(on):
    if _monitoring_tool is None:
        return
    monitoring = sys.monitoring
    monitoring.set_events(_monitoring_tool, monitoring.events.JUMP if on else 0)


class _Running:
    """While an input runs: the Ctrl-C flag is read, the jump hook is on.
    Nested (the statements of a paste in its whole), the outermost counts."""

    def __init__(self):
        self._outer = False

    def __enter__(self):
        global _input_running, _pending, _countdown
        self._outer = not _input_running
        if self._outer:
            _pending = False
            _countdown = CHECK_EVERY
            _input_running = True
            _set_monitoring(True)
        return self

    def __exit__(self, *exc):
        global _input_running, _pending
        if self._outer:
            _set_monitoring(False)
            _input_running = False
            # A Ctrl-C that came as the input ended is dropped.
            _pending = False
        return False


_original_sleep = time.sleep


def _sleep(seconds):
    """``time.sleep`` in a session: in slices of at most ``SLEEP_SLICE``,
    with a Ctrl-C check between them."""
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    if not _input_running:
        return _original_sleep(seconds)
    end = time.monotonic() + seconds
    while True:
        check_interrupt()
        left = end - time.monotonic()
        if left <= 0:
            return None
        _original_sleep(min(left, SLEEP_SLICE))


# ---------------------------------------------------------------------------
# The REPL.

class _Exit:
    """``exit`` and ``quit`` in a session: they do not end it."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return CLOSE_HINT[0].upper() + CLOSE_HINT[1:]

    def __call__(self, code=None):
        raise SystemExit(code)


class Console:
    """The session's REPL over ``namespace``: ``push(line)`` returns
    ``(ok, text)``: an input's result (the reprs of its expressions, or
    ``""``), or its error (a traceback)."""

    def __init__(self, namespace, before_input=None):
        self.namespace = namespace
        self.buffer = []
        #: Every definition of every input that ran without an error.
        self.definitions = []
        #: The names those definitions bind.
        self.names = set()
        self._compile = codeop.CommandCompiler()
        self._before_input = before_input

    def prompt(self):
        return PS2 if self.buffer else PS1

    def push(self, line):
        """One line: Ok ``""`` while a block is incomplete."""
        self.buffer.append(line)
        source = "\n".join(self.buffer)
        try:
            code = self._compile(source, CONSOLE, "single")
        except (OverflowError, SyntaxError, ValueError) as e:
            self.buffer = []
            return False, format_syntax_error(e)
        if code is None:
            return True, ""
        self.buffer = []
        return self.run(source, code)

    def push_lines(self, text):
        """An input of several lines (a paste, or one of ``run``'s
        arguments). Outside a block, when it parses whole, its statements
        run one after another, as a file's would (blank lines inside a
        class do not end it); otherwise each line is pushed. The first
        error ends it."""
        text = text.replace("\r\n", "\n")
        if "\n" not in text:
            return self.push(text)
        if not self.buffer:
            chunk = self._parse_chunk(text)
            if chunk is not None:
                return self._run_chunk(text, chunk)
        shown = []
        # A paste's last newline ends its last line, not a block.
        for line in text.removesuffix("\n").split("\n"):
            ok, out = self.push(line)
            if not ok:
                return False, "\n".join([*shown, out])
            if out:
                shown.append(out)
        return True, "\n".join(shown)

    def _future_flags(self):
        return getattr(self._compile.compiler, "flags", 0) & _FUTURE_MASK

    def _parse_chunk(self, text):
        try:
            return compile(text, CONSOLE, "exec", self._future_flags() | ast.PyCF_ONLY_AST, True)
        except (OverflowError, SyntaxError, ValueError):
            return None

    def _run_chunk(self, text, tree):
        with _Running():
            return self._run_statements(text, tree)

    def _run_statements(self, text, tree):
        shown = []
        for stmt in tree.body:
            try:
                code = compile(ast.Interactive(body=[stmt]), CONSOLE, "single", self._future_flags(), True)
            except (OverflowError, SyntaxError, ValueError) as e:
                return False, "\n".join([*shown, format_syntax_error(e)])
            compiler = self._compile.compiler
            if hasattr(compiler, "flags"):
                compiler.flags |= _future_flags(code)
            ok, out = self.run(text, code, ast.Module(body=[stmt], type_ignores=[]))
            if not ok:
                return False, "\n".join([*shown, out])
            if out:
                shown.append(out)
        return True, "\n".join(shown)

    def run(self, source, code, tree=None):
        """Runs ``code``, compiled from ``source`` (``tree``: the statements
        of it that it is, when not all); records its definitions if it ran."""
        shown = []

        def displayhook(value):
            if value is None:
                return
            builtins._ = None  # as sys.displayhook: `_` is not in the repr
            shown.append(repr(value))
            builtins._ = value

        saved = sys.displayhook
        sys.displayhook = displayhook
        try:
            with _Running():
                if self._before_input is not None:
                    self._before_input()
                exec(code, self.namespace)
        except SystemExit:
            return False, f"SystemExit: {CLOSE_HINT}"
        except BaseException as e:  # noqa: BLE001 - shown, and the session goes on
            return False, format_exception(e)
        finally:
            sys.displayhook = saved
            _flush()
        self.record(source, tree)
        return True, "\n".join(shown)

    def record(self, source, tree=None):
        """Keeps the definitions of an input that ran."""
        if tree is None:
            try:
                tree = compile(source, CONSOLE, "exec", self._future_flags() | ast.PyCF_ONLY_AST, True)
            except (OverflowError, SyntaxError, ValueError):
                return
        for stmt in tree.body:
            if is_definition(stmt):
                self.names.update(defined_names(stmt))
        self.definitions.extend(definitions_of(source, tree))


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def new_namespace():
    """A fresh ``__main__`` module with the session's imports."""
    module = types.ModuleType("__main__")
    module.__builtins__ = builtins
    exec("from monarch.actor import *\nimport monarch\n", module.__dict__)
    return module


# ---------------------------------------------------------------------------
# The component's side: the session's controller and its actors. These
# need the host's bindings, imported where used.

#: The controller's console, once ``init`` ran.
_console = None
#: The definitions the session's classes are shipped with: the console's
#: (in the controller), or those an actor was made from (so that it can
#: spawn the session's classes in turn). None outside a session.
_definitions = None


def install(entry_file=None):
    """At build time, in a session's component: hooks the session into the
    runtime (shipping and rebuilding classes, the Ctrl-C checks)."""
    from . import _runtime

    if entry_file:
        add_sdk_file(entry_file)
    _runtime._session = sys.modules[__name__]


def _session_fault_hook(failure):
    """``unhandled_fault_hook`` in a session: report, do not exit."""
    sys.stderr.write(f"Unhandled monarch error: {failure.report()}\n")
    sys.stderr.flush()


def _poll_host():
    """Delivers the events that came since the last input (a failure's
    report, replies), without waiting."""
    from . import _runtime

    _runtime._HostSource().wait(0.0)


def init(args):
    """The session's controller: a fresh namespace. None, or why not."""
    global _console, _definitions, _host_interrupted
    from . import _program
    from . import actor as _public

    if _wconsole is None:
        return "this component has no console import (build it for the world session-program)"
    _host_interrupted = _wconsole.interrupted
    _public.unhandled_fault_hook = _session_fault_hook
    time.sleep = _sleep
    try:
        sys.stdout.reconfigure(line_buffering=True)
    except Exception:  # noqa: BLE001 - not a TextIOWrapper
        pass
    _start_monitoring()
    sys.argv = ["", *args]
    module = new_namespace()
    module.__dict__["exit"] = _Exit("exit")
    module.__dict__["quit"] = _Exit("quit")
    _program.prepare_session(module)
    _console = Console(module.__dict__, before_input=_poll_host)
    _definitions = _console.definitions
    return None


def on_input(line):
    """``(ok, text)`` for one line the user entered."""
    if _console is None:
        error = init([])
        if error is not None:
            return False, error
    if _host_interrupted is not None:
        _host_interrupted()  # a Ctrl-C at the prompt is not this input's
    return _console.push_lines(line)


def prompt():
    return _console.prompt() if _console is not None else PS1


def run_lines(lines):
    """``run``: each argument is one input, in order; the results are
    printed. None, or the first error."""
    if _console is None:
        error = init([])
        if error is not None:
            return error
    for line in lines:
        ok, text = on_input(line)
        if not ok:
            return text
        if text:
            print(text, flush=True)
    if _console.buffer:
        # The end of the lines ends an open block, as the end of a file.
        ok, text = on_input("")
        if not ok:
            return text
        if text:
            print(text, flush=True)
    return None


def ship_class(cls, key, init):
    """At a spawn (``_runtime``): a class defined in the session goes as
    ``__session__:QUALNAME`` with the definitions (``wrap_init``). Other
    classes go as they are."""
    if _definitions is None or cls.__module__ not in ("__main__", "__mp_main__"):
        return key, init
    qualname = cls.__qualname__
    if "<locals>" in qualname:
        raise TypeError(f"actor class {qualname!r} is defined inside a function; define it at the top level of an input")
    top = qualname.split(".")[0]
    if _console is not None and top not in _console.names:
        raise TypeError(
            f"actor class {qualname!r} was not defined by a top-level `class` statement of an input that ran "
            "without an error, so its actors cannot define it; define it at the top level of an input"
        )
    return session_key(qualname), wrap_init(_definitions, init)


def rebuild_class(key, init):
    """At ``create`` (``_runtime``), in an actor: a ``__session__:`` key's
    definitions are run in a fresh ``__main__`` module; returns the key and
    init to make the class from. Other keys are returned as they are."""
    global _definitions
    if not key.startswith(SESSION_KEY_PREFIX):
        return key, init
    from . import _program

    qualname = key[len(SESSION_KEY_PREFIX):]
    definitions, inner = unwrap_init(init)
    module = types.ModuleType("__main__")
    module.__builtins__ = builtins
    _program.prepare_session(module)
    _program.BUILDING = True
    try:
        failures = define([(1, "from monarch.actor import *\nimport monarch\n"), *definitions], module.__dict__)
    finally:
        _program.BUILDING = False
    _definitions = definitions
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            why = "".join(f"\n  <console> line {line}: {error}" for line, error in failures)
            raise LookupError(f"the session's definitions did not define actor class {qualname!r}" +
                              (f"; these failed:{why}" if why else ""))
    return f"__main__:{qualname}", inner

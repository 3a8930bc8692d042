"""The user's program inside the component.

componentize-py runs this at build time and snapshots the result, and a
component has no files at run time. So the build:

1. reads the user's script, compiles it (a syntax error is reported with
   file and line, and the build fails), and registers its source so that
   tracebacks show its lines;
2. imports every module the script imports, anywhere in it (a module that
   is not imported at build time cannot be imported at run time);
3. runs the script's top level in *actor mode*, as module ``__main__``:
   one statement at a time, skipping ``if __name__ == "__main__":`` blocks,
   output muted, and a statement that fails (it needs the cluster, or a
   name a skipped statement would have set) is skipped. What remains are
   the classes and functions actors need, already defined in every
   instance, so spawning an actor costs no import.

At run time the controller runs the whole script as ``__main__``.

The program's tests (``monarch-host test``, the WIT ``tests`` export) are
its functions named ``test*``, listed at build time from the module the
build defined (``_testing.collect``). Each runs in an instance of its
own: the script's top level first, without its ``if __name__ ==
"__main__":`` blocks and with its asserts keeping their values (as pytest
imports a module), then the test function.
"""

import ast
import builtins
import importlib
import importlib.util
import io
import linecache
import sys
import traceback
import types

from . import _testing

#: True while the build runs the script in actor mode: the host cannot be
#: reached then, so anything that needs it raises ``NotAtBuildTime``.
BUILDING = False

_display = "<program>"
_code = None
_test_code = None
_assert_records = []
_tests = []
_actor_module = None
_problems = []


class NotAtBuildTime(RuntimeError):
    """Raised by calls that need the cluster while the build defines the
    program's classes."""


def check_not_building(what):
    if BUILDING:
        raise NotAtBuildTime(f"{what} needs the cluster")


def actor_module():
    return _actor_module


def problems():
    return list(_problems)


_is_main_guard = _testing.is_main_guard


def _imported_names(tree):
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _where(e):
    tb = traceback.extract_tb(e.__traceback__)
    frames = [f for f in tb if f.filename == _display] or tb
    if frames:
        return f"{frames[-1].filename}:{frames[-1].lineno}"
    return _display


def prepare(module_name, display):
    """At build time: load, check and define the user's program."""
    global _display, _code, _test_code, _assert_records, _tests, _actor_module, BUILDING
    _display = display
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        _problems.append(f"{display}: the program's source was not found in the build")
        return
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    linecache.cache[display] = (len(source), None, source.splitlines(True), display)
    try:
        tree = ast.parse(source, display)
        _code = compile(tree, display, "exec")
        test_tree, _assert_records = _testing.prepare_tree(tree)
        _test_code = compile(test_tree, display, "exec")
    except SyntaxError as e:
        detail = f"{e.filename}:{e.lineno}:{e.offset or 0}: SyntaxError: {e.msg}"
        if e.text:
            detail += "\n    " + e.text.rstrip() + "\n    " + " " * max(0, (e.offset or 1) - 1) + "^"
        _problems.append(detail)
        return
    for name in _imported_names(tree):
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            # `from pkg import name` lists names that may be attributes, not
            # modules: only a missing top-level module is a problem.
            if e.name and name.startswith(e.name) and "." not in e.name and name.split(".")[0] == e.name:
                _problems.append(f"{display}: No module named {e.name!r} (install it where the build runs, "
                                 "or put it next to the program)")
        except Exception as e:  # noqa: BLE001 - reported like the import at run time would be
            _problems.append(f"{display}: importing {name} raised {type(e).__name__}: {e}")
    # Named `__main__`, so that classes pickled here and in the controller
    # name the same module; `if __name__ == "__main__":` blocks are skipped
    # by the statement filter instead.
    module = types.ModuleType("__main__")
    module.__file__ = display
    module.__builtins__ = builtins
    sys.modules["__mp_main__"] = module
    sys.modules["__main__"] = module
    _actor_module = module
    saved = sys.stdout, sys.stderr
    BUILDING = True
    try:
        for stmt in tree.body:
            if _is_main_guard(stmt):
                continue
            piece = compile(ast.Module(body=[stmt], type_ignores=[]), display, "exec")
            sys.stdout = sys.stderr = io.StringIO()
            try:
                exec(piece, module.__dict__)
            except (ImportError, SyntaxError) as e:
                name = getattr(e, "name", None)
                if not (name and any(repr(name) in p for p in _problems)):
                    _problems.append(f"{_where(e)}: {type(e).__name__}: {e}")
            except BaseException:  # noqa: BLE001 - needs the cluster or a skipped name
                pass
            finally:
                sys.stdout, sys.stderr = saved
    finally:
        BUILDING = False
        sys.stdout, sys.stderr = saved
    _tests = _testing.collect(module.__dict__)


def prepare_session(module):
    """A console session (``monarch._session``) has no script: ``module``,
    the session's namespace (in its controller) or the one an actor
    rebuilt the session's classes in, is ``__main__`` and the module of
    the actor classes named ``__main__:Class``."""
    global _display, _actor_module
    _display = "<console>"
    module.__builtins__ = builtins
    sys.modules["__mp_main__"] = module
    sys.modules["__main__"] = module
    _actor_module = module


def run_main(args):
    """The controller: the whole script as ``__main__``. Returns None, or
    the text of why it failed."""
    if _code is None:
        return "the program was not built (see the build's errors)"
    module = types.ModuleType("__main__")
    module.__file__ = _display
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [_display, *args]
    try:
        exec(_code, module.__dict__)
    except SystemExit as e:
        if e.code is None or e.code == 0:
            return None
        if isinstance(e.code, int):
            return f"the program exited with status {e.code}"
        return str(e.code)
    except BaseException as e:  # noqa: BLE001 - printed as Python prints it
        # From the program's frame down: this function's frame is the SDK's.
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next))
        sys.stderr.write(text)
        return f"{type(e).__name__}: {e} (at {_where(e)})"
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
    return None


def listed_tests():
    """The program's tests (``list-tests``), in the order it defines them."""
    return list(_tests)


def run_test(name):
    """Runs the test ``name`` as the controller (``run-test``): the
    script's top level as a test imports it, then the function. Returns
    None when it passed, else why it failed (``_testing.failure_text``)."""
    if _test_code is None:
        return "the program was not built (see the build's errors)"
    module = types.ModuleType("__main__")
    module.__file__ = _display
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [_display]
    try:
        try:
            exec(_test_code, module.__dict__)
        except BaseException as e:  # noqa: BLE001 - the test fails with it
            return _testing.failure_text(
                e, _display, _assert_records, context="the program's top level failed before the test ran"
            )
        fn = module.__dict__.get(name)
        if not _testing.is_test(name, fn):
            listed = ", ".join(_tests) or "none"
            return f"{_display} has no test function {name!r} (its tests: {listed})"
        problem = _testing.signature_problem(fn)
        if problem is not None:
            return problem
        try:
            _testing.call_test(fn)
        except BaseException as e:  # noqa: BLE001 - the test fails with it
            return _testing.failure_text(e, _display, _assert_records)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
    return None

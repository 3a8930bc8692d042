"""The console session's REPL (monarch._session), on the host's CPython:
blocks, what an input shows, tracebacks, the definitions an actor reruns,
how a session's class travels to its actors, and the Ctrl-C checks with
a fake flag. What needs the host (spawning, ``console.interrupted``
itself) is tested end to end by the host's tests."""

import builtins
import sys
import types

import pytest

from monarch import _codec, _session
from monarch._session import CLOSE_HINT, Console, PS1, PS2


def namespace():
    return {"__name__": "__main__", "__builtins__": builtins}


@pytest.fixture
def console():
    return Console(namespace())


def lines(console, *inputs):
    """Pushes each line; returns the (ok, text) of the last."""
    result = None
    for line in inputs:
        result = console.push(line)
    return result


# -- blocks and prompts ------------------------------------------------------

def test_a_simple_statement_runs_at_once(console):
    assert console.push("x = 41") == (True, "")
    assert console.prompt() == PS1
    assert console.namespace["x"] == 41


def test_a_block_waits_for_an_empty_line(console):
    assert console.push("def f(n):") == (True, "")
    assert console.prompt() == PS2
    assert console.push("    return n + 1") == (True, "")
    assert console.prompt() == PS2
    assert "f" not in console.namespace
    assert console.push("") == (True, "")
    assert console.prompt() == PS1
    assert console.push("f(1)") == (True, "2")


def test_a_compound_statement_on_one_line_is_a_block(console):
    assert console.push("for i in range(3): pass") == (True, "")
    assert console.prompt() == PS2
    assert console.push("") == (True, "")
    assert console.namespace["i"] == 2


def test_an_empty_line_alone_does_nothing(console):
    assert console.push("") == (True, "")
    assert console.prompt() == PS1


def test_a_paste_runs_as_a_file_would(console):
    # A blank line inside a class does not end it, as it would typed.
    ok, text = console.push_lines("class A:\n    x = 1\n\n    def y(self):\n        return 2\n\nA().y()\nA.x")
    assert (ok, text) == (True, "2\n1")
    assert console.prompt() == PS1


def test_a_paste_stops_at_its_first_error(console):
    ok, text = console.push_lines("a = 1\n1 / 0\nb = 2\n")
    assert not ok
    assert "ZeroDivisionError" in text
    assert 'File "<console>", line 2, in <module>' in text
    assert "b" not in console.namespace


def test_an_incomplete_paste_is_pushed_line_by_line(console):
    assert console.push_lines("if True:\n    x = 3\n    if x:\n") == (True, "")
    assert console.prompt() == PS2
    assert console.push("        y = 4") == (True, "")
    assert console.push("") == (True, "")
    assert console.namespace["y"] == 4


# -- what an input shows -------------------------------------------------------

def test_expressions_show_their_repr_and_none_nothing(console):
    assert console.push("1 + 2") == (True, "3")
    assert console.push("'a'") == (True, "'a'")
    assert console.push("None") == (True, "")
    assert console.push("1; 2") == (True, "1\n2")


def test_the_last_value_is_underscore(console):
    console.push("[1, 2]")
    assert console.push("_ + [3]") == (True, "[1, 2, 3]")


def test_print_goes_to_stdout_not_to_the_result(console, capsys):
    assert console.push("print('hello')") == (True, "")
    assert capsys.readouterr().out == "hello\n"


def test_the_result_is_not_printed(console, capsys):
    assert console.push("40 + 2") == (True, "42")
    assert capsys.readouterr().out == ""


def test_a_failing_repr_is_an_error(console):
    lines(console, "class C:", "    def __repr__(self): raise ValueError('no repr')", "")
    ok, text = console.push("C()")
    assert not ok
    assert text.splitlines() == [
        "Traceback (most recent call last):",
        '  File "<console>", line 1, in <module>',
        '  File "<console>", line 2, in __repr__',
        "ValueError: no repr",
    ]


# -- errors --------------------------------------------------------------------

def test_an_exception_shows_its_traceback_from_the_input_down(console):
    lines(console, "def f(n):", "    return 1 / n", "")
    ok, text = console.push("f(0)")
    assert not ok
    assert text.splitlines() == [
        "Traceback (most recent call last):",
        '  File "<console>", line 1, in <module>',
        '  File "<console>", line 2, in f',
        "ZeroDivisionError: division by zero",
    ]
    # The session goes on.
    assert console.push("f(2)") == (True, "0.5")


def test_the_sdks_frames_are_left_out(console):
    console.namespace["_codec"] = _codec
    ok, text = console.push("_codec.Decoder().decode(b'\\xff')")
    assert not ok
    assert text.startswith("Traceback (most recent call last):\n  File \"<console>\", line 1, in <module>\n")
    assert "_codec.py" not in text
    assert "EncodingError" in text


def test_chained_exceptions_are_stripped_too(console):
    console.namespace["_codec"] = _codec
    ok, text = console.push_lines(
        "try:\n    _codec.Decoder().decode(b'\\xff')\nexcept Exception as e:\n    raise RuntimeError('wrapped') from e\n"
    )
    assert not ok
    assert "_codec.py" not in text
    assert "The above exception was the direct cause" in text
    assert text.endswith("RuntimeError: wrapped")


def test_a_syntax_error_shows_the_caret(console):
    ok, text = console.push("x = = 1")
    assert not ok
    assert text.splitlines() == ['  File "<console>", line 1', "    x = = 1", "        ^", "SyntaxError: invalid syntax"]
    assert console.prompt() == PS1
    assert console.push("x = 1") == (True, "")


def test_a_syntax_error_in_a_block_drops_the_block(console):
    console.push("def f():")
    ok, text = console.push("  return )")
    assert not ok and "SyntaxError" in text
    assert console.prompt() == PS1


@pytest.mark.parametrize("line", ["exit()", "quit()", "raise SystemExit(3)", "import sys; sys.exit(0)"])
def test_exit_does_not_end_the_session(line):
    console = Console(namespace())
    console.namespace["exit"] = console.namespace["quit"] = _session._Exit("exit")
    console.namespace["sys"] = sys
    ok, text = console.push(line)
    assert not ok
    assert CLOSE_HINT in text
    assert console.push("1") == (True, "1")


def test_exit_shows_how_to_leave(console):
    console.namespace["exit"] = _session._Exit("exit")
    ok, text = console.push("exit")
    assert ok and ":close" in text


# -- definitions -----------------------------------------------------------------

def test_which_statements_are_definitions():
    source = "\n".join([
        "import os",
        "from math import pi as PI",
        "X = 1",
        "Y: int = 2",
        "NAMES = ['a', {'b': (1, 2)}]",
        "F = lambda x: print(x)",
        "G = lambda x=print(): x",
        "Z = len('abc')",
        "W = [str(i) for i in range(3)]",
        "X += 1",
        "print('hi')",
        "for i in range(2): pass",
        "def f():",
        "    return os.getcwd()",
        "async def g():",
        "    pass",
        "class C:",
        "    v = compute()",
        "@decorate(1)",
        "class D:",
        "    pass",
    ]) + "\n"
    defs = _session.definitions_of(source)
    assert [text.splitlines()[0] for _, text in defs] == [
        "import os",
        "from math import pi as PI",
        "X = 1",
        "Y: int = 2",
        "NAMES = ['a', {'b': (1, 2)}]",
        "F = lambda x: print(x)",
        "def f():",
        "async def g():",
        "class C:",
        "@decorate(1)",
    ]
    # Each keeps its first line in the input (a decorated class its
    # decorator's) and its whole text.
    by_first = {text.splitlines()[0]: (line, text) for line, text in defs}
    assert by_first["def f():"] == (13, "def f():\n    return os.getcwd()\n")
    assert by_first["@decorate(1)"] == (19, "@decorate(1)\nclass D:\n    pass\n")


def test_statements_sharing_a_line_are_kept_apart():
    assert _session.definitions_of("import os; x = f(); y = 2") == [(1, "import os"), (1, "y = 2")]


def test_a_console_records_the_definitions_of_inputs_that_ran(console):
    console.push("import math")
    console.push("LIMIT = 3")
    console.push("value = math.sqrt(16)")  # a call: not rerun by actors
    lines(console, "class A:", "    pass", "")
    console.push("broken = 1 / 0")
    lines(console, "def g():", "    return LIMIT", "")
    assert console.definitions == [
        (1, "import math"),
        (1, "LIMIT = 3"),
        (1, "class A:\n    pass\n"),
        (1, "def g():\n    return LIMIT\n"),
    ]
    assert {"math", "LIMIT", "A", "g"} <= console.names
    assert "value" not in console.names


def test_an_input_that_fails_records_nothing(console):
    console.push_lines("if True:\n    class Hidden:\n        pass\n")
    console.push("class Z: x = 1 / 0")
    ok, _ = console.push("")
    assert not ok
    assert console.definitions == []


def test_a_paste_records_each_statement_that_ran_with_its_line(console):
    console.push_lines("import math\n\nclass A:\n    x = 1\n\n    y = 2\nz = math.sqrt(2)\n")
    assert console.definitions == [(1, "import math"), (3, "class A:\n    x = 1\n\n    y = 2\n")]


# -- shipping a session's class to its actors ------------------------------------

def test_wrap_init_round_trips():
    definitions = [(1, "import math"), (4, "class A:\n    pass\n")]
    init = _codec.encode_args(_codec.Encoder(), [1, "two"], {"k": 3.5})
    payload = _session.wrap_init(definitions, init)
    assert _session.unwrap_init(payload) == (definitions, init)
    # As documented: a CBOR array of the definitions and the inner init.
    assert _codec.Decoder().decode(payload) == [[[1, "import math"], [4, "class A:\n    pass\n"]], init]


def test_unwrap_init_refuses_other_payloads():
    with pytest.raises(_codec.EncodingError):
        _session.unwrap_init(_codec.Encoder().encode([1, 2, 3]))
    with pytest.raises(_codec.EncodingError):
        _session.unwrap_init(_codec.Encoder().encode([[["x", 1]], b""]))


def test_the_session_key_names_the_qualname():
    assert _session.session_key("Counter") == "__session__:Counter"
    assert _session.session_key("Outer.Inner").startswith(_session.SESSION_KEY_PREFIX)


def test_definitions_rebuild_the_classes_elsewhere(console):
    lines(console, "SCALE = 10")
    lines(console, "class Counter:", "    def __init__(self, v):", "        self.v = v * SCALE", "",)
    lines(console, "def broken():", "    return 1", "")
    console.push("Counter = Counter")  # no call: recorded, harmless
    # What an actor does: a fresh module, the definitions, the class.
    module = types.ModuleType("__main__")
    failures = _session.define(console.definitions, module.__dict__)
    assert failures == []
    assert module.Counter(2).v == 20


def test_definitions_that_fail_are_skipped_and_reported():
    namespace_ = {"__name__": "__main__", "__builtins__": builtins}
    failures = _session.define([(1, "X = missing_name"), (2, "import no_such_module_here"), (3, "Y = 5")], namespace_)
    assert namespace_["Y"] == 5
    assert [line for line, _ in failures] == [1, 2]
    assert "NameError" in failures[0][1]


def test_rebuilt_definitions_keep_their_lines_in_tracebacks():
    namespace_ = {"__name__": "__main__", "__builtins__": builtins}
    _session.define([(3, "def f():\n    return 1 / 0\n")], namespace_)
    try:
        namespace_["f"]()
    except ZeroDivisionError as e:
        text = _session.format_exception(e)
    assert 'File "<console>", line 4, in f' in text


def test_a_redefined_class_is_the_new_one_after_the_definitions(console):
    lines(console, "class A:", "    v = 1", "")
    lines(console, "class A:", "    v = 2", "")
    module = types.ModuleType("__main__")
    _session.define(console.definitions, module.__dict__)
    assert module.A.v == 2


def test_future_imports_carry_to_later_definitions():
    namespace_ = {"__name__": "__main__", "__builtins__": builtins}
    _session.define([(1, "from __future__ import annotations"), (2, "def f(x: Undefined) -> Nope:\n    return x\n")],
                    namespace_)
    assert namespace_["f"].__annotations__ == {"x": "Undefined", "return": "Nope"}


# -- Ctrl-C ------------------------------------------------------------------------

class FakeFlag:
    """``console.interrupted``: true once after ``press()``."""

    def __init__(self):
        self.pressed = False
        self.reads = 0

    def press(self):
        self.pressed = True

    def __call__(self):
        self.reads += 1
        pressed, self.pressed = self.pressed, False
        return pressed


@pytest.fixture
def flag(monkeypatch):
    fake = FakeFlag()
    monkeypatch.setattr(_session, "_host_interrupted", fake)
    return fake


def test_the_flag_is_read_only_while_an_input_runs(flag):
    flag.press()
    assert not _session.interrupted()
    assert flag.reads == 0
    with _session._Running():
        assert _session.interrupted()
        assert not _session.interrupted()


def test_sleep_stops_on_ctrl_c(flag, monkeypatch):
    slices = []

    def fake_sleep(seconds):
        slices.append(seconds)
        if len(slices) == 3:
            flag.press()

    monkeypatch.setattr(_session, "_original_sleep", fake_sleep)
    clock = iter(range(0, 1000))
    monkeypatch.setattr(_session.time, "monotonic", lambda: next(clock) * 0.01)
    console = Console(namespace())
    console.namespace["sleep"] = _session._sleep
    ok, text = console.push("sleep(100)")
    assert not ok
    assert text.splitlines() == [
        "Traceback (most recent call last):",
        '  File "<console>", line 1, in <module>',
        "KeyboardInterrupt",
    ]
    assert len(slices) == 3 and max(slices) <= _session.SLEEP_SLICE


def test_sleep_outside_an_input_is_the_original(monkeypatch):
    slept = []
    monkeypatch.setattr(_session, "_original_sleep", slept.append)
    _session._sleep(2.5)
    assert slept == [2.5]
    with pytest.raises(ValueError):
        _session._sleep(-1)


def code_in(filename):
    return compile("pass", filename, "exec")


def test_the_jump_hook_reads_the_flag_every_so_many_jumps(flag, monkeypatch):
    monkeypatch.setattr(_session, "CHECK_EVERY", 100)
    user = code_in("<console>")
    with _session._Running():
        _session._countdown = 100
        for _ in range(250):
            _session._on_jump(user, 0, 0)
        assert flag.reads == 2
        flag.press()
        with pytest.raises(KeyboardInterrupt):
            for _ in range(100):
                _session._on_jump(user, 0, 0)


def test_the_jump_hook_waits_for_the_sdk_to_return(flag, monkeypatch):
    monkeypatch.setattr(_session, "CHECK_EVERY", 10)
    sdk = code_in(_session.__file__)
    user = code_in("<console>")
    with _session._Running():
        _session._countdown = 1
        flag.press()
        _session._on_jump(sdk, 0, 0)  # deferred: inside the SDK
        with pytest.raises(KeyboardInterrupt):
            _session._on_jump(user, 0, 0)
        # Once.
        for _ in range(50):
            _session._on_jump(user, 0, 0)


def test_a_deferred_ctrl_c_is_the_sdks_next_check(flag):
    sdk = code_in(_session.__file__)
    with _session._Running():
        _session._countdown = 1
        flag.press()
        _session._on_jump(sdk, 0, 0)
        with pytest.raises(KeyboardInterrupt):
            _session.check_interrupt()
        _session.check_interrupt()


def test_the_jump_hook_does_nothing_outside_an_input(flag):
    flag.press()
    _session._countdown = 1
    _session._on_jump(code_in("<console>"), 0, 0)
    assert flag.reads == 0


@pytest.mark.skipif(not hasattr(sys, "monitoring"), reason="sys.monitoring is CPython 3.12+")
def test_ctrl_c_stops_a_pure_python_loop(flag, monkeypatch):
    monkeypatch.setattr(_session, "CHECK_EVERY", 1000)
    _session._start_monitoring()
    console = Console(namespace())
    console.namespace["press"] = flag.press
    ok, text = console.push_lines("n = 0\nwhile True:\n    n += 1\n    if n == 5000: press()\n")
    assert not ok
    assert text.endswith("KeyboardInterrupt")
    assert '"<console>", line 3' in text or '"<console>", line 2' in text
    assert _session._monitoring_tool is not None
    assert sys.monitoring.get_events(_session._monitoring_tool) == 0
    assert console.push("n > 0") == (True, "True")


def test_a_ctrl_c_in_the_event_loop_loses_no_ready_callback():
    # What _runtime's wait does on Ctrl-C: raise out of the loop. What was
    # ready must run when the loop runs again (the next input's `.get()`).
    import asyncio

    from monarch._loop import HostLoop

    class Source:
        raise_next = False

        def pending(self):
            return True

        def wait(self, timeout):
            if self.raise_next:
                self.raise_next = False
                raise KeyboardInterrupt

    source = Source()
    loop = HostLoop(source)
    ran = []

    async def job(i):
        ran.append(i)
        await asyncio.sleep(0)
        return i

    tasks = [loop.create_task(job(i)) for i in range(3)]
    source.raise_next = True
    with pytest.raises(KeyboardInterrupt):
        loop.run_until_complete(tasks[0])
    assert not loop.is_running()
    assert loop.run_until_complete(asyncio.gather(*tasks)) == [0, 1, 2]
    assert sorted(ran) == [0, 1, 2]

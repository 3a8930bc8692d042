"""A Python program's tests (monarch._testing, and monarch._program's
build and run of them), on the host's CPython: which functions are tests
and in what order, and what a failing test's report says (the values of
a failed assert, the file and line, the traceback). No component: the
program is built here as the component's build does (``_program.prepare``)."""

import ast
import sys
import textwrap

import pytest

from monarch import _program, _testing


# -- discovery ------------------------------------------------------------------

def test_collect_lists_test_functions_in_the_order_the_module_defines_them():
    source = textwrap.dedent(
        """
        def test_zeta(): pass
        async def test_alpha(): pass
        def helper(): pass
        test_data = [1, 2]          # not a function
        class TestLike: pass        # classes are not collected
        def test_middle(): pass
        def test_zeta(): pass       # redefined: keeps its first place
        def testnounderscore(): pass
        def test_off(): pass
        test_off.__test__ = False   # as pytest, opted out
        """
    )
    namespace = {}
    exec(compile(source, "<m>", "exec"), namespace)
    assert _testing.collect(namespace) == ["test_zeta", "test_alpha", "test_middle", "testnounderscore"]


def test_signature_problem_names_the_arguments_a_test_wants():
    def test_fixture(procs, tmp=1):
        pass

    def test_fine(x=1, *args, **kwargs):
        pass

    problem = _testing.signature_problem(test_fixture)
    assert "test_fixture takes arguments (procs)" in problem and "fixtures are not supported" in problem
    assert _testing.signature_problem(test_fine) is None


def test_call_test_runs_async_tests_to_their_end():
    seen = []

    async def test_async():
        import asyncio

        await asyncio.sleep(0)
        seen.append("ran")

    _testing.call_test(test_async)
    assert seen == ["ran"]


def test_prepare_tree_drops_main_guards_and_keeps_assert_values():
    tree = ast.parse(
        textwrap.dedent(
            """
            x = 1
            def test_a():
                assert f(1) == 2
            if __name__ == "__main__":
                main()
            assert x == 1
            """
        )
    )
    module, records = _testing.prepare_tree(tree)
    text = ast.unparse(module)
    assert "main()" not in text
    assert "(_monarch_assert_0_0 := f(1)) == (_monarch_assert_0_1 := 2)" in text
    assert "assert x == 1" in text, "a module-level assert is left as it is"
    assert [(r.lineno, r.kind, r.ops) for r in records] == [(4, "compare", ["=="])]
    assert "main()" in ast.unparse(tree), "the tree given is not changed"


# -- a program built and tested as in a component ----------------------------------

PROGRAM = '''\
import asyncio

calls = []


def add(a, b):
    calls.append((a, b))
    return a + b


def test_passes():
    assert add(1, 2) == 3


def test_assert_compares():
    total = add(1, 2)
    assert total == 4


def test_assert_calls_once():
    assert add(1, 2) == 4


def test_assert_with_message():
    assert add(2, 2) == 5, "two and two"


def test_lists():
    assert [1, 2, 3] == [1, 2, 4, 5]


def test_chain():
    a, b, c = 1, 5, 3
    assert a < b < c


def test_truthy():
    assert not [1]


def helper_check(v):
    assert v > 10


def test_through_a_helper():
    helper_check(7)


def test_raises():
    {}["missing"]


async def test_async_fails():
    await asyncio.sleep(0)
    assert 1 + 1 == 3


def test_wants_fixture(tmp_path):
    pass


if __name__ == "__main__":
    raise SystemExit("main ran")
'''


@pytest.fixture
def program(tmp_path, monkeypatch):
    """PROGRAM, built as the component's build builds it."""
    (tmp_path / "tested_app.py").write_text(PROGRAM)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("__main__", "__mp_main__"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    display = str(tmp_path / "tested_app.py")
    _program._problems.clear()
    _program.prepare("tested_app", display)
    assert _program.problems() == []
    yield display
    sys.modules.pop("tested_app", None)


def run(name):
    error = _program.run_test(name)
    return error


def test_the_tests_are_listed_in_source_order(program):
    assert _program.listed_tests() == [
        "test_passes",
        "test_assert_compares",
        "test_assert_calls_once",
        "test_assert_with_message",
        "test_lists",
        "test_chain",
        "test_truthy",
        "test_through_a_helper",
        "test_raises",
        "test_async_fails",
        "test_wants_fixture",
    ]


def test_a_passing_test_returns_none_and_main_does_not_run(program):
    assert run("test_passes") is None


def test_a_failed_comparison_shows_its_values_file_and_line(program):
    text = run("test_assert_compares")
    lines = text.splitlines()
    assert lines[0] == f"AssertionError: assert 3 == 4 (at {program}:17)"
    assert lines[1] == "  where left = 3, right = 4"
    assert "Traceback (most recent call last):" in text
    assert f'File "{program}", line 17, in test_assert_compares' in text
    assert lines[-1] == "AssertionError: assert 3 == 4"
    assert "_program.py" not in text, "the SDK's frames are left out"


def test_values_are_not_computed_twice(program):
    text = run("test_assert_calls_once")
    assert text.splitlines()[0].startswith("AssertionError: assert 3 == 4 (at ")
    module = sys.modules["__main__"]
    assert module.calls == [(1, 2)], "add ran once, by the test itself"


def test_an_assert_message_comes_first_then_the_values(program):
    lines = run("test_assert_with_message").splitlines()
    assert lines[0] == f"AssertionError: two and two (at {program}:25)"
    assert lines[1] == "  assert 4 == 5"
    assert lines[2] == "  where left = 4, right = 5"


def test_unequal_lists_say_where_they_differ(program):
    lines = run("test_lists").splitlines()
    assert lines[0].startswith("AssertionError: assert [1, 2, 3] == [1, 2, 4, 5] (at ")
    assert "  at index 2: 3 != 4" in lines
    assert "  right has 2 more items: [4, 5]" in lines or "  right has 1 more item: [5]" in lines


def test_a_chain_shows_the_link_that_failed(program):
    lines = run("test_chain").splitlines()
    assert lines[0].startswith("AssertionError: assert 5 < 3 (at ")
    assert lines[1] == "  where left = 5, right = 3"


def test_assert_not_shows_the_value(program):
    assert run("test_truthy").splitlines()[0].startswith("AssertionError: assert not [1] (at ")


def test_an_assert_in_a_helper_points_at_the_helper(program):
    text = run("test_through_a_helper")
    lines = text.splitlines()
    assert lines[0] == f"AssertionError: assert 7 > 10 (at {program}:42)"
    assert "in test_through_a_helper" in text and "in helper_check" in text


def test_another_exception_shows_its_traceback(program):
    text = run("test_raises")
    lines = text.splitlines()
    assert lines[0] == f"KeyError: 'missing' (at {program}:50)"
    assert "where" not in text
    assert f'File "{program}", line 50, in test_raises' in text
    assert lines[-1] == "KeyError: 'missing'"


def test_an_async_test_fails_with_its_values_too(program):
    text = run("test_async_fails")
    assert text.splitlines()[0] == f"AssertionError: assert 2 == 3 (at {program}:55)"
    assert "asyncio" not in text.split("Traceback")[1].split("\n", 2)[1], "starts at the test's frame"


def test_a_test_that_wants_arguments_fails_saying_so(program):
    assert "test_wants_fixture takes arguments (tmp_path)" in run("test_wants_fixture")


def test_an_unknown_test_is_an_error(program):
    text = run("test_nope")
    assert "has no test function 'test_nope'" in text and "test_passes" in text


def test_a_failing_top_level_fails_the_test_and_says_when(tmp_path, monkeypatch):
    (tmp_path / "broken_top.py").write_text("def test_a():\n    pass\n\nvalue = {}['key']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("__main__", "__mp_main__"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name))
    display = str(tmp_path / "broken_top.py")
    _program.prepare("broken_top", display)
    assert _program.listed_tests() == ["test_a"]
    text = _program.run_test("test_a")
    assert text.splitlines()[0] == (
        f"the program's top level failed before the test ran: KeyError: 'key' (at {display}:4)"
    )


# -- the explanations on their own ---------------------------------------------------

def test_explain_compare_renders_the_failed_link():
    assert _testing.explain_compare(["=="], [3, 4]) == ["assert 3 == 4", "  where left = 3, right = 4"]
    assert _testing.explain_compare(["<", "<"], [1, 5, 3])[0] == "assert 5 < 3"
    lines = _testing.explain_compare(["=="], [{"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}])
    assert "  differing items: 'b': 2 != 3" in lines
    assert "  keys only in right: ['c']" in lines
    lines = _testing.explain_compare(["=="], ["one\ntwo\n", "one\nthree\n"])
    assert "  text differs (- left, + right):" in lines
    assert "    - two" in lines and "    + three" in lines


def test_long_values_are_shortened():
    line = _testing.explain_compare(["=="], [list(range(1000)), []])[0]
    assert len(line) < 1000 and " ... " in line

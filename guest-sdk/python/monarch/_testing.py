"""A program's tests, for ``monarch-host test`` (the WIT ``tests`` export).

Pure Python, so that pytest checks it on the host's CPython:

- ``collect``: the tests of a module namespace, as pytest finds them:
  its functions whose name starts with ``test`` (``test_add``, plain
  ``def`` or ``async def``), in the order the module defined them.
- ``prepare_tree``: the program's syntax tree as a test imports it: without
  its ``if __name__ == "__main__":`` blocks (as when pytest imports a
  module), and with each ``assert`` inside a function keeping the values it
  compares (see ``AssertRewriter``), so that a failure can show them
  without evaluating anything twice.
- ``failure_text``: why a test failed, as a pytest user reads it: the
  exception and the file and line where it happened, for a failed
  ``assert`` the values (``assert 3 == 4`` / ``where left = 3, right =
  4``), then the traceback.
- ``call_test``: runs one test function, an ``async def`` one through
  ``asyncio.run`` (the SDK's event loop in a component).
"""

import ast
import asyncio
import copy
import difflib
import inspect
import itertools
import linecache
import operator
import traceback

#: The prefix of the names given to the values an assert compares.
VALUE_PREFIX = "_monarch_assert_"

_MISSING = object()

_OPS = {
    ast.Eq: ("==", operator.eq),
    ast.NotEq: ("!=", operator.ne),
    ast.Lt: ("<", operator.lt),
    ast.LtE: ("<=", operator.le),
    ast.Gt: (">", operator.gt),
    ast.GtE: (">=", operator.ge),
    ast.Is: ("is", operator.is_),
    ast.IsNot: ("is not", operator.is_not),
    ast.In: ("in", lambda a, b: a in b),
    ast.NotIn: ("not in", lambda a, b: a not in b),
}
_OP_FUNCS = {symbol: func for symbol, func in _OPS.values()}


# ---------------------------------------------------------------------------
# Finding the tests.

def is_test(name, obj):
    """Whether pytest would collect ``obj``, bound to ``name`` in a module,
    as a test function."""
    return (
        isinstance(name, str)
        and name.startswith("test")
        and inspect.isfunction(obj)
        and getattr(obj, "__test__", True) is not False
    )


def collect(namespace):
    """The tests of a module's namespace (a dict), in the order it defined
    them (a dict keeps the order its names were first bound)."""
    return [name for name, obj in namespace.items() if is_test(name, obj)]


def signature_problem(fn):
    """Why ``fn`` cannot be called with no arguments (pytest would look for
    fixtures of those names), or None."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    needed = [
        p.name
        for p in sig.parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if not needed:
        return None
    return (
        f"{fn.__name__} takes arguments ({', '.join(needed)}): a test is called with none "
        "(pytest's fixtures are not supported; make them helper functions the test calls)"
    )


def call_test(fn):
    """Calls the test function ``fn``; an ``async def`` one (or one that
    returns an awaitable) runs to its end through ``asyncio.run``."""
    result = fn()
    if inspect.iscoroutine(result):
        asyncio.run(result)
    elif inspect.isawaitable(result):
        async def wait():
            return await result

        asyncio.run(wait())


# ---------------------------------------------------------------------------
# The module as a test imports it.

def is_main_guard(stmt):
    """``if __name__ == "__main__":`` (or ``!=``, either way round)."""
    if not isinstance(stmt, ast.If):
        return False
    test = stmt.test
    return (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Eq, ast.NotEq))
        and any(isinstance(n, ast.Name) and n.id == "__name__" for n in [test.left, *test.comparators])
    )


class AssertRecord:
    """One rewritten ``assert``: where it is, what its test is (``kind``:
    ``compare``, ``not`` or ``value``), the names its values are kept
    under in the frame, the comparison operators, and whether it has a
    message of its own."""

    def __init__(self, node, kind, names, ops, has_msg):
        self.lineno = node.lineno
        self.col = node.col_offset
        self.end_lineno = getattr(node, "end_lineno", None) or node.lineno
        self.end_col = getattr(node, "end_col_offset", None)
        self.kind = kind
        self.names = names
        self.ops = ops
        self.has_msg = has_msg

    def contains(self, lineno, col=None):
        if not self.lineno <= lineno <= self.end_lineno:
            return False
        if col is None:
            return True
        if lineno == self.lineno and col < self.col:
            return False
        if lineno == self.end_lineno and self.end_col is not None and col > self.end_col:
            return False
        return True

    def __repr__(self):
        return f"AssertRecord(line {self.lineno}, {self.kind}, {self.names}, {self.ops})"


def _named(name, value):
    target = ast.Name(id=name, ctx=ast.Store())
    node = ast.NamedExpr(target=target, value=value)
    ast.copy_location(target, value)
    ast.copy_location(node, value)
    return node


class AssertRewriter(ast.NodeTransformer):
    """Makes each ``assert`` in a function body keep the values its test
    computes, with assignment expressions: ``assert f(x) == y`` becomes
    ``assert (_monarch_assert_0_0 := f(x)) == (_monarch_assert_0_1 :=
    y)``. Each value is computed once, in the order and with the
    short-circuits of the original; a failure reads the names from the
    frame. Asserts outside functions (the module's or a class body's top
    level) are left as they are: there the names would be globals or
    class attributes."""

    def __init__(self):
        self.records = []
        self._in_function = [False]

    def _scoped(self, node, in_function):
        self._in_function.append(in_function)
        try:
            return self.generic_visit(node)
        finally:
            self._in_function.pop()

    def visit_FunctionDef(self, node):
        return self._scoped(node, True)

    def visit_AsyncFunctionDef(self, node):
        return self._scoped(node, True)

    def visit_ClassDef(self, node):
        return self._scoped(node, False)

    def visit_Lambda(self, node):
        return node

    def visit_Assert(self, node):
        if not self._in_function[-1]:
            return node
        index = len(self.records)
        test = node.test

        def name(i):
            return f"{VALUE_PREFIX}{index}_{i}"

        if isinstance(test, ast.Compare) and all(type(op) in _OPS for op in test.ops):
            operands = [test.left, *test.comparators]
            names = [name(i) for i in range(len(operands))]
            new_test = ast.Compare(
                left=_named(names[0], operands[0]),
                ops=test.ops,
                comparators=[_named(n, c) for n, c in zip(names[1:], operands[1:])],
            )
            record = AssertRecord(node, "compare", names, [_OPS[type(op)][0] for op in test.ops], node.msg is not None)
        elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            names = [name(0)]
            new_test = ast.UnaryOp(op=ast.Not(), operand=_named(names[0], test.operand))
            record = AssertRecord(node, "not", names, [], node.msg is not None)
        elif isinstance(test, ast.Constant):
            return node
        else:
            names = [name(0)]
            new_test = _named(names[0], test)
            record = AssertRecord(node, "value", names, [], node.msg is not None)
        ast.copy_location(new_test, test)
        self.records.append(record)
        node.test = new_test
        return node


def prepare_tree(tree):
    """The program's tree as a test imports it: a new tree without the
    top-level ``if __name__ == "__main__":`` blocks, its asserts
    rewritten; and the ``AssertRecord``s of the asserts."""
    module = ast.Module(body=[s for s in tree.body if not is_main_guard(s)], type_ignores=[])
    # The rewriter changes the tree in place: work on a copy of it.
    module = copy.deepcopy(module)
    rewriter = AssertRewriter()
    module = rewriter.visit(module)
    ast.fix_missing_locations(module)
    return module, rewriter.records


# ---------------------------------------------------------------------------
# Why a test failed.

def _short_repr(value, limit=400):
    try:
        text = repr(value)
    except Exception as e:  # noqa: BLE001 - a broken __repr__ is no reason to lose the report
        text = f"<{type(value).__name__} whose repr raised {type(e).__name__}>"
    if len(text) > limit:
        keep = (limit - 5) // 2
        text = f"{text[:keep]} ... {text[-keep:]}"
    return text


def _differences(left, right, limit=12):
    """Lines that say where two unequal values differ, for the common
    containers and for text; empty when there is nothing more to say."""
    lines = []
    if isinstance(left, str) and isinstance(right, str):
        if "\n" in left or "\n" in right or len(left) + len(right) > 80:
            diff = list(difflib.ndiff(left.splitlines(), right.splitlines()))
            lines.append("text differs (- left, + right):")
            lines.extend(f"  {line}" for line in diff[: limit * 2])
        return lines
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)) and type(left) is type(right):
        for i, (a, b) in enumerate(zip(left, right)):
            try:
                same = a == b
            except Exception:  # noqa: BLE001
                same = False
            if not same:
                lines.append(f"at index {i}: {_short_repr(a, 120)} != {_short_repr(b, 120)}")
                break
        if len(left) != len(right):
            longer, side = (left, "left") if len(left) > len(right) else (right, "right")
            extra = longer[min(len(left), len(right)):]
            lines.append(f"{side} has {len(extra)} more item{'s' if len(extra) != 1 else ''}: {_short_repr(extra, 200)}")
        return lines
    if isinstance(left, dict) and isinstance(right, dict):
        differing = []
        for key in left:
            if key in right:
                try:
                    same = left[key] == right[key]
                except Exception:  # noqa: BLE001
                    same = False
                if not same:
                    differing.append(f"{_short_repr(key, 60)}: {_short_repr(left[key], 80)} != {_short_repr(right[key], 80)}")
        if differing:
            lines.append("differing items: " + "; ".join(differing[:limit]))
        only_left = [k for k in left if k not in right]
        only_right = [k for k in right if k not in left]
        if only_left:
            lines.append("keys only in left: " + _short_repr(only_left, 200))
        if only_right:
            lines.append("keys only in right: " + _short_repr(only_right, 200))
        return lines
    if isinstance(left, (set, frozenset)) and isinstance(right, (set, frozenset)):
        if left - right:
            lines.append("only in left: " + _short_repr(sorted(left - right, key=repr), 200))
        if right - left:
            lines.append("only in right: " + _short_repr(sorted(right - left, key=repr), 200))
    return lines


def explain_compare(ops, values):
    """The lines that explain a failed comparison chain ``values[0] ops[0]
    values[1] ...`` whose operands evaluated to ``values`` (``_MISSING``
    for one never evaluated): the link that failed, its values, and where
    they differ. None when there is nothing to show."""
    failed = None
    for i, symbol in enumerate(ops):
        left, right = values[i], values[i + 1]
        if left is _MISSING or right is _MISSING:
            break
        try:
            holds = bool(_OP_FUNCS[symbol](left, right))
        except Exception:  # noqa: BLE001 - a comparison that raises did fail
            holds = False
        if not holds:
            failed = i
            break
    if failed is None:
        # Evaluated again, it held (a value changed since, or a name kept
        # a value from an earlier pass): show what is known.
        shown = []
        for i, value in enumerate(values):
            if value is _MISSING:
                break
            if i:
                shown.append(ops[i - 1])
            shown.append(_short_repr(value))
        if len(shown) < 3:
            return None
        return [f"assert {' '.join(shown)}"]
    left, right, symbol = values[failed], values[failed + 1], ops[failed]
    lines = [
        f"assert {_short_repr(left)} {symbol} {_short_repr(right)}",
        f"  where left = {_short_repr(left)}, right = {_short_repr(right)}",
    ]
    if symbol == "==":
        lines.extend(f"  {line}" for line in _differences(left, right))
    return lines


def _explain_record(record, frame_locals):
    values = [frame_locals.get(n, _MISSING) for n in record.names]
    if record.kind == "compare":
        return explain_compare(record.ops, values)
    if values[0] is _MISSING:
        return None
    if record.kind == "not":
        return [f"assert not {_short_repr(values[0])}"]
    return [f"assert {_short_repr(values[0])}"]


def _pure(node):
    """Whether evaluating ``node`` again calls nothing the program wrote:
    names, attributes, constants, subscripts by those, and literals of
    them."""
    if isinstance(node, (ast.Name, ast.Constant)):
        return True
    if isinstance(node, ast.Attribute):
        return _pure(node.value)
    if isinstance(node, ast.Subscript):
        return _pure(node.value) and _pure(node.slice)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_pure(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _pure(node.operand)
    return False


def _find_assert(filename, lineno, col):
    """The ``assert`` statement of ``filename``'s source (as ``linecache``
    has it) at the line (and column) where it raised, or None."""
    lines = linecache.getlines(filename)
    if not lines:
        return None
    try:
        tree = ast.parse("".join(lines), filename)
    except SyntaxError:
        return None
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and node.lineno <= lineno <= (node.end_lineno or node.lineno):
            if col is not None and lineno == node.lineno and col < node.col_offset:
                continue
            if found is None or node.lineno >= found.lineno:
                found = node
    return found


def _reevaluate(node, frame):
    """For an assert that kept no values (outside a function, or in a
    module not rewritten): its comparison's operands evaluated again in
    the frame, those that call nothing."""
    test = node.test
    if isinstance(test, ast.Compare) and all(type(op) in _OPS for op in test.ops):
        values = []
        for operand in [test.left, *test.comparators]:
            if not _pure(operand):
                values.append(_MISSING)
                continue
            try:
                code = compile(ast.Expression(body=operand), "<assert>", "eval")
                values.append(eval(code, frame.f_globals, dict(frame.f_locals)))
            except Exception:  # noqa: BLE001 - then it is not shown
                values.append(_MISSING)
        return explain_compare([_OPS[type(op)][0] for op in test.ops], values)
    return None


def _position(tb):
    """The line and column where ``tb``'s frame was when it raised."""
    lineno = tb.tb_lineno
    col = None
    positions = getattr(tb.tb_frame.f_code, "co_positions", None)
    if positions is not None and tb.tb_lasti >= 0:
        pos = next(itertools.islice(positions(), tb.tb_lasti // 2, None), None)
        if pos is not None and pos[0] is not None:
            lineno, col = pos[0], pos[2]
    return lineno, col


def _program_frames(tb, filename):
    """The traceback entries whose code is in ``filename``."""
    out = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            out.append(tb)
        tb = tb.tb_next
    return out


def _from_program(tb, filename):
    """``tb`` from its first entry in ``filename`` (the SDK's and asyncio's
    frames above the test left out); all of it when none is."""
    start = tb
    while start is not None and start.tb_frame.f_code.co_filename != filename:
        start = start.tb_next
    return start or tb


def failure_text(exc, filename, records=(), context=None):
    """Why a test failed with ``exc``, for its report. ``filename`` is the
    program's (as its code objects name it); ``records`` the
    ``AssertRecord``s of its rewritten asserts; ``context``, if given,
    says when it happened (the top level, before the test).

    The first line says it all (a CI server's JUnit message): ``TYPE:
    MESSAGE (at FILE:LINE)``, the line being the innermost one of the
    program. For a failed ``assert``, the values it compared follow; then
    the traceback from the program's first frame down."""
    tb = exc.__traceback__
    frames = _program_frames(tb, filename)
    where = None
    if frames:
        innermost = frames[-1]
        lineno, col = _position(innermost)
        where = f"{filename}:{lineno}"
    else:
        entries = traceback.extract_tb(tb)
        if entries:
            where = f"{entries[-1].filename}:{entries[-1].lineno}"

    explanation = None
    raised_by_assert = False
    if isinstance(exc, AssertionError) and frames and frames[-1] is _last(tb):
        innermost = frames[-1]
        lineno, col = _position(innermost)
        record = None
        for r in records:
            if r.contains(lineno, col) and all(
                n in innermost.tb_frame.f_code.co_varnames or n in innermost.tb_frame.f_code.co_cellvars
                for n in r.names
            ):
                if record is None or r.lineno >= record.lineno:
                    record = r
        if record is not None:
            raised_by_assert = True
            explanation = _explain_record(record, innermost.tb_frame.f_locals)
        else:
            node = _find_assert(filename, lineno, col)
            if node is not None:
                raised_by_assert = True
                explanation = _reevaluate(node, innermost.tb_frame)

    message = _first_line(exc)
    if raised_by_assert and not message and explanation:
        message = explanation[0]
        explanation = explanation[1:]
    head = type(exc).__name__ + (f": {message}" if message else "")
    if where:
        head += f" (at {where})"
    if context:
        head = f"{context}: {head}"
    lines = [head]
    if explanation:
        lines.extend(line if line.startswith("  ") else f"  {line}" for line in explanation)
    shown = _from_program(tb, filename)
    if raised_by_assert:
        body = "".join(traceback.format_tb(shown))
        last = type(exc).__name__ + (f": {message}" if message else "")
        trace = "Traceback (most recent call last):\n" + body + last + "\n"
    else:
        trace = "".join(traceback.format_exception(type(exc), exc, shown))
    return "\n".join(lines) + "\n\n" + trace.rstrip() + "\n"


def _last(tb):
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def _first_line(exc):
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001
        return ""
    return text.strip().splitlines()[0] if text.strip() else ""

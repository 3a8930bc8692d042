"""Errors made from the host's call-error records (monarch._errors)."""

import builtins

import pytest

from monarch._errors import (
    FAILURE_KINDS,
    ActorError,
    InvalidRequestError,
    MeshFailure,
    MeshTimeoutError,
    SupervisionError,
    actor_error_class,
    from_call_error,
    type_name_of,
)

REMOTE_TB = (
    "Traceback (most recent call last):\n"
    '  File "prog.py", line 7, in div\n'
    "    return a / b\n"
    "ZeroDivisionError: division by zero\n"
)


# -- each kind ----------------------------------------------------------------

def test_endpoint_kind_is_an_actor_error():
    err = from_call_error("endpoint", "division by zero", "ZeroDivisionError", REMOTE_TB, "calc", 3, "div")
    assert isinstance(err, ActorError)
    assert isinstance(err, ZeroDivisionError)
    assert isinstance(err, ArithmeticError)
    assert err.message == "division by zero"
    assert err.exception_type == "ZeroDivisionError"
    assert err.traceback == REMOTE_TB
    assert (err.mesh, err.rank, err.endpoint) == ("calc", 3, "div")
    assert err.args == ("division by zero",)


@pytest.mark.parametrize("kind", FAILURE_KINDS)
def test_failure_kinds_are_supervision_errors(kind):
    err = from_call_error(kind, "it went away", None, "wasm backtrace", "w", 1, "step")
    assert type(err) is SupervisionError
    assert not isinstance(err, ActorError)
    assert err.kind == kind
    assert err.message == "it went away"
    assert (err.mesh, err.rank, err.endpoint, err.backtrace) == ("w", 1, "step", "wasm backtrace")
    assert str(err) == f"actor w[1] failed ({kind}): it went away"


def test_failure_kinds_are_the_wit_ones():
    assert set(FAILURE_KINDS) == {"trap", "deadline", "out-of-memory", "proc-lost", "stopped", "supervision"}


def test_supervision_error_without_origin():
    err = from_call_error("stopped", "the mesh was stopped")
    assert str(err) == "actor failed (stopped): the mesh was stopped"


def test_timeout_kind():
    err = from_call_error("timeout", "no reply within 5s", mesh="w", rank=0)
    assert type(err) is MeshTimeoutError
    assert isinstance(err, TimeoutError)
    assert str(err) == "no reply within 5s"
    with pytest.raises(TimeoutError):
        raise err


def test_invalid_kind():
    err = from_call_error("invalid", "the mesh is empty")
    assert type(err) is InvalidRequestError
    assert isinstance(err, ValueError)
    assert str(err) == "the mesh is empty"


def test_an_unknown_kind_is_a_supervision_error():
    # A kind a newer host may add is still a failure the caller sees.
    err = from_call_error("meteor-strike", "gone", None, None, "w", 0)
    assert isinstance(err, SupervisionError) and err.kind == "meteor-strike"


# -- builtin types --------------------------------------------------------------

@pytest.mark.parametrize("name", ["ValueError", "KeyError", "IndexError", "TypeError", "RuntimeError",
                                  "ZeroDivisionError", "AttributeError", "FileNotFoundError", "OSError",
                                  "NotImplementedError", "AssertionError", "StopIteration", "MemoryError",
                                  "ImportError", "RecursionError", "TimeoutError"])
def test_builtin_type_raises_as_both(name):
    builtin = getattr(builtins, name)
    err = from_call_error("endpoint", "bad input", name, REMOTE_TB, "w", 0, "f")
    assert isinstance(err, ActorError) and isinstance(err, builtin)
    with pytest.raises(builtin):
        raise err
    try:
        raise err
    except ActorError as caught:
        assert caught is err
    assert err.message == "bad input" and err.exception_type == name
    assert "bad input" in str(err)


def test_except_value_error_catches_a_remote_value_error():
    def call():
        raise from_call_error("endpoint", "not a number: 'x'", "ValueError", REMOTE_TB)

    try:
        call()
    except ValueError as e:
        caught = e
    assert isinstance(caught, ActorError)
    assert caught.exception_type == "ValueError"


def test_the_class_is_shared_per_builtin():
    assert actor_error_class("ValueError") is actor_error_class("ValueError")
    assert type(from_call_error("endpoint", "a", "KeyError")) is type(from_call_error("endpoint", "b", "KeyError"))
    assert actor_error_class("ValueError") is not actor_error_class("KeyError")


@pytest.mark.parametrize("name", [None, "", "mymod.ParseError", "ParseError", "Exception",
                                  "print", "int", "KeyboardInterrupt", "SystemExit", "GeneratorExit",
                                  "BaseException", "std::io::Error"])
def test_non_builtin_stays_actor_error(name):
    err = from_call_error("endpoint", "it failed", name, None, "w", 0, "f")
    assert type(err) is ActorError
    assert err.exception_type == name
    with pytest.raises(ActorError):
        raise err
    # A remote SystemExit or KeyboardInterrupt does not end the caller.
    assert isinstance(err, Exception)


@pytest.mark.parametrize("name,base", [
    ("UnicodeDecodeError", UnicodeError),
    ("UnicodeEncodeError", UnicodeError),
    ("UnicodeTranslateError", UnicodeError),
])
def test_builtins_that_want_more_arguments(name, base):
    # These cannot be made from a message alone: the error is the nearest
    # base that can, so ``except ValueError`` still catches it.
    err = from_call_error("endpoint", "'utf-8' codec can't decode byte 0xff", name, REMOTE_TB)
    assert isinstance(err, ActorError) and isinstance(err, base) and isinstance(err, ValueError)
    assert err.exception_type == name
    assert "can't decode byte 0xff" in str(err)


def test_exception_group_stays_actor_error():
    err = from_call_error("endpoint", "2 sub-exceptions", "ExceptionGroup")
    assert type(err) is ActorError


def test_exception_property():
    err = from_call_error("endpoint", "bad", "ValueError")
    rebuilt = err.exception
    assert type(rebuilt) is ValueError and str(rebuilt) == "bad"
    plain = from_call_error("endpoint", "bad", "mymod.Bad")
    assert plain.exception is plain
    odd = from_call_error("endpoint", "bad", "UnicodeDecodeError")
    assert odd.exception is odd


# -- messages -------------------------------------------------------------------

def test_str_includes_where_type_message_and_remote_traceback():
    err = from_call_error("endpoint", "division by zero", "ZeroDivisionError", REMOTE_TB, "calc", 3, "div")
    text = str(err)
    assert text.startswith("A remote actor call failed in calc[3].div: ZeroDivisionError: division by zero")
    assert "\n\nRemote traceback:\n" in text
    assert 'File "prog.py", line 7, in div' in text
    assert text.endswith("ZeroDivisionError: division by zero")  # trailing newline trimmed


def test_str_without_origin_type_or_traceback():
    assert str(ActorError("boom")) == "A remote actor call failed: boom"
    assert str(ActorError("boom", "ValueError")) == "A remote actor call failed: ValueError: boom"
    assert str(ActorError("boom", mesh="m", rank=0)) == "A remote actor call failed in m[0]: boom"


def test_str_of_a_builtin_mix_is_the_actor_error_text():
    err = from_call_error("endpoint", "'k'", "KeyError", None, "m", 1, "get")
    # Not KeyError's repr-style text.
    assert str(err) == "A remote actor call failed in m[1].get: KeyError: 'k'"


def test_traceback_is_kept_when_raised_and_caught():
    err = from_call_error("endpoint", "bad", "ValueError", REMOTE_TB)
    try:
        raise err
    except ValueError as e:
        assert e.traceback == REMOTE_TB
        assert e.__traceback__ is not None


# -- MeshFailure ------------------------------------------------------------------

def test_mesh_failure_report():
    f = MeshFailure("workers", 2, "trap", "step", None, "wasm trap: unreachable", "0: foo\n1: bar\n")
    assert f.mesh_name == "workers" and f.rank == 2 and f.kind == "trap"
    assert f.endpoint == "step" and f.type_name is None
    assert f.report() == "actor workers[2] in endpoint step failed (trap): wasm trap: unreachable\n0: foo\n1: bar"
    assert str(f) == f.report()
    assert repr(f) == "MeshFailure(mesh='workers', rank=2, kind='trap', reason='wasm trap: unreachable')"


def test_mesh_failure_report_without_endpoint_or_backtrace():
    f = MeshFailure("w", 0, "proc-lost", None, None, "the proc exited", None)
    assert f.report() == "actor w[0] failed (proc-lost): the proc exited"
    f = MeshFailure("w", 0, "endpoint", "f", "ValueError", "bad", "")
    assert f.report() == "actor w[0] in endpoint f failed (endpoint): bad"
    assert f.type_name == "ValueError"


# -- naming local exceptions --------------------------------------------------------

class LocalError(Exception):
    pass


def test_type_name_of():
    assert type_name_of(ValueError("x")) == "ValueError"
    assert type_name_of(KeyError("x")) == "KeyError"
    assert type_name_of(LocalError()) == f"{__name__}.LocalError"


def test_type_name_round_trip():
    # What one Python actor names, another Python caller raises alike.
    for exc in (ValueError("v"), KeyError("k"), LocalError("l")):
        err = from_call_error("endpoint", str(exc), type_name_of(exc))
        assert isinstance(err, ActorError)
        assert isinstance(err, type(exc)) == (type(exc).__module__ == "builtins")


def test_subclass_name_is_readable():
    assert type(from_call_error("endpoint", "x", "ValueError")).__name__ == "ActorError[ValueError]"

"""Errors as Monarch names them, made from the host's ``call-error`` and
``supervision-failure`` records. Pure Python: the runtime passes plain
attribute holders, and pytest passes stand-ins."""

import builtins

#: Error kinds that mean the actor is gone, not that its endpoint raised.
FAILURE_KINDS = ("trap", "deadline", "out-of-memory", "proc-lost", "stopped", "supervision")


class ActorError(Exception):
    """An endpoint raised. ``exception_type`` names the remote exception's
    type, ``message`` is its text, ``traceback`` the remote traceback.

    When the remote type is a builtin exception (``ValueError``,
    ``KeyError``...), the error raised is also an instance of it, so
    ``except ValueError`` catches it as it would locally."""

    def __init__(self, message, exception_type=None, traceback=None, mesh=None, rank=None, endpoint=None):
        self.message = message
        self.exception_type = exception_type
        self.traceback = traceback
        self.mesh = mesh
        self.rank = rank
        self.endpoint = endpoint
        super().__init__(message)

    @property
    def exception(self):
        """The remote exception, rebuilt where its type is a builtin."""
        cls = _builtin_exception(self.exception_type)
        if cls is None:
            return self
        try:
            return cls(self.message)
        except Exception:  # noqa: BLE001 - a builtin whose constructor wants more
            return self

    def __str__(self):
        where = ""
        if self.mesh is not None:
            where = f" in {self.mesh}[{self.rank}]" + (f".{self.endpoint}" if self.endpoint else "")
        head = f"{self.exception_type}: {self.message}" if self.exception_type else self.message
        text = f"A remote actor call failed{where}: {head}"
        if self.traceback:
            text += "\n\nRemote traceback:\n" + self.traceback.rstrip()
        return text


class SupervisionError(Exception):
    """The actor (or its proc) failed: it trapped, ran past its handler
    deadline, ran out of memory, its proc was lost, it was stopped, or a
    failure below it went unhandled. ``kind`` says which."""

    def __init__(self, message, kind=None, mesh=None, rank=None, endpoint=None, backtrace=None):
        self.message = message
        self.kind = kind
        self.mesh = mesh
        self.rank = rank
        self.endpoint = endpoint
        self.backtrace = backtrace
        super().__init__(message)

    def __str__(self):
        where = f" {self.mesh}[{self.rank}]" if self.mesh is not None else ""
        return f"actor{where} failed ({self.kind}): {self.message}"


class MeshTimeoutError(TimeoutError):
    """No reply within the call timeout."""


class InvalidRequestError(ValueError):
    """The host refused the request before sending it (a size mismatch, an
    empty mesh, a payload over the limits)."""


class MeshFailure:
    """An actor of a mesh this program (or actor) owns failed: what
    ``__supervise__`` and ``unhandled_fault_hook`` receive."""

    def __init__(self, mesh, rank, kind, endpoint, type_name, reason, backtrace):
        self.mesh_name = mesh
        self.rank = rank
        self.kind = kind
        self.endpoint = endpoint
        self.type_name = type_name
        self.reason = reason
        self.backtrace = backtrace

    def report(self):
        where = f"{self.mesh_name}[{self.rank}]" + (f" in endpoint {self.endpoint}" if self.endpoint else "")
        text = f"actor {where} failed ({self.kind}): {self.reason}"
        if self.backtrace:
            text += "\n" + self.backtrace.rstrip()
        return text

    def __str__(self):
        return self.report()

    def __repr__(self):
        return f"MeshFailure(mesh={self.mesh_name!r}, rank={self.rank}, kind={self.kind!r}, reason={self.reason!r})"


_actor_error_types = {}


def _builtin_exception(name):
    if not name or "." in name:
        return None
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and cls is not Exception:
        return cls
    return None


def actor_error_class(type_name):
    """``ActorError``, or a subclass that is also the builtin exception
    ``type_name`` names."""
    base = _builtin_exception(type_name)
    if base is None:
        return ActorError
    cls = _actor_error_types.get(base)
    if cls is None:
        # The builtin, or else the nearest of its bases that can be mixed in
        # and made from a message alone: UnicodeDecodeError wants five
        # arguments, so its errors are UnicodeErrors; ExceptionGroup wants
        # a list of exceptions, so its errors are plain ActorErrors.
        cls = ActorError
        for candidate in base.__mro__:
            if candidate is Exception:
                break
            try:
                mixed = type(f"ActorError[{candidate.__name__}]", (ActorError, candidate), {})
                _new_actor_error(mixed, "probe")
            except Exception:  # noqa: BLE001 - a layout or constructor that cannot be mixed in
                continue
            cls = mixed
            break
        _actor_error_types[base] = cls
    return cls


def _new_actor_error(cls, message, exception_type=None, traceback=None, mesh=None, rank=None, endpoint=None):
    # ``cls.__new__(cls)`` rather than ``cls(...)``: OSError's constructor
    # reads two or more arguments as an errno and a text.
    try:
        err = cls.__new__(cls)
    except TypeError:  # MemoryError's __new__ is only reached through the class
        err = cls(message)
    ActorError.__init__(err, message, exception_type, traceback, mesh, rank, endpoint)
    return err


def from_call_error(kind, message, type_name=None, backtrace=None, mesh=None, rank=None, endpoint=None):
    """The exception to raise for a failed request."""
    if kind == "endpoint":
        return _new_actor_error(actor_error_class(type_name), message, type_name, backtrace, mesh, rank, endpoint)
    if kind == "timeout":
        return MeshTimeoutError(message)
    if kind == "invalid":
        return InvalidRequestError(message)
    return SupervisionError(message, kind, mesh, rank, endpoint, backtrace)


def type_name_of(exc):
    """How an exception's type is named to other languages: the bare name
    for builtins, ``module.Qualname`` otherwise."""
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"

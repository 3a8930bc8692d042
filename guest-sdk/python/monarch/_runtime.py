"""The runtime: meshes, calls, futures and the exports of the WIT world
``program``, over the bindings that componentize-py generates
(``wit_world``). Only code running inside a component imports this module;
the pure parts live in ``_codec``, ``_shape``, ``_errors`` and ``_loop``.
"""

import asyncio
import contextvars
import inspect
import math
import sys
import traceback

from componentize_py_types import Err
from wit_world.imports import mesh as _wmesh
from wit_world.imports import types as _wt

from . import _codec, _debug, _program
from ._errors import MeshFailure, SupervisionError, from_call_error, type_name_of
from ._loop import HostLoop, HostLoopPolicy
from ._shape import Extent, Point, ValueMesh, selectors

# ---------------------------------------------------------------------------
# Requests in flight and the event loop over them.

#: request id -> callback(event kind)
_pending = {}
#: Set while the controller's main runs; failures then go to the hook.
_failures = []
#: ``monarch._session`` in a console session's component (it sets this when
#: the component is built): it ships the classes defined in the session to
#: their actors, and reads Ctrl-C. None in a program.
_session = None


def _kind_name(kind):
    return kind.name.lower().replace("_", "-")


def _dispatch(event):
    kind = event.kind
    if isinstance(kind, _wt.EventKind_Failure):
        f = kind.value
        failure = MeshFailure(f.mesh, f.rank, _kind_name(f.kind), f.endpoint, f.type_name, f.reason, f.backtrace)
        _on_unhandled_failure(failure)
        return
    callback = _pending.get(event.id)
    if callback is None:
        return
    if not isinstance(kind, _wt.EventKind_Item):
        del _pending[event.id]
    callback(kind)


def _on_unhandled_failure(failure):
    # Looked up at each failure, so that a program may replace
    # ``monarch.actor.unhandled_fault_hook``.
    from . import actor as _public

    _public.unhandled_fault_hook(failure)


class _HostSource:
    """What the loop waits on: the host's event mailbox."""

    def pending(self):
        return bool(_pending)

    def wait(self, timeout):
        _program.check_not_building("waiting for the cluster")
        if timeout is None:
            ms = 60_000
        else:
            ms = math.ceil(timeout * 1000)
        for event in _wmesh.next_events(256, ms):
            _dispatch(event)
        if _session is not None:
            # A session's input stops on Ctrl-C: the host's wait returns
            # early, and this is a safe point to raise (events dispatched).
            _session.check_interrupt()


_LOOP = HostLoop(_HostSource())
_LOOP.close = lambda: None  # shared by every asyncio.run of the program
asyncio.set_event_loop_policy(HostLoopPolicy(lambda: _LOOP))


def _loop():
    return _LOOP


# ---------------------------------------------------------------------------
# Encoding with references.

def _to_tag(value):
    if isinstance(value, ActorMesh):
        return _codec.TAG_ACTOR_MESH, value._handle.to_ref()
    ref = getattr(value, "_monarch_ref", None)
    if ref is not None:
        return ref()
    return None


def _from_tag(tag, content):
    if tag == _codec.TAG_ACTOR_MESH and isinstance(content, bytes):
        return ActorMesh._from_ref(content)
    if tag == _codec.TAG_RDMA_BUFFER and isinstance(content, bytes):
        from .rdma import RDMABuffer

        return RDMABuffer._from_ref(content)
    return NotImplemented


_ENCODER = _codec.Encoder(_to_tag)
_DECODER = _codec.Decoder(_from_tag)


def _encode_args(args, kwargs):
    return _codec.encode_args(_ENCODER, args, kwargs)


def _decode(data):
    return _DECODER.decode(data)


# ---------------------------------------------------------------------------
# Futures.

class Future:
    """A result that will come: ``fut.get()`` waits for it (outside async
    code), ``await fut`` inside it. As Monarch's ``Future``."""

    def __init__(self, *, coro=None, fut=None, value=None, done=False):
        self._coro = coro
        self._fut = fut
        self._value = value
        self._done = done

    def _task(self):
        if self._fut is None:
            self._fut = _LOOP.create_task(self._coro)
            self._coro = None
        return self._fut

    def get(self, timeout=None):
        """Waits for the result and returns it, or raises its error.
        ``timeout`` (seconds) raises ``TimeoutError`` past it."""
        if self._done:
            return self._value
        if _LOOP.is_running():
            raise RuntimeError(
                "Future.get() blocks, and this code runs inside the event loop (an async "
                "function): use `await fut` instead"
            )
        target = self._task() if timeout is None else asyncio.wait_for(asyncio.shield(self._task()), timeout)
        return _LOOP.run_until_complete(target)

    def result(self, timeout=None):
        return self.get(timeout)

    def exception(self, timeout=None):
        try:
            self.get(timeout)
        except Exception as e:  # noqa: BLE001
            return e
        return None

    def __await__(self):
        if self._done:
            return self._value
            yield  # noqa: unreachable - makes this a generator
        return (yield from self._task().__await__())

    def __repr__(self):
        return "Future(done)" if self._done else "Future(pending)"


def _request(start, finish):
    """Starts a request (``start()`` returns its id) and a future that
    ``finish(result)`` turns into a value or an exception."""
    fut = _LOOP.create_future()
    rid = start()

    def on_event(kind):
        if fut.done():
            return
        try:
            fut.set_result(finish(kind.value))
        except BaseException as e:  # noqa: BLE001 - the caller gets it
            fut.set_exception(e)

    _pending[rid] = on_event
    return Future(fut=fut)


def _raise_call_error(e):
    origin = e.origin
    raise from_call_error(
        _kind_name(e.kind),
        e.message,
        e.type_name,
        e.backtrace,
        origin.mesh if origin else None,
        origin.rank if origin else None,
        origin.endpoint if origin else None,
    )


def _unwrap(result):
    if isinstance(result, Err):
        _raise_call_error(result.value)
    return result.value


def _done(result):
    """The end of a request whose reply is only "done" (or an error)."""
    _unwrap(result)


# ---------------------------------------------------------------------------
# Meshes.

def _extent_of(dims):
    return Extent([d.name for d in dims], [d.size for d in dims])


def _wit_extent(dims):
    return [_wt.Dim(str(k), int(v)) for k, v in dims.items()]


def _wit_slice(extent, dims):
    out = []
    for label, sel in selectors(extent, dims):
        if sel[0] == "index":
            out.append(_wt.SliceDim(label, _wt.Selector_Index(sel[1])))
        else:
            out.append(_wt.SliceDim(label, _wt.Selector_Range((sel[1], sel[2], sel[3]))))
    return out


def class_key(cls):
    """How an actor class is named to the host: ``module:Qualname``."""
    module = cls.__module__
    if module == "__mp_main__":
        module = "__main__"
    line = getattr(cls, "__firstlineno__", None)
    return f"{module}:{cls.__qualname__}" + (f":{line}" if line else "")


_REDUCERS = {
    "sum": _wt.Reducer.SUM_I64,
    "min": _wt.Reducer.MIN_I64,
    "max": _wt.Reducer.MAX_I64,
    "sum_f64": _wt.Reducer.SUM_F64,
    "min_f64": _wt.Reducer.MIN_F64,
    "max_f64": _wt.Reducer.MAX_F64,
    "sum-i64": _wt.Reducer.SUM_I64,
    "min-i64": _wt.Reducer.MIN_I64,
    "max-i64": _wt.Reducer.MAX_I64,
    "sum-f64": _wt.Reducer.SUM_F64,
    "min-f64": _wt.Reducer.MIN_F64,
    "max-f64": _wt.Reducer.MAX_F64,
    "concat": _wt.Reducer.CONCAT,
}


def _class_of(Class):
    """The host's name for an actor class, and the class where it is this
    program's (None for a library's, named ``"NAME/Class"``)."""
    if isinstance(Class, str):
        if "/" not in Class:
            raise TypeError(
                f"spawn takes an Actor subclass, or an actor library's class as 'NAME/Class', not {Class!r}"
            )
        return Class, None
    if not (isinstance(Class, type) and issubclass(Class, Actor)):
        raise TypeError(f"spawn takes an Actor subclass, not {Class!r}")
    return class_key(Class), Class


class ProcMesh:
    """Procs in named dimensions. ``spawn`` puts one actor on each."""

    def __init__(self, handle, extent):
        self._handle = handle
        self._extent = extent

    @property
    def extent(self):
        return self._extent

    def size(self, dim=None):
        return self._extent.nelements if dim is None else self._extent[dim]

    def slice(self, **dims):
        handle = self._handle.slice(_wit_slice(self._extent, dims))
        return ProcMesh(handle, _extent_of(handle.extent()))

    def spawn(self, name, Class, *args, **kwargs):
        """Spawns ``Class(*args, **kwargs)`` on every proc of this mesh; the
        actor mesh is called ``name``. ``Class`` may also be the name of a
        class of an actor library, ``"NAME/Class"`` (``monarch-host run
        --actors NAME=PATH``), in any language. ``persist=True`` makes it
        a persistent actor mesh, the server's (see ``spawn_with``)."""
        persist = kwargs.pop("persist", False)
        return self.spawn_with(name, Class, args, kwargs, persist=persist)

    def respawn(self, name, Class, *args, **kwargs):
        """``spawn(..., persist=True)`` that replaces the persistent actor
        mesh ``name`` if there is one: it is stopped first, and its actors'
        state is lost (the host logs so)."""
        kwargs.pop("persist", None)
        return self.spawn_with(name, Class, args, kwargs, persist=True, replace=True)

    def spawn_with(
        self,
        name,
        Class,
        args=(),
        kwargs=None,
        per_proc=None,
        handler_timeout=None,
        persist=False,
        replace=False,
    ):
        """``spawn`` with monarch-host's options: ``per_proc`` puts several
        actors on each proc (``{"actors": 8}``: the actor mesh's extent is
        the proc mesh's followed by these dimensions); ``handler_timeout``
        (seconds) bounds each handler, past which the actor fails with
        kind ``deadline``.

        ``persist=True`` spawns a persistent actor mesh: it belongs to the
        server (``monarch-host serve``), not to this job or session, which
        it outlives; later ones find it with ``lookup_actor_mesh(name)``,
        and ``DELETE /v1/meshes/NAME`` stops it. Its failures are the
        server's: logged and shown by ``GET /v1/meshes``, failing no job.
        Its procs must outlive the job too (a job on a persistent mesh,
        ``submit --mesh NAME``). A name in use fails, naming ``respawn``;
        ``replace=True`` (``respawn``) replaces that mesh, losing its
        actors' state."""
        key, cls = _class_of(Class)
        init = _encode_args(args, kwargs or {})
        if _session is not None and cls is not None:
            key, init = _session.ship_class(cls, key, init)
        options = _wt.SpawnOptions(
            _wit_extent(per_proc or {}),
            None if handler_timeout is None else max(1, round(handler_timeout * 1000)),
        )
        try:
            if persist or replace:
                handle = self._handle.spawn_persistent(name, key, init, options, bool(replace))
            else:
                handle = self._handle.spawn_with(name, key, init, options)
        except Err as e:
            verb = "respawning" if replace else "spawning"
            raise RuntimeError(f"{verb} {name!r}: {e.value}") from None
        return ActorMesh(handle, cls, _extent_of(handle.extent()), name)

    def info(self):
        """Where each proc runs: dicts of rank, id, host, pid and state."""
        out = []
        for p in self._handle.info():
            state = p.state
            if isinstance(state, _wt.ProcState_Failed):
                state = f"failed: {state.value}"
            else:
                state = type(state).__name__.split("_")[-1].lower()
            out.append({"rank": p.rank, "id": p.id, "host": p.host, "pid": p.pid, "state": state})
        return out

    def kill(self, rank, signal=9):
        """Signals the process of the proc at ``rank`` (to test fault handling)."""
        try:
            self._handle.kill(rank, signal)
        except Err as e:
            raise RuntimeError(e.value) from None

    def stop(self):
        self._handle.stop()
        return Future(done=True)

    def __repr__(self):
        return f"ProcMesh({dict(self._extent)})"


def lookup_actor_mesh(name, Class=None):
    """The persistent actor mesh ``name`` (``spawn(..., persist=True)``),
    spawned by an earlier job or session of this server. ``Class``, if
    given, lets the mesh check endpoint names as a spawned mesh does.
    Raises ``RuntimeError`` when there is none of that name, or no server
    (``monarch-host run``)."""
    _program.check_not_building("lookup_actor_mesh")
    cls = None if Class is None else _class_of(Class)[1]
    try:
        handle = _wmesh.lookup_actor_mesh(name)
    except Err as e:
        raise RuntimeError(f"looking up {name!r}: {e.value}") from None
    return ActorMesh(handle, cls, _extent_of(handle.extent()), name)


class HostMesh:
    """Hosts; ``this_host()`` is the one the program runs on."""

    def __init__(self, extent=None):
        self._extent = extent or Extent([], [])

    @property
    def extent(self):
        return self._extent

    def spawn_procs(self, per_host=None, bootstrap=None, name=None):
        """Procs on every host, shaped ``per_host`` (``{"gpus": 8}``)."""
        _program.check_not_building("spawn_procs")
        dims = dict(self._extent)
        dims.update(per_host or {})
        if not dims:
            dims = {"procs": 1}
        try:
            handle = _wmesh.spawn_procs(_wit_extent(dims))
        except Err as e:
            raise RuntimeError(f"spawning procs {dims}: {e.value}") from None
        return ProcMesh(handle, _extent_of(handle.extent()))

    def __repr__(self):
        return f"HostMesh({dict(self._extent)})"


class ActorMesh:
    """Actors in named dimensions. ``mesh.endpoint.call(...)`` and the other
    adverbs send to them; ``mesh.slice(gpus=0)`` picks some."""

    def __init__(self, handle, cls, extent, name):
        self._handle = handle
        self._class = cls
        self._extent = extent
        self._name = name

    @classmethod
    def _from_ref(cls, ref):
        _program.check_not_building("an actor mesh reference")
        try:
            handle = _wmesh.ActorMesh.from_ref(ref)
        except Err as e:
            raise ValueError(f"not an actor mesh reference: {e.value}") from None
        return cls(handle, None, _extent_of(handle.extent()), handle.name())

    @property
    def extent(self):
        return self._extent

    def size(self, dim=None):
        return self._extent.nelements if dim is None else self._extent[dim]

    def __len__(self):
        return self._extent.nelements

    def slice(self, **dims):
        handle = self._handle.slice(_wit_slice(self._extent, dims))
        return ActorMesh(handle, self._class, _extent_of(handle.extent()), self._name)

    def stop(self):
        self._handle.stop()
        return Future(done=True)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = self.__dict__.get("_class")
        if cls is not None and not _is_endpoint(getattr(cls, name, None)):
            raise AttributeError(f"{cls.__qualname__} has no endpoint {name!r}")
        return Endpoint(self, name)

    def __reduce__(self):
        return (ActorMesh._from_ref, (self._handle.to_ref(),))

    def __repr__(self):
        return f"ActorMesh({self._name!r}, {dict(self._extent)})"


class _Stream:
    """``endpoint.stream()``: futures of the replies in arrival order
    (``for fut in stream: fut.get()``), or the values with ``async for``."""

    def __init__(self, start):
        self._queue = []
        self._waiter = None
        self._ended = False
        self._error = None
        self._rid = start()
        _pending[self._rid] = self._on_event

    def _on_event(self, kind):
        if isinstance(kind, _wt.EventKind_Item):
            self._queue.append(kind.value[1])
        elif isinstance(kind, _wt.EventKind_End):
            self._ended = True
        else:  # done(err): the stream could not start
            self._ended = True
            if isinstance(kind.value, Err):
                self._error = kind.value.value
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _next(self):
        while not self._queue:
            if self._ended:
                if self._error is not None:
                    error, self._error = self._error, None
                    _raise_call_error(error)
                raise StopAsyncIteration
            self._waiter = _LOOP.create_future()
            await self._waiter
        return _decode(_unwrap(self._queue.pop(0)))

    def __iter__(self):
        while True:
            fut = Future(coro=self._next())
            try:
                value = fut.get()
            except StopAsyncIteration:
                return
            except Exception as e:  # noqa: BLE001 - handed to the caller's get()
                yield _Failed(e)
                continue
            yield Future(value=value, done=True)

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self._next()


class _Failed(Future):
    def __init__(self, error):
        super().__init__(done=True)
        self._error = error

    def get(self, timeout=None):
        raise self._error

    def __await__(self):
        raise self._error
        yield  # noqa


class Endpoint:
    """One endpoint of an actor mesh, with Monarch's adverbs."""

    def __init__(self, mesh, name):
        self._mesh = mesh
        self._name = name

    def _split_reduce(self, kwargs):
        op = kwargs.get("reduce")
        cls = self._mesh._class
        if isinstance(op, str) and op in _REDUCERS:
            fn = getattr(cls, self._name, None) if cls is not None else None
            if fn is None or "reduce" not in inspect.signature(fn).parameters:
                kwargs = dict(kwargs)
                del kwargs["reduce"]
                return op, kwargs
        return None, kwargs

    def call(self, *args, **kwargs):
        """Every actor of the mesh; a ``ValueMesh`` of the replies in rank
        order. ``reduce="sum"`` (``min``, ``max``, ``sum_f64``...) reduces
        the replies in the host instead."""
        op, kwargs = self._split_reduce(kwargs)
        if op is not None:
            return self.reduce(op, *args, **kwargs)
        payload = _encode_args(args, kwargs)
        mesh = self._mesh

        def finish(result):
            reply = _unwrap(result)
            gathered = reply.value
            return ValueMesh(_extent_of(gathered.extent), [_decode(v) for v in gathered.values])

        return _request(lambda: mesh._handle.call(self._name, payload, None), finish)

    def reduce(self, op, *args, **kwargs):
        """Every actor, the replies combined in the host: ``op`` is ``sum``,
        ``min`` or ``max`` (integers), ``sum_f64``, ``min_f64``,
        ``max_f64`` (floats) or ``concat`` (a list, in rank order)."""
        try:
            reducer = _REDUCERS[op]
        except KeyError:
            raise ValueError(f"unknown reducer {op!r}; use one of {sorted(set(_REDUCERS))}") from None
        payload = _encode_args(args, kwargs)
        mesh = self._mesh

        def finish(result):
            data = _unwrap(result).value
            if reducer == _wt.Reducer.CONCAT:
                return _DECODER.decode_sequence(data)
            return _decode(data)

        return _request(lambda: mesh._handle.call(self._name, payload, reducer), finish)

    def call_one(self, *args, **kwargs):
        """The one actor of a mesh of one; an error for any other size."""
        if len(self._mesh) != 1:
            raise ValueError(
                f"call_one needs a mesh of one actor, and this one is {dict(self._mesh.extent)}; "
                "slice it or use call"
            )
        payload = _encode_args(args, kwargs)
        mesh = self._mesh
        return _request(lambda: mesh._handle.call_one(self._name, payload),
                        lambda result: _decode(_unwrap(result).value))

    def choose(self, *args, **kwargs):
        """One actor of the mesh, the least busy."""
        payload = _encode_args(args, kwargs)
        mesh = self._mesh
        return _request(lambda: mesh._handle.choose(self._name, payload),
                        lambda result: _decode(_unwrap(result).value))

    def stream(self, *args, **kwargs):
        """Every actor; the replies as they come (futures, or values with
        ``async for``)."""
        payload = _encode_args(args, kwargs)
        mesh = self._mesh
        return _Stream(lambda: mesh._handle.stream(self._name, payload))

    def broadcast(self, *args, **kwargs):
        """Every actor, without waiting. An actor that fails handling it is
        reported to the mesh's owner (``__supervise__``, else
        ``unhandled_fault_hook``)."""
        payload = _encode_args(args, kwargs)
        try:
            self._mesh._handle.broadcast(self._name, payload)
        except Err as e:
            _raise_call_error(e.value)

    def __repr__(self):
        return f"Endpoint({self._mesh._name}.{self._name})"


# ---------------------------------------------------------------------------
# Actors.

#: Every Actor subclass defined, by class key: a script may define two
#: classes of one name (Monarch's getting-started guide does), and each
#: spawn must make the one it names.
_classes = {}


class Actor:
    """Base class of actors. Methods marked ``@endpoint`` can be called on
    a mesh of them; ``__supervise__(self, failure)`` handles failures of
    meshes the actor owns (return true when handled)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _classes[class_key(cls)] = cls


def _is_endpoint(fn):
    return getattr(fn, "_monarch_endpoint", False)


def endpoint(fn=None, **options):
    """Marks an actor method as an endpoint (``@endpoint`` or
    ``@endpoint(...)``; Monarch's options are accepted)."""

    def mark(f):
        f._monarch_endpoint = True
        f._monarch_endpoint_options = options
        return f

    return mark(fn) if fn is not None else mark


class ActorInstance:
    """``context().actor_instance``: who is running."""

    def __init__(self, rank, proc_getter, name=None):
        self.rank = rank
        self._proc_getter = proc_getter
        self.name = name

    @property
    def proc(self):
        return self._proc_getter()

    @property
    def actor_id(self):
        return f"{self.name or 'controller'}[{self.rank.rank}]"

    def __repr__(self):
        return f"ActorInstance({self.actor_id})"


class Context:
    """``context()``: the running actor and the rank the current message
    was sent to."""

    def __init__(self, actor_instance, message_rank):
        self.actor_instance = actor_instance
        self.message_rank = message_rank


_this_proc = None


def this_proc():
    """The proc this code runs on. In the controller (which has no proc of
    its own in monarch-host), a proc spawned for it on first use."""
    global _this_proc
    if _this_proc is None:
        _this_proc = HostMesh().spawn_procs({"procs": 1})
    return _this_proc


def this_host():
    """The host this code runs on."""
    return HostMesh()


_CONTROLLER = Context(ActorInstance(Point(0, Extent([], [])), this_proc, None), Point(0, Extent([], [])))
_context = contextvars.ContextVar("monarch.context", default=_CONTROLLER)


def context():
    return _context.get()


def current_rank():
    return context().actor_instance.rank


def current_size():
    return dict(context().actor_instance.rank.extent)


# The actor of this instance (an actor instance holds exactly one).
_actor = None


def _resolve_class(key):
    cls = _classes.get(key)
    if cls is not None:
        return cls
    # Another language names a class of the program by its bare name.
    module_name, _, qualname = key.partition(":") if ":" in key else ("__main__", ":", key)
    qualname = qualname.split(":")[0]
    if module_name == "__main__":
        module = _program.actor_module()
    else:
        module = sys.modules.get(module_name)
    if module is None:
        raise LookupError(f"module {module_name!r} of actor class {qualname!r} was not imported when the program was built")
    obj = module
    for part in qualname.split("."):
        if part == "<locals>":
            raise LookupError(
                f"actor class {qualname!r} is defined inside a function; define it at the top level of its module"
            )
        obj = getattr(obj, part, None)
        if obj is None:
            raise LookupError(
                f"no actor class {qualname!r} in {module_name}: define it at the top level, outside "
                "`if __name__ == '__main__':`"
            )
    return obj


def export_create(class_key_, init, rank, extent):
    global _actor
    try:
        if _session is not None:
            class_key_, init = _session.rebuild_class(class_key_, init)
        cls = _resolve_class(class_key_)
        args, kwargs = _codec.decode_args(_DECODER, init)
        ext = _extent_of(extent)
        point = Point(rank, ext)
        _context.set(Context(ActorInstance(point, this_proc, cls.__qualname__), point))
        obj = cls.__new__(cls)
        obj.__init__(*args, **kwargs)
        _actor = obj
    except BaseException as e:  # noqa: BLE001 - becomes the spawn's error
        raise Err(_describe(e)) from None
    finally:
        _flush()


def export_handle(endpoint_name, message):
    try:
        actor = _actor
        fn = getattr(type(actor), endpoint_name, None)
        if not _is_endpoint(fn):
            raise AttributeError(f"{type(actor).__qualname__} has no endpoint {endpoint_name!r}")
        args, kwargs = _codec.decode_args(_DECODER, message)
        result = fn(actor, *args, **kwargs)
        if inspect.isawaitable(result):
            result = _LOOP.run_until_complete(result)
        return _ENCODER.encode(result)
    except BaseException as e:  # noqa: BLE001 - the caller gets it
        raise Err(
            _wt.EndpointError(
                message=str(e) or type(e).__name__,
                type_name=type_name_of(e),
                # From the endpoint's frame down; this one is the SDK's.
                backtrace="".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next)),
            )
        ) from None
    finally:
        _debug.end()
        _flush()


def export_supervise(failure):
    try:
        handler = getattr(_actor, "__supervise__", None)
        if handler is None:
            return False
        f = failure
        event = MeshFailure(f.mesh, f.rank, _kind_name(f.kind), f.endpoint, f.type_name, f.reason, f.backtrace)
        result = handler(event)
        if inspect.isawaitable(result):
            result = _LOOP.run_until_complete(result)
        return bool(result)
    except BaseException:  # noqa: BLE001 - a supervisor that raises did not handle it
        traceback.print_exc()
        return False
    finally:
        _flush()


def _describe(e):
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return text.rstrip()


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


__all__ = [
    "Actor",
    "ActorMesh",
    "Context",
    "Endpoint",
    "Future",
    "HostMesh",
    "ProcMesh",
    "SupervisionError",
    "context",
    "current_rank",
    "current_size",
    "endpoint",
    "this_host",
    "this_proc",
]

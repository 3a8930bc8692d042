"""The entry module of the built-in Python session (``monarch-host
console``; ``build.rs``'s ``python_session`` hands it to componentize-py
with the world ``session-program``): a REPL over the ``monarch`` package
(``monarch/_session.py``), whose actors run in instances of the same
component. There is no user script: what the session defines, it ships
to its actors with each spawn."""

import traceback

import wit_world
from componentize_py_types import Err
from wit_world import exports

from monarch import _preload  # noqa: F401 - the standard library an input may import
from monarch import _program, _runtime, _session  # noqa: F401
import monarch.actor  # noqa: F401 - the public API, imported into the session's namespace
import monarch.faults  # noqa: F401 - faults made on purpose (`from monarch import faults`)
import monarch.rdma  # noqa: F401 - read back when a buffer reference arrives
import monarch.tensor  # noqa: F401 - imported by inputs that use tensors

_session.install(__file__)


def _sdk_error(e):
    # An exception out of an export traps the instance: the session's own
    # errors are returned as errors instead.
    return "monarch session: " + "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()


class WitWorld(wit_world.WitWorld):
    def init(self, args):
        try:
            error = _session.init(args)
        except BaseException as e:  # noqa: BLE001
            error = _sdk_error(e)
        if error is not None:
            raise Err(error)

    def on_input(self, line):
        try:
            ok, text = _session.on_input(line)
        except BaseException as e:  # noqa: BLE001
            ok, text = False, _sdk_error(e)
        if not ok:
            raise Err(text)
        return text

    def prompt(self):
        try:
            return _session.prompt()
        except BaseException:  # noqa: BLE001
            return ">>> "

    def run(self, args):
        try:
            error = _session.run_lines(args)
        except BaseException as e:  # noqa: BLE001
            error = _sdk_error(e)
        if error is not None:
            raise Err(error)


class ActorClass(exports.ActorClass):
    def create(self, class_, init, rank, extent):
        _runtime.export_create(class_, init, rank, extent)

    def handle(self, endpoint, message):
        return _runtime.export_handle(endpoint, message)

    def supervise(self, failure):
        return _runtime.export_supervise(failure)

"""The component's entry module (what `monarch-host build` hands to
componentize-py): the exports of the WIT world ``test`` (``program`` and
its tests), over the ``monarch`` package and the user's script named in
``_monarch_build``."""

import sys

import wit_world
from componentize_py_types import Err
from wit_world import exports

from monarch import _preload  # noqa: F401 - the standard library a program may import at run time
from monarch import _program, _runtime
import monarch.actor  # noqa: F401 - the public API, imported by most programs
import monarch.faults  # noqa: F401 - imported by tests that make faults
import monarch.rdma  # noqa: F401 - read back when a buffer reference arrives
import monarch.tensor  # noqa: F401 - imported lazily by programs that use tensors

import _monarch_build

_program.prepare(_monarch_build.MODULE, _monarch_build.DISPLAY)
if _program.problems():
    for problem in _program.problems():
        sys.stderr.write(f"monarch-build-error: {problem}\n")
    sys.stderr.flush()
    raise SystemExit(1)


class WitWorld(wit_world.WitWorld):
    def run(self, args):
        error = _program.run_main(args)
        if error is not None:
            raise Err(error)


class ActorClass(exports.ActorClass):
    def create(self, class_, init, rank, extent):
        _runtime.export_create(class_, init, rank, extent)

    def handle(self, endpoint, message):
        return _runtime.export_handle(endpoint, message)

    def supervise(self, failure):
        return _runtime.export_supervise(failure)


class Tests(exports.Tests):
    """``monarch-host test``: the script's ``test*`` functions."""

    def list_tests(self):
        return _program.listed_tests()

    def run_test(self, name):
        error = _program.run_test(name)
        if error is not None:
            raise Err(error)

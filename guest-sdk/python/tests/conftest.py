"""Puts guest-sdk/python on sys.path so that the tests import the pure
modules of ``monarch`` (``_codec``, ``_shape``, ``_errors``, ``_loop``,
``_program``, ``_testing``; ``faults`` with fake bindings) without an
install step. They must not import ``monarch.actor`` or
``monarch._runtime``: those need the host's bindings (``wit_world``)."""

import os
import sys

SDK_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if SDK_DIR not in sys.path:
    sys.path.insert(0, SDK_DIR)

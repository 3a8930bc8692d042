"""Standard library modules imported at build time. A component has no
files at run time, so a module a program imports lazily (inside a
function) must already be in the snapshot; the build imports what the
program names, and these, which programs and the standard library itself
commonly import late."""

import abc  # noqa: F401
import argparse  # noqa: F401
import asyncio  # noqa: F401
import base64  # noqa: F401
import bisect  # noqa: F401
import collections  # noqa: F401
import collections.abc  # noqa: F401
import contextlib  # noqa: F401
import copy  # noqa: F401
import copyreg  # noqa: F401
import dataclasses  # noqa: F401
import datetime  # noqa: F401
import decimal  # noqa: F401
import enum  # noqa: F401
import fractions  # noqa: F401
import functools  # noqa: F401
import hashlib  # noqa: F401
import heapq  # noqa: F401
import inspect  # noqa: F401
import io  # noqa: F401
import itertools  # noqa: F401
import json  # noqa: F401
import logging  # noqa: F401
import math  # noqa: F401
import numbers  # noqa: F401
import operator  # noqa: F401
import os  # noqa: F401
import pickle  # noqa: F401
import pprint  # noqa: F401
import queue  # noqa: F401
import random  # noqa: F401
import re  # noqa: F401
import statistics  # noqa: F401
import string  # noqa: F401
import struct  # noqa: F401
import textwrap  # noqa: F401
import time  # noqa: F401
import traceback  # noqa: F401
import types  # noqa: F401
import typing  # noqa: F401
import uuid  # noqa: F401
import warnings  # noqa: F401
import weakref  # noqa: F401

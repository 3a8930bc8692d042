"""The payload encoding (wit/ENCODING.md): every shared vector of
wit/encoding-vectors.json, argument lists, the pickle fallback, the
integer range and the tag hooks."""

import collections
import dataclasses
import enum
import json
import math
import os
import pickle

import pytest

from monarch import _codec
from monarch._codec import (
    TAG_ACTOR_MESH,
    TAG_KWARGS,
    TAG_PICKLE,
    TAG_RDMA_BUFFER,
    Decoder,
    Encoder,
    EncodingError,
    Tagged,
    decode_args,
    encode_args,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
VECTORS_PATH = os.path.join(REPO_ROOT, "wit", "encoding-vectors.json")

with open(VECTORS_PATH, encoding="utf-8") as f:
    VECTORS = json.load(f)

ENCODE_VECTORS = [v for v in VECTORS if "error" not in v and not v.get("decode_only")]
DECODE_VECTORS = [v for v in VECTORS if "error" not in v]
ERROR_VECTORS = [v for v in VECTORS if "error" in v]

#: What each error category of the vectors must say, in Python's words.
ERROR_WORDS = {
    "truncated": "cut short",
    "trailing bytes": "left over",
    "indefinite length": "indefinite",
    "invalid UTF-8": "UTF-8",
    "unknown tag": "tag",
    "not well-formed": "",
}


def ids(vectors):
    return [v["name"] for v in vectors]


def to_python(typed, as_key=False, for_decode=False):
    """The Python value a typed JSON value stands for. Arrays used as map
    keys are tuples (ENCODING.md, rule 4 for readers). ``for_decode``: what
    the decoder gives back, where a pickle tag is the object it holds."""
    if "tag" in typed:
        kind, body = "tag", typed
    else:
        (kind, body), = typed.items()
    if kind == "null":
        return None
    if kind == "bool":
        return body
    if kind == "int":
        assert isinstance(body, str), "ints are decimal strings in the vectors"
        return int(body)
    if kind == "float":
        return float(body)  # a number, or "nan", "inf", "-inf"
    if kind == "text":
        return body
    if kind == "bytes":
        return bytes.fromhex(body)
    if kind == "array":
        items = [to_python(x, as_key, for_decode) for x in body]
        return tuple(items) if as_key else items
    if kind == "map":
        return {to_python(k, True, for_decode): to_python(v, False, for_decode) for k, v in body}
    if kind == "tag":
        tag = body["tag"]
        content = to_python(body["value"], as_key, for_decode)
        if for_decode and tag == TAG_PICKLE:
            return pickle.loads(content)
        return Tagged(tag, content)
    raise AssertionError(f"unknown typed value {typed!r}")


def same(a, b):
    """Equality that also holds for NaN and tells 0.0 from -0.0, ints from
    floats and bools, lists from tuples."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a.keys()) == list(b.keys()) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, Tagged):
        return a.tag == b.tag and same(a.value, b.value)
    return a == b


def test_the_vectors_are_all_used():
    assert len(ENCODE_VECTORS) + len(ERROR_VECTORS) + sum(1 for v in VECTORS if v.get("decode_only")) == len(VECTORS)
    assert ERROR_VECTORS and ENCODE_VECTORS and any(v.get("decode_only") for v in VECTORS)
    for v in ERROR_VECTORS:
        assert v["error"] in ERROR_WORDS, f"new error category {v['error']!r} in {v['name']!r}"


@pytest.mark.parametrize("vector", ENCODE_VECTORS, ids=ids(ENCODE_VECTORS))
def test_encode_vector(vector):
    value = to_python(vector["value"])
    assert Encoder().encode(value).hex() == vector["hex"]
    # The same without pickling: none of the vectors needs it.
    assert Encoder(allow_pickle=False).encode(value).hex() == vector["hex"]


@pytest.mark.parametrize("vector", DECODE_VECTORS, ids=ids(DECODE_VECTORS))
def test_decode_vector(vector):
    expected = to_python(vector["value"], for_decode=True)
    got = Decoder().decode(bytes.fromhex(vector["hex"]))
    assert same(got, expected), f"{got!r} != {expected!r}"


@pytest.mark.parametrize("vector", ERROR_VECTORS, ids=ids(ERROR_VECTORS))
def test_error_vector(vector):
    with pytest.raises(EncodingError) as info:
        Decoder().decode(bytes.fromhex(vector["hex"]))
    assert ERROR_WORDS[vector["error"]] in str(info.value)


def test_encoding_error_is_a_value_error():
    with pytest.raises(ValueError):
        Decoder().decode(b"")


def test_decode_accepts_bytearray_and_memoryview():
    assert Decoder().decode(bytearray(b"\x83\x01\x02\x03")) == [1, 2, 3]
    assert Decoder().decode(memoryview(b"\x61\x61")) == "a"


def test_round_trip_of_a_nested_value():
    value = {"a": [1, -2, 3.5, None, True, False], "b": {"c": b"\x00\xff", (1, 2): "t"}, "": []}
    data = Encoder().encode(value)
    assert Decoder().decode(data) == value


def test_tuples_and_lists_are_arrays():
    assert Encoder().encode((1, 2)) == Encoder().encode([1, 2]) == bytes.fromhex("820102")
    assert Decoder().decode(bytes.fromhex("820102")) == [1, 2]
    assert Encoder().encode(bytearray(b"\x01")) == Encoder().encode(b"\x01") == bytes.fromhex("4101")


def test_decode_sequence():
    # What the host's ``concat`` reducer returns: one value per rank.
    assert Decoder().decode_sequence(bytes.fromhex("0161618102f6")) == [1, "a", [2], None]
    assert Decoder().decode_sequence(b"") == []
    with pytest.raises(EncodingError):
        Decoder().decode_sequence(bytes.fromhex("0182"))


def test_unhashable_map_key_is_an_encoding_error():
    with pytest.raises(EncodingError, match="map key"):
        Decoder().decode(bytes.fromhex("a1a000"))  # {{}: 0}


def test_simple_values_outside_the_subset_are_refused():
    for hex_ in ("f7", "e0", "f820"):  # undefined, simple 0, simple 32
        with pytest.raises(EncodingError):
            Decoder().decode(bytes.fromhex(hex_))


# -- integers -------------------------------------------------------------

@pytest.mark.parametrize("n", [2**64, 2**64 + 1, 2**100, -(2**64) - 1, -(2**100)])
def test_integers_out_of_range_are_refused(n):
    with pytest.raises(EncodingError, match="outside the payload range"):
        Encoder().encode(n)
    with pytest.raises(EncodingError):
        Encoder().encode([1, {"x": n}])


@pytest.mark.parametrize("n", [2**64 - 1, -(2**64), 2**63, -(2**63) - 1, 0, -1])
def test_integers_at_the_edges_round_trip(n):
    assert Decoder().decode(Encoder().encode(n)) == n


def test_bool_is_not_an_integer():
    assert Encoder().encode(True) == b"\xf5"
    assert Encoder().encode([False, 0]) == bytes.fromhex("82f400")
    assert type(Decoder().decode(b"\x01")) is int
    assert type(Decoder().decode(b"\xf5")) is bool


# -- argument lists ---------------------------------------------------------

def test_encode_args_positional():
    enc = Encoder()
    assert encode_args(enc, (), {}) == bytes.fromhex("80")
    assert encode_args(enc, (1, 2, 3), {}) == bytes.fromhex("83010203")
    assert encode_args(enc, [None], {}) == bytes.fromhex("81f6")


def test_encode_args_with_keywords():
    enc = Encoder()
    assert encode_args(enc, (1,), {"x": 2}) == bytes.fromhex("d99ca6828101a1617802")
    assert encode_args(enc, (1, 2), {"x": 3, "y": "a"}) == bytes.fromhex("d99ca682820102a261780361796161")
    assert encode_args(enc, (), {"x": 1}) == bytes.fromhex("d99ca68280a1617801")


def test_decode_args():
    dec = Decoder()
    assert decode_args(dec, bytes.fromhex("80")) == ([], {})
    assert decode_args(dec, bytes.fromhex("83010203")) == ([1, 2, 3], {})
    assert decode_args(dec, bytes.fromhex("d99ca682820102a261780361796161")) == ([1, 2], {"x": 3, "y": "a"})
    assert decode_args(dec, bytes.fromhex("d99ca68280a1617801")) == ([], {"x": 1})


@pytest.mark.parametrize("args,kwargs", [
    ((), {}),
    ((1, "two", [3.0]), {}),
    ((), {"only": "keywords"}),
    (({"a": 1}, None), {"flag": True, "items": [1, 2]}),
])
def test_args_round_trip(args, kwargs):
    data = encode_args(Encoder(), args, kwargs)
    got_args, got_kwargs = decode_args(Decoder(), data)
    assert got_args == [a if not isinstance(a, tuple) else list(a) for a in args]
    assert got_kwargs == kwargs


def test_decode_args_of_a_bare_value_is_one_argument():
    # An SDK that sends one value, not an argument list.
    dec = Decoder()
    assert decode_args(dec, bytes.fromhex("05")) == ([5], {})
    assert decode_args(dec, bytes.fromhex("a1617801")) == ([{"x": 1}], {})
    assert decode_args(dec, bytes.fromhex("f6")) == ([None], {})


@pytest.mark.parametrize("payload", [
    Tagged(TAG_KWARGS, [[1]]),                   # not two elements
    Tagged(TAG_KWARGS, [[1], {"x": 1}, 3]),
    Tagged(TAG_KWARGS, {"x": 1}),                # not an array
    Tagged(TAG_KWARGS, [1, {"x": 1}]),           # positional not an array
    Tagged(TAG_KWARGS, [[1], [2]]),              # keywords not a map
])
def test_malformed_keyword_arguments_are_refused(payload):
    data = Encoder().encode(payload)
    with pytest.raises(EncodingError, match="keyword"):
        decode_args(Decoder(), data)


def test_keyword_names_must_be_text():
    data = Encoder().encode(Tagged(TAG_KWARGS, [[], {1: "x"}]))
    with pytest.raises(EncodingError, match="name must be text"):
        decode_args(Decoder(), data)


# -- pickling ---------------------------------------------------------------

@dataclasses.dataclass
class Sample:
    x: int
    label: str


def test_a_dataclass_travels_as_a_pickle():
    data = Encoder().encode(Sample(3, "a"))
    assert data[:3] == bytes.fromhex("d99ca7")  # tag 40103
    assert Decoder().decode(data) == Sample(3, "a")
    # Inside containers and argument lists too.
    args, kwargs = decode_args(Decoder(), encode_args(Encoder(), (Sample(1, "b"),), {"s": Sample(2, "c")}))
    assert args == [Sample(1, "b")] and kwargs == {"s": Sample(2, "c")}


def test_pickling_refused_when_not_allowed():
    with pytest.raises(EncodingError, match="Sample cannot be sent to another language"):
        Encoder(allow_pickle=False).encode(Sample(3, "a"))
    with pytest.raises(EncodingError):
        Encoder(allow_pickle=False).encode({"nested": [Sample(3, "a")]})
    with pytest.raises(EncodingError):
        Encoder(allow_pickle=False).encode({1, 2})


def test_pickle_not_read_when_not_allowed():
    data = Encoder().encode(Sample(3, "a"))
    with pytest.raises(EncodingError, match="pickle"):
        Decoder(allow_pickle=False).decode(data)


def test_a_pickle_tag_must_hold_bytes():
    with pytest.raises(EncodingError, match="bytes"):
        Decoder().decode(Encoder().encode(Tagged(TAG_PICKLE, "not bytes")))


def test_unpicklable_value_is_an_encoding_error():
    with pytest.raises(EncodingError, match="cannot send"):
        Encoder().encode(lambda: None)


class Color(enum.IntEnum):
    RED = 1


Pair = collections.namedtuple("Pair", "a b")


def test_subclasses_of_plain_types_without_pickling():
    enc = Encoder(allow_pickle=False)
    assert enc.encode(Color.RED) == b"\x01"
    assert enc.encode(Pair(1, 2)) == bytes.fromhex("820102")
    assert enc.encode(collections.OrderedDict(a=1)) == bytes.fromhex("a1616101")
    # With pickling on, they keep their type.
    assert Decoder().decode(Encoder().encode(Pair(1, 2))) == Pair(1, 2)
    assert type(Decoder().decode(Encoder().encode(Pair(1, 2)))) is Pair


# -- tag hooks --------------------------------------------------------------

class Ref:
    def __init__(self, name):
        self.name = name

    def __eq__(self, other):
        return isinstance(other, Ref) and other.name == self.name


def _to_tag(value):
    if isinstance(value, Ref):
        return TAG_ACTOR_MESH, value.name.encode()
    return None


def _from_tag(tag, content):
    if tag == TAG_ACTOR_MESH:
        return Ref(content.decode())
    return NotImplemented


def test_to_tag_writes_the_tag():
    enc = Encoder(_to_tag, allow_pickle=False)
    assert enc.encode(Ref("{}")) == bytes.fromhex("d99ca4427b7d")
    assert encode_args(enc, (Ref("{}"),), {}) == bytes.fromhex("81d99ca4427b7d")


def test_from_tag_reads_the_tag():
    dec = Decoder(_from_tag)
    assert dec.decode(bytes.fromhex("d99ca4427b7d")) == Ref("{}")
    assert decode_args(dec, bytes.fromhex("81d99ca4427b7d")) == ([Ref("{}")], {})


def test_tags_no_hook_claims():
    # Known reference tags that no hook claims stay Tagged, and re-encode
    # as they came; unknown tags are refused even with a hook.
    dec = Decoder(_from_tag)
    got = dec.decode(bytes.fromhex("d99ca5480102030405060708"))
    assert got == Tagged(TAG_RDMA_BUFFER, bytes.fromhex("0102030405060708"))
    assert Encoder().encode(got) == bytes.fromhex("d99ca5480102030405060708")
    with pytest.raises(EncodingError, match="40104"):
        dec.decode(bytes.fromhex("d99ca800"))


def test_from_tag_may_give_unknown_tags_a_meaning():
    dec = Decoder(lambda tag, content: ("mine", content) if tag == 1234 else NotImplemented)
    assert dec.decode(bytes.fromhex("d904d200")) == ("mine", 0)


def test_to_tag_none_falls_back_to_pickle():
    data = Encoder(_to_tag).encode(Sample(1, "x"))
    assert Decoder(_from_tag).decode(data) == Sample(1, "x")


def test_tagged_equality_and_repr():
    assert Tagged(1, [1]) == Tagged(1, [1])
    assert Tagged(1, [1]) != Tagged(2, [1])
    assert hash(Tagged(1, [1])) == hash(Tagged(1, [1]))
    assert repr(Tagged(40100, b"x")) == "Tagged(40100, b'x')"


def test_tag_numbers():
    assert (_codec.TAG_ACTOR_MESH, _codec.TAG_RDMA_BUFFER, _codec.TAG_KWARGS, _codec.TAG_PICKLE) == (
        40100, 40101, 40102, 40103)

"""The payload encoding shared by every SDK: a CBOR subset, specified in
``wit/ENCODING.md`` and checked against ``wit/encoding-vectors.json``.

Pure Python, with no import of the host's bindings, so that it is tested
with pytest on any machine. References (actor meshes, RDMA buffers) are
turned into tags and back by hooks that the runtime installs.
"""

import pickle
import struct

#: An actor mesh reference: bytes of ``actor-mesh.to-ref``.
TAG_ACTOR_MESH = 40100
#: An RDMA buffer reference: bytes of ``buffer.to-ref``.
TAG_RDMA_BUFFER = 40101
#: Call arguments with keywords: ``[positional, keywords]``.
TAG_KWARGS = 40102
#: A Python object as pickle bytes (only Python reads it).
TAG_PICKLE = 40103

_pack_f64 = struct.Struct(">d").pack
_unpack_f64 = struct.Struct(">d").unpack_from
_unpack_f32 = struct.Struct(">f").unpack_from
_unpack_f16 = struct.Struct(">e").unpack_from
_unpack_u16 = struct.Struct(">H").unpack_from
_unpack_u32 = struct.Struct(">I").unpack_from
_unpack_u64 = struct.Struct(">Q").unpack_from


class EncodingError(ValueError):
    """A value that cannot be encoded, or bytes that are not a payload."""


class Tagged:
    """A tagged value that no hook claimed: kept as it came."""

    __slots__ = ("tag", "value")

    def __init__(self, tag, value):
        self.tag = tag
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Tagged) and (self.tag, self.value) == (other.tag, other.value)

    def __hash__(self):
        return hash((self.tag, repr(self.value)))

    def __repr__(self):
        return f"Tagged({self.tag}, {self.value!r})"


def _head(out, major, n):
    if n < 24:
        out.append(major | n)
    elif n < 0x100:
        out.append(major | 24)
        out.append(n)
    elif n < 0x10000:
        out.append(major | 25)
        out += n.to_bytes(2, "big")
    elif n < 0x100000000:
        out.append(major | 26)
        out += n.to_bytes(4, "big")
    else:
        out.append(major | 27)
        out += n.to_bytes(8, "big")


class Encoder:
    """Writes values. ``to_tag(value)`` may return ``(tag, content)`` for
    objects of the runtime (meshes, buffers); others that the subset cannot
    carry are pickled when ``allow_pickle`` is true."""

    def __init__(self, to_tag=None, allow_pickle=True):
        self.to_tag = to_tag
        self.allow_pickle = allow_pickle

    def encode(self, value):
        out = bytearray()
        self._write(out, value)
        return bytes(out)

    def _write(self, out, value):
        t = type(value)
        if t is int:
            if value >= 0:
                if value >= 1 << 64:
                    raise EncodingError(f"integer {value} is outside the payload range (-2**64 .. 2**64-1)")
                _head(out, 0x00, value)
            else:
                n = -1 - value
                if n >= 1 << 64:
                    raise EncodingError(f"integer {value} is outside the payload range (-2**64 .. 2**64-1)")
                _head(out, 0x20, n)
        elif t is str:
            b = value.encode("utf-8")
            _head(out, 0x60, len(b))
            out += b
        elif value is None:
            out.append(0xF6)
        elif t is bool:
            out.append(0xF5 if value else 0xF4)
        elif t is float:
            out.append(0xFB)
            out += _pack_f64(value)
        elif t is list or t is tuple:
            _head(out, 0x80, len(value))
            for item in value:
                self._write(out, item)
        elif t is dict:
            _head(out, 0xA0, len(value))
            for k, v in value.items():
                self._write(out, k)
                self._write(out, v)
        elif t is bytes or t is bytearray or t is memoryview:
            b = bytes(value)
            _head(out, 0x40, len(b))
            out += b
        else:
            self._write_other(out, value)

    def _write_other(self, out, value):
        if self.to_tag is not None:
            tagged = self.to_tag(value)
            if tagged is not None:
                tag, content = tagged
                _head(out, 0xC0, tag)
                self._write(out, content)
                return
        if isinstance(value, Tagged):
            _head(out, 0xC0, value.tag)
            self._write(out, value.value)
            return
        # Subclasses of the plain types (an IntEnum, a namedtuple...) that
        # are not worth a pickle travel as their base value only when
        # pickling is off; with it on they keep their type.
        if not self.allow_pickle:
            for base, conv in ((bool, bool), (int, int), (float, float), (str, str),
                               (tuple, list), (list, list), (dict, dict)):
                if isinstance(value, base):
                    self._write(out, conv(value))
                    return
            raise EncodingError(
                f"a {type(value).__qualname__} cannot be sent to another language: "
                "use None, bool, int, float, str, bytes, list, tuple, dict or an actor mesh"
            )
        try:
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - any pickling failure is the user's to read
            raise EncodingError(f"cannot send a {type(value).__qualname__}: {e}") from e
        _head(out, 0xC0, TAG_PICKLE)
        _head(out, 0x40, len(data))
        out += data


class Decoder:
    """Reads values. ``from_tag(tag, content)`` turns runtime tags back into
    objects (return ``NotImplemented`` for tags it does not know)."""

    def __init__(self, from_tag=None, allow_pickle=True):
        self.from_tag = from_tag
        self.allow_pickle = allow_pickle

    def decode(self, data):
        data = bytes(data)
        value, pos = self._read(data, 0, False)
        if pos != len(data):
            raise EncodingError(f"{len(data) - pos} bytes left over after the value")
        return value

    def decode_sequence(self, data):
        """Every value of a CBOR sequence (the host's ``concat``)."""
        data = bytes(data)
        values, pos = [], 0
        while pos < len(data):
            value, pos = self._read(data, pos, False)
            values.append(value)
        return values

    def _arg(self, data, pos, info):
        if info < 24:
            return info, pos
        if info == 24:
            self._need(data, pos, 1)
            return data[pos], pos + 1
        if info == 25:
            self._need(data, pos, 2)
            return _unpack_u16(data, pos)[0], pos + 2
        if info == 26:
            self._need(data, pos, 4)
            return _unpack_u32(data, pos)[0], pos + 4
        if info == 27:
            self._need(data, pos, 8)
            return _unpack_u64(data, pos)[0], pos + 8
        if info == 31:
            raise EncodingError("indefinite lengths are not part of the payload encoding")
        raise EncodingError(f"reserved additional information {info}")

    @staticmethod
    def _need(data, pos, n):
        if pos + n > len(data):
            raise EncodingError("the payload is cut short")

    def _read(self, data, pos, as_key):
        if pos >= len(data):
            raise EncodingError("the payload is cut short")
        ib = data[pos]
        major, info = ib >> 5, ib & 0x1F
        pos += 1
        if major == 7:
            if info == 20:
                return False, pos
            if info == 21:
                return True, pos
            if info == 22:
                return None, pos
            if info == 27:
                self._need(data, pos, 8)
                return _unpack_f64(data, pos)[0], pos + 8
            if info == 26:
                self._need(data, pos, 4)
                return _unpack_f32(data, pos)[0], pos + 4
            if info == 25:
                self._need(data, pos, 2)
                return _unpack_f16(data, pos)[0], pos + 2
            if info == 31:
                raise EncodingError("indefinite lengths are not part of the payload encoding")
            raise EncodingError(f"simple value {info} is not part of the payload encoding")
        n, pos = self._arg(data, pos, info)
        if major == 0:
            return n, pos
        if major == 1:
            return -1 - n, pos
        if major == 2:
            self._need(data, pos, n)
            return data[pos:pos + n], pos + n
        if major == 3:
            self._need(data, pos, n)
            try:
                return data[pos:pos + n].decode("utf-8"), pos + n
            except UnicodeDecodeError as e:
                raise EncodingError(f"text that is not UTF-8: {e}") from None
        if major == 4:
            if n > len(data) - pos:
                raise EncodingError("the payload is cut short")
            items = []
            for _ in range(n):
                item, pos = self._read(data, pos, as_key)
                items.append(item)
            return (tuple(items) if as_key else items), pos
        if major == 5:
            if n > len(data) - pos:
                raise EncodingError("the payload is cut short")
            out = {}
            for _ in range(n):
                k, pos = self._read(data, pos, True)
                v, pos = self._read(data, pos, False)
                try:
                    out[k] = v
                except TypeError:
                    raise EncodingError(f"a map key of type {type(k).__name__} cannot be a dict key") from None
            return out, pos
        # major 6: a tag
        content, pos = self._read(data, pos, as_key)
        return self._tag(n, content), pos

    def _tag(self, tag, content):
        if tag == TAG_PICKLE:
            if not isinstance(content, bytes):
                raise EncodingError("a pickle tag must hold bytes")
            if not self.allow_pickle:
                raise EncodingError("a pickled Python object, and pickles are not accepted here")
            return pickle.loads(content)
        if tag == TAG_KWARGS:
            return Tagged(tag, content)
        if self.from_tag is not None:
            value = self.from_tag(tag, content)
            if value is not NotImplemented:
                return value
        if tag in (TAG_ACTOR_MESH, TAG_RDMA_BUFFER):
            return Tagged(tag, content)
        raise EncodingError(f"tag {tag} is not part of the payload encoding")


def encode_args(encoder, args, kwargs):
    """A message or init: the argument list of ``wit/ENCODING.md``."""
    if kwargs:
        return encoder.encode(Tagged(TAG_KWARGS, [list(args), dict(kwargs)]))
    return encoder.encode(list(args))


def decode_args(decoder, data):
    """``(args, kwargs)`` from an argument list. A value that is not an
    argument list (a payload from an SDK that sends one bare value) is one
    positional argument."""
    value = decoder.decode(data)
    if type(value) is list:
        return value, {}
    if isinstance(value, Tagged) and value.tag == TAG_KWARGS:
        content = value.value
        if (type(content) is not list or len(content) != 2 or type(content[0]) is not list
                or type(content[1]) is not dict):
            raise EncodingError("keyword arguments must be [positional, keywords]")
        kwargs = content[1]
        for k in kwargs:
            if type(k) is not str:
                raise EncodingError(f"a keyword argument's name must be text, not {k!r}")
        return content[0], kwargs
    return [value], {}


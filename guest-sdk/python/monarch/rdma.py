"""RDMA buffers: bytes in host memory on one proc, moved one-sided to and
from other buffers (RDMA where the hardware has it, TCP otherwise). A
buffer travels inside messages as a reference; its bytes stay put."""

from componentize_py_types import Err
from wit_world.imports import rdma as _wrdma

from . import _codec, _runtime


class RDMABuffer:
    """``size`` bytes on the proc at ``rank`` of ``procs``."""

    def __init__(self, handle):
        self._handle = handle

    @classmethod
    def allocate(cls, procs, size, rank=0):
        try:
            return cls(_wrdma.Buffer.allocate(procs._handle, rank, size))
        except Err as e:
            raise RuntimeError(f"allocating an RDMA buffer: {e.value}") from None

    @classmethod
    def _from_ref(cls, ref):
        try:
            return cls(_wrdma.Buffer.from_ref(ref))
        except Err as e:
            raise ValueError(f"not an RDMA buffer reference: {e.value}") from None

    def _monarch_ref(self):
        return _codec.TAG_RDMA_BUFFER, self._handle.to_ref()

    def __reduce__(self):
        return (RDMABuffer._from_ref, (self._handle.to_ref(),))

    def size(self):
        return self._handle.size()

    def write(self, data, offset=0):
        """Puts ``data`` at ``offset``; a Future of None."""
        data = bytes(data)
        return _runtime._request(lambda: self._handle.write(offset, data), _runtime._done)

    def read(self, length=None, offset=0):
        """``length`` bytes from ``offset`` (the rest by default); a Future of bytes."""
        if length is None:
            length = self.size() - offset
        return _runtime._request(lambda: self._handle.read(offset, length), lambda r: bytes(_runtime._unwrap(r).value))

    def read_into(self, dst):
        """Copies this buffer into ``dst`` (equal sizes); a Future of None."""
        return _runtime._request(lambda: self._handle.read_into(dst._handle), _runtime._done)

    def write_from(self, src):
        """Copies ``src`` into this buffer (equal sizes); a Future of None."""
        return _runtime._request(lambda: self._handle.write_from(src._handle), _runtime._done)

    def drop(self):
        """Frees the memory now; a Future of None."""
        return _runtime._request(lambda: self._handle.free(), _runtime._done)

    def __repr__(self):
        return f"RDMABuffer({self.size()} bytes)"

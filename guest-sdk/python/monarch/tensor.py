"""Tensors that live on the procs of a mesh (the WIT ``tensor``
interface): the controller holds handles, ops queue without waiting and run
on every rank in order, and an op that fails poisons what is computed from
it until a fetch or all-reduce reports it.

    engine = TensorEngine.spawn(procs)
    x = engine.create([4096, 16], sharding=Shard("procs", 0), init=Normal(0.0, 1.0, seed=42))
    loss = (x @ w - y).sum()
    loss.all_reduce("procs").get()
    print(loss.item().get())
"""

import array
import sys

from componentize_py_types import Err
from wit_world.imports import tensor as _wtensor

from . import _runtime

_DTYPES = {
    "float32": (_wtensor.Dtype.FLOAT32, "f"),
    "float64": (_wtensor.Dtype.FLOAT64, "d"),
    "int64": (_wtensor.Dtype.INT64, "q"),
}
_BINARY = {"add": _wtensor.BinaryOp.ADD, "sub": _wtensor.BinaryOp.SUB,
           "mul": _wtensor.BinaryOp.MUL, "div": _wtensor.BinaryOp.DIV}


class Replicate:
    """Every rank holds the whole tensor."""

    def _wit(self):
        return _wtensor.Sharding_Replicate()


class Shard:
    """Split along ``tensor_dim`` over the ranks of mesh dimension ``mesh_dim``."""

    def __init__(self, mesh_dim, tensor_dim):
        self.mesh_dim = mesh_dim
        self.tensor_dim = tensor_dim

    def _wit(self):
        return _wtensor.Sharding_Shard(_wtensor.ShardSpec(self.mesh_dim, self.tensor_dim))


class Zeros:
    def _wit(self):
        return _wtensor.Init_Zeros()


class Ones:
    def _wit(self):
        return _wtensor.Init_Ones()


class Full:
    def __init__(self, value):
        self.value = float(value)

    def _wit(self):
        return _wtensor.Init_Full(self.value)


class Normal:
    def __init__(self, mean=0.0, std=1.0, seed=0):
        self.mean, self.std, self.seed = float(mean), float(std), int(seed)

    def _wit(self):
        return _wtensor.Init_Normal(_wtensor.Normal(self.mean, self.std, self.seed))


class Uniform:
    def __init__(self, low=0.0, high=1.0, seed=0):
        self.low, self.high, self.seed = float(low), float(high), int(seed)

    def _wit(self):
        return _wtensor.Init_Uniform(_wtensor.Uniform(self.low, self.high, self.seed))


def _device(device):
    if device in (None, "cpu"):
        return _wtensor.Device_Cpu()
    if isinstance(device, str) and device.startswith("cuda"):
        _, _, ordinal = device.partition(":")
        return _wtensor.Device_Cuda(int(ordinal or 0))
    raise ValueError(f"device {device!r}: use 'cpu' or 'cuda[:N]'")


def _elements(data, code):
    values = array.array(code, data)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


class TensorEngine:
    """Tensor workers on every proc of a proc mesh."""

    def __init__(self, handle):
        self._handle = handle

    @classmethod
    def spawn(cls, procs):
        try:
            return cls(_wtensor.Engine.spawn(procs._handle))
        except Err as e:
            raise RuntimeError(f"starting the tensor engine: {e.value}") from None

    def create(self, dims, dtype="float32", device="cpu", sharding=None, init=None):
        """A new tensor of global shape ``dims``."""
        wit_dtype, _ = _DTYPES[dtype]
        handle = self._handle.create(list(dims), wit_dtype, _device(device),
                                     (sharding or Replicate())._wit(), (init or Zeros())._wit())
        return Tensor(handle)

    def from_list(self, values, dims, dtype="float32", device="cpu", sharding=None):
        """A tensor holding ``values`` (row-major) in shape ``dims``."""
        _, code = _DTYPES[dtype]
        data = array.array(code, values)
        if sys.byteorder != "little":
            data.byteswap()
        wit_dtype, _ = _DTYPES[dtype]
        handle = self._handle.create(list(dims), wit_dtype, _device(device),
                                     (sharding or Replicate())._wit(), _wtensor.Init_FromBytes(data.tobytes()))
        return Tensor(handle)

    def sync(self):
        """A Future done when every op made so far has run on every rank."""
        return _runtime._request(self._handle.sync, _runtime._done)


class Tensor:
    """A handle to a tensor on the engine's mesh."""

    def __init__(self, handle):
        self._handle = handle

    @property
    def shape(self):
        return list(self._handle.layout().dims)

    def _code(self):
        dtype = self._handle.layout().dtype
        return {v[0]: v[1] for v in _DTYPES.values()}[dtype]

    def _binary(self, op, other):
        if isinstance(other, Tensor):
            return Tensor(self._handle.binary(_BINARY[op], other._handle))
        return Tensor(self._handle.scalar(_BINARY[op], float(other)))

    def __add__(self, other):
        return self._binary("add", other)

    def __sub__(self, other):
        return self._binary("sub", other)

    def __mul__(self, other):
        return self._binary("mul", other)

    def __truediv__(self, other):
        return self._binary("div", other)

    def __neg__(self):
        return Tensor(self._handle.unary(_wtensor.UnaryOp.NEG))

    def relu(self):
        return Tensor(self._handle.unary(_wtensor.UnaryOp.RELU))

    def exp(self):
        return Tensor(self._handle.unary(_wtensor.UnaryOp.EXP))

    def __matmul__(self, other):
        return Tensor(self._handle.matmul(other._handle))

    def t(self):
        return Tensor(self._handle.transpose())

    @property
    def T(self):  # noqa: N802 - torch's name
        return self.t()

    def sum(self, dim=None):
        return Tensor(self._handle.sum(dim))

    def copy(self):
        return Tensor(self._handle.copy())

    def axpy_(self, alpha, x):
        """``self += alpha * x``, in place."""
        self._handle.axpy(float(alpha), x._handle)
        return self

    def copy_(self, src):
        self._handle.assign(src._handle)
        return self

    def all_reduce(self, mesh_dim):
        """Sums over mesh dimension ``mesh_dim``, in place; a Future."""
        return _runtime._request(lambda: self._handle.all_reduce(mesh_dim), _runtime._done)

    def fetch(self):
        """A Future of the whole tensor's elements, row-major, as a list."""
        code = self._code()
        return _runtime._request(self._handle.fetch, lambda r: _elements(_runtime._unwrap(r).value, code))

    def fetch_shard(self, rank):
        code = self._code()
        return _runtime._request(lambda: self._handle.fetch_shard(rank),
                                 lambda r: _elements(_runtime._unwrap(r).value, code))

    def item(self):
        """A Future of the one element of a tensor of one element."""
        code = self._code()

        def one(r):
            values = _elements(_runtime._unwrap(r).value, code)
            if len(values) != 1:
                raise ValueError(f"item() needs a tensor of one element, not {len(values)}")
            return values[0]

        return _runtime._request(self._handle.fetch, one)

    def __repr__(self):
        layout = self._handle.layout()
        return f"Tensor(dims={list(layout.dims)}, dtype={layout.dtype.name.lower()})"

"""Shapes of meshes: extents, points and meshes of values, as in Monarch.

Pure Python (no host bindings), so that pytest covers it anywhere.
"""

import itertools
from collections.abc import Mapping


class Extent(Mapping):
    """A mesh's shape: named dimensions, outermost first, ranks row-major.
    Reads like a dict: ``extent["gpus"]``, ``dict(extent)``."""

    __slots__ = ("_labels", "_sizes")

    def __init__(self, labels, sizes):
        self._labels = tuple(labels)
        self._sizes = tuple(int(s) for s in sizes)
        if len(self._labels) != len(self._sizes):
            raise ValueError("an extent needs as many sizes as labels")

    @classmethod
    def from_dict(cls, dims):
        return cls(list(dims.keys()), list(dims.values()))

    @property
    def labels(self):
        return list(self._labels)

    @property
    def sizes(self):
        return list(self._sizes)

    @property
    def nelements(self):
        n = 1
        for s in self._sizes:
            n *= s
        return n

    def __len__(self):
        return len(self._labels)

    def __iter__(self):
        return iter(self._labels)

    def __getitem__(self, label):
        try:
            return self._sizes[self._labels.index(label)]
        except ValueError:
            raise KeyError(label) from None

    def __eq__(self, other):
        if isinstance(other, Extent):
            return self._labels == other._labels and self._sizes == other._sizes
        if isinstance(other, Mapping):
            return dict(self) == dict(other)
        return NotImplemented

    def __hash__(self):
        return hash((self._labels, self._sizes))

    def __repr__(self):
        return repr(dict(zip(self._labels, self._sizes)))

    def point(self, rank):
        """The point of row-major ``rank``."""
        return Point(rank, self)

    def coordinates(self, rank):
        coords = []
        for size in reversed(self._sizes):
            coords.append(rank % size if size else 0)
            rank = rank // size if size else 0
        return list(reversed(coords))

    def rank_of(self, coords):
        rank = 0
        for c, size in zip(coords, self._sizes):
            rank = rank * size + c
        return rank


class Point(Mapping):
    """One position in an extent: ``point["gpus"]``, ``point.rank``, and
    ``mesh.slice(**point)`` to pick that position out of a mesh shaped
    alike."""

    __slots__ = ("_rank", "_extent", "_coords")

    def __init__(self, rank, extent):
        self._rank = rank
        self._extent = extent
        self._coords = extent.coordinates(rank)

    @property
    def rank(self):
        return self._rank

    @property
    def extent(self):
        return self._extent

    def __len__(self):
        return len(self._coords)

    def __iter__(self):
        return iter(self._extent.labels)

    def __getitem__(self, label):
        try:
            return self._coords[self._extent.labels.index(label)]
        except ValueError:
            raise KeyError(label) from None

    def __eq__(self, other):
        if isinstance(other, Point):
            return self._rank == other._rank and self._extent == other._extent
        if isinstance(other, Mapping):
            return dict(self) == dict(other)
        return NotImplemented

    def __hash__(self):
        return hash((self._rank, self._extent))

    def __repr__(self):
        return repr(dict(self))


def selectors(extent, dims):
    """Checks a slice request (``gpus=2``, ``gpus=slice(0, 4)``) against an
    extent and returns ``[(label, ("index", i) | ("range", start, stop, step))]``
    with ranges clamped as Python clamps them."""
    out = []
    for label, sel in dims.items():
        if label not in extent:
            raise ValueError(f"the mesh has no dimension {label!r}; its dimensions are {extent.labels}")
        size = extent[label]
        if isinstance(sel, bool) or not isinstance(sel, (int, slice)):
            raise TypeError(f"slice {label!r} by an int or a slice, not {type(sel).__name__}")
        if isinstance(sel, int):
            i = sel + size if sel < 0 else sel
            if not 0 <= i < size:
                raise IndexError(f"index {sel} is out of range for dimension {label!r} of size {size}")
            out.append((label, ("index", i)))
        else:
            start, stop, step = sel.indices(size)
            if step <= 0:
                raise ValueError(f"a slice of {label!r} needs a positive step")
            stop = max(stop, start)
            out.append((label, ("range", start, stop, step)))
    return out


def sliced(extent, sels):
    """The extent left after ``selectors``, and for each rank of it the
    rank in ``extent`` it stands for."""
    picks = dict(sels)
    labels, sizes, axes = [], [], []
    for label, size in zip(extent.labels, extent.sizes):
        sel = picks.get(label)
        if sel is None:
            idx = list(range(size))
        elif sel[0] == "index":
            idx = [sel[1]]
        else:
            idx = list(range(sel[1], sel[2], sel[3]))
        if sel is None or sel[0] == "range":
            labels.append(label)
            sizes.append(len(idx))
        axes.append(idx)
    parent = [extent.rank_of(coords) for coords in itertools.product(*axes)]
    return Extent(labels, sizes), parent


class ValueMesh(Mapping):
    """What ``call`` returns: one value per actor, shaped like the mesh
    called. ``items()`` gives ``(point, value)`` in rank order; ``values()``
    the values; ``item(gpus=1)`` one value; ``slice(gpus=slice(0, 2))`` a
    smaller ValueMesh."""

    def __init__(self, extent, values):
        if len(values) != extent.nelements:
            raise ValueError(f"a mesh of {extent.nelements} needs as many values, not {len(values)}")
        self._extent = extent
        self._values = list(values)

    @property
    def extent(self):
        return self._extent

    def __len__(self):
        return len(self._values)

    def __iter__(self):
        return (self._extent.point(r) for r in range(len(self._values)))

    def __getitem__(self, point):
        if isinstance(point, int):
            return self._values[point]
        if isinstance(point, Mapping):
            return self.item(**dict(point))
        raise KeyError(point)

    def items(self):
        return [(self._extent.point(r), v) for r, v in enumerate(self._values)]

    def values(self):
        return list(self._values)

    def item(self, **coords):
        if not coords and len(self._values) == 1:
            return self._values[0]
        if set(coords) != set(self._extent.labels):
            raise KeyError(f"name every dimension of {self._extent.labels} to pick one value, got {sorted(coords)}")
        view = self.slice(**coords)
        return view._values[0]

    def slice(self, **dims):
        extent, parent = sliced(self._extent, selectors(self._extent, dims))
        return ValueMesh(extent, [self._values[r] for r in parent])

    def __eq__(self, other):
        if isinstance(other, ValueMesh):
            return self._extent == other._extent and self._values == other._values
        return NotImplemented

    def __repr__(self):
        if not self._extent.labels:
            # One value, at the only point of a mesh with no dimensions.
            return f"ValueMesh({self._values[0]!r})"
        body = ", ".join(f"{dict(p)}: {v!r}" for p, v in self.items())
        return f"ValueMesh({dict(self._extent)}: {{{body}}})"

"""Extents, points, slicing and ValueMesh (monarch._shape)."""

import pytest

from monarch._shape import Extent, Point, ValueMesh, selectors, sliced


@pytest.fixture
def ext():
    return Extent(["hosts", "gpus"], [2, 3])


# -- Extent -----------------------------------------------------------------

def test_extent_reads_like_a_dict(ext):
    assert ext["hosts"] == 2 and ext["gpus"] == 3
    assert len(ext) == 2
    assert list(ext) == ["hosts", "gpus"]
    assert dict(ext) == {"hosts": 2, "gpus": 3}
    assert list(ext.items()) == [("hosts", 2), ("gpus", 3)]
    assert "gpus" in ext and "cpus" not in ext
    assert ext.get("cpus") is None
    with pytest.raises(KeyError):
        ext["cpus"]


def test_extent_properties(ext):
    assert ext.labels == ["hosts", "gpus"]
    assert ext.sizes == [2, 3]
    assert ext.nelements == 6
    assert Extent([], []).nelements == 1
    assert Extent(["a"], [0]).nelements == 0
    # The lists handed out are copies.
    ext.labels.append("x")
    ext.sizes.append(9)
    assert ext.labels == ["hosts", "gpus"] and ext.sizes == [2, 3]


def test_extent_from_dict_equality_hash_repr(ext):
    assert Extent.from_dict({"hosts": 2, "gpus": 3}) == ext
    assert ext == {"hosts": 2, "gpus": 3}
    assert ext != Extent(["gpus", "hosts"], [3, 2])  # the order of dimensions counts
    assert ext != Extent(["hosts", "gpus"], [2, 4])
    assert hash(ext) == hash(Extent(["hosts", "gpus"], [2, 3]))
    assert len({ext, Extent(["hosts", "gpus"], [2, 3])}) == 1
    assert repr(ext) == "{'hosts': 2, 'gpus': 3}"
    assert ext != 6


def test_extent_needs_as_many_sizes_as_labels():
    with pytest.raises(ValueError):
        Extent(["a", "b"], [1])


def test_extent_coordinates_are_row_major(ext):
    assert [ext.coordinates(r) for r in range(6)] == [
        [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    assert [ext.rank_of(ext.coordinates(r)) for r in range(6)] == list(range(6))


# -- Point ------------------------------------------------------------------

def test_point_coords_and_rank(ext):
    p = ext.point(4)
    assert isinstance(p, Point)
    assert p.rank == 4
    assert p.extent == ext
    assert p["hosts"] == 1 and p["gpus"] == 1
    assert dict(p) == {"hosts": 1, "gpus": 1}
    assert list(p) == ["hosts", "gpus"]
    assert len(p) == 2
    assert repr(p) == "{'hosts': 1, 'gpus': 1}"
    with pytest.raises(KeyError):
        p["cpus"]


def test_point_equality(ext):
    assert ext.point(5) == ext.point(5)
    assert ext.point(5) != ext.point(4)
    assert ext.point(5) == {"hosts": 1, "gpus": 2}
    assert hash(ext.point(5)) == hash(Extent(["hosts", "gpus"], [2, 3]).point(5))
    # The same rank in another extent is another point.
    assert ext.point(1) != Extent(["gpus"], [6]).point(1)


def test_point_of_a_scalar_extent():
    p = Extent([], []).point(0)
    assert p.rank == 0 and dict(p) == {} and len(p) == 0


# -- selectors ----------------------------------------------------------------

def test_selectors_ints_and_negative_ints(ext):
    assert selectors(ext, {"gpus": 2}) == [("gpus", ("index", 2))]
    assert selectors(ext, {"gpus": -1}) == [("gpus", ("index", 2))]
    assert selectors(ext, {"gpus": -3}) == [("gpus", ("index", 0))]
    assert selectors(ext, {"hosts": 0, "gpus": 1}) == [("hosts", ("index", 0)), ("gpus", ("index", 1))]


def test_selectors_slices_with_steps_and_clamping(ext):
    assert selectors(ext, {"gpus": slice(0, 2)}) == [("gpus", ("range", 0, 2, 1))]
    assert selectors(ext, {"gpus": slice(None, None, 2)}) == [("gpus", ("range", 0, 3, 2))]
    assert selectors(ext, {"gpus": slice(1, None)}) == [("gpus", ("range", 1, 3, 1))]
    assert selectors(ext, {"gpus": slice(-2, None)}) == [("gpus", ("range", 1, 3, 1))]
    # Clamped as Python clamps a list slice.
    assert selectors(ext, {"gpus": slice(0, 100)}) == [("gpus", ("range", 0, 3, 1))]
    assert selectors(ext, {"gpus": slice(-100, 2)}) == [("gpus", ("range", 0, 2, 1))]
    assert selectors(ext, {"gpus": slice(5, 10)}) == [("gpus", ("range", 3, 3, 1))]
    # An empty range never has its stop before its start.
    assert selectors(ext, {"gpus": slice(2, 1)}) == [("gpus", ("range", 2, 2, 1))]


def test_selectors_errors(ext):
    with pytest.raises(ValueError, match="no dimension 'cpus'"):
        selectors(ext, {"cpus": 0})
    with pytest.raises(IndexError, match="out of range"):
        selectors(ext, {"gpus": 3})
    with pytest.raises(IndexError, match="out of range"):
        selectors(ext, {"gpus": -4})
    with pytest.raises(TypeError, match="bool"):
        selectors(ext, {"gpus": True})
    with pytest.raises(TypeError, match="str"):
        selectors(ext, {"gpus": "1"})
    with pytest.raises(TypeError):
        selectors(ext, {"gpus": 1.0})
    with pytest.raises(ValueError, match="positive step"):
        selectors(ext, {"gpus": slice(None, None, -1)})
    with pytest.raises(ValueError):
        selectors(ext, {"gpus": slice(None, None, 0)})


def test_selectors_match_python_slicing(ext):
    ranks = list(range(ext["gpus"]))
    for start in (None, -5, -1, 0, 1, 2, 3, 7):
        for stop in (None, -5, -1, 0, 1, 2, 3, 7):
            for step in (None, 1, 2, 3):
                sel = slice(start, stop, step)
                (_, (kind, a, b, c)), = selectors(ext, {"gpus": sel})
                assert kind == "range"
                assert list(range(a, b, c)) == ranks[sel], sel


# -- sliced -----------------------------------------------------------------

def test_sliced_index_drops_the_dimension(ext):
    sub, parent = sliced(ext, selectors(ext, {"gpus": 1}))
    assert sub == Extent(["hosts"], [2])
    assert parent == [1, 4]
    sub, parent = sliced(ext, selectors(ext, {"hosts": -1}))
    assert sub == Extent(["gpus"], [3])
    assert parent == [3, 4, 5]


def test_sliced_range_keeps_the_dimension(ext):
    sub, parent = sliced(ext, selectors(ext, {"gpus": slice(None, None, 2)}))
    assert sub == Extent(["hosts", "gpus"], [2, 2])
    assert parent == [0, 2, 3, 5]
    sub, parent = sliced(ext, selectors(ext, {"hosts": slice(1, 2), "gpus": slice(1, 3)}))
    assert sub == Extent(["hosts", "gpus"], [1, 2])
    assert parent == [4, 5]


def test_sliced_to_one_point_and_to_nothing(ext):
    sub, parent = sliced(ext, selectors(ext, {"hosts": 1, "gpus": 2}))
    assert sub == Extent([], []) and parent == [5]
    sub, parent = sliced(ext, selectors(ext, {"gpus": slice(3, None)}))
    assert sub == Extent(["hosts", "gpus"], [2, 0]) and parent == []


def test_sliced_without_selectors_is_the_identity(ext):
    sub, parent = sliced(ext, [])
    assert sub == ext and parent == list(range(6))


# -- ValueMesh --------------------------------------------------------------

@pytest.fixture
def vm(ext):
    return ValueMesh(ext, ["a", "b", "c", "d", "e", "f"])


def test_value_mesh_needs_one_value_per_point(ext):
    with pytest.raises(ValueError):
        ValueMesh(ext, [1, 2, 3])


def test_value_mesh_items_and_values(vm, ext):
    assert vm.values() == ["a", "b", "c", "d", "e", "f"]
    items = vm.items()
    assert [dict(p) for p, _ in items] == [
        {"hosts": 0, "gpus": 0}, {"hosts": 0, "gpus": 1}, {"hosts": 0, "gpus": 2},
        {"hosts": 1, "gpus": 0}, {"hosts": 1, "gpus": 1}, {"hosts": 1, "gpus": 2}]
    assert [p.rank for p, _ in items] == list(range(6))
    assert [v for _, v in items] == vm.values()
    assert len(vm) == 6
    assert list(vm) == [ext.point(r) for r in range(6)]
    assert vm.extent == ext
    # values() is a copy.
    vm.values().append("z")
    assert len(vm.values()) == 6


def test_value_mesh_item(vm):
    assert vm.item(hosts=1, gpus=0) == "d"
    assert vm.item(hosts=-1, gpus=-1) == "f"
    with pytest.raises(KeyError, match="name every dimension"):
        vm.item(hosts=1)
    with pytest.raises(KeyError):
        vm.item()
    with pytest.raises(IndexError):
        vm.item(hosts=2, gpus=0)


def test_value_mesh_item_of_one_value():
    one = ValueMesh(Extent(["gpus"], [1]), [42])
    assert one.item() == 42
    assert one.item(gpus=0) == 42
    assert ValueMesh(Extent([], []), ["x"]).item() == "x"


def test_value_mesh_getitem(vm, ext):
    assert vm[0] == "a" and vm[5] == "f"
    assert vm[ext.point(4)] == "e"
    assert vm[{"hosts": 0, "gpus": 2}] == "c"
    for point, value in vm.items():
        assert vm[point] == value
    with pytest.raises(KeyError):
        vm["gpus"]


def test_value_mesh_slice(vm):
    row = vm.slice(hosts=1)
    assert row.extent == {"gpus": 3}
    assert row.values() == ["d", "e", "f"]
    assert row.item(gpus=2) == "f"
    col = vm.slice(gpus=slice(0, 3, 2))
    assert col.extent == Extent(["hosts", "gpus"], [2, 2])
    assert col.values() == ["a", "c", "d", "f"]
    assert col.item(hosts=1, gpus=1) == "f"
    assert vm.slice(hosts=0, gpus=1).values() == ["b"]
    assert vm.slice(hosts=0, gpus=1).item() == "b"
    assert vm.slice(gpus=slice(5, 9)).values() == []
    with pytest.raises(ValueError):
        vm.slice(cpus=0)


def test_value_mesh_slice_by_a_point(vm):
    # ``mesh.slice(**point)``: a point picks its position out of a mesh
    # shaped alike.
    other = ValueMesh(vm.extent, list(range(6)))
    for point, value in other.items():
        assert vm.slice(**point).item() == vm.values()[value]


def test_value_mesh_equality(vm, ext):
    assert vm == ValueMesh(Extent(["hosts", "gpus"], [2, 3]), list("abcdef"))
    assert vm != ValueMesh(ext, list("abcdeF"))
    assert vm != ValueMesh(Extent(["gpus", "hosts"], [3, 2]), list("abcdef"))
    assert vm != list("abcdef")


def test_value_mesh_repr(vm):
    assert repr(ValueMesh(Extent(["gpus"], [2]), ["a", 1])) == (
        "ValueMesh({'gpus': 2}: {{'gpus': 0}: 'a', {'gpus': 1}: 1})")
    assert repr(vm.slice(hosts=0, gpus=0)) == "ValueMesh('a')"
    assert repr(vm).startswith("ValueMesh({'hosts': 2, 'gpus': 3}: {{'hosts': 0, 'gpus': 0}: 'a', ")

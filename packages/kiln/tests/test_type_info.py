"""dtype facts, constants, predicates and small tensor utilities against PyTorch: ``finfo``/``iinfo`` for
every dtype, ``pi``/``e``/``inf``/``nan``/``newaxis``, ``typename``, ``is_nonzero``, ``is_same_size``,
``is_signed``, ``is_inference``, ``get_device`` (and their ``Tensor`` methods), ``fill``/``fill_``/``zero_``/
``detach``/``detach_``/``index_put_`` at the top level, ``Tensor.type_as``, ``apply_`` and ``map_``, and
``set_printoptions``."""

# ruff: noqa: B023 - lambdas made inside loops are called within the same iteration

from __future__ import annotations

import inspect
import math

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

# ---------------------------------------------------------------------------------------- finfo / iinfo

FLOATS = (kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64)
INTS = (kiln.uint8, kiln.int8, kiln.int16, kiln.int32, kiln.int64)


@pytest.mark.parametrize("dtype", FLOATS, ids=U.dtype_id)
def test_finfo_matches_torch(dtype):
    k, t = kiln.finfo(dtype), torch.finfo(U.K2T[dtype])
    for attr in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution", "dtype"):
        assert getattr(k, attr) == getattr(t, attr), attr
        assert type(getattr(k, attr)) is type(getattr(t, attr)), attr
    assert repr(k) == repr(t) and str(k) == str(t)
    assert k == kiln.finfo(dtype) and k != kiln.finfo(kiln.float64 if dtype is not kiln.float64 else kiln.float32)


@pytest.mark.parametrize("dtype", INTS, ids=U.dtype_id)
def test_iinfo_matches_torch(dtype):
    k, t = kiln.iinfo(dtype), torch.iinfo(U.K2T[dtype])
    for attr in ("bits", "max", "min", "dtype"):
        assert getattr(k, attr) == getattr(t, attr) and type(getattr(k, attr)) is type(getattr(t, attr)), attr
    assert repr(k) == repr(t)
    assert k == kiln.iinfo(type=dtype)


def test_finfo_default_dtype(default_dtype):
    assert kiln.finfo() == kiln.finfo(kiln.float32) and kiln.finfo().dtype == torch.finfo().dtype
    default_dtype(kiln.float64)
    assert kiln.finfo().dtype == torch.finfo().dtype == "float64"


def test_info_errors_and_hashing():
    U.assert_same_error(lambda: kiln.finfo(kiln.int32), lambda: torch.finfo(torch.int32))
    U.assert_same_error(lambda: kiln.finfo(kiln.bool), lambda: torch.finfo(torch.bool))
    U.assert_same_error(lambda: kiln.iinfo(kiln.float32), lambda: torch.iinfo(torch.float32))
    U.assert_same_error(lambda: kiln.iinfo(kiln.bool), lambda: torch.iinfo(torch.bool))
    U.assert_same_error(
        lambda: kiln.finfo("float32"), lambda: torch.finfo("float32"), message="must be kiln.dtype, not str"
    )
    with pytest.raises(TypeError):
        kiln.iinfo()
    with pytest.raises(TypeError):
        torch.iinfo()
    for lib, fi in ((kiln, kiln.finfo()), (torch, torch.finfo())):
        with pytest.raises(TypeError):
            hash(fi)
        assert lib.finfo(lib.float16).max == 65504.0


def test_constants():
    for name in ("pi", "e", "inf"):
        assert getattr(kiln, name) == getattr(torch, name) and type(getattr(kiln, name)) is float
    assert math.isnan(kiln.nan) and kiln.newaxis is None is torch.newaxis
    x = kiln.arange(3)
    assert x[:, kiln.newaxis].shape == (3, 1)


# ---------------------------------------------------------------------------------------- predicates


class _Plain:
    pass


@pytest.mark.parametrize(
    "obj",
    [1, 2.5, None, int, "s", [1], _Plain, _Plain(), np.zeros(2), np.float32(1), math, len, _Plain.__init__],
    ids=lambda o: repr(o)[:20],
)
def test_typename_of_non_tensors_matches_torch(obj):
    assert kiln.typename(obj) == torch.typename(obj)


@pytest.mark.parametrize("dtype", U.ALL_DTYPES, ids=U.dtype_id)
def test_typename_of_tensors(dtype):
    assert kiln.typename(kiln.zeros(2, dtype=dtype)) == U.kiln_message(
        torch.typename(torch.zeros(2, dtype=U.K2T[dtype]))
    )


@pytest.mark.parametrize("dtype", U.ALL_DTYPES, ids=U.dtype_id)
def test_is_signed_matches_torch(dtype):
    k, t = kiln.zeros(2, dtype=dtype), torch.zeros(2, dtype=U.K2T[dtype])
    assert kiln.is_signed(k) == torch.is_signed(t) == k.is_signed() == t.is_signed()


@pytest.mark.parametrize(
    "values",
    [[0.0], [1.0], 0.0, -2, True, False, [float("nan")], [[0]], [], [1, 2], [[1.0, 0.0]]],
    ids=repr,
)
def test_is_nonzero_matches_torch(values):
    k, t = kiln.tensor(values), torch.tensor(values)
    try:
        expected = torch.is_nonzero(t)
    except RuntimeError:
        U.assert_same_error(lambda: kiln.is_nonzero(k), lambda: torch.is_nonzero(t))
        U.assert_same_error(lambda: k.is_nonzero(), lambda: t.is_nonzero())
        return
    assert kiln.is_nonzero(k) is expected and k.is_nonzero() is expected


def test_is_same_size_get_device_is_inference():
    a, b = kiln.zeros(2, 3), kiln.zeros(2, 3, dtype=kiln.int8)
    assert kiln.is_same_size(a, b) and a.is_same_size(b)
    assert not kiln.is_same_size(a, a.t()) and not kiln.is_same_size(kiln.zeros(2), kiln.zeros(2, 1))
    assert kiln.get_device(a) == torch.get_device(torch.zeros(2)) == a.get_device() == -1
    assert not kiln.is_inference(a)
    with kiln.inference_mode():
        assert kiln.is_inference(kiln.zeros(2))
    for call in (
        lambda L: L.is_same_size(L.ones(2), 2),
        lambda L: L.is_nonzero(1),
        lambda L: L.is_signed(1),
        lambda L: L.get_device(1),
        lambda L: L.is_inference(1),
    ):
        U.assert_same_error(lambda: call(kiln), lambda: call(torch))


# ---------------------------------------------------------------------------------------- fill, zero_, detach, index_put_


@pytest.mark.parametrize("layout", U.LAYOUTS)
@pytest.mark.parametrize("dtype", (kiln.float32, kiln.int64, kiln.bool, kiln.uint8), ids=U.dtype_id)
def test_fill_and_zero_match_torch(dtype, layout):
    for value in (3, -1, 2.5, True, 0):
        p = U.make_pair((3, 4), dtype, layout="contiguous" if layout == "expanded" else layout, seed=1)
        U.check_op(lambda L, x: L.fill(x, value), p, grad=False)
        U.check_op(lambda L, x: L.fill_(x.clone(), value), p, grad=False)
        U.check_op(lambda L, x: L.zero_(x.clone()), p, grad=False)
    U.check_op(lambda L, x: L.fill(x, L.tensor(2)), p, grad=False)


def test_fill_gradients_and_errors():
    kx, tx = U.both(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    kv, tv = U.both(np.array(2.0), requires_grad=True)
    k, t = kiln.fill(kx * 1, kv), torch.fill(tx * 1, tv)
    U.assert_close(k, t)
    U.check_backward(k, t, [(kx, tx), (kv, tv)])
    U.assert_same_error(
        lambda: kiln.fill(kiln.ones(2), kiln.tensor([3.0])), lambda: torch.fill(torch.ones(2), torch.tensor([3.0]))
    )
    U.assert_same_error(
        lambda: kiln.fill_(kiln.ones(2, requires_grad=True), 1.0),
        lambda: torch.fill_(torch.ones(2, requires_grad=True), 1.0),
    )
    U.assert_same_error(
        lambda: kiln.zero_(kiln.ones(2, requires_grad=True)), lambda: torch.zero_(torch.ones(2, requires_grad=True))
    )


def test_detach_and_index_put_at_top_level():
    x = kiln.ones(3, requires_grad=True)
    y = x * 2
    d = kiln.detach(y)
    assert not d.requires_grad and d.data_ptr() == y.data_ptr()
    assert kiln.detach_(y) is y and not y.requires_grad and y.grad_fn is None
    k = kiln.index_put_(kiln.zeros(3), (kiln.tensor([1]),), kiln.tensor(5.0))
    t = torch.index_put_(torch.zeros(3), (torch.tensor([1]),), torch.tensor(5.0))
    U.assert_close(k, t)
    U.assert_same_error(lambda: kiln.detach(1), lambda: torch.detach(1), message="must be Tensor, not int")


# ---------------------------------------------------------------------------------------- type_as, apply_, map_


@pytest.mark.parametrize("dtype", U.ALL_DTYPES, ids=U.dtype_id)
def test_type_as_matches_torch(dtype):
    p = U.make_pair((2, 3), kiln.float64, layout="transposed")
    U.check_op(lambda L, x: x.type_as(L.zeros(1, dtype=getattr(L, dtype.name))), p, grad=False)
    same = p.k.type_as(kiln.zeros(1, dtype=kiln.float64))
    assert same is p.k  # nothing to convert: self, as torch's .to
    U.assert_same_error(lambda: p.k.type_as(1), lambda: p.t.type_as(1))


def test_type_as_gradient():
    p = U.make_pair((3,), kiln.float32, requires_grad=True)
    U.check_op(lambda L, x: x.type_as(L.zeros(1, dtype=L.float64)), p)


@pytest.mark.parametrize("layout", ("contiguous", "transposed", "strided"))
@pytest.mark.parametrize("dtype", (kiln.float32, kiln.int64, kiln.bool, kiln.uint8), ids=U.dtype_id)
def test_apply_and_map_match_torch(dtype, layout):
    p = U.make_pair((3, 4), dtype, layout=layout, seed=2)
    q = U.make_pair((4,), dtype, seed=3)
    for fn in (lambda v: v * 2, lambda v: v / 3, lambda v: -v, lambda v: 7):
        U.check_op(lambda L, x: x.clone().apply_(fn), p, grad=False)
    U.check_op(lambda L, x, y: x.clone().map_(y, lambda a, b: a + b), p, q, grad=False)
    # written in place through the view: the leaves under it change as torch's do
    p.k.apply_(lambda v: 1)
    p.t.apply_(lambda v: 1)
    U.assert_close(p.k_leaf, p.t_leaf)


def test_apply_and_map_errors_match_torch():
    for call in (
        lambda L: L.ones(2, requires_grad=True).apply_(lambda v: v),
        lambda L: L.ones(2).apply_(1),
        lambda L: L.ones(2).apply_(lambda v: "a"),
        lambda L: L.ones(2, requires_grad=True).map_(L.ones(2), lambda a, b: a),
        lambda L: L.ones(2).map_(L.ones(2, requires_grad=True), lambda a, b: a),
        lambda L: L.ones(2).map_(L.ones(3), lambda a, b: a),
        lambda L: L.ones(2).map_(1, lambda a, b: a),
        lambda L: L.ones(2).map_(L.ones(2, dtype=L.int64), lambda a, b: a),
    ):
        U.assert_same_error(lambda: call(kiln), lambda: call(torch))
    x = kiln.ones(2)
    version = x._version
    assert x.apply_(lambda v: v + 1) is x and x.tolist() == [2.0, 2.0] and x._version == version + 1


# ---------------------------------------------------------------------------------------- printing


def _shape_of(fn) -> list[tuple]:
    """A signature's parameter names, kinds and defaults (annotations aside)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.fixture
def printoptions():
    yield
    kiln.set_printoptions(profile="default")
    torch.set_printoptions(profile="default")


PRINT_CASES = [
    ({"precision": 2}, lambda L: L.tensor([1.23456, 2.5])),
    ({"precision": 6}, lambda L: L.tensor([1.23456789, -2.5])),
    ({"sci_mode": True}, lambda L: L.tensor([1.23456, 2.5])),
    ({"sci_mode": True}, lambda L: L.tensor([1.0, 2.0])),
    ({"sci_mode": False}, lambda L: L.tensor([1e-8, 1e9])),
    ({"sci_mode": False}, lambda L: L.tensor([1e9, 2.0])),
    ({"profile": "short"}, lambda L: L.arange(2000.0)),
    ({"profile": "short"}, lambda L: L.tensor([1.23456])),
    ({"profile": "full"}, lambda L: L.arange(1010.0)),
    ({"profile": "full"}, lambda L: L.arange(1010)),
    ({"linewidth": 40}, lambda L: L.arange(20.0)),
    ({"linewidth": 40}, lambda L: L.arange(20.0, dtype=L.float64)),
    ({"threshold": 5, "edgeitems": 1}, lambda L: L.arange(20.0).reshape(4, 5)),
    ({"threshold": 5, "edgeitems": 2}, lambda L: L.arange(60).reshape(3, 4, 5)),
    ({"profile": "short", "precision": 5}, lambda L: L.tensor([1.123456789])),
    ({"profile": "nonsense"}, lambda L: L.tensor([1.123456789])),
    ({"precision": 1}, lambda L: L.tensor([[0.25, -1.75], [3.5, 100.0]], requires_grad=True)),
]


@pytest.mark.parametrize("i", range(len(PRINT_CASES)))
def test_set_printoptions_prints_as_torch(i, printoptions):
    options, make = PRINT_CASES[i]
    kiln.set_printoptions(**options)
    torch.set_printoptions(**options)
    assert repr(make(kiln)) == U.kiln_message(repr(make(torch)))


def test_set_printoptions_signature_and_reset(printoptions):
    assert _shape_of(kiln.set_printoptions) == _shape_of(torch.set_printoptions)
    kiln.set_printoptions(precision=2, sci_mode=True)
    kiln.set_printoptions(profile="default")
    assert repr(kiln.tensor([1.23456])) == "tensor([1.2346])"


# ---------------------------------------------------------------------------------------- signatures


def test_signatures_match_torch_where_introspectable():
    assert _shape_of(kiln.typename) == _shape_of(torch.typename)
    params = list(inspect.signature(kiln.finfo).parameters.values())
    assert [(p.name, p.default) for p in params] == [("type", None)]
    assert [p.name for p in inspect.signature(kiln.iinfo).parameters.values()] == ["type"]
    schema_names = {
        name: ["input" if a.name == "self" else a.name for a in s.arguments]
        for name in ("is_nonzero", "is_same_size", "is_signed", "get_device", "is_inference", "zero_", "detach")
        for s in torch._C._jit_get_schemas_for_operator(f"aten::{name}")
        if not s.overload_name
    }
    for name, names in schema_names.items():
        assert list(inspect.signature(getattr(kiln, name)).parameters) == names, name
    assert list(inspect.signature(kiln.fill).parameters) == ["input", "value"]
    assert list(inspect.signature(kiln.index_put_).parameters) == ["input", "indices", "values", "accumulate"]
    assert list(inspect.signature(kiln.Tensor.map_).parameters) == ["self", "tensor", "callable"]
    assert list(inspect.signature(kiln.Tensor.apply_).parameters) == ["self", "callable"]


def test_module_load_matches_torch():
    for assign in (False, True):
        kp, tp = kiln.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
        kv, tv = kiln.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0])
        with kiln.no_grad():
            k = kp.module_load(kv, assign=assign)
        with torch.no_grad():
            t = tp.module_load(tv, assign=assign)
        U.assert_close(k, t)
        U.assert_close(kp, tp)
        assert k is not kp and k is not kv and not k.requires_grad
    assert list(inspect.signature(kiln.Tensor.module_load).parameters) == ["self", "other", "assign"]

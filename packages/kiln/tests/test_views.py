"""Shape and view ops against PyTorch: results, strides, storage offsets, contiguity, aliasing
(writes through views reach the base and vice versa, exactly when torch's do), version counters,
gradients, basic ``__getitem__`` and ``__setitem__``."""

# ruff: noqa: B023 - lambdas made inside loops are called within the same iteration

from __future__ import annotations

import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kiln


def check_view(fn, x: U.Pair, *, grad: bool = True, strides: bool = True, seed: int = 0):
    """Compare ``fn(lib, x)`` with torch: values, shape, dtype, strides, offset, contiguity, gradient,
    then aliasing in both directions (base -> result, result -> base) and the shared version counter.

    ``strides=False`` skips strides, offset and contiguity (for copies, whose layout is tested apart).
    Strides and offsets of empty results are not compared (an implementation detail)."""
    k, t = U.check_op(fn, x, grad=grad and x.t_leaf.requires_grad, check_stride=strides, seed=seed)
    if t is None:  # torch refused; kiln refused too
        return None, None
    if not isinstance(t, torch.Tensor):
        return k, t
    if strides and t.numel() > 0:
        assert k.storage_offset() == t.storage_offset(), (
            f"storage_offset {k.storage_offset()} != torch's {t.storage_offset()}"
        )
    if strides:
        assert k.is_contiguous() == t.is_contiguous(), (
            f"is_contiguous {k.is_contiguous()} != torch's {t.is_contiguous()}"
        )
    # base -> result: a view sees writes into its base, a copy does not
    with torch.no_grad():
        x.t_leaf.add_(100)
    with kiln.no_grad():
        x.k_leaf.add_(100)
    U.assert_close(k, t, msg="after writing into the base: ")
    assert k._version == t._version, f"result version {k._version} != torch's {t._version}"
    # result -> base
    if t.numel() and 0 not in t.stride():
        with torch.no_grad():
            t.mul_(-1)
        with kiln.no_grad():
            k.mul_(-1)
        U.assert_close(x.k_leaf, x.t_leaf, msg="base after writing into the result: ")
        assert x.k_leaf._version == x.t_leaf._version, (
            f"base version {x.k_leaf._version} != torch's {x.t_leaf._version}"
        )
        assert k._version == t._version
    return k, t


# ---------------------------------------------------------------------------------------- view / reshape

VIEW_CASES = [
    # (base shape, layout, target shape)
    ((2, 3, 4), "contiguous", (6, 4)),
    ((2, 3, 4), "contiguous", (-1,)),
    ((2, 3, 4), "contiguous", (4, -1, 2)),
    ((2, 3, 4), "contiguous", (1, 24, 1)),
    ((2, 3, 4), "transposed", (-1,)),
    ((2, 3, 4), "transposed", (4, 6)),
    ((2, 3, 4), "transposed", (2, 2, 3, 2)),
    ((4, 6), "strided", (24,)),
    ((4, 6), "strided", (4, 2, 3)),
    ((4, 6), "strided", (2, 2, 6)),
    ((3, 4), "expanded", (12,)),
    ((3, 4), "expanded", (3, 4, 1)),
    ((3, 4), "expanded", (1, 3, 2, 2)),
    ((3, 1, 4), "transposed", (4, 3)),
    ((1, 5), "transposed", (5,)),
    ((0, 3), "contiguous", (3, 0)),
    ((0, 3), "contiguous", (-1, 3)),
    ((0, 3), "strided", (0,)),
    ((), "contiguous", (1, 1)),
    ((), "contiguous", (-1,)),
    ((1,), "contiguous", ()),
    ((2, 3), "contiguous", (5,)),  # invalid size
    ((2, 3), "contiguous", (-1, -1)),  # two inferred dims
    ((2, 3), "contiguous", (-1, 4)),  # not divisible
    ((2, 0), "contiguous", (-1, 0)),  # ambiguous -1
]


@pytest.mark.parametrize("case", VIEW_CASES, ids=[f"{c[0]}-{c[1]}-to-{c[2]}" for c in VIEW_CASES])
def test_view(case):
    """view succeeds exactly when torch's does (same strides) and raises torch's error otherwise."""
    shape, layout, target = case
    x = U.make_pair(shape, kiln.float32, layout=layout, seed=1, requires_grad=True)
    try:
        x.t.view(target)
    except RuntimeError as exc:
        U.assert_same_error(lambda: x.k.view(target), lambda: x.t.view(target))
        assert "view" in str(exc) or "shape" in str(exc) or "dimension" in str(exc)
        return
    check_view(lambda L, a: a.view(target), x)
    if target:  # torch's view() needs at least one size
        check_view(
            lambda L, a: a.view(*target), U.make_pair(shape, kiln.float32, layout=layout, seed=1, requires_grad=True)
        )
    check_view(
        lambda L, a: L.reshape(a, target), U.make_pair(shape, kiln.float32, layout=layout, seed=1, requires_grad=True)
    )


@pytest.mark.parametrize("case", VIEW_CASES, ids=[f"{c[0]}-{c[1]}-to-{c[2]}" for c in VIEW_CASES])
def test_reshape_views_exactly_when_torch_does(case):
    """reshape aliases its input when a view is possible and copies otherwise, like torch."""
    shape, layout, target = case
    x = U.make_pair(shape, kiln.float32, layout=layout, seed=2, requires_grad=True)
    check_view(lambda L, a: a.reshape(target), x)
    x = U.make_pair(shape, kiln.float32, layout=layout, seed=2, requires_grad=True)
    check_view(lambda L, a: a.reshape(*target) if target else a.reshape(()), x)


BAD_SIZES = [(2.0, 4), (True, 8), ((2.0, 4),), ([2, 4.0],), ("ab",), (np.float64(2.0), 4), (None,)]


@pytest.mark.parametrize("args", BAD_SIZES, ids=repr)
@pytest.mark.parametrize("method", ["view", "reshape", "expand"])
def test_sizes_that_are_not_integers_raise_type_error_as_torch(method, args):
    """A float, a bool, a string or None among the sizes is a TypeError, never a size (2.0 was once 2)."""
    for lib in (kiln, torch):
        t = lib.ones(1, 8) if method == "expand" else lib.ones(8)
        with pytest.raises(TypeError):
            getattr(t, method)(*args)
    with pytest.raises(TypeError, match="must be tuple of ints"):
        getattr(kiln.ones(1, 8) if method == "expand" else kiln.ones(8), method)(*args)


def test_sizes_with_index_are_sizes_as_in_torch():
    """NumPy ints and 0-d integer tensors are sizes (they have ``__index__``); no size at all is a TypeError."""
    for lib in (kiln, torch):
        t = lib.ones(8)
        assert tuple(t.view(np.int64(2), 4).shape) == (2, 4)
        assert tuple(t.view(lib.tensor(8)).shape) == (8,)
        assert tuple(t.reshape([np.int32(4), -1]).shape) == (4, 2)
        with pytest.raises(TypeError):
            t.view()
        with pytest.raises(TypeError):
            lib.ones(()).view()


def test_view_as_reshape_as_flatten_ravel():
    for layout in U.LAYOUTS:
        x = U.make_pair((2, 3, 4), kiln.float64, layout=layout, seed=3, requires_grad=True)
        other = U.make_pair((6, 4), kiln.float64, seed=4)
        check_view(lambda L, a: a.reshape_as(other.t if L is torch else other.k), x)
        for fn in (
            lambda L, a: a.flatten(),
            lambda L, a: L.flatten(a, 1),
            lambda L, a: a.flatten(0, 1),
            lambda L, a: a.flatten(-2, -1),
            lambda L, a: a.flatten(1, 1),
            lambda L, a: a.ravel(),
            lambda L, a: L.ravel(a),
        ):
            check_view(fn, U.make_pair((2, 3, 4), kiln.float64, layout=layout, seed=3, requires_grad=True))
    z = U.make_pair((), kiln.float32, seed=5, requires_grad=True)
    check_view(lambda L, a: a.flatten(), z)
    check_view(lambda L, a: a.ravel(), U.make_pair((), kiln.float32, seed=5, requires_grad=True))


# ---------------------------------------------------------------------------------------- permute, transpose, t, T, mT

PERMUTE_FNS = {
    "permute": lambda L, a: a.permute(2, 0, 1),
    "permute_tuple": lambda L, a: a.permute((1, 2, 0)),
    "permute_neg": lambda L, a: L.permute(a, (-1, -3, -2)),
    "transpose": lambda L, a: a.transpose(0, 2),
    "transpose_neg": lambda L, a: L.transpose(a, -1, -2),
    "transpose_same": lambda L, a: a.transpose(1, 1),
    "swapaxes": lambda L, a: L.swapaxes(a, 0, 1),
    "swapdims": lambda L, a: a.swapdims(2, 1),
    "mT": lambda L, a: a.mT,
    "T": lambda L, a: a.T,
}


@pytest.mark.parametrize("name", list(PERMUTE_FNS))
@pytest.mark.parametrize("layout", U.LAYOUTS)
def test_permute_family(name, layout):
    x = U.make_pair((2, 3, 4), kiln.float32, layout=layout, seed=6, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates .T on non-2-D tensors
        check_view(PERMUTE_FNS[name], x)


@pytest.mark.parametrize("shape", [(3, 4), (4,), (), (0, 2), (1, 3)])
def test_t_and_T_on_small_ranks(shape):
    for fn in (lambda L, a: a.t(), lambda L, a: L.t(a), lambda L, a: a.T, lambda L, a: a.mT):
        x = U.make_pair(shape, kiln.float32, layout="strided", seed=7, requires_grad=True)
        check_view(fn, x)


def test_T_on_3d_matches_torch():
    """torch still reverses all dims for ``.T`` on N-D tensors (with a deprecation warning)."""
    x = U.make_pair((2, 3, 4), kiln.float32, seed=8, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_view(lambda L, a: a.T, x)


# ---------------------------------------------------------------------------------------- expand / broadcast_to

EXPAND_CASES = [
    ((3, 1), (3, 4)),
    ((3, 1), (-1, 4)),
    ((1, 4), (2, 3, 4)),
    ((1,), (5,)),
    ((), (2, 3)),
    ((3, 1), (2, 3, 0)),
    ((2, 1, 1), (2, 3, 2)),
    ((3, 4), (3, 4)),
    ((3, 4), (2, -1, 4)),
    ((3, 2), (3, 4)),  # error: non-singleton
    ((3, 1), (4,)),  # error: too few sizes
    ((3, 1), (-1, 3, 1)),  # error: -1 in a new leading dim
]


@pytest.mark.parametrize("case", EXPAND_CASES, ids=[f"{a}->{b}" for a, b in EXPAND_CASES])
def test_expand_broadcast_to(case):
    shape, target = case
    for layout in ("contiguous", "transposed", "strided"):
        for fn in (
            lambda L, a: a.expand(*target) if target else a.expand(()),
            lambda L, a: a.expand(target),
            lambda L, a: L.broadcast_to(a, target),
            lambda L, a: a.broadcast_to(target),
        ):
            check_view(fn, U.make_pair(shape, kiln.float32, layout=layout, seed=9, requires_grad=True))


def test_expand_as():
    x = U.make_pair((3, 1), kiln.float32, seed=10, requires_grad=True)
    other = U.make_pair((2, 3, 5), kiln.float32, seed=11)
    check_view(lambda L, a: a.expand_as(other.t if L is torch else other.k), x)


# ---------------------------------------------------------------------------------------- squeeze / unsqueeze

SQUEEZE_FNS = {
    "squeeze()": lambda L, a: a.squeeze(),
    "squeeze(0)": lambda L, a: a.squeeze(0),
    "squeeze(1)": lambda L, a: L.squeeze(a, 1),
    "squeeze(-1)": lambda L, a: a.squeeze(-1),
    "squeeze((0, 2))": lambda L, a: a.squeeze((0, 2)),
    "squeeze((1, -1))": lambda L, a: L.squeeze(a, (1, -1)),
    "squeeze(dim=3)": lambda L, a: a.squeeze(dim=3),
    "squeeze(5) (error)": lambda L, a: a.squeeze(5),
}


@pytest.mark.parametrize("name", list(SQUEEZE_FNS))
@pytest.mark.parametrize("layout", U.LAYOUTS)
def test_squeeze(name, layout):
    x = U.make_pair((1, 3, 1, 2), kiln.float32, layout=layout, seed=12, requires_grad=True)
    check_view(SQUEEZE_FNS[name], x)


@pytest.mark.parametrize("shape", [(), (1,), (0,), (1, 0, 1)])
def test_squeeze_small(shape):
    for fn in (lambda L, a: a.squeeze(), lambda L, a: a.squeeze(0), lambda L, a: a.squeeze(-1)):
        check_view(fn, U.make_pair(shape, kiln.float32, seed=13, requires_grad=True))


@pytest.mark.parametrize("dim", [0, 1, 2, 3, -1, -2, -4, 4, -5])
@pytest.mark.parametrize("layout", U.LAYOUTS)
def test_unsqueeze(dim, layout):
    x = U.make_pair((2, 1, 3), kiln.float32, layout=layout, seed=14, requires_grad=True)
    check_view(lambda L, a: a.unsqueeze(dim), x)
    check_view(
        lambda L, a: L.unsqueeze(a, dim=dim),
        U.make_pair((2, 1, 3), kiln.float32, layout=layout, seed=14, requires_grad=True),
    )


def test_unsqueeze_zero_dim():
    for dim in (0, -1, 1):
        check_view(lambda L, a: a.unsqueeze(dim), U.make_pair((), kiln.float32, seed=15, requires_grad=True))


# ---------------------------------------------------------------------------------------- select / narrow / contiguous / clone

SELECT_NARROW = {
    "select(0, 1)": lambda L, a: a.select(0, 1),
    "select(-1, -2)": lambda L, a: L.select(a, -1, -2),
    "select(1, 2)": lambda L, a: a.select(1, 2),
    "select(1, 3) (error)": lambda L, a: a.select(1, 3),
    "select(3, 0) (error)": lambda L, a: a.select(3, 0),
    "narrow(0, 1, 1)": lambda L, a: a.narrow(0, 1, 1),
    "narrow(-1, 1, 2)": lambda L, a: L.narrow(a, -1, 1, 2),
    "narrow(1, -2, 2)": lambda L, a: a.narrow(1, -2, 2),
    "narrow(1, 0, 0)": lambda L, a: a.narrow(1, 0, 0),
    "narrow(2, 3, 2) (error)": lambda L, a: a.narrow(2, 3, 2),
}


@pytest.mark.parametrize("name", list(SELECT_NARROW))
@pytest.mark.parametrize("layout", U.LAYOUTS)
def test_select_narrow(name, layout):
    x = U.make_pair((2, 3, 4), kiln.float32, layout=layout, seed=16, requires_grad=True)
    check_view(SELECT_NARROW[name], x)


@pytest.mark.parametrize("layout", U.LAYOUTS)
def test_contiguous(layout):
    x = U.make_pair((2, 3, 4), kiln.float32, layout=layout, seed=17, requires_grad=True)
    k, t = check_view(lambda L, a: a.contiguous(), x)
    assert (k is x.k) == (t is x.t), "contiguous() returns self exactly when the input is already contiguous"
    y = U.make_pair((2, 3, 4), kiln.float32, layout=layout, seed=17, requires_grad=True)
    check_view(lambda L, a: L.contiguous(a) if L is kiln else a.contiguous(), y)


@pytest.mark.parametrize("layout", U.LAYOUTS)
def test_clone_is_a_copy(layout):
    x = U.make_pair((2, 3, 4), kiln.float32, layout=layout, seed=18, requires_grad=True)
    k, _ = check_view(lambda L, a: a.clone(), x, strides=False)
    assert k.data_ptr() != x.k.data_ptr()
    y = U.make_pair((2, 3, 4), kiln.float32, layout=layout, seed=18, requires_grad=True)
    check_view(lambda L, a: L.clone(a), y, strides=False)


@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_clone_preserves_strides_like_torch(layout):
    """torch's clone uses memory_format=torch.preserve_format: dense non-contiguous inputs keep their strides."""
    x = U.make_pair((2, 3, 4), kiln.float32, layout=layout, seed=18)
    U.check_op(lambda L, a: a.clone(), x, grad=False, check_stride=True)


# ---------------------------------------------------------------------------------------- __getitem__


@st.composite
def index_key(draw, shape):
    """A basic-indexing key for ``shape``: ints (negative too), slices with steps, None, one Ellipsis."""
    parts = []
    nd = len(shape)
    consumed = draw(st.integers(0, nd))
    for d in range(consumed):
        n = shape[d]
        kind = draw(st.sampled_from(["int", "slice", "slice", "full"]) if n > 0 else st.sampled_from(["slice", "full"]))
        if kind == "int":
            parts.append(draw(st.integers(-n, n - 1)))
        elif kind == "full":
            parts.append(slice(None))
        else:
            start = draw(st.one_of(st.none(), st.integers(-n - 2, n + 2)))
            stop = draw(st.one_of(st.none(), st.integers(-n - 2, n + 2)))
            step = draw(st.sampled_from([None, 1, 2, 3]))
            parts.append(slice(start, stop, step))
    for _ in range(draw(st.integers(0, 2))):
        parts.insert(draw(st.integers(0, len(parts))), None)
    if draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), Ellipsis)
    if len(parts) == 1 and draw(st.booleans()):
        return parts[0]
    return tuple(parts)


@given(data=st.data(), shape=U.shapes(max_dims=3, max_side=5), layout=U.layouts, seed=U.seeds)
def test_getitem_hypothesis(data, shape, layout, seed):
    key = data.draw(index_key(shape))
    x = U.make_pair(shape, kiln.float32, layout=layout, seed=seed, requires_grad=True)
    check_view(lambda L, a: a[key], x, seed=seed)


GETITEM_KEYS = [
    0,
    -1,
    2,
    slice(None),
    slice(1, None),
    slice(None, None, 2),
    slice(-3, -1),
    slice(5, 1),
    slice(None, 100),
    (0, 1),
    (-1, -1, -1),
    (slice(None), 1),
    (Ellipsis, 0),
    (0, Ellipsis),
    (None,),
    (None, 0, None),
    (Ellipsis, None),
    (slice(None, None, 3), Ellipsis, slice(1, None, 2)),
    Ellipsis,
    (),
    (1, slice(None), None, -2),
    (slice(0, 0),),
    (None, Ellipsis, None),
]


@pytest.mark.parametrize("key", GETITEM_KEYS, ids=repr)
def test_getitem_keys(key):
    for layout in U.LAYOUTS:
        x = U.make_pair((3, 4, 5), kiln.float64, layout=layout, seed=19, requires_grad=True)
        check_view(lambda L, a: a[key], x)


@pytest.mark.parametrize(
    "key",
    [3, -4, (0, 5), (1, 2, 7), (0, 0, 0, 0), slice(None, None, -1), slice(None, None, 0), 1.5],
    ids=repr,
)
def test_getitem_errors(key):
    x = U.make_pair((3, 4, 5), kiln.float32, seed=20)
    U.assert_same_error(lambda: x.k[key], lambda: x.t[key])


def test_getitem_with_integer_tensor_and_zero_dim():
    x = U.make_pair((3, 4), kiln.float32, seed=21, requires_grad=True)
    check_view(lambda L, a: a[L.tensor(1)], x)
    z = U.make_pair((), kiln.float32, seed=22, requires_grad=True)
    check_view(lambda L, a: a[None], z)
    check_view(lambda L, a: a[...], U.make_pair((), kiln.float32, seed=22, requires_grad=True))
    check_view(lambda L, a: a[()], U.make_pair((), kiln.float32, seed=22, requires_grad=True))


# ---------------------------------------------------------------------------------------- __setitem__


@st.composite
def setitem_case(draw):
    shape = draw(U.shapes(min_dims=1, max_dims=3, max_side=4))
    key = draw(index_key(shape))
    kind = draw(st.sampled_from(["scalar", "tensor", "0-d"]))
    return shape, key, kind


@given(
    case=setitem_case(),
    layout=st.sampled_from(["contiguous", "transposed", "strided"]),
    seed=U.seeds,
    dtype=st.sampled_from([kiln.float32, kiln.int64]),
)
def test_setitem_hypothesis(case, layout, seed, dtype):
    """``x[key] = value`` with scalars and broadcast tensors writes the same elements as torch."""
    shape, key, kind = case
    x = U.make_pair(shape, dtype, layout=layout, seed=seed)
    target = x.t[key]
    rng = U.rng_for(seed)
    if kind == "scalar":
        value_k = value_t = 7 if dtype is kiln.int64 else 2.5
    else:
        vshape = () if kind == "0-d" else tuple(target.shape)[rng.integers(0, len(target.shape) + 1) :]
        vshape = tuple(1 if rng.random() < 0.3 else s for s in vshape)
        v = U.make_pair(vshape, dtype, seed=seed + 1)
        value_k, value_t = v.k, v.t
    x.t[key] = value_t
    x.k[key] = value_k
    U.assert_close(x.k, x.t)
    U.assert_close(x.k_leaf, x.t_leaf)
    assert x.k._version == x.t._version


@pytest.mark.parametrize(
    "case",
    [
        ("float into int tensor (truncates)", kiln.int64, lambda L: 2.7),
        ("negative float into uint8", kiln.uint8, lambda L: 3.9),
        ("bool into float", kiln.float32, lambda L: True),
        ("int tensor into float", kiln.float32, lambda L: L.tensor([1, 2, 3, 4])),
        ("float64 tensor into float32", kiln.float32, lambda L: L.tensor([[0.1], [0.2], [0.3]], dtype=L.float64)),
        ("float tensor into int", kiln.int32, lambda L: L.tensor([1.9, -1.9, 2.5, 0.1])),
        ("float tensor into bool", kiln.bool, lambda L: L.tensor([0.0, 0.5, -1.0, 0.0])),
        ("0-d tensor", kiln.float32, lambda L: L.tensor(4.0)),
    ],
    ids=lambda c: c[0] if isinstance(c, tuple) else str(c),
)
def test_setitem_dtype_casting(case):
    _, dtype, value = case
    x = U.make_pair((3, 4), dtype, seed=23)
    for key in ((slice(None), slice(None)), (slice(None, None, 2),), (1,), (Ellipsis, slice(1, None, 2))):
        try:
            x.t[key] = value(torch)
        except RuntimeError:
            U.assert_same_error(lambda: x.k.__setitem__(key, value(kiln)), lambda: x.t.__setitem__(key, value(torch)))
            continue
        x.k[key] = value(kiln)
        U.assert_close(x.k, x.t)


def test_setitem_shape_mismatch_error():
    x = U.make_pair((3, 4), kiln.float32, seed=24)
    v = U.make_pair((3,), kiln.float32, seed=25)
    U.assert_same_error(lambda: x.k.__setitem__(slice(None), v.k), lambda: x.t.__setitem__(slice(None), v.t))


# ---------------------------------------------------------------------------------------- aliasing & versions


def test_views_write_through_both_ways():
    k, t = U.both(np.arange(12.0).reshape(3, 4))
    kv, tv = k[1], t[1]
    kw, tw = k.t()[::2], t.t()[::2]
    k[1, 2] = -1.0
    t[1, 2] = -1.0
    U.assert_close(kv, tv)
    kv.fill_(5.0)
    tv.fill_(5.0)
    U.assert_close(k, t)
    kw.mul_(10)
    tw.mul_(10)
    U.assert_close(k, t)
    U.assert_close(kv, tv)
    k.view(-1)[0] = 42.0
    t.view(-1)[0] = 42.0
    U.assert_close(kw, tw)
    k.unsqueeze(0).squeeze(0).transpose(0, 1)[3].zero_()
    t.unsqueeze(0).squeeze(0).transpose(0, 1)[3].zero_()
    U.assert_close(k, t)


def test_version_counter_shared_by_views():
    k, t = U.both(np.zeros((3, 4), np.float32))
    assert k._version == t._version == 0
    steps = [
        lambda x: x[0].add_(1),
        lambda x: x.mul_(2),
        lambda x: x.__setitem__(1, 3.0),
        lambda x: x.t().zero_(),
        lambda x: x.view(-1)[2:].fill_(1),
        lambda x: x[1:, ::2].copy_(x[:2, 1::2].clone()),
        lambda x: x.__iadd__(1),
        lambda x: x.__imul__(2),
        lambda x: x.neg_(),
        lambda x: x.exp_(),
    ]
    kv, tv = k[1], t[1]
    kd, td = k.detach(), t.detach()
    for i, step in enumerate(steps):
        step(k)
        step(t)
        assert k._version == t._version, f"after step {i}: base version {k._version} != torch's {t._version}"
        assert kv._version == tv._version == t._version, (
            f"after step {i}: view version {kv._version} != torch's {tv._version}"
        )
        assert kd._version == td._version, (
            f"after step {i}: detached alias version {kd._version} != torch's {td._version}"
        )
    U.assert_close(k, t)
    # out-of-place ops leave the version alone; views of a view share it too
    ka, ta = k + 1, t + 1
    assert ka._version == ta._version == 0
    kvv, tvv = kv[1:], tv[1:]
    kvv.add_(1)
    tvv.add_(1)
    assert k._version == t._version and kvv._version == tvv._version == t._version


@pytest.mark.parametrize("layout", U.LAYOUTS)
def test_strides_and_contiguity_of_layouts(layout):
    """The test harness' own layouts are laid out identically in both libraries."""
    for shape in ((2, 3, 4), (1, 5), (4,), (), (0, 3)):
        x = U.make_pair(shape, kiln.float32, layout=layout, seed=26)
        assert tuple(x.k.stride()) == tuple(x.t.stride()) or x.t.numel() == 0, (shape, x.k.stride(), x.t.stride())
        assert x.k.storage_offset() == x.t.storage_offset() or x.t.numel() == 0
        assert x.k.is_contiguous() == x.t.is_contiguous(), (shape, layout)
        U.assert_close(x.k, x.t)

"""Reductions against PyTorch: sum, mean, amax/amin, max/min (all three forms), argmax/argmin, any/all.

Dims: None, int (negative too), tuples; keepdim; 0-d and empty inputs; non-contiguous layouts;
ties (integer-valued floats) for the gradient conventions of max/amax."""

from __future__ import annotations

import kiln_testutil as U
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kiln


@st.composite
def shape_and_dim(draw, kinds=("none", "int", "tuple"), min_dims=0, max_side=4):
    shape = draw(U.shapes(min_dims=min_dims, max_side=max_side))
    nd = len(shape)
    kind = draw(st.sampled_from(kinds))
    if kind == "none":
        return shape, None
    if nd == 0:
        return shape, draw(st.sampled_from([0, -1])) if kind == "int" else draw(st.sampled_from([(0,), (-1,)]))
    if kind == "int":
        return shape, draw(st.integers(-nd, nd - 1))
    dims = draw(st.lists(st.integers(0, nd - 1), min_size=1, max_size=nd, unique=True))
    return shape, tuple(d - nd if draw(st.booleans()) else d for d in dims)


def _reduce_call(name, dim, keepdim, **kw):
    """fn(lib, x) calling ``lib.<name>(x, dim, keepdim)`` without passing dim when it is None."""

    def fn(L, x):
        f = getattr(L, name)
        if dim is None:
            return f(x, **kw)
        return f(x, dim, keepdim=keepdim, **kw)

    return fn


# ---------------------------------------------------------------------------------------- sum / mean


@pytest.mark.parametrize("name", ["sum", "mean"])
@given(sd=shape_and_dim(), keepdim=st.booleans(), layout=U.layouts, dtype=U.float_dtypes, seed=U.seeds)
def test_sum_mean_float_forward_backward(name, sd, keepdim, layout, dtype, seed):
    shape, dim = sd
    x = U.make_pair(shape, dtype, layout=layout, seed=seed, requires_grad=True)
    U.check_op(_reduce_call(name, dim, keepdim), x, seed=seed, rtol=1e-5 if dtype is kiln.float32 else None)


@pytest.mark.parametrize("name", ["sum", "mean"])
def test_sum_mean_method_forms(name):
    x = U.make_pair((2, 3, 4), kiln.float32, layout="transposed", seed=1, requires_grad=True)
    for fn in (
        lambda L, a: getattr(a, name)(),
        lambda L, a: getattr(a, name)(1),
        lambda L, a: getattr(a, name)(dim=-1),
        lambda L, a: getattr(a, name)((0, 2), True),
        lambda L, a: getattr(a, name)(dim=[0, -1], keepdim=True),
        lambda L, a: getattr(L, name)(a, dim=(-3,)),
    ):
        U.check_op(fn, x)


@given(sd=shape_and_dim(), keepdim=st.booleans(), layout=U.layouts, seed=U.seeds, dtype=st.sampled_from(U.ALL_DTYPES))
def test_sum_all_dtypes(sd, keepdim, layout, seed, dtype):
    """Integers and bools sum to int64; half types stay half."""
    shape, dim = sd
    x = U.make_pair(shape, dtype, layout=layout, seed=seed)
    U.check_op(_reduce_call("sum", dim, keepdim), x, grad=False, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    "din,dout",
    [
        (kiln.int32, kiln.float64),
        (kiln.int64, kiln.int32),
        (kiln.bool, kiln.float32),
        (kiln.float32, kiln.float64),
        (kiln.float64, kiln.float32),
        (kiln.float16, kiln.float32),
        (kiln.uint8, kiln.uint8),
    ],
    ids=U.dtype_id,
)
def test_sum_dtype_argument(din, dout):
    x = U.make_pair((3, 4), din, seed=2, requires_grad=din.is_floating_point)
    U.check_op(lambda L, a: L.sum(a, dtype=U.K2T[dout] if L is torch else dout), x, rtol=1e-3, atol=1e-3)
    U.check_op(lambda L, a: a.sum(1, dtype=U.K2T[dout] if L is torch else dout), x, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(
    "din,dout", [(kiln.float32, kiln.float64), (kiln.int64, kiln.float32), (kiln.float16, kiln.float32)], ids=U.dtype_id
)
def test_mean_dtype_argument(din, dout):
    x = U.make_pair((3, 4), din, seed=2, requires_grad=din.is_floating_point)
    U.check_op(lambda L, a: L.mean(a, dtype=U.K2T[dout] if L is torch else dout), x, rtol=1e-3, atol=1e-3)
    U.check_op(lambda L, a: a.mean(0, True, dtype=U.K2T[dout] if L is torch else dout), x, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", U.ALL_DTYPES, ids=U.dtype_id)
def test_mean_non_float_errors(dtype):
    x = U.make_pair((3,), dtype, seed=1)
    U.check_op(lambda L, a: L.mean(a), x, grad=False)


@pytest.mark.parametrize("shape,dim", [((0,), None), ((0, 3), 0), ((0, 3), 1), ((2, 0), (0, 1)), ((2, 0), -1)])
def test_sum_mean_empty(shape, dim):
    x = U.make_pair(shape, kiln.float32, seed=1, requires_grad=True)
    for name in ("sum", "mean"):
        U.check_op(_reduce_call(name, dim, False), x)
        U.check_op(_reduce_call(name, dim, True), x)


def test_sum_of_bool_and_overflowing_ints():
    x = U.make_pair((4, 5), kiln.bool, seed=3)
    U.check_op(lambda L, a: a.sum(), x, grad=False)
    U.check_op(lambda L, a: a.sum(0), x, grad=False)
    y = U.make_pair((3,), kiln.int8, values=[100, 100, 100])
    U.check_op(lambda L, a: a.sum(), y, grad=False)  # int8 sums to int64: no overflow
    z = U.make_pair((3,), kiln.uint8, values=[200, 200, 200])
    U.check_op(lambda L, a: a.sum(dtype=L.uint8), z, grad=False)  # explicit uint8 wraps


# ---------------------------------------------------------------------------------------- amax / amin / max() / min()


@pytest.mark.parametrize("name", ["amax", "amin"])
@given(
    sd=shape_and_dim(kinds=("int", "tuple", "none")),
    keepdim=st.booleans(),
    layout=U.layouts,
    dtype=U.float_dtypes,
    seed=U.seeds,
)
def test_amax_amin_forward_backward_with_ties(name, sd, keepdim, layout, dtype, seed):
    """Integer-valued data makes ties common; torch shares the gradient evenly among them."""
    shape, dim = sd
    x = U.make_pair(shape, dtype, layout=layout, seed=seed, requires_grad=True, low=-2, high=2, integral=True)

    def fn(L, a):
        f = getattr(L, name)
        return f(a) if dim is None else f(a, dim, keepdim)

    U.check_op(fn, x, seed=seed)


@pytest.mark.parametrize("name", ["max", "min"])
@given(shape=U.shapes(), layout=U.layouts, dtype=U.float_dtypes, seed=U.seeds)
def test_max_min_full_reduction_with_ties(name, shape, layout, dtype, seed):
    """``max(x)`` is a 0-d tensor; its gradient is shared among ties (like torch)."""
    x = U.make_pair(shape, dtype, layout=layout, seed=seed, requires_grad=True, low=-2, high=2, integral=True)
    U.check_op(lambda L, a: getattr(L, name)(a), x, seed=seed)
    U.check_op(lambda L, a: getattr(a, name)(), x, seed=seed)


@pytest.mark.parametrize("name", ["max", "min", "amax", "amin"])
@pytest.mark.parametrize("dtype", U.ALL_DTYPES, ids=U.dtype_id)
def test_extremes_all_dtypes(name, dtype):
    x = U.make_pair((3, 4), dtype, seed=4, layout="transposed")
    U.check_op(lambda L, a: getattr(L, name)(a), x, grad=False)
    U.check_op(lambda L, a: getattr(L, name)(a, 1), x, grad=False)
    U.check_op(lambda L, a: getattr(L, name)(a, 0, True), x, grad=False)


# ---------------------------------------------------------------------------------------- max / min with dim


@pytest.mark.parametrize("name", ["max", "min"])
@given(data=st.data(), layout=U.layouts, dtype=U.float_dtypes, seed=U.seeds, keepdim=st.booleans())
def test_max_min_dim_values_indices(name, data, layout, dtype, seed, keepdim):
    """``max(x, dim)`` returns (values, indices); ties pick torch's index; only that index gets grad."""
    shape, dim = data.draw(shape_and_dim(kinds=("int",)))
    x = U.make_pair(shape, dtype, layout=layout, seed=seed, requires_grad=True, low=-2, high=2, integral=True)
    k, t = U.check_op(lambda L, a: getattr(L, name)(a, dim, keepdim), x, seed=seed)
    if t is not None:
        assert type(k).__name__ == type(t).__name__ == name
        assert k[0] is k.values and k[1] is k.indices
        assert k._fields == ("values", "indices")


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_dim_call_forms(name):
    x = U.make_pair((3, 4), kiln.float32, seed=5, layout="strided", requires_grad=True)
    for fn in (
        lambda L, a: getattr(L, name)(a, 1),
        lambda L, a: getattr(L, name)(a, dim=0),
        lambda L, a: getattr(L, name)(a, -1, True),
        lambda L, a: getattr(L, name)(a, dim=1, keepdim=True),
        lambda L, a: getattr(a, name)(0),
        lambda L, a: getattr(a, name)(dim=-1, keepdim=False),
        lambda L, a: getattr(a, name)(1).values * 2,
        lambda L, a: getattr(a, name)(1)[0],
    ):
        U.check_op(fn, x)
    # values, indices unpack
    k_vals, k_idx = getattr(x.k, name)(1)
    t_vals, t_idx = getattr(x.t, name)(1)
    U.assert_close(k_vals, t_vals)
    U.assert_close(k_idx, t_idx)


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_binary_form(name):
    """``max(a, b)`` is the elementwise maximum (ties split the gradient)."""
    a = U.make_pair((2, 3), kiln.float32, seed=1, requires_grad=True, low=-1, high=1, integral=True)
    b = U.make_pair((3,), kiln.float32, seed=2, requires_grad=True, low=-1, high=1, integral=True)
    U.check_op(lambda L, p, q: getattr(L, name)(p, q), a, b)
    U.check_op(lambda L, p, q: getattr(p, name)(q), a, b)
    U.check_op(lambda L, p, q: getattr(L, name)(p, other=q), a, b)


@pytest.mark.parametrize("name", ["max", "min", "amax", "amin", "argmax", "argmin"])
def test_nan_propagation(name):
    vals = [[1.0, np.nan, 3.0], [np.nan, -1.0, np.nan], [2.0, 2.0, 0.5]]
    for dtype in (kiln.float32, kiln.float64, kiln.float16):
        x = U.make_pair((3, 3), dtype, values=vals)
        U.check_op(lambda L, a: getattr(L, name)(a), x, grad=False)
        U.check_op(lambda L, a: getattr(L, name)(a, 1), x, grad=False)
        U.check_op(lambda L, a: getattr(L, name)(a, 0), x, grad=False)


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_zero_dim(name):
    x = U.make_pair((), kiln.float32, seed=1, requires_grad=True)
    U.check_op(lambda L, a: getattr(L, name)(a), x)
    U.check_op(lambda L, a: getattr(L, name)(a, 0), x)
    U.check_op(lambda L, a: getattr(L, name)(a, -1, True), x)


# ---------------------------------------------------------------------------------------- argmax / argmin


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@given(
    data=st.data(),
    layout=U.layouts,
    seed=U.seeds,
    keepdim=st.booleans(),
    dtype=st.sampled_from((kiln.float32, kiln.float64, kiln.int64, kiln.int8, kiln.uint8, kiln.float16)),
)
def test_argmax_argmin(name, data, layout, seed, keepdim, dtype):
    """Flattened (in logical order, also for non-contiguous inputs) or along dim; first index on ties."""
    shape, dim = data.draw(shape_and_dim(kinds=("none", "int")))
    x = U.make_pair(shape, dtype, layout=layout, seed=seed, low=-2, high=2, integral=True)
    U.check_op(lambda L, a: getattr(L, name)(a, dim, keepdim), x, grad=False)
    U.check_op(lambda L, a: getattr(a, name)(dim=dim), x, grad=False)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_on_requires_grad_and_bool(name):
    x = U.make_pair((3, 4), kiln.float32, seed=1, requires_grad=True)
    k, _ = U.check_op(lambda L, a: getattr(L, name)(a, 1), x, grad=False)
    assert k.requires_grad is False
    b = U.make_pair((3, 4), kiln.bool, seed=2)
    U.check_op(lambda L, a: getattr(L, name)(a), b, grad=False)


# ---------------------------------------------------------------------------------------- any / all


@pytest.mark.parametrize("name", ["any", "all"])
@given(sd=shape_and_dim(), keepdim=st.booleans(), layout=U.layouts, seed=U.seeds, dtype=st.sampled_from(U.ALL_DTYPES))
def test_any_all(name, sd, keepdim, layout, seed, dtype):
    """Reductions to bool (uint8 inputs give uint8, as in torch); empty: any False, all True."""
    shape, dim = sd
    x = U.make_pair(shape, dtype, layout=layout, seed=seed, low=-1, high=1, integral=True)
    U.check_op(_reduce_call(name, dim, keepdim), x, grad=False)


@pytest.mark.parametrize("name", ["any", "all"])
def test_any_all_method_and_values(name):
    for vals in ([0, 0, 0], [0, 1, 0], [1, 1, 1], [np.nan, 0, 0]):
        x = U.make_pair((3,), kiln.float32, values=vals, requires_grad=True)
        k, t = U.check_op(lambda L, a: getattr(a, name)(), x, grad=False)
        assert k.requires_grad is False
        assert bool(k) == bool(t)

"""Softmax, log-softmax, logsumexp and layer norm against the reference kernels: every dim, both float
dtypes, special values (NaN, inf, all -inf rows), affine or not, and the cases handed back to the
reference (non-contiguous inputs, other dtypes, other reduced dims)."""

from __future__ import annotations

import numpy as np
import pytest
from kiln_cpu_helpers import F, assert_same, make, reference

import kiln
from kiln_cpu import _jit

FLOAT = [kiln.float32, kiln.float64]


def _atol(name, dtype):
    """log-softmax subtracts log(sum) from x - max: the rounding of the sum shows as an absolute error."""
    if name == "softmax":
        return 1e-30
    return 2e-6 if dtype is kiln.float32 else 1e-14


@pytest.fixture
def norm_spy(monkeypatch):
    """A list that receives the name of every softmax/norm Numba loop the kernels call."""
    calls: list[str] = []
    real = _jit.norm

    def record(name):
        calls.append(name)
        return real(name)

    monkeypatch.setattr(_jit, "norm", record)
    return calls


SOFTMAX = {
    "softmax": lambda t, d: F.softmax(t, d),
    "log_softmax": lambda t, d: F.log_softmax(t, d),
}


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("name", list(SOFTMAX))
def test_softmax_matches_reference(name, dtype, dim, norm_spy):
    fn = SOFTMAX[name]
    for shape in ((4, 5, 37), (3, 200, 1), (2, 1, 300)):
        x = make(shape, dtype, seed=dim + 3)
        assert_same(fn(x, dim), reference(fn, x, dim), ulps=4, atol=_atol(name, dtype))
    layout = "rows" if dim in (2, -1) else "slabs"
    assert norm_spy and all(c.endswith(layout) or c.endswith("rows") for c in norm_spy)


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("name", list(SOFTMAX))
def test_softmax_special_rows(name, dtype, norm_spy):
    """All -inf rows, rows with NaN or +inf, and huge values give the reference's NaN/inf/0 pattern."""
    x = np.random.default_rng(0).standard_normal((6, 40)).astype(dtype.numpy)
    x[0] = -np.inf
    x[1, 3] = np.nan
    x[2, 7] = np.inf
    x[3, :20] = -np.inf
    x[4] *= 1e30
    x[5] = 0.0
    t = kiln.from_numpy(x)
    fn = SOFTMAX[name]
    for dim in (0, 1):
        assert_same(fn(t, dim), reference(fn, t, dim), ulps=4, atol=_atol(name, dtype))
    assert len(norm_spy) == 2


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_non_contiguous_and_other_dtypes_go_to_the_reference(dtype, norm_spy):
    x = make((8, 6), dtype)
    for t in (x.t(), x[:, ::2]):
        for fn in SOFTMAX.values():
            assert_same(fn(t, 1), reference(fn, t, 1))
        f = lambda u: kiln.logsumexp(u, 1)
        assert_same(f(t), reference(f, t))
    h = make((8, 6), kiln.float16)
    assert_same(F.softmax(h, 1), reference(F.softmax, h, 1))
    assert_same(F.layer_norm(h, (6,)), reference(F.layer_norm, h, (6,)))
    assert norm_spy == []


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_logsumexp_matches_reference(dtype, keepdim, norm_spy):
    fn = lambda t, d: kiln.logsumexp(t, d, keepdim=keepdim)
    for shape in ((4, 5, 37), (300,), (3, 1)):
        x = make(shape, dtype, seed=len(shape))
        assert_same(fn(x, -1), reference(fn, x, -1), ulps=4)
    x = np.random.default_rng(1).standard_normal((5, 9)).astype(dtype.numpy)
    x[0] = -np.inf
    x[1, 2] = np.inf
    x[2, 4] = np.nan
    x[3] *= 1e30
    t = kiln.from_numpy(x)
    assert_same(fn(t, 1), reference(fn, t, 1), ulps=4)
    assert norm_spy == ["logsumexp-rows"] * 4
    assert_same(fn(t, 0), reference(fn, t, 0))  # not the last dim: the reference
    assert_same(fn(t, (0, 1)), reference(fn, t, (0, 1)))
    assert len(norm_spy) == 4


@pytest.mark.parametrize("affine", ["none", "weight", "bias", "both"])
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_layer_norm_matches_reference(dtype, affine, norm_spy):
    rng = np.random.default_rng(2)
    for shape, ns in (((6, 130), (130,)), ((3, 4, 5, 6), (5, 6)), ((7,), (7,)), ((2, 3), (2, 3))):
        x = kiln.from_numpy((rng.standard_normal(shape) * 3 + 1).astype(dtype.numpy))
        w = kiln.from_numpy(rng.standard_normal(ns).astype(dtype.numpy)) if affine in ("weight", "both") else None
        b = kiln.from_numpy(rng.standard_normal(ns).astype(dtype.numpy)) if affine in ("bias", "both") else None
        fn = lambda t, ns=ns, w=w, b=b: F.layer_norm(t, ns, w, b, 1e-5)
        assert_same(fn(x), reference(fn, x), ulps=8, atol=1e-6 if dtype is kiln.float32 else 1e-14)
    assert norm_spy == ["layer_norm-rows"] * 4


def test_layer_norm_specials_and_constant_rows(norm_spy):
    x = np.random.default_rng(3).standard_normal((5, 16)).astype(np.float32)
    x[0] = 2.5  # zero variance: 0 * 1/sqrt(eps)
    x[1, 3] = np.nan
    x[2, 0] = np.inf
    x[3] *= 1e20
    t = kiln.from_numpy(x)
    fn = lambda u: F.layer_norm(u, (16,))
    assert_same(fn(t), reference(fn, t), ulps=8, atol=1e-6)
    assert norm_spy == ["layer_norm-rows"]


def test_layer_norm_mixed_dtype_parameters_go_to_the_reference(norm_spy):
    x = make((4, 6), kiln.float32)
    w = kiln.ones(6, dtype=kiln.float64)
    try:
        expected = reference(F.layer_norm, x, (6,), w)
    except RuntimeError:
        with pytest.raises(RuntimeError):
            F.layer_norm(x, (6,), w)
    else:
        assert_same(F.layer_norm(x, (6,), w), expected)
    assert norm_spy == []

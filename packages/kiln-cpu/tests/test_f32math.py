"""float32 exp, log, tanh, sigmoid and erf: at most 1 ulp from the exact value (float64 rounded once),
over the whole float32 range: random bit patterns, dense grids where the functions bend, the overflow
and underflow edges, denormals, signed zeros, infinities and NaN."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kiln_cpu_helpers import ulp_distance

import kiln
from kiln_cpu import _jit_f32math, _opcodes


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(42)
    bits = rng.integers(0, 2**32, 400_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    grid = np.linspace(-12, 12, 200_001, dtype=np.float32)
    tiny = np.float32(10.0) ** rng.uniform(-45, -3, 50_000).astype(np.float32)
    edges = np.concatenate(
        [np.linspace(c - 1, c + 1, 20_001, dtype=np.float32) for c in (88.72, -88.72, -87.33, -103.97)]
    )
    denormals = (np.arange(1, 5001, dtype=np.uint32) * 1601).view(np.float32)
    specials = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, np.finfo(np.float32).max, -np.finfo(np.float32).max,
         np.finfo(np.float32).tiny, 2.0**-149, -(2.0**-149), 1e-8, -1e-8, 0.000244140625, 0.5493, 1.0, 6.0, 3.9],
        np.float32,
    )  # fmt: skip
    x = np.concatenate([bits, grid, tiny, -tiny, edges, denormals, -denormals, specials])
    return x


X = _inputs()


def _exact(name: str, x: np.ndarray) -> np.ndarray:
    """The function in float64 (within an ulp of float64, far below float32's), rounded to float32."""
    with np.errstate(all="ignore"):  # signalling-NaN patterns and float32 overflow warn
        d = x.astype(np.float64)
        if name == "exp":
            r = np.exp(d)
        elif name == "log":
            r = np.log(d)
        elif name == "tanh":
            r = np.tanh(d)
        elif name == "sigmoid":  # 0 where float32's exp(-x) overflows, as PyTorch's
            r = np.where(np.exp(-x) == np.inf, 0.0, 1.0 / (1.0 + np.exp(-d)))
        else:
            r = np.frompyfunc(math.erf, 1, 1)(d).astype(np.float64)
        return r.astype(np.float32)


ULPS = {"exp": 1, "log": 1, "tanh": 1, "sigmoid": 1, "erf": 1}


@pytest.mark.parametrize("name", list(ULPS))
def test_float32_within_one_ulp_everywhere(name, spy):
    x = X if name != "erf" else X[::4]
    got = getattr(kiln, name)(kiln.from_numpy(x.copy())).numpy()
    assert spy == [("unary", getattr(_opcodes, name.upper()), "flat")]
    want = _exact(name, x)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    got, want, xs = got[~nan], want[~nan], x[~nan]
    dist = ulp_distance(got, want)
    worst = np.argmax(dist)
    assert dist[worst] <= ULPS[name], f"{name}({xs[worst]!r}) = {got[worst]!r}, exact {want[worst]!r}"
    # the sign of zero where the result is zero (odd functions keep -0.0)
    zero = want == 0
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]))


def test_sigmoid_underflows_where_pytorchs_does(spy):
    """Below x = -88.7228 float32's exp(-x) overflows and PyTorch's sigmoid is 0: so is kiln-cpu's, as its
    reference's (a small tensor's) is, so that a result never depends on a tensor's size."""
    import torch

    x = np.linspace(-110, -80, 1 << 19, dtype=np.float32)
    got = kiln.sigmoid(kiln.from_numpy(x.copy())).numpy()
    assert spy == [("unary", _opcodes.SIGMOID, "flat")]
    want = torch.sigmoid(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(got == 0, want == 0)
    assert ulp_distance(got, want).max() <= 1
    small = kiln.sigmoid(kiln.from_numpy(x[::4096].copy())).numpy()  # the reference's (below min_numel)
    np.testing.assert_array_equal(small == 0, got[::4096] == 0)


def test_special_values():
    x = kiln.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -1.0, 1e-45])
    assert kiln.exp(x).tolist()[:4] == [1.0, 1.0, float("inf"), 0.0]
    log = kiln.log(x).tolist()
    assert log[:3] == [float("-inf"), float("-inf"), float("inf")] and math.isnan(log[3]) and math.isnan(log[5])
    assert kiln.tanh(x).tolist()[2:4] == [1.0, -1.0]
    assert math.copysign(1.0, kiln.tanh(x).tolist()[1]) == -1.0
    assert kiln.sigmoid(x).tolist()[2:4] == [1.0, 0.0]
    assert kiln.erf(x).tolist()[2:4] == [1.0, -1.0]
    assert math.copysign(1.0, kiln.erf(x).tolist()[1]) == -1.0
    for fn in (kiln.exp, kiln.log, kiln.tanh, kiln.sigmoid, kiln.erf):
        assert math.isnan(fn(x).tolist()[4])


def test_float32_arithmetic_exps():
    """The exps computed in float32 arithmetic (softmax, tanh): ``expf_core`` within 2 ulps of the exact
    value over the float32 range (subnormal results and overflow included), ``expf_nonpositive`` the same
    for ``x <= 0`` down to -87 and 0 below."""
    from numba import njit

    @njit
    def apply(x, out, nonpositive):
        for i in range(x.shape[0]):
            out[i] = _jit_f32math.expf_nonpositive(x[i]) if nonpositive else _jit_f32math.expf_core(x[i])

    for nonpositive in (False, True):
        x = X[~np.isnan(X)]
        if nonpositive:
            x = np.concatenate([x[x <= 0], -np.abs(np.linspace(0, 90, 100_001, dtype=np.float32))])
        got = np.empty_like(x)
        apply(x, got, nonpositive)
        want = _exact("exp", x)
        if nonpositive:
            flushed = x < -87
            assert (got[flushed] == 0).all()
            got, want, x = got[~flushed], want[~flushed], x[~flushed]
        dist = ulp_distance(got, want)
        worst = np.argmax(dist)
        assert dist[worst] <= 2, f"exp({x[worst]!r}) = {got[worst]!r}, exact {want[worst]!r} ({nonpositive=})"

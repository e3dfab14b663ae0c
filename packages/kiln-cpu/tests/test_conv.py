"""2-d convolution forward against the reference kernel: strides, padding, dilation, bias or not, 1x1
and large kernels, non-contiguous inputs; groups, transposed, 1-d and 3-d convolutions go to the
reference."""

from __future__ import annotations

import numpy as np
import pytest
from kiln_cpu_helpers import F, assert_same, reference

import kiln
from kiln_cpu import _jit

FLOAT = [kiln.float32, kiln.float64]


@pytest.fixture
def conv_spy(monkeypatch):
    calls: list[int] = []
    real = _jit.im2col_2d
    monkeypatch.setattr(_jit, "im2col_2d", lambda *a: calls.append(1) or real(*a))
    return calls


def _rand(shape, dtype, seed):
    return kiln.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(dtype.numpy))


def _tol(dtype):
    return {"ulps": 64, "atol": 1e-5} if dtype is kiln.float32 else {"ulps": 64, "atol": 1e-12}


CASES = [
    # (input shape, weight shape, stride, padding, dilation)
    ((2, 3, 9, 11), (4, 3, 3, 3), 1, 0, 1),
    ((2, 3, 9, 11), (4, 3, 3, 3), 1, 1, 1),
    ((1, 2, 10, 7), (5, 2, 3, 2), (2, 3), (1, 2), 1),
    ((2, 4, 12, 12), (3, 4, 3, 3), 1, 2, 2),
    ((3, 5, 6, 6), (7, 5, 1, 1), 1, 0, 1),
    ((1, 1, 5, 5), (2, 1, 5, 5), 2, 3, 1),  # padding wider than the kernel reaches
    ((2, 2, 5, 7), (2, 2, 3, 3), 3, 0, (1, 2)),
]


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_conv2d_matches_reference(dtype, case, with_bias, conv_spy):
    xs, ws, stride, padding, dilation = CASES[case]
    x, w = _rand(xs, dtype, case), _rand(ws, dtype, case + 10)
    b = _rand((ws[0],), dtype, 3) if with_bias else None
    fn = lambda t: F.conv2d(t, w, b, stride, padding, dilation)
    assert_same(fn(x), reference(fn, x), **_tol(dtype))
    xt = _rand(xs[:2] + xs[2:][::-1], dtype, 5).transpose(2, 3)  # non-contiguous input
    assert_same(fn(xt), reference(fn, xt), **_tol(dtype))
    assert len(conv_spy) == 2


def test_nan_and_inf_reach_the_output(conv_spy):
    x = _rand((1, 2, 6, 6), kiln.float32, 0)
    x[0, 0, 2, 3] = float("nan")
    x[0, 1, 0, 0] = float("inf")
    w = _rand((3, 2, 3, 3), kiln.float32, 1)
    fn = lambda t: F.conv2d(t, w, padding=1)
    assert_same(fn(x), reference(fn, x), **_tol(kiln.float32))
    assert conv_spy


def test_other_convolutions_go_to_the_reference(conv_spy):
    x = _rand((2, 4, 6, 6), kiln.float32, 0)
    w = _rand((4, 2, 3, 3), kiln.float32, 1)
    assert_same(F.conv2d(x, w, groups=2), reference(F.conv2d, x, w, groups=2))
    wt = _rand((4, 3, 3, 3), kiln.float32, 2)
    assert_same(F.conv_transpose2d(x, wt), reference(F.conv_transpose2d, x, wt))
    x1, w1 = _rand((2, 3, 9), kiln.float32, 3), _rand((4, 3, 3), kiln.float32, 4)
    assert_same(F.conv1d(x1, w1), reference(F.conv1d, x1, w1))
    h, wh = x.to(kiln.float16), _rand((3, 4, 3, 3), kiln.float32, 5).to(kiln.float16)
    assert_same(F.conv2d(h, wh), reference(F.conv2d, h, wh))
    assert conv_spy == []

"""nll_loss forward against the reference kernel, bit for bit: 1-d, 2-d and spatial inputs, class weights
(NaN and 0 included), ignore_index, every reduction, uint8 targets, and out-of-range targets raising the
reference's error."""

from __future__ import annotations

import numpy as np
import pytest
from kiln_cpu_helpers import F, assert_same, reference

import kiln

FLOAT = [kiln.float32, kiln.float64]
SHAPES = [(7,), (9, 7), (4, 7, 3), (2, 7, 3, 5)]


def _case(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = kiln.from_numpy(rng.standard_normal(shape).astype(dtype.numpy))
    classes = shape[0] if len(shape) == 1 else shape[1]
    tshape = () if len(shape) == 1 else (shape[0],) + shape[2:]
    t = rng.integers(0, classes, tshape)
    if t.size > 2:
        t.reshape(-1)[:2] = -100  # ignored
    return x, kiln.from_numpy(np.asarray(t, np.int64)), classes


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_nll_loss_matches_reference(dtype, shape, weighted, reduction):
    x, t, classes = _case(shape, dtype, len(shape))
    w = None
    if weighted:
        wn = np.random.default_rng(9).random(classes).astype(dtype.numpy)
        wn[1] = 0.0
        w = kiln.from_numpy(wn)
    fn = lambda a, b: F.nll_loss(a, b, weight=w, reduction=reduction)
    assert_same(fn(x, t), reference(fn, x, t))
    if len(shape) > 1:
        t3 = kiln.from_numpy(np.where(t.numpy() == -100, 3, t.numpy()))
        fn = lambda a, b: F.nll_loss(a, b, weight=w, ignore_index=3, reduction=reduction)
        assert_same(fn(x, t3), reference(fn, x, t3))


def test_the_numba_loop_runs(monkeypatch):
    from kiln_cpu import _jit

    calls = []
    real = _jit.nll_rows
    monkeypatch.setattr(_jit, "nll_rows", lambda *a: calls.append(1) or real(*a))
    x, t, _ = _case((2, 7, 3, 5), kiln.float32, 0)
    assert_same(F.nll_loss(x, t), reference(F.nll_loss, x, t))
    assert calls


def test_uint8_targets_nan_weights_and_all_ignored():
    x, _, classes = _case((6, 5), kiln.float32, 0)
    t8 = kiln.from_numpy(np.array([0, 1, 2, 3, 4, 1], np.uint8))
    wn = np.ones(classes, np.float32)
    wn[2] = np.nan
    w = kiln.from_numpy(wn)
    for red in ("none", "sum", "mean"):
        fn = lambda a, b, red=red: F.nll_loss(a, b, weight=w, reduction=red)
        assert_same(fn(x, t8), reference(fn, x, t8))
        ignored = kiln.from_numpy(np.full(6, -100, np.int64))
        fn = lambda a, b, red=red: F.nll_loss(a, b, reduction=red)
        assert_same(fn(x, ignored), reference(fn, x, ignored))


@pytest.mark.parametrize("bad", [5, -1])
def test_out_of_range_target_raises_the_reference_error(bad):
    x, t, _ = _case((6, 5), kiln.float32, 0)
    t[3] = bad
    with pytest.raises(IndexError, match=f"Target {bad} is out of bounds"):
        F.nll_loss(x, t)


def test_non_contiguous_input_goes_to_the_reference():
    x, _, _ = _case((5, 6), kiln.float64, 1)
    xt = x.t()  # (6, 5)
    t6 = kiln.from_numpy(np.arange(6) % 5)
    for red in ("none", "mean"):
        fn = lambda a, b, red=red: F.nll_loss(a, b, reduction=red)
        assert_same(fn(xt, t6), reference(fn, xt, t6))

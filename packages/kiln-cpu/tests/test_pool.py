"""Max pooling (1-d to 3-d, adaptive; values and argmax indices), average pooling, adaptive average pooling,
interpolation and reflect/replicate/circular padding (the ``_separable`` maps), forward and backward
through autograd, against the reference kernels: strides, padding, dilation, ceil mode,
``count_include_pad``, ``divisor_override``, ties and NaN (the reference's argmax), inf and -0.0,
non-contiguous inputs, both float dtypes, and the cases handed back to the reference."""

from __future__ import annotations

import types

import numpy as np
import pytest
from kiln_cpu_helpers import assert_same, make, reference

import kiln
from kiln._ops import pad, pool, resample
from kiln_cpu import _jit_pool, config
from kiln_testing._runner import ReferenceMode

P = types.SimpleNamespace(**vars(pool), pad=pad.pad, interpolate=resample.interpolate)

FLOAT = [kiln.float32, kiln.float64]


@pytest.fixture
def pool_spy(monkeypatch):
    """A list that receives the name of every pooling loop the kernels run (``argmax_scatter``: the max
    pools' backward)."""
    calls: list[str] = []
    for name in ("max_pool", "max_pool_2x2", "argmax_scatter", "separable", "separable_backward"):
        fn = getattr(_jit_pool, name)
        monkeypatch.setattr(_jit_pool, name, lambda *a, _fn=fn, _n=name: calls.append(_n) or _fn(*a))
    return calls


def _ties(shape, dtype, seed):
    """Values from a few levels (ties everywhere) with NaN, inf, -inf and -0.0 mixed in."""
    rng = np.random.default_rng(seed)
    x = rng.choice(np.array([0.0, -0.0, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan]), shape, p=[0.2] * 4 + [0.05] * 4)
    return kiln.from_numpy(x.astype(dtype.numpy))


def _grad_check(fn, x, seed, ulps=0, atol=0.0):
    """Forward and the gradient through autograd against the reference (the gradient of the output is
    ``make``'s values: NaN and inf included)."""
    xg = x.detach().requires_grad_()
    xr = x.detach().requires_grad_()
    out = fn(xg)
    with ReferenceMode():
        expected = fn(xr)
    outs = out if isinstance(out, tuple) else (out,)
    exps = expected if isinstance(expected, tuple) else (expected,)
    for o, e in zip(outs, exps):
        assert_same(o.detach(), e.detach())
    g = make(tuple(outs[0].shape), x.dtype, seed)
    outs[0].backward(g)
    with ReferenceMode():
        exps[0].backward(g)
    assert_same(xg.grad, xr.grad, ulps=ulps, atol=atol)


# ---------------------------------------------------------------------------------------- max pooling

MAX_POOL = {
    "k2s2": ((2, 3, 8, 10), dict(kernel_size=2, stride=2)),
    "k2s2-odd": ((2, 3, 9, 11), dict(kernel_size=2, stride=2)),  # the last row and column are left out
    "k2s2-ceil": ((2, 3, 9, 11), dict(kernel_size=2, stride=2, ceil_mode=True)),  # partial windows
    "k3s1p1": ((2, 3, 7, 9), dict(kernel_size=3, stride=1, padding=1)),
    "k3s2p1-ceil": ((1, 4, 9, 10), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    "dilated": ((2, 2, 11, 12), dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 1), dilation=(2, 3))),
    "ceil-partial": ((1, 2, 6, 7), dict(kernel_size=4, stride=3, ceil_mode=True)),
    "unbatched": ((3, 9, 8), dict(kernel_size=(2, 3), stride=(1, 2))),
}


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("case", list(MAX_POOL))
def test_max_pool2d(case, dtype, pool_spy):
    shape, kw = MAX_POOL[case]
    fn = lambda t: P.max_pool2d(t, **kw, return_indices=True)
    _grad_check(fn, make(shape, dtype, 1), 2)
    _grad_check(fn, _ties(shape, dtype, 3), 4)  # first maximum wins, the last NaN wins
    loop = "max_pool_2x2" if case in ("k2s2", "k2s2-odd") else "max_pool"  # 2x2 windows, stride 2: its own loop
    assert pool_spy.count(loop) == 2 and pool_spy.count("argmax_scatter") == 2 and len(pool_spy) == 4


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_max_pool_non_contiguous_input(dtype, pool_spy):
    x = make((2, 3, 10, 9), dtype, 1).transpose(2, 3)
    _grad_check(lambda t: P.max_pool2d(t, 3, 2, 1, return_indices=True), x, 2)
    _grad_check(lambda t: P.max_pool2d(t, 2, return_indices=True), _ties((4, 3, 8, 9), dtype, 3)[:, :, ::2], 4)
    assert pool_spy.count("max_pool") == 1 and pool_spy.count("max_pool_2x2") == 1


OTHER_MAX = {
    "max_pool1d": (lambda t: P.max_pool1d(t, 3, 2, 1, return_indices=True), (3, 4, 17)),
    "max_pool1d-no-indices": (lambda t: P.max_pool1d(t, 2, 1, 0, 2, True), (3, 4, 17)),
    "max_pool3d": (lambda t: P.max_pool3d(t, 2, 1, 1, return_indices=True), (2, 2, 5, 6, 7)),
    "max_pool3d-ceil": (lambda t: P.max_pool3d(t, (2, 3, 2), 2, (1, 1, 0), 1, True), (1, 3, 5, 7, 6)),
    "adaptive2d": (lambda t: P.adaptive_max_pool2d(t, (4, 3), return_indices=True), (2, 3, 9, 11)),
    "adaptive2d-grow": (lambda t: P.adaptive_max_pool2d(t, (7, 13)), (2, 3, 5, 6)),
    "adaptive1d": (lambda t: P.adaptive_max_pool1d(t, 5, return_indices=True), (3, 4, 17)),
}


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("case", list(OTHER_MAX))
def test_other_max_pools(case, dtype, pool_spy):
    fn, shape = OTHER_MAX[case]
    _grad_check(fn, make(shape, dtype, 1), 2)
    _grad_check(fn, _ties(shape, dtype, 3), 4)
    assert pool_spy.count("max_pool") == 2 and pool_spy.count("argmax_scatter") == 2


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_argmax_scatter_adds_in_order_over_threads(dtype, pool_spy, monkeypatch):
    """Many rows split over the threads (a small grain), duplicate indices added in order of the outputs
    (bit for bit ``np.add.at``), gradients read in place from a transposed tensor."""
    from kiln_cpu import kernels_pool

    monkeypatch.setattr(kernels_pool, "_GRAIN", 64)
    rng = np.random.default_rng(5)
    src = make((40, 9, 6), dtype, 1).transpose(1, 2)  # (40, 6, 9): 240 rows of 9 gradients
    ind = kiln.from_numpy(rng.integers(0, 4, src.shape).astype(np.int64))  # planes of 4: duplicates
    fn = lambda s, i: P._argmax_scatter(s, i, 4)
    assert_same(fn(src, ind), reference(fn, src, ind))
    assert pool_spy.count("argmax_scatter") >= 2  # one call per range of rows


def test_argmax_scatter_indices_outside_the_plane_go_to_the_reference(pool_spy):
    src = make((64, 32), kiln.float32, 1)
    for bad, wrapped in ((5, False), (-1, True)):
        ind = np.zeros((64, 32), np.int64)
        ind[40, 7] = bad
        i = kiln.from_numpy(ind)
        if wrapped:  # np.add.at wraps a negative index: the reference's result
            assert_same(P._argmax_scatter(src, i, 5), reference(P._argmax_scatter, src, i, 5))
        else:
            with pytest.raises(IndexError):
                P._argmax_scatter(src, i, 5)
    assert pool_spy.count("argmax_scatter") == 2


# ---------------------------------------------------------------------------------------- separable maps

SEPARABLE = {
    "avg2d-k2s2": (lambda t: P.avg_pool2d(t, 2, 2), (2, 3, 8, 10)),
    "avg2d-k3s1p1": (lambda t: P.avg_pool2d(t, 3, 1, 1), (2, 3, 7, 9)),
    "avg2d-exclude-pad-ceil": (lambda t: P.avg_pool2d(t, 3, 2, 1, True, False), (1, 4, 9, 10)),
    "avg2d-divisor": (lambda t: P.avg_pool2d(t, (2, 3), (1, 2), (1, 1), divisor_override=5), (2, 2, 7, 8)),
    "avg2d-unbatched": (lambda t: P.avg_pool2d(t, 2), (3, 9, 8)),
    "avg1d": (lambda t: P.avg_pool1d(t, 4, 3, 2, True), (3, 4, 17)),
    "adaptive-avg2d": (lambda t: P.adaptive_avg_pool2d(t, (4, 5)), (2, 3, 9, 11)),
    "adaptive-avg1d": (lambda t: P.adaptive_avg_pool1d(t, 6), (3, 4, 17)),
    "bilinear": (lambda t: P.interpolate(t, scale_factor=2, mode="bilinear"), (2, 3, 5, 6)),
    "bilinear-align": (lambda t: P.interpolate(t, size=(7, 4), mode="bilinear", align_corners=True), (2, 3, 5, 6)),
    "bicubic": (lambda t: P.interpolate(t, size=(9, 5), mode="bicubic"), (2, 2, 6, 7)),
    "bilinear-antialias": (lambda t: P.interpolate(t, size=(3, 4), mode="bilinear", antialias=True), (1, 2, 9, 11)),
    "nearest": (lambda t: P.interpolate(t, scale_factor=(2, 3), mode="nearest"), (2, 3, 5, 4)),
    "nearest-exact": (lambda t: P.interpolate(t, size=(7, 5), mode="nearest-exact"), (2, 3, 5, 4)),
    "linear1d": (lambda t: P.interpolate(t, size=11, mode="linear"), (2, 3, 7)),
    "trilinear": (lambda t: P.interpolate(t, scale_factor=2, mode="trilinear"), (1, 2, 3, 4, 5)),
    "reflect": (lambda t: P.pad(t, (1, 2, 2, 1), mode="reflect"), (2, 3, 5, 6)),
    "replicate": (lambda t: P.pad(t, (2, 0, 1, 3), mode="replicate"), (2, 3, 5, 6)),
    "circular": (lambda t: P.pad(t, (1, 2), mode="circular"), (2, 3, 7)),
}


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("case", list(SEPARABLE))
def test_separable(case, dtype, pool_spy):
    fn, shape = SEPARABLE[case]
    # the backward reproduces OpenBLAS's gemm (bit for bit here, one K block); 2 ulps for other BLAS builds
    _grad_check(fn, make(shape, dtype, 1), 2, ulps=2)
    assert pool_spy == ["separable", "separable_backward"]


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_separable_backward_overlapping_windows(dtype, pool_spy):
    """Overlapping windows: each input sums several products (fused multiply-adds), the reference in its
    dense products' order, which OpenBLAS picks by CPU: within 2 ulps, or a few float32 roundings of
    the O(1) terms where they cancel."""
    atol = 1e-5 if dtype is kiln.float32 else 1e-13
    _grad_check(lambda t: P.avg_pool2d(t, 3, 1, 1), make((2, 3, 12, 13), dtype, 1), 2, ulps=2, atol=atol)
    fn = lambda t: P.interpolate(t, size=(11, 3), mode="bicubic")
    _grad_check(fn, make((1, 2, 7, 9), dtype, 3), 4, ulps=2, atol=atol)
    assert pool_spy.count("separable_backward") == 2


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_separable_special_values_and_layouts(dtype, pool_spy):
    """inf and NaN in the input and in the gradient (a line of the gradient with inf turns NaN where the
    reference's dense product multiplies inf by 0), -0.0, non-contiguous inputs."""
    for fn in (lambda t: P.avg_pool2d(t, 2, 2), lambda t: P.interpolate(t, scale_factor=2, mode="bilinear")):
        _grad_check(fn, _ties((2, 3, 8, 6), dtype, 1), 2, ulps=2)
        _grad_check(fn, make((2, 3, 6, 8), dtype, 3).transpose(2, 3), 4, ulps=2)
    assert pool_spy.count("separable") == 4 and pool_spy.count("separable_backward") == 4


@pytest.mark.parametrize("dtype", [kiln.float16, kiln.bfloat16], ids=str)
def test_half_precision_through_the_float32_loops(dtype, pool_spy):
    """float16/bfloat16 pools and resampling, forward and backward: the input (and the gradient) widened to
    float32, the float32 loops, the results rounded once, as the reference computes them: bit for bit,
    ties, NaN, inf and -0.0 included."""
    cases = [
        lambda t: P.max_pool2d(t, 3, 2, 1, return_indices=True),
        lambda t: P.adaptive_max_pool2d(t, (3, 4)),
        lambda t: P.avg_pool2d(t, 3, 2, 1),
        lambda t: P.interpolate(t, scale_factor=2, mode="bilinear"),
        lambda t: P.pad(t, (1, 2, 2, 1), mode="reflect"),
    ]
    for fn in cases:
        _grad_check(fn, _ties((2, 3, 8, 9), dtype, 1), 2)
    assert pool_spy.count("argmax_scatter") == 2
    assert pool_spy.count("separable") == 3 and pool_spy.count("separable_backward") == 3


def test_small_half_precision_calls_are_not_widened(pool_spy, monkeypatch):
    """Below the loops' threshold a half-precision call goes to the reference as it is: widening it first
    would only cost time, the float32 loops handing it back too."""
    from kiln_cpu import _kernel_support

    widened = []
    real = _kernel_support._widened
    monkeypatch.setattr(_kernel_support, "_widened", lambda t: widened.append(t) or real(t))
    monkeypatch.setattr(config, "min_numel", 1 << 18)
    for shape, runs in (((1, 2, 8, 8), False), ((2, 4, 16, 16), True)):
        x = make(shape, kiln.bfloat16, 1)
        fn = lambda t: P.max_pool2d(t, 2)
        assert_same(fn(x), reference(fn, x))
        assert bool(widened) is runs and bool(pool_spy) is runs


# -------------------------------------------------------------------------------------------- hand-backs

HANDED_BACK = {
    "max-empty-batch": lambda: P.max_pool2d(kiln.zeros(0, 3, 4, 4), 2),
    "max-float16-expanded": lambda: P.max_pool2d(make((1, 2, 6, 6), kiln.float16, 1).expand(3, 2, 6, 6), 2),
    "max-int": lambda: P.max_pool2d(make((1, 2, 6, 6), kiln.int64, 1), 2),
    "avg-int": lambda: P.avg_pool2d(make((1, 2, 6, 6), kiln.int64, 1), 2),
    "avg-empty-batch": lambda: P.avg_pool2d(kiln.zeros(0, 3, 4, 4), 2),
    "adaptive-to-zero": lambda: P.adaptive_avg_pool2d(make((1, 2, 6, 6), kiln.float32, 1), (0, 3)),
    "constant-pad": lambda: P.pad(make((1, 2, 6, 6), kiln.float32, 1), (1, 1)),
}


@pytest.mark.parametrize("case", list(HANDED_BACK))
def test_handed_back(case, pool_spy):
    assert_same(HANDED_BACK[case](), reference(HANDED_BACK[case]))
    assert pool_spy == []


@pytest.mark.parametrize("chain_min", [None, 1024])
def test_small_inputs_run_the_loops_from_the_chain_threshold(pool_spy, monkeypatch, chain_min):
    """Below ``min_numel`` the loops still run from ``chain_min_numel`` elements (they beat the reference at
    any size, so by default at every size); below a threshold set higher, calls go to the reference."""
    monkeypatch.setattr(config, "min_numel", 1 << 18)
    if chain_min is not None:
        monkeypatch.setattr(config, "chain_min_numel", chain_min)
    for fn in (lambda t: P.max_pool2d(t, 2), lambda t: P.avg_pool2d(t, 2)):
        for shape in ((2, 3, 8, 8), (2, 4, 16, 16), (1, 1, 2, 2)):
            x = make(shape, kiln.float32, 1)
            assert_same(fn(x), reference(fn, x))
            assert len(pool_spy) == (chain_min is None or x.numel() >= chain_min), shape
            pool_spy.clear()

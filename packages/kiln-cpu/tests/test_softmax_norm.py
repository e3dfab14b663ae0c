"""Softmax, log-softmax, logsumexp, layer norm, batch norm and group norm (forward) against the reference
kernels: every dim, both float dtypes, special values (NaN, inf, all -inf rows, constant channels),
affine or not, training and eval, and the cases handed back to the reference (non-contiguous inputs,
other dtypes, other reduced dims, empty inputs)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kiln_cpu_helpers import F, assert_same, make, reference

import kiln
from kiln._ops import normalization as N

FLOAT = [kiln.float32, kiln.float64]


# Softmax (and logsumexp) against the reference on any x86-64 CPU: kiln's float32 exp is within 2 ulps
# and NumPy's within 3 (NumPy's SIMD exp, and so its last bits, follow the CPU's vector extensions); the
# row sums run in different orders (kiln's running sums over the vector lanes, whose count follows the
# vector width, against NumPy's pairwise sums), then each side rounds once more: 8 ulps bound the
# difference everywhere. (4 held with AVX2; AVX-512 machines measured more.)
_ULPS = 8


def _atol(name, dtype):
    """log-softmax subtracts log(sum) from x - max: the rounding of the sum shows as an absolute error."""
    if name == "softmax":
        return 1e-30
    return 2e-6 if dtype is kiln.float32 else 1e-14


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
        assert_same(fn(x, dim), reference(fn, x, dim), ulps=_ULPS, atol=_atol(name, dtype))
    layout = "rows" if dim in (2, -1) else "slabs"
    assert norm_spy and all(c.endswith(layout) or c.endswith("rows") for c in norm_spy)


@pytest.mark.parametrize("width", [40, 100])  # below and above the rows' vectorised path (64)
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("name", list(SOFTMAX))
def test_softmax_special_rows(name, dtype, width, norm_spy):
    """All -inf rows, rows with NaN or +inf, huge values and a max of zeros of both signs give the
    reference's NaN/inf/0 pattern (the rows' max skips NaN: the NaN's exp makes the row's sum NaN)."""
    x = np.random.default_rng(0).standard_normal((7, width)).astype(dtype.numpy)
    x[0] = -np.inf
    x[1, 3] = np.nan
    x[2, 7] = np.inf
    x[3, :20] = -np.inf
    x[4] *= 1e30
    x[5] = 0.0
    x[6] = -np.abs(x[6])
    x[6, 1::2] = -0.0
    x[6, 0] = 0.0
    t = kiln.from_numpy(x)
    fn = SOFTMAX[name]
    for dim in (0, 1):
        assert_same(fn(t, dim), reference(fn, t, dim), ulps=_ULPS, atol=_atol(name, dtype))
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
    assert_same(F.softmax(h.t(), 1), reference(F.softmax, h.t(), 1))
    assert_same(F.layer_norm(h.t(), (8,)), reference(F.layer_norm, h.t(), (8,)))
    assert norm_spy == []


def _bits_equal(a: kiln.Tensor, b: kiln.Tensor) -> np.ndarray:
    """Per element: the same bits (NaN where both are NaN counts as the same)."""
    x, y = a.numpy().view(np.uint16).ravel(), b.numpy().view(np.uint16).ravel()
    return (x == y) | (np.isnan(a.to(kiln.float32).numpy()) & np.isnan(b.to(kiln.float32).numpy())).ravel()


@pytest.mark.parametrize("dtype", [kiln.float16, kiln.bfloat16], ids=str)
def test_half_precision_rows_compute_in_float32(dtype, norm_spy):
    """float16/bfloat16 softmax, log-softmax and layer norm over the last dim: each row widened to
    float32, computed as the float32 rows are, rounded once; within one half-precision ulp of the
    reference (which computes in float32 and rounds), bfloat16's softmax below 1.6e-38 flushed to 0 as
    float32's is, and layer norm's results near 0 within 1e-6 (its float32 sums differ from the
    reference's in the last bits beyond 128 elements, and + bias cancels there)."""
    x = make((9, 300), dtype, seed=4)
    xs = np.random.default_rng(5).standard_normal((9, 300)).astype(np.float32) * 4
    same = []
    for t in (x, kiln.from_numpy(xs).to(dtype)):
        for name, fn in SOFTMAX.items():
            got, want = fn(t, -1), reference(fn, t, -1)
            assert_same(got, want, ulps=1, atol=1e-30 if name == "softmax" else 0.0)
            same.append(_bits_equal(got, want))
        w, b = make((300,), dtype, seed=6), make((300,), dtype, seed=7)
        for params in ((w, b), (w, None), (None, None)):
            f = lambda u, p=params: F.layer_norm(u, (300,), *p)
            got, want = f(t), reference(f, t)
            assert_same(got, want, ulps=1, atol=1e-6)
            same.append(_bits_equal(got, want))
    assert np.mean(np.concatenate(same)) > 0.99  # rounded to nearest once: off by one ulp only rarely
    k = 1 if dtype is kiln.float16 else 2
    loops = [f"softmax-rows:{k}", f"log_softmax-rows:{k}"] + [f"layer_norm-rows:{k}"] * 3
    assert norm_spy == loops * 2


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_logsumexp_matches_reference(dtype, keepdim, norm_spy):
    fn = lambda t, d: kiln.logsumexp(t, d, keepdim=keepdim)
    for shape in ((4, 5, 37), (300,), (3, 1)):
        x = make(shape, dtype, seed=len(shape))
        assert_same(fn(x, -1), reference(fn, x, -1), ulps=_ULPS)
    for width in (9, 100):
        x = np.random.default_rng(1).standard_normal((5, width)).astype(dtype.numpy)
        x[0] = -np.inf
        x[1, 2] = np.inf
        x[2, 4] = np.nan
        x[3] *= 1e30
        t = kiln.from_numpy(x)
        assert_same(fn(t, 1), reference(fn, t, 1), ulps=_ULPS)
    assert norm_spy == ["logsumexp-rows"] * 5
    assert_same(fn(t, 0), reference(fn, t, 0))  # not the last dim: the reference
    assert_same(fn(t, (0, 1)), reference(fn, t, (0, 1)))
    assert len(norm_spy) == 5


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


# ------------------------------------------------------------------------------------ batch / group norm


def _affine(shape_c, dtype, affine, seed):
    rng = np.random.default_rng(seed)
    w = kiln.from_numpy(rng.standard_normal(shape_c).astype(dtype.numpy)) if affine in ("weight", "both") else None
    b = kiln.from_numpy(rng.standard_normal(shape_c).astype(dtype.numpy)) if affine in ("bias", "both") else None
    return w, b


def _stats(c, dtype, seed):
    rng = np.random.default_rng(seed)
    mean = kiln.from_numpy(rng.standard_normal(c).astype(dtype.numpy))
    var = kiln.from_numpy((rng.random(c) + 0.5).astype(dtype.numpy))
    return mean, var


BN_SHAPES = {"3d": (4, 3, 5), "2d": (6, 4), "4d": (2, 3, 4, 5), "5d-batch-of-one": (1, 2, 2, 3, 2)}


@pytest.mark.parametrize("affine", ["none", "weight", "bias", "both"])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_batch_norm_matches_reference_bit_for_bit(dtype, mode, affine, norm_spy):
    for i, shape in enumerate(BN_SHAPES.values()):
        x = kiln.from_numpy((np.random.default_rng(i).standard_normal(shape) * 3 + 1).astype(dtype.numpy))
        w, b = _affine((shape[1],), dtype, affine, i)
        rm, rv = _stats(shape[1], dtype, i) if mode == "eval" else (None, None)
        fn = lambda t, w=w, b=b, rm=rm, rv=rv: F.batch_norm(t, rm, rv, w, b, mode == "train", 0.1, 1e-5)
        assert_same(fn(x), reference(fn, x))
    assert norm_spy == ["batch_norm-channels"] * len(BN_SHAPES)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_batch_norm_one_channel(mode, norm_spy):
    """One channel: NumPy sums the merged (N, *) dims in its own order, so training goes to the reference;
    eval has no sums and runs the loop."""
    x = make((3, 1, 4, 5), kiln.float32, seed=3)
    rm, rv = _stats(1, kiln.float32, 2) if mode == "eval" else (None, None)
    fn = lambda u: F.batch_norm(u, rm, rv, training=mode == "train")
    assert_same(fn(x), reference(fn, x))
    for actual, expected in zip(N._batch_norm_stats(x), reference(N._batch_norm_stats, x)):
        assert_same(actual, expected)
    assert norm_spy == ([] if mode == "train" else ["batch_norm-channels"])


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_batch_norm_special_values(mode, norm_spy):
    x = np.random.default_rng(4).standard_normal((5, 4, 6)).astype(np.float32)
    x[:, 0] = 2.5  # a constant channel: variance 0
    x[1, 1, 2] = np.nan
    x[2, 2, 0] = np.inf
    x[:, 3] *= 1e20
    x[0, 3, :2] = -0.0
    t = kiln.from_numpy(x)
    rm, rv = _stats(4, kiln.float32, 1) if mode == "eval" else (None, None)
    fn = lambda u: F.batch_norm(u, rm, rv, training=mode == "train")
    assert_same(fn(t), reference(fn, t))
    assert norm_spy == ["batch_norm-channels"]


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_batch_norm_running_statistics_bit_for_bit(dtype, norm_spy):
    """``_batch_norm_stats`` (mean, unbiased variance; exactly 0 for a constant channel, NaN where a NaN
    is), and the running statistics batch_norm and instance_norm update with it."""
    x = np.random.default_rng(6).standard_normal((5, 4, 3, 2)).astype(dtype.numpy) * 2 + 3
    x[:, 1] = -0.5
    x[2, 2, 1, 1] = np.nan
    t = kiln.from_numpy(x)
    for actual, expected in zip(N._batch_norm_stats(t), reference(N._batch_norm_stats, t)):
        assert_same(actual, expected)

    def running(u, fn):
        rm, rv = kiln.zeros(4, dtype=dtype), kiln.ones(4, dtype=dtype)
        fn(u, rm, rv)
        return rm, rv

    for fn in (
        lambda u, rm, rv: F.batch_norm(u, rm, rv, training=True, momentum=0.3),
        lambda u, rm, rv: F.instance_norm(u[:, :2].contiguous(), rm[:2], rv[:2], momentum=0.3),
    ):
        for actual, expected in zip(running(t, fn), reference(running, t, fn)):
            assert_same(actual, expected)
    assert norm_spy.count("batch_norm_stats-channels") == 3


GN_CASES = {
    "3d-3-groups": ((2, 6, 5), 3),
    "2d": ((3, 4), 2),
    "4d-one-group": ((2, 4, 3, 3), 1),
    "4d": ((2, 4, 3, 3), 4),
}


@pytest.mark.parametrize("affine", ["none", "weight", "bias", "both"])
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_group_norm_matches_reference_bit_for_bit(dtype, affine, norm_spy):
    for i, (shape, groups) in enumerate(GN_CASES.values()):
        x = kiln.from_numpy((np.random.default_rng(i).standard_normal(shape) * 3 - 1).astype(dtype.numpy))
        w, b = _affine((shape[1],), dtype, affine, i)
        fn = lambda t, g=groups, w=w, b=b: F.group_norm(t, g, w, b, 1e-5)
        assert_same(fn(x), reference(fn, x))
    assert norm_spy == ["group_norm-rows"] * len(GN_CASES)


def test_group_norm_special_values(norm_spy):
    x = np.random.default_rng(5).standard_normal((3, 4, 5)).astype(np.float64)
    x[0, :2] = -1.25  # a constant group
    x[1, 2, 3] = np.nan
    x[2, 0, 1] = -np.inf
    t = kiln.from_numpy(x)
    fn = lambda u: F.group_norm(u, 2)
    assert_same(fn(t), reference(fn, t))
    assert norm_spy == ["group_norm-rows"]


def test_batch_and_group_norm_hand_back_to_the_reference(norm_spy):
    """Non-contiguous (transposed, strided) and empty inputs go to the reference."""
    x = make((4, 3, 6), kiln.float32, seed=2)
    cases = [
        (lambda u: F.batch_norm(u, None, None, training=True), x.transpose(0, 2)),
        (lambda u: F.batch_norm(u, None, None, training=True), x[:, :, ::2]),
        (lambda u: F.group_norm(u, 3), x.permute(0, 2, 1)),
        (lambda u: F.group_norm(u, 1), x[::2]),
        (lambda u: F.batch_norm(u, None, None, training=True), make((0, 3, 2), kiln.float32)),
        (lambda u: F.group_norm(u, 3), make((0, 3, 2), kiln.float64)),
    ]
    for fn, t in cases:
        assert_same(fn(t), reference(fn, t))
    assert norm_spy == []


@pytest.mark.parametrize("chain_min", [None, 100])
def test_small_inputs_run_the_loops_from_the_chain_threshold(norm_spy, monkeypatch, chain_min):
    """Below ``min_numel`` the softmax and norm loops still run from ``chain_min_numel`` elements (one
    serial pass beats the reference's chain of NumPy calls at any size by default); below a threshold
    set higher, inputs go to the reference."""
    from kiln_cpu import config

    monkeypatch.setattr(config, "min_numel", 1 << 18)
    if chain_min is not None:
        monkeypatch.setattr(config, "chain_min_numel", chain_min)
    for shape in ((128, 10), (8, 10), (1, 3)):
        ran = chain_min is None or math.prod(shape) >= chain_min
        x = make(shape, kiln.float32, seed=4)
        for fn in (lambda t: F.log_softmax(t, 1), lambda t: F.layer_norm(t, t.shape[-1:])):
            assert_same(fn(x), reference(fn, x), ulps=_ULPS, atol=2e-6)
            assert bool(norm_spy) is ran, shape
            norm_spy.clear()


@pytest.mark.parametrize("dtype", [kiln.float16, kiln.bfloat16], ids=str)
def test_half_precision_slabs_logsumexp_and_channel_norms(dtype, norm_spy):
    """Softmax over another dim than the last, logsumexp, batch norm (training and eval, with its batch
    statistics) and group norm in float16/bfloat16: the input widened to float32, the float32 loops, the
    result rounded once; parameters and running statistics of the input's dtype or float32. Within one
    half ulp of the reference (which computes in float32 and rounds), results near 0 within 1e-6."""
    x = kiln.from_numpy(np.random.default_rng(1).standard_normal((6, 12, 5, 7)).astype(np.float32) * 3 + 1).to(dtype)
    for fn in SOFTMAX.values():
        assert_same(fn(x, 1), reference(fn, x, 1), ulps=1, atol=1e-30)
    lse = lambda t: kiln.logsumexp(t, -1)
    assert_same(lse(x), reference(lse, x), ulps=1)
    rng = np.random.default_rng(2)
    w, b, rm = (kiln.from_numpy(rng.standard_normal(12).astype(np.float32)) for _ in range(3))
    rv = kiln.from_numpy(rng.random(12).astype(np.float32) + 0.5)
    for pd in (dtype, kiln.float32):
        p = [t.to(pd) for t in (w, b, rm, rv)]
        for fn in (
            lambda t, p=p: N._native_batch_norm(t, p[0], p[1], None, None, True, 1e-5),
            lambda t, p=p: N._native_batch_norm(t, p[0], p[1], p[2], p[3], False, 1e-5),
            lambda t, p=p: F.group_norm(t, 3, p[0], p[1]),
        ):
            got = fn(x)
            assert got.dtype == dtype
            assert_same(got, reference(fn, x), ulps=1, atol=1e-6)
    for actual, expected in zip(N._batch_norm_stats(x), reference(N._batch_norm_stats, x)):
        assert actual.dtype == kiln.float32
        assert_same(actual, expected, ulps=2)
    channels = ["batch_norm-channels", "batch_norm-channels", "group_norm-rows"]
    assert norm_spy == ["softmax-slabs", "log_softmax-slabs", "logsumexp-rows"] + channels * 2 + [
        "batch_norm_stats-channels"
    ]

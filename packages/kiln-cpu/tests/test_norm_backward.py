"""The fused backward ops of the softmax family and the norms against the reference kernels:
``_softmax_backward_data`` / ``_log_softmax_backward_data`` (rows and slabs) and ``_native_norm_backward``
(batch norm in training and eval, layer norm, group norm; every output mask, affine or not), called
directly and through autograd, in both float dtypes, with special values, and the cases handed back to
the reference (non-contiguous or expanded operands, other dtypes, empty and 0-d tensors, merged sums).

The loops are bit for bit the reference's where each summed run has at most 128 elements (NumPy's
pairwise leaf); longer runs keep thirty-two running sums per leaf, and log-softmax's exp differs in its
last bit: the tolerances allow for both."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
from kiln_cpu_helpers import F, assert_same, make, reference

import kiln
from kiln._ops import normalization, softmax

N = types.SimpleNamespace(**vars(softmax), **{k: v for k, v in vars(normalization).items() if k not in vars(softmax)})


FLOAT = [kiln.float32, kiln.float64]


def _randn(shape, dtype, seed, scale=3.0, shift=0.0):
    x = np.random.default_rng(seed).standard_normal(shape) * scale + shift
    return kiln.from_numpy(np.asarray(x, dtype.numpy))


# ------------------------------------------------------------------------------------ softmax backward

SOFTMAX_BWD = {
    "softmax": (N._softmax_backward_data, N.softmax),
    "log_softmax": (N._log_softmax_backward_data, N.log_softmax),
}


def _exp_tol(name, dtype):
    """log-softmax's gradient subtracts exp(y) * s: exp's last bit shows as an absolute error; a row sum over
    more than 128 elements keeps thirty-two running sums (NumPy's eight): its last bits too."""
    return {"ulps": 4, "atol": 2e-6 if dtype is kiln.float32 else 1e-14}


def _long_row_tol(n, dtype):
    """Bit for bit up to 128 elements per summed row (NumPy's leaf), within a few ulps beyond."""
    return {} if n <= 128 else {"ulps": 16, "atol": 1e-5 if dtype is kiln.float32 else 1e-13}


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("name", list(SOFTMAX_BWD))
def test_softmax_backward_matches_reference(name, dtype, dim, norm_spy):
    op, fwd = SOFTMAX_BWD[name]
    expected = []
    for i, shape in enumerate(((4, 5, 37), (3, 200, 1), (2, 1, 300))):
        y = fwd(_randn(shape, dtype, i), dim)
        g = _randn(shape, dtype, i + 10, scale=1.0)
        assert_same(op(g, y, dim), reference(op, g, y, dim), **_exp_tol(name, dtype))
        expected.append(f"{name}_backward-" + ("rows" if dim == -1 or shape[dim + 1 :] in ((1,), ()) else "slabs"))
    assert [c for c in norm_spy if "_backward-" in c] == expected


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("name", list(SOFTMAX_BWD))
def test_softmax_backward_special_values(name, dtype, dim, norm_spy):
    """NaN, inf and -0.0 in the gradient, outputs of all -inf rows (NaN), of -inf entries (0 / -inf)."""
    op, fwd = SOFTMAX_BWD[name]
    x = np.random.default_rng(0).standard_normal((6, 40)).astype(dtype.numpy)
    x[0] = -np.inf
    x[1, 3] = -np.inf
    x[2, 7] = np.inf
    x[3, 5] = np.nan
    y = fwd(kiln.from_numpy(x), dim)
    gn = np.random.default_rng(1).standard_normal((6, 40)).astype(dtype.numpy)
    gn[4, 1] = np.nan
    gn[5, 2] = np.inf
    gn[5, 3] = -0.0
    gn[:, 10] = -0.0
    g = kiln.from_numpy(gn)
    assert_same(op(g, y, dim), reference(op, g, y, dim), **_exp_tol(name, dtype))
    assert [c for c in norm_spy if "_backward-" in c] == [f"{name}_backward-" + ("rows" if dim == 1 else "slabs")]


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("name", list(SOFTMAX_BWD))
def test_softmax_backward_through_autograd(name, dtype, norm_spy):
    _, fwd = SOFTMAX_BWD[name]
    x = _randn((8, 33), dtype, 3).requires_grad_()
    g = _randn((8, 33), dtype, 4, scale=1.0)

    def grad_of(t):
        (gx,) = kiln.autograd.grad(fwd(t, 1), t, g)
        return gx

    # the forward loops differ from the reference in exp's last bit, and the backward reads their output
    assert_same(grad_of(x), reference(grad_of, x), ulps=16, atol=1e-6 if dtype is kiln.float32 else 1e-14)
    assert norm_spy == [f"{name}-rows", f"{name}_backward-rows"]


def test_softmax_backward_hands_back_to_the_reference(norm_spy):
    """Gradients in another dim order or expanded, transposed outputs, mixed dtypes, empty and 0-d."""
    y = N.softmax(make((6, 5), kiln.float32, seed=1), 1)
    g = make((6, 5), kiln.float32, seed=2)
    cases = [
        (g.t().contiguous().t(), y),
        (kiln.ones(()).expand(6, 5), y),
        (g.t(), N.softmax(make((5, 6), kiln.float32, seed=3), 0)),
        (g.to(kiln.float64), y),
        (make((0, 5), kiln.float32), make((0, 5), kiln.float32)),
        (make((), kiln.float64), make((), kiln.float64)),
    ]
    for op in (N._softmax_backward_data, N._log_softmax_backward_data):
        for gg, yy in cases:
            assert_same(op(gg, yy, 1 if yy.dim() else 0), reference(op, gg, yy, 1 if yy.dim() else 0))
    assert [c for c in norm_spy if "_backward-" in c] == []


# --------------------------------------------------------------------------------------- norm backward

ALL = (True, True, True)
MASKS = {
    "all": ALL,
    "input-only": (True, False, False),
    "params-only": (False, True, True),
    "bias-only": (False, False, True),
}


def _params(c, dtype, seed, affine):
    w = _randn(c, dtype, seed, scale=1.0, shift=0.5) if affine else None
    return w


LAYER_CASES = {
    "rows": ((6, 130), (130,)),
    "two-dims": ((3, 4, 5, 6), (5, 6)),
    "every-dim": ((7,), (7,)),
    "one-row": ((1, 9), (9,)),
}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_layer_norm_backward_bit_for_bit(dtype, affine, mask, norm_spy):
    for i, (shape, ns) in enumerate(LAYER_CASES.values()):
        x, g = _randn(shape, dtype, i, shift=1.0), _randn(shape, dtype, i + 20, scale=1.0)
        w = _params(ns, dtype, i + 40, affine)
        args = (g, x, w, None, None, 1e-5, N._layer_layout(shape, ns), MASKS[mask])
        for actual, expected in zip(N._native_norm_backward(*args), reference(N._native_norm_backward, *args)):
            assert_same(actual, expected, **_long_row_tol(math.prod(ns), dtype))
    assert norm_spy.count("layer_norm_backward-rows") == len(LAYER_CASES)
    params = MASKS[mask][2] or (MASKS[mask][1] and affine)
    assert norm_spy.count("norm_params-cols") == (len(LAYER_CASES) if params else 0)


BATCH_SHAPES = {"3d": (4, 3, 5), "2d": (6, 4), "4d": (2, 3, 4, 5), "batch-of-one": (1, 3, 7)}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_batch_norm_backward_bit_for_bit(dtype, mode, affine, mask, norm_spy):
    for i, shape in enumerate(BATCH_SHAPES.values()):
        c = shape[1]
        x, g = _randn(shape, dtype, i, shift=-1.0), _randn(shape, dtype, i + 20, scale=1.0)
        stats = (None, None)
        if mode == "eval":
            stats = (_randn(c, dtype, i + 30, scale=1.0), kiln.from_numpy(np.linspace(0.5, 2, c).astype(dtype.numpy)))
        args = (g, x, _params((c,), dtype, i + 40, affine), *stats, 1e-3, N._channel_layout(shape), MASKS[mask])
        for actual, expected in zip(N._native_norm_backward(*args), reference(N._native_norm_backward, *args)):
            assert_same(actual, expected)
    assert norm_spy == ["batch_norm_backward-channels"] * len(BATCH_SHAPES)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_batch_norm_long_runs_within_ulps(dtype, mode, norm_spy):
    """Runs of more than 128 elements (a channel's pixels in one image) are summed with thirty-two running
    sums per leaf: within a few ulps of NumPy's eight, forward, backward and the batch statistics."""
    shape = (3, 4, 16, 21)
    x, g = _randn(shape, dtype, 1, shift=-1.0), _randn(shape, dtype, 2, scale=1.0)
    w, b = _params((4,), dtype, 3, True), _params((4,), dtype, 4, True)
    stats = (None, None)
    if mode == "eval":
        stats = (_randn(4, dtype, 5, scale=1.0), kiln.from_numpy(np.linspace(0.5, 2, 4).astype(dtype.numpy)))
    tol = {"ulps": 64, "atol": 1e-5 if dtype is kiln.float32 else 1e-13}
    args = (g, x, w, *stats, 1e-3, N._channel_layout(shape), (True, True, True))
    for actual, expected in zip(N._native_norm_backward(*args), reference(N._native_norm_backward, *args)):
        assert_same(actual, expected, **tol)
    fn = lambda t: F.batch_norm(t, *stats, w, b, mode == "train", 0.1, 1e-3)
    assert_same(fn(x), reference(fn, x), **tol)
    for actual, expected in zip(N._batch_norm_stats(x), reference(N._batch_norm_stats, x)):
        assert_same(actual, expected, **tol)
    assert norm_spy[:2] == ["batch_norm_backward-channels", "batch_norm-channels"]


GROUP_CASES = {"3d": ((2, 6, 5), 3), "2d": ((3, 4), 2), "4d-one-group": ((2, 4, 3, 3), 1), "4d": ((2, 4, 3, 3), 4)}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_group_norm_backward_bit_for_bit(dtype, affine, mask, norm_spy):
    for i, (shape, groups) in enumerate(GROUP_CASES.values()):
        x, g = _randn(shape, dtype, i, shift=2.0), _randn(shape, dtype, i + 20, scale=1.0)
        args = (g, x, _params((shape[1],), dtype, i + 40, affine), None, None, 1e-5, N._group_layout(shape, groups))
        args = (*args, MASKS[mask])
        for actual, expected in zip(N._native_norm_backward(*args), reference(N._native_norm_backward, *args)):
            assert_same(actual, expected)
    assert norm_spy == ["group_norm_backward-rows"] * len(GROUP_CASES)


def _special_input(shape, dtype):
    x = np.random.default_rng(7).standard_normal(shape).astype(dtype.numpy)
    flat = x.reshape(shape[0], shape[1], -1)
    flat[:, 0] = 0.75  # a constant channel / group / row: variance exactly 0
    flat[0, 1, 1] = np.nan
    flat[1, 2, 0] = np.inf
    flat[:, 3] *= 1e18
    g = np.random.default_rng(8).standard_normal(shape).astype(dtype.numpy)
    g.reshape(shape[0], shape[1], -1)[1, 1, :] = -0.0
    g.reshape(shape[0], shape[1], -1)[0, 3, 2] = -np.inf
    return kiln.from_numpy(x), kiln.from_numpy(g)


BN_LOOP, LN_LOOPS, GN_LOOP = (
    ["batch_norm_backward-channels"],
    ["layer_norm_backward-rows", "norm_params-cols"],
    ["group_norm_backward-rows"],
)
# kind -> (mean, var, layout) for an input shape; the loops that run
SPECIAL_LAYOUTS = {
    "batch-train": (lambda s: (None, None, N._channel_layout(s)), BN_LOOP),
    "batch-eval": (lambda s: (kiln.zeros(s[1]), kiln.ones(s[1]), N._channel_layout(s)), BN_LOOP),
    "layer": (lambda s: (None, None, N._layer_layout(s, s[2:])), LN_LOOPS),
    "group": (lambda s: (None, None, N._group_layout(s, 4)), GN_LOOP),
}


@pytest.mark.parametrize("kind", list(SPECIAL_LAYOUTS))
def test_norm_backward_special_values(kind, norm_spy):
    shape = (3, 4, 5)
    x, g = _special_input(shape, kiln.float32)
    make_stats, loops = SPECIAL_LAYOUTS[kind]
    mean, var, lay = make_stats(shape)
    w = kiln.from_numpy(np.linspace(-1, 1, 5 if kind == "layer" else 4).astype(np.float32))
    args = (g, x, w, mean, var, 1e-5, lay, ALL)
    for actual, expected in zip(N._native_norm_backward(*args), reference(N._native_norm_backward, *args)):
        assert_same(actual, expected)
    assert norm_spy == loops


TRAINING = {
    "batch_norm": (
        (4, 3, 6),
        3,
        lambda x, w, b: F.batch_norm(x, kiln.zeros(3, dtype=x.dtype), kiln.ones(3, dtype=x.dtype), w, b, True),
    ),
    "batch_norm_eval": (
        (4, 3, 6),
        3,
        lambda x, w, b: F.batch_norm(x, kiln.full((3,), 0.5, dtype=x.dtype), kiln.full((3,), 2.0, dtype=x.dtype), w, b),
    ),
    "layer_norm": ((5, 4, 6), (4, 6), lambda x, w, b: F.layer_norm(x, (4, 6), w, b)),
    "group_norm": ((2, 6, 5), 6, lambda x, w, b: F.group_norm(x, 3, w, b)),
}


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("name", list(TRAINING))
def test_norm_gradients_through_autograd_bit_for_bit(name, dtype, norm_spy):
    shape, c, fn = TRAINING[name]
    x = _randn(shape, dtype, 1).requires_grad_()
    w = _randn(c, dtype, 2, scale=1.0).requires_grad_()
    b = _randn(c, dtype, 3, scale=1.0).requires_grad_()
    g = _randn(shape, dtype, 4, scale=1.0)

    def grads(x, w, b):
        return kiln.autograd.grad(fn(x, w, b), (x, w, b), g)

    for actual, expected in zip(grads(x, w, b), reference(grads, x, w, b)):
        assert_same(actual, expected)
    assert any(c.endswith("backward-channels") or c.endswith("backward-rows") for c in norm_spy)


def test_norm_backward_hands_back_to_the_reference(norm_spy):
    """Operands in another dim order, an expanded gradient (NumPy sums a broadcast dim in another order),
    mixed dtypes, empty inputs, and the sums NumPy merges (one channel; a layer norm over one element) go
    to the reference."""
    shape = (4, 3, 5)
    x, g = make(shape, kiln.float32, seed=1), make(shape, kiln.float32, seed=2)
    lay = N._channel_layout(shape)
    w = kiln.ones(3)
    cases = [
        (g.transpose(0, 2).contiguous().transpose(0, 2), x, w, None, None, lay),
        (g, x.transpose(0, 2).contiguous().transpose(0, 2), w, None, None, lay),
        (kiln.ones(()).expand(*shape), x, w, None, None, lay),
        (g.to(kiln.float64), x, w, None, None, lay),
        (g, x, w.to(kiln.float64), None, None, lay),
        (g, x, w, kiln.zeros(3, dtype=kiln.float64), kiln.ones(3, dtype=kiln.float64), lay),
        (make((0, 3, 2), kiln.float32), make((0, 3, 2), kiln.float32), w, None, None, N._channel_layout((0, 3, 2))),
        (make((4, 1, 5), kiln.float32), make((4, 1, 5), kiln.float32), None, None, None, N._channel_layout((4, 1, 5))),
        (make((4, 1, 5), kiln.float64), make((4, 1, 5), kiln.float64), None, None, None, N._group_layout((4, 1, 5), 1)),
        (make((6, 1), kiln.float32), make((6, 1), kiln.float32), None, None, None, N._layer_layout((6, 1), (1,))),
    ]
    for gg, xx, ww, mean, var, lay in cases:
        args = (gg, xx, ww, mean, var, 1e-5, lay, ALL)
        for actual, expected in zip(N._native_norm_backward(*args), reference(N._native_norm_backward, *args)):
            assert_same(actual, expected)
    assert norm_spy == []


# ------------------------------------------------------------------------- half precision, expanded grads

HALF = [kiln.float16, kiln.bfloat16]


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_precision_backward_computes_in_float32(dtype, norm_spy):
    """float16/bfloat16 operands are widened to float32 and run the float32 loops; the gradients come out
    in float32 as the reference's (which widens them too), within the float32 loops' tolerance; the
    parameters may be float32 or the input's dtype."""
    for name, (op, fwd) in SOFTMAX_BWD.items():
        for dim in (0, -1):
            y = fwd(_randn((12, 40), dtype, 1), dim)
            g = _randn((12, 40), dtype, 2, scale=1.0)
            got = op(g, y, dim)
            assert got.dtype == kiln.float32
            assert_same(got, reference(op, g, y, dim), **_exp_tol(name, kiln.float32))
    shape = (4, 6, 5)
    x, g = _randn(shape, dtype, 3, shift=1.0), _randn(shape, dtype, 4, scale=1.0)
    stats = (_randn(6, kiln.float32, 5, scale=1.0), kiln.from_numpy(np.linspace(0.5, 2, 6).astype(np.float32)))
    for pd in (dtype, kiln.float32):
        w6, w5 = _params((6,), pd, 6, True), _params((5,), pd, 7, True)
        cases = (
            (w6, None, None, N._channel_layout(shape)),
            (w6, stats[0].to(pd), stats[1].to(pd), N._channel_layout(shape)),
            (w5, None, None, N._layer_layout(shape, (5,))),
            (w6, None, None, N._group_layout(shape, 3)),
        )
        for w, mean, var, lay in cases:
            args = (g, x, w, mean, var, 1e-5, lay, ALL)
            for actual, expected in zip(N._native_norm_backward(*args), reference(N._native_norm_backward, *args)):
                assert actual.dtype == kiln.float32
                assert_same(actual, expected)
    loops = ["batch_norm_backward-channels"] * 2 + LN_LOOPS + GN_LOOP
    assert [c for c in norm_spy if "backward-" in c or "params" in c] == ["softmax_backward-slabs"] + [
        "softmax_backward-rows",
        "log_softmax_backward-slabs",
        "log_softmax_backward-rows",
    ] + loops * 2

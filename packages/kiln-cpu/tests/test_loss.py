"""nll_loss forward and backward (``_nll_loss_backward``) against the reference kernels, bit for bit: 1-d,
2-d and spatial inputs, class weights (NaN and 0 included), ignore_index, every reduction, uint8
targets, special output gradients, and out-of-range targets raising the reference's error."""

from __future__ import annotations

import numpy as np
import pytest
from kiln_cpu_helpers import F, assert_same, reference

import kiln
from kiln._ops.classification_loss import _nll_loss_backward
from kiln_cpu import _jit_loss, config

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


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("dtype", [kiln.float16, kiln.bfloat16], ids=str)
def test_half_precision_through_the_float32_loops(dtype, reduction, loss_spy):
    """float16/bfloat16 nll_loss (weighted, two targets ignored) and its gradient: the operands widened to
    float32, the float32 loops, the results rounded once, as the reference computes them: bit for bit."""
    x, t, classes = _case((4, 7, 3, 5), kiln.float32, 1)
    x = x.to(dtype).requires_grad_()
    w = kiln.from_numpy(np.random.default_rng(9).random(classes).astype(np.float32)).to(dtype)

    def loss_and_grad(x):
        loss = F.nll_loss(x, t, weight=w, reduction=reduction)
        return loss, kiln.autograd.grad(loss, x, kiln.ones_like(loss))[0]

    for got, want in zip(loss_and_grad(x), reference(loss_and_grad, x)):
        assert got.dtype == dtype
        assert_same(got.detach(), want.detach())
    assert {"nll_rows", "nll_backward_fill"} <= set(loss_spy)


@pytest.fixture
def loss_spy(monkeypatch):
    """A list that receives the name of every nll Numba loop the kernels call."""
    calls: list[str] = []
    for name in ("nll_rows", "nll_weights", "nll_backward_fill"):
        real = getattr(_jit_loss, name)
        monkeypatch.setattr(_jit_loss, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    return calls


def test_the_numba_loop_runs(loss_spy):
    x, t, _ = _case((2, 7, 3, 5), kiln.float32, 0)
    assert_same(F.nll_loss(x, t), reference(F.nll_loss, x, t))
    assert loss_spy == ["nll_rows"]


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


# ------------------------------------------------------------------------------------------- backward


def _out_grad(x, t, reduction, dtype, seed):
    shape = tuple(t.shape) if reduction == "none" and x.dim() > 1 else ()
    return kiln.from_numpy(np.asarray(np.random.default_rng(seed).standard_normal(shape) + 0.5, dtype.numpy))


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_nll_loss_backward_matches_reference(dtype, shape, weighted, reduction, loss_spy):
    x, t, classes = _case(shape, dtype, len(shape) + 5)
    w = None
    if weighted:
        wn = np.random.default_rng(9).random(classes).astype(dtype.numpy)
        wn[1] = 0.0
        w = kiln.from_numpy(wn)
    g = _out_grad(x, t, reduction, dtype, 3)
    args = (g, x, t, w, -100, reduction)
    assert_same(_nll_loss_backward(*args), reference(_nll_loss_backward, *args))
    assert loss_spy == ["nll_weights", "nll_backward_fill"]


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_nll_loss_backward_special_values(reduction, loss_spy):
    """Output gradients NaN, inf and -0.0 (ignored rows then write -0.0 or NaN at class 0, as the
    reference), NaN and 0 class weights, an ignore_index inside the class range, uint8 targets."""
    x, _, classes = _case((6, 5), kiln.float32, 0)
    t8 = kiln.from_numpy(np.array([0, 1, 2, 3, 4, 3], np.uint8))
    wn = np.ones(classes, np.float32)
    wn[2] = np.nan
    wn[4] = 0.0
    w = kiln.from_numpy(wn)
    if reduction == "none":
        g = kiln.from_numpy(np.array([np.nan, np.inf, -0.0, 2.0, -np.inf, 1.5], np.float32))
    else:
        g = kiln.tensor(-np.inf if reduction == "sum" else -0.0, dtype=kiln.float32)
    for weight in (None, w):
        args = (g, x, t8, weight, 3, reduction)
        assert_same(_nll_loss_backward(*args), reference(_nll_loss_backward, *args))
    assert loss_spy == ["nll_weights", "nll_backward_fill"] * 2


def test_nll_loss_backward_all_ignored_and_through_autograd(loss_spy):
    x, t, _ = _case((9, 7), kiln.float64, 1)
    ignored = kiln.from_numpy(np.full(9, -100, np.int64))
    g = kiln.tensor(1.0, dtype=kiln.float64)
    args = (g, x, ignored, None, -100, "mean")
    assert_same(_nll_loss_backward(*args), reference(_nll_loss_backward, *args))  # 0 / 0: zeros
    xs = x.detach().requires_grad_()

    def grad_of(a):
        return kiln.autograd.grad(F.cross_entropy(a, t), a)[0]

    assert_same(grad_of(xs), reference(grad_of, xs), ulps=16, atol=1e-14)  # log_softmax's exp: last bits
    assert loss_spy.count("nll_backward_fill") == 2


def test_nll_loss_backward_hands_back_to_the_reference(loss_spy):
    """Out-of-range targets (the reference raises), a weight of another dtype than the gradient, half
    dtypes, empty inputs."""
    x, t, _ = _case((6, 5), kiln.float32, 0)
    g = kiln.tensor(1.0)
    bad = kiln.from_numpy(np.array([0, 1, 5, 3, 4, 1]))
    with pytest.raises(IndexError, match="Target 5 is out of bounds"):
        _nll_loss_backward(g, x, bad, None, -100, "mean")
    cases = [
        (g.to(kiln.float64), x, t, kiln.ones(5)),
        (g, x, t, kiln.ones(5, dtype=kiln.float64)),
        (g.to(kiln.float16), x[:1].to(kiln.float16).expand(*x.shape), t, None),  # half: widened only when dense
        (g, kiln.zeros(0, 5), kiln.zeros(0, dtype=kiln.int64), None),
    ]
    for gg, xx, tt, ww in cases:
        args = (gg, xx, tt, ww, -100, "sum")
        try:
            expected = reference(_nll_loss_backward, *args)
        except RuntimeError:
            with pytest.raises(RuntimeError):
                _nll_loss_backward(*args)
        else:
            assert_same(_nll_loss_backward(*args), expected)
    assert loss_spy == ["nll_weights"]  # the out-of-range target: found by the loop, raised by the reference


@pytest.mark.parametrize("chain_min", [None, 100])
def test_small_inputs_run_the_loops_from_the_chain_threshold(loss_spy, monkeypatch, chain_min):
    """Below ``min_numel``, nll_loss runs its loops from ``chain_min_numel`` elements: at any size by
    default, and from a threshold set higher."""
    monkeypatch.setattr(config, "min_numel", 1 << 18)
    if chain_min is not None:
        monkeypatch.setattr(config, "chain_min_numel", chain_min)
    for shape in ((128, 10), (8, 10), (2, 3)):
        ran = ["nll_rows"] if chain_min is None or shape[0] * shape[1] >= chain_min else []
        x, t, _ = _case(shape, kiln.float32, 0)
        assert_same(F.nll_loss(x, t), reference(F.nll_loss, x, t))
        assert loss_spy == ran, shape
        loss_spy.clear()


def test_a_mean_over_no_target_is_nan_or_zeros_without_a_warning(loss_spy):
    """Every target ignored: the mean divides by a weight sum of 0, NaN forward and zero gradients (as the
    reference), and no NumPy warning escapes, whose suppression only that case pays for."""
    import warnings

    x, _, _ = _case((6, 5), kiln.float32, 0)
    xs = x.detach().requires_grad_()
    ignored = kiln.from_numpy(np.full(6, -100, np.int64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = F.nll_loss(xs, ignored)
        loss.backward()
    assert loss.isnan().item() and xs.grad.abs().sum().item() == 0
    assert loss_spy.count("nll_rows") == 1 and loss_spy.count("nll_backward_fill") == 1


# ------------------------------------------------- kiln-compile's fused cross entropy (log-softmax, nll)


def _two_kernels(x, t, ignore_index, reduction, grad):
    """What the fused kernels stand for: the four ops' own kernels."""
    from kiln.backend import call_kernel, op

    lp = call_kernel(op("_log_softmax"), (x, 1))
    loss = call_kernel(op("_nll_loss"), (lp, t, None, ignore_index, reduction))
    g = call_kernel(op("_nll_loss_backward"), (grad, lp, t, None, ignore_index, reduction))
    return lp, loss, call_kernel(op("_log_softmax_backward_data"), (g, lp, 1))


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("shape", [(0, 5), (9, 1), (9, 7), (5, 100), (700, 10)], ids=str)
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_fused_cross_entropy_matches_the_two_kernels_bit_for_bit(dtype, shape, reduction):
    from kiln_cpu.kernels_loss import log_softmax_nll, log_softmax_nll_backward

    rng = np.random.default_rng(shape[0])
    xn = rng.standard_normal(shape).astype(dtype.numpy) * 4
    if shape[0] >= 5 and shape[1] >= 2:
        xn[1, 0], xn[2, 1], xn[3, :] = np.inf, -np.inf, -np.inf  # an infinite logit, a row of -inf
        xn[4, 0] = np.nan
    tn = rng.integers(0, shape[1], shape[0])
    tn[::3] = 7  # ignored (and a valid class where there are 8 or more)
    x, t = kiln.from_numpy(xn), kiln.from_numpy(tn)
    threads = kiln.get_num_threads()
    try:
        for n_threads in (1, 2):
            kiln.set_num_threads(n_threads)
            for g in (1.0, -2.5, 0.0, np.inf, np.nan):
                grad = kiln.tensor(g, dtype=dtype)
                lp_want, loss_want, grad_want = _two_kernels(x, t, 7, reduction, grad)
                lp, loss = log_softmax_nll(x, t, 7, reduction)
                got = log_softmax_nll_backward(grad, lp_want, t, 7, reduction)
                assert_same(loss, loss_want)  # (a NaN loss's sign is the NumPy or Numba path's, by size)
                for a, b in ((lp, lp_want), (got, grad_want)):
                    assert_same(a, b)
                    assert np.array_equal(np.signbit(a.numpy()), np.signbit(b.numpy()))  # a NaN's sign too
    finally:
        kiln.set_num_threads(threads)


def test_fused_cross_entropy_hands_other_inputs_to_the_two_kernels():
    """A transposed (non-contiguous) input or log-probabilities, and a bad target, run the ops' own kernels:
    their numbers, and their error."""
    from kiln_cpu.kernels_loss import log_softmax_nll, log_softmax_nll_backward

    x = kiln.randn(6, 4).t()
    t = kiln.tensor([0, 1, 2, 3])
    lp_want, loss_want, grad_want = _two_kernels(x, t, -100, "mean", kiln.tensor(1.0))
    lp, loss = log_softmax_nll(x, t, -100, "mean")
    assert_same(lp, lp_want)
    assert_same(loss, loss_want)
    lp_t = lp_want.t().contiguous().t()
    assert_same(log_softmax_nll_backward(kiln.tensor(1.0), lp_t, t, -100, "mean"), grad_want)
    for bad in (6, -1):  # 6 classes
        with pytest.raises(IndexError, match=f"Target {bad} is out of bounds"):
            log_softmax_nll(x.contiguous(), kiln.tensor([0, bad, 1, 2]), -100, "sum")


def test_fused_cross_entropy_other_reductions_are_the_two_kernels():
    """Reduction "none" gives the two kernels' per-row losses and gradient, and another one what they make of
    it (the public functions refuse it before)."""
    from kiln_cpu.kernels_loss import log_softmax_nll, log_softmax_nll_backward

    x, t = kiln.randn(5, 4), kiln.tensor([0, 3, -100, 1, 2])
    g = kiln.randn(5)
    lp_want, loss_want, grad_want = _two_kernels(x, t, -100, "none", g)
    lp, loss = log_softmax_nll(x, t, -100, "none")
    assert_same(lp, lp_want)
    assert_same(loss, loss_want)
    assert_same(log_softmax_nll_backward(g, lp_want, t, -100, "none"), grad_want)
    _, bogus_want, _ = _two_kernels(x, t, -100, "bogus", kiln.tensor(1.0))
    assert_same(log_softmax_nll(x, t, -100, "bogus")[1], bogus_want)

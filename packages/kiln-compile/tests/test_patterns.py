"""Patterns: cross entropy's four ops (``_log_softmax``, ``_nll_loss`` and their backwards) become two calls
of the device's fused kernels, with the eager results — losses, log-probabilities and gradients, ignored
targets, both reductions, both float dtypes — and the eager error for a bad target. What the kernels do not
take (class weights, no reduction, label smoothing, other shapes and layouts) keeps the ops' own kernels."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import kiln
import kiln.compile
import kiln.nn.functional as F
import kiln.plugins
from kiln.compile import _backends

CODEGEN = next((c for c in kiln.plugins.compilers().values() if getattr(c, "device_type", None) == "cpu"), None)
pytestmark = pytest.mark.skipif(
    getattr(CODEGEN, "log_softmax_nll", None) is None, reason="no cpu code generator with the fused cross entropy"
)

FUSED = {"log_softmax_nll", "log_softmax_nll_backward"}
OPS = ("_log_softmax", "_nll_loss", "_nll_loss_backward", "_log_softmax_backward_data")


def _callees(compiled) -> list[str]:
    """What the generated programs of a compiled function's first trace call: op names for ``_k(cN, ...)``,
    the function's name for ``... = cN(...)`` (a fused kernel)."""
    entry = compiled._entries[0]
    names = []
    for program in (entry.forward, entry.backward):
        if program is not None:
            g = program.__globals__
            names += [g[c].name for c in re.findall(r"_k\((c\d+),", program.source)]
            names += [getattr(g[c], "__name__", c) for c in re.findall(r"= (c\d+)\(", program.source)]
    return names


def _step(model_w, x, y, **kw):
    """Forward, cross entropy, backward: the loss and the weight's gradient (cleared first)."""
    model_w.grad = None
    logits = x @ model_w
    loss = F.cross_entropy(logits, y, **kw)
    loss.backward()
    return loss.detach(), model_w.grad.clone()


def _both(fn, w, *args, **kw):
    """``fn`` run eagerly and compiled (twice: the second call runs the program), on copies of ``w``."""
    we = w.detach().clone().requires_grad_()
    wc = w.detach().clone().requires_grad_()
    eager = fn(we, *args, **kw)
    compiled = kiln.compile(lambda w, *a: fn(w, *a, **kw))
    compiled(wc, *args)
    return eager, compiled(wc, *args), compiled


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("classes", [1, 10, 100])
def test_cross_entropy_fuses_and_matches_eager(dtype, reduction, classes):
    kiln.manual_seed(classes)
    x = kiln.randn(33, 7, dtype=dtype)
    w = kiln.randn(7, classes, dtype=dtype)
    y = kiln.randint(0, classes, (33,))
    y[::5] = -100  # ignored rows
    (loss_e, grad_e), (loss_c, grad_c), compiled = _both(_step, w, x, y, reduction=reduction)
    names = _callees(compiled)
    assert set(names) >= FUSED and not set(OPS) & set(names), names
    tol = 1e-6 if dtype is kiln.float32 else 1e-12
    assert kiln.allclose(loss_c, loss_e, rtol=tol, atol=tol)
    assert kiln.allclose(grad_c, grad_e, rtol=tol, atol=tol)


def test_the_whole_step_fuses_into_one_program_and_trains_as_eager():
    kiln.manual_seed(0)
    model = kiln.nn.Sequential(kiln.nn.Linear(12, 16), kiln.nn.ReLU(), kiln.nn.Linear(16, 5))
    twin = kiln.nn.Sequential(kiln.nn.Linear(12, 16), kiln.nn.ReLU(), kiln.nn.Linear(16, 5))
    twin.load_state_dict(model.state_dict())
    opts = [kiln.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin)]
    x, y = kiln.randn(20, 12), kiln.randint(0, 5, (20,))

    def step(m, opt):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    compiled = kiln.compile(lambda: step(model, opts[0]))
    for _ in range(4):
        got, want = compiled(), step(twin, opts[1])
        assert kiln.allclose(got, want, rtol=1e-5)
    assert set(_callees(compiled)) >= FUSED
    for p, q in zip(model.parameters(), twin.parameters()):
        assert kiln.allclose(p, q, rtol=1e-5, atol=1e-6)
        assert kiln.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6)


def test_log_probabilities_read_elsewhere_and_every_target_ignored():
    """The log-probabilities are also returned (the fused call makes them), and a batch whose every target is
    ignored gives eager's NaN mean and zero gradient."""

    def fn(w, x, y):
        w.grad = None
        lp = F.log_softmax(x @ w, 1)
        loss = F.nll_loss(lp, y)
        loss.backward()
        return loss.detach(), lp.detach(), w.grad.clone()

    x = kiln.randn(6, 3)
    w = kiln.randn(3, 4)
    for y in (kiln.tensor([0, 3, 1, 2, 2, 0]), kiln.full((6,), -100, dtype=kiln.int64)):
        eager, got, compiled = _both(fn, w, x, y)
        assert set(_callees(compiled)) >= FUSED
        for e, g in zip(eager, got):
            assert kiln.allclose(g, e, rtol=1e-6, equal_nan=True)
    assert math.isnan(float(got[0])) and not got[2].any()


def test_nan_and_infinite_logits_follow_eager():
    def fn(w, x, y):
        w.grad = None
        loss = F.cross_entropy(x * w, y)
        loss.backward()
        return loss.detach(), w.grad.clone()

    x = kiln.tensor([[0.0, 1.0, -2.0], [math.inf, 0.0, 1.0], [-math.inf, 2.0, 0.0], [math.nan, 0.0, 1.0]])
    for y in (kiln.tensor([0, 1, 1, 2]), kiln.tensor([2, 1, 0, -100])):
        eager, got, _ = _both(fn, kiln.ones(3), x, y)
        for e, g in zip(eager, got):
            assert np.array_equal(g.numpy(), e.numpy(), equal_nan=True), (g, e)


def test_an_out_of_range_target_raises_eagers_error():
    compiled = kiln.compile(lambda x, y: F.cross_entropy(x, y))
    x = kiln.randn(4, 3)
    compiled(x, kiln.tensor([0, 1, 2, 0]))
    assert "log_softmax_nll" in _callees(compiled)
    with pytest.raises(IndexError, match=r"Target 3 is out of bounds\."):
        compiled(x, kiln.tensor([0, 3, 2, 0]))
    with pytest.raises(IndexError, match=r"Target -2 is out of bounds\."):
        compiled(x, kiln.tensor([0, -2, 2, 0]))


def test_the_backward_kernel_alone_matches_the_two_kernels_and_raises_for_a_bad_target():
    """The backward kernel called directly (a backward graph does not run its forward's check): the two ops'
    own kernels' numbers, and their error for a bad target."""
    from kiln.backend import call_kernel, op

    lp = F.log_softmax(kiln.randn(3, 4), 1)
    g, t = kiln.tensor(1.5), kiln.tensor([0, 1, 3])
    for reduction in ("sum", "mean"):
        got = CODEGEN.log_softmax_nll_backward(g, lp, t, -100, reduction)
        nll_grad = call_kernel(op("_nll_loss_backward"), (g, lp, t, None, -100, reduction))
        want = call_kernel(op("_log_softmax_backward_data"), (nll_grad, lp, 1))
        assert np.array_equal(got.numpy(), want.numpy())
    with pytest.raises(IndexError, match=r"Target 4 is out of bounds\."):
        CODEGEN.log_softmax_nll_backward(g, lp, kiln.tensor([0, 4, 1]), -100, "mean")


@pytest.mark.parametrize(
    "kw",
    [
        {"weight": kiln.tensor([1.0, 2.0, 0.5, 1.0])},
        {"reduction": "none"},
    ],
    ids=["weight", "reduction-none"],
)
def test_what_the_kernels_do_not_take_keeps_the_ops(kw):
    def fn(w, x, y, **kw):
        w.grad = None
        loss = F.cross_entropy(x @ w, y, **kw)
        loss.sum().backward()
        return loss.detach(), w.grad.clone()

    x, w, y = kiln.randn(5, 3), kiln.randn(3, 4), kiln.tensor([0, 1, 2, 3, 1])
    eager, got, compiled = _both(fn, w, x, y, **kw)
    assert not FUSED & set(_callees(compiled))
    for e, g in zip(eager, got):
        assert kiln.allclose(g, e, rtol=1e-6)


def test_label_smoothing_matches_eager():
    """Label smoothing adds its own terms to the log-probabilities' nll_loss: the pair still fuses."""
    w, x, y = kiln.randn(3, 4), kiln.randn(5, 3), kiln.tensor([0, 1, 2, 3, 1])
    (loss_e, grad_e), (loss_c, grad_c), compiled = _both(_step, w, x, y, label_smoothing=0.1)
    assert "log_softmax_nll" in _callees(compiled)
    assert kiln.allclose(loss_c, loss_e, rtol=1e-6) and kiln.allclose(grad_c, grad_e, rtol=1e-6, atol=1e-7)


def test_other_shapes_and_layouts_keep_the_ops():
    """A 1-D input, spatial (N, C, d) inputs, a log-softmax over dim 0 and a transposed input are not rows the
    kernels take."""
    cases = [
        (lambda x, y: F.cross_entropy(x, y), kiln.randn(4), kiln.tensor(2)),
        (lambda x, y: F.cross_entropy(x, y), kiln.randn(2, 4, 3), kiln.randint(0, 4, (2, 3))),
        (lambda x, y: F.nll_loss(F.log_softmax(x, 0), y), kiln.randn(4, 4), kiln.randint(0, 4, (4,))),
        (lambda x, y: F.cross_entropy(x.t(), y), kiln.randn(3, 5), kiln.randint(0, 3, (5,))),
    ]
    for fn, x, y in cases:
        compiled = kiln.compile(fn)
        compiled(x, y)
        assert kiln.allclose(compiled(x, y), fn(x, y), rtol=1e-6)
        assert not FUSED & set(_callees(compiled))


def test_a_write_between_the_two_ops_keeps_them():
    def fn(x, y):
        lp = F.log_softmax(x, 1)
        x.mul_(2)  # a write between the pair: the fused call, made at the second op, would read the new x
        return F.nll_loss(lp, y), x

    compiled = kiln.compile(fn)
    x, y = kiln.randn(4, 3), kiln.tensor([0, 1, 2, 1])
    compiled(x.clone(), y)
    got, want = compiled(x.clone(), y), fn(x.clone(), y)
    assert not FUSED & set(_callees(compiled))
    assert all(kiln.allclose(g, e) for g, e in zip(got, want))


def test_a_code_generator_without_the_kernels_keeps_the_ops(monkeypatch):
    def plain(group):
        return CODEGEN(group)

    plain.device_type = "cpu"
    monkeypatch.setattr(_backends.kiln.plugins, "compilers", lambda: {"plain": plain})
    w = kiln.randn(3, 4)
    (loss_e, grad_e), (loss_c, grad_c), compiled = _both(_step, w, kiln.randn(5, 3), kiln.tensor([0, 1, 2, 3, 1]))
    assert not FUSED & set(_callees(compiled))
    assert kiln.allclose(loss_c, loss_e) and kiln.allclose(grad_c, grad_e)


def test_a_value_first_read_by_a_guard_or_a_grad_assignment_keeps_the_ops():
    """The node that first reads the log-probabilities, or the nll gradient, is a ``.grad`` assignment or a
    value guard, not an op: no pair, and the program runs as eager does."""

    def grads_of_log_probs(lp, y):  # the nll gradient goes straight to a leaf's .grad
        loss = F.nll_loss(lp, y)
        loss.backward()
        return loss.detach()

    lp = F.log_softmax(kiln.randn(4, 3), 1).requires_grad_()
    y = kiln.tensor([0, 1, 2, 0])
    compiled = kiln.compile(grads_of_log_probs)
    for _ in range(2):
        lp.grad = None
        got, got_grad = compiled(lp, y), lp.grad.clone()
        lp.grad = None
        assert kiln.allclose(got, grads_of_log_probs(lp, y)) and kiln.allclose(got_grad, lp.grad)

    def stored(w, x):  # the log-probabilities become a .grad
        w.grad = F.log_softmax(x, 1)
        return x * 1

    w, x = kiln.zeros(2, 3, requires_grad=True), kiln.randn(2, 3)
    compiled = kiln.compile(stored)
    compiled(w, x)
    compiled(w, x)
    assert kiln.allclose(w.grad, F.log_softmax(x, 1))

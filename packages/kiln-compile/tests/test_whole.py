"""Whole programs (``mode="reduce-overhead"``): a graph compiled into one native function by the device's code
generator gives the eager results — training steps of an MLP (parameters, gradients, losses, version counts),
pointwise ops with broadcasting, views of inputs and of made values, reductions, products in both float
dtypes — and the eager error for a bad target, with nothing written. A graph with an op the generator does
not take keeps the default program."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import kiln
import kiln.compile
import kiln.nn as nn
import kiln.nn.functional as F
import kiln.plugins

CODEGEN = next((c for c in kiln.plugins.compilers().values() if getattr(c, "device_type", None) == "cpu"), None)
pytestmark = pytest.mark.skipif(getattr(CODEGEN, "program", None) is None, reason="no cpu whole-program generator")


def _whole(compiled) -> bool:
    """Whether a compiled function's first trace runs as a whole program (its forward has no Python source of
    kernel calls but the native function's)."""
    fwd = compiled._entries[0].forward
    return "@njit" in getattr(fwd, "source", "")


def _step_fn(model, opt, x, y):
    def step():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


OPTIMIZERS = {
    "sgd": lambda p: kiln.optim.SGD(p, lr=0.1),
    "sgd-momentum": lambda p: kiln.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-2),
    "adam": lambda p: kiln.optim.Adam(p, lr=1e-2),
}


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
@pytest.mark.parametrize(
    "mode, optimizer", [("reduce-overhead", "sgd"), ("max-autotune", "sgd-momentum"), ("reduce-overhead", "adam")]
)
def test_mlp_training_steps_match_eager(dtype, mode, optimizer):
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 7)).to(dtype)
    twin = copy.deepcopy(model)
    x = kiln.randn(16, 20, dtype=dtype)
    y = kiln.randint(0, 7, (16,))
    y[3] = -100  # an ignored row
    eager = _step_fn(model, OPTIMIZERS[optimizer](model.parameters()), x, y)
    compiled = kiln.compile(_step_fn(twin, OPTIMIZERS[optimizer](twin.parameters()), x, y), mode=mode)
    tol = 1e-5 if dtype is kiln.float32 else 1e-12
    for _ in range(5):
        le, lc = eager(), compiled()
        assert lc.dtype is dtype and lc.shape == ()
        assert kiln.allclose(lc, le, rtol=tol, atol=tol)
    assert _whole(compiled)
    for (name, pe), pc in zip(model.named_parameters(), twin.parameters()):
        assert kiln.allclose(pc, pe, rtol=tol, atol=tol), name
        assert kiln.allclose(pc.grad, pe.grad, rtol=tol, atol=tol), name
        assert pc._version > 0  # the update was counted as a write


def test_a_bad_target_raises_the_eager_error_and_writes_nothing():
    kiln.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    x = kiln.randn(5, 6)
    y = kiln.tensor([0, 1, 2, 1, 0])
    step = kiln.compile(_step_fn(model, kiln.optim.SGD(model.parameters(), lr=0.5), x, y), mode="reduce-overhead")
    step()
    step()
    assert _whole(step)
    before = [p.detach().clone() for p in model.parameters()]
    y[2] = 3  # out of range for 3 classes
    with pytest.raises(IndexError, match="Target 3 is out of bounds"):
        step()
    for p, b in zip(model.parameters(), before):
        assert kiln.equal(p, b)
    y[2] = 2
    step()  # and it runs again


def _pointwise(x, w, b):
    h = (x * w.t() + b).relu()  # broadcasting, a transposed input
    g = h[:, 1:] * 2.0 - h[:, :-1].sigmoid()  # views of a made value at an offset
    return g.sum(0), g.mean(), (h.t() @ x).tanh()


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_pointwise_views_reductions_and_products_match_eager(dtype):
    kiln.manual_seed(2)
    x = kiln.randn(4, 6, dtype=dtype)
    w = kiln.randn(6, 4, dtype=dtype)
    b = kiln.randn(6, dtype=dtype)
    compiled = kiln.compile(_pointwise, mode="reduce-overhead")
    compiled(x, w, b)
    got = compiled(x, w, b)
    assert _whole(compiled)
    tol = 1e-5 if dtype is kiln.float32 else 1e-12
    for g, e in zip(got, _pointwise(x, w, b)):
        assert g.shape == e.shape and g.dtype is e.dtype
        assert kiln.allclose(g, e, rtol=tol, atol=tol)


def test_a_write_into_an_input_is_counted_and_seen_by_autograd():
    def f(a, b):
        a.add_(b * 2)
        return a * 3

    a, b = kiln.randn(5), kiln.randn(5)
    compiled = kiln.compile(f, mode="reduce-overhead")
    expected = f(a.clone(), b)
    a1 = a.clone()
    compiled(a1, b)
    a2 = a.clone()
    v = a2._version
    out = compiled(a2, b)
    assert _whole(compiled)
    assert kiln.allclose(out, expected) and kiln.allclose(a2, a + b * 2)
    assert a2._version == v + 1


def test_an_op_it_does_not_take_keeps_the_default_program():
    def f(x):
        return kiln.sort(x, dim=1).values.exp()

    x = kiln.randn(3, 5)
    compiled = kiln.compile(f, mode="reduce-overhead")
    compiled(x)
    assert kiln.allclose(compiled(x), f(x))
    assert not _whole(compiled)


def test_another_shape_traces_again():
    f = kiln.compile(lambda x, y: (x @ y).relu().sum(1), mode="reduce-overhead")
    for n in (3, 5, 3):
        x, y = kiln.randn(n, 4), kiln.randn(4, 2)
        assert kiln.allclose(f(x, y), (x @ y).relu().sum(1))


def test_an_update_reading_an_input_that_shares_its_memory_matches_eager():
    # the same tensor passed twice: the group that stores into one reads the other; values must be eager's
    def f(p, q):
        p.mul_(2).add_(q * 3)
        return p.sum()

    for alias in (False, True):
        base = kiln.randn(4, 3)
        p, q = base.clone(), base.clone()
        p2 = base.clone()
        q2 = p2 if alias else base.clone()
        expected = f(p, p if alias else q)
        compiled = kiln.compile(f, mode="reduce-overhead")
        warm = base.clone()
        compiled(warm, warm if alias else base.clone())
        got = compiled(p2, q2)
        assert kiln.allclose(got, expected) and kiln.allclose(p2, p)


def test_a_view_past_an_input_is_not_read_from_native_code():
    # the guards fix an input's layout, not how far its storage goes: a view reaching past the input's own
    # elements keeps the default program (which checks the storage, as eager does)
    def f(x):
        return x.as_strided((8,), (1,)) * 2

    base = kiln.zeros(8)
    compiled = kiln.compile(f, mode="reduce-overhead")
    compiled(base[:4])
    assert kiln.equal(compiled(base[:4]), f(base[:4]))
    assert not _whole(compiled)
    with pytest.raises((RuntimeError, ValueError)):
        compiled(kiln.ones(4))


def test_reductions_of_a_0d_tensor_and_large_logits_match_eager():
    f = kiln.compile(lambda x: ((x * 2).sum(0), (x * 3).mean(-1, keepdim=True)), mode="reduce-overhead")
    x = kiln.tensor(1.5)
    for _ in range(2):
        for g, e in zip(f(x), ((x * 2).sum(0), (x * 3).mean(-1, keepdim=True))):
            assert g.shape == e.shape and kiln.allclose(g, e)
    logits = kiln.tensor([[1e8, 1e8 - 1.0, -1e8], [3.0, 1.0, 2.0]], dtype=kiln.float64)
    target = kiln.tensor([1, 0])
    ce = kiln.compile(lambda z, t: (F.log_softmax(z * 1, 1), F.cross_entropy(z * 1, t)), mode="reduce-overhead")
    ce(logits, target)
    for g, e in zip(ce(logits, target), (F.log_softmax(logits, 1), F.cross_entropy(logits, target))):
        assert kiln.allclose(g, e, rtol=1e-12, atol=1e-12)
    assert _whole(ce)


def test_a_compiled_model_runs_whole_forward_and_backward_with_eager_gradients():
    # the forward returns what its backward reads, views of the weights among them (W.t()): made as tensor
    # views of the inputs after the call, as the default program makes them
    kiln.manual_seed(3)
    model = nn.Sequential(nn.Linear(10, 12), nn.ReLU(), nn.Linear(12, 4))
    twin = copy.deepcopy(model)
    compiled = kiln.compile(twin, mode="reduce-overhead")
    x, y = kiln.randn(6, 10), kiln.randint(0, 4, (6,))
    for _ in range(3):
        for m in (model, twin):
            m.zero_grad()
        F.cross_entropy(model(x), y).backward()
        loss = F.cross_entropy(compiled(x), y)
        loss.backward()
        assert loss.grad_fn is not None
        for pe, pc in zip(model.parameters(), twin.parameters()):
            assert kiln.allclose(pc.grad, pe.grad, rtol=1e-5, atol=1e-6)
    entry = next(e for e in compiled._compiled._entries if e.forward is not None)
    assert "@njit" in entry.forward.source and "@njit" in entry.backward.source


def test_an_update_of_an_input_over_another_inputs_memory_matches_eager():
    # two storages over one NumPy array (q is p shifted by one): a store into p must not change what the loop
    # reads from q after it; the call checks the memory and runs op by op
    def f(p, q):
        p.add_(q.exp())
        return p.sum()

    compiled = kiln.compile(f, mode="reduce-overhead")
    for _ in range(3):
        a, b = np.linspace(0.0, 1.0, 9), np.linspace(0.0, 1.0, 9)
        pe, qe = kiln.from_numpy(a[1:]), kiln.from_numpy(a[:-1])
        pc, qc = kiln.from_numpy(b[1:]), kiln.from_numpy(b[:-1])
        assert kiln.allclose(compiled(pc, qc), f(pe, qe)) and kiln.allclose(pc, pe)
    fresh = compiled(kiln.zeros(8, dtype=kiln.float64), kiln.ones(8, dtype=kiln.float64))
    assert kiln.allclose(fresh, f(kiln.zeros(8, dtype=kiln.float64), kiln.ones(8, dtype=kiln.float64)))
    assert _whole(compiled)

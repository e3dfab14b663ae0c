"""The layout and ownership of accumulated gradients (kiln.autograd.accumulate): a leaf's gradient takes
its parameter's layout, products' gradients their operands', a first gradient is stolen only when
nothing else holds it, and never aliases a gradient held elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln


def test_accumulated_grad_takes_the_parameters_layout():
    """A contiguous leaf's ``.grad`` is contiguous even when the backward produced a transposed gradient
    (PyTorch's gradient layout contract: optimizers and fused updates see the parameter's layout)."""
    for L in (kiln, torch):
        w = L.ones(3, 5, requires_grad=True)
        x = L.ones(4, 5)
        (x @ w.t()).sum().backward()  # mm's weight gradient comes out transposed
        assert w.grad.stride() == (5, 1), L
        np.testing.assert_array_equal(w.grad.numpy(), np.full((3, 5), 4.0))


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "size-1 dims", "overlapping"])
def test_a_broadcast_gradient_is_copied_in_the_leafs_layout(layout):
    """``x.sum().backward()`` reaches the leaf with an expanded gradient (stride 0), which is copied: into a
    row-major ``.grad`` for a row-major or overlapping leaf, into the leaf's own strides for a dense one."""
    results = []
    for L in (kiln, torch):
        base = L.arange(12.0).reshape(3, 4)
        x = (
            {
                "contiguous": base,
                "transposed": base.t(),
                "size-1 dims": base.reshape(3, 1, 4, 1),
                "overlapping": L.zeros(1).expand(3, 4),
            }[layout]
            .detach()
            .requires_grad_()
        )
        (x.sum() * 2).backward()
        results.append((x.grad.stride(), x.grad.tolist()))
    assert results[0] == results[1]


def test_product_gradients_take_their_operands_layout():
    """The gradient of a transposed (column-major) matrix operand comes out column-major, as PyTorch's mm
    backward computes it: ``(g^T a)^T`` instead of ``a^T g``, so a Linear weight's gradient needs no
    transposing copy."""
    rng = np.random.default_rng(0)
    a_np, w_np, b_np = rng.standard_normal((4, 5)), rng.standard_normal((3, 5)), rng.standard_normal(3)
    for op in ("matmul", "mm", "addmm"):
        strides = []
        for L in (kiln, torch):
            a, w, b = (L.tensor(v, requires_grad=True) for v in (a_np, w_np, b_np))
            at, wt = a.t().t(), w.t()  # at: a view, row-major; wt: column-major
            out = L.addmm(b, at, wt) if op == "addmm" else getattr(L, op)(at, wt)
            ga, gw = L.autograd.grad(out.sum() * 1.0 + (out * out).sum(), (at, wt))
            strides.append((ga.stride(), gw.stride()))
            if L is kiln:
                got = (ga.numpy(), gw.numpy())
            else:
                np.testing.assert_allclose(got[0], ga.numpy(), rtol=1e-12)
                np.testing.assert_allclose(got[1], gw.numpy(), rtol=1e-12)
        assert strides[0] == strides[1] == (((5, 1), (1, 5))), (op, strides)


@pytest.mark.skipif(not __import__("kiln.autograd.accumulate").autograd.accumulate._STEAL, reason="CPython < 3.14 only")
def test_sole_owner_test_of_a_leafs_first_gradient():
    """A leaf's first gradient becomes its ``.grad`` without a copy only when the engine's buffer holds the
    only reference to it and nothing else reaches its memory."""
    from kiln.autograd.accumulate import _sole_owner

    t = kiln.zeros(64, 80, requires_grad=True)
    assert _sole_owner(t, [kiln.ones(64, 80)])
    assert _sole_owner(t, [kiln.ones(5120).view(64, 80)])  # a view whose base nothing else holds
    assert not _sole_owner(t, [kiln.from_numpy(np.ones((64, 80), np.float32))])  # behind a NumPy wrapper object
    held = kiln.ones(64, 80)
    assert not _sole_owner(t, [held])  # this test holds it too
    base = kiln.ones(5120)
    assert not _sole_owner(t, [base.view(64, 80)])  # another tensor shares the memory
    user = np.ones((64, 80), np.float32)
    assert not _sole_owner(t, [kiln.from_numpy(user)])  # a NumPy array the user holds
    assert not _sole_owner(t, [kiln.from_numpy(user).detach()])
    assert not _sole_owner(t, [kiln.from_numpy(np.ones((80, 64), np.float32)).t()])  # not the leaf's layout
    assert not _sole_owner(t, [kiln.ones(64, 80, dtype=kiln.float64)])
    assert not _sole_owner(kiln.zeros(80, 64, requires_grad=True).t(), [kiln.ones(64, 80)])
    # small gradients too, in the layouts kernels return (the whole walk is left to large ones)
    small = kiln.zeros(3, 4, requires_grad=True)
    assert _sole_owner(small, [kiln.ones(3, 4)])
    a, b = kiln.randn(3, 4), kiln.randn(3, 4)
    assert _sole_owner(small, [a + b])  # a NumPy result: the storage views the array the tensor caches
    cached = a + b
    cached._numpy()
    assert not _sole_owner(small, [cached])  # this test holds it
    kept = a + b
    array = kept.numpy()
    assert not _sole_owner(small, [kept.detach()])  # the user holds its array
    del array
    flat = kiln.zeros(12, requires_grad=True)
    assert _sole_owner(flat, [kiln.randn(12) * 2])  # 1-D: the array is the storage
    kept = kiln.randn(12) * 2
    array = kept.numpy()
    assert not _sole_owner(flat, [kept.detach()])
    del array  # held to here
    assert not _sole_owner(small, [kiln.ones(12).view(3, 4)])  # a view of a small base: copied


def test_leaf_gradient_never_aliases_a_gradient_held_elsewhere():
    """Gradients that the caller, a hook or retain_grad still hold are copied into ``.grad``: accumulating
    a second backward in place never changes them (PyTorch's AccumulateGrad steals only what it alone
    holds; it counts references to the gradient tensor alone, so ``v.view(3).backward(g)`` leaves PyTorch's
    ``v.grad`` sharing ``g``'s memory: kiln counts the references to the memory too)."""
    v = kiln.ones(3, requires_grad=True)
    g = kiln.full((3,), 2.0)
    for make in (lambda v: v, lambda v: v + 0, lambda v: v.view(3), lambda v: v * 1):
        v.grad = None
        make(v).backward(g)
        make(v).backward(g)
        assert g.tolist() == [2.0, 2.0, 2.0] and v.grad.tolist() == [4.0, 4.0, 4.0]
    for L in (kiln, torch):
        v = L.ones(3, requires_grad=True)
        kept = []
        v.grad = None
        for _ in range(2):
            y = v + 0
            y.register_hook(kept.append)
            y.sum().backward()
        assert kept[0].tolist() == [1.0, 1.0, 1.0] and v.grad.tolist() == [2.0, 2.0, 2.0], L
        v.grad = None
        y = v * 1
        y.retain_grad()
        (y * 3).sum().backward(retain_graph=True)
        (y * 3).sum().backward()
        assert y.grad.tolist() == [6.0, 6.0, 6.0] and v.grad.tolist() == [6.0, 6.0, 6.0], L


def test_linear_weight_gradient_is_taken_without_a_copy(monkeypatch):
    """The gradients of a Linear-style product reach the leaves as the engine's own buffers."""
    from kiln.autograd import accumulate, engine

    seen = []
    sole = accumulate._sole_owner
    monkeypatch.setattr(engine, "_sole_owner", lambda t, grads: seen.append(sole(t, grads)) or seen[-1])
    w = kiln.ones(64, 80, requires_grad=True)
    b = kiln.ones(64, requires_grad=True)
    kiln.addmm(b, kiln.ones(4, 80), w.t()).sum().backward()
    # the bias's gradient, summed over the batch, is no view either (autograd's own reduction of a broadcast
    # gradient drops the leading dims in the sum itself, where sum_to_size returns a view of the kept-dims sum)
    assert seen == [accumulate._STEAL, accumulate._STEAL]
    assert w.grad.is_contiguous() and (w.grad == 4.0).all() and (b.grad == 4.0).all()


def test_sum_to_size_is_a_view_where_pytorchs_is():
    """``sum_to_size`` views the kept-dims sum where dims are dropped, as PyTorch's ``sum_to``; a sum to ``()``
    is a new tensor (PyTorch's ``sum()``), even of a 0-d tensor, and an equal size returns the tensor."""
    a, b, z = kiln.randn(4, 3), kiln.randn(2, 4, 3), kiln.tensor(2.0)
    views = {
        (a, (3,)): True,
        (a, (1, 3)): False,
        (b, (4, 1)): True,
        (b, (1, 1, 3)): False,
        (a, ()): False,
        (z, ()): False,
        (kiln.randn(1, 1), ()): False,
    }
    for (t, size), view in views.items():
        r = t.sum_to_size(size)
        assert (r._base is not None) is view and r is not t, (t.shape, size)
        assert kiln.allclose(r.sum(), t.sum())
    assert a.sum_to_size(4, 3) is a


def test_a_recorded_broadcast_gradient_keeps_pytorchs_view_node():
    """With ``create_graph``, a broadcast gradient's reduction is recorded as PyTorch's (a view of the
    kept-dims sum)."""
    x, b = kiln.ones(4, 3), kiln.zeros(3, requires_grad=True)
    (g,) = kiln.autograd.grad((x * b * b).sum(), b, create_graph=True)
    names = []
    node = g.grad_fn
    while node is not None and node.next_functions:
        names.append(node.name())
        node = node.next_functions[0][0]
    assert names == ["AddBackward0", "ViewBackward0", "SumBackward1", "MulBackward0"]  # torch 2.13's

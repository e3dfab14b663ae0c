"""kiln.utils.checkpoint against torch.utils.checkpoint (PyTorch is the oracle)."""

import gc
import warnings
import weakref

import numpy as np
import pytest

import kiln
from kiln.utils.checkpoint import CheckpointError, checkpoint, checkpoint_sequential

torch = pytest.importorskip("torch")


def _pair(shape, seed):
    a = np.random.default_rng(seed).standard_normal(shape)
    return kiln.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


def _fn(lib):
    def f(x, w, scale, *, shift=0.0):
        h = (x @ w).tanh()
        return h.sin() * scale + shift, (h * x).sum(1)

    return f


def _fn_pos(lib):
    def f(x, w, scale):
        h = (x @ w).tanh()
        return h.sin() * scale, (h * x).sum(1)

    return f


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_gradients_match_plain_and_torch(use_reentrant):
    x, tx = _pair((3, 4), 0)
    w, tw = _pair((4, 4), 1)
    a, b = checkpoint(_fn_pos(kiln), x, w, 2.0, use_reentrant=use_reentrant)
    (a.sum() + (b * b).sum()).backward()
    ta, tb = torch.utils.checkpoint.checkpoint(_fn_pos(torch), tx, tw, 2.0, use_reentrant=use_reentrant)
    (ta.sum() + (tb * tb).sum()).backward()
    np.testing.assert_allclose(a.detach().numpy(), ta.detach().numpy())
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-12)
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    a, b = _fn_pos(kiln)(x, w, 2.0)
    (a.sum() + (b * b).sum()).backward()
    np.testing.assert_allclose(gx.numpy(), x.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(gw.numpy(), w.grad.numpy(), rtol=1e-12)


def test_non_reentrant_kwargs_and_autograd_grad():
    x, tx = _pair((3, 4), 2)
    w, tw = _pair((4, 4), 3)
    a, _ = checkpoint(_fn(kiln), x, w, 3.0, shift=1.0, use_reentrant=False)
    gx, gw = kiln.autograd.grad(a.sum(), (x, w))
    ta, _ = torch.utils.checkpoint.checkpoint(_fn(torch), tx, tw, 3.0, shift=1.0, use_reentrant=False)
    tgx, tgw = torch.autograd.grad(ta.sum(), (tx, tw))
    np.testing.assert_allclose(gx.numpy(), tgx.numpy(), rtol=1e-12)
    np.testing.assert_allclose(gw.numpy(), tgw.numpy(), rtol=1e-12)


def test_non_reentrant_backward_twice_with_retain_graph():
    """retain_graph keeps the recompute's inputs: a second backward accumulates again, a third (after one
    without retain_graph) raises PyTorch's error, as any freed node does."""
    for lib, ckpt in ((kiln, checkpoint), (torch, torch.utils.checkpoint.checkpoint)):
        x = lib.tensor([1.0, 2.0, -0.5], dtype=lib.float64, requires_grad=True)
        y = ckpt(lambda a: (a.sin() * a).sum(), x, use_reentrant=False)
        y.backward(retain_graph=True)
        first = x.grad.clone()
        y.backward()
        np.testing.assert_allclose(x.grad.numpy(), 2 * first.numpy(), rtol=1e-12)
        with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
            y.backward()
        z = ckpt(lambda a: (a.exp() * a).sum(), x, use_reentrant=False)
        g1 = lib.autograd.grad(z, x, retain_graph=True)[0]
        g2 = lib.autograd.grad(z, x)[0]
        np.testing.assert_array_equal(g1.numpy(), g2.numpy())


def test_non_reentrant_parameter_without_input_grad():
    w, tw = _pair((4, 4), 4)
    x = kiln.ones(2, 4, dtype=kiln.float64)
    checkpoint(lambda x: (x @ w).exp(), x, use_reentrant=False).sum().backward()
    torch.utils.checkpoint.checkpoint(
        lambda x: (x @ tw).exp(), torch.ones(2, 4, dtype=torch.float64), use_reentrant=False
    ).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_dropout_mask_is_reproduced(use_reentrant):
    kiln.manual_seed(0)
    x = kiln.randn(50, 50, dtype=kiln.float64, requires_grad=True)

    from kiln.nn_functional import dropout

    def f(x):
        return dropout(x * 2.0, p=0.5, training=True)

    y = checkpoint(f, x, use_reentrant=use_reentrant)
    y.sum().backward()
    # the gradient is 2 / (1 - p) exactly where the forward kept the value
    kept = (y.detach() != 0).numpy()
    np.testing.assert_allclose(x.grad.numpy(), np.where(kept, 4.0, 0.0))


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_intermediates_are_not_kept(use_reentrant):
    x = kiln.randn(4, 4, requires_grad=True)
    refs = []

    def f(x):
        h = x.exp()
        refs.append(weakref.ref(h))
        return (h * h).sin()

    y = checkpoint(f, x, use_reentrant=use_reentrant)
    gc.collect()
    assert refs[0]() is None
    y.sum().backward()
    assert len(refs) == 2  # recomputed in backward
    # without checkpoint, the graph keeps it (the control)
    y = f(x)
    gc.collect()
    assert refs[2]() is not None


def test_use_reentrant_warning():
    x = kiln.randn(2, requires_grad=True)
    with pytest.warns(UserWarning, match="the use_reentrant parameter should be passed explicitly"):
        checkpoint(lambda t: t * 2, x)
    with pytest.warns(UserWarning, match="checkpoint_sequential: the use_reentrant parameter"):
        checkpoint_sequential([lambda t: t * 2, lambda t: t + 1], 2, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checkpoint(lambda t: t * 2, x, use_reentrant=False)


def test_errors_match_torch():
    x = kiln.randn(2, requires_grad=True)
    tx = torch.randn(2, requires_grad=True)
    for ck, t in ((checkpoint, x), (torch.utils.checkpoint.checkpoint, tx)):
        with pytest.raises(ValueError, match=r"^Unexpected keyword arguments: a,b$"):
            ck(lambda t, a, b: t, t, use_reentrant=True, a=1, b=2)
        with pytest.raises(ValueError, match="only supported when use_reentrant=False"):
            ck(lambda t: t, t, use_reentrant=True, debug=True)
        with pytest.warns(UserWarning, match=r"^None of the inputs have requires_grad=True\. Gradients will be None$"):
            ck(lambda t: t * 2, t.detach(), use_reentrant=True)


def test_reentrant_no_output_requires_grad():
    for lib, ck in ((kiln, checkpoint), (torch, torch.utils.checkpoint.checkpoint)):
        x = lib.randn(2, requires_grad=True)
        y = ck(lambda t: t.detach() * 3, x, use_reentrant=True)
        assert y.requires_grad  # every output of the reentrant Function is recorded, as in PyTorch
        with pytest.raises(RuntimeError, match="none of output has requires_grad=True"):
            y.sum().backward()


def test_no_grad_mode_just_runs():
    x = kiln.randn(2, requires_grad=True)
    with kiln.no_grad():
        y = checkpoint(lambda t: t * 2, x, use_reentrant=False)
    assert not y.requires_grad


def test_determinism_check():
    x = kiln.randn(3, requires_grad=True)
    calls = []

    def f(t):
        calls.append(1)
        return t * 2 if len(calls) == 1 else (t * 2).reshape(3, 1)

    y = checkpoint(f, x, use_reentrant=False)
    with pytest.raises(CheckpointError, match="different metadata"):
        y.sum().backward()


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_sequential_over_nn_sequential(use_reentrant):
    nn = pytest.importorskip("kiln.nn")
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    x = kiln.randn(5, 4, dtype=kiln.float64, requires_grad=True)
    checkpoint_sequential(model, 2, x, use_reentrant=use_reentrant).pow(2).sum().backward()
    grads = [p.grad.numpy().copy() for p in model.parameters()] + [x.grad.numpy().copy()]
    model.zero_grad()
    x.grad = None
    model(x).pow(2).sum().backward()
    for g, p in zip(grads, [*model.parameters(), x]):
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-12)


def test_a_non_leaf_read_through_a_closure_raises_rather_than_losing_its_gradient():
    x = kiln.rand(3, dtype=kiln.float64, requires_grad=True)
    h = x * 2  # a non-leaf that requires grad, not passed as an argument
    z = kiln.rand(3, dtype=kiln.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="Pass that tensor as an argument, or use use_reentrant=True"):
        checkpoint(lambda y: (y * h).sum(), z, use_reentrant=False)
    # passed as an argument, it gets its gradient
    out = checkpoint(lambda y, hh: (y * hh).sum(), z, h, use_reentrant=False)
    out.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * z.detach().numpy())


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_the_recompute_runs_with_the_forwards_autocast_state(use_reentrant):
    pytest.importorskip("kiln.amp")
    seen = []

    def f(a, b):
        seen.append(kiln.is_autocast_enabled("cpu"))
        return (a @ b).float().sum()

    a = kiln.rand(3, 4, requires_grad=True)
    b = kiln.rand(4, 2, requires_grad=True)
    with kiln.autocast("cpu"):
        out = checkpoint(f, a, b, use_reentrant=use_reentrant)
    out.backward()  # outside the region
    assert seen == [True, True]
    assert a.grad.dtype is kiln.float32


@pytest.mark.parametrize("written", ["view", "base"])
def test_non_reentrant_argument_that_is_a_view_of_a_written_base(written):
    """An argument that is a view whose base (or the view itself) was written in place before the call takes
    its history before the function's nodes begin, so the gradient reaches the leaf as in PyTorch."""
    grads = []
    for lib, ckpt in ((kiln, checkpoint), (torch, torch.utils.checkpoint.checkpoint)):
        a = lib.tensor(np.arange(1.0, 7.0) / 4, requires_grad=True)
        x = (a * 1.5).reshape(2, 3) * 1
        v = x[0]
        (v if written == "view" else x).mul_(2)
        ckpt(lambda t: (t * t).sin(), v, use_reentrant=False).sum().backward()
        grads.append(a.grad.detach().numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12)

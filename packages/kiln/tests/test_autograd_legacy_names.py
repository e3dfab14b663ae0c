"""torch.autograd's remaining names against PyTorch: Variable and variable, backward's ``grad_variables``,
grad's ``only_inputs`` and ``is_grads_batched``, ``set_multithreading_enabled`` and the gradient layout
contract with ``enforce_grad_layout_policy``."""

from __future__ import annotations

import inspect
import threading
import warnings

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")


def _warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [(w.category, str(w.message).replace("kiln", "torch")) for w in caught]


def test_variable_returns_a_detached_alias_and_matches_instances():
    x = kiln.ones(3)
    v = kiln.autograd.Variable(x, requires_grad=True)
    assert type(v) is kiln.Tensor and v is not x and v.requires_grad and not x.requires_grad
    v.data.mul_(2)  # shares memory
    assert x.tolist() == [2.0, 2.0, 2.0]
    y = kiln.ones(2, requires_grad=True) * 2
    w = kiln.autograd.Variable(y)
    assert w.grad_fn is None and not w.requires_grad
    assert isinstance(x, kiln.autograd.Variable) and not isinstance(1, kiln.autograd.Variable)
    assert kiln.autograd.Variable().shape == (0,) and kiln.autograd.Variable().dtype == kiln.float32
    _, kw = _warnings(lambda: kiln.autograd.Variable(x, volatile=True))
    _, tw = _warnings(lambda: torch.autograd.Variable(torch.ones(3), volatile=True))
    assert [m for _, m in kw] == [m for _, m in tw]
    with pytest.raises(TypeError, match="Variable data has to be a tensor, but got list"):
        kiln.autograd.Variable([1.0, 2.0])
    with pytest.raises(TypeError) as te:
        torch.autograd.Variable([1.0, 2.0])
    assert str(te.value) == "Variable data has to be a tensor, but got list"
    with pytest.raises(RuntimeError) as ke:
        kiln.autograd.variable(1)
    with pytest.raises(RuntimeError) as te:
        torch.autograd.variable(1)
    assert str(ke.value).replace("kiln", "torch") == str(te.value)


def test_backward_grad_variables_is_the_old_name_of_grad_tensors():
    for lib in (kiln, torch):
        t = lib.ones(2, requires_grad=True)
        _, w = _warnings(lambda lib=lib, t=t: lib.autograd.backward((t * 3).sum(), grad_variables=lib.tensor(2.0)))
        assert t.grad.tolist() == [6.0, 6.0]
        assert w == [(FutureWarning, "`grad_variables` is deprecated. Use `grad_tensors` instead.")]
    errors = []
    for lib in (kiln, torch):
        t = lib.ones(2, requires_grad=True)
        with pytest.raises(RuntimeError) as e, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lib.autograd.backward(t.sum(), lib.tensor(1.0), grad_variables=lib.tensor(1.0))
        errors.append(str(e.value))
    assert errors[0] == errors[1]


def test_grad_only_inputs_warns_and_is_ignored():
    results = []
    for lib in (kiln, torch):
        t = lib.ones(2, requires_grad=True)
        (g,), w = _warnings(lambda lib=lib, t=t: lib.autograd.grad((t * 2).sum(), t, only_inputs=False))
        results.append((g.tolist(), w))
    assert results[0] == results[1] and results[0][1][0][0] is FutureWarning


@pytest.mark.parametrize("create_graph", [False, True])
def test_grad_is_grads_batched_matches_torch(create_graph):
    x = np.random.default_rng(0).standard_normal((3, 4))
    kx, tx = kiln.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    ky, ty = (kx**2).sum(1), (tx**2).sum(1)
    kz, tz = kx.sin(), tx.sin()
    eye = np.eye(3)
    batch2 = np.random.default_rng(1).standard_normal((2, 3, 4))
    kg = kiln.autograd.grad(
        (ky, kz), kx, (kiln.tensor(eye[:2]), kiln.tensor(batch2)), is_grads_batched=True, create_graph=create_graph
    )
    tg = torch.autograd.grad(
        (ty, tz), tx, (torch.tensor(eye[:2]), torch.tensor(batch2)), is_grads_batched=True, create_graph=create_graph
    )
    assert len(kg) == len(tg) == 1
    np.testing.assert_allclose(kg[0].detach().numpy(), tg[0].detach().numpy(), rtol=1e-12)
    assert kg[0].requires_grad == tg[0].requires_grad == create_graph
    # the graph is freed after the last entry unless retained (create_graph retains it), as for a plain grad
    if not create_graph:
        with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
            kiln.autograd.grad(ky, kx, kiln.ones(3))
    else:
        kiln.autograd.grad(ky, kx, kiln.ones(3))


def test_set_multithreading_enabled_is_a_thread_local_switch():
    from kiln.autograd.grad_mode import is_multithreading_enabled

    assert is_multithreading_enabled()
    with kiln.autograd.set_multithreading_enabled(False):
        assert not is_multithreading_enabled()
        seen = []
        th = threading.Thread(target=lambda: seen.append(is_multithreading_enabled()))
        th.start()
        th.join()
        assert seen == [True]
        t = kiln.ones(3, requires_grad=True)
        (t * 2).sum().backward()  # backward runs on this thread either way
        assert t.grad.tolist() == [2.0, 2.0, 2.0]
    assert is_multithreading_enabled()

    @kiln.autograd.set_multithreading_enabled(False)
    def inside():
        return is_multithreading_enabled()

    assert inside() is False and is_multithreading_enabled()
    kiln.autograd.set_multithreading_enabled(False)  # a plain call switches it, as torch's
    assert not is_multithreading_enabled()
    kiln.autograd.set_multithreading_enabled(True)


LAYOUTS = [
    lambda lib: lib.empty(2, 3, 4).permute(2, 0, 1),
    lambda lib: lib.empty(4, 6)[:, ::2],
    lambda lib: lib.empty(3, 4).t(),
    lambda lib: lib.empty(64, 70).t(),
    lambda lib: lib.empty(3, 1, 5).permute(2, 1, 0),
    lambda lib: lib.empty(100, 100),
    lambda lib: lib.empty(5, 3).t()[1:],
]


@pytest.mark.parametrize("make", LAYOUTS)
def test_gradient_layout_contract_matches_torch(make):
    for enforce in (True, False):
        p, q = make(kiln).requires_grad_(), make(torch).requires_grad_()
        with kiln.autograd.enforce_grad_layout_policy(enforce):
            (p * 2).sum().backward()
            (p * 3).sum().backward()  # accumulation keeps the layout
        with torch.autograd.enforce_grad_layout_policy(enforce):
            (q * 2).sum().backward()
            (q * 3).sum().backward()
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
        if enforce:  # what an unenforced steal keeps depends on each engine's incoming gradient
            assert p.grad.stride() == q.grad.stride()


def test_relaxed_layout_keeps_a_sole_owned_gradient_as_it_is():
    from kiln.autograd.accumulate import layout_enforced

    big = kiln.empty(80, 90).t().requires_grad_()
    incoming = kiln.ones(90, 80)  # row-major: not the leaf's (transposed) layout
    with kiln.autograd.enforce_grad_layout_policy(False):
        assert not layout_enforced()
        big.backward(incoming.clone())
    assert layout_enforced()
    relaxed = big.grad.stride()
    big.grad = None
    big.backward(incoming.clone())
    assert big.grad.stride() == (1, 90) and relaxed in ((80, 1), (1, 90))
    kiln.autograd.enforce_grad_layout_policy(False)
    assert not layout_enforced()
    kiln.autograd.enforce_grad_layout_policy(True)


@pytest.mark.parametrize("name", ["backward", "grad", "set_multithreading_enabled", "enforce_grad_layout_policy"])
def test_signatures_match_torch(name):
    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    kfn, tfn = getattr(kiln.autograd, name), getattr(torch.autograd, name)
    assert params(kfn) == params(tfn)
    assert kfn.__doc__ and name in kiln.autograd.__all__

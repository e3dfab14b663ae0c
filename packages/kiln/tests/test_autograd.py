"""Autograd against PyTorch: backward, autograd.grad (allow_unused, create_graph / higher order),
retain_graph, backward(inputs=...), gradients of non-float outputs and broadcasts, leaf flags."""

from __future__ import annotations

import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

FREED = "Trying to backward through the graph a second time"


def leaves(values, dtype=kiln.float64):
    """(kiln, torch) leaves requiring grad with the same values."""
    return U.both(np.asarray(values, dtype=np.float64), dtype=dtype, requires_grad=True)


# ---------------------------------------------------------------------------------------- backward / grad


def test_backward_accumulates_into_leaves():
    kx, tx = leaves([1.0, -2.0, 3.0])
    kw, tw = leaves([[0.5], [1.5]])
    for x, w in ((kx, kw), (tx, tw)):
        y = (w * x).exp().sum() + (x * x).sum()
        y.backward()
    U.assert_close(kx.grad, tx.grad)
    U.assert_close(kw.grad, tw.grad)
    assert kx.grad.requires_grad is False and kx.grad.grad_fn is None


def test_gradient_accumulation_over_two_backward_calls():
    kx, tx = leaves([1.0, 2.0])
    for x in (kx, tx):
        (x * x).sum().backward()
        (3 * x).sum().backward()
    U.assert_close(kx.grad, tx.grad)
    kg, tg = kx.grad, tx.grad
    for x in (kx, tx):
        (x**3).sum().backward()
    U.assert_close(kx.grad, tx.grad)
    assert (kx.grad is kg) == (tx.grad is tg), "accumulation happens in place into the existing .grad, like torch"
    kx.grad.zero_()
    tx.grad.zero_()
    kx.grad = None
    tx.grad = None
    for x in (kx, tx):
        (x * 2).sum().backward()
    U.assert_close(kx.grad, tx.grad)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("shape", [(), (1,), (1, 1, 1)])
def test_implicit_gradient_of_a_one_element_output(shape, dtype):
    """backward() with no gradient starts from ones in the output's shape and dtype (made directly on the CPU):
    a leaf output takes it as its .grad, and each call's is new memory, so writing one .grad in place
    changes no other."""
    grads = {}
    for lib in (kiln, torch):
        d = getattr(lib, dtype)
        leaf = lib.full(shape, 3.0, dtype=d, requires_grad=True)
        leaf.backward()
        other = lib.full(shape, 5.0, dtype=d, requires_grad=True)
        (other * 2).sum().backward()
        leaf.grad.add_(10)  # in place: the next implicit gradient must still be ones
        again = lib.full(shape, 1.0, dtype=d, requires_grad=True)
        again.backward()
        grads[lib] = [t.grad for t in (leaf, other, again)]
        assert all(g.dtype == d and tuple(g.shape) == shape for g in grads[lib])
    for k, t in zip(grads[kiln], grads[torch]):
        np.testing.assert_array_equal(k.float().numpy(), t.float().numpy())


def test_backward_with_gradient_argument():
    kx, tx = leaves([[1.0, 2.0], [3.0, 4.0]])
    g = np.array([[1.0, -1.0], [0.5, 2.0]])
    (kx * kx).backward(kiln.tensor(g))
    (tx * tx).backward(torch.tensor(g))
    U.assert_close(kx.grad, tx.grad)
    kiln.autograd.backward(
        [kx.sum(), (kx * 2).sum()], [kiln.tensor(1.0, dtype=kiln.float64), kiln.tensor(3.0, dtype=kiln.float64)]
    )
    torch.autograd.backward(
        [tx.sum(), (tx * 2).sum()], [torch.tensor(1.0, dtype=torch.float64), torch.tensor(3.0, dtype=torch.float64)]
    )
    U.assert_close(kx.grad, tx.grad)


def test_autograd_grad_basic_and_leaves_untouched():
    kx, tx = leaves([1.0, 2.0, 3.0])
    ky, ty = leaves([0.5, 0.5, 0.5])
    (kgx, kgy) = kiln.autograd.grad((kx * ky).sin().sum(), (kx, ky))
    (tgx, tgy) = torch.autograd.grad((tx * ty).sin().sum(), (tx, ty))
    U.assert_close(kgx, tgx)
    U.assert_close(kgy, tgy)
    assert kx.grad is None and ky.grad is None
    assert kgx.requires_grad is False
    (kg,) = kiln.autograd.grad(kx * 2, kx, grad_outputs=kiln.ones(3, dtype=kiln.float64))
    (tg,) = torch.autograd.grad(tx * 2, tx, grad_outputs=torch.ones(3, dtype=torch.float64))
    U.assert_close(kg, tg)
    # single tensor input returns a 1-tuple
    r = kiln.autograd.grad((kx * kx).sum(), kx)
    assert isinstance(r, tuple) and len(r) == 1


def test_autograd_grad_allow_unused():
    kx, tx = leaves([1.0, 2.0])
    kz, tz = leaves([3.0])
    U.assert_same_error(
        lambda: kiln.autograd.grad((kx * 2).sum(), (kx, kz)), lambda: torch.autograd.grad((tx * 2).sum(), (tx, tz))
    )
    kg = kiln.autograd.grad((kx * 2).sum(), (kx, kz), allow_unused=True)
    tg = torch.autograd.grad((tx * 2).sum(), (tx, tz), allow_unused=True)
    U.assert_close(kg, tg)
    kg = kiln.autograd.grad((kx * 2).sum(), (kx, kz), materialize_grads=True)
    tg = torch.autograd.grad((tx * 2).sum(), (tx, tz), materialize_grads=True)
    U.assert_close(kg, tg)


def test_autograd_grad_wrt_intermediate():
    kx, tx = leaves([1.0, 2.0])
    out = {}
    for lib, x in (("k", kx), ("t", tx)):
        h = x.exp()
        y = (h * h).sum()
        out[lib] = (h, y)
    (kg,) = kiln.autograd.grad(out["k"][1], out["k"][0])
    (tg,) = torch.autograd.grad(out["t"][1], out["t"][0])
    U.assert_close(kg, tg)


# ---------------------------------------------------------------------------------------- higher order


HIGHER_ORDER = {
    "x**3": lambda L, x, y: (x**3).sum(),
    "sin": lambda L, x, y: x.sin().sum(),
    "x*y*y cross": lambda L, x, y: (x * y * y).sum(),
    "exp(x*y)": lambda L, x, y: (x * y).exp().sum(),
    "tanh": lambda L, x, y: x.tanh().sum(),
    "sigmoid": lambda L, x, y: L.sigmoid(x).sum(),
    "log": lambda L, x, y: (x.abs() + 1).log().sum(),
    "sqrt": lambda L, x, y: (x * x + 1).sqrt().sum(),
    "div": lambda L, x, y: (x / (y * y + 1)).sum(),
    "pow tensor": lambda L, x, y: ((x.abs() + 1) ** y).sum(),
    "2**x": lambda L, x, y: (2**x).sum(),
    "matmul": lambda L, x, y: (x.unsqueeze(1) @ y.unsqueeze(0)).sin().sum(),
    "mean/amax": lambda L, x, y: (x * x).mean() + (x * y).amax(),
    "cos*x": lambda L, x, y: (x.cos() * x).sum(),
    "relu*x": lambda L, x, y: (x.relu() * x).sum(),
    "relu with negative upstream": lambda L, x, y: (L.relu(x - 0.9) * (y - 1.0) * x).sum(),
}


@pytest.mark.parametrize("name", list(HIGHER_ORDER))
def test_second_and_third_derivatives(name):
    """d/dx, d2/dx2 (diagonal via grad of grad.sum()), d2/dxdy cross terms and d3/dx3 equal torch's."""
    f = HIGHER_ORDER[name]
    x = U.make_pair((3,), kiln.float64, seed=1, requires_grad=True, low=0.3, high=1.5)
    y = U.make_pair((3,), kiln.float64, seed=2, requires_grad=True, low=0.3, high=1.5)

    def derivs(L, a, b):
        out = f(L, a, b)
        (gx,) = L.autograd.grad(out, a, create_graph=True)
        gxx, gxy = L.autograd.grad(gx.sum(), (a, b), create_graph=True, allow_unused=True)
        res = [out, gx, gxx, gxy]
        if gxx is not None and gxx.requires_grad:
            (gxxx,) = L.autograd.grad(gxx.sum(), a, allow_unused=True)
            res.append(gxxx)
        return tuple(res)

    U.check_op(derivs, x, y, grad=False, rtol=1e-10, atol=1e-10)


def test_create_graph_backward_then_backward_again():
    kx, tx = leaves([0.5, 1.5])
    for x in (kx, tx):
        y = (x**3).sum()
        y.backward(create_graph=True)
        g = x.grad
        assert g.requires_grad
        x.grad = None
        g.sum().backward()
    U.assert_close(kx.grad, tx.grad)


# ---------------------------------------------------------------------------------------- retain_graph


def test_second_backward_without_retain_graph_raises():
    kx, tx = leaves([1.0, 2.0])
    ky, ty = (kx * kx).sum(), (tx * tx).sum()
    ky.backward()
    ty.backward()
    info = U.assert_same_error(ky.backward, ty.backward)
    assert FREED in str(info.value)


def test_retain_graph_allows_second_backward():
    kx, tx = leaves([1.0, 2.0])
    ky, ty = (kx * kx).exp().sum(), (tx * tx).exp().sum()
    ky.backward(retain_graph=True)
    ty.backward(retain_graph=True)
    ky.backward()
    ty.backward()
    U.assert_close(kx.grad, tx.grad)
    U.assert_same_error(ky.backward, ty.backward)


def test_second_backward_through_graph_without_saved_tensors_is_allowed():
    """torch only refuses when a freed *saved tensor* is needed; add/sum save none."""
    kx, tx = leaves([1.0, 2.0])
    ky, ty = (kx + 1).sum(), (tx + 1).sum()
    ky.backward()
    ty.backward()
    ky.backward()
    ty.backward()
    U.assert_close(kx.grad, tx.grad)


def test_autograd_grad_frees_graph_too():
    kx, tx = leaves([1.0, 2.0])
    ky, ty = (kx.sin()).sum(), (tx.sin()).sum()
    kiln.autograd.grad(ky, kx)
    torch.autograd.grad(ty, tx)
    U.assert_same_error(lambda: kiln.autograd.grad(ky, kx), lambda: torch.autograd.grad(ty, tx))


# ---------------------------------------------------------------------------------------- backward(inputs=...)


def test_backward_inputs_restricts_accumulation():
    kx, tx = leaves([1.0, 2.0])
    ky, ty = leaves([3.0, 4.0])
    (kx * ky).sum().backward(inputs=[kx])
    (tx * ty).sum().backward(inputs=[tx])
    U.assert_close(kx.grad, tx.grad)
    assert ky.grad is None and ty.grad is None
    (kx * ky).sum().backward(inputs=ky)
    (tx * ty).sum().backward(inputs=ty)
    U.assert_close(ky.grad, ty.grad)
    U.assert_close(kx.grad, tx.grad)


def test_backward_inputs_with_non_leaf():
    """torch accumulates into a non-leaf's .grad when it is named in inputs."""
    kx, tx = leaves([1.0, 2.0])
    kh, th = kx * 3, tx * 3
    (kh * kh).sum().backward(inputs=[kh])
    (th * th).sum().backward(inputs=[th])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        U.assert_close(kh.grad, th.grad)
    assert kx.grad is None and tx.grad is None


def test_backward_inputs_empty_error():
    kx, tx = leaves([1.0])
    U.assert_same_error(lambda: (kx * 2).sum().backward(inputs=[]), lambda: (tx * 2).sum().backward(inputs=[]))


# ---------------------------------------------------------------------------------------- misc


def test_backward_through_non_float_outputs_is_not_recorded():
    kx, tx = leaves([1.0, 2.0])
    for lib, x in ((kiln, kx), (torch, tx)):
        assert (x > 1).requires_grad is False
        assert x.argmax().requires_grad is False
        assert x.to(lib.int64).requires_grad is False


def test_broadcast_gradient_reduction_and_dtype():
    kx, tx = U.both(np.array([[1.0], [2.0]], np.float32), requires_grad=True)
    ky, ty = U.both(np.array([0.5, 1.5, 2.5]), requires_grad=True)  # float64
    (kx * ky).sum().backward()
    (tx * ty).sum().backward()
    U.assert_close(kx.grad, tx.grad)
    U.assert_close(ky.grad, ty.grad)
    assert kx.grad.dtype is kiln.float32 and ky.grad.dtype is kiln.float64


def test_is_leaf_and_grad_fn_flags():
    kx, tx = leaves([1.0])
    for a, b in ((kx, tx), (kx * 2, tx * 2), (kx.detach(), tx.detach()), (kiln.ones(1), torch.ones(1))):
        assert a.is_leaf == b.is_leaf
        assert a.requires_grad == b.requires_grad
        assert (a.grad_fn is None) == (b.grad_fn is None)


def test_error_message_for_numpy_of_requires_grad():
    kx, tx = leaves([1.0])
    U.assert_same_error(lambda: kx.numpy(), lambda: tx.numpy())


def test_create_graph_gradient_is_a_copy_of_its_own():
    """With create_graph, a leaf's first gradient is copied (recorded), as PyTorch's: it shares memory with no
    other leaf's gradient nor with a gradient the caller passed in."""
    x = kiln.ones(4, requires_grad=True)
    w = kiln.ones(4, requires_grad=True)
    (x + w).sum().backward(create_graph=True)
    assert x.grad.data_ptr() != w.grad.data_ptr()
    x.grad.add_(100)  # (an expanded gradient kept as is would refuse an in-place write)
    assert w.grad.tolist() == [1.0] * 4
    g = kiln.full((3,), 2.0)
    y = kiln.ones(3, requires_grad=True)
    y.backward(g, create_graph=True)
    with kiln.no_grad():
        g.add_(5)
    assert y.grad.tolist() == [2.0] * 3
    z = kiln.ones(3, requires_grad=True)
    (z * z).sum().backward(create_graph=True)
    assert z.grad.requires_grad and z.grad.grad_fn is not None
    (gz,) = kiln.autograd.grad(z.grad.sum(), z)
    assert gz.tolist() == [2.0] * 3

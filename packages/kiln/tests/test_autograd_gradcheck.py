"""grad_fn names and graph structure as PyTorch's, and gradcheck / gradgradcheck in float64 over the op
surface (and that they catch wrong first and second derivatives)."""

from __future__ import annotations

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln


def leaves(values, dtype=kiln.float64):
    """(kiln, torch) leaves requiring grad with the same values."""
    return U.both(np.asarray(values, dtype=np.float64), dtype=dtype, requires_grad=True)


# ---------------------------------------------------------------------------------------- grad_fn names

GRAD_FN_CASES = {
    "add": lambda L, x, y: x + y,
    "add scalar": lambda L, x, y: x + 1,
    "sub": lambda L, x, y: x - y,
    "rsub": lambda L, x, y: 1 - x,
    "mul": lambda L, x, y: x * y,
    "mul scalar": lambda L, x, y: x * 2,
    "div": lambda L, x, y: x / y,
    "neg": lambda L, x, y: -x,
    "pow scalar": lambda L, x, y: x**2,
    "pow tensor": lambda L, x, y: x**y,
    "exp": lambda L, x, y: x.exp(),
    "log": lambda L, x, y: x.log(),
    "sqrt": lambda L, x, y: x.sqrt(),
    "sin": lambda L, x, y: x.sin(),
    "cos": lambda L, x, y: x.cos(),
    "tanh": lambda L, x, y: x.tanh(),
    "sigmoid": lambda L, x, y: x.sigmoid(),
    "relu": lambda L, x, y: x.relu(),
    "abs": lambda L, x, y: x.abs(),
    "sign": lambda L, x, y: x.sign(),
    "maximum": lambda L, x, y: L.maximum(x, y),
    "minimum": lambda L, x, y: L.minimum(x, y),
    "where": lambda L, x, y: L.where(x > 1, x, y),
    "sum()": lambda L, x, y: x.sum(),
    "sum(dim)": lambda L, x, y: x.sum(0),
    "mean()": lambda L, x, y: x.mean(),
    "mean(dim)": lambda L, x, y: x.mean(1),
    "amax": lambda L, x, y: x.amax(0),
    "max()": lambda L, x, y: x.max(),
    "max(dim)": lambda L, x, y: x.max(0).values,
    "matmul 2d": lambda L, x, y: x @ y.t(),
    "mm": lambda L, x, y: L.mm(x, y.t()),
    "view": lambda L, x, y: x.view(-1),
    "reshape (view)": lambda L, x, y: x.reshape(-1),
    "permute": lambda L, x, y: x.permute(1, 0),
    "transpose": lambda L, x, y: x.transpose(0, 1),
    "t": lambda L, x, y: x.t(),
    "expand": lambda L, x, y: x[:1].expand(3, 2),
    "squeeze": lambda L, x, y: x.unsqueeze(0).squeeze(0),
    "unsqueeze": lambda L, x, y: x.unsqueeze(0),
    "select": lambda L, x, y: x[0],
    "slice": lambda L, x, y: x[1:],
    "clone": lambda L, x, y: x.clone(),
    "to float64": lambda L, x, y: x.to(L.float64),
}


@pytest.mark.parametrize("name", list(GRAD_FN_CASES))
def test_grad_fn_names(name):
    """``type(y.grad_fn).__name__`` and ``y.grad_fn.name()`` equal torch's."""
    fn = GRAD_FN_CASES[name]
    kx, tx = U.both(np.array([[1.5, 2.0], [0.5, 3.0], [2.5, 1.0]], np.float32), requires_grad=True)
    ky, ty = U.both(np.array([[1.0, 2.5], [1.5, 0.5], [2.0, 2.0]], np.float32), requires_grad=True)
    k, t = fn(kiln, kx, ky), fn(torch, tx, ty)
    assert type(k.grad_fn).__name__ == type(t.grad_fn).__name__, (
        f"{type(k.grad_fn).__name__} != torch's {type(t.grad_fn).__name__}"
    )
    assert k.grad_fn.name() == t.grad_fn.name()


def test_accumulate_grad_node_name():
    kx, tx = leaves([1.0])
    kn = (kx * 2).grad_fn.next_functions[0][0]
    tn = (tx * 2).grad_fn.next_functions[0][0]
    assert kn.name() == tn.name().replace("torch::", "kiln::")
    assert type(kn).__name__ == type(tn).__name__
    assert kn.variable is kx


def test_next_functions_structure():
    kx, tx = leaves([1.0, 2.0])
    kc, tc = U.both(np.array([1.0, 2.0]))
    k, t = kx * kc + kx, tx * tc + tx
    kn, tn = k.grad_fn.next_functions, t.grad_fn.next_functions
    assert len(kn) == len(tn)
    assert [type(n).__name__ for n, _ in kn] == [type(n).__name__ for n, _ in tn]
    kmul, tmul = kn[0][0].next_functions, tn[0][0].next_functions
    assert [(n is None) for n, _ in kmul] == [(n is None) for n, _ in tmul]


# ---------------------------------------------------------------------------------------- gradcheck / gradgradcheck


def _f64(shape, seed, low=-1.5, high=1.5):
    a = U.rand_array(shape, kiln.float64, U.rng_for(seed), low=low, high=high)
    return kiln.tensor(a, dtype=kiln.float64, requires_grad=True)


def _away_from_zero(shape, seed):
    a = U.rand_array(shape, kiln.float64, U.rng_for(seed), low=0.3, high=1.5)
    sign = np.where(U.rng_for(seed + 99).random(shape) < 0.5, -1.0, 1.0)
    return kiln.tensor(a * sign, dtype=kiln.float64, requires_grad=True)


def _pos(shape, seed):
    return _f64(shape, seed, low=0.3, high=2.0)


def _distinct(shape, seed):
    """Distinct values (no ties) for max/min-type ops."""
    n = int(np.prod(shape))
    v = U.rng_for(seed).permutation(n).astype(np.float64).reshape(shape) * 0.37 - 1.0
    return kiln.tensor(v, dtype=kiln.float64, requires_grad=True)


GRADCHECK = {
    "add": (lambda x, y: x + y, lambda: (_f64((2, 3), 1), _f64((3,), 2))),
    "add alpha": (lambda x, y: kiln.add(x, y, alpha=-2.5), lambda: (_f64((2, 3), 1), _f64((2, 1), 2))),
    "sub": (lambda x, y: x - y, lambda: (_f64((2, 3), 1), _f64((1, 3), 2))),
    "sub alpha": (lambda x, y: kiln.sub(x, y, alpha=3), lambda: (_f64((3,), 1), _f64((2, 3), 2))),
    "rsub scalar": (lambda x: 2 - x, lambda: (_f64((3,), 1),)),
    "mul": (lambda x, y: x * y, lambda: (_f64((2, 3), 1), _f64((3,), 2))),
    "div": (lambda x, y: x / y, lambda: (_f64((2, 3), 1), _away_from_zero((3,), 2))),
    "rdiv scalar": (lambda x: 2 / x, lambda: (_away_from_zero((3,), 1),)),
    "div trunc": (
        lambda x, y: kiln.div(x, y, rounding_mode="trunc"),
        lambda: (_away_from_zero((3,), 1), _away_from_zero((3,), 2)),
    ),
    "pow tensor": (lambda x, y: x**y, lambda: (_pos((2, 3), 1), _f64((3,), 2))),
    "pow scalar": (lambda x: x**3, lambda: (_f64((2, 3), 1),)),
    "pow scalar float": (lambda x: x**2.5, lambda: (_pos((2, 3), 1),)),
    "rpow scalar": (lambda x: 2.5**x, lambda: (_f64((2, 3), 1),)),
    "neg": (lambda x: -x, lambda: (_f64((2, 3), 1),)),
    "abs": (lambda x: x.abs(), lambda: (_away_from_zero((2, 3), 1),)),
    "sign": (lambda x: x.sign() * x, lambda: (_away_from_zero((2, 3), 1),)),
    "exp": (lambda x: x.exp(), lambda: (_f64((2, 3), 1),)),
    "log": (lambda x: x.log(), lambda: (_pos((2, 3), 1),)),
    "sqrt": (lambda x: x.sqrt(), lambda: (_pos((2, 3), 1),)),
    "sin": (lambda x: x.sin(), lambda: (_f64((2, 3), 1),)),
    "cos": (lambda x: x.cos(), lambda: (_f64((2, 3), 1),)),
    "tanh": (lambda x: x.tanh(), lambda: (_f64((2, 3), 1),)),
    "sigmoid": (lambda x: x.sigmoid(), lambda: (_f64((2, 3), 1),)),
    "relu": (lambda x: x.relu(), lambda: (_away_from_zero((2, 3), 1),)),
    "maximum": (lambda x, y: kiln.maximum(x, y), lambda: (_distinct((2, 3), 1), _distinct((3,), 2) + 0.05)),
    "minimum": (lambda x, y: kiln.minimum(x, y), lambda: (_distinct((2, 3), 1), _distinct((3,), 2) + 0.05)),
    "where": (lambda x, y: kiln.where(x > 0, x, y), lambda: (_away_from_zero((2, 3), 1), _f64((3,), 2))),
    "sum": (lambda x: x.sum(), lambda: (_f64((2, 3), 1),)),
    "sum dim keepdim": (lambda x: x.sum((0, 2), keepdim=True), lambda: (_f64((2, 3, 2), 1),)),
    "mean": (lambda x: x.mean(-1), lambda: (_f64((2, 3), 1),)),
    "amax": (lambda x: x.amax(1), lambda: (_distinct((2, 3), 1),)),
    "amin": (lambda x: x.amin((0, 1)), lambda: (_distinct((2, 3), 1),)),
    "max()": (lambda x: x.max(), lambda: (_distinct((2, 3), 1),)),
    "max(dim)": (lambda x: x.max(1).values, lambda: (_distinct((2, 3), 1),)),
    "min(dim keepdim)": (lambda x: x.min(0, keepdim=True)[0], lambda: (_distinct((2, 3), 1),)),
    "matmul dot": (lambda x, y: x @ y, lambda: (_f64((3,), 1), _f64((3,), 2))),
    "matmul mv": (lambda x, y: x @ y, lambda: (_f64((2, 3), 1), _f64((3,), 2))),
    "matmul vm": (lambda x, y: x @ y, lambda: (_f64((3,), 1), _f64((3, 2), 2))),
    "matmul mm": (lambda x, y: x @ y, lambda: (_f64((2, 3), 1), _f64((3, 2), 2))),
    "matmul batched broadcast": (lambda x, y: x @ y, lambda: (_f64((2, 1, 2, 3), 1), _f64((2, 3, 2), 2))),
    "matmul 1-d with batched": (lambda x, y: x @ y, lambda: (_f64((3,), 1), _f64((2, 3, 2), 2))),
    "mm": (lambda x, y: kiln.mm(x, y), lambda: (_f64((2, 3), 1), _f64((3, 2), 2))),
    "view": (lambda x: x.view(3, 2) * 1, lambda: (_f64((2, 3), 1),)),
    "reshape copy": (lambda x: x.t().reshape(-1), lambda: (_f64((2, 3), 1),)),
    "permute": (lambda x: x.permute(2, 0, 1), lambda: (_f64((2, 3, 2), 1),)),
    "transpose": (lambda x: x.transpose(0, -1), lambda: (_f64((2, 3, 2), 1),)),
    "t": (lambda x: x.t(), lambda: (_f64((2, 3), 1),)),
    "mT": (lambda x: x.mT, lambda: (_f64((2, 2, 3), 1),)),
    "expand": (lambda x: x.expand(2, 3, 2), lambda: (_f64((3, 1), 1),)),
    "broadcast_to": (lambda x: kiln.broadcast_to(x, (2, 3)), lambda: (_f64((3,), 1),)),
    "squeeze": (lambda x: x.squeeze(), lambda: (_f64((1, 3, 1), 1),)),
    "unsqueeze": (lambda x: x.unsqueeze(1), lambda: (_f64((2, 3), 1),)),
    "flatten": (lambda x: x.flatten(1), lambda: (_f64((2, 2, 2), 1),)),
    "select": (lambda x: x.select(1, -1), lambda: (_f64((2, 3), 1),)),
    "narrow": (lambda x: x.narrow(1, 1, 2), lambda: (_f64((2, 3), 1),)),
    "getitem": (lambda x: x[None, ::2, 1:], lambda: (_f64((3, 3), 1),)),
    "clone": (lambda x: x.clone(), lambda: (_f64((2, 3), 1),)),
    "contiguous": (lambda x: x.t().contiguous(), lambda: (_f64((2, 3), 1),)),
    "inplace mul_ on clone": (lambda x, y: x.clone().mul_(y), lambda: (_f64((2, 3), 1), _f64((3,), 2))),
    "inplace setitem on clone": (
        lambda x, y: (lambda c: (c.__setitem__((0, slice(1, None)), y[:2]), c)[1])(x.clone()),
        lambda: (_f64((2, 3), 1), _f64((3,), 2)),
    ),
    "inplace view add_": (
        lambda x, y: (lambda c: (c.t()[1].add_(y[:2]), c * c)[1])(x.clone()),
        lambda: (_f64((2, 3), 1), _f64((3,), 2)),
    ),
    "copy_": (lambda x, y: (lambda c: (c.copy_(y), c)[1])(x * 1), lambda: (_f64((2, 3), 1), _f64((3,), 2))),
    "exp_ on non-leaf": (lambda x: (x * 2).exp_(), lambda: (_f64((3,), 1),)),
}


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradcheck(name):
    fn, make = GRADCHECK[name]
    assert kiln.autograd.gradcheck(fn, make())


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradgradcheck(name):
    fn, make = GRADCHECK[name]
    assert kiln.autograd.gradgradcheck(fn, make())


def test_gradcheck_detects_a_wrong_gradient():
    """gradcheck itself can fail: a Function with a wrong backward is caught."""

    class Bad(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def backward(ctx, grad):
            return grad * 3  # should be 2x

    x = _f64((3,), 1)
    with pytest.raises(kiln.autograd.GradcheckError):
        kiln.autograd.gradcheck(Bad.apply, (x,))
    assert kiln.autograd.gradcheck(Bad.apply, (x,), raise_exception=False) is False


def test_gradgradcheck_detects_a_wrong_second_derivative():
    """gradgradcheck itself can fail: a correct first derivative that is not differentiable correctly."""

    class Square(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 2 * x.detach()  # right value, but d/dx of it is lost

    x = _f64((3,), 1)
    assert kiln.autograd.gradcheck(Square.apply, (x,))
    with pytest.raises(kiln.autograd.GradcheckError):
        kiln.autograd.gradgradcheck(Square.apply, (x,))


def test_gradcheck_requires_an_input_with_grad():
    x = kiln.ones(3, dtype=kiln.float64)
    t = torch.ones(3, dtype=torch.float64)
    U.assert_same_error(
        lambda: kiln.autograd.gradcheck(lambda a: a * 2, (x,)), lambda: torch.autograd.gradcheck(lambda a: a * 2, (t,))
    )

"""``kiln.func`` against ``torch.func``: grad, grad_and_value, vjp, jvp, jacrev, jacfwd, hessian and
linearize on the same functions and values, nested transforms, pytrees of inputs, has_aux, and the
errors PyTorch raises for misuse. (``functional_call`` on modules is tested with kiln-nn.)"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.func as kf

torch = pytest.importorskip("torch")
tf = torch.func

RNG = np.random.default_rng(0)


def _pair(*shape):
    x = RNG.standard_normal(shape)
    return kiln.tensor(x), torch.tensor(x)


def _close(a, b, atol=1e-10):
    if isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _close(x, y, atol)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _close(a[k], b[k], atol)
    else:
        assert tuple(a.shape) == tuple(b.shape)
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), atol=atol, rtol=1e-7)


def f_scalar(lib):
    return lambda a, b: (a.sin() * b).sum() + (a**2).sum() * b.exp().sum()


def f_vector(lib):
    return lambda a: a.sin()[:, None] * a[None, :] + a.sum()


@pytest.mark.parametrize("argnums", [0, 1, (0, 1), (1, 0), -1])
def test_grad_matches_torch(argnums):
    (ka, ta), (kb, tb) = _pair(4), _pair(4)
    _close(kf.grad(f_scalar(kiln), argnums)(ka, kb), tf.grad(f_scalar(torch), argnums)(ta, tb))


def test_results_are_plain_tensors_unless_an_input_requires_grad():
    ka, ta = _pair(3)
    f = lambda a: (a**3).sum()
    assert kf.grad(f)(ka).requires_grad is tf.grad(f)(ta).requires_grad is False
    kg, tg = kf.grad(f)(ka.requires_grad_()), tf.grad(f)(ta.requires_grad_())
    assert kg.requires_grad is tg.requires_grad is True  # composes with autograd, as torch.func does
    (kga,) = kiln.autograd.grad(kg.sum(), ka)
    (tga,) = torch.autograd.grad(tg.sum(), ta)
    _close(kga, tga)
    with kiln.no_grad():
        assert kf.grad(f)(ka).requires_grad is False


def test_grad_and_value_and_aux():
    ka, ta = _pair(5)
    kg, (kv, kaux) = kf.grad_and_value(lambda a: ((a**2).sum(), a.mean()), has_aux=True)(ka)
    tg, (tv, taux) = tf.grad_and_value(lambda a: ((a**2).sum(), a.mean()), has_aux=True)(ta)
    _close((kg, kv, kaux), (tg, tv, taux))
    kg, kaux = kf.grad(lambda a: ((a**2).sum(), {"m": a.max()}), has_aux=True)(ka)
    tg, taux = tf.grad(lambda a: ((a**2).sum(), {"m": a.max()}), has_aux=True)(ta)
    _close((kg, kaux), (tg, taux))


def test_grad_over_a_dict_of_parameters():
    kw, tw = _pair(3, 2)
    kb, tb = _pair(2)
    kx, tx = _pair(5, 3)

    def loss(p, x):
        return ((x @ p["w"] + p["b"]) ** 2).mean()

    _close(kf.grad(loss)({"w": kw, "b": kb}, kx), tf.grad(loss)({"w": tw, "b": tb}, tx))


def test_nested_grad_and_hessian_match_torch():
    ka, ta = _pair(4)
    kb, tb = _pair(4)
    _close(
        kf.grad(lambda a: kf.grad(lambda b: (b**3 * a).sum())(a).sum())(ka),
        tf.grad(lambda a: tf.grad(lambda b: (b**3 * a).sum())(a).sum())(ta),
    )
    _close(kf.hessian(f_scalar(kiln))(ka, kb), tf.hessian(f_scalar(torch))(ta, tb))
    _close(kf.hessian(f_scalar(kiln), argnums=(0, 1))(ka, kb), tf.hessian(f_scalar(torch), argnums=(0, 1))(ta, tb))


@pytest.mark.parametrize("api", ["jacrev", "jacfwd"])
def test_jacobians_match_torch(api):
    ka, ta = _pair(4)
    _close(getattr(kf, api)(f_vector(kiln))(ka), getattr(tf, api)(f_vector(torch))(ta))
    (kb, tb) = _pair(4)
    two = lambda a, b: (a * b, (a - b).sum())
    _close(getattr(kf, api)(two, argnums=(0, 1))(ka, kb), getattr(tf, api)(two, argnums=(0, 1))(ta, tb))


def test_jacobian_of_a_function_that_ignores_its_input_is_zero():
    ka, ta = _pair(3)
    c = kiln.ones(2, dtype=kiln.float64)
    _close(kf.jacrev(lambda a: c * 2)(ka), tf.jacrev(lambda a: torch.ones(2, dtype=torch.float64) * 2)(ta))


def test_vjp_and_jvp_and_linearize_match_torch():
    ka, ta = _pair(4)
    kt, tt = _pair(4)
    kc, tc = _pair(4, 4)
    ko, kfn = kf.vjp(f_vector(kiln), ka)
    to, tfn = tf.vjp(f_vector(torch), ta)
    _close(ko, to)
    _close(kfn(kc), tfn(tc))
    _close(kf.jvp(f_vector(kiln), (ka,), (kt,)), tf.jvp(f_vector(torch), (ta,), (tt,)))
    ko, kj = kf.linearize(f_vector(kiln), ka)
    to, tj = tf.linearize(f_vector(torch), ta)
    _close(ko, to)
    _close(kj(kt), tj(tt))


def test_vjp_with_aux_and_two_primals():
    (ka, ta), (kb, tb) = _pair(3), _pair(3)
    ko, kfn, kaux = kf.vjp(lambda a, b: (a * b, b.sum()), ka, kb, has_aux=True)
    to, tfn, taux = tf.vjp(lambda a, b: (a * b, b.sum()), ta, tb, has_aux=True)
    kc, tc = _pair(3)
    _close((ko, kaux), (to, taux))
    _close(kfn(kc), tfn(tc))


def test_misuse_raises_what_torch_raises():
    ka, ta = _pair(3)
    cases = [
        (lambda f: f.grad(lambda a: a * 2)(X), RuntimeError),  # not a scalar
        (lambda f: f.grad(lambda a: a.sum(), argnums=2)(X), RuntimeError),  # argnum out of range
        (lambda f: f.grad(lambda a: a.sum())(3.0), ValueError),  # not a tensor
    ]
    for call, exc in cases:
        global X
        X = ta
        with pytest.raises(exc) as theirs:
            call(tf)
        X = ka
        with pytest.raises(exc) as ours:
            call(kf)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(RuntimeError, match="same shape"):
        kf.jvp(lambda a: a, (ka,), (kiln.ones(2, dtype=kiln.float64),))
    with pytest.raises(RuntimeError, match="tuples"):
        kf.jvp(lambda a: a, ka, ka)
    with pytest.raises(RuntimeError, match="randomness"):
        kf.jacfwd(lambda a: a, randomness="sometimes")


X = None


def test_gradients_agree_with_gradcheck_on_the_transform():
    x = kiln.randn(3, dtype=kiln.float64, requires_grad=True)
    # the gradient transform is itself differentiable inside another transform: check it numerically
    assert kiln.autograd.gradcheck(lambda a: kf.jacrev(lambda b: b.sin() * b)(a).sum(), (x,))


def test_closed_over_tensors_keep_their_gradient_as_in_torch_func():
    """A function of x that closes over a parameter w: grad(f)(x) stays differentiable with respect to w."""
    grads = []
    for lib, f in ((torch, tf), (kiln, kf)):
        w = lib.tensor([2.0, 3.0], dtype=lib.float64, requires_grad=True)
        x = lib.tensor([1.0, -1.0], dtype=lib.float64)
        g = f.grad(lambda a, w=w: (a * a * w).sum())(x)
        assert g.requires_grad
        g.sum().backward()
        grads.append(w.grad.tolist())
    assert grads[0] == grads[1]


def test_argnums_must_be_unique():
    ka, _ = _pair(3)
    with pytest.raises(RuntimeError, match="argnums elements must be unique"):
        kf.grad(lambda a, b: (a * b).sum(), argnums=(0, 0))(ka, ka)

"""Activation functions, scaled dot-product attention, distances and ``one_hot`` of
``kiln._ops.activation``, ``attention``, ``distance`` and ``one_hot`` against ``torch.nn.functional``: forward and backward on random and
non-contiguous inputs, values exactly at the kinks, 0-d and empty inputs, half precision, gradcheck and
gradgradcheck, in-place forms, autograd node names, and error types and messages."""

from __future__ import annotations

import math
import types

import kiln_testutil as U
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import kiln
from kiln._ops import activation as _activation
from kiln._ops import attention as _attention
from kiln._ops import distance as _distance
from kiln._ops import one_hot as _one_hot

# kiln's activation, attention, distance and one_hot modules as one namespace
_KF_MODULES = (_activation, _attention, _distance, _one_hot)
KF = types.SimpleNamespace(**{k: v for m in _KF_MODULES for k, v in vars(m).items()})

F32, F64 = kiln.float32, kiln.float64


def lib(L):
    """``torch.nn.functional`` for torch, kiln's activation module for kiln."""
    return TF if L is torch else KF


# name -> (fn(L, x), values at the kinks, grad_fn name)
ELEMENTWISE = {
    "gelu": (lambda L, x: lib(L).gelu(x), [0.0], "GeluBackward0"),
    "gelu tanh": (lambda L, x: lib(L).gelu(x, approximate="tanh"), [0.0], "GeluBackward0"),
    "silu": (lambda L, x: lib(L).silu(x), [0.0], "SiluBackward0"),
    "mish": (lambda L, x: lib(L).mish(x), [0.0], "MishBackward0"),
    "elu": (lambda L, x: lib(L).elu(x), [0.0], "EluBackward0"),
    "elu alpha": (lambda L, x: lib(L).elu(x, 2.5), [0.0], "EluBackward0"),
    "selu": (lambda L, x: lib(L).selu(x), [0.0], "EluBackward0"),
    "celu": (lambda L, x: lib(L).celu(x), [0.0], "CeluBackward0"),
    "celu alpha": (lambda L, x: lib(L).celu(x, alpha=0.5), [0.0], "CeluBackward0"),
    "leaky_relu": (lambda L, x: lib(L).leaky_relu(x), [0.0], "LeakyReluBackward0"),
    "leaky_relu slope": (lambda L, x: lib(L).leaky_relu(x, 0.2), [0.0], "LeakyReluBackward0"),
    "relu6": (lambda L, x: lib(L).relu6(x * 3), [0.0, 2.0], "HardtanhBackward0"),
    "hardtanh": (lambda L, x: lib(L).hardtanh(x), [-1.0, 1.0], "HardtanhBackward0"),
    "hardtanh bounds": (lambda L, x: lib(L).hardtanh(x, -0.5, 2.0), [-0.5, 2.0], "HardtanhBackward0"),
    "hardswish": (lambda L, x: lib(L).hardswish(x * 2), [-1.5, 1.5, 0.0], "HardswishBackward0"),
    "hardsigmoid": (lambda L, x: lib(L).hardsigmoid(x * 2), [-1.5, 1.5], "HardsigmoidBackward0"),
    "softplus": (lambda L, x: lib(L).softplus(x), [0.0], "SoftplusBackward0"),
    "softplus beta threshold": (lambda L, x: lib(L).softplus(x, 2.0, 4.0), [2.0], "SoftplusBackward0"),
    "logsigmoid": (lambda L, x: lib(L).logsigmoid(x), [0.0], "LogSigmoidBackward0"),
    "softsign": (lambda L, x: lib(L).softsign(x), [0.0], "DivBackward0"),
    "tanhshrink": (lambda L, x: lib(L).tanhshrink(x), [0.0], "SubBackward0"),
    "softshrink": (lambda L, x: lib(L).softshrink(x), [-0.5, 0.5, 0.0], "SoftshrinkBackward0"),
    "softshrink lambd": (lambda L, x: lib(L).softshrink(x, 1.0), [-1.0, 1.0], "SoftshrinkBackward0"),
    "hardshrink": (lambda L, x: lib(L).hardshrink(x), [-0.5, 0.5, 0.0], "HardshrinkBackward0"),
    "hardshrink lambd": (lambda L, x: lib(L).hardshrink(x, lambd=1.0), [-1.0, 1.0], "HardshrinkBackward0"),
    "threshold": (lambda L, x: lib(L).threshold(x, 0.5, -2.0), [0.5], "ThresholdBackward0"),
    "rrelu eval": (lambda L, x: lib(L).rrelu(x), [0.0], "RreluWithNoiseBackward0"),
    "prelu shared": (
        lambda L, x: lib(L).prelu(x, L.tensor([0.3], dtype=x.dtype)),
        [0.0],
        "PreluKernelBackward0",
    ),
}
# the activations with an ``inplace=`` argument: name -> fn(L, x, inplace)
INPLACE = {
    "elu": lambda L, x, ip: lib(L).elu(x, 0.7, inplace=ip),
    "selu": lambda L, x, ip: lib(L).selu(x, inplace=ip),
    "celu": lambda L, x, ip: lib(L).celu(x, 1.5, inplace=ip),
    "leaky_relu": lambda L, x, ip: lib(L).leaky_relu(x, 0.1, inplace=ip),
    "relu6": lambda L, x, ip: lib(L).relu6(x, inplace=ip),
    "hardtanh": lambda L, x, ip: lib(L).hardtanh(x, -0.5, 0.5, inplace=ip),
    "hardswish": lambda L, x, ip: lib(L).hardswish(x, inplace=ip),
    "hardsigmoid": lambda L, x, ip: lib(L).hardsigmoid(x, inplace=ip),
    "silu": lambda L, x, ip: lib(L).silu(x, inplace=ip),
    "mish": lambda L, x, ip: lib(L).mish(x, inplace=ip),
    "threshold": lambda L, x, ip: lib(L).threshold(x, 0.2, 5.0, inplace=ip),
    "rrelu eval": lambda L, x, ip: lib(L).rrelu(x, 0.1, 0.3, inplace=ip),
}


# ---------------------------------------------------------------------------------------- elementwise


@pytest.mark.parametrize("layout", U.LAYOUTS)
@pytest.mark.parametrize("dtype", [F32, F64], ids=U.dtype_id)
@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_matches_torch(name, dtype, layout):
    fn = ELEMENTWISE[name][0]
    x = U.make_pair((3, 4), dtype, layout=layout, requires_grad=True, seed=len(name))
    U.check_op(fn, x)


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_at_kinks(name):
    """Values exactly at the kinks (and either side of them): forward and gradient as torch's."""
    fn, kinks, _ = ELEMENTWISE[name]
    vals = sorted({v + d for v in kinks for d in (0.0, -1e-3, 1e-3)} | {-4.0, 4.0})
    for dtype in (F32, F64):
        x = U.make_pair((len(vals),), dtype, values=np.array(vals), requires_grad=True)
        U.check_op(fn, x)


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_0d_empty_and_specials(name):
    fn = ELEMENTWISE[name][0]
    U.check_op(fn, U.make_pair((), F32, requires_grad=True))
    U.check_op(fn, U.make_pair((0, 3), F64, requires_grad=True))
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 30.0, -30.0, 1e-30])
    U.check_op(fn, U.make_pair((8,), F64, values=specials), grad=False)


@pytest.mark.parametrize("dtype", U.HALF_DTYPES, ids=U.dtype_id)
@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_half_forward(name, dtype):
    fn = ELEMENTWISE[name][0]
    U.check_op(fn, U.make_pair((3, 5), dtype, layout="transposed"), grad=False)


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_grad_fn_name(name):
    fn, _, node = ELEMENTWISE[name]
    t = fn(torch, torch.randn(3, requires_grad=True))
    k = fn(kiln, kiln.randn(3, requires_grad=True))
    assert t.grad_fn.name() == node
    assert k.grad_fn.name() == node


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_gradcheck_and_gradgradcheck(name):
    fn = ELEMENTWISE[name][0]
    rng = np.random.default_rng(3)
    # values away from the kinks, where finite differences are meaningful
    base = rng.uniform(0.1, 1.4, size=(2, 3)) * rng.choice([-1.0, 1.0], size=(2, 3)) + 0.07
    x = kiln.tensor(base, dtype=F64, requires_grad=True)
    assert kiln.autograd.gradcheck(lambda t: fn(kiln, t), (x,))
    assert kiln.autograd.gradgradcheck(lambda t: fn(kiln, t), (x,))


# torch has no double backward for hardsigmoid (kiln's is checked by gradgradcheck above)
@pytest.mark.parametrize("name", [n for n in ELEMENTWISE if n != "hardsigmoid"])
def test_elementwise_double_backward_matches_torch(name):
    """Second derivatives (gradients of the create_graph gradient) equal torch's on random inputs."""
    fn = ELEMENTWISE[name][0]
    x = U.make_pair((2, 5), F64, layout="transposed", requires_grad=True, seed=13)

    def first_grad(L, v):
        y = fn(L, v)
        (g,) = L.autograd.grad((y * y).sum(), v, create_graph=True)
        return g

    U.check_op(first_grad, x)


# name -> fn(L, x) for the integer and bool input checks (torch's own errors or results)
INTEGER_INPUTS = {
    "gelu": lambda L, x: lib(L).gelu(x),
    "silu": lambda L, x: lib(L).silu(x),
    "mish": lambda L, x: lib(L).mish(x),
    "elu": lambda L, x: lib(L).elu(x),
    "selu": lambda L, x: lib(L).selu(x),
    "celu": lambda L, x: lib(L).celu(x),
    "leaky_relu": lambda L, x: lib(L).leaky_relu(x),
    "relu6": lambda L, x: lib(L).relu6(x),
    "hardtanh": lambda L, x: lib(L).hardtanh(x, 1.5, 2.5),
    "hardswish": lambda L, x: lib(L).hardswish(x),
    "hardsigmoid": lambda L, x: lib(L).hardsigmoid(x),
    "softplus": lambda L, x: lib(L).softplus(x),
    "logsigmoid": lambda L, x: lib(L).logsigmoid(x),
    "softsign": lambda L, x: lib(L).softsign(x),
    "tanhshrink": lambda L, x: lib(L).tanhshrink(x),
    "softshrink": lambda L, x: lib(L).softshrink(x),
    "hardshrink": lambda L, x: lib(L).hardshrink(x),
    "threshold": lambda L, x: lib(L).threshold(x, 1.5, 7.5),
    "rrelu": lambda L, x: lib(L).rrelu(x),
    "rrelu training": lambda L, x: lib(L).rrelu(x, training=True),
    "glu": lambda L, x: lib(L).glu(x),
    "prelu": lambda L, x: lib(L).prelu(x, L.ones(1, dtype=x.dtype)),
}


@pytest.mark.parametrize("dtype", [kiln.int64, kiln.int32, kiln.bool], ids=U.dtype_id)
@pytest.mark.parametrize("name", list(INTEGER_INPUTS))
def test_integer_and_bool_inputs(name, dtype):
    """Refused with torch's message, or (hardtanh, threshold, softsign...) computed as torch does."""
    fn = INTEGER_INPUTS[name]
    x = U.make_pair((2, 4), dtype, low=-3, high=3)
    try:
        fn(torch, x.t)
    except Exception:  # noqa: BLE001 - the premise: torch refuses
        U.assert_same_error(lambda: fn(kiln, x.k), lambda: fn(torch, x.t), exact=True)
    else:
        U.check_op(fn, x, grad=False)


def test_rrelu_training_refuses_float16():
    x = U.make_pair((3,), kiln.float16)
    U.assert_same_error(lambda: KF.rrelu(x.k, training=True), lambda: TF.rrelu(x.t, training=True), exact=True)


def test_non_tensor_input():
    U.assert_same_error(lambda: KF.gelu([1.0]), lambda: TF.gelu([1.0]), exact=True)
    U.assert_same_error(lambda: KF.silu([1.0]), lambda: TF.silu([1.0]), exact=True)


@pytest.mark.parametrize(
    "call",
    [
        lambda F, x: F.gelu(x, approximate="foo"),
        lambda F, x: F.hardtanh(x, 2.0, 1.0),
        lambda F, x: F.softshrink(x, -1.0),
        lambda F, x: F.softshrink(x.double(), -0.25),
        lambda F, x: F.softshrink(x.half(), 1e6),
        lambda F, x: F.softshrink(x.bfloat16(), -0.25),
        lambda F, x: F.softshrink(x, float("nan")),
        lambda F, x: F.celu(x, 0.0),
        lambda F, x: F.rrelu(x, 0.5, 0.1),
        lambda F, x: F.rrelu(x, 0.5, 0.1, training=True),
    ],
    ids=[
        "gelu-approximate",
        "hardtanh-min>max",
        "softshrink-neg",
        "softshrink-neg-double",
        "softshrink-half-too-large",
        "softshrink-bfloat16",
        "softshrink-nan",
        "celu-0",
        "rrelu-eval-bounds",
        "rrelu-train-bounds",
    ],
)
def test_parameter_errors(call):
    x = U.make_pair((2, 3), F32)
    U.assert_same_error(lambda: call(KF, x.k), lambda: call(TF, x.t), exact=True)


# ---------------------------------------------------------------------------------------- in-place


@pytest.mark.parametrize("name", list(INPLACE))
def test_inplace_matches_torch(name):
    fn = INPLACE[name]
    x = U.make_pair((3, 4), F64, layout="transposed", requires_grad=True, seed=5)
    out_k, out_t = U.check_op(lambda L, v: fn(L, v * 1, True), x)
    assert out_k.grad_fn.name() == out_t.grad_fn.name()  # EluBackward1 in place, HardtanhBackward0...
    # the input itself is written and returned
    y = U.make_pair((2, 5), F32, layout="strided", seed=6)
    rk, rt = fn(kiln, y.k, True), fn(torch, y.t, True)
    assert rk is y.k and rt is y.t
    U.assert_close(y.k, y.t)
    U.assert_close(y.k_leaf, y.t_leaf)


@pytest.mark.parametrize(
    "call",
    [
        lambda F, x: F.elu_(x, 0.5),
        lambda F, x: F.selu_(x),
        lambda F, x: F.celu_(x, 2.0),
        lambda F, x: F.leaky_relu_(x, 0.3),
        lambda F, x: F.hardtanh_(x, -0.5, 1.0),
        lambda F, x: F.threshold_(x, 0.1, -7.0),
        lambda F, x: F.rrelu_(x, 0.2, 0.4),
    ],
    ids=["elu_", "selu_", "celu_", "leaky_relu_", "hardtanh_", "threshold_", "rrelu_"],
)
def test_inplace_aliases(call):
    x = U.make_pair((3, 4), F64, requires_grad=True, seed=11)
    U.check_op(lambda L, v: call(lib(L), v * 1), x)


def test_tensor_methods():
    x = U.make_pair((2, 3), F32, requires_grad=True)
    w = U.make_pair((3,), F32, requires_grad=True, low=0.1, high=0.5, seed=1)
    U.check_op(lambda L, v, u: v.hardshrink(0.7) + v.prelu(u), x, w)


def test_rrelu_with_noise_gradcheck():
    rng = np.random.default_rng(2)
    x = kiln.tensor(rng.uniform(0.1, 2, (2, 3)) * rng.choice([-1, 1], (2, 3)), dtype=F64, requires_grad=True)
    noise = kiln.tensor(rng.uniform(0.1, 0.3, (2, 3)), dtype=F64)
    assert kiln.autograd.gradcheck(lambda t: KF.rrelu_with_noise(t, noise, 0.1, 0.3, True), (x,))
    assert kiln.autograd.gradgradcheck(lambda t: KF.rrelu_with_noise(t, noise, 0.1, 0.3, True), (x,))


@pytest.mark.parametrize("name", ["elu", "hardtanh", "rrelu eval"])
def test_inplace_through_a_view(name):
    """Writing into a column of a non-leaf: the base sees it and gradients flow through both paths."""
    fn = INPLACE[name]

    def run(L, v):
        y = v * 2
        fn(L, y[:, 1], True)
        return y

    U.check_op(run, U.make_pair((3, 4), F64, requires_grad=True, seed=12))


def test_inplace_on_leaf_requiring_grad_refused():
    x = U.make_pair((3,), F32, requires_grad=True)
    U.assert_same_error(lambda: KF.elu(x.k, inplace=True), lambda: TF.elu(x.t, inplace=True))


def test_inplace_double_backward():
    x = U.make_pair((4,), F64, requires_grad=True, seed=9)

    def fn(L, v):
        y = lib(L).elu(v * 1, inplace=True)
        (g,) = L.autograd.grad(y.sum(), v, create_graph=True)
        return g

    U.check_op(fn, x)


# ---------------------------------------------------------------------------------------- prelu


@pytest.mark.parametrize(
    "shape,wshape,layout",
    [
        ((2, 3, 4), (3,), "contiguous"),
        ((2, 3, 4, 5), (3,), "transposed"),
        ((2, 3, 4), (1,), "strided"),
        ((2, 3), (3,), "expanded"),
        ((2, 3), (), "contiguous"),
        ((5,), (1,), "contiguous"),
        ((), (1,), "contiguous"),
        ((0, 3, 2), (3,), "contiguous"),
    ],
)
@pytest.mark.parametrize("dtype", [F32, F64], ids=U.dtype_id)
def test_prelu(shape, wshape, layout, dtype):
    x = U.make_pair(shape, dtype, layout=layout, requires_grad=True, seed=1)
    w = U.make_pair(wshape, dtype, requires_grad=True, low=0.05, high=0.5, seed=2)
    U.check_op(lambda L, a, b: lib(L).prelu(a, b), x, w)


def test_prelu_gradcheck():
    x = kiln.tensor(np.random.default_rng(0).uniform(-2, 2, (2, 3, 2)), dtype=F64, requires_grad=True)
    w = kiln.tensor([0.1, 0.2, 0.3], dtype=F64, requires_grad=True)
    assert kiln.autograd.gradcheck(KF.prelu, (x, w))
    assert kiln.autograd.gradgradcheck(KF.prelu, (x, w))


@pytest.mark.parametrize(
    "xshape,wshape,wdtype",
    [
        ((2, 3, 4), (4,), "float32"),
        ((2, 3, 4), (3, 1), "float32"),
        ((), (2,), "float32"),
        ((5,), (5,), "float32"),
        ((2, 3), (3,), "float64"),
        ((2, 3), (3,), "int64"),
    ],
)
def test_prelu_errors(xshape, wshape, wdtype):
    x = U.make_pair(xshape, F32)
    w = U.make_pair(wshape, getattr(kiln, wdtype))
    U.assert_same_error(lambda: KF.prelu(x.k, w.k), lambda: TF.prelu(x.t, w.t), exact=True)


# ---------------------------------------------------------------------------------------- rrelu


def test_rrelu_training_statistics():
    kiln.manual_seed(0)
    x = kiln.tensor(np.linspace(-3, 3, 4001), dtype=F64, requires_grad=True)
    y = KF.rrelu(x, 0.1, 0.3, training=True)
    assert y.grad_fn.name() == "RreluWithNoiseBackward0"
    xv, yv = x.detach().numpy(), y.detach().numpy()
    pos = xv > 0
    np.testing.assert_array_equal(yv[pos], xv[pos])
    slopes = yv[xv < 0] / xv[xv < 0]
    assert slopes.min() >= 0.1 and slopes.max() <= 0.3
    assert abs(slopes.mean() - 0.2) < 0.01 and slopes.std() > 0.04  # uniform on [0.1, 0.3]: std 0.058
    y.sum().backward()
    g = x.grad.numpy()
    np.testing.assert_allclose(g[xv < 0], slopes)
    np.testing.assert_array_equal(g[pos], 1.0)
    # kiln's generator drives the draws
    kiln.manual_seed(0)
    again = KF.rrelu(x.detach(), 0.1, 0.3, training=True)
    np.testing.assert_array_equal(again.numpy(), yv)


def test_rrelu_training_inplace():
    kiln.manual_seed(1)
    x = kiln.tensor([-1.0, 2.0, -3.0])
    out = KF.rrelu(x, training=True, inplace=True)
    assert out is x
    v = x.numpy()
    assert v[1] == 2.0 and -1.0 / 3 <= v[0] <= -1.0 / 8 and -1.0 <= v[2] <= -3.0 / 8
    # through autograd: the gradient is the drawn slope
    leaf = kiln.tensor([-1.0, 2.0, -3.0], dtype=F64, requires_grad=True)
    y = leaf * 1
    KF.rrelu(y, training=True, inplace=True)
    assert y.grad_fn is not None
    y.sum().backward()
    np.testing.assert_allclose(leaf.grad.numpy(), y.detach().numpy() / np.array([-1.0, 2.0, -3.0]))


# ---------------------------------------------------------------------------------------- glu


@pytest.mark.parametrize(
    "shape,dim,layout",
    [((3, 4), -1, "contiguous"), ((4, 3), 0, "transposed"), ((2, 6, 2), 1, "strided"), ((0, 4), 1, "contiguous")],
)
@pytest.mark.parametrize("dtype", [F32, F64], ids=U.dtype_id)
def test_glu(shape, dim, layout, dtype):
    x = U.make_pair(shape, dtype, layout=layout, requires_grad=True)
    out, _ = U.check_op(lambda L, v: lib(L).glu(v, dim), x)
    assert out.grad_fn is None or out.grad_fn.name() == "GluBackward0"


def test_glu_gradcheck():
    x = kiln.tensor(np.random.default_rng(0).normal(size=(2, 4)), dtype=F64, requires_grad=True)
    assert kiln.autograd.gradcheck(lambda t: KF.glu(t, 1), (x,))
    assert kiln.autograd.gradgradcheck(lambda t: KF.glu(t, 0), (x,))


@pytest.mark.parametrize("shape,dim", [((2, 3), -1), ((), -1), ((2, 4), 2)])
def test_glu_errors(shape, dim):
    x = U.make_pair(shape, F32)
    U.assert_same_error(lambda: KF.glu(x.k, dim), lambda: TF.glu(x.t, dim), exact=True)


# ---------------------------------------------------------------------------------------- attention


def _sdpa(**kw):
    return lambda L, q, k, v, *m: lib(L).scaled_dot_product_attention(q, k, v, *m, **kw)


@pytest.mark.parametrize(
    "qs,ks,vs,kw",
    [
        ((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), {}),
        ((3, 4), (6, 4), (6, 2), {}),
        ((2, 3, 4), (2, 5, 4), (2, 5, 3), {"scale": 0.3}),
        ((1, 2, 4, 5), (2, 1, 6, 5), (2, 1, 6, 3), {}),  # broadcast batch dims
        ((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 6), {"is_causal": True}),  # L < S
        ((1, 2, 5, 4), (1, 2, 3, 4), (1, 2, 3, 6), {"is_causal": True}),  # L > S: top-left aligned
        ((1, 4, 3, 4), (1, 2, 5, 4), (1, 2, 5, 6), {"enable_gqa": True}),
        ((0, 2, 3, 4), (0, 2, 5, 4), (0, 2, 5, 6), {}),
        ((1, 2, 3, 4), (1, 2, 0, 4), (1, 2, 0, 6), {}),
    ],
)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=U.dtype_id)
def test_sdpa(qs, ks, vs, kw, layout, dtype):
    q = U.make_pair(qs, dtype, layout=layout, requires_grad=True, seed=1)
    k = U.make_pair(ks, dtype, layout=layout, requires_grad=True, seed=2)
    v = U.make_pair(vs, dtype, requires_grad=True, seed=3)
    U.check_op(_sdpa(**kw), q, k, v, rtol=1e-4, atol=1e-5, grad_rtol=1e-4, grad_atol=1e-5)


@pytest.mark.parametrize("mask_shape", [(3, 5), (1, 1, 3, 5), (2, 1, 1, 5), (3, 1)])
@pytest.mark.parametrize("kind", ["bool", "float", "float32-mask"])
def test_sdpa_masks(mask_shape, kind):
    q = U.make_pair((2, 2, 3, 4), F64, requires_grad=True, seed=1)
    k = U.make_pair((2, 2, 5, 4), F64, requires_grad=True, seed=2)
    v = U.make_pair((2, 2, 5, 6), F64, layout="strided", requires_grad=True, seed=3)
    rng = np.random.default_rng(4)
    keep = rng.random(mask_shape) < 0.6
    if mask_shape[-2:] == (3, 5):
        keep[..., 1, :] = False  # a fully masked row
    if kind == "bool":
        m = U.make_pair(mask_shape, kiln.bool, values=keep)
    else:
        vals = np.where(keep, rng.normal(size=mask_shape), -np.inf)
        # an additive float mask of the query's dtype is differentiable: its gradient is compared too
        m = U.make_pair(mask_shape, F64 if kind == "float" else F32, values=vals, requires_grad=kind == "float")
    U.check_op(_sdpa(), q, k, v, m)


@pytest.mark.parametrize("mask_shape,dtype", [((5,), "bool"), ((), "bool"), ((5,), "float64"), ((), "float64")])
def test_sdpa_low_dim_masks_broadcast(mask_shape, dtype):
    """0-d and 1-d masks broadcast, as on PyTorch's math path (its fused CPU path refuses them for 4-d inputs)."""
    q, k, v = (U.make_pair(s, F64, requires_grad=True, seed=i) for i, s in enumerate([(2, 3, 4), (2, 5, 4), (2, 5, 6)]))
    m = U.make_pair(mask_shape, getattr(kiln, dtype), seed=7)
    U.check_op(_sdpa(), q, k, v, m)


def test_sdpa_fully_masked_row_is_zero_with_zero_grad():
    q = U.make_pair((1, 3, 4), F32, requires_grad=True)
    k = U.make_pair((1, 5, 4), F32, requires_grad=True, seed=1)
    v = U.make_pair((1, 5, 2), F32, requires_grad=True, seed=2)
    m = U.make_pair((3, 5), kiln.bool, values=np.array([[1, 0, 1, 0, 1], [0] * 5, [1] * 5], dtype=bool))
    out, _ = U.check_op(_sdpa(), q, k, v, m)
    assert (out.detach().numpy()[0, 1] == 0).all()
    assert (q.k_leaf.grad.numpy()[0, 1] == 0).all()


@pytest.mark.parametrize("dtype", U.HALF_DTYPES, ids=U.dtype_id)
def test_sdpa_half_forward(dtype):
    q, k, v = (U.make_pair(s, dtype, seed=i) for i, s in enumerate([(2, 3, 4), (2, 5, 4), (2, 5, 3)]))
    U.check_op(_sdpa(), q, k, v, grad=False, rtol=2e-2, atol=2e-2)


def test_sdpa_gradcheck_and_gradgradcheck():
    rng = np.random.default_rng(0)
    q, k, v = (
        kiln.tensor(rng.normal(size=s), dtype=F64, requires_grad=True) for s in [(2, 2, 3), (2, 3, 3), (2, 3, 2)]
    )
    mask = kiln.tensor([[True, False, True], [True, True, True]])

    def f(a, b, c):
        return KF.scaled_dot_product_attention(a, b, c, attn_mask=mask)

    assert kiln.autograd.gradcheck(f, (q, k, v))
    assert kiln.autograd.gradgradcheck(f, (q, k, v))
    assert kiln.autograd.gradcheck(lambda a, b, c: KF.scaled_dot_product_attention(a, b, c, is_causal=True), (q, k, v))


def test_sdpa_dropout_statistics():
    kiln.manual_seed(0)
    q = kiln.zeros((1, 200, 4))  # uniform weights 1/S over S = 50 keys
    k = kiln.zeros((1, 50, 4))
    v = kiln.ones((1, 50, 1))
    out = KF.scaled_dot_product_attention(q, k, v, dropout_p=0.3).numpy().ravel()
    # each output is (kept keys / 50) / 0.7: mean 1, spread of a binomial proportion
    assert abs(out.mean() - 1.0) < 0.03
    assert 0.05 < out.std() < 0.15
    assert np.allclose(KF.scaled_dot_product_attention(q, k, v, dropout_p=0.0).numpy(), 1.0)
    kiln.manual_seed(0)
    np.testing.assert_array_equal(KF.scaled_dot_product_attention(q, k, v, dropout_p=0.3).numpy().ravel(), out)


@pytest.mark.parametrize(
    "qs,ks,vs,dtypes,kw",
    [
        ((1, 3, 4), (1, 5, 4), (1, 5, 6), ("float32", "float64", "float32"), {}),
        ((1, 3, 4), (1, 5, 4), (1, 5, 6), ("float32", "float32", "float64"), {}),
        ((1, 3, 4), (1, 5, 4), (1, 5, 6), ("int64", "int64", "int64"), {}),
        ((1, 3, 4), (1, 5, 3), (1, 5, 6), ("float32",) * 3, {}),
        ((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 4, 6), ("float32",) * 3, {}),
        ((4,), (4,), (4,), ("float32",) * 3, {}),
        ((1, 3, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4), ("float32",) * 3, {"enable_gqa": True}),
        ((1, 4, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4), ("float32",) * 3, {}),
        ((1, 3, 4), (1, 5, 4), (1, 5, 6), ("float32",) * 3, {"dropout_p": 1.5}),
        ((1, 3, 4), (1, 5, 4), (1, 5, 6), ("float32",) * 3, {"mask": ("bool", (3, 5)), "is_causal": True}),
        ((1, 3, 4), (1, 5, 4), (1, 5, 6), ("float32",) * 3, {"mask": ("int64", (3, 5))}),
        ((1, 3, 4), (1, 5, 4), (1, 5, 6), ("float32",) * 3, {"mask": ("float64", (3, 5))}),
        ((1, 3, 4), (1, 5, 4), (1, 5, 6), ("float32",) * 3, {"mask": ("bool", (3, 4))}),
        ((3, 4), (5, 4), (5, 6), ("float32",) * 3, {"enable_gqa": True}),
    ],
)
def test_sdpa_errors(qs, ks, vs, dtypes, kw):
    kw = dict(kw)
    q, k, v = (U.make_pair(s, getattr(kiln, d), seed=i) for i, (s, d) in enumerate(zip((qs, ks, vs), dtypes)))
    mask = kw.pop("mask", None)
    if mask is not None:
        m = U.make_pair(mask[1], getattr(kiln, mask[0]))
        kw["attn_mask"] = None
        km, tm = m.k, m.t
    else:
        km = tm = None
    kw.pop("attn_mask", None)
    U.assert_same_error(
        lambda: KF.scaled_dot_product_attention(q.k, k.k, v.k, attn_mask=km, **kw),
        lambda: TF.scaled_dot_product_attention(q.t, k.t, v.t, attn_mask=tm, **kw),
        exact=True,
    )


# ---------------------------------------------------------------------------------------- distances


@pytest.mark.parametrize(
    "s1,s2,kw",
    [
        ((3, 4), (3, 4), {}),
        ((3, 4), (1, 4), {"dim": -1}),
        ((2, 3, 4), (3, 1), {"dim": 0}),
        ((4,), (4,), {"dim": 0}),
        ((), (), {"dim": 0}),
        ((0, 3), (0, 3), {}),
        ((3, 4), (3, 4), {"eps": 0.5}),
    ],
)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=U.dtype_id)
def test_cosine_similarity(s1, s2, kw, layout, dtype):
    a = U.make_pair(s1, dtype, layout=layout, requires_grad=True, seed=1)
    b = U.make_pair(s2, dtype, layout="strided", requires_grad=True, seed=2)
    U.check_op(lambda L, x, y: lib(L).cosine_similarity(x, y, **kw), a, b)


def test_cosine_similarity_zero_vector_and_mixed_dtypes():
    a = U.make_pair((2, 3), F64, values=np.array([[0.0, 0, 0], [1, 2, 3]]), requires_grad=True)
    b = U.make_pair((2, 3), F64, requires_grad=True, seed=3)
    U.check_op(lambda L, x, y: lib(L).cosine_similarity(x, y, dim=1), a, b)
    c = U.make_pair((2, 3), F32, requires_grad=True, seed=4)
    U.check_op(lambda L, x, y: lib(L).cosine_similarity(x, y), b, c)
    x = kiln.tensor(np.random.default_rng(0).normal(size=(2, 3)), dtype=F64, requires_grad=True)
    y = kiln.tensor(np.random.default_rng(1).normal(size=(2, 3)), dtype=F64, requires_grad=True)
    assert kiln.autograd.gradcheck(KF.cosine_similarity, (x, y))
    assert kiln.autograd.gradgradcheck(KF.cosine_similarity, (x, y))


@pytest.mark.parametrize(
    "s1,s2,d1,d2,kw",
    [
        ((2, 3), (2, 4), "float32", "float32", {}),
        ((2, 3), (2, 3), "float32", "float32", {"dim": 2}),
        ((2, 3), (2, 3), "int64", "int64", {}),
    ],
)
def test_cosine_similarity_errors(s1, s2, d1, d2, kw):
    a, b = U.make_pair(s1, getattr(kiln, d1)), U.make_pair(s2, getattr(kiln, d2))
    U.assert_same_error(
        lambda: KF.cosine_similarity(a.k, b.k, **kw), lambda: TF.cosine_similarity(a.t, b.t, **kw), exact=True
    )


@pytest.mark.parametrize(
    "s1,s2,kw",
    [
        ((3, 4), (3, 4), {}),
        ((3, 4), (4,), {"p": 1.0}),
        ((2, 3, 4), (3, 4), {"p": 3.0, "keepdim": True}),
        ((4,), (4,), {"p": float("inf")}),
        ((), (), {}),
        ((0, 4), (0, 4), {}),
        ((3, 4), (3, 4), {"eps": 0.0, "p": 0.5}),
        ((3, 4), (3, 4), {"p": 0.0}),
    ],
)
@pytest.mark.parametrize("dtype", [F32, F64], ids=U.dtype_id)
def test_pairwise_distance(s1, s2, kw, dtype):
    a = U.make_pair(s1, dtype, layout="transposed", requires_grad=True, seed=1)
    b = U.make_pair(s2, dtype, requires_grad=True, seed=2)
    U.check_op(lambda L, x, y: lib(L).pairwise_distance(x, y, **kw), a, b)


@pytest.mark.parametrize("dtype", U.HALF_DTYPES, ids=U.dtype_id)
def test_distances_half_forward(dtype):
    a, b = U.make_pair((3, 4), dtype, seed=1), U.make_pair((3, 4), dtype, layout="transposed", seed=2)
    U.check_op(lambda L, x, y: lib(L).cosine_similarity(x, y), a, b, grad=False, rtol=2e-2, atol=2e-2)
    U.check_op(lambda L, x, y: lib(L).pairwise_distance(x, y), a, b, grad=False, rtol=2e-2, atol=2e-2)


def test_pairwise_distance_integer_inputs_and_gradcheck():
    a, b = U.make_pair((2, 3), kiln.int64, seed=1), U.make_pair((2, 3), kiln.int64, seed=2)
    U.check_op(lambda L, x, y: lib(L).pairwise_distance(x, y), a, b, grad=False)
    x = kiln.tensor(np.random.default_rng(0).normal(size=(2, 3)), dtype=F64, requires_grad=True)
    y = kiln.tensor(np.random.default_rng(1).normal(size=(2, 3)), dtype=F64, requires_grad=True)
    assert kiln.autograd.gradcheck(KF.pairwise_distance, (x, y))
    assert kiln.autograd.gradgradcheck(KF.pairwise_distance, (x, y))


@pytest.mark.parametrize(
    "shape,p",
    [((4, 3), 2.0), ((5, 2), 1.0), ((3, 3), 3.0), ((4, 2), float("inf")), ((3, 2), 0.0), ((1, 3), 2.0), ((0, 3), 2.0)],
)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_pdist(shape, p, layout):
    x = U.make_pair(shape, F64, layout=layout, requires_grad=True)
    # torch's pdist backward crashes (segfault) with fewer than two rows: forward only there
    U.check_op(lambda L, v: lib(L).pdist(v, p), x, grad=shape[0] >= 2)


def test_pdist_gradcheck():
    x = kiln.tensor(np.random.default_rng(0).normal(size=(4, 3)), dtype=F64, requires_grad=True)
    assert kiln.autograd.gradcheck(KF.pdist, (x,))
    assert kiln.autograd.gradgradcheck(KF.pdist, (x,))


@pytest.mark.parametrize(
    "shape,dtype,p",
    [((2, 3, 4), "float32", 2.0), ((3, 2), "float32", -1.0), ((3, 2), "int64", 2.0), ((3, 2), "float16", 2.0)],
)
def test_pdist_errors(shape, dtype, p):
    x = U.make_pair(shape, getattr(kiln, dtype))
    U.assert_same_error(lambda: KF.pdist(x.k, p), lambda: TF.pdist(x.t, p), exact=True)


# ---------------------------------------------------------------------------------------- one_hot


@pytest.mark.parametrize(
    "values,num_classes",
    [([0, 2, 1], -1), ([[0, 3], [1, 1]], 5), (2, -1), ([], 3), ([0, 1], 2)],
)
def test_one_hot(values, num_classes):
    a = np.asarray(values, dtype=np.int64)
    x = U.make_pair(a.shape, kiln.int64, values=a)
    out, _ = U.check_op(lambda L, v: lib(L).one_hot(v, num_classes), x, grad=False)
    assert out.dtype is kiln.int64


def test_one_hot_strided():
    x = U.make_pair((3, 4), kiln.int64, layout="transposed", low=0, high=4)
    U.check_op(lambda L, v: lib(L).one_hot(v[:, ::2]), x, grad=False)


@pytest.mark.parametrize(
    "values,dtype,num_classes",
    [
        ([0, 2, 1], "int64", 2),
        ([0, -2, 1], "int64", -1),
        ([0, -2, 1], "int64", 4),
        ([0, 1], "float32", -1),
        ([0, 1], "int32", -1),
        ([], "int64", -1),
        ([0], "int64", 0),
        ([1], "bool", -1),
    ],
)
def test_one_hot_errors(values, dtype, num_classes):
    a = np.asarray(values).astype(getattr(kiln, dtype).numpy)
    x = U.make_pair(a.shape, getattr(kiln, dtype), values=a)
    U.assert_same_error(lambda: KF.one_hot(x.k, num_classes), lambda: TF.one_hot(x.t, num_classes), exact=True)


def test_sdpa_matches_explicit_formula():
    """A hand-computed check independent of torch: weights are a softmax of scaled scores."""
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(2, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    s = q @ k.T / math.sqrt(3)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    out = KF.scaled_dot_product_attention(*(kiln.tensor(a) for a in (q, k, v)))
    np.testing.assert_allclose(out.numpy(), w @ v, rtol=1e-12)


@pytest.mark.parametrize("n", [6, 2048])  # NumPy's where; kiln-cpu's loop (or the reference's bit mask)
def test_relu_gradient_passes_at_nan_as_pytorch(n):
    """relu's gradient is the incoming gradient where the input is NaN (PyTorch's threshold_backward drops it
    only where the result is <= 0), first and second order, as kiln.compile's fused expression has it."""
    x = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    x[::3] = np.nan
    x[1] = 0.0
    grads = []
    for L in (kiln, torch):
        t = L.tensor(x.tolist(), requires_grad=True)
        (g,) = L.autograd.grad((L.relu(t) * 2).sum(), t, create_graph=True)
        (gg,) = L.autograd.grad((g * t.detach()).sum(), t, allow_unused=True, materialize_grads=True)
        grads.append((g.detach().numpy(), gg.numpy()))
    np.testing.assert_array_equal(grads[0][0], grads[1][0])
    np.testing.assert_array_equal(grads[0][1], grads[1][1])
    assert grads[0][0][0] == 2.0  # (the first input is NaN)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int32"])
def test_relu_backward_masks_every_gradient_value(dtype):
    """relu's backward (``threshold_backward``) keeps the gradient's bits where the result is positive
    (NaN, inf and -0.0 included) and gives +0 elsewhere, even for a NaN or inf gradient; bit for bit
    PyTorch's."""
    from kiln._ops.relu import _threshold_backward

    specials = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.5, 3.0]
    grad_np = np.array(specials * 2, np.float64)
    out_np = np.array([1.0] * 8 + [0.0, -1.0, 0.0, -0.0, np.nan, -np.inf, 0.0, -3.0])
    if dtype == "int32":
        grad_np = np.arange(16) - 8
        out_np = np.array([1] * 8 + [0, -1, 0, 0, 2, -5, 0, -3])
    results = []
    for L in (kiln, torch):
        d = getattr(L, dtype)
        g, r = L.tensor(grad_np.tolist(), dtype=d), L.tensor(out_np.tolist(), dtype=d)
        got = torch.ops.aten.threshold_backward(g, r, 0) if L is torch else _threshold_backward(g, r)
        results.append(got.view(L.int16 if got.element_size() == 2 else getattr(L, f"int{8 * got.element_size()}")))
    assert results[0].tolist() == results[1].tolist()


@pytest.mark.parametrize(
    "call",
    [("hardtanh", ()), ("relu6", ()), ("elu", ()), ("celu", (0.5,)), ("selu", ())],
)
def test_piecewise_activation_gradients_at_nan_as_pytorch(call):
    """A NaN input takes the gradient of the side PyTorch's backward tests last (the inner or positive one),
    not NaN or 0."""
    name, extra = call
    x = [float("nan"), -2.0, -0.5, 0.0, 0.5, 3.0, 7.0]
    grads = []
    for L, F in ((kiln, KF), (torch, TF)):
        t = L.tensor(x, requires_grad=True)
        getattr(F, name)(t, *extra).sum().backward()
        grads.append(t.grad.tolist())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6)


def test_relu_pickles_by_reference():
    """kiln.relu, made by elementwise's op factory, pickles by reference (a model holding it saves)."""
    import pickle

    assert pickle.loads(pickle.dumps(kiln.relu)) is kiln.relu
    assert pickle.loads(pickle.dumps(kiln.Tensor.relu)) is kiln.Tensor.relu

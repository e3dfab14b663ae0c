"""Layers against torch: same parameter shapes, outputs and gradients for copied weights."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kiln_nn_helpers import assert_close, copy_weights, k2t

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
import kiln.optim


@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 4), (4,)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(shape, bias):
    k, t = nn.Linear(4, 3, bias=bias), torch.nn.Linear(4, 3, bias=bias)
    assert [(n, tuple(p.shape)) for n, p in k.named_parameters()] == [
        (n, tuple(p.shape)) for n, p in t.named_parameters()
    ]
    copy_weights(k, t)
    x = kiln.randn(*shape, requires_grad=True)
    xt = k2t(x, requires_grad=True)
    yk, yt = k(x), t(xt)
    assert tuple(yk.shape) == tuple(yt.shape)
    assert_close(yk, yt)
    g = kiln.randn(*yk.shape)
    yk.backward(g)
    yt.backward(k2t(g))
    assert_close(x.grad, xt.grad)
    assert_close(k.weight.grad, t.weight.grad)
    if bias:
        assert_close(k.bias.grad, t.bias.grad)


def test_linear_init_bounds():
    m = nn.Linear(100, 50)
    bound = 1 / math.sqrt(100)
    assert m.weight.abs().max().item() <= bound
    assert m.bias.abs().max().item() <= bound
    # kaiming_uniform(a=sqrt(5)) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)): std = bound / sqrt(3)
    assert abs(m.weight.std().item() - bound / math.sqrt(3)) < 0.1 * bound


def test_linear_wrong_shape_names_layer_and_matches_torch_prefix():
    m = nn.Linear(4, 5)
    with pytest.raises(RuntimeError) as ek:
        m(kiln.randn(2, 3))
    with pytest.raises(RuntimeError) as et:
        torch.nn.Linear(4, 5)(torch.randn(2, 3))
    assert str(ek.value).startswith(str(et.value))
    assert "Linear(in_features=4, out_features=5, bias=True)" in str(ek.value) and "(*, 4)" in str(ek.value)
    with pytest.raises(RuntimeError) as ek:
        m(kiln.randn(2, 7, 3))
    with pytest.raises(RuntimeError) as et:
        torch.nn.Linear(4, 5)(torch.randn(2, 7, 3))
    assert str(ek.value).startswith(str(et.value))
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(2x3 and 4x5\)"):
        F.linear(kiln.randn(2, 3), kiln.randn(5, 4))


def test_bilinear_matches_torch():
    k, t = nn.Bilinear(3, 4, 2), torch.nn.Bilinear(3, 4, 2)
    copy_weights(k, t)
    a, b = kiln.randn(5, 3, requires_grad=True), kiln.randn(5, 4, requires_grad=True)
    at, bt = k2t(a, True), k2t(b, True)
    yk, yt = k(a, b), t(at, bt)
    assert_close(yk, yt)
    yk.sum().backward()
    yt.sum().backward()
    assert_close(a.grad, at.grad)
    assert_close(b.grad, bt.grad)
    assert_close(k.weight.grad, t.weight.grad)
    assert_close(k.bias.grad, t.bias.grad)
    y3 = k(kiln.randn(2, 5, 3), kiln.randn(2, 5, 4))
    assert tuple(y3.shape) == (2, 5, 2)


def test_lazy_linear_infers_in_features():
    m = nn.LazyLinear(5)
    assert repr(m) == repr(torch.nn.LazyLinear(5))
    opt_params = list(m.parameters())
    y = m(kiln.randn(2, 7))
    assert tuple(y.shape) == (2, 5)
    assert type(m) is nn.Linear and m.in_features == 7
    assert tuple(m.weight.shape) == (5, 7) and type(m.weight) is nn.Parameter
    assert opt_params[0] is m.weight  # an optimizer built before the first call still sees them
    assert repr(m) == "Linear(in_features=7, out_features=5, bias=True)"
    y.sum().backward()
    assert m.weight.grad is not None


def test_identity_flatten_unflatten():
    x = kiln.randn(2, 3, 4, 5)
    xt = k2t(x)
    assert nn.Identity(54, unused="x")(x) is x
    for args in [(), (0,), (1, 2), (2, -1)]:
        assert_close(nn.Flatten(*args)(x), torch.nn.Flatten(*args)(xt))
        assert repr(nn.Flatten(*args)) == repr(torch.nn.Flatten(*args))
    y = kiln.randn(2, 12)
    assert_close(nn.Unflatten(1, (3, 4))(y), torch.nn.Unflatten(1, (3, 4))(k2t(y)))
    with pytest.raises(TypeError, match="unflattened_size must be tuple of ints"):
        nn.Unflatten(1, (3, 4.0))


def test_functional_reexports_core():
    assert callable(F.linear) and callable(F.bilinear)
    x = kiln.tensor([-1.0, 2.0])
    assert F.relu(x).tolist() == [0.0, 2.0]
    assert_close(F.sigmoid(x), torch.sigmoid(k2t(x)))
    assert_close(F.tanh(x), torch.tanh(k2t(x)))
    F.relu(x, inplace=True)
    assert x.tolist() == [0.0, 2.0]
    assert set(F.__all__) >= {"linear", "bilinear", "relu", "sigmoid", "tanh"}


def test_mlp_training_step_matches_torch():
    def mlp(lib):
        return lib.nn.Sequential(lib.nn.Linear(3, 8), lib.nn.Linear(8, 8), lib.nn.Linear(8, 1))

    k, t = mlp(kiln), mlp(torch)
    copy_weights(k, t)
    ok, ot = (
        kiln.optim.SGD(k.parameters(), lr=0.05, momentum=0.9),
        torch.optim.SGD(t.parameters(), lr=0.05, momentum=0.9),
    )
    x, y = kiln.randn(16, 3), kiln.randn(16, 1)
    xt, yt = k2t(x), k2t(y)
    for _ in range(5):
        ok.zero_grad()
        ot.zero_grad()
        lk = ((k(x).relu() - y) ** 2).mean()
        lt = ((t(xt).relu() - yt) ** 2).mean()
        lk.backward()
        lt.backward()
        ok.step()
        ot.step()
    for pk, pt in zip(k.parameters(), t.parameters()):
        assert_close(pk, pt, rtol=1e-5, atol=1e-6)


def test_lazy_linear_loads_state_dict_before_first_call():
    src = nn.Linear(3, 2)
    lazy = nn.LazyLinear(2)
    lazy.load_state_dict(src.state_dict())
    x = kiln.randn(4, 3)
    assert_close(lazy(x), k2t(src(x)))
    assert type(lazy) is nn.Linear and lazy.in_features == 3


@settings(max_examples=25, deadline=None)
@given(
    lead=st.lists(st.integers(0, 3), min_size=0, max_size=3),
    in_f=st.integers(1, 5),
    out_f=st.integers(1, 5),
    bias=st.booleans(),
)
def test_functional_linear_random_shapes(lead, in_f, out_f, bias):
    x = kiln.randn(*lead, in_f, requires_grad=True)
    w = kiln.randn(out_f, in_f, requires_grad=True)
    b = kiln.randn(out_f, requires_grad=True) if bias else None
    xt, wt = k2t(x, True), k2t(w, True)
    bt = k2t(b, True) if bias else None
    y, yt = F.linear(x, w, b), torch.nn.functional.linear(xt, wt, bt)
    assert tuple(y.shape) == tuple(yt.shape)
    assert_close(y, yt)
    y.sum().backward()
    yt.sum().backward()
    assert_close(x.grad, xt.grad)
    assert_close(w.grad, wt.grad)
    if bias:
        assert_close(b.grad, bt.grad)

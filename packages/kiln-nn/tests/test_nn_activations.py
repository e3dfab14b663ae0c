"""Activation layers against torch: repr, outputs and gradients, including in-place variants."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from layer_twins import check_twin, same_error, seeded, to_np  # noqa: F401

import kiln
import kiln.nn as nn

ACT_CASES = [
    ("ReLU", (), {}),
    ("ReLU", (), {"inplace": True}),
    ("ReLU6", (), {}),
    ("LeakyReLU", (0.2,), {}),
    ("PReLU", (), {}),
    ("PReLU", (3,), {"init": 0.1}),
    ("ELU", (0.5,), {}),
    ("CELU", (1.5,), {}),
    ("SELU", (), {}),
    ("GELU", (), {}),
    ("GELU", (), {"approximate": "tanh"}),
    ("SiLU", (), {}),
    ("Mish", (), {}),
    ("Sigmoid", (), {}),
    ("Tanh", (), {}),
    ("Softmax", (), {"dim": 1}),
    ("Softmax", (), {"dim": -1}),
    ("LogSoftmax", (), {"dim": 1}),
    ("Softmin", (), {"dim": 0}),
    ("Softmax2d", (), {}),
    ("Softplus", (), {"beta": 2.0, "threshold": 1.0}),
    ("Hardswish", (), {}),
    ("Hardsigmoid", (), {}),
    ("Hardtanh", (-0.5, 0.7), {}),
    ("Softsign", (), {}),
    ("Tanhshrink", (), {}),
    ("Threshold", (0.1, 20.0), {}),
    ("GLU", (), {"dim": -1}),
    ("LogSigmoid", (), {}),
    ("Hardshrink", (0.3,), {}),
    ("Softshrink", (0.3,), {}),
    ("RReLU", (0.1, 0.3), {}),
]


@pytest.mark.parametrize(("name", "args", "kwargs"), ACT_CASES)
def test_activation_matches_torch(name, args, kwargs):
    k, t = getattr(nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs)
    k.eval()
    t.eval()
    x = torch.randn(2, 3, 4, 4) * 3
    if kwargs.get("inplace"):
        # in-place on a leaf needing grad is an error in both; compare on a non-leaf
        xk, xt = kiln.tensor(to_np(x), requires_grad=True), x.clone().requires_grad_(True)
        yk, yt = k(xk * 1.0), t(xt * 1.0)
        np.testing.assert_allclose(to_np(yk), to_np(yt))
        yk.sum().backward()
        yt.sum().backward()
        np.testing.assert_allclose(to_np(xk.grad), to_np(xt.grad))
        assert repr(k) == repr(t)
        return
    check_twin(k, t, x)


def test_inplace_writes_into_input():
    for m, t in [
        (nn.ReLU(inplace=True), torch.nn.ReLU(inplace=True)),
        (nn.LeakyReLU(0.5, inplace=True), torch.nn.LeakyReLU(0.5, inplace=True)),
        (nn.Hardtanh(inplace=True), torch.nn.Hardtanh(inplace=True)),
        (nn.ELU(inplace=True), torch.nn.ELU(inplace=True)),
        (nn.SiLU(True), torch.nn.SiLU(True)),
    ]:
        x, xt = kiln.tensor([-1.0, 2.0, -3.0]), torch.tensor([-1.0, 2.0, -3.0])
        m(x)
        t(xt)
        np.testing.assert_allclose(to_np(x), xt.numpy(), rtol=1e-6)


def test_prelu_init_and_softmax_implicit_dim_warning():
    assert nn.PReLU(4).weight.tolist() == [0.25] * 4
    with pytest.warns(UserWarning, match="Implicit dimension choice"):
        nn.Softmax()(kiln.randn(2, 3))


def test_activation_errors_match_torch():
    same_error(lambda: nn.Hardtanh(1.0, 0.5), lambda: torch.nn.Hardtanh(1.0, 0.5), AssertionError)
    same_error(lambda: nn.Softmax2d()(kiln.randn(3, 3)), lambda: torch.nn.Softmax2d()(torch.randn(3, 3)), ValueError)
    same_error(lambda: nn.GLU()(kiln.randn(2, 3)), lambda: torch.nn.GLU()(torch.randn(2, 3)), RuntimeError)
    same_error(lambda: nn.PReLU(3)(kiln.randn(2, 4)), lambda: torch.nn.PReLU(3)(torch.randn(2, 4)), RuntimeError)

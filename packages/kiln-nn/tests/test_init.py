"""kiln.nn.init: distributions checked statistically against PyTorch's formulas, errors as torch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from kiln_nn_helpers import to_np

import kiln
from kiln.nn import init


def empty(*shape):
    return kiln.empty(*shape)


def test_calculate_gain_matches_torch():
    for name in ["linear", "conv2d", "sigmoid", "tanh", "relu", "leaky_relu", "selu", "conv_transpose3d"]:
        assert init.calculate_gain(name) == torch.nn.init.calculate_gain(name)
    assert init.calculate_gain("leaky_relu", 0.2) == torch.nn.init.calculate_gain("leaky_relu", 0.2)
    for lib in (init, torch.nn.init):
        with pytest.raises(ValueError, match="Unsupported nonlinearity foo"):
            lib.calculate_gain("foo")
        with pytest.raises(ValueError, match="negative_slope True not a valid number"):
            lib.calculate_gain("leaky_relu", True)


def test_uniform_and_normal_moments():
    t = init.uniform_(empty(200, 100), -2.0, 3.0)
    a = to_np(t)
    assert a.min() >= -2.0 and a.max() <= 3.0
    assert abs(a.mean() - 0.5) < 0.05 and abs(a.std() - 5 / math.sqrt(12)) < 0.05
    a = to_np(init.normal_(empty(200, 100), 1.5, 0.5))
    assert abs(a.mean() - 1.5) < 0.02 and abs(a.std() - 0.5) < 0.02


def test_trunc_normal_bounds_and_std():
    a = to_np(init.trunc_normal_(empty(200, 100), mean=0.0, std=1.0, a=-1.0, b=2.0))
    assert a.min() >= -1.0 and a.max() <= 2.0
    ref = torch.nn.init.trunc_normal_(torch.empty(200, 100), mean=0.0, std=1.0, a=-1.0, b=2.0).numpy()
    assert abs(a.mean() - ref.mean()) < 0.03 and abs(a.std() - ref.std()) < 0.03
    with pytest.warns(UserWarning, match="mean is more than 2 std from"):
        init.trunc_normal_(empty(3), mean=10.0, std=1.0, a=-1.0, b=1.0)


def test_constant_ones_zeros_eye_dirac_match_torch():
    assert to_np(init.constant_(empty(2, 3), 0.3)).tolist() == torch.nn.init.constant_(torch.empty(2, 3), 0.3).tolist()
    assert to_np(init.ones_(empty(2))).tolist() == [1.0, 1.0]
    assert to_np(init.zeros_(empty(2))).tolist() == [0.0, 0.0]
    assert to_np(init.eye_(empty(3, 5))).tolist() == torch.nn.init.eye_(torch.empty(3, 5)).tolist()
    for shape, groups in [((4, 2, 3), 1), ((6, 3, 3, 3), 2), ((2, 2, 1, 3, 3), 1)]:
        got = to_np(init.dirac_(empty(*shape), groups))
        ref = torch.nn.init.dirac_(torch.empty(*shape), groups).numpy()
        assert (got == ref).all()
    for lib, make in ((init, empty), (torch.nn.init, torch.empty)):
        with pytest.raises(ValueError, match="Only tensors with 2 dimensions are supported"):
            lib.eye_(make(3))
        with pytest.raises(ValueError, match="Only tensors with 3, 4, or 5 dimensions are supported"):
            lib.dirac_(make(3, 3))
        with pytest.raises(ValueError, match="dim 0 must be divisible by groups"):
            lib.dirac_(make(3, 3, 3), 2)


@pytest.mark.parametrize("shape", [(300, 200), (64, 32, 3, 3)])
def test_xavier_and_kaiming_std(shape):
    fan_in = shape[1] * int(np.prod(shape[2:]))
    fan_out = shape[0] * int(np.prod(shape[2:]))
    xs = math.sqrt(2.0 / (fan_in + fan_out))
    a = to_np(init.xavier_uniform_(empty(*shape), gain=2.0))
    assert abs(a).max() <= 2.0 * xs * math.sqrt(3) + 1e-6 and abs(a.std() - 2.0 * xs) < 0.05 * 2.0 * xs
    a = to_np(init.xavier_normal_(empty(*shape)))
    assert abs(a.std() - xs) < 0.05 * xs
    ks = math.sqrt(2.0) / math.sqrt(fan_in)
    a = to_np(init.kaiming_uniform_(empty(*shape), nonlinearity="relu"))
    assert abs(a).max() <= ks * math.sqrt(3) + 1e-6 and abs(a.std() - ks) < 0.05 * ks
    ks_out = math.sqrt(2.0 / (1 + 0.1**2)) / math.sqrt(fan_out)
    a = to_np(init.kaiming_normal_(empty(*shape), a=0.1, mode="fan_out"))
    assert abs(a.std() - ks_out) < 0.05 * ks_out and abs(a.mean()) < 0.05 * ks_out


def test_fan_errors_match_torch():
    for lib, make in ((init, empty), (torch.nn.init, torch.empty)):
        with pytest.raises(
            ValueError, match="Fan in and fan out can not be computed for tensor with fewer than 2 dimensions"
        ):
            lib.xavier_uniform_(make(5))
        with pytest.raises(ValueError, match=r"Mode fan_avg not supported, please use one of \['fan_in', 'fan_out'\]"):
            lib.kaiming_uniform_(make(3, 3), mode="fan_avg")
        with pytest.raises(ValueError, match="Only tensors with 2 or more dimensions are supported"):
            lib.orthogonal_(make(3))
        with pytest.raises(ValueError, match="Only tensors with 2 dimensions are supported"):
            lib.sparse_(make(3, 3, 3), 0.5)
    with pytest.warns(UserWarning, match="Initializing zero-element tensors is a no-op"):
        init.kaiming_uniform_(empty(0, 3))


@pytest.mark.parametrize("shape", [(5, 8), (8, 5), (4, 2, 3)])
def test_orthogonal(shape):
    a = to_np(init.orthogonal_(empty(*shape), gain=2.0)).reshape(shape[0], -1)
    rows, cols = a.shape
    gram = a @ a.T if rows <= cols else a.T @ a
    np.testing.assert_allclose(gram, 4.0 * np.eye(min(rows, cols)), atol=1e-4)


def test_sparse_zero_fraction():
    a = to_np(init.sparse_(empty(10, 40), sparsity=0.3, std=0.5))
    assert ((a == 0).sum(axis=0) >= 3).all()
    nz = a[a != 0]
    assert abs(nz.std() - 0.5) < 0.1


def test_generator_reproducible_and_no_grad():
    g1, g2 = kiln.Generator().manual_seed(7), kiln.Generator().manual_seed(7)
    for fn in (init.uniform_, init.normal_, init.xavier_uniform_, init.kaiming_normal_, init.orthogonal_):
        a = to_np(fn(empty(4, 6), generator=g1))
        b = to_np(fn(empty(4, 6), generator=g2))
        assert (a == b).all()
    p = kiln.nn.Parameter(kiln.zeros(3, 3))
    init.normal_(p)
    assert p.is_leaf and p.grad_fn is None and p.requires_grad

"""RNN, LSTM, GRU and their cells against torch: parameter names and init, outputs, gradients, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from layer_twins import assert_same_structure, check_twin, load_from_torch, same_error, seeded, to_np  # noqa: F401

import kiln
import kiln.nn as nn

RNN_CASES = [
    ("RNN", (3, 5), {}, (4, 2, 3), False),
    ("RNN", (3, 5, 2), {"nonlinearity": "relu", "batch_first": True}, (2, 4, 3), True),
    ("RNN", (3, 5, 2, "tanh", False, False, 0.0, True), {}, (4, 2, 3), False),
    ("LSTM", (3, 6), {}, (4, 2, 3), True),
    ("LSTM", (3, 6, 2), {"bidirectional": True, "batch_first": True}, (2, 5, 3), False),
    ("LSTM", (3, 6, 2), {"proj_size": 2, "bidirectional": True}, (4, 2, 3), True),
    ("LSTM", (3, 4), {"bias": False}, (4, 3), True),
    ("GRU", (3, 5), {}, (4, 2, 3), True),
    ("GRU", (3, 5, 3), {"bidirectional": True, "batch_first": True, "bias": False}, (2, 4, 3), False),
    ("GRU", (3, 5), {"bidirectional": True}, (6, 3), True),
    ("RNN", (3, 5, 2), {"batch_first": True}, (4, 3), True),
    ("LSTM", (3, 5), {"batch_first": True, "proj_size": 3}, (4, 3), False),
]


def _state(name, mod, shape):
    batched = len(shape) == 3
    b = (shape[0] if mod.batch_first else shape[1]) if batched else None
    nd = 2 if mod.bidirectional else 1
    real = mod.proj_size if getattr(mod, "proj_size", 0) else mod.hidden_size
    lead = (mod.num_layers * nd, b) if batched else (mod.num_layers * nd,)
    if name == "LSTM":
        return (torch.randn(*lead, real), torch.randn(*lead, mod.hidden_size))
    return torch.randn(*lead, real)


@pytest.mark.filterwarnings("ignore:LSTM with projections")
@pytest.mark.parametrize(("name", "args", "kwargs", "shape", "with_state"), RNN_CASES)
def test_recurrent_matches_torch(name, args, kwargs, shape, with_state):
    k, t = getattr(nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs)
    assert_same_structure(k, t)
    load_from_torch(k, t)
    x = torch.randn(*shape)
    xk, xt = kiln.tensor(to_np(x), requires_grad=True), x.clone().requires_grad_(True)
    if with_state:
        s = _state(name, t, shape)
        if name == "LSTM":
            sk = tuple(kiln.tensor(to_np(v), requires_grad=True) for v in s)
            st = tuple(v.clone().requires_grad_(True) for v in s)
        else:
            sk, st = kiln.tensor(to_np(s), requires_grad=True), s.clone().requires_grad_(True)
        (yk, hk), (yt, ht) = k(xk, sk), t(xt, st)
    else:
        (yk, hk), (yt, ht) = k(xk), t(xt)
    hk = hk if isinstance(hk, tuple) else (hk,)
    ht = ht if isinstance(ht, tuple) else (ht,)
    for a, b in zip((yk, *hk), (yt, *ht)):
        assert tuple(a.shape) == tuple(b.shape)
        np.testing.assert_allclose(to_np(a), to_np(b), rtol=1e-4, atol=1e-5)
    lk = (yk * yk).sum() + sum((h * 2).sum() for h in hk)
    lt = (yt * yt).sum() + sum((h * 2).sum() for h in ht)
    lk.backward()
    lt.backward()
    np.testing.assert_allclose(to_np(xk.grad), to_np(xt.grad), rtol=1e-4, atol=1e-5)
    if with_state:
        for a, b in zip(sk if isinstance(sk, tuple) else (sk,), st if isinstance(st, tuple) else (st,)):
            np.testing.assert_allclose(to_np(a.grad), to_np(b.grad), rtol=1e-4, atol=1e-5)
    tp = dict(t.named_parameters())
    for n, p in k.named_parameters():
        np.testing.assert_allclose(to_np(p.grad), to_np(tp[n].grad), rtol=1e-4, atol=1e-5, err_msg=n)


def test_parameter_names_and_all_weights():
    k = nn.LSTM(3, 4, 2, bidirectional=True, proj_size=2)
    names = [n for n, _ in k.named_parameters()]
    assert names[:5] == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", "weight_hr_l0"]
    assert "weight_hh_l1_reverse" in names and "weight_hr_l1_reverse" in names
    assert len(k.all_weights) == 4 and k.all_weights[1][0] is k.weight_ih_l0_reverse


def test_recurrent_dropout_between_layers_only_in_training():
    k = nn.GRU(3, 8, 3, dropout=0.5)
    x = kiln.randn(5, 2, 3)
    k.eval()
    y1, _ = k(x)
    y2, _ = k(x)
    np.testing.assert_array_equal(to_np(y1), to_np(y2))
    k.train()
    ya, _ = k(x)
    yb, _ = k(x)
    assert not np.allclose(to_np(ya), to_np(yb))
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        nn.LSTM(3, 4, dropout=0.2)


def test_recurrent_init_uniform_bounds():
    m = nn.LSTM(20, 64, 2, bidirectional=True)
    bound = 1 / math.sqrt(64)
    for _, p in m.named_parameters():
        assert p.abs().max().item() <= bound
    w = to_np(m.weight_ih_l0)
    assert abs(w.std() - bound / math.sqrt(3)) < 0.05 * bound and abs(w.mean()) < 0.05 * bound
    c = nn.GRUCell(10, 100)
    assert all(p.abs().max().item() <= 0.1 for p in c.parameters())


CELL_CASES = [
    ("RNNCell", (3, 5), {}, (2, 3)),
    ("RNNCell", (3, 5), {"nonlinearity": "relu", "bias": False}, (3,)),
    ("LSTMCell", (3, 5), {}, (2, 3)),
    ("LSTMCell", (3, 5), {"bias": False}, (3,)),
    ("GRUCell", (3, 5), {}, (2, 3)),
    ("GRUCell", (3, 5), {}, (3,)),
]


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize(("name", "args", "kwargs", "shape"), CELL_CASES)
def test_cells_match_torch(name, args, kwargs, shape, with_state):
    k, t = getattr(nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs)
    x = torch.randn(*shape)
    if not with_state:
        check_twin(k, t, x)
        return
    hs = shape[:-1] + (5,)
    if name == "LSTMCell":
        assert_same_structure(k, t)
        load_from_torch(k, t)
        h, c = torch.randn(*hs), torch.randn(*hs)
        (hk, ck), (ht, ct) = k(kiln.tensor(to_np(x)), (kiln.tensor(to_np(h)), kiln.tensor(to_np(c)))), t(x, (h, c))
        np.testing.assert_allclose(to_np(hk), to_np(ht), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(to_np(ck), to_np(ct), rtol=1e-5, atol=1e-6)
    else:
        check_twin(k, t, x, torch.randn(*hs))


def test_recurrent_wrong_shape_errors_match_torch():
    for name in ("RNN", "LSTM", "GRU"):
        k, t = getattr(nn, name)(3, 4), getattr(torch.nn, name)(3, 4)
        same_error(lambda k=k: k(kiln.randn(2, 5, 2)), lambda t=t: t(torch.randn(2, 5, 2)), RuntimeError)
        same_error(lambda k=k: k(kiln.randn(2, 5, 2, 1)), lambda t=t: t(torch.randn(2, 5, 2, 1)), ValueError)
    same_error(
        lambda: nn.GRU(3, 4)(kiln.randn(2, 5, 3), kiln.randn(2, 5, 4)),
        lambda: torch.nn.GRU(3, 4)(torch.randn(2, 5, 3), torch.randn(2, 5, 4)),
        RuntimeError,
    )
    same_error(
        lambda: nn.LSTM(3, 4)(kiln.randn(2, 5, 3), (kiln.randn(1, 5, 4), kiln.randn(1, 4, 4))),
        lambda: torch.nn.LSTM(3, 4)(torch.randn(2, 5, 3), (torch.randn(1, 5, 4), torch.randn(1, 4, 4))),
        RuntimeError,
    )
    same_error(
        lambda: nn.RNN(3, 4)(kiln.randn(2, 5, 3), kiln.randn(1, 4)),
        lambda: torch.nn.RNN(3, 4)(torch.randn(2, 5, 3), torch.randn(1, 4)),
        RuntimeError,
    )
    same_error(lambda: nn.RNN(3, 4, nonlinearity="gelu"), lambda: torch.nn.RNN(3, 4, nonlinearity="gelu"), ValueError)
    same_error(lambda: nn.GRU(3, 4, proj_size=2), lambda: torch.nn.GRU(3, 4, proj_size=2), ValueError)
    same_error(lambda: nn.LSTM(3, 4, proj_size=4), lambda: torch.nn.LSTM(3, 4, proj_size=4), ValueError)
    same_error(lambda: nn.LSTM(3, 4, dropout=2), lambda: torch.nn.LSTM(3, 4, dropout=2), ValueError)
    same_error(
        lambda: nn.RNNCell(3, 4)(kiln.randn(1, 2, 3)), lambda: torch.nn.RNNCell(3, 4)(torch.randn(1, 2, 3)), ValueError
    )
    same_error(
        lambda: nn.LSTMCell(3, 4)(kiln.randn(2, 3), (kiln.randn(1, 2, 4), kiln.randn(2, 4))),
        lambda: torch.nn.LSTMCell(3, 4)(torch.randn(2, 3), (torch.randn(1, 2, 4), torch.randn(2, 4))),
        ValueError,
    )
    same_error(
        lambda: nn.LSTM(3, 4)(kiln.randn(2, 5, 3).double()),
        lambda: torch.nn.LSTM(3, 4)(torch.randn(2, 5, 3).double()),
        ValueError,
    )

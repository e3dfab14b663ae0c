"""Loss modules against torch for every reduction: values, input gradients, weight buffers, repr, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from layer_twins import check_twin, same_error, seeded, to_np  # noqa: F401

import kiln
import kiln.nn as nn

REDUCTIONS = ["none", "mean", "sum"]


def _probs(*shape):
    return torch.rand(*shape) * 0.9 + 0.05


def _sign(*shape):
    return torch.randint(0, 2, shape).float() * 2 - 1


def _ctc_inputs():
    log_probs = torch.randn(12, 2, 5).log_softmax(2)
    return (log_probs, torch.randint(1, 5, (2, 4)), torch.tensor([12, 10]), torch.tensor([4, 3]))


# (class name, constructor kwargs, input maker) — inputs that are float and not targets get gradients
LOSS_CASES = [
    ("L1Loss", {}, lambda: (torch.randn(3, 4), torch.randn(3, 4))),
    ("MSELoss", {}, lambda: (torch.randn(3, 4), torch.randn(3, 4))),
    ("SmoothL1Loss", {"beta": 0.5}, lambda: (torch.randn(3, 4), torch.randn(3, 4))),
    ("HuberLoss", {"delta": 0.7}, lambda: (torch.randn(3, 4) * 2, torch.randn(3, 4))),
    ("CrossEntropyLoss", {}, lambda: (torch.randn(5, 4), torch.randint(0, 4, (5,)))),
    (
        "CrossEntropyLoss",
        {"weight": torch.rand(4) + 0.5, "ignore_index": 1, "label_smoothing": 0.1},
        lambda: (torch.randn(5, 4, 3), torch.randint(0, 4, (5, 3))),
    ),
    ("CrossEntropyLoss", {"label_smoothing": 0.2}, lambda: (torch.randn(5, 4), torch.randn(5, 4).softmax(1))),
    ("NLLLoss", {}, lambda: (torch.randn(5, 4).log_softmax(1), torch.randint(0, 4, (5,)))),
    ("NLLLoss", {"weight": torch.rand(4) + 0.5}, lambda: (torch.randn(3, 4, 2, 2), torch.randint(0, 4, (3, 2, 2)))),
    ("BCELoss", {}, lambda: (_probs(3, 4), torch.rand(3, 4))),
    ("BCELoss", {"weight": torch.rand(4)}, lambda: (_probs(3, 4), torch.rand(3, 4))),
    ("BCEWithLogitsLoss", {}, lambda: (torch.randn(3, 4), torch.rand(3, 4))),
    (
        "BCEWithLogitsLoss",
        {"weight": torch.rand(3, 1), "pos_weight": torch.rand(4) + 0.5},
        lambda: (torch.randn(3, 4), torch.rand(3, 4)),
    ),
    ("KLDivLoss", {}, lambda: (torch.randn(3, 4).log_softmax(1), torch.randn(3, 4).softmax(1))),
    ("KLDivLoss", {"log_target": True}, lambda: (torch.randn(3, 4).log_softmax(1), torch.randn(3, 4).log_softmax(1))),
    ("CosineEmbeddingLoss", {"margin": 0.2}, lambda: (torch.randn(5, 4), torch.randn(5, 4), _sign(5))),
    ("MarginRankingLoss", {"margin": 0.1}, lambda: (torch.randn(6), torch.randn(6), _sign(6))),
    ("TripletMarginLoss", {}, lambda: (torch.randn(5, 4), torch.randn(5, 4), torch.randn(5, 4))),
    (
        "TripletMarginLoss",
        {"margin": 0.5, "p": 1.0, "swap": True},
        lambda: (torch.randn(5, 4), torch.randn(5, 4), torch.randn(5, 4)),
    ),
    ("PoissonNLLLoss", {}, lambda: (torch.randn(3, 4), torch.poisson(torch.rand(3, 4) * 3))),
    (
        "PoissonNLLLoss",
        {"log_input": False, "full": True},
        lambda: (_probs(3, 4) * 3, torch.poisson(torch.rand(3, 4) * 3)),
    ),
    ("GaussianNLLLoss", {}, lambda: (torch.randn(4, 3), torch.randn(4, 3), torch.rand(4, 3) + 0.1)),
    ("GaussianNLLLoss", {"full": True}, lambda: (torch.randn(4, 3), torch.randn(4, 3), torch.rand(4, 1) + 0.1)),
    ("HingeEmbeddingLoss", {"margin": 0.5}, lambda: (torch.randn(3, 4), _sign(3, 4))),
    ("SoftMarginLoss", {}, lambda: (torch.randn(3, 4), _sign(3, 4))),
    ("MultiLabelSoftMarginLoss", {}, lambda: (torch.randn(3, 4), torch.randint(0, 2, (3, 4)).float())),
    ("MultiMarginLoss", {"p": 2, "margin": 0.5}, lambda: (torch.randn(5, 4), torch.randint(0, 4, (5,)))),
    ("CTCLoss", {}, _ctc_inputs),
    ("CTCLoss", {"blank": 0, "zero_infinity": True}, _ctc_inputs),
]


def _kiln_kwargs(kwargs):
    return {k: kiln.tensor(to_np(v)) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize(("name", "kwargs", "make"), LOSS_CASES, ids=lambda v: v if isinstance(v, str) else "")
def test_loss_matches_torch(name, kwargs, make, reduction):
    k = getattr(nn, name)(reduction=reduction, **_kiln_kwargs(kwargs))
    t = getattr(torch.nn, name)(reduction=reduction, **kwargs)
    inputs = make()
    # targets never need gradients in these tests (torch rejects some), only the predictions do
    n_pred = {"CosineEmbeddingLoss": 2, "MarginRankingLoss": 2, "TripletMarginLoss": 3, "GaussianNLLLoss": 1}.get(
        name, 1
    )
    kin = [
        kiln.tensor(to_np(x), requires_grad=i < n_pred or (name == "GaussianNLLLoss" and i == 2))
        for i, x in enumerate(inputs)
    ]
    tin = [x.clone().requires_grad_(i < n_pred or (name == "GaussianNLLLoss" and i == 2)) for i, x in enumerate(inputs)]
    lk, lt = k(*kin), t(*tin)
    assert tuple(lk.shape) == tuple(lt.shape)
    np.testing.assert_allclose(to_np(lk), to_np(lt), rtol=1e-4, atol=1e-5)
    g = torch.rand_like(lt) + 0.5
    (lk * kiln.tensor(to_np(g))).sum().backward()
    (lt * g).sum().backward()
    for a, b in zip(kin, tin):
        if b.requires_grad:
            np.testing.assert_allclose(to_np(a.grad), to_np(b.grad), rtol=1e-4, atol=1e-5)
    assert repr(k) == repr(t)
    assert list(k.state_dict()) == list(t.state_dict())
    assert [n for n, _ in k.named_buffers()] == [n for n, _ in t.named_buffers()]


def test_kl_div_batchmean_and_legacy_flags():
    x, y = torch.randn(4, 3).log_softmax(1), torch.randn(4, 3).softmax(1)
    check_twin(nn.KLDivLoss(reduction="batchmean"), torch.nn.KLDivLoss(reduction="batchmean"), x, y, load=False)
    with pytest.warns(UserWarning, match="reduction='sum'"):
        m = nn.MSELoss(size_average=False)
    assert m.reduction == "sum"
    with pytest.warns(UserWarning):
        assert nn.L1Loss(reduce=False).reduction == "none"


def test_weight_buffers_follow_state_dict():
    w = kiln.tensor([1.0, 2.0, 3.0])
    m = nn.CrossEntropyLoss(weight=w)
    assert list(m.state_dict()) == ["weight"] and m.weight is w
    b = nn.BCEWithLogitsLoss(pos_weight=kiln.tensor([2.0]))
    assert list(b.state_dict()) == ["pos_weight"]
    assert list(nn.NLLLoss().state_dict()) == []


def test_loss_wrong_shape_errors_match_torch():
    same_error(
        lambda: nn.CrossEntropyLoss()(kiln.randn(2, 3), kiln.tensor([0, 1, 2])),
        lambda: torch.nn.CrossEntropyLoss()(torch.randn(2, 3), torch.tensor([0, 1, 2])),
        ValueError,
    )
    same_error(
        lambda: nn.NLLLoss()(kiln.randn(2, 3), kiln.tensor([0, 5])),
        lambda: torch.nn.NLLLoss()(torch.randn(2, 3), torch.tensor([0, 5])),
        IndexError,
    )
    same_error(
        lambda: nn.BCELoss()(kiln.rand(2, 3), kiln.rand(3, 2)),
        lambda: torch.nn.BCELoss()(torch.rand(2, 3), torch.rand(3, 2)),
        ValueError,
    )
    same_error(lambda: nn.TripletMarginLoss(margin=0), lambda: torch.nn.TripletMarginLoss(margin=0), ValueError)
    same_error(lambda: nn.MultiMarginLoss(p=3), lambda: torch.nn.MultiMarginLoss(p=3), ValueError)
    same_error(lambda: nn.HuberLoss(delta="1"), lambda: torch.nn.HuberLoss(delta="1"), TypeError)

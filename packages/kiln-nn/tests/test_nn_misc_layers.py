"""Padding, distance, fold/unfold, channel-shuffle and local-response-norm layers against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from layer_twins import check_twin, same_error, seeded, to_np  # noqa: F401

import kiln
import kiln.nn as nn

PAD_CASES = [
    ("ConstantPad1d", (2, 1.5), (2, 3, 4)),
    ("ConstantPad2d", ((1, 0, 2, -1), -2.0), (2, 3, 4, 4)),
    ("ConstantPad3d", (1, 0.5), (1, 2, 2, 3, 2)),
    ("ZeroPad1d", ((1, 2),), (3, 4)),
    ("ZeroPad2d", (1,), (2, 3, 4, 4)),
    ("ZeroPad3d", ((1, 0, 0, 1, 2, 0),), (1, 2, 2, 3, 2)),
    ("ReflectionPad1d", (2,), (2, 3, 5)),
    ("ReflectionPad2d", ((1, 2, 0, 1),), (2, 3, 4, 4)),
    ("ReflectionPad3d", (1,), (1, 2, 3, 3, 3)),
    ("ReplicationPad1d", ((3, 1),), (2, 3, 4)),
    ("ReplicationPad2d", (2,), (3, 4, 4)),
    ("ReplicationPad3d", (1,), (1, 2, 2, 3, 2)),
    ("CircularPad1d", (2,), (2, 3, 4)),
    ("CircularPad2d", ((1, 2, 2, 1),), (2, 3, 4, 4)),
    ("CircularPad3d", (1,), (1, 2, 2, 3, 2)),
]


@pytest.mark.parametrize(("name", "args", "shape"), PAD_CASES)
def test_padding_layers_match_torch(name, args, shape):
    check_twin(getattr(nn, name)(*args), getattr(torch.nn, name)(*args), torch.randn(*shape))


def test_padding_errors_match_torch():
    same_error(
        lambda: nn.CircularPad2d(1)(kiln.randn(4, 4)), lambda: torch.nn.CircularPad2d(1)(torch.randn(4, 4)), ValueError
    )
    same_error(
        lambda: nn.ReflectionPad1d(5)(kiln.randn(2, 3, 4)),
        lambda: torch.nn.ReflectionPad1d(5)(torch.randn(2, 3, 4)),
        RuntimeError,
    )


@pytest.mark.parametrize(
    ("name", "args", "shapes"),
    [
        ("PairwiseDistance", (), [(4, 5), (4, 5)]),
        ("PairwiseDistance", (1.0, 1e-3, True), [(4, 5), (1, 5)]),
        ("CosineSimilarity", (), [(4, 5, 2), (4, 5, 2)]),
        ("CosineSimilarity", (-1, 1e-6), [(4, 5), (4, 5)]),
        ("Unfold", ((2, 3),), [(2, 3, 5, 6)]),
        ("Unfold", (3, 2, 1, 2), [(2, 2, 7, 7)]),
        ("Fold", ((4, 5), (2, 2)), [(2, 12, 12)]),
        ("Fold", ((5, 5), 3, 1, 1, 2), [(1, 18, 9)]),
        ("ChannelShuffle", (2,), [(2, 6, 3, 3)]),
        ("ChannelShuffle", (3,), [(2, 6, 4)]),
        ("LocalResponseNorm", (3,), [(2, 5, 4, 4)]),
        ("LocalResponseNorm", (2, 1e-2, 0.5, 2.0), [(2, 4, 6)]),
    ],
)
def test_misc_layers_match_torch(name, args, shapes):
    check_twin(getattr(nn, name)(*args), getattr(torch.nn, name)(*args), *[torch.randn(*s) for s in shapes])


def test_channel_shuffle_errors_match_torch():
    same_error(
        lambda: nn.ChannelShuffle(2)(kiln.randn(1, 3, 2, 2)),
        lambda: torch.nn.ChannelShuffle(2)(torch.randn(1, 3, 2, 2)),
        RuntimeError,
    )
    same_error(
        lambda: nn.ChannelShuffle(2)(kiln.randn(3)), lambda: torch.nn.ChannelShuffle(2)(torch.randn(3)), RuntimeError
    )


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("swap", [False, True])
def test_triplet_margin_with_distance_loss(reduction, swap):
    a, p, n = torch.randn(5, 4), torch.randn(5, 4), torch.randn(5, 4)
    k = nn.TripletMarginWithDistanceLoss(margin=0.7, swap=swap, reduction=reduction)
    t = torch.nn.TripletMarginWithDistanceLoss(margin=0.7, swap=swap, reduction=reduction)
    check_twin(k, t, a, p, n)
    kc = nn.TripletMarginWithDistanceLoss(distance_function=lambda x, y: 1 - nn.functional.cosine_similarity(x, y))
    tc = torch.nn.TripletMarginWithDistanceLoss(
        distance_function=lambda x, y: 1 - torch.nn.functional.cosine_similarity(x, y)
    )
    check_twin(kc, tc, a, p, n, structure=False)
    same_error(
        lambda: nn.TripletMarginWithDistanceLoss(margin=-1),
        lambda: torch.nn.TripletMarginWithDistanceLoss(margin=-1),
        ValueError,
    )
    same_error(
        lambda: k(kiln.randn(5, 4), kiln.randn(5, 4), kiln.randn(4)), lambda: t(a, p, torch.randn(4)), RuntimeError
    )
    np.testing.assert_allclose(
        to_np(k.distance_function(kiln.tensor(to_np(a)), kiln.tensor(to_np(p)))),
        to_np(t.distance_function(a, p)),
        rtol=1e-5,
    )


@pytest.mark.parametrize(
    ("name", "args", "shape"),
    [
        ("LPPool1d", (2, 3), (2, 3, 8)),
        ("LPPool1d", (1.5, 2, 1), (2, 3, 7)),
        ("LPPool2d", (2, 2), (2, 3, 6, 6)),
        ("LPPool2d", (3, (2, 3), (1, 2), True), (1, 2, 5, 7)),
        ("LPPool2d", (float("inf"), 2), (1, 2, 4, 4)),
    ],
)
def test_lp_pool_matches_torch(name, args, shape):
    x = torch.rand(*shape) + 0.1  # positive: fractional powers of negatives are nan in both
    check_twin(getattr(nn, name)(*args), getattr(torch.nn, name)(*args), x)


@pytest.mark.parametrize(
    ("pool", "unpool", "args", "shape", "out"),
    [
        ("MaxPool1d", "MaxUnpool1d", (2,), (2, 3, 8), None),
        ("MaxPool2d", "MaxUnpool2d", (2,), (2, 3, 6, 6), None),
        ("MaxPool2d", "MaxUnpool2d", (3, 2, 1), (1, 2, 7, 7), [7, 7]),
        ("MaxPool2d", "MaxUnpool2d", (2,), (3, 4, 5), [1, 3, 5, 5]),
    ],
)
def test_max_unpool_matches_torch(pool, unpool, args, shape, out):
    tp = getattr(torch.nn, pool)(*args, return_indices=True)
    y, idx = tp(torch.randn(*shape))
    k, t = getattr(nn, unpool)(*args), getattr(torch.nn, unpool)(*args)
    check_twin(k, t, y, idx, kwargs={"output_size": out} if out else None)
    if out is None:
        same_error(
            lambda: k(kiln.tensor(to_np(y)), kiln.tensor(to_np(idx)), output_size=[50] * (y.dim() - 2)),
            lambda: t(y, idx, output_size=[50] * (y.dim() - 2)),
            ValueError,
        )


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_matches_torch(reduction):
    x = torch.randn(4, 5)
    y = torch.tensor([[3, 0, -1, 1, 1], [1, 2, 3, 4, 0], [-1, 2, 2, 2, 2], [4, -1, 0, 0, 0]])
    k, t = nn.MultiLabelMarginLoss(reduction=reduction), torch.nn.MultiLabelMarginLoss(reduction=reduction)
    check_twin(k, t, x, y)
    check_twin(k, t, torch.randn(5), torch.tensor([2, 1, -1, 0, 0]))
    with pytest.warns(FutureWarning, match="`NLLLoss2d` has been deprecated"):
        k2 = nn.NLLLoss2d()
    with pytest.warns(FutureWarning, match="`NLLLoss2d` has been deprecated"):
        t2 = torch.nn.NLLLoss2d()
    assert repr(k2) == repr(t2)

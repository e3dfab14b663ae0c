"""Normalisation, dropout and embedding layers against torch: structure, outputs, gradients, running stats."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from layer_twins import assert_same_structure, check_twin, load_from_torch, same_error, seeded, to_np  # noqa: F401

import kiln
import kiln.nn as nn

NORM_CASES = [
    ("BatchNorm1d", (4,), {}, (6, 4)),
    ("BatchNorm1d", (4,), {"affine": False, "momentum": None}, (3, 4, 5)),
    ("BatchNorm2d", (3,), {"eps": 1e-3, "bias": False}, (2, 3, 4, 5)),
    ("BatchNorm2d", (3,), {"track_running_stats": False}, (2, 3, 4, 5)),
    ("BatchNorm3d", (2,), {}, (2, 2, 3, 3, 3)),
    ("InstanceNorm1d", (3,), {"affine": True}, (2, 3, 6)),
    ("InstanceNorm2d", (3,), {}, (2, 3, 4, 5)),
    ("InstanceNorm2d", (3,), {"affine": True, "track_running_stats": True}, (3, 4, 5)),
    ("LayerNorm", (5,), {}, (2, 3, 5)),
    ("LayerNorm", ([3, 5],), {"elementwise_affine": False}, (2, 3, 5)),
    ("LayerNorm", (5,), {"bias": False, "eps": 1e-3}, (4, 5)),
    ("GroupNorm", (2, 4), {}, (2, 4, 3, 3)),
    ("GroupNorm", (1, 3), {"affine": False}, (2, 3, 5)),
    ("RMSNorm", (5,), {}, (2, 3, 5)),
    ("RMSNorm", ([3, 5],), {"eps": 1e-4, "elementwise_affine": False}, (2, 3, 5)),
]


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize(("name", "args", "kwargs", "shape"), NORM_CASES)
def test_norm_matches_torch(name, args, kwargs, shape, train):
    k, t = getattr(nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs)
    with torch.no_grad():  # non-trivial affine parameters and running statistics
        for n, v in list(t.named_parameters()) + list(t.named_buffers()):
            if v.is_floating_point():
                v.copy_(torch.rand_like(v) + 0.5 if "var" in n or "weight" in n else torch.randn_like(v))
    k.train(train)
    t.train(train)
    check_twin(k, t, torch.randn(*shape))
    for (n, a), (_, b) in zip(k.named_buffers(), t.named_buffers()):
        np.testing.assert_allclose(to_np(a), to_np(b), rtol=1e-5, atol=1e-6, err_msg=n)


@pytest.mark.parametrize("momentum", [0.1, 0.3, None])
@pytest.mark.parametrize("cls", ["BatchNorm1d", "BatchNorm2d"])
def test_batchnorm_running_stats_over_train_steps(cls, momentum):
    k, t = getattr(nn, cls)(3, momentum=momentum), getattr(torch.nn, cls)(3, momentum=momentum)
    shape = (5, 3) if cls == "BatchNorm1d" else (4, 3, 2, 3)
    for step in range(4):
        x = torch.randn(*shape) * (step + 1) + step
        yk, yt = k(kiln.tensor(to_np(x))), t(x)
        np.testing.assert_allclose(to_np(yk), to_np(yt), rtol=1e-4, atol=1e-5)
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(to_np(getattr(k, name)), to_np(getattr(t, name)), rtol=1e-5, atol=1e-6)
    assert k.num_batches_tracked.item() == t.num_batches_tracked.item() == 4
    assert k.num_batches_tracked.dtype == kiln.int64
    k.eval()
    t.eval()
    x = torch.randn(*shape)
    np.testing.assert_allclose(to_np(k(kiln.tensor(to_np(x)))), to_np(t(x)), rtol=1e-4, atol=1e-5)
    k.reset_running_stats()
    assert k.running_mean.tolist() == [0.0] * 3 and k.running_var.tolist() == [1.0] * 3
    assert k.num_batches_tracked.item() == 0


def test_batchnorm_state_dict_and_untracked():
    k = nn.BatchNorm2d(3)
    assert list(k.state_dict()) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    sd = dict(k.state_dict())  # a plain dict has no version metadata: an old (v1) checkpoint
    del sd["num_batches_tracked"]
    k.load_state_dict(sd)  # loads, as in torch, keeping the counter
    assert k.num_batches_tracked.item() == 0
    u = nn.BatchNorm1d(3, track_running_stats=False, affine=False)
    assert u.running_mean is None and list(u.state_dict()) == []
    u.eval()  # no running stats: eval still normalises with batch statistics
    y = u(kiln.randn(8, 3) * 3 + 2)
    assert abs(y.mean().item()) < 1e-5


@pytest.mark.parametrize(
    ("name", "args", "shape", "exc"),
    [
        ("BatchNorm1d", (3,), (2, 3, 4, 5), ValueError),
        ("BatchNorm2d", (3,), (2, 3), ValueError),
        ("BatchNorm3d", (3,), (2, 3, 4, 5), ValueError),
        ("InstanceNorm2d", (3,), (3,), ValueError),
        ("LayerNorm", (3,), (2, 4), RuntimeError),
        ("GroupNorm", (2, 4), (2, 6), RuntimeError),
    ],
)
def test_norm_wrong_shape_errors_match_torch(name, args, shape, exc):
    k, t = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    same_error(lambda: k(kiln.randn(*shape)), lambda: t(torch.randn(*shape)), exc)


def test_norm_constructor_errors_and_instance_norm_channel_check():
    same_error(lambda: nn.GroupNorm(3, 4), lambda: torch.nn.GroupNorm(3, 4), ValueError)
    k, t = nn.InstanceNorm2d(4, affine=True), torch.nn.InstanceNorm2d(4, affine=True)
    same_error(lambda: k(kiln.randn(2, 3, 4, 4)), lambda: t(torch.randn(2, 3, 4, 4)), ValueError)
    with pytest.warns(UserWarning, match="does not match num_features"):
        nn.InstanceNorm2d(4)(kiln.randn(2, 3, 4, 4))


def test_norm_init():
    for m in (nn.BatchNorm2d(5), nn.LayerNorm(5), nn.GroupNorm(1, 5), nn.InstanceNorm1d(5, affine=True)):
        assert m.weight.tolist() == [1.0] * 5 and m.bias.tolist() == [0.0] * 5
    assert nn.RMSNorm(5).weight.tolist() == [1.0] * 5
    bn = nn.BatchNorm1d(5)
    assert bn.running_mean.tolist() == [0.0] * 5 and bn.running_var.tolist() == [1.0] * 5


@pytest.mark.parametrize(
    "name", ["Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout"]
)
def test_dropout_eval_identity_repr_and_p_check(name):
    shape = {"Dropout1d": (2, 3, 4), "Dropout3d": (2, 3, 2, 2, 2)}.get(name, (2, 3, 4, 4))
    k, t = getattr(nn, name)(0.3), getattr(torch.nn, name)(0.3)
    k.eval()
    t.eval()
    check_twin(k, t, torch.randn(*shape))
    same_error(lambda: getattr(nn, name)(1.5), lambda: getattr(torch.nn, name)(1.5), ValueError)
    assert repr(getattr(nn, name)(0.2, inplace=True)) == repr(getattr(torch.nn, name)(0.2, inplace=True))


def test_dropout_train_statistics():
    x = kiln.ones(200, 100)
    y = nn.Dropout(0.25)(x)
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.75) < 0.02
    assert np.allclose(to_np(y)[to_np(y) != 0], 1 / 0.75)
    y2 = nn.Dropout2d(0.5)(kiln.ones(50, 40, 3, 3))
    per_channel = to_np(y2).reshape(50, 40, 9)
    assert np.all((per_channel == 0).all(-1) | (per_channel == 2.0).all(-1))  # whole channels dropped
    assert abs((per_channel[..., 0] == 0).mean() - 0.5) < 0.05


EMB_CASES = [
    ((10, 4), {}),
    ((10, 4), {"padding_idx": 2}),
    ((10, 4), {"padding_idx": -1, "scale_grad_by_freq": True}),
    ((10, 4), {"max_norm": 1.0, "norm_type": 1.5}),
]


@pytest.mark.parametrize(("args", "kwargs"), EMB_CASES)
def test_embedding_matches_torch(args, kwargs):
    k, nn_t = nn.Embedding(*args, **kwargs), torch.nn.Embedding(*args, **kwargs)
    idx = torch.tensor([[1, 2, 3, 2], [9, 0, 2, 2]])
    check_twin(k, nn_t, idx)
    if "max_norm" in kwargs:  # rows looked up are renormalised in place in both
        np.testing.assert_allclose(to_np(k.weight), to_np(nn_t.weight), rtol=1e-5, atol=1e-6)


def test_embedding_init_padding_and_from_pretrained():
    m = nn.Embedding(2000, 50, padding_idx=3)
    w = to_np(m.weight)
    assert abs(w.mean()) < 0.01 and abs(w.std() - 1) < 0.01  # N(0, 1)
    assert not w[3].any()
    same_error(
        lambda: nn.Embedding(5, 2, padding_idx=5), lambda: torch.nn.Embedding(5, 2, padding_idx=5), AssertionError
    )
    same_error(
        lambda: nn.Embedding(5, 3)(kiln.tensor([7])), lambda: torch.nn.Embedding(5, 3)(torch.tensor([7])), IndexError
    )
    pre = torch.randn(4, 3)
    k = nn.Embedding.from_pretrained(kiln.tensor(to_np(pre)), padding_idx=1)
    t = torch.nn.Embedding.from_pretrained(pre, padding_idx=1)
    assert repr(k) == repr(t) and not k.weight.requires_grad
    assert nn.Embedding.from_pretrained(kiln.randn(4, 3), freeze=False).weight.requires_grad
    same_error(
        lambda: nn.Embedding.from_pretrained(kiln.randn(4)),
        lambda: torch.nn.Embedding.from_pretrained(torch.randn(4)),
        AssertionError,
    )
    np.testing.assert_allclose(to_np(k(kiln.tensor([0, 3]))), to_np(t(torch.tensor([0, 3]))))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_matches_torch(mode):
    k, t = nn.EmbeddingBag(10, 3, mode=mode), torch.nn.EmbeddingBag(10, 3, mode=mode)
    check_twin(k, t, torch.tensor([[1, 2, 4], [4, 3, 9]]))
    k.weight.grad = None
    t.weight.grad = None
    check_twin(k, t, torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 3, 3]), structure=False)
    if mode == "sum":
        kb, tb = (
            nn.EmbeddingBag(10, 3, mode="sum", padding_idx=0),
            torch.nn.EmbeddingBag(10, 3, mode="sum", padding_idx=0),
        )
        check_twin(kb, tb, torch.tensor([[1, 0, 4], [0, 3, 9]]), kwargs={"per_sample_weights": torch.rand(2, 3)})
    b = torch.nn.EmbeddingBag.from_pretrained(torch.randn(3, 2), mode=mode)
    assert repr(nn.EmbeddingBag.from_pretrained(kiln.randn(3, 2), mode=mode)) == repr(b)

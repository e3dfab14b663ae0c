"""Convolution, pooling and resampling layers against torch: structure, repr, outputs, gradients, init, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from layer_twins import check_twin, same_error, seeded, to_np  # noqa: F401

import kiln
import kiln.nn as nn

CONV_CASES = [
    ("Conv1d", (3, 4, 3), {}, (2, 3, 9)),
    ("Conv1d", (4, 6, 4), {"padding": "same", "dilation": 2, "groups": 2, "padding_mode": "circular"}, (2, 4, 9)),
    ("Conv1d", (3, 2, 3), {"padding": "valid", "bias": False}, (3, 7)),
    ("Conv2d", (3, 4, 3), {"padding": 1}, (2, 3, 6, 6)),
    ("Conv2d", (4, 6, (3, 2)), {"stride": 2, "padding": (1, 2), "groups": 2, "bias": False}, (2, 4, 7, 6)),
    ("Conv2d", (3, 4, 3), {"padding": 2, "padding_mode": "reflect"}, (1, 3, 6, 5)),
    ("Conv2d", (3, 4, 3), {"padding": (1, 2), "padding_mode": "replicate", "dilation": (1, 2)}, (2, 3, 5, 6)),
    ("Conv2d", (3, 4, 2), {"padding": "same"}, (2, 3, 5, 5)),
    ("Conv2d", (3, 4, 3), {"padding": 1, "padding_mode": "circular", "stride": (2, 1)}, (3, 6, 6)),
    ("Conv3d", (2, 3, 2), {"padding": 1, "stride": 2}, (1, 2, 4, 5, 4)),
    ("ConvTranspose1d", (3, 4, 3), {"stride": 2, "padding": 1, "output_padding": 1}, (2, 3, 5)),
    ("ConvTranspose2d", (4, 6, 3), {"stride": 2, "groups": 2, "dilation": 2}, (2, 4, 4, 3)),
    ("ConvTranspose2d", (3, 2, (2, 3)), {"bias": False, "padding": (0, 1)}, (3, 4, 4)),
    ("ConvTranspose3d", (2, 3, 2), {"stride": 2}, (1, 2, 2, 3, 2)),
]


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize(("name", "args", "kwargs", "shape"), CONV_CASES)
def test_conv_matches_torch(name, args, kwargs, shape):
    k, t = getattr(nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs)
    assert k._reversed_padding_repeated_twice == list(t._reversed_padding_repeated_twice)
    check_twin(k, t, torch.randn(*shape))


def test_conv_transpose_output_size():
    k, t = nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1), torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1)
    x = torch.randn(1, 3, 4, 4)
    check_twin(k, t, x, kwargs={"output_size": [8, 8]})
    assert same_error(
        lambda: k(kiln.randn(1, 3, 4, 4), output_size=[12, 12]), lambda: t(x, output_size=[12, 12]), ValueError
    ).startswith("requested an output size of [12, 12], but valid sizes range from [7, 7] to [8, 8]")


@pytest.mark.parametrize(
    ("args", "kwargs", "exc"),
    [
        ((4, 6, 3), {"groups": 4}, ValueError),
        ((3, 6, 3), {"groups": 2}, ValueError),
        ((3, 6, 3), {"groups": 0}, ValueError),
        ((3, 6, 3), {"padding": "full"}, ValueError),
        ((3, 6, 3), {"padding": "same", "stride": 2}, ValueError),
        ((3, 6, 3), {"padding_mode": "mirror"}, ValueError),
    ],
)
def test_conv_constructor_errors_match_torch(args, kwargs, exc):
    with pytest.raises(exc) as ek:
        nn.Conv2d(*args, **kwargs)
    with pytest.raises(exc) as et:
        torch.nn.Conv2d(*args, **kwargs)
    # messages that print a set of options: the set's order depends on string hashing, compare it as a set
    (kpre, _, krest), (tpre, _, trest) = str(ek.value).partition("{"), str(et.value).partition("{")
    assert kpre == tpre
    if krest:
        kset, _, ktail = krest.partition("}")
        tset, _, ttail = trest.partition("}")
        assert set(kset.split(", ")) == set(tset.split(", ")) and ktail == ttail
    if "padding_mode" in kwargs:
        same_error(
            lambda: nn.ConvTranspose2d(3, 6, 3, padding_mode="reflect"),
            lambda: torch.nn.ConvTranspose2d(3, 6, 3, padding_mode="reflect"),
            ValueError,
        )


def test_conv_wrong_input_shape_errors_match_torch():
    k, t = nn.Conv2d(3, 4, 3), torch.nn.Conv2d(3, 4, 3)
    msg = same_error(lambda: k(kiln.randn(2, 3)), lambda: t(torch.randn(2, 3)), RuntimeError)
    assert "conv2d" in msg and "4D (batched)" in msg
    msg = same_error(lambda: k(kiln.randn(1, 5, 8, 8)), lambda: t(torch.randn(1, 5, 8, 8)), RuntimeError)
    assert "to have 3 channels, but got 5 channels" in msg
    same_error(
        lambda: nn.ConvTranspose1d(3, 4, 3)(kiln.randn(3)),
        lambda: torch.nn.ConvTranspose1d(3, 4, 3)(torch.randn(3)),
        RuntimeError,
    )


def test_conv_init_bounds_and_std():
    m = nn.Conv2d(16, 32, 3)
    fan_in = 16 * 9
    bound = 1 / math.sqrt(fan_in)
    assert m.weight.abs().max().item() <= bound
    assert abs(m.weight.std().item() - bound / math.sqrt(3)) < 0.05 * bound
    assert m.bias.abs().max().item() <= bound
    mt = nn.ConvTranspose2d(8, 4, 3)  # weight (in, out, k, k): fan_in = out * k * k
    bt = 1 / math.sqrt(4 * 9)
    assert mt.weight.abs().max().item() <= bt and mt.bias.abs().max().item() <= bt
    assert abs(mt.weight.std().item() - bt / math.sqrt(3)) < 0.1 * bt


POOL_CASES = [
    ("MaxPool1d", (3,), {"stride": 2, "padding": 1}, (2, 3, 9)),
    ("MaxPool1d", (2,), {"dilation": 2, "ceil_mode": True}, (3, 8)),
    ("MaxPool2d", (2,), {}, (2, 3, 6, 6)),
    ("MaxPool2d", ((3, 2),), {"stride": (2, 1), "padding": 1, "ceil_mode": True}, (2, 2, 7, 5)),
    ("MaxPool3d", (2,), {}, (1, 2, 4, 4, 4)),
    ("AvgPool1d", (3,), {"stride": 2, "padding": 1, "count_include_pad": False}, (2, 3, 8)),
    ("AvgPool2d", (2,), {}, (2, 3, 6, 6)),
    ("AvgPool2d", (3,), {"stride": 2, "padding": 1, "ceil_mode": True, "divisor_override": 5}, (1, 2, 7, 7)),
    ("AdaptiveAvgPool1d", (4,), {}, (2, 3, 10)),
    ("AdaptiveAvgPool2d", ((3, None),), {}, (2, 3, 7, 5)),
    ("AdaptiveAvgPool2d", (1,), {}, (3, 5, 5)),
    ("AdaptiveMaxPool1d", (3,), {}, (2, 3, 7)),
    ("AdaptiveMaxPool2d", ((2, 3),), {}, (2, 3, 7, 8)),
    ("PixelShuffle", (2,), {}, (2, 8, 3, 3)),
    ("PixelUnshuffle", (2,), {}, (2, 2, 4, 6)),
    ("Upsample", (), {"scale_factor": 2}, (1, 2, 3, 3)),
    ("Upsample", (), {"size": (5, 7), "mode": "bilinear", "align_corners": True}, (1, 2, 3, 4)),
    ("Upsample", (), {"scale_factor": 1.5, "mode": "bicubic"}, (1, 2, 4, 4)),
    ("Upsample", (), {"size": 9, "mode": "linear"}, (2, 3, 4)),
    ("UpsamplingNearest2d", (), {"scale_factor": 2}, (1, 1, 2, 3)),
    ("UpsamplingBilinear2d", (), {"size": (4, 4)}, (1, 1, 2, 3)),
]


@pytest.mark.parametrize(("name", "args", "kwargs", "shape"), POOL_CASES)
def test_pool_and_resample_match_torch(name, args, kwargs, shape):
    check_twin(getattr(nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs), torch.randn(*shape))


@pytest.mark.parametrize("name", ["MaxPool2d", "AdaptiveMaxPool2d"])
def test_max_pool_return_indices(name):
    k, t = getattr(nn, name)(2, return_indices=True), getattr(torch.nn, name)(2, return_indices=True)
    (_, ki), (_, ti) = check_twin(k, t, torch.randn(2, 3, 6, 6))
    assert ki.tolist() == ti.tolist()


@pytest.mark.parametrize(
    ("name", "args", "shape", "exc"),
    [
        ("MaxPool2d", (2,), (2,), RuntimeError),
        ("AvgPool2d", (2,), (2,), IndexError),
        ("AdaptiveAvgPool2d", (2,), (2,), RuntimeError),
        ("AdaptiveMaxPool2d", (2,), (4, 4), RuntimeError),
        ("AvgPool1d", (2,), (2, 2, 2, 2), RuntimeError),
        ("PixelShuffle", (2,), (1, 3, 2, 2), RuntimeError),
    ],
)
def test_pool_wrong_shape_errors_match_torch(name, args, shape, exc):
    k, t = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    same_error(lambda: k(kiln.randn(*shape)), lambda: t(torch.randn(*shape)), exc)


@pytest.mark.parametrize(
    ("name", "kwargs", "shape"),
    [
        ("LazyConv1d", {}, (2, 3, 7)),
        ("LazyConv2d", {"groups": 3, "bias": False, "padding": 1}, (2, 3, 5, 5)),
        ("LazyConv3d", {"stride": 2}, (3, 4, 4, 4)),
        ("LazyConvTranspose1d", {"stride": 2}, (2, 3, 5)),
        ("LazyConvTranspose2d", {"output_padding": 1, "stride": 2}, (2, 3, 4, 4)),
        ("LazyConvTranspose3d", {}, (1, 2, 3, 3, 3)),
    ],
)
def test_lazy_conv_infers_in_channels(name, kwargs, shape):
    k, t = getattr(nn, name)(6, 3, **kwargs), getattr(torch.nn, name)(6, 3, **kwargs)
    assert repr(k) == repr(t)
    params = list(k.parameters())
    x = torch.randn(*shape)
    k(kiln.randn(*shape))
    t(x)
    assert type(k).__name__ == type(t).__name__ and repr(k) == repr(t)
    assert params[0] is k.weight and type(k.weight) is nn.Parameter  # optimizers built before the call still work
    fan_in = math.prod(k.weight.shape[1:])
    assert k.weight.abs().max().item() <= 1 / math.sqrt(fan_in)
    check_twin(k, t, x)


def test_lazy_conv_loads_state_dict_and_rejects_bad_input():
    src = nn.Conv2d(3, 4, 3)
    lazy = nn.LazyConv2d(4, 3)
    lazy.load_state_dict(src.state_dict())
    x = kiln.randn(1, 3, 5, 5)
    np.testing.assert_allclose(to_np(lazy(x)), to_np(src(x)), rtol=1e-6)
    assert type(lazy) is nn.Conv2d and lazy.in_channels == 3
    same_error(
        lambda: nn.LazyConv2d(4, 3)(kiln.randn(3, 5)),
        lambda: torch.nn.LazyConv2d(4, 3)(torch.randn(3, 5)),
        RuntimeError,
    )
    same_error(
        lambda: nn.LazyConv2d(4, 3, groups=2)(kiln.randn(1, 3, 5, 5)),
        lambda: torch.nn.LazyConv2d(4, 3, groups=2)(torch.randn(1, 3, 5, 5)),
        ValueError,
    )

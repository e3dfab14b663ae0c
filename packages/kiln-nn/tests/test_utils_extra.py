"""nn.init's deprecated aliases and nn.utils' newer helpers against torch: clip_grads_with_norm_, the batch-norm
fusions, skip_init and the conv weight memory-format conversion."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
import torch
from layer_twins import load_from_torch, seeded, to_np  # noqa: F401

import kiln
import kiln.nn as nn
from kiln.nn import init, utils

ALIASES = [
    ("uniform", (), {"a": -2.0, "b": 3.0}),
    ("normal", (), {"std": 0.5}),
    ("constant", (0.3,), {}),
    ("eye", (), {}),
    ("dirac", (), {}),
    ("xavier_uniform", (), {"gain": 2.0}),
    ("xavier_normal", (), {}),
    ("kaiming_uniform", (), {"a": 0.1}),
    ("kaiming_normal", (), {"mode": "fan_out"}),
    ("orthogonal", (), {}),
    ("sparse", (0.5,), {}),
]


@pytest.mark.parametrize(("name", "args", "kwargs"), ALIASES)
def test_init_aliases_warn_and_call_the_underscore_form(name, args, kwargs):
    shape = (3, 4, 3) if name == "dirac" else (4, 5)
    kt = kiln.empty(*shape)
    tt = torch.empty(*shape)
    with warnings.catch_warnings(record=True) as kw:
        warnings.simplefilter("always")
        out = getattr(init, name)(kt, *args, **kwargs)
    with warnings.catch_warnings(record=True) as tw:
        warnings.simplefilter("always")
        getattr(torch.nn.init, name)(tt, *args, **kwargs)
    assert out is kt
    assert [(w.category, str(w.message)) for w in kw] == [(w.category, str(w.message)) for w in tw]
    assert kw[0].filename == __file__
    assert getattr(init, name).__doc__ and name in init.__all__
    # the same fill as the underscore form from the same seed
    kiln.manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = to_np(getattr(init, name)(kiln.empty(*shape), *args, **kwargs)).copy()
    kiln.manual_seed(3)
    b = to_np(getattr(init, name + "_")(kiln.empty(*shape), *args, **kwargs))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grads_with_norm_matches_torch(max_norm):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (5,))]
    kp = [nn.Parameter(kiln.tensor(a)) for a in arrays]
    tp = [torch.nn.Parameter(torch.tensor(a)) for a in arrays]
    for p, q, a in zip(kp, tp, arrays):
        p.grad, q.grad = kiln.tensor(a * 3), torch.tensor(a * 3)
    knorm = utils.get_total_norm([p.grad for p in kp])
    tnorm = torch.nn.utils.get_total_norm([q.grad for q in tp])
    assert utils.clip_grads_with_norm_(kp, max_norm, knorm) is None
    torch.nn.utils.clip_grads_with_norm_(tp, max_norm, tnorm)
    for p, q in zip(kp, tp):
        np.testing.assert_allclose(to_np(p.grad), q.grad.numpy(), rtol=1e-6)
    utils.clip_grads_with_norm_([nn.Parameter(kiln.ones(2))], 1.0, kiln.tensor(5.0))  # no gradients: nothing
    nan_param = nn.Parameter(kiln.ones(2))
    nan_param.grad = kiln.ones(2)
    utils.clip_grads_with_norm_([nan_param], 1.0, kiln.tensor(float("nan")))
    assert np.isnan(to_np(nan_param.grad)).all()  # a NaN norm scales to NaN, as torch's


CONV_BN = [
    ("Conv2d", (3, 4, 3), {"padding": 1}, "BatchNorm2d", (2, 3, 6, 6), False),
    ("Conv1d", (3, 4, 2), {"bias": False}, "BatchNorm1d", (2, 3, 7), False),
    ("Conv3d", (2, 3, 2), {}, "BatchNorm3d", (1, 2, 4, 4, 4), False),
    ("ConvTranspose2d", (3, 4, 3), {"stride": 2}, "BatchNorm2d", (2, 3, 4, 4), True),
]


@pytest.mark.parametrize(("conv", "args", "kwargs", "bn", "shape", "transpose"), CONV_BN)
@pytest.mark.parametrize("affine", [True, False])
def test_fuse_conv_bn_eval_matches_torch(conv, args, kwargs, bn, shape, transpose, affine):
    tconv = getattr(torch.nn, conv)(*args, **kwargs).eval()
    tbn = getattr(torch.nn, bn)(args[1], affine=affine).eval()
    with torch.no_grad():
        tbn.running_mean.uniform_(-1, 1)
        tbn.running_var.uniform_(0.5, 2)
        if affine:
            tbn.weight.uniform_(0.5, 1.5)
            tbn.bias.uniform_(-1, 1)
    kconv = getattr(nn, conv)(*args, **kwargs).eval()
    kbn = getattr(nn, bn)(args[1], affine=affine).eval()
    load_from_torch(kconv, tconv)
    load_from_torch(kbn, tbn)
    kfused = utils.fuse_conv_bn_eval(kconv, kbn, transpose=transpose)
    tfused = torch.nn.utils.fuse_conv_bn_eval(tconv, tbn, transpose=transpose)
    assert kfused is not kconv and type(kfused) is type(kconv)
    x = torch.randn(*shape)
    np.testing.assert_allclose(to_np(kfused(kiln.tensor(x.numpy()))), tfused(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        to_np(kfused(kiln.tensor(x.numpy()))), to_np(kbn(kconv(kiln.tensor(x.numpy())))), rtol=1e-4, atol=1e-5
    )
    for name in ("weight", "bias"):
        kt, tt = getattr(kfused, name), getattr(tfused, name)
        assert type(kt) is nn.Parameter and kt.requires_grad == tt.requires_grad
        np.testing.assert_allclose(to_np(kt), tt.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_fuse_linear_bn_eval_matches_torch_and_errors():
    for features, bn_features in ((4, 4), (4, 1)):
        tlin, tbn = torch.nn.Linear(3, features).eval(), torch.nn.BatchNorm1d(bn_features).eval()
        with torch.no_grad():
            tbn.running_mean.uniform_(-1, 1)
            tbn.running_var.uniform_(0.5, 2)
            tbn.weight.uniform_(0.5, 1.5)
        klin, kbn = nn.Linear(3, features).eval(), nn.BatchNorm1d(bn_features).eval()
        load_from_torch(klin, tlin)
        load_from_torch(kbn, tbn)
        kf, tf = utils.fuse_linear_bn_eval(klin, kbn), torch.nn.utils.fuse_linear_bn_eval(tlin, tbn)
        x = torch.randn(5, 3)
        np.testing.assert_allclose(to_np(kf(kiln.tensor(x.numpy()))), tf(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    pairs = [
        (lambda m: (m.Linear(3, 4), m.BatchNorm1d(4).eval()), "fuse_linear_bn_eval"),
        (lambda m: (m.Linear(3, 4).eval(), m.BatchNorm1d(3).eval()), "fuse_linear_bn_eval"),
        (lambda m: (m.Linear(3, 4).eval(), m.BatchNorm1d(4, track_running_stats=False).eval()), "fuse_linear_bn_eval"),
        (lambda m: (m.Conv2d(3, 4, 1).eval(), m.BatchNorm2d(4)), "fuse_conv_bn_eval"),
        (lambda m: (m.Conv2d(3, 4, 1).eval(), m.BatchNorm2d(4, track_running_stats=False).eval()), "fuse_conv_bn_eval"),
    ]
    for build, fn in pairs:
        with pytest.raises(AssertionError) as ke:
            getattr(utils, fn)(*build(nn))
        with pytest.raises(AssertionError) as te:
            getattr(torch.nn.utils, fn)(*build(torch.nn))
        assert str(ke.value) == str(te.value)


def test_fuse_weights_functions_match_torch():
    rng = np.random.default_rng(1)
    w, b, rm, rv, g, beta = (
        rng.standard_normal(s).astype(np.float64) for s in ((4, 3, 2, 2), (4,), (4,), (4,), (4,), (4,))
    )
    rv = np.abs(rv) + 0.1
    k = [kiln.tensor(a) for a in (w, b, rm, rv)]
    t = [torch.tensor(a) for a in (w, b, rm, rv)]
    for bias, gamma in ((True, True), (False, False)):
        kw, kb = utils.fuse_conv_bn_weights(
            k[0],
            k[1] if bias else None,
            k[2],
            k[3],
            1e-3,
            kiln.tensor(g) if gamma else None,
            kiln.tensor(beta) if gamma else None,
        )
        tw, tb = torch.nn.utils.fuse_conv_bn_weights(
            t[0],
            t[1] if bias else None,
            t[2],
            t[3],
            1e-3,
            torch.tensor(g) if gamma else None,
            torch.tensor(beta) if gamma else None,
        )
        np.testing.assert_allclose(to_np(kw), tw.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(to_np(kb), tb.detach().numpy(), rtol=1e-12)
        assert kw.dtype == kiln.float64 and kb.requires_grad == tb.requires_grad
    lw = rng.standard_normal((4, 3))
    kw, kb = utils.fuse_linear_bn_weights(kiln.tensor(lw), None, k[2], k[3], 1e-5, kiln.tensor(g), kiln.tensor(beta))
    tw, tb = torch.nn.utils.fuse_linear_bn_weights(
        torch.tensor(lw), None, t[2], t[3], 1e-5, torch.tensor(g), torch.tensor(beta)
    )
    np.testing.assert_allclose(to_np(kw), tw.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(to_np(kb), tb.detach().numpy(), rtol=1e-12)


def test_skip_init_builds_without_initialising():
    kiln.manual_seed(0)
    before = kiln.rand(3)
    kiln.manual_seed(0)
    m = utils.skip_init(nn.Linear, 50, 60)
    after = kiln.rand(3)
    np.testing.assert_array_equal(to_np(before), to_np(after))  # no random numbers were drawn
    assert type(m) is nn.Linear and m.weight.shape == (60, 50) and m.weight.requires_grad
    m2 = utils.skip_init(nn.Conv2d, 3, 4, 3, bias=False, device="cpu")
    assert m2.weight.shape == (4, 3, 3, 3) and m2.bias is None
    nn.init.ones_(m2.weight)  # init works again afterwards
    assert to_np(m2.weight).min() == 1.0

    class NoDevice(nn.Module):
        def __init__(self, n):
            super().__init__()

    with pytest.raises(RuntimeError) as ke:
        utils.skip_init(NoDevice, 3)

    class TNoDevice(torch.nn.Module):
        def __init__(self, n):
            super().__init__()

    with pytest.raises(RuntimeError) as te:
        torch.nn.utils.skip_init(TNoDevice, 3)
    assert str(ke.value) == str(te.value)


def test_convert_conv_weight_memory_format():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.Sequential(nn.ConvTranspose2d(4, 2, 2)), nn.Conv3d(1, 1, 1), nn.Linear(2, 2)
    )
    with kiln.no_grad():
        model[0].weight.data = model[0].weight.detach().permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    assert not model[0].weight.is_contiguous()
    values = to_np(model[0].weight).copy()
    assert utils.convert_conv2d_weight_memory_format(model, kiln.contiguous_format) is model
    assert model[0].weight.is_contiguous() and model[1][0].weight.is_contiguous()
    np.testing.assert_array_equal(to_np(model[0].weight), values)
    assert type(model[0].weight) is nn.Parameter
    utils.convert_conv3d_weight_memory_format(model, kiln.preserve_format)
    assert model[2].weight.is_contiguous()


@pytest.mark.parametrize(
    "name",
    [
        "clip_grads_with_norm_", "fuse_conv_bn_eval", "fuse_conv_bn_weights", "fuse_linear_bn_eval",
        "fuse_linear_bn_weights", "skip_init", "convert_conv2d_weight_memory_format",
        "convert_conv3d_weight_memory_format",
    ],
)  # fmt: skip
def test_signatures_match_torch(name):
    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert params(getattr(utils, name)) == params(getattr(torch.nn.utils, name))
    assert getattr(utils, name).__doc__ and name in utils.__all__

"""The pooling functions and layers kiln-nn composes (3-d average/adaptive pooling, power-average pooling,
unpooling, fractional max pooling) against torch: values, indices, gradients, float64 gradcheck, layouts
(non-contiguous, unbatched, empty batch), layer structure and errors."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from layer_twins import check_twin, pair, same_error, seeded, to_np  # noqa: F401

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.autograd import gradcheck


def k(t: torch.Tensor, grad: bool = False) -> kiln.Tensor:
    return kiln.tensor(to_np(t), requires_grad=grad)


def compare(kfn, tfn, *inputs, rtol=1e-6, atol=1e-9):
    """Run both on float64 twins of ``inputs`` and compare outputs (indices exactly) and input gradients."""
    kin = [k(x, x.is_floating_point()) for x in inputs]
    tin = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    kout, tout = kfn(*kin), tfn(*tin)
    kouts = kout if isinstance(kout, tuple) else (kout,)
    touts = tout if isinstance(tout, tuple) else (tout,)
    assert len(kouts) == len(touts)
    for a, b in zip(kouts, touts):
        assert tuple(a.shape) == tuple(b.shape) and str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1]
        if b.dtype == torch.int64:
            assert to_np(a).tolist() == b.tolist()
        else:
            np.testing.assert_allclose(to_np(a), to_np(b), rtol=rtol, atol=atol)
    b = touts[0]
    if b.requires_grad and b.numel():
        g = torch.randn(b.shape, dtype=b.dtype)
        (kouts[0] * k(g)).sum().backward()
        (b * g).sum().backward()
        for a, t in zip(kin, tin):
            if t.requires_grad:
                np.testing.assert_allclose(to_np(a.grad), to_np(t.grad), rtol=rtol, atol=atol)
    return kouts, touts


def x64(*shape, noncontig: bool = False):
    t = torch.randn(*shape, dtype=torch.float64)
    return t.transpose(-1, -2).contiguous().transpose(-1, -2) if noncontig else t


# ---------------------------------------------------------------------------------------- avg_pool3d

AVG3D = [
    ((2,), {}),
    (((2, 3, 2), (1, 2, 3), (1, 1, 0)), {}),
    ((3,), {"stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False}),
    ((3,), {"stride": 2, "padding": 1, "ceil_mode": True}),
    ((2,), {"stride": 1, "divisor_override": 5}),
    (((3, 2, 3), (2, 3, 1), 1), {"ceil_mode": True, "count_include_pad": False}),
    ((1,), {}),
]


@pytest.mark.parametrize(("args", "kwargs"), AVG3D)
@pytest.mark.parametrize("shape", [(2, 3, 5, 6, 7), (3, 5, 6, 7), (0, 2, 4, 4, 4)])
def test_avg_pool3d_matches_torch(args, kwargs, shape):
    compare(lambda x: F.avg_pool3d(x, *args, **kwargs), lambda x: TF.avg_pool3d(x, *args, **kwargs), x64(*shape))


def test_avg_pool3d_noncontiguous_int64_and_float32():
    x = x64(2, 2, 5, 6, 7, noncontig=True)
    compare(lambda a: F.avg_pool3d(a, 3, 2, 1), lambda a: TF.avg_pool3d(a, 3, 2, 1), x)
    xi = torch.randint(-50, 50, (2, 3, 4, 5, 4))
    for kw in (
        {},
        {"padding": 1, "count_include_pad": False},
        {"divisor_override": 3},
        {"ceil_mode": True, "stride": 3},
    ):
        assert to_np(F.avg_pool3d(k(xi), 2, **kw)).tolist() == TF.avg_pool3d(xi, 2, **kw).tolist()
    xf = torch.randn(2, 3, 6, 6, 6)
    np.testing.assert_allclose(
        to_np(F.avg_pool3d(k(xf), 3, 2, 1)), TF.avg_pool3d(xf, 3, 2, 1).numpy(), rtol=1e-5, atol=1e-6
    )


def test_avg_pool3d_gradcheck():
    x = kiln.randn(1, 2, 4, 5, 3, dtype=kiln.float64, requires_grad=True)
    assert gradcheck(lambda a: F.avg_pool3d(a, 2, 1, 1, True, False), (x,))
    assert gradcheck(lambda a: F.avg_pool3d(a, (2, 3, 2), divisor_override=4), (x,))


AVG3D_ERRORS = [
    ((3, 4), (2,), {}),
    ((2, 3, 4, 4), ((2, 2),), {}),
    ((2, 3, 4, 4, 4), ((2, 2),), {}),
    ((2, 3, 4, 4, 4), (2,), {"stride": (1, 2)}),
    ((2, 3, 4, 4, 4), (2,), {"padding": (1, 2)}),
    ((2, 3, 4, 4, 4), (2,), {"padding": 2}),
    ((2, 3, 4, 4, 4), (2,), {"padding": -1}),
    ((2, 3, 4, 4, 4), (0,), {}),
    ((2, 3, 4, 4, 4), (2,), {"stride": 0}),
    ((2, 3, 4, 4, 4), (2,), {"stride": -1}),
    ((2, 3, 4, 4, 4), (-2,), {"stride": 1}),
    ((2, 3, 4, 5, 6), (5,), {}),
    ((2, 3, 4, 5, 6), (5,), {"padding": 2}),
    ((2, 3, 4, 4, 4), (2,), {"divisor_override": 0}),
    ((2, 0, 4, 4, 4), (2,), {}),
    ((3, 0, 4, 4), (2,), {}),
    ((2, 3, 4, 4, 4), ([],), {}),
    ((2, 3, 4, 4, 4), (2.0,), {}),
    ((2, 3, 4, 4, 4), ((2, 2.0, 2),), {}),
    ((2, 3, 4, 4, 4), ("2",), {}),
]


@pytest.mark.parametrize(("shape", "args", "kwargs"), AVG3D_ERRORS)
def test_avg_pool3d_errors_match_torch(shape, args, kwargs):
    same_error(
        lambda: F.avg_pool3d(kiln.randn(*shape), *args, **kwargs),
        lambda: TF.avg_pool3d(torch.randn(*shape), *args, **kwargs),
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int32", "bool", "uint8"])
def test_avg_pool3d_dtype_errors_match_torch(dtype):
    same_error(
        lambda: F.avg_pool3d(kiln.ones(1, 2, 2, 2, 2, dtype=getattr(kiln, dtype)), 2),
        lambda: TF.avg_pool3d(torch.ones(1, 2, 2, 2, 2, dtype=getattr(torch, dtype)), 2),
        NotImplementedError,
    )


# ---------------------------------------------------------------------------------------- adaptive 3-d

ADAPTIVE = [2, (2, 3, 4), (None, 2, 1), (5, 6, 7), (3, 1, None), 1, [4, 4, 4], (7, 9, 8)]


@pytest.mark.parametrize("out", ADAPTIVE)
@pytest.mark.parametrize("shape", [(2, 3, 5, 6, 7), (3, 5, 6, 7)])
def test_adaptive_pool3d_matches_torch(out, shape):
    x = x64(*shape, noncontig=True)
    compare(lambda a: F.adaptive_avg_pool3d(a, out), lambda a: TF.adaptive_avg_pool3d(a, out), x)
    compare(lambda a: F.adaptive_max_pool3d(a, out, True), lambda a: TF.adaptive_max_pool3d(a, out, True), x)
    compare(
        lambda a: F.adaptive_max_pool3d_with_indices(a, out), lambda a: TF.adaptive_max_pool3d_with_indices(a, out), x
    )


def test_adaptive_max_pool3d_ties_nan_and_inf_pick_torchs_index():
    # ties: the first maximum in (d, h, w) order; NaN: the last NaN; all -inf: the first position
    x = torch.zeros(1, 1, 4, 4, 4, dtype=torch.float64)
    x[0, 0, 1, 2, 3] = x[0, 0, 2, 0, 0] = 5
    x[0, 0, 0, 3, 3] = float("nan")
    x[0, 0, 1, 3, 2] = float("nan")
    x[0, 0, 3] = -math.inf
    for out in (1, 2, (2, 1, 3), (3, 3, 3)):
        kv, ki = F.adaptive_max_pool3d(k(x), out, True)
        tv, ti = TF.adaptive_max_pool3d(x, out, True)
        assert to_np(ki).tolist() == ti.tolist()
        np.testing.assert_array_equal(to_np(kv), tv.numpy())


def test_adaptive_pool3d_empty_and_float32():
    for shape, out in (((0, 3, 4, 4, 4), 2), ((2, 3, 4, 4, 4), 0), ((2, 3, 4, 4, 4), (0, 2, 2))):
        compare(
            lambda a, o=out: F.adaptive_avg_pool3d(a, o), lambda a, o=out: TF.adaptive_avg_pool3d(a, o), x64(*shape)
        )
        compare(
            lambda a, o=out: F.adaptive_max_pool3d(a, o, True),
            lambda a, o=out: TF.adaptive_max_pool3d(a, o, True),
            x64(*shape),
        )
    x = torch.randn(2, 3, 5, 6, 7)
    np.testing.assert_allclose(to_np(F.adaptive_avg_pool3d(k(x), 3)), TF.adaptive_avg_pool3d(x, 3).numpy(), rtol=1e-5)
    xh = torch.randn(1, 2, 4, 4, 4).half()
    np.testing.assert_array_equal(to_np(F.adaptive_max_pool3d(k(xh), 2)), TF.adaptive_max_pool3d(xh, 2).numpy())


def test_adaptive_pool3d_gradcheck():
    x = kiln.randn(1, 2, 5, 4, 3, dtype=kiln.float64, requires_grad=True)
    assert gradcheck(lambda a: F.adaptive_avg_pool3d(a, (3, 2, 2)), (x,))
    assert gradcheck(lambda a: F.adaptive_max_pool3d(a, (3, 2, 2)), (x,))


ADAPTIVE_ERRORS = [
    ((2, 3, 5, 6, 7), (2, 3)),
    ((2, 3, 5, 6, 7), (2,)),
    ((2, 3, 5, 6, 7), (-1, 2, 3)),
    ((2, 3, 5, 6, 7), (1, -2, 3)),
    ((2, 3, 5, 6, 7), (1, 2, 3, 4, 5, 6)),
    ((3, 4, 4), 2),
    ((3, 4, 4), (1, 2)),
    ((2, 0, 4, 4, 4), 2),
    ((2, 0, 4, 4, 4), -1),
    ((2, 3, 0, 4, 4), 0),
    ((2, 3, 4, 4, 4), (1.5, 2, 2)),
    ((2, 3, 4, 4, 4), None),
    ((2, 3, 4, 4, 4), 2.5),
]


@pytest.mark.parametrize(("shape", "out"), ADAPTIVE_ERRORS)
@pytest.mark.parametrize("name", ["adaptive_avg_pool3d", "adaptive_max_pool3d"])
def test_adaptive_pool3d_errors_match_torch(name, shape, out):
    same_error(lambda: getattr(F, name)(kiln.randn(*shape), out), lambda: getattr(TF, name)(torch.randn(*shape), out))


@pytest.mark.parametrize("name", ["adaptive_avg_pool3d", "adaptive_max_pool3d"])
@pytest.mark.parametrize("dtype", ["int64", "bool"])
def test_adaptive_pool3d_dtype_errors_match_torch(name, dtype):
    for out in (2, -1):
        same_error(
            lambda: getattr(F, name)(kiln.ones(2, 3, 4, 4, 4, dtype=getattr(kiln, dtype)), out),  # noqa: B023
            lambda: getattr(TF, name)(torch.ones(2, 3, 4, 4, 4, dtype=getattr(torch, dtype)), out),  # noqa: B023
        )


# ---------------------------------------------------------------------------------------- lp pooling


@pytest.mark.parametrize("p", [1, 2, 3.5, math.inf, -math.inf])
@pytest.mark.parametrize(
    ("nd", "shape", "args"),
    [
        (1, (2, 3, 9), (3,)),
        (1, (3, 8), (2, 3, True)),
        (2, (2, 3, 6, 7), ((2, 3),)),
        (2, (3, 7, 7), (3, 2, True)),
        (3, (2, 2, 5, 6, 4), (2,)),
        (3, (2, 4, 5, 6), ((2, 3, 2), (1, 2, 1), True)),
    ],
)
def test_lp_pool_matches_torch(p, nd, shape, args):
    x = x64(*shape).abs() + 0.1 if isinstance(p, float) and not math.isinf(p) else x64(*shape)
    compare(lambda a: getattr(F, f"lp_pool{nd}d")(a, p, *args), lambda a: getattr(TF, f"lp_pool{nd}d")(a, p, *args), x)


def test_lp_pool_zero_window_has_zero_gradient_and_gradcheck():
    x = torch.zeros(1, 1, 4, 4, dtype=torch.float64)
    x[0, 0, 2:, 2:] = torch.rand(2, 2, dtype=torch.float64) + 0.5
    compare(lambda a: F.lp_pool2d(a, 2, 2), lambda a: TF.lp_pool2d(a, 2, 2), x)
    xk = (kiln.rand(1, 2, 4, 4, 4, dtype=kiln.float64) + 0.5).requires_grad_()
    assert gradcheck(lambda a: F.lp_pool3d(a, 3, 2), (xk,))


@pytest.mark.parametrize(
    ("name", "args"), [("LPPool1d", (2, 3)), ("LPPool2d", (1.5, (2, 3), 2, True)), ("LPPool3d", (2, 2))]
)
def test_lp_pool_layers_match_torch(name, args):
    shape = {"LPPool1d": (2, 3, 9), "LPPool2d": (2, 3, 6, 7), "LPPool3d": (1, 2, 4, 4, 6)}[name]
    check_twin(getattr(nn, name)(*args), getattr(torch.nn, name)(*args), torch.rand(*shape) + 0.1)


# ---------------------------------------------------------------------------------------- unpooling


@pytest.mark.parametrize(
    ("nd", "shape", "kwargs", "out"),
    [
        (1, (2, 3, 8), {}, None),
        (1, (3, 9), {"stride": 2, "padding": 1}, (9,)),
        (2, (2, 3, 6, 6), {}, None),
        (2, (2, 3, 7, 7), {}, (7, 7)),
        (2, (3, 7, 6), {"stride": 1}, [1, 3, 7, 6]),
        (3, (2, 2, 4, 6, 4), {}, None),
        (3, (2, 5, 4, 7), {"stride": (2, 1, 2), "padding": (1, 0, 0)}, (5, 4, 7)),
        (2, (0, 3, 4, 4), {}, None),
    ],
)
def test_max_unpool_matches_torch(nd, shape, kwargs, out):
    x = x64(*shape)
    v, i = getattr(TF, f"max_pool{nd}d")(x, 2, return_indices=True, **kwargs)
    kfn, tfn = getattr(F, f"max_unpool{nd}d"), getattr(TF, f"max_unpool{nd}d")
    kout, tout = compare(
        lambda a, b: kfn(a, b, 2, output_size=out, **kwargs), lambda a, b: tfn(a, b, 2, output_size=out, **kwargs), v, i
    )
    # max pooling the unpooled tensor gives the pooled values back
    np.testing.assert_array_equal(to_np(kout[0]), tout[0].detach().numpy())


def test_max_unpool_gradcheck_duplicates_and_layers():
    v = kiln.randn(1, 2, 2, 2, dtype=kiln.float64, requires_grad=True)
    idx = kiln.tensor([[[[0, 5], [10, 15]], [[3, 2], [9, 12]]]])
    assert gradcheck(lambda a: F.max_unpool2d(a, idx, 2), (v,))
    # an index written twice holds one of the values (PyTorch leaves which unspecified); every input reads
    # its gradient at its index, as in PyTorch
    dup = torch.tensor([[[[3, 3], [3, 12]]]])
    vt = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]], dtype=torch.float64, requires_grad=True)
    vk = k(vt, True)
    out = F.max_unpool2d(vk, k(dup), 2)
    assert to_np(out)[0, 0, 0, 3] in (1.0, 2.0, 3.0) and to_np(out)[0, 0, 3, 0] == 4.0
    g = torch.randn(1, 1, 4, 4, dtype=torch.float64)
    (out * k(g)).sum().backward()
    (TF.max_unpool2d(vt, dup, 2) * g).sum().backward()
    np.testing.assert_array_equal(to_np(vk.grad), vt.grad.numpy())
    x = torch.randn(2, 3, 6, 4, 4)
    _, ti = TF.max_pool3d(x, 2, return_indices=True)
    tv = torch.randn(2, 3, 3, 2, 2)
    k3, t3 = nn.MaxUnpool3d(2), torch.nn.MaxUnpool3d(2)
    assert repr(k3) == repr(t3)
    check_twin(k3, t3, tv, ti)
    check_twin(nn.MaxUnpool1d(2, 1), torch.nn.MaxUnpool1d(2, 1), torch.randn(3, 4), torch.tensor([[0, 2, 3, 4]] * 3))


UNPOOL_ERRORS = [
    ("max_unpool2d", (2, 3, 2, 2), lambda i: i, (2,), {"output_size": (6, 6)}),
    ("max_unpool2d", (2, 3, 2, 2), lambda i: i, (2,), {"output_size": (1, 2, 3)}),
    ("max_unpool2d", (2, 3, 2, 2), lambda i: i[..., :1], (2,), {}),
    ("max_unpool2d", (2, 3, 2, 2), lambda i: i * 100, (2,), {}),
    ("max_unpool2d", (2, 3, 2, 2), lambda i: -i - 1, (2,), {}),
    ("max_unpool2d", (2, 3, 2, 2), lambda i: i.int(), (2,), {}),
    ("max_unpool2d", (2, 3, 2, 2), lambda i: i.float(), (2,), {}),
    ("max_unpool2d", (2, 2), lambda i: i, (2,), {}),
    ("max_unpool2d", (2, 0, 2, 2), lambda i: i, (2,), {}),
    ("max_unpool2d", (2, 3, 2, 2), lambda i: i * 3, (2,), {"stride": 0}),
    ("max_unpool2d", (2, 3, 2, 2), lambda i: i, (2,), {"output_size": (2.5, 4)}),
    ("max_unpool1d", (3, 4), lambda i: i * 3, (2,), {}),
    ("max_unpool1d", (4,), lambda i: i, (2,), {}),
    ("max_unpool3d", (2, 3, 2, 2, 2), lambda i: i * 100, (2,), {}),
    ("max_unpool3d", (2, 3, 2, 2, 2), lambda i: i, (2,), {"stride": 0}),
    ("max_unpool3d", (2, 3, 2, 2, 2), lambda i: i[..., :1], (2,), {}),
    ("max_unpool3d", (2, 3, 2), lambda i: i, (2,), {}),
]


@pytest.mark.parametrize(("name", "shape", "index", "args", "kwargs"), UNPOOL_ERRORS)
def test_max_unpool_errors_match_torch(name, shape, index, args, kwargs):
    v = torch.randn(*shape)
    i = index(torch.arange(v.numel()).reshape(shape) % 4)
    same_error(
        lambda: getattr(F, name)(k(v), k(i) if i.dtype != torch.int32 else kiln.tensor(i.numpy()), *args, **kwargs),
        lambda: getattr(TF, name)(v, i, *args, **kwargs),
    )


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_max_unpool_value_dtype_errors_match_torch(dtype):
    i = torch.zeros(1, 1, 2, 2, dtype=torch.int64)
    same_error(
        lambda: F.max_unpool2d(kiln.ones(1, 1, 2, 2, dtype=getattr(kiln, dtype)), k(i), 2),
        lambda: TF.max_unpool2d(torch.ones(1, 1, 2, 2, dtype=getattr(torch, dtype)), i, 2),
        NotImplementedError,
    )


# ---------------------------------------------------------------------------------------- fractional


FRACTIONAL = [
    (2, (2, 3, 9, 11), 2, {"output_size": 4}),
    (2, (2, 3, 9, 11), (2, 3), {"output_size": (5, 4)}),
    (2, (2, 3, 9, 11), 3, {"output_size": 1}),
    (2, (2, 3, 9, 11), 2, {"output_size": (8, 10)}),
    (2, (2, 3, 9, 11), 2, {"output_ratio": (0.5, 0.7)}),
    (2, (3, 9, 11), 2, {"output_size": 4}),
    (2, (0, 3, 9, 11), 2, {"output_size": 4}),
    (2, (2, 3, 9, 11), 2, {"output_size": 0}),
    (3, (2, 3, 7, 8, 9), 2, {"output_size": 4}),
    (3, (2, 3, 7, 8, 9), (2, 3, 2), {"output_size": (5, 4, 3)}),
    (3, (3, 7, 8, 9), 3, {"output_ratio": 0.5}),
    (3, (2, 3, 7, 8, 9), 2, {"output_ratio": (0.5, 0.3, 0.8)}),
]


@pytest.mark.parametrize(("nd", "shape", "kernel", "kwargs"), FRACTIONAL)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fractional_max_pool_matches_torch_for_the_same_samples(nd, shape, kernel, kwargs, dtype):
    x = torch.randn(*shape, dtype=dtype)
    n = shape[0] if len(shape) == nd + 2 else 1
    samples = torch.rand(n, shape[-nd - 1], nd, dtype=dtype)
    kfn, tfn = getattr(F, f"fractional_max_pool{nd}d"), getattr(TF, f"fractional_max_pool{nd}d")
    kw = dict(kwargs, return_indices=True)
    kv, ki = kfn(k(x), kernel, _random_samples=k(samples), **kw)
    tv, ti = tfn(x, kernel, _random_samples=samples, **kw)
    assert to_np(ki).tolist() == ti.tolist()
    np.testing.assert_array_equal(to_np(kv), tv.numpy())
    if dtype is torch.float64 and tv.numel():
        compare(
            lambda a: kfn(a, kernel, _random_samples=k(samples), **kwargs),
            lambda a: tfn(a, kernel, _random_samples=samples, **kwargs),
            x,
        )
        compare(
            lambda a: getattr(F, f"fractional_max_pool{nd}d_with_indices")(
                a, kernel, _random_samples=k(samples), **kwargs
            ),
            lambda a: getattr(TF, f"fractional_max_pool{nd}d_with_indices")(
                a, kernel, _random_samples=samples, **kwargs
            ),
            x,
        )


def test_fractional_max_pool_draws_samples_ties_nan_and_gradcheck():
    x = kiln.randn(2, 3, 8, 8)
    a, b = F.fractional_max_pool2d(x, 2, output_size=5), F.fractional_max_pool2d(x, 2, output_size=5)
    assert a.shape == (2, 3, 5, 5) and not np.array_equal(to_np(a), to_np(b))  # fresh samples each call
    kiln.manual_seed(3)
    a = F.fractional_max_pool2d(x, 2, output_size=5)
    kiln.manual_seed(3)
    np.testing.assert_array_equal(to_np(a), to_np(F.fractional_max_pool2d(x, 2, output_size=5)))
    t = torch.zeros(1, 1, 5, 5, dtype=torch.float64)
    t[0, 0, 1, 1] = t[0, 0, 2, 2] = 1
    t[0, 0, 3:, 3:] = float("nan")
    t[0, 0, 0, 4] = -math.inf
    s = torch.rand(1, 1, 2, dtype=torch.float64)
    kv, ki = F.fractional_max_pool2d(k(t), 2, output_size=4, return_indices=True, _random_samples=k(s))
    tv, ti = TF.fractional_max_pool2d(t, 2, output_size=4, return_indices=True, _random_samples=s)
    assert to_np(ki).tolist() == ti.tolist()
    np.testing.assert_array_equal(to_np(kv), tv.numpy())
    xk = kiln.randn(1, 2, 6, 5, 4, dtype=kiln.float64, requires_grad=True)
    sk = kiln.rand(1, 2, 3, dtype=kiln.float64)
    assert gradcheck(lambda a: F.fractional_max_pool3d(a, 2, output_size=(3, 3, 2), _random_samples=sk), (xk,))


FRACTIONAL_ERRORS = [
    (2, (2, 3, 9, 9), 2, {}, (2, 3, 2)),
    (2, (2, 3, 9, 9), 2, {"output_ratio": 0.5}, (2, 3, 2)),
    (2, (2, 3, 9, 9), 2, {"output_ratio": (0.5, 0.5, 0.5)}, (2, 3, 2)),
    (2, (2, 3, 9, 9), 2, {"output_size": 9}, (2, 3, 2)),
    (2, (2, 3, 9, 9), 10, {"output_size": 4}, (2, 3, 2)),
    (2, (2, 3, 9, 9), 2, {"output_size": 4}, (1, 3, 2)),
    (2, (2, 3, 9, 9), 2, {"output_size": 4}, (2, 3, 1)),
    (2, (9, 9), 2, {"output_size": 4}, None),
    (2, (2, 3, 9, 9), (2, 2, 2), {"output_size": 4}, (2, 3, 2)),
    (2, (2, 3, 9, 9), 2, {"output_size": (4, 4, 4)}, (2, 3, 2)),
    (2, (2, 3, 9, 9), 2.5, {"output_size": 4}, (2, 3, 2)),
    (2, (2, 3, 9, 9), 2, {"output_size": (-1, 4)}, (2, 3, 2)),
    (2, (2, 3, 9, 9), 2, {"output_size": 4}, (2, 4, 2)),
    (2, (2, 3, 9, 9), 2, {"output_size": 4}, (2, 3)),
    (2, (9,), 2, {"output_size": 4}, (2, 3, 2)),
    (2, (1, 2, 3, 4, 9), 2, {"output_size": 4}, (2, 3)),
    (2, (2, 0, 9, 9), 2, {"output_size": 4}, (2, 3, 2)),
    (2, (2, 3, 9, 9), 20, {"output_size": -1}, (1, 3, 2)),
    (2, (2, 3, 9, 9), 2, {"output_size": -1}, (1, 3, 2)),
    (3, (2, 3, 7, 8, 9), 2, {}, (2, 3, 3)),
    (3, (2, 3, 7, 8, 9), 2, {"output_size": 8}, (2, 3, 3)),
    (3, (2, 3, 7, 8, 9), 2, {"output_size": 3}, (2, 3, 2)),
    (3, (2, 3, 7, 8, 9), 10, {"output_size": 3}, (2, 3, 3)),
    (3, (2, 3, 8, 9), 2, {"output_size": 3}, None),
    (3, (2, 3, 7, 8, 9), 2, {"output_size": (6, 7, 8)}, (2, 3, 3)),
    (3, (2, 3, 7, 8, 9), 2, {"output_size": (5, 7, 7)}, (2, 3, 3)),
    (3, (2, 3, 7, 8, 9), (2, 2, 2, 2), {"output_size": 3}, (2, 3, 3)),
    (3, (2, 3, 7, 8, 9), 2, {"output_size": (3, 3)}, (2, 3, 3)),
    (3, (2, 3, 0, 8, 9), 2, {"output_size": 2}, (2, 3, 3)),
    (3, (2, 3, 5, 8, 9), 2, {"output_size": (-2, 2, 2)}, (2, 3, 3)),
    (3, (2, 3, 5, 8, 9), 2, {"output_size": 2}, (1, 3, 3)),
    (3, (2, 3, 5, 8, 9), 2, {"output_size": 2}, (2, 4, 3)),
]


@pytest.mark.parametrize(("nd", "shape", "kernel", "kwargs", "samples"), FRACTIONAL_ERRORS)
def test_fractional_max_pool_errors_match_torch(nd, shape, kernel, kwargs, samples):
    x = torch.randn(*shape)
    s = None if samples is None else torch.rand(*samples)
    same_error(
        lambda: getattr(F, f"fractional_max_pool{nd}d")(
            k(x), kernel, _random_samples=None if s is None else k(s), **kwargs
        ),
        lambda: getattr(TF, f"fractional_max_pool{nd}d")(x, kernel, _random_samples=s, **kwargs),
    )


def test_fractional_max_pool_dtype_errors_match_torch():
    s = torch.rand(2, 3, 2)
    same_error(
        lambda: F.fractional_max_pool2d(kiln.randn(2, 3, 9, 9), 2, output_size=4, _random_samples=k(s.double())),
        lambda: TF.fractional_max_pool2d(torch.randn(2, 3, 9, 9), 2, output_size=4, _random_samples=s.double()),
    )
    same_error(
        lambda: F.fractional_max_pool2d(kiln.ones(2, 3, 9, 9, dtype=kiln.int64), 2, output_size=4),
        lambda: TF.fractional_max_pool2d(torch.ones(2, 3, 9, 9, dtype=torch.int64), 2, output_size=4),
        NotImplementedError,
    )


@pytest.mark.parametrize(
    ("name", "args", "kwargs"),
    [
        ("FractionalMaxPool2d", (2,), {"output_size": 3}),
        ("FractionalMaxPool2d", ((2, 3),), {"output_ratio": 0.5, "return_indices": True}),
        ("FractionalMaxPool3d", (2,), {"output_ratio": (0.5, 0.6, 0.7)}),
        ("FractionalMaxPool3d", (2,), {"output_size": (3, 2, 3), "return_indices": True}),
    ],
)
def test_fractional_max_pool_layers_match_torch(name, args, kwargs):
    nd = int(name[-2])
    x = torch.randn(2, 3, *([7, 8, 9][-nd:]))
    samples = torch.rand(2, 3, nd)
    kmod = getattr(nn, name)(*args, _random_samples=k(samples), **kwargs)
    tmod = getattr(torch.nn, name)(*args, _random_samples=samples, **kwargs)
    assert {n for n, _ in kmod.named_buffers()} == {n for n, _ in tmod.named_buffers()}
    for attr in ("kernel_size", "output_size", "output_ratio", "return_indices"):
        assert getattr(kmod, attr) == getattr(tmod, attr)
    check_twin(kmod, tmod, x, structure=False)
    assert repr(kmod) == repr(tmod)
    assert getattr(nn, name)(2, output_size=2)(kiln.randn(1, 2, *([5] * nd))).shape == (1, 2, *([2] * nd))


@pytest.mark.parametrize(
    "kwargs", [{}, {"output_size": 3, "output_ratio": 0.5}, {"output_ratio": 1.5}, {"output_ratio": (0.5, 0.0)}]
)
@pytest.mark.parametrize("name", ["FractionalMaxPool2d", "FractionalMaxPool3d"])
def test_fractional_max_pool_layer_errors_match_torch(name, kwargs):
    same_error(lambda: getattr(nn, name)(2, **kwargs), lambda: getattr(torch.nn, name)(2, **kwargs), ValueError)


# ---------------------------------------------------------------------------------------- layers and signatures


@pytest.mark.parametrize(
    ("name", "args", "shape"),
    [
        ("AvgPool3d", (2,), (2, 3, 4, 4, 4)),
        ("AvgPool3d", ((2, 3, 1), 1, 0, True, False, 3), (2, 3, 5, 6, 4)),
        ("AvgPool3d", (3, 2, 1, False, False), (3, 5, 5, 5)),
        ("AdaptiveAvgPool3d", ((2, None, 3),), (2, 3, 5, 6, 7)),
        ("AdaptiveMaxPool3d", (2,), (2, 3, 5, 6, 7)),
        ("AdaptiveMaxPool3d", ((3, 2, 1), True), (3, 5, 6, 7)),
    ],
)
def test_3d_pool_layers_match_torch(name, args, shape):
    kmod, tmod = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    check_twin(kmod, tmod, torch.randn(*shape))
    for attr in getattr(tmod, "__constants__", []):
        assert getattr(kmod, attr) == getattr(tmod, attr)


NEW_FUNCTIONS = [
    "avg_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool3d_with_indices", "lp_pool1d", "lp_pool2d", "lp_pool3d",
    "max_unpool1d", "max_unpool2d", "max_unpool3d", "fractional_max_pool2d_with_indices",
    "fractional_max_pool3d_with_indices",
]  # fmt: skip


def _sig(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", NEW_FUNCTIONS)
def test_signatures_match_torch(name):
    kfn, tfn = getattr(F, name), getattr(TF, name)
    assert kfn.__doc__ and name in F.__all__
    try:
        expected = _sig(tfn)
    except ValueError:  # a C++ builtin: the docstring's first line
        expected = None
    if expected is not None:
        assert _sig(kfn) == expected
    else:
        first = tfn.__doc__.strip().splitlines()[0]
        assert first.startswith(
            f"{name}("
            + ", ".join(
                p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                for p in inspect.signature(kfn).parameters.values()
            )
        )


@pytest.mark.parametrize("name", ["adaptive_max_pool3d", "fractional_max_pool2d", "fractional_max_pool3d"])
def test_boolean_dispatch_names_take_torchs_positional_and_keyword_forms(name):
    # torch's boolean_dispatch picks the with-indices function on return_indices given either way
    if name.startswith("adaptive"):
        x, args = torch.randn(1, 2, 4, 4, 4), (2,)
    else:
        nd = int(name[-2])
        x, args = torch.randn(1, 2, *([6] * nd)), (2, 3, None)
    tfn, kfn = getattr(TF, name), getattr(F, name)
    for extra, kw in (((), {}), ((True,), {}), ((), {"return_indices": True}), ((False,), {})):
        samples = {} if name.startswith("adaptive") else {"_random_samples": torch.rand(1, 2, int(name[-2]))}
        ksamples = {key: k(v) for key, v in samples.items()}
        tout = tfn(x, *args, *extra, **kw, **samples)
        kout = kfn(k(x), *args, *extra, **kw, **ksamples)
        assert isinstance(kout, tuple) == isinstance(tout, tuple)

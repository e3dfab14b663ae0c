"""Pooling, interpolation, padding and pixel (un)shuffle against ``torch.nn.functional``.

Forward and backward over parameter tables (kernel, stride, padding, dilation, ceil_mode,
count_include_pad, divisor_override, output sizes, interpolation modes and scales, padding modes) on
contiguous, transposed and strided inputs, unbatched and empty-batch inputs, float32 and float64;
argmax indices with ties and NaN; integer inputs where PyTorch accepts them; gradcheck and
gradgradcheck in float64; PyTorch's exception types and messages for bad arguments."""

from __future__ import annotations

import types
import zlib

import kiln_testutil as U
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln._ops import pad as _pad
from kiln._ops import pool as _pool
from kiln._ops import resample as _resample
from kiln._ops import spatial_args as _spatial_args

# kiln's pooling, resampling and padding modules (and their shared argument checks) as one namespace
_P_MODULES = (_spatial_args, _pool, _resample, _pad)
P = types.SimpleNamespace(**{k: v for m in _P_MODULES for k, v in vars(m).items()})

LAYOUTS = ("contiguous", "transposed", "strided")
FLOATS = (kiln.float32, kiln.float64)


def _lib(L):
    return F if L is torch else P


# name -> (input shape, fn(f, x)) where f is torch.nn.functional or kiln's namespace P
CASES = {
    # max pooling
    "max1d": ((2, 3, 9), lambda f, x: f.max_pool1d(x, 3)),
    "max1d_s2_p1_ceil": ((2, 3, 8), lambda f, x: f.max_pool1d(x, 3, 2, 1, ceil_mode=True)),
    "max1d_dil2": ((2, 3, 9), lambda f, x: f.max_pool1d(x, 2, 1, 1, dilation=2)),
    "max1d_idx": ((2, 3, 9), lambda f, x: f.max_pool1d(x, 3, 2, 1, return_indices=True)),
    "max1d_unbatched": ((3, 9), lambda f, x: f.max_pool1d(x, 2)),
    "max1d_with_indices": ((2, 3, 7), lambda f, x: f.max_pool1d_with_indices(x, 2, ceil_mode=True)),
    "max2d": ((2, 3, 6, 7), lambda f, x: f.max_pool2d(x, 2)),
    "max2d_rect": ((2, 2, 7, 8), lambda f, x: f.max_pool2d(x, (3, 2), (2, 3), (1, 0))),
    "max2d_dil_ceil": ((1, 2, 9, 8), lambda f, x: f.max_pool2d(x, 3, 2, 1, dilation=(2, 1), ceil_mode=True)),
    "max2d_overlap_idx": ((2, 2, 6, 6), lambda f, x: f.max_pool2d(x, 3, 1, 1, return_indices=True)),
    "max2d_unbatched": ((3, 6, 5), lambda f, x: f.max_pool2d(x, 2, 1, return_indices=True)),
    "max2d_with_indices": ((1, 2, 5, 5), lambda f, x: f.max_pool2d_with_indices(x, 2, ceil_mode=True)),
    "max2d_empty_batch": ((0, 2, 5, 5), lambda f, x: f.max_pool2d(x, 2)),
    "max3d": ((1, 2, 5, 4, 6), lambda f, x: f.max_pool3d(x, 2, return_indices=True)),
    "max3d_pad": ((1, 2, 5, 5, 5), lambda f, x: f.max_pool3d(x, 3, 2, 1, ceil_mode=True)),
    "max3d_unbatched": ((2, 4, 4, 4), lambda f, x: f.max_pool3d(x, (2, 1, 2), dilation=(1, 2, 1))),
    # average pooling
    "avg1d": ((2, 3, 9), lambda f, x: f.avg_pool1d(x, 3)),
    "avg1d_pad_ceil": ((2, 3, 8), lambda f, x: f.avg_pool1d(x, 3, 2, 1, ceil_mode=True)),
    "avg1d_nopad_count": ((2, 3, 8), lambda f, x: f.avg_pool1d(x, 3, 2, 1, True, False)),
    "avg1d_unbatched": ((3, 9), lambda f, x: f.avg_pool1d(x, 4, 2)),
    "avg2d": ((2, 3, 6, 7), lambda f, x: f.avg_pool2d(x, 2)),
    "avg2d_pad": ((2, 2, 7, 8), lambda f, x: f.avg_pool2d(x, (3, 2), (2, 1), (1, 1))),
    "avg2d_ceil_nocount": ((1, 2, 7, 6), lambda f, x: f.avg_pool2d(x, 3, 2, 1, True, False)),
    "avg2d_ceil_count": ((1, 2, 7, 6), lambda f, x: f.avg_pool2d(x, 3, 2, 1, ceil_mode=True)),
    "avg2d_divisor": ((2, 2, 6, 6), lambda f, x: f.avg_pool2d(x, 3, 2, 1, divisor_override=5)),
    "avg2d_unbatched": ((3, 6, 5), lambda f, x: f.avg_pool2d(x, 2, 1)),
    "avg2d_empty_batch": ((0, 2, 5, 5), lambda f, x: f.avg_pool2d(x, 2)),
    # adaptive pooling
    "aavg1d": ((2, 3, 10), lambda f, x: f.adaptive_avg_pool1d(x, 4)),
    "aavg1d_up": ((2, 3, 3), lambda f, x: f.adaptive_avg_pool1d(x, 7)),
    "aavg1d_unbatched": ((3, 7), lambda f, x: f.adaptive_avg_pool1d(x, 3)),
    "aavg2d": ((2, 3, 7, 9), lambda f, x: f.adaptive_avg_pool2d(x, (3, 4))),
    "aavg2d_int": ((2, 2, 5, 5), lambda f, x: f.adaptive_avg_pool2d(x, 2)),
    "aavg2d_none": ((2, 2, 5, 6), lambda f, x: f.adaptive_avg_pool2d(x, (None, 4))),
    "aavg2d_unbatched": ((3, 7, 5), lambda f, x: f.adaptive_avg_pool2d(x, (1, 8))),
    "aavg2d_zero_out": ((2, 2, 5, 5), lambda f, x: f.adaptive_avg_pool2d(x, 0)),
    "amax1d": ((2, 3, 10), lambda f, x: f.adaptive_max_pool1d(x, 4, return_indices=True)),
    "amax1d_unbatched": ((3, 7), lambda f, x: f.adaptive_max_pool1d(x, 3)),
    "amax2d": ((2, 3, 7, 9), lambda f, x: f.adaptive_max_pool2d(x, (3, 4), return_indices=True)),
    "amax2d_up": ((1, 2, 3, 4), lambda f, x: f.adaptive_max_pool2d(x, (5, 6))),
    "amax2d_none": ((2, 2, 5, 6), lambda f, x: f.adaptive_max_pool2d(x, (3, None))),
    "amax2d_unbatched": ((3, 6, 5), lambda f, x: f.adaptive_max_pool2d(x, 2, True)),
    "amax2d_empty_batch": ((0, 2, 5, 5), lambda f, x: f.adaptive_max_pool2d(x, 2)),
    "amax2d_unbatched_empty": ((0, 5, 5), lambda f, x: f.adaptive_max_pool2d(x, 2)),
    "aavg2d_zero_channels": ((1, 0, 5, 5), lambda f, x: f.adaptive_avg_pool2d(x, 2)),
    "aavg2d_unbatched_empty": ((0, 5, 5), lambda f, x: f.adaptive_avg_pool2d(x, 2)),
    "aavg1d_zero_channels": ((2, 0, 5), lambda f, x: f.adaptive_avg_pool1d(x, 2)),
    "amax1d_unbatched_empty": ((0, 5), lambda f, x: f.adaptive_max_pool1d(x, 2)),
    "amax1d_with_indices": ((2, 3, 8), lambda f, x: f.adaptive_max_pool1d_with_indices(x, 3)),
    "amax2d_with_indices": ((2, 3, 7, 5), lambda f, x: f.adaptive_max_pool2d_with_indices(x, (2, 4))),
    # interpolation
    "nearest1d_size": ((2, 3, 5), lambda f, x: f.interpolate(x, size=8)),
    "nearest1d_scale": ((2, 3, 5), lambda f, x: f.interpolate(x, scale_factor=1.7)),
    "nearest1d_down": ((2, 3, 9), lambda f, x: f.interpolate(x, size=4)),
    "nearest2d_scale2": ((2, 3, 4, 5), lambda f, x: f.interpolate(x, scale_factor=2)),
    "nearest2d_size": ((2, 3, 5, 6), lambda f, x: f.interpolate(x, size=(7, 4))),
    "nearest2d_scale_tuple": ((1, 2, 5, 6), lambda f, x: f.interpolate(x, scale_factor=(1.5, 0.7))),
    "nearest2d_recompute": ((1, 2, 5, 6), lambda f, x: f.interpolate(x, scale_factor=1.3, recompute_scale_factor=True)),
    "nexact1d": ((2, 3, 5), lambda f, x: f.interpolate(x, size=8, mode="nearest-exact")),
    "nexact2d": ((2, 3, 5, 6), lambda f, x: f.interpolate(x, size=(3, 10), mode="nearest-exact")),
    "nexact2d_scale": ((1, 2, 5, 6), lambda f, x: f.interpolate(x, scale_factor=1.6, mode="nearest-exact")),
    "linear_size": ((2, 3, 5), lambda f, x: f.interpolate(x, size=9, mode="linear")),
    "linear_align": ((2, 3, 5), lambda f, x: f.interpolate(x, size=9, mode="linear", align_corners=True)),
    "linear_down": ((2, 3, 9), lambda f, x: f.interpolate(x, size=4, mode="linear")),
    "linear_scale": ((2, 3, 5), lambda f, x: f.interpolate(x, scale_factor=2.5, mode="linear")),
    "linear_to1_align": ((2, 3, 5), lambda f, x: f.interpolate(x, size=1, mode="linear", align_corners=True)),
    "bilinear_size": ((2, 3, 4, 5), lambda f, x: f.interpolate(x, size=(7, 3), mode="bilinear")),
    "bilinear_align": ((2, 3, 4, 5), lambda f, x: f.interpolate(x, size=(6, 9), mode="bilinear", align_corners=True)),
    "bilinear_scale": ((1, 2, 5, 4), lambda f, x: f.interpolate(x, scale_factor=(1.5, 2.25), mode="bilinear")),
    "bilinear_down_recompute": (
        (1, 2, 7, 6),
        lambda f, x: f.interpolate(x, scale_factor=0.6, mode="bilinear", recompute_scale_factor=True),
    ),
    "area1d": ((2, 3, 9), lambda f, x: f.interpolate(x, size=4, mode="area")),
    "area2d_scale": ((2, 3, 7, 6), lambda f, x: f.interpolate(x, scale_factor=0.5, mode="area")),
    "bilinear_aa_down": ((2, 2, 9, 7), lambda f, x: f.interpolate(x, size=(3, 2), mode="bilinear", antialias=True)),
    "bilinear_aa_mixed": ((2, 2, 5, 8), lambda f, x: f.interpolate(x, size=(11, 3), mode="bilinear", antialias=True)),
    "bilinear_aa_scale": (
        (1, 2, 9, 8),
        lambda f, x: f.interpolate(x, scale_factor=(0.45, 1.6), mode="bilinear", antialias=True),
    ),
    "bilinear_aa_align": (
        (1, 2, 9, 8),
        lambda f, x: f.interpolate(x, size=(4, 12), mode="bilinear", align_corners=True, antialias=True),
    ),
    "bicubic_size": ((2, 2, 5, 6), lambda f, x: f.interpolate(x, size=(9, 4), mode="bicubic")),
    "bicubic_align": ((1, 2, 5, 6), lambda f, x: f.interpolate(x, size=(3, 8), mode="bicubic", align_corners=True)),
    "bicubic_scale": ((1, 2, 4, 5), lambda f, x: f.interpolate(x, scale_factor=1.7, mode="bicubic")),
    "trilinear": ((1, 2, 3, 4, 5), lambda f, x: f.interpolate(x, size=(5, 3, 7), mode="trilinear")),
    "trilinear_align": (
        (1, 2, 3, 4, 3),
        lambda f, x: f.interpolate(x, scale_factor=(2.0, 0.5, 1.5), mode="trilinear", align_corners=True),
    ),
    "nearest3d": ((1, 2, 3, 4, 5), lambda f, x: f.interpolate(x, scale_factor=1.5)),
    "nexact3d": ((1, 2, 3, 4, 5), lambda f, x: f.interpolate(x, size=(2, 6, 3), mode="nearest-exact")),
    "bilinear_empty_batch": ((0, 2, 4, 4), lambda f, x: f.interpolate(x, size=5, mode="bilinear")),
    # padding
    "pad_const1": ((2, 3, 5), lambda f, x: f.pad(x, (1, 2))),
    "pad_const_value": ((2, 3, 4, 5), lambda f, x: f.pad(x, (1, 2, 0, 3), value=-1.5)),
    "pad_const_crop": ((2, 3, 4, 5), lambda f, x: f.pad(x, (-1, 2, 1, -2))),
    "pad_const_all_dims": ((2, 3, 4), lambda f, x: f.pad(x, (1, 0, 0, 1, 2, 1), "constant", 2.0)),
    "pad_const_crop_all": ((2, 3, 4), lambda f, x: f.pad(x, (-2, -2))),
    "pad_reflect1d": ((2, 3, 5), lambda f, x: f.pad(x, (2, 4), mode="reflect")),
    "pad_reflect1d_unbatched": ((3, 5), lambda f, x: f.pad(x, (3, 1), mode="reflect")),
    "pad_reflect2d": ((2, 3, 4, 5), lambda f, x: f.pad(x, (1, 2, 3, 0), mode="reflect")),
    "pad_reflect2d_unbatched": ((3, 4, 5), lambda f, x: f.pad(x, (4, 4, 3, 3), mode="reflect")),
    "pad_reflect_neg": ((2, 3, 6), lambda f, x: f.pad(x, (-1, 2), mode="reflect")),
    "pad_reflect3d": ((1, 2, 3, 4, 3), lambda f, x: f.pad(x, (1, 2, 2, 1, 0, 2), mode="reflect")),
    "pad_replicate1d": ((2, 3, 5), lambda f, x: f.pad(x, (3, 7), mode="replicate")),
    "pad_replicate2d": ((2, 3, 4, 5), lambda f, x: f.pad(x, (1, 2, 5, 0), mode="replicate")),
    "pad_replicate2d_neg": ((2, 3, 4, 5), lambda f, x: f.pad(x, (-1, 2, 1, -1), mode="replicate")),
    "pad_replicate_unbatched": ((3, 4), lambda f, x: f.pad(x, (2, 1), mode="replicate")),
    "pad_replicate3d": ((1, 2, 3, 4, 3), lambda f, x: f.pad(x, (1, 2, 2, 1, 3, 0), mode="replicate")),
    "pad_circular1d": ((2, 3, 5), lambda f, x: f.pad(x, (2, 5), mode="circular")),
    "pad_circular2d": ((2, 3, 4, 5), lambda f, x: f.pad(x, (1, 2, 4, 0), mode="circular")),
    "pad_circular_neg": ((2, 3, 4, 5), lambda f, x: f.pad(x, (-1, 2, 1, -2), mode="circular")),
    "pad_circular_unbatched": ((3, 4, 5), lambda f, x: f.pad(x, (1, 1, 2, 2), mode="circular")),
    "pad_empty_batch": ((0, 3, 4, 5), lambda f, x: f.pad(x, (1, 2, 2, 1), mode="reflect")),
    # pixel (un)shuffle
    "pixel_shuffle": ((2, 8, 3, 4), lambda f, x: f.pixel_shuffle(x, 2)),
    "pixel_shuffle_unbatched": ((9, 2, 3), lambda f, x: f.pixel_shuffle(x, 3)),
    "pixel_shuffle_5d": ((2, 1, 4, 2, 2), lambda f, x: f.pixel_shuffle(x, 2)),
    "pixel_unshuffle": ((2, 2, 4, 6), lambda f, x: f.pixel_unshuffle(x, 2)),
    "pixel_unshuffle_unbatched": ((1, 6, 3), lambda f, x: f.pixel_unshuffle(x, 3)),
}


def _tol(dtype):
    return {"rtol": 1e-5, "atol": 1e-5} if dtype is kiln.float32 else {}


def _seed(name: str) -> int:
    return zlib.crc32(name.encode()) % 1000


# torch refuses the backward of an adaptive average pool with an empty output or channel dim: forward only
FORWARD_ONLY = {"aavg2d_zero_out", "aavg2d_zero_channels", "aavg1d_zero_channels"}
# (dtype, layout) combinations every case runs in
VARIANTS = [(kiln.float32, "contiguous"), (kiln.float64, "transposed"), (kiln.float32, "strided")]


@pytest.mark.parametrize("dtype,layout", VARIANTS, ids=[f"{U.dtype_id(d)}-{lay}" for d, lay in VARIANTS])
@pytest.mark.parametrize("name", list(CASES))
def test_forward_backward(name, dtype, layout):
    shape, fn = CASES[name]
    x = U.make_pair(shape, dtype, layout=layout, requires_grad=True, seed=_seed(name))
    tol = _tol(dtype)
    _, t_out = U.check_op(
        lambda L, t: fn(_lib(L), t),
        x,
        grad=name not in FORWARD_ONLY,
        grad_rtol=tol.get("rtol"),
        grad_atol=tol.get("atol"),
        **tol,
    )
    assert t_out is not None, "torch refused the case: the table entry is wrong"


@pytest.mark.parametrize(
    "name", ["max2d_overlap_idx", "avg2d_pad", "aavg2d", "amax2d", "bilinear_size", "bicubic_size", "pad_reflect2d"]
)
def test_expanded_input(name):
    """Stride-0 (broadcast) inputs: every window sees repeated values, so ties decide the argmax."""
    shape, fn = CASES[name]
    x = U.make_pair(shape, kiln.float64, layout="expanded", requires_grad=True, seed=_seed(name))
    U.check_op(lambda L, t: fn(_lib(L), t), x)


def _pool_sweep() -> list:
    """Seeded random 1-d and 2-d pooling geometries (kernel, stride, padding <= kernel/2, dilation,
    ceil_mode, count_include_pad) whose output is non-empty, including windows that start in padding."""
    rng = np.random.default_rng(1234)
    cases = []
    while len(cases) < 40:
        nd = 1 if len(cases) < 24 else 2
        k = tuple(int(v) for v in rng.integers(1, 5, nd))
        st = tuple(int(v) for v in rng.integers(1, 4, nd))
        pd = tuple(int(rng.integers(0, kk // 2 + 1)) for kk in k)
        dl = tuple(int(v) for v in rng.integers(1, 3, nd))
        size = tuple(int(v) for v in rng.integers(3, 9, nd))
        ceil, count = bool(rng.integers(2)), bool(rng.integers(2))
        kind = "max" if len(cases) % 2 == 0 else "avg"
        if kind == "avg":
            dl = (1,) * nd
        if any(P._pool_out(n, kk, ss, pp, dd, ceil) < 1 for n, kk, ss, pp, dd in zip(size, k, st, pd, dl)):
            continue
        if kind == "max" and any(pp > ((kk - 1) * dd + 1) // 2 for kk, pp, dd in zip(k, pd, dl)):
            continue
        cases.append((kind, size, k, st, pd, dl, ceil, count))
    return cases


@pytest.mark.parametrize("kind,size,k,st,pd,dl,ceil,count", _pool_sweep())
def test_pool_geometry_sweep(kind, size, k, st, pd, dl, ceil, count):
    x = U.make_pair((2, 2) + size, kiln.float64, requires_grad=True, seed=sum(size) + sum(k))
    nd = len(size)

    def fn(L, t):
        f = _lib(L)
        if kind == "max":
            pool = f.max_pool1d if nd == 1 else f.max_pool2d
            return pool(t, k, st, pd, dl, ceil, return_indices=True)
        pool = f.avg_pool1d if nd == 1 else f.avg_pool2d
        return pool(t, k, st, pd, ceil, count)

    U.check_op(fn, x)


def _interp_sweep() -> list:
    rng = np.random.default_rng(99)
    cases = []
    for i in range(24):
        mode = ("nearest", "nearest-exact", "linear", "bilinear", "area")[i % 5]
        nd = 2 if mode == "bilinear" or (mode != "linear" and i % 3 == 0) else 1
        size = tuple(int(v) for v in rng.integers(1, 7, nd))
        kw: dict = {"mode": mode}
        if i % 2:
            kw["size"] = tuple(int(v) for v in rng.integers(1, 10, nd))
        else:
            kw["scale_factor"] = tuple(float(np.round(v, 2)) for v in rng.uniform(0.4, 3.2, nd))
            if any(int(n * sc) < 1 for n, sc in zip(size, kw["scale_factor"])):
                kw["scale_factor"] = tuple(sc + 1.0 for sc in kw["scale_factor"])
            kw["recompute_scale_factor"] = bool(i % 4 == 0) if mode != "area" else None
        if mode in ("linear", "bilinear"):
            kw["align_corners"] = bool(i % 3 == 1)
        cases.append((size, kw))
    return cases


@pytest.mark.parametrize("size,kw", _interp_sweep())
def test_interpolate_sweep(size, kw):
    x = U.make_pair((2, 2) + size, kiln.float64, requires_grad=True, seed=len(size) + sum(size))
    U.check_op(lambda L, t: _lib(L).interpolate(t, **kw), x)


def test_grad_fn_names():
    x = U.make_pair((1, 2, 6, 6), kiln.float32, requires_grad=True)
    for fn in (
        lambda f, t: f.max_pool2d(t, 2),
        lambda f, t: f.avg_pool2d(t, 2),
        lambda f, t: f.adaptive_avg_pool2d(t, 3),
        lambda f, t: f.adaptive_max_pool2d(t, 3),
        lambda f, t: f.interpolate(t, scale_factor=2),
        lambda f, t: f.interpolate(t, scale_factor=2, mode="bilinear"),
        lambda f, t: f.interpolate(t, scale_factor=2, mode="nearest-exact"),
        lambda f, t: f.interpolate(t, scale_factor=0.5, mode="bilinear", antialias=True),
        lambda f, t: f.interpolate(t, scale_factor=0.5, mode="bicubic"),
        lambda f, t: f.interpolate(t.unsqueeze(0), scale_factor=0.5, mode="trilinear"),
        lambda f, t: f.interpolate(t.unsqueeze(0), scale_factor=0.5),
        lambda f, t: f.pad(t, (1, 1, 1, 1), mode="reflect"),
        lambda f, t: f.pad(t, (1, 1, 1, 1), mode="replicate"),
        lambda f, t: f.pad(t, (1, 1)),
    ):
        assert fn(P, x.k).grad_fn.name() == fn(F, x.t).grad_fn.name()


# ---------------------------------------------------------------------------------------- max pool details


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "name,fn",
    [
        ("max1d", lambda f, x: f.max_pool1d(x[:, :, 0], 3, 1, 1, return_indices=True)),
        ("max2d", lambda f, x: f.max_pool2d(x, 3, 1, 1, return_indices=True)),
        ("max2d_ceil", lambda f, x: f.max_pool2d(x, 2, 2, ceil_mode=True, return_indices=True)),
        ("amax2d", lambda f, x: f.adaptive_max_pool2d(x, (3, 2), return_indices=True)),
        ("max3d", lambda f, x: f.max_pool3d(x.unsqueeze(2), (1, 2, 2), 1, return_indices=True)),
    ],
)
def test_max_pool_ties(name, fn, layout):
    """Integral values make ties: the first maximum in the window wins, and the gradient follows it."""
    x = U.make_pair((2, 2, 5, 5), kiln.float64, layout=layout, requires_grad=True, integral=True, low=-1, high=1)
    U.check_op(lambda L, t: fn(_lib(L), t), x)


@pytest.mark.parametrize("name", ["max2d", "amax2d", "max1d"])
def test_max_pool_nan_and_inf(name):
    vals = np.arange(50, dtype=np.float64).reshape(1, 2, 5, 5) % 7
    vals[0, 0, 1, 1] = np.nan
    vals[0, 0, 3, 3:5] = np.nan
    vals[0, 1, :2, :2] = -np.inf
    vals[0, 1, 4, 4] = np.inf
    fns = {
        "max2d": lambda f, x: f.max_pool2d(x, 2, 1, 1, return_indices=True),
        "amax2d": lambda f, x: f.adaptive_max_pool2d(x, 3, return_indices=True),
        "max1d": lambda f, x: f.max_pool1d(x.flatten(2), 3, 2, 1, return_indices=True),
    }
    x = U.make_pair((1, 2, 5, 5), kiln.float64, values=vals)
    U.check_op(lambda L, t: fns[name](_lib(L), t), x, grad=False)


@pytest.mark.parametrize(
    "dtype", [kiln.int64, kiln.int32, kiln.uint8, kiln.int16, kiln.float16, kiln.bfloat16], ids=U.dtype_id
)
@pytest.mark.parametrize(
    "name,fn",
    [
        ("max2d", lambda f, x: f.max_pool2d(x, 3, 2, 1, return_indices=True)),
        ("max3d", lambda f, x: f.max_pool3d(x.unsqueeze(0), 2)),
        ("max1d_idx", lambda f, x: f.max_pool1d(x[0], 2, return_indices=True)),
        ("avg2d", lambda f, x: f.avg_pool2d(x, 3, 2, 1)),
        ("avg2d_nocount", lambda f, x: f.avg_pool2d(x, 3, 2, 1, count_include_pad=False)),
        ("avg1d", lambda f, x: f.avg_pool1d(x[0], 2)),
        ("pad_const", lambda f, x: f.pad(x, (1, -1), value=3)),
        ("pad_reflect", lambda f, x: f.pad(x, (1, 2), mode="reflect")),
        ("pad_replicate", lambda f, x: f.pad(x, (1, 2, 2, 1), mode="replicate")),
        ("pad_circular", lambda f, x: f.pad(x, (1, 2, 2, 1), mode="circular")),
        ("pixel_shuffle", lambda f, x: f.pixel_shuffle(x.reshape(1, 4, 5, 5), 2)),
    ],
)
def test_other_dtypes(name, fn, dtype):
    """Integer and half inputs: torch's result, or its refusal (kiln must raise the same type)."""
    x = U.make_pair((2, 2, 5, 5), dtype, low=-5, high=5)
    tol = {"rtol": 1e-2, "atol": 1e-2} if dtype in U.HALF_DTYPES else {}
    U.check_op(lambda L, t: fn(_lib(L), t), x, grad=False, **tol)


@pytest.mark.parametrize("dtype", U.HALF_DTYPES, ids=U.dtype_id)
@pytest.mark.parametrize(
    "name", ["max2d_overlap_idx", "avg2d_ceil_count", "aavg2d", "bilinear_align", "pad_replicate2d", "pad_const_crop"]
)
def test_half_forward_backward(name, dtype):
    """float16/bfloat16 compute in float32 and round back, forward and backward."""
    shape, fn = CASES[name]
    x = U.make_pair(shape, dtype, requires_grad=True, seed=_seed(name))
    # where several outputs feed one input, torch accumulates the gradient in bfloat16 (rounding every
    # add) and kiln in float32 (rounding once): a few bfloat16 ulps apart
    g_tol = 5e-2 if dtype is kiln.bfloat16 else 1e-2
    U.check_op(lambda L, t: fn(_lib(L), t), x, rtol=1e-2, atol=1e-2, grad_rtol=g_tol, grad_atol=g_tol)


@pytest.mark.parametrize("dtype", [kiln.int64, kiln.float16, kiln.bool], ids=U.dtype_id)
@pytest.mark.parametrize(
    "name,fn",
    [
        ("max2d", lambda f, x: f.max_pool2d(x, 2)),
        ("max1d", lambda f, x: f.max_pool1d(x[0], 2)),
        ("avg2d", lambda f, x: f.avg_pool2d(x, 2)),
        ("aavg2d", lambda f, x: f.adaptive_avg_pool2d(x, 2)),
        ("aavg1d", lambda f, x: f.adaptive_avg_pool1d(x[0], 2)),
        ("amax2d", lambda f, x: f.adaptive_max_pool2d(x, 2)),
        ("nearest1d", lambda f, x: f.interpolate(x[0], size=3)),
        ("linear", lambda f, x: f.interpolate(x[0], size=3, mode="linear")),
        ("bilinear", lambda f, x: f.interpolate(x, size=3, mode="bilinear")),
        ("bilinear_align", lambda f, x: f.interpolate(x, size=(3, 6), mode="bilinear", align_corners=True)),
        ("nearest2d", lambda f, x: f.interpolate(x, size=(3, 6))),
        ("nearest_exact", lambda f, x: f.interpolate(x, scale_factor=1.5, mode="nearest-exact")),
        ("area", lambda f, x: f.interpolate(x, size=3, mode="area")),
        ("bicubic", lambda f, x: f.interpolate(x, size=3, mode="bicubic")),
        ("trilinear", lambda f, x: f.interpolate(x.unsqueeze(0), size=3, mode="trilinear")),
        ("nearest3d", lambda f, x: f.interpolate(x.unsqueeze(0), size=3)),
        ("pad_reflect_value0", lambda f, x: f.pad(x, (1, 1, 1, 1), mode="reflect", value=0.0)),
        ("pad_replicate3d", lambda f, x: f.pad(x.unsqueeze(0), (1, 1, 1, 1, 0, 1), mode="replicate")),
        ("pad_reflect1d", lambda f, x: f.pad(x[0], (1, 2), mode="reflect")),
        ("pad_circular", lambda f, x: f.pad(x, (1, 2), mode="circular")),
        ("pad_bool", lambda f, x: f.pad(x, (1, 1), value=1)),
    ],
)
def test_dtype_refusals(name, fn, dtype):
    """Where torch refuses a dtype, kiln raises the same type and message; else the results agree."""
    x = U.make_pair((1, 2, 4, 4), dtype)
    try:
        fn(F, x.t)
    except Exception:  # noqa: BLE001 - torch refuses: compare the error
        U.assert_same_error(lambda: fn(P, x.k), lambda: fn(F, x.t))
        return
    tol = {"rtol": 1e-2, "atol": 1e-2} if dtype in U.HALF_DTYPES else {}
    U.check_op(lambda L, t: fn(_lib(L), t), x, grad=False, **tol)


# ---------------------------------------------------------------------------------------- gradcheck

GRAD_FNS = {
    "max1d": lambda t: P.max_pool1d(t, 3, 2, 1),
    "max2d": lambda t: P.max_pool2d(t, 2, 1, 1, dilation=(1, 2)),
    "max3d": lambda t: P.max_pool3d(t.unsqueeze(0), 2, 1),
    "amax1d": lambda t: P.adaptive_max_pool1d(t, 3),
    "amax2d": lambda t: P.adaptive_max_pool2d(t.unsqueeze(0), (2, 3)),
    "avg1d": lambda t: P.avg_pool1d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False),
    "avg2d": lambda t: P.avg_pool2d(t.unsqueeze(0), 3, 2, 1, ceil_mode=True),
    "avg2d_divisor": lambda t: P.avg_pool2d(t, 2, 1, divisor_override=3),
    "aavg1d": lambda t: P.adaptive_avg_pool1d(t, 3),
    "aavg2d": lambda t: P.adaptive_avg_pool2d(t, (3, 2)),
    "nearest": lambda t: P.interpolate(t.unsqueeze(0), scale_factor=1.5),
    "nearest_exact": lambda t: P.interpolate(t, size=3, mode="nearest-exact"),
    "linear": lambda t: P.interpolate(t.unsqueeze(0), size=7, mode="linear"),
    "bilinear": lambda t: P.interpolate(t.unsqueeze(0), size=(3, 5), mode="bilinear", align_corners=True),
    "bicubic": lambda t: P.interpolate(t.unsqueeze(0), size=(5, 3), mode="bicubic"),
    "trilinear": lambda t: P.interpolate(t[None, None], size=(3, 2, 5), mode="trilinear"),
    "bilinear_aa": lambda t: P.interpolate(t.unsqueeze(0), size=(3, 2), mode="bilinear", antialias=True),
    "pad_constant": lambda t: P.pad(t, (1, -1, 2, 0), value=0.5),
    "pad_reflect": lambda t: P.pad(t, (2, 1, 1, 2), mode="reflect"),
    "pad_replicate": lambda t: P.pad(t, (2, 1), mode="replicate"),
    "pad_circular": lambda t: P.pad(t.unsqueeze(0), (2, 1, 1, 0), mode="circular"),
    "pixel_shuffle": lambda t: P.pixel_shuffle(t.reshape(4, 2, 4), 2),
    "pixel_unshuffle": lambda t: P.pixel_unshuffle(t, 2),
}


@pytest.mark.parametrize("name", list(GRAD_FNS))
def test_gradcheck_gradgradcheck(name):
    rng = np.random.default_rng(_seed(name))
    a = kiln.tensor(rng.permutation(32).reshape(2, 4, 4) / 7.0 - 2.0, dtype=kiln.float64, requires_grad=True)
    if "max" not in name:
        a = kiln.tensor(rng.standard_normal((2, 4, 4)), dtype=kiln.float64, requires_grad=True)
    fn = GRAD_FNS[name]
    if "1d" in name or name == "linear":
        a = kiln.tensor(a.detach().numpy()[:, 0], dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradcheck(fn, (a,))
    assert kiln.autograd.gradgradcheck(fn, (a,))


def test_double_backward_vs_torch():
    """Second-order gradients through max pool and bilinear upsampling agree with torch's."""
    x = U.make_pair((1, 2, 5, 5), kiln.float64, requires_grad=True)

    def fn(L, t):
        f = _lib(L)
        y = f.max_pool2d(t * t, 2, 1) + f.interpolate(t * t, size=(4, 4), mode="bilinear")
        (g,) = L.autograd.grad(y.sum(), t, create_graph=True)
        return f.avg_pool2d(g * g, 2)

    U.check_op(fn, x)


# ---------------------------------------------------------------------------------------- errors

_X4 = (1, 2, 5, 5)
ERRORS = {
    "max2d_pad_half": (_X4, lambda f, x: f.max_pool2d(x, 2, padding=2)),
    "max2d_pad_half_dil": (_X4, lambda f, x: f.max_pool2d(x, 3, padding=2, dilation=2)),
    "max2d_too_small": (_X4, lambda f, x: f.max_pool2d(x, 6)),
    "max2d_kernel0": (_X4, lambda f, x: f.max_pool2d(x, 0)),
    "max2d_kernel0_stride1": (_X4, lambda f, x: f.max_pool2d(x, 0, stride=1)),
    "max2d_stride0": (_X4, lambda f, x: f.max_pool2d(x, 2, stride=0)),
    "max2d_dil0": (_X4, lambda f, x: f.max_pool2d(x, 2, dilation=0)),
    "max2d_pad_neg": (_X4, lambda f, x: f.max_pool2d(x, 2, padding=-1)),
    "max2d_kernel3": (_X4, lambda f, x: f.max_pool2d(x, (2, 2, 2))),
    "max2d_stride3": (_X4, lambda f, x: f.max_pool2d(x, 2, stride=(1, 2, 3))),
    "max2d_padding3": (_X4, lambda f, x: f.max_pool2d(x, 2, padding=(1, 1, 1))),
    "max2d_dilation3": (_X4, lambda f, x: f.max_pool2d(x, 2, dilation=(1, 1, 1))),
    "max2d_1d_input": ((5,), lambda f, x: f.max_pool2d(x, 2)),
    "max2d_2d_input": ((3, 3), lambda f, x: f.max_pool2d(x, 2)),
    "max2d_5d_input": ((1, 1, 1, 3, 3), lambda f, x: f.max_pool2d(x, 2)),
    "max2d_zero_channels": ((2, 0, 4, 4), lambda f, x: f.max_pool2d(x, 2)),
    "max2d_zero_height": ((2, 2, 0, 4), lambda f, x: f.max_pool2d(x, 2)),
    "max1d_4d": (_X4, lambda f, x: f.max_pool1d(x, 2)),
    "max1d_1d": ((5,), lambda f, x: f.max_pool1d(x, 2)),
    "max1d_stride0": ((1, 2, 5), lambda f, x: f.max_pool1d(x, 2, stride=0)),
    "max1d_kernel0": ((1, 2, 5), lambda f, x: f.max_pool1d(x, 0)),
    "max1d_pad_half": ((1, 2, 5), lambda f, x: f.max_pool1d(x, 2, padding=2)),
    "max1d_too_small": ((1, 2, 5), lambda f, x: f.max_pool1d(x, 6)),
    "max1d_dil0": ((1, 2, 5), lambda f, x: f.max_pool1d(x, 2, dilation=0)),
    "max1d_pad_neg": ((1, 2, 5), lambda f, x: f.max_pool1d(x, 2, padding=-1)),
    "max1d_kernel2": ((1, 2, 5), lambda f, x: f.max_pool1d(x, (2, 2))),
    "max1d_zero_channels": ((2, 0, 5), lambda f, x: f.max_pool1d(x, 2)),
    "max1d_idx_stride0": ((1, 2, 5), lambda f, x: f.max_pool1d(x, 2, stride=0, return_indices=True)),
    "max1d_idx_pad_half": ((1, 2, 5), lambda f, x: f.max_pool1d(x, 2, padding=2, return_indices=True)),
    "max1d_idx_too_small": ((1, 2, 5), lambda f, x: f.max_pool1d(x, 6, return_indices=True)),
    "max1d_idx_dil0": ((1, 2, 5), lambda f, x: f.max_pool1d(x, 2, dilation=0, return_indices=True)),
    "max1d_idx_4d": (_X4, lambda f, x: f.max_pool1d(x, 2, return_indices=True)),
    "max1d_idx_pad_neg": ((1, 2, 5), lambda f, x: f.max_pool1d(x, 2, padding=-1, return_indices=True)),
    "max1d_idx_kernel2": ((1, 2, 5), lambda f, x: f.max_pool1d(x, (2, 2), return_indices=True)),
    "max1d_idx_zero_channels": ((2, 0, 5), lambda f, x: f.max_pool1d(x, 2, return_indices=True)),
    "max3d_too_small": ((1, 2, 4, 4, 4), lambda f, x: f.max_pool3d(x, 5)),
    "max3d_pad_half": ((1, 2, 4, 4, 4), lambda f, x: f.max_pool3d(x, 2, padding=2)),
    "max3d_pad_half_dil": ((1, 2, 4, 4, 4), lambda f, x: f.max_pool3d(x, 3, padding=2, dilation=2)),
    "max3d_dil0": ((1, 2, 4, 4, 4), lambda f, x: f.max_pool3d(x, 2, dilation=0)),
    "max3d_kernel0": ((1, 2, 4, 4, 4), lambda f, x: f.max_pool3d(x, 0, stride=1)),
    "max3d_stride0": ((1, 2, 4, 4, 4), lambda f, x: f.max_pool3d(x, 2, stride=0)),
    "max3d_kernel2": ((1, 2, 4, 4, 4), lambda f, x: f.max_pool3d(x, (2, 2))),
    "max3d_4d_input_bad": ((3, 3, 3), lambda f, x: f.max_pool3d(x, 2)),
    "max3d_6d_input": ((1, 1, 1, 3, 3, 3), lambda f, x: f.max_pool3d(x, 2)),
    "max3d_stride_neg": ((1, 2, 4, 4, 4), lambda f, x: f.max_pool3d(x, 2, stride=-1)),
    "max2d_stride_neg": (_X4, lambda f, x: f.max_pool2d(x, 2, stride=-1)),
    "max2d_kernel_neg": (_X4, lambda f, x: f.max_pool2d(x, -1)),
    "avg2d_stride_neg": (_X4, lambda f, x: f.avg_pool2d(x, 2, stride=-1)),
    "max1d_stride_neg": ((1, 2, 5), lambda f, x: f.max_pool1d(x, 2, stride=-1)),
    "max3d_zero_channels": ((1, 0, 2, 2, 2), lambda f, x: f.max_pool3d(x, 2)),
    "max_kernel_float": (_X4, lambda f, x: f.max_pool2d(x, 2.5)),
    "avg2d_pad_half": (_X4, lambda f, x: f.avg_pool2d(x, 2, padding=2)),
    "avg2d_too_small": (_X4, lambda f, x: f.avg_pool2d(x, 6)),
    "avg2d_kernel0": (_X4, lambda f, x: f.avg_pool2d(x, 0)),
    "avg2d_kernel0_stride1": (_X4, lambda f, x: f.avg_pool2d(x, 0, stride=1)),
    "avg2d_stride0": (_X4, lambda f, x: f.avg_pool2d(x, 2, stride=0)),
    "avg2d_pad_neg": (_X4, lambda f, x: f.avg_pool2d(x, 2, padding=-1)),
    "avg2d_kernel3": (_X4, lambda f, x: f.avg_pool2d(x, (2, 2, 2))),
    "avg2d_divisor0": (_X4, lambda f, x: f.avg_pool2d(x, 2, divisor_override=0)),
    "avg2d_1d_input": ((5,), lambda f, x: f.avg_pool2d(x, 2)),
    "avg2d_2d_input": ((3, 3), lambda f, x: f.avg_pool2d(x, 2)),
    "avg2d_5d_input": ((1, 1, 1, 3, 3), lambda f, x: f.avg_pool2d(x, 2)),
    "avg2d_zero_channels": ((2, 0, 4, 4), lambda f, x: f.avg_pool2d(x, 2)),
    "avg1d_4d": (_X4, lambda f, x: f.avg_pool1d(x, 2)),
    "avg1d_too_small": ((1, 2, 5), lambda f, x: f.avg_pool1d(x, 6)),
    "avg1d_pad_half": ((1, 2, 5), lambda f, x: f.avg_pool1d(x, 2, padding=2)),
    "avg1d_stride0": ((1, 2, 5), lambda f, x: f.avg_pool1d(x, 2, stride=0)),
    "avg1d_kernel0": ((1, 2, 5), lambda f, x: f.avg_pool1d(x, 0, stride=1)),
    "avg1d_pad_neg": ((1, 2, 5), lambda f, x: f.avg_pool1d(x, 2, padding=-1)),
    "avg1d_kernel2": ((1, 2, 5), lambda f, x: f.avg_pool1d(x, (2, 2))),
    "aavg2d_size3": (_X4, lambda f, x: f.adaptive_avg_pool2d(x, (2, 2, 2))),
    "aavg2d_neg": (_X4, lambda f, x: f.adaptive_avg_pool2d(x, -1)),
    "aavg2d_2d_input": ((3, 3), lambda f, x: f.adaptive_avg_pool2d(x, 2)),
    "aavg2d_float_size": (_X4, lambda f, x: f.adaptive_avg_pool2d(x, (2, 2.5))),
    "aavg1d_4d": (_X4, lambda f, x: f.adaptive_avg_pool1d(x, 2)),
    "aavg1d_1d": ((5,), lambda f, x: f.adaptive_avg_pool1d(x, 2)),
    "aavg1d_size2": ((1, 2, 5), lambda f, x: f.adaptive_avg_pool1d(x, (2, 2))),
    "amax2d_size3": (_X4, lambda f, x: f.adaptive_max_pool2d(x, (2, 2, 2))),
    "amax2d_2d_input": ((3, 3), lambda f, x: f.adaptive_max_pool2d(x, 2)),
    "amax2d_zero_channels": ((1, 0, 3, 3), lambda f, x: f.adaptive_max_pool2d(x, 2)),
    "amax2d_unbatched_zero_height": ((3, 0, 3), lambda f, x: f.adaptive_max_pool2d(x, 2)),
    "amax2d_neg_both": (_X4, lambda f, x: f.adaptive_max_pool2d(x, (-1, -2))),
    "amax1d_neg": ((1, 1, 3), lambda f, x: f.adaptive_max_pool1d(x, -2)),
    "amax1d_unbatched_zero_length": ((3, 0), lambda f, x: f.adaptive_max_pool1d(x, 2)),
    "aavg2d_float_later": (_X4, lambda f, x: f.adaptive_avg_pool2d(x, (2, 2, 2.5))),
    "aavg2d_unbatched_zero_height": ((3, 0, 3), lambda f, x: f.adaptive_avg_pool2d(x, 2)),
    "aavg2d_zero_height": ((1, 3, 0, 3), lambda f, x: f.adaptive_avg_pool2d(x, 2)),
    "aavg1d_zero_length": ((2, 2, 0), lambda f, x: f.adaptive_avg_pool1d(x, 2)),
    "max2d_kernel_float_first": (_X4, lambda f, x: f.max_pool2d(x, (2.5, 2))),
    "max2d_kernel_float_second": (_X4, lambda f, x: f.max_pool2d(x, (2, 2.5))),
    "avg2d_kernel_float": (_X4, lambda f, x: f.avg_pool2d(x, 2.5)),
    "pad_float_first": ((1, 1, 3, 3), lambda f, x: f.pad(x, [1.0, 1])),
    "pad_float_third": ((1, 1, 3, 3), lambda f, x: f.pad(x, [1, 1, 1.0, 1])),
    "amax2d_zero_width": ((1, 1, 3, 0), lambda f, x: f.adaptive_max_pool2d(x, 2)),
    "amax2d_neg": (_X4, lambda f, x: f.adaptive_max_pool2d(x, (2, -1))),
    "amax1d_zero_channels": ((2, 0, 5), lambda f, x: f.adaptive_max_pool1d(x, 2)),
    "amax1d_zero_length": ((2, 2, 0), lambda f, x: f.adaptive_max_pool1d(x, 2)),
    "amax1d_float_size": ((2, 2, 5), lambda f, x: f.adaptive_max_pool1d(x, 2.5)),
    "aavg2d_float_first": (_X4, lambda f, x: f.adaptive_avg_pool2d(x, (2.5, 2))),
    "aavg1d_neg": ((2, 2, 5), lambda f, x: f.adaptive_avg_pool1d(x, -2)),
    "amax1d_4d": (_X4, lambda f, x: f.adaptive_max_pool1d(x, 2)),
    "amax1d_1d": ((5,), lambda f, x: f.adaptive_max_pool1d(x, 2)),
    "interp_both": (_X4, lambda f, x: f.interpolate(x, size=2, scale_factor=2)),
    "interp_neither": (_X4, lambda f, x: f.interpolate(x)),
    "interp_size_len": (_X4, lambda f, x: f.interpolate(x, size=(2,))),
    "interp_scale_len": (_X4, lambda f, x: f.interpolate(x, scale_factor=(2.0, 2.0, 2.0))),
    "interp_align_nearest": (_X4, lambda f, x: f.interpolate(x, size=2, align_corners=True)),
    "interp_linear_4d": (_X4, lambda f, x: f.interpolate(x, size=2, mode="linear")),
    "interp_bilinear_3d": ((1, 2, 5), lambda f, x: f.interpolate(x, size=2, mode="bilinear")),
    "interp_trilinear_4d": (_X4, lambda f, x: f.interpolate(x, size=2, mode="trilinear")),
    "interp_trilinear_3d": ((1, 2, 5), lambda f, x: f.interpolate(x, size=2, mode="trilinear")),
    "interp_linear_5d": ((1, 1, 2, 2, 2), lambda f, x: f.interpolate(x, size=2, mode="linear")),
    "interp_bilinear_5d": ((1, 1, 2, 2, 2), lambda f, x: f.interpolate(x, size=2, mode="bilinear")),
    "interp_bicubic_3d": ((1, 2, 5), lambda f, x: f.interpolate(x, size=2, mode="bicubic")),
    "interp_trilinear_size0": ((1, 1, 2, 2, 2), lambda f, x: f.interpolate(x, size=(0, 2, 2), mode="trilinear")),
    "interp_nearest3d_zero_channels": ((1, 0, 2, 2, 2), lambda f, x: f.interpolate(x, size=3)),
    "interp_bicubic_size0": (_X4, lambda f, x: f.interpolate(x, size=(0, 3), mode="bicubic")),
    "interp_2d_input": ((3, 3), lambda f, x: f.interpolate(x, size=2)),
    "interp_bad_mode": (_X4, lambda f, x: f.interpolate(x, size=2, mode="foo")),
    "interp_antialias_nearest": (_X4, lambda f, x: f.interpolate(x, size=2, antialias=True)),
    "interp_recompute_size": (_X4, lambda f, x: f.interpolate(x, size=2, recompute_scale_factor=True)),
    "interp_size0": (_X4, lambda f, x: f.interpolate(x, size=0)),
    "interp_scale_small": (_X4, lambda f, x: f.interpolate(x, scale_factor=0.1)),
    "interp_scale_neg": (_X4, lambda f, x: f.interpolate(x, scale_factor=-1.0)),
    "interp_zero_channels": ((1, 0, 3), lambda f, x: f.interpolate(x, size=2)),
    "interp_linear_zero_channels": ((1, 0, 3), lambda f, x: f.interpolate(x, size=2, mode="linear")),
    "interp_zero_height": ((1, 1, 0, 3), lambda f, x: f.interpolate(x, size=2)),
    "interp_linear_empty_width": ((1, 1, 0), lambda f, x: f.interpolate(x, size=2, mode="linear")),
    "interp_linear_size0": ((1, 1, 3), lambda f, x: f.interpolate(x, size=0, mode="linear")),
    "pad_reflect_too_big": ((1, 1, 3, 3), lambda f, x: f.pad(x, (3, 3, 1, 1), mode="reflect")),
    "pad_reflect_too_big_h": ((1, 1, 3, 3), lambda f, x: f.pad(x, (1, 1, 3, 3), mode="reflect")),
    "pad_reflect_wrong_len": ((1, 1, 3, 3), lambda f, x: f.pad(x, (1, 1), mode="reflect")),
    "pad_reflect_1d_input": ((3,), lambda f, x: f.pad(x, (1, 1), mode="reflect")),
    "pad_reflect_2d_input_len4": ((3, 3), lambda f, x: f.pad(x, (1, 1, 1, 1), mode="reflect")),
    "pad_reflect_zero_channels": ((1, 0, 3, 3), lambda f, x: f.pad(x, (1, 1, 1, 1), mode="reflect")),
    "pad_replicate_zero_height": ((1, 1, 0, 3), lambda f, x: f.pad(x, (1, 1, 1, 1), mode="replicate")),
    "pad_circular_wrap": ((1, 1, 3, 3), lambda f, x: f.pad(x, (4, 1, 1, 1), mode="circular")),
    "pad_circular_wrong_len": ((3, 3), lambda f, x: f.pad(x, (1, 1, 1, 1), mode="circular")),
    "pad_odd": ((1, 1, 3, 3), lambda f, x: f.pad(x, (1,))),
    "pad_too_long": ((1, 1, 3, 3), lambda f, x: f.pad(x, (1,) * 10)),
    "pad_value_reflect": ((1, 1, 3, 3), lambda f, x: f.pad(x, (1, 1), mode="reflect", value=2.0)),
    "pad_value_reflect_zero_wrong_len": ((1, 1, 3, 3), lambda f, x: f.pad(x, (1, 1), mode="reflect", value=0)),
    "amax2d_with_indices_size3": (_X4, lambda f, x: f.adaptive_max_pool2d_with_indices(x, (2, 2, 2))),
    "pad_crop_too_much": ((1, 1, 3, 3), lambda f, x: f.pad(x, (-2, -2))),
    "pad_crop_too_much_one_side": ((1, 1, 3, 3), lambda f, x: f.pad(x, (-4, 1))),
    "pad_bad_mode": ((1, 1, 3, 3), lambda f, x: f.pad(x, (1, 1), mode="foo")),
    "pad_0d": ((), lambda f, x: f.pad(x, (1, 1))),
    "pad_float_entry": ((1, 1, 3, 3), lambda f, x: f.pad(x, [1, 1.0])),
    "shuffle_2d": ((3, 3), lambda f, x: f.pixel_shuffle(x, 2)),
    "shuffle_channels": ((1, 3, 2, 2), lambda f, x: f.pixel_shuffle(x, 2)),
    "shuffle_factor0": ((1, 4, 2, 2), lambda f, x: f.pixel_shuffle(x, 0)),
    "unshuffle_2d": ((4, 4), lambda f, x: f.pixel_unshuffle(x, 2)),
    "unshuffle_height": ((1, 1, 3, 4), lambda f, x: f.pixel_unshuffle(x, 2)),
    "unshuffle_width": ((1, 1, 4, 3), lambda f, x: f.pixel_unshuffle(x, 2)),
    "unshuffle_factor0": ((1, 1, 4, 4), lambda f, x: f.pixel_unshuffle(x, 0)),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_errors(name):
    shape, fn = ERRORS[name]
    x = U.make_pair(shape, kiln.float32)
    U.assert_same_error(lambda: fn(P, x.k), lambda: fn(F, x.t), exact=True)


@pytest.mark.parametrize(
    "fn",
    [
        lambda f, x: f.max_pool2d(x, 2, padding=2),
        lambda f, x: f.interpolate(x, size=2, mode="bilinear"),
        lambda f, x: f.pad(x, (1, 2), mode="reflect"),
    ],
)
def test_errors_raise_before_any_kernel(fn):
    """Validation happens in meta: a bad call on an autograd input records nothing and raises."""
    x = U.make_pair((1, 1, 2, 2), kiln.float32, requires_grad=True)
    try:
        fn(F, x.t)
    except Exception as exc:  # noqa: BLE001
        with pytest.raises(type(exc)):
            fn(P, x.k)
    else:
        U.check_op(lambda L, t: fn(_lib(L), t), x)


@pytest.mark.parametrize(
    "pad,value",
    [((1, 2), 0), ((-1, 1, 2, 0), 2.5), ((1,), 0), ((1,) * 10, 0), ((-2, -2), 0), ((0, 0, -3, 1), 1), ([1.0, 1], 0)],
)
def test_constant_pad_nd(pad, value):
    """The op behind constant ``pad``, also wanted as ``kiln.constant_pad_nd`` (``torch.constant_pad_nd``)."""
    x = U.make_pair((2, 3, 4), kiln.float64, requires_grad=True)
    U.check_op(lambda L, t: (torch.constant_pad_nd if L is torch else P.constant_pad_nd)(t, pad, value), x)
    try:
        torch.constant_pad_nd(x.t, pad, value)
    except (RuntimeError, TypeError):
        U.assert_same_error(lambda: P.constant_pad_nd(x.k, pad, value), lambda: torch.constant_pad_nd(x.t, pad, value))


def test_separable_backward_checks_grad_shape():
    from kiln._ops.separable import _separable_backward

    g = kiln.zeros(1, 1, 3, 3)
    with pytest.raises(RuntimeError, match="grad_output"):
        _separable_backward(g, (1, 1, 4, 4), "avg_pool", ((2, 2), (2, 2), (0, 0), False, True, None))

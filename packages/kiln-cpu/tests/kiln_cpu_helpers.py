"""Shared test helpers (imported by name; conftest puts this folder on sys.path): the reference oracle,
exact and ulp comparisons, and input tensors with special values mixed in."""

from __future__ import annotations

import types

import numpy as np

import kiln
from kiln._ops import (
    classification_loss,
    ctc_loss,
    dropout,
    embedding,
    margin_loss,
    nn_conv,
    normalization,
    regression_loss,
    softmax,
)
from kiln_testing._runner import ReferenceMode

_NN_MODULES = (
    nn_conv,
    classification_loss,
    regression_loss,
    margin_loss,
    ctc_loss,
    softmax,
    normalization,
    embedding,
    dropout,
)
# torch.nn.functional's names for the core's nn primitives (kiln-cpu does not depend on kiln-nn, whose
# kiln.nn.functional re-exports these same functions)
F = types.SimpleNamespace(**{name: getattr(m, name) for m in _NN_MODULES for name in m.__all__})


def reference(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` computed by the NumPy reference kernels."""
    with ReferenceMode():
        return fn(*args, **kwargs)


def assert_same(
    actual: kiln.Tensor, expected: kiln.Tensor, *, ulps: int = 0, atol: float = 0.0, layout: bool = True
) -> None:
    """Same dtype, shape and layout; values equal (NaN where NaN, the sign of zero too), or within
    ``ulps`` units in the last place or ``atol``."""
    assert actual.dtype == expected.dtype
    assert tuple(actual.shape) == tuple(expected.shape)
    # the same memory layout (a transposed result stays transposed): strides of dims longer than 1
    if layout and actual.numel() > 1:
        got = [(n, s) for n, s in zip(actual.shape, actual.stride()) if n > 1]
        assert got == [(n, s) for n, s in zip(expected.shape, expected.stride()) if n > 1]
    a, e = actual.numpy(), expected.numpy()
    if a.dtype.kind not in "fV":
        np.testing.assert_array_equal(a, e)
        return
    nan = np.isnan(e)
    np.testing.assert_array_equal(np.isnan(a), nan)
    a, e = a[~nan], e[~nan]
    if ulps == 0:
        np.testing.assert_array_equal(a.view(_INTS[a.dtype.itemsize]), e.view(_INTS[a.dtype.itemsize]))
    else:
        with np.errstate(invalid="ignore"):  # inf - inf
            far = (ulp_distance(a, e) > ulps) & ~(np.abs(a.astype(np.float64) - e.astype(np.float64)) <= atol)
        assert not far.any(), f"{far.sum()} elements differ: {a[far][:5]} vs {e[far][:5]}"


_INTS = {2: np.int16, 4: np.int32, 8: np.int64}


def assert_product_within_bound(actual: kiln.Tensor, fn, *args: kiln.Tensor) -> None:
    """``actual`` (float32 ``fn(*args)`` for a product ``fn``: matmul, addmm, ...) within the rounding
    bound of a float32 product in any summation order: ``|actual - exact| <= (k + 2) * 2**-24 * (|C| +
    |A| |B|)`` elementwise, with ``exact`` and the magnitudes computed in float64 (k: the length of the
    sums). BLAS libraries pick their kernel, blocking and order by CPU and thread count, so no product
    test may ask for one order's bits."""
    exact = fn(*(a.double() for a in args)).numpy()
    scale = fn(*(a.double().abs() for a in args)).numpy()
    k = max(a.shape[-1] for a in args if a.dim() >= 2)
    bound = (k + 2) * 2.0**-24 * scale
    got = actual.double().numpy()
    assert got.shape == exact.shape
    far = ~(np.abs(got - exact) <= bound)
    assert not far.any(), f"{far.sum()} elements beyond the bound: {got[far][:5]} vs {exact[far][:5]}"


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Units in the last place between two float arrays of one dtype (float16, bfloat16, float32,
    float64; inf is one step past max)."""
    ints = _INTS[a.dtype.itemsize]

    def ordered(x):
        i = x.view(ints).astype(np.int64)
        return np.where(i < 0, np.iinfo(ints).min - i, i)

    return np.abs(ordered(a) - ordered(b))


SPECIALS = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -1e-40, 3.0e38, -3.0e38, 1.0, -1.0, 0.5]


def make(shape, dtype, seed=0, *, positive=False):
    """A contiguous tensor of ``shape``: normals (or ints over the whole range, or random bools) with specials
    mixed in."""
    rng = np.random.default_rng(seed)
    np_dtype = dtype.numpy
    n = int(np.prod(shape))
    if np_dtype.kind == "b":
        x = rng.integers(0, 2, n).astype(bool)
    elif np_dtype.kind in "fV":  # V: bfloat16
        x = rng.standard_normal(n) * rng.choice([1e-3, 1.0, 30.0], n)
        k = min(len(SPECIALS), n // 3)
        pos = rng.choice(n, k, replace=False) if k else []
        x[pos] = SPECIALS[:k]
        if positive:
            x = np.abs(x)
        with np.errstate(over="ignore"):  # 3e38 is inf in float16
            x = x.astype(np_dtype)
    else:
        info = np.iinfo(np_dtype)
        x = rng.integers(-1000, 1000, n).astype(np_dtype)
        if n >= 4:
            x[:4] = [info.min, info.max, -1, 0]
    return kiln.from_numpy(x.reshape(shape).copy())

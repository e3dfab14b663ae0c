"""Hypothesis strategies for kiln tests: shapes, broadcastable shapes, dtypes and strided tensors.

``strided_tensors`` draws the *geometry* (shape, a permutation of the dimensions, a step per dimension,
a storage offset, broadcast dimensions) with hypothesis, so failures shrink to the simplest layout,
and fills the storage from a seeded NumPy generator, so values are cheap and reproducible.

    from hypothesis import given
    from kiln.testing import strategies as kst

    @given(kst.strided_tensors(dtype=kiln.float32, device="example"))
    def test_neg(x):
        kiln.testing.assert_close(kiln.neg(x).cpu(), kiln.neg(x.cpu()))
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import kiln
from kiln.backend import ALL_DTYPES

__all__ = ["shapes", "broadcastable_shapes", "dtypes", "strided_tensors", "host_values"]


def shapes(min_dims: int = 0, max_dims: int = 3, min_side: int = 0, max_side: int = 4) -> st.SearchStrategy:
    """Tensor shapes, 0-d and zero-size dimensions included by default."""
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def broadcastable_shapes(
    num_shapes: int = 2, min_dims: int = 0, max_dims: int = 3, min_side: int = 0, max_side: int = 4
) -> st.SearchStrategy:
    """Tuples of ``num_shapes`` mutually broadcastable shapes, of possibly different ranks."""
    return hnp.mutually_broadcastable_shapes(
        num_shapes=num_shapes, min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side
    ).map(lambda r: r.input_shapes)


def dtypes(*, floating: bool = True, integral: bool = True, boolean: bool = True, device=None) -> st.SearchStrategy:
    """kiln dtypes of the chosen kinds; with ``device``, only those the device type declares."""
    allowed = ALL_DTYPES
    if device is not None:
        from kiln import plugins

        dev = kiln.device(device) if isinstance(device, str) else device
        allowed = tuple(d for d in ALL_DTYPES if d in plugins.devices()[dev.type].dtypes)
    chosen = [
        d
        for d in allowed
        if (d.is_floating_point and floating) or (d is kiln.bool and boolean) or (d in ALL_DTYPES[1:6] and integral)
    ]
    if not chosen:
        raise ValueError("no dtype matches the requested kinds (and the device's declared dtypes)")
    return st.sampled_from(chosen)


def host_values(shape: tuple, dtype: kiln.dtype, seed: int, *, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    """Values of ``dtype`` (as a NumPy array of ``dtype.numpy``) from a seeded generator: bool at
    random, integers in ``[low, high]`` (``[0, 10]`` for uint8), floats uniform in ``[low, high)``."""
    rng = np.random.default_rng(seed)
    if dtype is kiln.bool:
        return rng.random(shape) < 0.5
    if not dtype.is_floating_point:
        lo, hi = (0, 10) if dtype is kiln.uint8 else (int(np.floor(low)), int(np.ceil(high)))
        return rng.integers(lo, hi + 1, size=shape).astype(dtype.numpy)
    return rng.uniform(low, high, size=shape).astype(dtype.numpy)


@st.composite
def strided_tensors(
    draw,
    *,
    dtype: kiln.dtype | st.SearchStrategy = kiln.float32,
    shape: tuple | st.SearchStrategy | None = None,
    device="cpu",
    allow_broadcast: bool = True,
    low: float = -3.0,
    high: float = 3.0,
) -> kiln.Tensor:
    """A tensor on ``device`` that is a view with arbitrary (non-negative) strides over a larger storage.

    Dimensions are laid out in a random order, each with a random step (1 to 3 elements of its own
    extent), behind a random storage offset; with ``allow_broadcast`` some size-1 dimensions are
    expanded (stride 0). The storage is created on the device and the view is taken there, so the
    device's kernels see exactly this geometry. ``dtype`` and ``shape`` may be strategies.
    """
    if isinstance(dtype, st.SearchStrategy):
        dtype = draw(dtype)
    if shape is None:
        shape = draw(shapes())
    elif isinstance(shape, st.SearchStrategy):
        shape = draw(shape)
    shape = tuple(shape)
    nd = len(shape)
    expand = [draw(st.booleans()) if allow_broadcast and n > 1 else False for n in shape]
    inner = tuple(1 if e else n for n, e in zip(shape, expand))
    order = draw(st.permutations(range(nd))) if nd else []
    steps = [draw(st.integers(1, 3)) for _ in range(nd)]
    offset = draw(st.integers(0, 3))
    # Strides: the dimension laid out innermost gets its step; each outer one spans the inner extent.
    strides = [0] * nd
    extent = 1
    for d in reversed(order):
        strides[d] = steps[d] * extent
        extent = strides[d] * max(inner[d], 1)
    if any(n == 0 for n in inner):
        extent = 0
    storage = host_values((offset + max(extent, 1),), dtype, draw(st.integers(0, 2**32 - 1)), low=low, high=high)
    base = kiln.tensor(storage, dtype=dtype, device=device)
    view = base.as_strided(inner, tuple(strides), offset)
    if any(expand):
        view = view.expand(shape)
    return view

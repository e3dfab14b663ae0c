"""Joining and broadcasting tensors, NumPy style: ``broadcast_tensors``, ``atleast_1d``/``2d``/``3d``,
``hstack``, ``vstack`` (``row_stack``), ``dstack``, ``column_stack``, ``block_diag``, ``cartesian_prod`` and
``combinations``.

All are composites of views, ``cat`` and ``index_select``, so autograd and every device come with them.
"""

from __future__ import annotations

import itertools
import numbers

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import check_out_args, write_out
from kiln._ops._meta import broadcast_pair
from kiln._ops.shape import _common_dtype_device, cat, stack
from kiln._ops.views import expand
from kiln._tensor import Tensor

__all__ = [
    "broadcast_tensors",
    "atleast_1d",
    "atleast_2d",
    "atleast_3d",
    "hstack",
    "vstack",
    "row_stack",
    "dstack",
    "column_stack",
    "block_diag",
    "cartesian_prod",
    "combinations",
]

TOP_LEVEL = tuple(sorted(__all__))
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


def _tensor_list(tensors, what: str = "argument 0") -> tuple[Tensor, ...]:
    """The tensors of a ``*tensors`` or list argument, with PyTorch's error for anything else in it."""
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"expected Tensor as element {i} in {what}, but got {type(t).__name__}")
    return tuple(tensors)


def broadcast_tensors(*tensors) -> tuple[Tensor, ...]:
    """Views of ``tensors`` expanded to their common broadcast shape."""
    tensors = _tensor_list(tensors)
    shape: tuple = ()
    for t in tensors:
        shape = broadcast_pair(shape, t._shape)
    return tuple(t if t._shape == shape else expand(t, shape) for t in tensors)


def _atleast(name: str, nd: int, tensors: tuple):
    if len(tensors) == 1 and not isinstance(tensors[0], Tensor):
        if not isinstance(tensors[0], (list, tuple)):
            raise TypeError(
                f"{name}() received an invalid combination of arguments - got ({type(tensors[0]).__name__}), but "
                "expected one of:\n * (Tensor input)\n * (tuple of Tensors tensors)"
            )
        return tuple(_atleast(name, nd, (t,)) for t in _tensor_list(tensors[0]))
    if len(tensors) != 1:
        return tuple(_atleast(name, nd, (t,)) for t in _tensor_list(tensors))
    t = tensors[0]
    d = t.dim()
    if d >= nd:
        return t
    if d == 0:
        return t.reshape((1,) * nd)
    if nd == 2 or d == 2:  # (n,) -> (1, n); (m, n) -> (m, n, 1)
        return t.unsqueeze(0) if nd == 2 else t.unsqueeze(-1)
    return t.unsqueeze(0).unsqueeze(-1)  # (n,) -> (1, n, 1)


def atleast_1d(*tensors):
    """Each tensor viewed with at least one dimension (a 0-d tensor becomes ``(1,)``): one tensor for one
    tensor argument, else a tuple."""
    return _atleast("atleast_1d", 1, tensors)


def atleast_2d(*tensors):
    """Each tensor viewed with at least two dimensions (``()`` -> ``(1, 1)``, ``(n,)`` -> ``(1, n)``): one
    tensor for one tensor argument, else a tuple."""
    return _atleast("atleast_2d", 2, tensors)


def atleast_3d(*tensors):
    """Each tensor viewed with at least three dimensions (``()`` -> ``(1, 1, 1)``, ``(n,)`` -> ``(1, n, 1)``,
    ``(m, n)`` -> ``(m, n, 1)``): one tensor for one tensor argument, else a tuple."""
    return _atleast("atleast_3d", 3, tensors)


def _stack_args(name: str, tensors) -> tuple[Tensor, ...]:
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(
            f"{name}(): argument 'tensors' (position 1) must be tuple of Tensors, not {type(tensors).__name__}"
        )
    tensors = _tensor_list(tensors)
    if not tensors:
        raise RuntimeError(f"{name} expects a non-empty TensorList")
    return tensors


def _joined(name: str, result_fn, tensors, out) -> Tensor:
    tensors = _stack_args(name, tensors)
    if out is None:
        return result_fn(tensors)
    check_out_args(name, (tensors,))
    return write_out(name, result_fn(tensors), out)


def hstack(tensors, *, out=None) -> Tensor:
    """``tensors`` joined column-wise: along dim 0 when they are 1-D (0-d ones count as ``(1,)``), else along
    dim 1."""

    def join(ts):
        ts = atleast_1d(ts)
        return cat(ts, 0 if ts[0].dim() == 1 else 1)

    return _joined("hstack", join, tensors, out)


def vstack(tensors, *, out=None) -> Tensor:
    """``tensors`` joined row-wise: each viewed as at least 2-D (``(n,)`` -> ``(1, n)``), then joined along
    dim 0."""
    return _joined("vstack", lambda ts: cat(atleast_2d(ts), 0), tensors, out)


def row_stack(tensors, *, out=None) -> Tensor:
    """An alias of :func:`vstack`."""
    return _joined("row_stack", lambda ts: cat(atleast_2d(ts), 0), tensors, out)


def dstack(tensors, *, out=None) -> Tensor:
    """``tensors`` joined depth-wise: each viewed as at least 3-D, then joined along dim 2."""
    return _joined("dstack", lambda ts: cat(atleast_3d(ts), 2), tensors, out)


def column_stack(tensors, *, out=None) -> Tensor:
    """``tensors`` joined as columns: 0-d and 1-d tensors become columns ``(n, 1)``, the rest join along dim 1
    as they are."""

    def join(ts):
        return cat([t.reshape(t.numel(), 1) if t.dim() <= 1 else t for t in ts], 1)

    return _joined("column_stack", join, tensors, out)


def block_diag(*tensors) -> Tensor:
    """A matrix with ``tensors`` (each 0-d, 1-d or 2-d, read as ``(1, 1)``, ``(1, n)`` or itself) along its
    diagonal and zeros elsewhere, in their promoted dtype."""
    from kiln._ops.creation import zeros

    tensors = _tensor_list(tensors)
    for i, t in enumerate(tensors):
        if t.dim() > 2:
            raise RuntimeError(
                f"kiln.block_diag: Input tensors must have 2 or fewer dimensions. Input {i} has {t.dim()} dimensions"
            )
    if not tensors:
        return zeros(1, 0)
    dtype, device = _common_dtype_device(tensors)
    blocks = [t.reshape(1, -1) if t.dim() < 2 else t for t in tensors]
    total = sum(b._shape[1] for b in blocks)
    rows, start = [], 0
    for b in blocks:
        r, c = b._shape
        parts = [zeros(r, start, dtype=dtype, device=device), b.to(dtype)]
        parts.append(zeros(r, total - start - c, dtype=dtype, device=device))
        rows.append(cat(parts, 1))
        start += c
    return cat(rows, 0)


def _vector(t: Tensor) -> None:
    if t.dim() != 1:
        raise RuntimeError(f"Expect a 1D vector, but got shape {list(t._shape)}")


def cartesian_prod(*tensors) -> Tensor:
    """The Cartesian product of 1-D tensors of one dtype: one row per combination, ``(n1 * n2 * ..., k)``
    (for one tensor, the tensor itself)."""
    from kiln._ops.creation import meshgrid

    tensors = _tensor_list(tensors)
    if not tensors:
        raise RuntimeError("meshgrid expects a non-empty TensorList")
    for t in tensors:
        _vector(t)
    if len(tensors) == 1:
        return tensors[0]
    if any(t._dtype is not tensors[0]._dtype for t in tensors):
        raise RuntimeError("meshgrid expects all tensors to have the same dtype")
    grids = meshgrid(*tensors, indexing="ij")
    return stack([g.reshape(-1) for g in grids], 1)


def combinations(input: Tensor, r: int = 2, with_replacement: bool = False) -> Tensor:
    """The length-``r`` combinations of the elements of the 1-D ``input`` (as ``itertools.combinations``,
    or ``combinations_with_replacement``), one per row: ``(count, r)``; ``r=0`` gives an empty 1-D tensor."""
    from kiln._ops.copy import from_host
    from kiln._ops.index import index_select

    if not isinstance(input, Tensor):
        raise TypeError(f"combinations(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    if isinstance(r, bool) or not isinstance(r, numbers.Integral):
        raise TypeError(f"combinations(): argument 'r' (position 2) must be int, not {type(r).__name__}")
    _vector(input)
    if r < 0:
        raise RuntimeError(f"Expect a non-negative number, but got {r}")
    if r == 0:
        return input.new_empty((0,))
    pick = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    idx = np.array(list(pick(range(input._shape[0]), int(r))), dtype=np.int64).reshape(-1, int(r))
    flat = from_host(idx.reshape(-1), dt.int64, input._device)
    return index_select(input, 0, flat).reshape(idx.shape)

"""Writes and reads through flat or per-dim indices: ``put``/``put_`` (flat indices), ``index_reduce``/
``index_reduce_`` (``prod``/``mean``/``amax``/``amin`` along a dim), ``Tensor.fill_diagonal_``, and the index
helpers ``argwhere`` and ``unravel_index``.

All are composites of the index ops (``index_put``, ``scatter_reduce``, ``nonzero``) and elementwise
integer arithmetic, so autograd and every device come with them. Index values are data: their bounds are
checked on the host, with PyTorch's messages, before anything is written.
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from kiln import _dtype as dt
from kiln._ops._meta import scalar_type_name, wrap_dim
from kiln._tensor import Tensor, _numel

__all__ = ["put", "index_reduce", "argwhere", "unravel_index"]

TOP_LEVEL = tuple(sorted(__all__))
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


def _host_ints(t: Tensor) -> np.ndarray:
    from kiln._ops.copy import host_array

    return host_array(t.detach()).astype(np.int64).reshape(-1)


# ---------------------------------------------------------------------------------------- put


def _put_checks(self: Tensor, index, source) -> Tensor:
    """PyTorch's checks of ``put_``'s arguments; returns the flat indices, wrapped and bounds-checked."""
    for name, v, pos in (("index", index, 1), ("source", source, 2)):
        if not isinstance(v, Tensor):
            raise TypeError(f"put_(): argument '{name}' (position {pos}) must be Tensor, not {type(v).__name__}")
    if index._dtype is not dt.int64:
        raise RuntimeError(f"put_(): Expected a long tensor for index, but got {scalar_type_name(index._dtype)}")
    if source._dtype is not self._dtype:
        raise RuntimeError(
            "put_(): self and source expected to have the same dtype, but got self.dtype = "
            f"{scalar_type_name(self._dtype)} and source.dtype = {scalar_type_name(source._dtype)}"
        )
    if _numel(source._shape) != _numel(index._shape):
        raise IndexError(
            "put_(): Expected source and index to have the same number of elements, but got source.numel() = "
            f"{_numel(source._shape)}, index.numel() = {_numel(index._shape)}"
        )
    numel = _numel(self._shape)
    if numel == 0 and _numel(index._shape):
        raise IndexError("put_(): Tried to put elements into an empty tensor")
    idx = _host_ints(index)
    bad = (idx < -numel) | (idx >= numel)
    if bad.any():
        raise IndexError(f"out of range: tried to access index {int(idx[bad][0])} on a tensor of {numel} elements.")
    return index.reshape(-1).remainder(max(numel, 1))


def put_(self: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    """Write ``source``'s elements (in row-major order) at the flat, row-major indices ``index`` of this tensor
    (negative indices count from the end); ``accumulate=True`` adds instead, summing repeated indices."""

    flat = _put_checks(self, index, source)
    target = self if self._shape else self.unsqueeze(0)  # a 0-d tensor is written through a 1-element view
    target.index_put_(unravel_index(flat, target._shape), source.reshape(-1), accumulate)
    return self


def put(input: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    """A copy of ``input`` with ``source`` written at the flat indices ``index`` (:meth:`Tensor.put_`)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"put(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    return put_(input.clone(), index, source, accumulate)


# ---------------------------------------------------------------------------------------- index_reduce

_INDEX_REDUCES = ("prod", "mean", "amax", "amin")
_beta_warned = False


def _index_reduce_checks(self: Tensor, dim, index, source, reduce) -> int:
    from kiln._ops.gather_scatter import _INDEX_DTYPES

    global _beta_warned
    if not _beta_warned:  # once per process, as PyTorch's
        _beta_warned = True
        warnings.warn("index_reduce() is in beta and the API may change at any time.", UserWarning, stacklevel=3)
    for name, v, pos in (("index", index, 2), ("source", source, 3)):
        if not isinstance(v, Tensor):
            raise TypeError(
                f"index_reduce(): argument '{name}' (position {pos}) must be Tensor, not {type(v).__name__}"
            )
    if reduce not in _INDEX_REDUCES:
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got {reduce}.")
    d = wrap_dim(dim, self.dim())
    if index._dtype not in _INDEX_DTYPES:
        raise RuntimeError(
            f"index_reduce_(): Expected dtype int32/int64 for index but got: {scalar_type_name(index._dtype)}"
        )
    if index.dim() > 1:
        raise IndexError(
            f"index_reduce_(): Index is supposed to be a vector, but got dim: {index.dim()} with type: "
            f"{scalar_type_name(index._dtype)} and size: {list(index._shape)}"
        )
    n = _numel(index._shape)
    ssize = source._shape[d] if d < source.dim() else 1
    if n != ssize:
        raise RuntimeError(
            f"index_reduce_(): Number of indices ({n}) should be equal to source.size(dim): ({ssize}), for dim: {d}"
        )
    same_rank = source.dim() == self.dim()
    if not same_rank or any(i != d and source._shape[i] != s for i, s in enumerate(self._shape)):
        raise RuntimeError(
            "source tensor shape must match self tensor shape, excluding the specified dimension. Got self.shape = "
            f"{list(self._shape)} source.shape = {list(source._shape)}"
        )
    if source._dtype is not self._dtype:
        raise RuntimeError(
            f"index_reduce_(): self ({scalar_type_name(self._dtype)}) and source ({scalar_type_name(source._dtype)}) "
            "must have the same scalar type"
        )
    if self._dtype is dt.bool:
        raise NotImplementedError("\"index_func_\" not implemented for 'Bool'")
    size = self._shape[d] if self._shape else 1
    idx = _host_ints(index)
    if ((idx < 0) | (idx >= size)).any():
        raise IndexError("index out of range in self")
    return d


def index_reduce(
    input: Tensor, dim: int, index: Tensor, source: Tensor, reduce: str, *, include_self: bool = True
) -> Tensor:
    """A copy of ``input`` where each slice ``source.select(dim, i)`` is combined into the slice ``index[i]`` of
    ``input`` along ``dim`` with ``reduce`` (``"prod"``, ``"mean"``, ``"amax"`` or ``"amin"``); with
    ``include_self=False`` the slices that receive values start from those values alone. Integer means round
    down."""
    from kiln._ops.gather_scatter import scatter_reduce

    if not isinstance(input, Tensor):
        raise TypeError(f"index_reduce(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    d = _index_reduce_checks(input, dim, index, source, reduce)
    if not input._shape:  # 0-d: one slice
        return index_reduce(input.reshape(1), 0, index, source.reshape(1), reduce, include_self=include_self).reshape(
            ()
        )
    view = [1] * source.dim()
    view[d] = -1
    spread = index.to(dt.int64).reshape(view).expand(source._shape)
    return scatter_reduce(input, d, spread, source, reduce, include_self=include_self)


def index_reduce_(self: Tensor, dim: int, index: Tensor, source: Tensor, reduce: str, *, include_self: bool = True):
    """In-place :func:`index_reduce`."""
    from kiln._ops.copy import _check_no_overlap

    _check_no_overlap(self)
    return self.copy_(index_reduce(self, dim, index, source, reduce, include_self=include_self))


# ---------------------------------------------------------------------------------------- fill_diagonal_


def fill_diagonal_(self: Tensor, fill_value, wrap: bool = False) -> Tensor:
    """Set the main diagonal to ``fill_value`` in place: ``(i, i, ..., i)`` for a tensor whose dims are all
    equal, or ``(i, i)`` of a matrix; ``wrap=True`` restarts a tall matrix's diagonal every ``cols + 1`` rows,
    as NumPy's ``fill_diagonal``."""
    from kiln._ops.copy import from_host
    from kiln._ops.creation import _check_fits
    from kiln._state import state

    nd = self.dim()
    if nd < 2:
        raise RuntimeError("dimensions must larger than 1")
    if nd > 2 and any(n != self._shape[0] for n in self._shape):
        raise RuntimeError("all dimensions of input must be of equal length")
    if state.grad_enabled and self._requires_grad and self.grad_fn is None and self._base is None:
        raise RuntimeError("a view of a leaf Variable that requires grad is being used in an in-place operation.")
    n = min(self._shape)
    if nd == 2 and wrap and self._shape[0] > self._shape[1]:
        rows, cols = self._shape
        flat = np.arange(0, rows * cols, cols + 1, dtype=np.int64)
        positions = [flat // cols, flat % cols]
    else:
        positions = [np.arange(n, dtype=np.int64)] * nd
    coords = tuple(from_host(p, dt.int64, self._device) for p in positions)
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    if not isinstance(fill_value, (numbers.Number, np.bool_)):
        raise TypeError(f"fill_diagonal_(): argument 'fill_value' must be Number, not {type(fill_value).__name__}")
    _check_fits(fill_value, self._dtype, len(positions[0]))
    if isinstance(fill_value, complex) and not self._dtype.is_complex:
        fill_value = fill_value.real  # checked to be real above
    value = from_host(np.asarray(fill_value), self._dtype, self._device)  # cast (wrapping) as fill_ casts
    return self.index_put_(coords, value)


# ---------------------------------------------------------------------------------------- index helpers


def argwhere(input: Tensor) -> Tensor:
    """The indices of the nonzero elements of ``input``, one row each (``(count, input.dim())``, int64)."""
    from kiln._ops.index import nonzero

    if not isinstance(input, Tensor):
        raise TypeError(f"argwhere(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    return nonzero(input)


def unravel_index(indices: Tensor, shape) -> tuple[Tensor, ...]:
    """The coordinates (one int64 tensor of ``indices``' shape per dim) that the flat, row-major ``indices``
    address in a tensor of ``shape``; indices outside ``[0, prod(shape))`` wrap around, as PyTorch's do."""
    if not isinstance(indices, Tensor):
        raise TypeError(f"expected 'indices' to be a Tensor, but got {type(indices).__name__}")
    if indices._dtype.is_floating_point or indices._dtype is dt.bool:
        raise TypeError(f"expected 'indices' to be integer dtype, but got kiln.{indices._dtype.name}")
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (int(shape),)
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"expected 'shape' sequence to only contain ints, but got {type(n)}")
    shape = tuple(int(n) for n in shape)
    if any(n < 0 for n in shape):
        raise ValueError(f"'shape' cannot have negative values, but got {shape}")
    if 0 in shape and _numel(indices._shape):
        raise RuntimeError("ZeroDivisionError")
    flat = indices.to(dt.int64)
    out = []
    for i, n in enumerate(shape):
        stride = math.prod(shape[i + 1 :])
        out.append(flat.floor_divide(stride).remainder(n) if n else flat.clone())
    return tuple(out)


Tensor.put_ = put_
Tensor.put = put
Tensor.index_reduce = index_reduce
Tensor.index_reduce_ = index_reduce_
Tensor.fill_diagonal_ = fill_diagonal_
Tensor.argwhere = argwhere

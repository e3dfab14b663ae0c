"""Sorting and searching: ``sort``, ``argsort``, ``msort``, ``topk``, ``kthvalue``, ``searchsorted``,
``bucketize``, ``unique`` and ``unique_consecutive``.
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op, with_out
from kiln._ops._meta import wrap_dim
from kiln._ops.gather_scatter import _zeros, scatter
from kiln._ops.reduction import _return_type, return_types
from kiln._spec import DimSpec, Spec
from kiln._tensor import Tensor

__all__ = ["argsort", "kthvalue", "msort", "sort", "topk", "bucketize", "searchsorted", "unique", "unique_consecutive"]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


# ---------------------------------------------------------------------------------------- sorting


def _sort_meta(input, dim=-1, descending=False, stable=False):
    d = wrap_dim(dim, len(input._shape))
    return (
        DimSpec((input._shape, input._dtype, input._device, d)),
        DimSpec((input._shape, dt.int64, input._device, d)),
    )


def _argsort_np(a: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    if a.dtype == np.bool_:
        a = a.astype(np.uint8)
    elif a.dtype.kind == "f" and a.dtype.itemsize < 4:
        a = a.astype(np.float32)
    if not descending:
        return np.argsort(a, axis=axis, kind="stable")
    # stable descending: sort the reversed array ascending, then reverse (ties keep their order)
    n = a.shape[axis]
    rev = np.argsort(np.flip(a, axis), axis=axis, kind="stable")
    return (n - 1) - np.flip(rev, axis)


def _sort_ref(spec, a, dim=-1, descending=False, stable=False):
    d = spec[0].dim
    if a.ndim == 0:
        return a.copy(), np.zeros((), np.int64)
    idx = _argsort_np(a, d, descending)
    return np.take_along_axis(a, idx, axis=d), idx


def _sort_backward(grads, input_shape, dim, result):
    grad = grads[0]
    if not input_shape:
        return grad
    return scatter(_zeros(input_shape, grad), dim, result[1], grad)


@op(
    tags=("index",),
    meta=_sort_meta,
    reference=_sort_ref,
    backward=_sort_backward,
    num_outputs=2,
    differentiable_outputs=(0,),
    grad_fn_name="SortBackward0",
)
def _sort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> tuple[Tensor, Tensor]:
    """Values sorted along ``dim`` and their original indices (stable)."""


return_types.sort = _return_type("sort")
return_types.topk = _return_type("topk")
return_types.kthvalue = _return_type("kthvalue")


@with_out
def sort(input, dim=-1, descending=False, stable=False):
    """``(values, indices)`` of ``input`` sorted along ``dim`` (ties keep their order; NaN sorts last)."""
    return return_types.sort(*_sort(input, dim, descending, stable))


def argsort(input, dim=-1, descending=False, stable=False):
    """Indices that sort ``input`` along ``dim``."""
    return _sort(input, dim, descending, stable)[1]


@with_out
def msort(input):
    """``input`` sorted along its first dimension."""
    return _sort(input, 0)[0]


def _check_k(input, k, dim, name):
    d = wrap_dim(dim, len(input._shape))
    size = input._shape[d] if input._shape else 1
    return d, size


@with_out
def topk(input, k, dim=-1, largest=True, sorted=True):
    """The ``k`` largest (or smallest) entries along ``dim`` and their indices, as ``(values, indices)``."""
    d, size = _check_k(input, k, dim, "topk")
    if input._dtype is dt.bool:
        raise RuntimeError("topk does not support bool dtypes on CPU")
    if k < 0 or k > size:
        raise RuntimeError("selected index k out of range")
    values, indices = _sort(input, d, largest, True)
    if input._shape:
        values, indices = values.narrow(d, 0, k), indices.narrow(d, 0, k)
    return return_types.topk(values, indices)


@with_out
def kthvalue(input, k, dim=-1, keepdim=False):
    """The ``k``-th smallest entry along ``dim`` and its index, as ``(values, indices)``."""
    d, size = _check_k(input, k, dim, "kthvalue")
    if input._dtype is dt.bool:
        raise NotImplementedError("\"kthvalue_cpu\" not implemented for 'Bool'")
    if k < 1 or k > size:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {d}")
    values, indices = _sort(input, d, False, True)
    if input._shape:
        values, indices = values.narrow(d, k - 1, 1), indices.narrow(d, k - 1, 1)
        if not keepdim:
            values, indices = values.squeeze(d), indices.squeeze(d)
    return return_types.kthvalue(values, indices)


for _fn in (sort, argsort, msort, topk, kthvalue):
    setattr(Tensor, _fn.__name__, _fn)


# ---------------------------------------------------------------------------------------- searchsorted


def _searchsorted_meta(sorted_sequence, input, out_int32=False, right=False, side=None, sorter=None):
    if side is not None and side not in ("left", "right"):
        raise RuntimeError(f"kiln.searchsorted(): side can only be 'left' or 'right' but got {side}")
    if side is not None and (side == "right") != right and right:
        raise RuntimeError(
            f"kiln.searchsorted(): side and right can't be set to opposites, got side of {side} while right was True"
        )
    s, v = sorted_sequence._shape, input._shape
    if len(s) != 1 and (len(s) != len(v) or s[:-1] != v[:-1]):
        raise RuntimeError(
            "kiln.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions of boundaries "
            f"tensor and input value tensor must match, but we got boundaries tensor {list(s)} and input value tensor "
            f"{list(v)}"
        )
    if sorter is not None and sorter._shape != s:
        raise RuntimeError(
            "kiln.searchsorted(): boundary and sorter must have the same size, but got boundary tensor "
            f"{list(s)}and got sorter tensor {list(sorter._shape)}"
        )
    return Spec((v, dt.int32 if out_int32 else dt.int64, input._device))


def _searchsorted_ref(spec, seq, v, out_int32=False, right=False, side=None, sorter=None):
    side = side or ("right" if right else "left")
    if sorter is not None:
        seq = np.take_along_axis(seq, sorter.astype(np.int64), axis=-1)
    common = np.result_type(seq.dtype, v.dtype)
    if common.kind == "f" and common.itemsize < 4:
        common = np.dtype(np.float32)
    seq, v = seq.astype(common), v.astype(common)
    if seq.ndim == 1:
        return np.searchsorted(seq, v, side=side)
    s2, v2 = seq.reshape(-1, seq.shape[-1]), v.reshape(-1, v.shape[-1] if v.ndim else 1)
    out = np.stack([np.searchsorted(a, b, side=side) for a, b in zip(s2, v2)]) if s2.shape[0] else v2.astype(np.int64)
    return out.reshape(spec.shape)


@op(tags=("index",), meta=_searchsorted_meta, reference=_searchsorted_ref)
def searchsorted(
    sorted_sequence: Tensor,
    input: Tensor,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Tensor | None = None,
) -> Tensor:
    """Indices where ``input`` would be inserted into the (last dim of) ``sorted_sequence`` to keep it sorted."""


def bucketize(input, boundaries, *, out_int32=False, right=False):
    """The bucket of each entry of ``input`` among the 1-D sorted ``boundaries`` (``searchsorted`` swapped)."""
    if len(boundaries._shape) != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({len(boundaries._shape)})")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right)


Tensor.bucketize = bucketize

# ---------------------------------------------------------------------------------------- unique


def _host_np(t: Tensor) -> np.ndarray:
    h = t.detach().to("cpu")
    return np.asarray((h.float() if h._dtype is dt.bfloat16 else h).contiguous().numpy())


def _unique_np(a: np.ndarray, consecutive: bool, dim) -> tuple:
    """(values, inverse, counts) of ``a`` flattened (``dim`` None) or of its slices along ``dim``."""
    if dim is None:
        a = a.reshape(-1)
        d = 0
    else:
        d = dim
        if any(size == 0 for i, size in enumerate(a.shape) if i != d):
            raise RuntimeError("There are 0 sized dimensions, and they aren't selected, so unique cannot be applied")
    if not consecutive:
        if dim is None:
            values, inverse, counts = np.unique(a, return_inverse=True, return_counts=True)
        else:
            values, inverse, counts = np.unique(a, axis=d, return_inverse=True, return_counts=True)
        return values, inverse.reshape(-1), counts
    n = a.shape[d]
    if n == 0:
        return a.copy(), np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows = np.moveaxis(a, d, 0).reshape(n, -1)
    start = np.concatenate([[True], np.any(rows[1:] != rows[:-1], axis=1)])
    values = np.take(a, np.flatnonzero(start), axis=d)
    return values, np.cumsum(start) - 1, np.diff(np.append(np.flatnonzero(start), n))


def _unique_meta(input, sorted=True, return_inverse=False, return_counts=False, consecutive=False, dim=None):
    d = None if dim is None else wrap_dim(dim, len(input._shape))
    values, _, counts = _unique_np(_host_np(input), consecutive, d)
    inverse_shape = input._shape if d is None else (input._shape[d] if input._shape else 1,)
    dev = input._device
    return (
        DimSpec((values.shape, input._dtype, dev, d)),
        Spec((inverse_shape, dt.int64, dev)),
        Spec((counts.shape, dt.int64, dev)),
    )


def _unique_ref(spec, a, sorted=True, return_inverse=False, return_counts=False, consecutive=False, dim=None):
    values, inverse, counts = _unique_np(a, consecutive, spec[0].dim)
    return values, inverse.astype(np.int64).reshape(spec[1].shape), counts.astype(np.int64)


@op(tags=("index", "dynamic_shape"), meta=_unique_meta, reference=_unique_ref, num_outputs=3)
def _unique(
    input: Tensor,
    sorted: bool = True,
    return_inverse: bool = False,
    return_counts: bool = False,
    consecutive: bool = False,
    dim: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Unique values (or runs, ``consecutive``) of the flattened input or, with ``dim``, its unique slices
    along ``dim`` (sorted lexicographically); inverse indices and counts."""


def _unique_result(out, return_inverse, return_counts):
    values, inverse, counts = out
    if return_inverse and return_counts:
        return values, inverse, counts
    if return_inverse:
        return values, inverse
    if return_counts:
        return values, counts
    return values


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """The sorted unique values of ``input`` (flattened, or the unique slices along ``dim``), with the
    inverse indices and counts on request."""
    out = _unique(input, sorted, return_inverse, return_counts, False, dim)
    return _unique_result(out, return_inverse, return_counts)


def unique_consecutive(input, return_inverse=False, return_counts=False, dim=None):
    """Collapse runs of equal consecutive values (flattened input) or equal consecutive slices along ``dim``,
    with inverse indices and counts on request."""
    out = _unique(input, True, return_inverse, return_counts, True, dim)
    return _unique_result(out, return_inverse, return_counts)


for _fn in (unique, unique_consecutive):
    setattr(Tensor, _fn.__name__, _fn)

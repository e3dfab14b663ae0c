"""Index-driven ops: ``gather``, ``scatter``/``scatter_add``, ``index_select``, ``index_add``,
``index_fill``, ``masked_fill``, ``take``, and the sorting family ``sort``/``argsort``/``msort``,
``topk`` and ``kthvalue``; plus their in-place variants (``scatter_``, ``index_add_``...).

Index values are data, so out-of-range indices are found by the kernel (with PyTorch's messages);
everything else is checked in the meta functions. Backward formulas are written with these same ops
(``gather`` <-> ``scatter_add``, ``index_select`` <-> ``index_add``), so higher-order gradients work.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import broadcast_shapes, scalar_type_name, wrap_dim
from kiln._ops.copy import inplace_variant
from kiln._ops.elementwise import _compute_np, where
from kiln._ops.reduction import _return_type, return_types
from kiln._tensor import Tensor, _numel

__all__ = [
    "argsort",
    "gather",
    "index_add",
    "index_fill",
    "index_select",
    "kthvalue",
    "masked_fill",
    "msort",
    "scatter",
    "scatter_add",
    "sort",
    "take",
    "topk",
]

_INDEX_DTYPES = (dt.int32, dt.int64)


def _zeros(shape, like: Tensor) -> Tensor:
    from kiln._ops.creation import zeros

    return zeros(shape, dtype=like._dtype, device=like._device)


def _check_bounds(idx: np.ndarray, size: int, dim: int, exc=RuntimeError) -> None:
    bad = (idx < 0) | (idx >= size)
    if bad.any():
        raise exc(f"index {int(idx[bad].flat[0])} is out of bounds for dimension {dim} with size {size}")


def _wrap_bounds(idx: np.ndarray, size: int, dim: int, exc=RuntimeError) -> np.ndarray:
    """Negative indices count from the end (index_select/index_add/index_fill); others raise."""
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        raise exc(f"index {int(idx[bad].flat[0])} is out of bounds for dimension {dim} with size {size}")
    return np.where(idx < 0, idx + size, idx)


# ---------------------------------------------------------------------------------------- gather / scatter


def _check_gather_shapes(name, input, dim, index, src=None):
    nd = max(len(input._shape), 1)
    d = wrap_dim(dim, len(input._shape))
    if index._dtype not in _INDEX_DTYPES:
        raise RuntimeError(f"{name.removesuffix('_add')}(): Expected dtype int32/int64 for index")
    if max(len(index._shape), 1) != nd:
        raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
    if _numel(index._shape) == 0:
        return d
    ishape = index._shape or (1,)
    sshape = input._shape or (1,)
    if isinstance(src, Tensor):
        srcshape = src._shape or (1,)
        if any((i != d and ishape[i] > sshape[i]) or ishape[i] > srcshape[i] for i in range(nd)):
            raise RuntimeError(
                f"Expected index {list(index._shape)} to be no larger than self {list(input._shape)} apart from "
                f"dimension {d} and to be no larger size than src {list(src._shape)}"
            )
    for i in range(nd):
        if i != d and ishape[i] > sshape[i]:
            raise RuntimeError(
                f"Size does not match at dimension {i} expected index {list(index._shape)} to be no larger than "
                f"self {list(input._shape)} apart from dimension {d}"
            )
    return d


def _gather_meta(input, dim, index, sparse_grad=False):
    d = _check_gather_shapes("gather", input, dim, index)
    return (index._shape, input._dtype, input._device, d)


def _nd(a: np.ndarray) -> np.ndarray:
    return a.reshape(1) if a.ndim == 0 else a


def _gather_ref(spec, a, dim, index, sparse_grad=False):
    d = spec[3]
    a1, i1 = _nd(a), _nd(index).astype(np.int64)
    if i1.size == 0:
        return np.empty(spec[0], a.dtype)
    _check_bounds(i1, a1.shape[d], d)
    a1 = a1[tuple(slice(0, s) if k != d else slice(None) for k, s in enumerate(i1.shape))]
    return np.take_along_axis(a1, i1, axis=d).reshape(spec[0])


def _gather_backward(grad, input, dim, index):
    return scatter_add(_zeros(input._shape, grad), dim, index, grad), None


@op(meta=_gather_meta, reference=_gather_ref, backward=_gather_backward, methods=("gather",))
def gather(input: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    """Values of ``input`` at ``index`` along ``dim``: ``out[i][j] = input[i][index[i][j]]`` (dim 1)."""


def _scatter_meta(name):
    def meta(input, dim, index, src=None, value=None):
        if isinstance(src, Tensor):
            d = _check_gather_shapes(name, input, dim, index, src)
            if src._dtype is not input._dtype:
                raise RuntimeError(f"{name.removesuffix('_add')}(): Expected self.dtype to be equal to src.dtype")
        else:
            d = _check_gather_shapes(name, input, dim, index)
        return (input._shape, input._dtype, input._device, d)

    return meta


def _scatter_ref(accumulate):
    def ref(spec, a, dim, index, src=None, value=None):
        d = spec[3]
        compute = _compute_np(spec[1])
        out = _nd(a).astype(compute, copy=True)
        i1 = _nd(index).astype(np.int64)
        if i1.size == 0:
            return out.reshape(spec[0])
        _check_bounds(i1, out.shape[d], d)
        if src is None:
            src = value
        if isinstance(src, np.ndarray):
            s = _nd(src)[tuple(slice(0, n) for n in i1.shape)].astype(compute)
        else:
            s = np.broadcast_to(np.asarray(src).astype(compute), i1.shape)
        pos = list(np.indices(i1.shape, sparse=True))
        pos[d] = i1
        if accumulate:
            np.add.at(out, tuple(pos), s)
        else:
            out[tuple(pos)] = s
        return out.reshape(spec[0])

    return ref


def _scatter_backward(grad, dim, index, needs_input_grad):
    g_src = gather(grad, dim, index) if needs_input_grad[2] else None  # a number src never needs one
    return scatter(grad, dim, index, 0.0) if needs_input_grad[0] else None, None, g_src


def _scatter_add_backward(grad, dim, index, needs_input_grad):
    return grad, None, gather(grad, dim, index) if needs_input_grad[2] else None


@op(
    meta=_scatter_meta("scatter"),
    reference=_scatter_ref(False),
    backward=_scatter_backward,
    methods=("scatter",),
    grad_fn_name=lambda args: "ScatterBackward" + ("0" if isinstance(args[3], Tensor) else "1"),
)
def scatter(input: Tensor, dim: int, index: Tensor, src: Tensor | float | None = None, *, value=None) -> Tensor:
    """A copy of ``input`` with ``src`` (a tensor, or a scalar ``value``) written at ``index`` along ``dim``."""


@op(
    meta=_scatter_meta("scatter_add"),
    reference=_scatter_ref(True),
    backward=_scatter_add_backward,
    methods=("scatter_add",),
)
def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """A copy of ``input`` with ``src`` added at ``index`` along ``dim`` (duplicate indices accumulate)."""


# ---------------------------------------------------------------------------------------- index_*


def _index_select_meta(input, dim, index):
    d = wrap_dim(dim, len(input._shape))
    if index._dtype not in _INDEX_DTYPES:
        raise RuntimeError("index_select(): Expected dtype int32 or int64 for index")
    if len(index._shape) > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    n = _numel(index._shape)
    if not input._shape and n != 1:
        raise RuntimeError(f"index_select(): Index to scalar can have only 1 value, got {n} value(s)")
    shape = input._shape[:d] + (n,) + input._shape[d + 1 :] if input._shape else index._shape
    return (shape, input._dtype, input._device, d)


def _index_select_ref(spec, a, dim, index):
    d = spec[3]
    i = index.reshape(-1).astype(np.int64)
    size = a.shape[d] if a.ndim else 1
    bad = (i < 0) | (i >= size)
    if bad.any():
        if d == 1 and a.ndim >= 2:  # PyTorch's CPU path for dim 1 has a message of its own
            raise RuntimeError(f"INDICES element is out of DATA bounds, id={int(i[bad][0])} axis_dim={size}")
        raise IndexError("index out of range in self")
    if a.ndim == 0:
        return np.broadcast_to(a, spec[0]).copy()
    return np.take(a, i, axis=d)


def _index_select_backward(grad, input_shape, dim, index):
    if not input_shape:
        return (grad.sum() if grad._shape else grad), None
    return index_add(_zeros(input_shape, grad), dim, index, grad), None


@op(meta=_index_select_meta, reference=_index_select_ref, backward=_index_select_backward, methods=("index_select",))
def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    """The entries of ``input`` along ``dim`` at the (1-D) ``index``."""


def _index_add_meta(input, dim, index, source, alpha=1):
    d = wrap_dim(dim, len(input._shape))
    if index._dtype not in _INDEX_DTYPES:
        raise RuntimeError(
            f"index_add_(): Expected dtype int32/int64 for index but got: {scalar_type_name(index._dtype)}"
        )
    if len(index._shape) > 1:
        raise IndexError("index_add_(): Index is supposed to be a vector")
    n = _numel(index._shape)
    if source._shape and d >= len(source._shape):
        raise RuntimeError(
            f"index_add_(): Indexing dim {d} is out of bounds of the source tensor with dim {len(source._shape)}"
        )
    ssize = source._shape[d] if source._shape else 1
    if n != ssize:
        raise RuntimeError(
            f"index_add_(): Number of indices ({n}) should be equal to source.size(dim): ({ssize}), for dim: {d}"
        )
    if (not input._shape and _numel(source._shape) != 1) or (
        input._shape
        and (
            len(source._shape) != len(input._shape)
            or any(i != d and source._shape[i] != s for i, s in enumerate(input._shape))
        )
    ):
        raise RuntimeError(
            "source tensor shape must match self tensor shape, excluding the specified dimension. Got self.shape = "
            f"{list(input._shape)} source.shape = {list(source._shape)}"
        )
    if source._dtype is not input._dtype:
        raise RuntimeError(
            "index_add_(): self ("
            + scalar_type_name(input._dtype)
            + ") and source ("
            + scalar_type_name(source._dtype)
            + ") must have the same scalar type"
        )
    return (input._shape, input._dtype, input._device, d)


def _index_add_ref(spec, a, dim, index, source, alpha=1):
    d = spec[3]
    compute = _compute_np(spec[1])
    out = _nd(a).astype(compute, copy=True)
    i = index.reshape(-1).astype(np.int64)
    _check_bounds(i, out.shape[d], d)
    s = source.astype(compute).reshape(out.shape[:d] + (i.size,) + out.shape[d + 1 :])
    if alpha != 1:
        s = s * np.asarray(alpha).astype(compute)
    pos = [slice(None)] * out.ndim
    pos[d] = i
    np.add.at(out, tuple(pos), s)
    return out.reshape(spec[0])


def _index_add_backward(grad, dim, index, source_shape, alpha, needs_input_grad):
    g = None
    if needs_input_grad[2]:  # the index is read (and so saved) for the source's gradient alone
        g = index_select(grad, dim, index) if grad._shape else grad
        g = (g if alpha == 1 else g * alpha).reshape(source_shape)
    return grad, None, g


@op(meta=_index_add_meta, reference=_index_add_ref, backward=_index_add_backward, methods=("index_add",))
def index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: float = 1) -> Tensor:
    """A copy of ``input`` with ``alpha * source`` added at ``index`` along ``dim`` (duplicates accumulate)."""


def _index_fill_meta(input, dim, index, value):
    d = wrap_dim(dim, len(input._shape))
    if index._dtype is not dt.int64:
        raise IndexError("index_fill_(): Expected dtype int64 for index.")
    if len(index._shape) > 1:
        raise IndexError("Index has to be a vector/scalar")
    return (input._shape, input._dtype, input._device, d)


def _index_fill_ref(spec, a, dim, index, value):
    d = spec[3]
    out = _nd(a).copy()
    i = _wrap_bounds(index.reshape(-1).astype(np.int64), out.shape[d], d, IndexError)
    pos = [slice(None)] * out.ndim
    pos[d] = i
    out[tuple(pos)] = np.asarray(value).astype(_compute_np(spec[1])).astype(out.dtype)
    return out.reshape(spec[0])


def _index_fill_backward(grad, dim, index):
    return index_fill(grad, dim, index, 0.0), None


@op(meta=_index_fill_meta, reference=_index_fill_ref, backward=_index_fill_backward, methods=("index_fill",))
def index_fill(input: Tensor, dim: int, index: Tensor, value: float) -> Tensor:
    """A copy of ``input`` with the entries at ``index`` along ``dim`` set to the scalar ``value``."""


# ---------------------------------------------------------------------------------------- masked_fill / take


_OVERFLOW_NAMES = {
    dt.uint8: "uint8_t",
    dt.int8: "int8_t",
    dt.int16: "int16_t",
    dt.int32: "int",
    dt.int64: "int64_t",
    dt.float16: "c10::Half",
    dt.bfloat16: "c10::BFloat16",
    dt.float32: "float",
}


def _check_scalar_fits(value, d: dt.dtype) -> None:
    """PyTorch's ``checked_convert``: a Python scalar out of the dtype's range is an error (c10 rules)."""
    if d is dt.bool or isinstance(value, bool) or d not in _OVERFLOW_NAMES or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return
    if d.is_floating_point:
        info = np.finfo(np.float32 if d is dt.float32 else d.numpy)
        bad = d is not dt.float64 and (value < float(info.min) or value > float(info.max))
    else:
        info = np.iinfo(d.numpy)
        if isinstance(value, int) and info.min == 0:  # unsigned from a signed integer: |value| <= max
            bad = value > info.max or (value < 0 and -value > info.max)
        else:
            bad = value < info.min or value > info.max
    if bad:
        raise RuntimeError(f"value cannot be converted to type {_OVERFLOW_NAMES[d]} without overflow")


def _masked_fill_meta(input, mask, value):
    if mask._dtype is not dt.bool:
        raise RuntimeError(
            f"masked_fill_ only supports boolean masks, but got mask with dtype {dt.CPP_TYPE_NAMES[mask._dtype]}"
        )
    _check_scalar_fits(value, input._dtype)
    if isinstance(value, Tensor) and value._shape:
        raise RuntimeError(
            "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
            f"{len(value._shape)} dimension(s)."
        )
    return (broadcast_shapes(input._shape, mask._shape), input._dtype, input._device)


def _masked_fill_ref(spec, a, mask, value):
    v = value if isinstance(value, np.ndarray) else np.asarray(value)
    if v.dtype.kind in "iub" and a.dtype.kind in "iu":
        v = v.astype(np.int64).astype(a.dtype)  # integers wrap (-1 -> 255 for uint8), as in PyTorch
    else:
        v = v.astype(_compute_np(spec[1])).astype(a.dtype)
    return np.where(mask, v, a)


def _masked_fill_backward(grad, mask, value):
    g_value = where(mask, grad, 0.0).sum() if isinstance(value, Tensor) else None
    return where(mask, 0.0, grad), None, g_value


@op(meta=_masked_fill_meta, reference=_masked_fill_ref, backward=_masked_fill_backward, methods=("masked_fill",))
def masked_fill(input: Tensor, mask: Tensor, value: Tensor | float) -> Tensor:
    """A copy of ``input`` with ``value`` where the boolean ``mask`` (broadcast) is True."""


def _take_meta(input, index):
    if index._dtype is not dt.int64:
        raise RuntimeError(f"take(): Expected a long tensor for index, but got {scalar_type_name(index._dtype)}")
    return (index._shape, input._dtype, input._device)


def _take_ref(spec, a, index):
    n = a.size
    i = index.astype(np.int64)
    bad = (i < -n) | (i >= n)
    if bad.any():
        raise IndexError(f"out of range: tried to access index {int(i[bad].flat[0])} on a tensor of {n} elements.")
    return a.reshape(-1)[np.where(i < 0, i + n, i)].reshape(spec[0])


def _take_backward(grad, input, index):
    n = _numel(input._shape)
    flat = where(index < 0, index + n, index).reshape(-1)
    return scatter_add(_zeros((n,), grad), 0, flat, grad.reshape(-1)).reshape(input._shape), None


@op(meta=_take_meta, reference=_take_ref, backward=_take_backward, methods=("take",))
def take(input: Tensor, index: Tensor) -> Tensor:
    """``input`` as if flattened, at ``index`` (int64; negative counts from the end); shaped like ``index``."""


# ---------------------------------------------------------------------------------------- sorting


def _sort_meta(input, dim=-1, descending=False, stable=False):
    d = wrap_dim(dim, len(input._shape))
    return ((input._shape, input._dtype, input._device, d), (input._shape, dt.int64, input._device, d))


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
    d = spec[0][3]
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


def sort(input, dim=-1, descending=False, stable=False):
    """``(values, indices)`` of ``input`` sorted along ``dim`` (ties keep their order; NaN sorts last)."""
    return return_types.sort(*_sort(input, dim, descending, stable))


def argsort(input, dim=-1, descending=False, stable=False):
    """Indices that sort ``input`` along ``dim``."""
    return _sort(input, dim, descending, stable)[1]


def msort(input):
    """``input`` sorted along its first dimension."""
    return _sort(input, 0)[0]


def _check_k(input, k, dim, name):
    d = wrap_dim(dim, len(input._shape))
    size = input._shape[d] if input._shape else 1
    return d, size


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

# ---------------------------------------------------------------------------------------- in place

for _fn, _needs_self in (
    (scatter, False),
    (scatter_add, False),
    (index_add, False),
    (index_fill, False),
    (masked_fill, False),
):
    _name = f"{_fn.op.name}_"
    setattr(Tensor, _name, inplace_variant(_fn, _name, f"In-place version of :func:`kiln.{_fn.op.name}`.", _needs_self))

# ---------------------------------------------------------------------------------------- index_copy


def _index_copy_meta(input, dim, index, source):
    d = wrap_dim(dim, len(input._shape))
    if index._dtype is not dt.int64:
        raise RuntimeError(f"index_copy_(): Expected a long tensor for index, but got {scalar_type_name(index._dtype)}")
    if len(index._shape) > 1:
        raise IndexError("index_copy_(): Index should have dimension 1 or 0 (got 2)")
    if source._dtype is not input._dtype:
        raise RuntimeError(
            "index_copy_(): self and source expected to have the same dtype, but got (self) "
            f"{scalar_type_name(input._dtype)} and (source) {scalar_type_name(source._dtype)}"
        )
    n = _numel(index._shape)
    expect = input._shape[:d] + (n,) + input._shape[d + 1 :] if input._shape else index._shape
    if _numel(source._shape) != _numel(expect) or (source._shape and input._shape and source._shape != expect):
        raise RuntimeError(
            f"index_copy_(): Source/destination tensor must have same slice shapes. Destination slice shape: "
            f"{list(input._shape)} at dimension {d} and source slice shape: {list(source._shape)} at dimension {d}."
        )
    return (input._shape, input._dtype, input._device, d)


def _index_copy_ref(spec, a, dim, index, source):
    d = spec[3]
    out = _nd(a).copy()
    i = index.reshape(-1).astype(np.int64)
    size = out.shape[d]
    bad = (i < 0) | (i >= size)
    if bad.any():
        raise IndexError(f"index_copy_(): index {int(i[bad][0])} is out of bounds for dimension {d} with size {size}")
    pos = [slice(None)] * out.ndim
    pos[d] = i
    out[tuple(pos)] = source.reshape(out.shape[:d] + (i.size,) + out.shape[d + 1 :])
    return out.reshape(spec[0])


def _index_copy_backward(grad, dim, index, source_shape):
    g_src = index_select(grad, dim, index) if grad._shape else grad
    return index_fill(grad, dim, index, 0.0), None, g_src.reshape(source_shape)


@op(meta=_index_copy_meta, reference=_index_copy_ref, backward=_index_copy_backward, methods=("index_copy",))
def index_copy(input: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """A copy of ``input`` with the slices of ``source`` written at ``index`` along ``dim``."""


# ---------------------------------------------------------------------------------------- data-dependent sizes


def _count(t: Tensor) -> int:
    """Number of nonzero entries: the one host sync these ops need to know their output size (as PyTorch)."""
    from kiln._ops.scans import count_nonzero

    return int(count_nonzero(t.to("cpu")).item())  # counted on the host, so a device lacking the op is not blamed


def _nonzero_meta(input):
    return ((_count(input), len(input._shape)), dt.int64, input._device)


def _nonzero_ref(spec, a):
    return np.argwhere(a).astype(np.int64).reshape(spec[0])


@op(meta=_nonzero_meta, reference=_nonzero_ref)
def _nonzero(input: Tensor) -> Tensor:
    """Indices of the nonzero entries, one row per entry."""


def nonzero(input, *, as_tuple=False):
    """Indices of the nonzero entries: an ``(n, ndim)`` int64 tensor, or (``as_tuple``) one 1-D tensor per dim."""
    idx = _nonzero(input)
    if not as_tuple:
        return idx
    if not input._shape:
        return (_nonzero(input.reshape(1)).reshape(-1),)
    return tuple(idx[:, i] for i in range(len(input._shape)))


def _masked_select_meta(input, mask):
    if mask._dtype is not dt.bool:
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    shape = broadcast_shapes(input._shape, mask._shape)
    return ((_count(mask.expand(shape)),), input._dtype, input._device, shape)


def _masked_select_ref(spec, a, mask):
    shape = spec[3]
    return np.broadcast_to(a, shape)[np.broadcast_to(mask, shape)]


def _masked_select_backward(grad, input_shape, mask):
    shape = broadcast_shapes(input_shape, mask._shape)
    n = _numel(shape)
    pos = _nonzero(mask.expand(shape).reshape(-1)).reshape(-1)
    return index_add(_zeros((n,), grad), 0, pos, grad).reshape(shape), None


@op(
    meta=_masked_select_meta, reference=_masked_select_ref, backward=_masked_select_backward, methods=("masked_select",)
)
def masked_select(input: Tensor, mask: Tensor) -> Tensor:
    """The entries of ``input`` where the boolean ``mask`` (broadcast) is True, as a 1-D tensor."""


def _bincount_meta(input, weights=None, minlength=0):
    if input._dtype.is_floating_point or input._dtype is dt.bool:
        raise NotImplementedError(f"\"bincount_cpu\" not implemented for '{scalar_type_name(input._dtype)}'")
    if len(input._shape) != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is not None and (len(weights._shape) != 1 or weights._shape[0] != input._shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    n = input._shape[0]
    if n:
        from kiln._ops.reduction import amax, amin

        host = input.to("cpu")
        if int(amin(host).item()) < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        length = max(int(amax(host).item()) + 1, minlength)
    else:
        length = minlength
    if weights is None:
        d = dt.int64
    else:
        d = weights._dtype if weights._dtype is dt.float32 else dt.float64
    return ((length,), d, input._device)


def _bincount_ref(spec, a, weights=None, minlength=0):
    w = None if weights is None else weights.astype(np.float64)
    return np.bincount(a.astype(np.int64), w, minlength=spec[0][0])[: spec[0][0]]


@op(meta=_bincount_meta, reference=_bincount_ref, methods=("bincount",))
def bincount(input: Tensor, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
    """Count of each value in the non-negative 1-D integer ``input`` (or the sum of its ``weights``)."""


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
    return (v, dt.int32 if out_int32 else dt.int64, input._device)


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
    return out.reshape(spec[0])


@op(meta=_searchsorted_meta, reference=_searchsorted_ref)
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


# ---------------------------------------------------------------------------------------- composites


def take_along_dim(input, indices, dim=None):
    """``gather`` with broadcasting of ``input`` and ``indices`` (or, without ``dim``, on the flattened input)."""
    if indices._dtype is not dt.int64:
        raise RuntimeError(
            f"kiln.take_along_dim(): dtype of indices should be Long but got {scalar_type_name(indices._dtype)}"
        )
    if dim is None:
        return gather(input.view(-1), 0, indices.reshape(-1))  # a view, as PyTorch (non-contiguous input raises)
    nd = len(input._shape)
    if nd != len(indices._shape):
        raise RuntimeError(
            "kiln.take_along_dim(): input and indices should have the same number of dimensions, "
            f"but got {nd} dimensions for input, and {len(indices._shape)} dimensions for indices"
        )
    d = wrap_dim(dim, nd)
    ishape = list(input._shape)
    xshape = list(indices._shape)
    ishape[d] = xshape[d] = 1
    b = list(broadcast_shapes(tuple(ishape), tuple(xshape)))
    bi, bx = list(b), list(b)
    bi[d], bx[d] = input._shape[d], indices._shape[d]
    return gather(input.expand(tuple(bi)), d, indices.expand(tuple(bx)))


def meshgrid(*tensors, indexing=None):
    """Coordinate grids from 1-D tensors (``indexing="ij"``: matrix order; ``"xy"``: first two dims swapped)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing is None:
        import warnings

        warnings.warn(
            "kiln.meshgrid: in an upcoming release, it will be required to pass the indexing argument.",
            UserWarning,
            stacklevel=2,
        )
        indexing = "ij"
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f'kiln.meshgrid: indexing must be one of "xy" or "ij", but received: {indexing}')
    if not tensors:
        raise RuntimeError("kiln.meshgrid: Expected at least one tensor")
    for t in tensors:
        if len(t._shape) > 1:
            raise RuntimeError("kiln.meshgrid: Expected 0D or 1D tensor in the tensor list")
    ts = [t.reshape(-1) for t in tensors]
    swap = indexing == "xy" and len(ts) >= 2
    if swap:
        ts[0], ts[1] = ts[1], ts[0]
    shape = tuple(t._shape[0] for t in ts)
    n = len(ts)
    out = [t.reshape((1,) * i + (-1,) + (1,) * (n - i - 1)).expand(shape) for i, t in enumerate(ts)]
    if swap:
        out[0], out[1] = out[1], out[0]
    return tuple(out)


for _fn in (nonzero, bucketize, take_along_dim):
    setattr(Tensor, _fn.__name__, _fn)
_name = "index_copy_"
setattr(Tensor, _name, inplace_variant(index_copy, _name, "In-place version of :func:`kiln.index_copy`.", False))
__all__ += [
    "bincount",
    "bucketize",
    "index_copy",
    "masked_select",
    "meshgrid",
    "nonzero",
    "searchsorted",
    "take_along_dim",
]

# ---------------------------------------------------------------------------------------- scatter_reduce

_REDUCES = ("sum", "prod", "mean", "amax", "amin")


def _scatter_reduce_meta(input, dim, index, src, reduce, include_self=True):
    if reduce not in _REDUCES:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    return _scatter_meta("scatter_reduce")(input, dim, index, src)


def _scatter_reduce_ref(spec, a, dim, index, src, reduce, include_self=True):
    d = spec[3]
    compute = _compute_np(spec[1])
    out = _nd(a).astype(compute, copy=True)
    i1 = _nd(index).astype(np.int64)
    if i1.size == 0:
        return out.reshape(spec[0])
    _check_bounds(i1, out.shape[d], d)
    s = _nd(src)[tuple(slice(0, n) for n in i1.shape)].astype(compute)
    pos = list(np.indices(i1.shape, sparse=True))
    pos[d] = i1
    pos = tuple(pos)
    hit = np.zeros(out.shape, np.int64)
    np.add.at(hit, pos, 1)
    if not include_self:
        if reduce in ("sum", "mean"):
            ident = 0
        elif reduce == "prod":
            ident = 1
        elif compute.kind == "f":
            ident = -np.inf if reduce == "amax" else np.inf
        else:
            info = np.iinfo(compute) if compute.kind in "iu" else None
            ident = (info.min if reduce == "amax" else info.max) if info else (reduce == "amin")
        out[hit > 0] = ident
    ufunc = {"sum": np.add, "mean": np.add, "prod": np.multiply, "amax": np.maximum, "amin": np.minimum}[reduce]
    ufunc.at(out, pos, s)
    if reduce == "mean":
        n = np.maximum(hit + (1 if include_self else 0), 1).astype(compute)
        out = out / n if compute.kind == "f" else np.floor_divide(out, n.astype(compute))
    return out.reshape(spec[0])


def _scatter_reduce_backward(grad, input, dim, index, src, reduce, include_self, result):
    from kiln._ops.creation import ones

    hits = scatter_add(
        _zeros(input._shape, grad), dim, index, ones(index._shape, dtype=grad._dtype, device=grad.device)
    )
    scattered = hits > 0
    if reduce == "sum":
        return (grad if include_self else where(scattered, 0.0, grad)), None, gather(grad, dim, index)
    if reduce == "mean":
        n = (hits + 1 if include_self else hits).clamp_min(1)
        g = grad / n
        return (g if include_self else where(scattered, 0.0, grad)), None, gather(g, dim, index)
    if reduce == "prod":
        # d(product)/d(element) is the product of the others: result / element for a non-zero element; for a
        # zero, the product of the group's non-zero elements if it is the group's only zero, else 0
        z_self, z_src = input == 0, src == 0
        zeros = scatter_add(
            z_self.to(grad._dtype) if include_self else _zeros(input._shape, grad), dim, index, z_src.to(grad._dtype)
        )
        nonzero_prod = scatter_reduce(
            where(z_self, 1.0, input), dim, index, where(z_src, 1.0, src), "prod", include_self=include_self
        )
        lone_zero = where(zeros == 1, nonzero_prod, 0.0)
        d_self = where(z_self, lone_zero, result / where(z_self, 1.0, input))
        d_src = where(z_src, gather(lone_zero, dim, index), gather(result, dim, index) / where(z_src, 1.0, src))
        g_self = where(scattered, grad * d_self, grad) if include_self else where(scattered, 0.0, grad)
        return g_self, None, gather(grad, dim, index) * d_src
    # amax / amin: the gradient is shared evenly among the entries equal to the result (PyTorch's formula)
    self_is = input == result
    src_is = src == gather(result, dim, index)
    count = scatter_add(self_is.to(grad._dtype), dim, index, src_is.to(grad._dtype))
    g = grad / count
    g_self = where(self_is, g, 0.0)
    if not include_self:
        g_self = where(scattered, 0.0, g_self)
    return g_self, None, where(src_is, gather(g, dim, index), 0.0)


@op(
    meta=_scatter_reduce_meta,
    reference=_scatter_reduce_ref,
    backward=_scatter_reduce_backward,
    methods=("scatter_reduce",),
    grad_fn_name="ScatterReduceBackward0",
)
def scatter_reduce(
    input: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *, include_self: bool = True
) -> Tensor:
    """A copy of ``input`` with ``src`` reduced (sum, prod, mean, amax, amin) into it at ``index`` along ``dim``."""


Tensor.scatter_reduce_ = inplace_variant(
    scatter_reduce, "scatter_reduce_", "In-place version of :func:`kiln.scatter_reduce`.", True
)

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
    return (values.shape, input._dtype, dev, d), (inverse_shape, dt.int64, dev), (counts.shape, dt.int64, dev)


def _unique_ref(spec, a, sorted=True, return_inverse=False, return_counts=False, consecutive=False, dim=None):
    values, inverse, counts = _unique_np(a, consecutive, spec[0][3])
    return values, inverse.astype(np.int64).reshape(spec[1][0]), counts.astype(np.int64)


@op(meta=_unique_meta, reference=_unique_ref, num_outputs=3)
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
__all__ += ["scatter_reduce", "unique", "unique_consecutive"]

# ---------------------------------------------------------------------------------------- repeat_interleave


def _repeat_index(repeats: Tensor | int, size: int, device) -> Tensor:
    """The index that repeats each of ``size`` positions ``repeats`` (an int or one count per position) times."""
    from kiln._ops.creation import tensor

    if isinstance(repeats, Tensor):
        if repeats._dtype.is_floating_point or repeats._dtype is dt.bool:
            raise NotImplementedError(
                f"\"repeat_interleave_cpu\" not implemented for '{scalar_type_name(repeats._dtype)}'"
            )
        if len(repeats._shape) > 1:
            raise RuntimeError("repeats must be 0-dim or 1-dim tensor")
        counts = _host_np(repeats).astype(np.int64).reshape(-1)
        if counts.size == 1:
            counts = np.full(size, counts[0])
        elif counts.size != size:
            raise RuntimeError(
                "repeats must have the same size as input along dim, but got repeats.size(0) = "
                f"{counts.size} and input.size(0) = {size}"
            )
        if (counts < 0).any():
            raise RuntimeError("repeats can not be negative")
    else:
        if repeats < 0:
            raise RuntimeError("Repeats must be non-negative")
        counts = np.full(size, int(repeats))
    return tensor(np.repeat(np.arange(size, dtype=np.int64), counts), device=device)


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
    """Each element (or each slice along ``dim``) of ``input`` repeated ``repeats`` times in place, as
    ``torch.repeat_interleave``; ``dim=None`` flattens first. ``repeats`` is an int or a tensor of counts.
    With ``input`` alone (a 1-D count tensor) it returns the repeated positions ``0, 0, 1, ...``."""
    if repeats is None:
        if not isinstance(input, Tensor) or len(input._shape) > 1:
            raise RuntimeError("repeats must be 0-dim or 1-dim tensor")
        n = input._shape[0] if input._shape else 1
        return _repeat_index(input.reshape(-1), n, input._device)
    x = input.reshape(-1) if dim is None else input
    d = 0 if dim is None else wrap_dim(dim, len(x._shape))
    if not x._shape:
        x = x.reshape(1)
    idx = _repeat_index(repeats, x._shape[d], x._device)
    if output_size is not None and output_size != idx._shape[0]:
        raise RuntimeError(
            f"repeat_interleave: output_size {output_size} does not match the repeats' total {idx._shape[0]}"
        )
    return index_select(x, d, idx)


Tensor.repeat_interleave = repeat_interleave
__all__ += ["repeat_interleave"]

# ---------------------------------------------------------------------------------------- histc

__all__ += ["histc"]


def _histc_meta(input, bins=100, min=0, max=0):
    if not input._dtype.is_floating_point:
        raise NotImplementedError(f"\"histogram_cpu\" not implemented for '{scalar_type_name(input._dtype)}'")
    if bins <= 0:
        raise RuntimeError(f"kiln.histogram(): bins must be > 0, but got {bins} for dimension 0")
    if min > max:
        raise RuntimeError("kiln.histc: max must be larger than min")
    return ((bins,), input._dtype, input._device)


def _histc_ref(spec, a, bins=100, min=0, max=0):
    compute = _compute_np(spec[1])
    x = a.reshape(-1).astype(compute)
    lo, hi = compute.type(min), compute.type(max)
    if lo == hi and x.size:
        lo, hi = x.min(), x.max()
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    x = x[(x >= lo) & (x <= hi)]
    pos = ((x - lo) * bins / (hi - lo)).astype(np.int64)
    pos = np.minimum(pos, bins - 1)
    return np.bincount(pos, minlength=bins).astype(compute)


@op(meta=_histc_meta, reference=_histc_ref, methods=("histc",))
def histc(input: Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:
    """Histogram of ``input`` in ``bins`` equal bins over ``[min, max]`` (the data's range when both are 0)."""


# ---------------------------------------------------------------------------------------- index / index_put

_INDEX_TENSOR_DTYPES = (dt.int64, dt.int32, dt.uint8, dt.bool)


def _check_indices(input, indices) -> tuple:
    """The indexing result's shape (computed on the host: boolean masks make it data-dependent).

    ``indices`` holds index tensors (integer, or boolean masks covering as many dims as they have) and
    ``None`` for a dim kept whole, as PyTorch's ``index``/``index_put`` take them."""
    if not isinstance(indices, (list, tuple)) or not all(i is None or isinstance(i, Tensor) for i in indices):
        raise TypeError("index_put(): indices must be a tuple of Tensors (or None for a whole dim)")
    nd = len(input._shape)
    for i in indices:
        if i is not None and i._dtype not in _INDEX_TENSOR_DTYPES:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    ndim = sum(1 if i is None or i._dtype not in (dt.bool, dt.uint8) else max(len(i._shape), 1) for i in indices)
    if ndim > nd:
        raise IndexError(f"too many indices for tensor of dimension {nd} (got {ndim})")
    shapes, d, mask_at = [], 0, None
    for i in indices:
        if i is None:
            d += 1
            continue
        if i._dtype not in (dt.bool, dt.uint8):
            shapes.append(list(i._shape))
            d += 1
            continue
        width = max(len(i._shape), 1)
        for j, size in enumerate(i._shape):
            if size != input._shape[d + j]:
                raise IndexError(
                    f"The shape of the mask {list(i._shape)} at index {j} does not match the shape of the indexed "
                    f"tensor {list(input._shape)} at index {d + j}"
                )
        shapes.extend([[int(np.count_nonzero(_host_np(i)))]] * width)
        mask_at = (d, width) if i._shape else None  # a 0-d mask adds a dim and consumes none
        d += width
    try:
        broadcast_shapes(*[tuple(s) for s in shapes])
    except RuntimeError:
        raise IndexError(
            "shape mismatch: indexing tensors could not be broadcast together with shapes "
            + ", ".join(str(s) for s in shapes)
        ) from None
    if mask_at is not None and sum(i is not None for i in indices) == 1:  # one mask: its count replaces its dims
        d, width = mask_at
        return input._shape[:d] + (shapes[0][0],) + input._shape[d + width :]
    dummy = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), shape=input._shape, strides=(0,) * nd)
    return dummy[_np_key([None if i is None else _host_np(i) for i in indices], input._shape)].shape


def _np_key(indices: list, shape: tuple) -> tuple:
    """NumPy's key for PyTorch's index tuple (``None``: a whole dim), with PyTorch's out-of-range messages
    (which number a dim by its place among the index tensors, as PyTorch moves those dims to the front)."""
    key, d = [], 0
    for i in indices:
        if i is None:
            key.append(slice(None))
            d += 1
            continue
        if isinstance(i, Tensor):  # list items may arrive unconverted
            i = i._numpy()
        if i.dtype in (np.bool_, np.uint8):
            i = i.astype(bool)
            key.append(i)
            d += max(i.ndim, 1)
            continue
        i = i.astype(np.int64)
        size = shape[d]
        bad = (i < -size) | (i >= size)
        if bad.any():
            place = sum(1 for k in key if not isinstance(k, slice))
            raise IndexError(f"index {int(i[bad].flat[0])} is out of bounds for dimension {place} with size {size}")
        key.append(i)
        d += 1
    return tuple(key)


def _index_meta(input, indices):
    return (_check_indices(input, indices), input._dtype, input._device)


def _index_ref(spec, a, indices):
    return np.asarray(a[_np_key(list(indices), a.shape)]).reshape(spec[0])


def _index_backward(grad, input_shape, indices):
    return index_put(_zeros(input_shape, grad), indices, grad, True), None


@op(meta=_index_meta, reference=_index_ref, backward=_index_backward, grad_fn_name="IndexBackward0")
def _index(input: Tensor, indices: Sequence[Tensor]) -> Tensor:
    """``input[indices]`` for a tuple of integer/boolean index tensors (advanced indexing from dim 0)."""


def _index_put_meta(input, indices, values, accumulate=False):
    shape = _check_indices(input, indices)
    if values._dtype is not input._dtype:
        raise RuntimeError(
            "Index put requires the source and destination dtypes match, got "
            f"{scalar_type_name(input._dtype)} for the destination and {scalar_type_name(values._dtype)} for the "
            "source."
        )
    try:
        if broadcast_shapes(values._shape, shape) != shape:
            raise RuntimeError
    except RuntimeError:
        raise RuntimeError(
            f"shape mismatch: value tensor of shape {list(values._shape)} cannot be broadcast to indexing result of "
            f"shape {list(shape)}"
        ) from None
    return (input._shape, input._dtype, input._device, shape)


def _index_put_ref(spec, a, indices, values, accumulate=False):
    compute = _compute_np(spec[1])
    out = a.astype(compute, copy=True)
    key = _np_key(list(indices), a.shape)
    v = np.broadcast_to(values.astype(compute), spec[3])
    if accumulate:
        np.add.at(out, key, v)
    else:
        out[key] = v
    return out


def _index_put_backward(grad, indices, values, accumulate):
    g_self = grad if accumulate else index_put(grad, indices, _zeros((), grad), False)
    return g_self, None, _index(grad, indices)


@op(meta=_index_put_meta, reference=_index_put_ref, backward=_index_put_backward, methods=("index_put",))
def index_put(input: Tensor, indices: Sequence[Tensor], values: Tensor, accumulate: bool = False) -> Tensor:
    """A copy of ``input`` with ``values`` written (or, ``accumulate``, added) at ``input[indices]``."""


Tensor.index_put_ = inplace_variant(index_put, "index_put_", "In-place version of :func:`kiln.index_put`.", False)


def _masked_scatter_meta(input, mask, source):
    if mask._dtype is not dt.bool:
        raise RuntimeError(
            f"masked_scatter_ only supports boolean masks, but got mask with dtype {scalar_type_name(mask._dtype)}"
        )
    if source._dtype is not input._dtype:
        raise RuntimeError(
            "masked_scatter: expected self and source to have same dtypes but got"
            f"{scalar_type_name(input._dtype)} and {scalar_type_name(source._dtype)}"
        )
    shape = broadcast_shapes(input._shape, mask._shape)
    if _count(mask.expand(shape)) > _numel(source._shape):
        raise RuntimeError("Number of elements of source < number of ones in mask")
    return (shape, input._dtype, input._device)


def _masked_scatter_ref(spec, a, mask, source):
    out = np.broadcast_to(a, spec[0]).copy()
    m = np.broadcast_to(mask, spec[0])
    out[m] = source.reshape(-1)[: int(m.sum())]
    return out


def _masked_scatter_backward(grad, mask, source_shape):
    shape = broadcast_shapes(grad._shape, mask._shape)
    m = mask.expand(shape)
    taken = masked_select(grad, m)
    n = _numel(source_shape)
    from kiln._ops.shape import cat

    g_src = cat([taken, _zeros((n - _numel(taken._shape),), grad)]).reshape(source_shape)
    return where(m, 0.0, grad), None, g_src


@op(
    meta=_masked_scatter_meta,
    reference=_masked_scatter_ref,
    backward=_masked_scatter_backward,
    methods=("masked_scatter",),
)
def masked_scatter(input: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """A copy of ``input`` with consecutive entries of ``source`` written where the boolean ``mask`` is True."""


Tensor.masked_scatter_ = inplace_variant(
    masked_scatter, "masked_scatter_", "In-place version of :func:`kiln.masked_scatter`.", False
)
__all__ += ["index_put", "masked_scatter"]

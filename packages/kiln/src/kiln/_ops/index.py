"""Index-driven selection and assignment: ``index_select``, ``index_add``, ``index_fill``, ``index_copy``,
``masked_fill``, ``masked_select``, ``masked_scatter``, ``take``, ``nonzero``, ``repeat_interleave`` and
advanced indexing (``_index``, ``index_put``); plus their in-place variants (``index_add_``...).

Index values are data, so out-of-range indices are found by the kernel (with PyTorch's messages);
everything else is checked in the meta functions. Backward formulas are written with these same ops
(``index_select`` <-> ``index_add``), so higher-order gradients work.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import broadcast_shapes, scalar_type_name, wrap_dim
from kiln._ops.copy import inplace_variant
from kiln._ops.elementwise import _compute_np, where
from kiln._ops.gather_scatter import _INDEX_DTYPES, _check_bounds, _nd, _wrap_bounds, _zeros, scatter_add
from kiln._ops.sort import _host_np
from kiln._spec import DimSpec, IndexSpec, Spec
from kiln._tensor import Tensor, _numel

__all__ = [
    "index_add",
    "index_fill",
    "index_select",
    "masked_fill",
    "take",
    "index_copy",
    "masked_select",
    "nonzero",
    "repeat_interleave",
    "index_put",
    "masked_scatter",
]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


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
    return DimSpec((shape, input._dtype, input._device, d))


def _index_select_ref(spec, a, dim, index):
    d = spec.dim
    i = index.reshape(-1).astype(np.int64)
    size = a.shape[d] if a.ndim else 1
    bad = (i < 0) | (i >= size)
    if bad.any():
        if d == 1 and a.ndim >= 2:  # PyTorch's CPU path for dim 1 has a message of its own
            raise RuntimeError(f"INDICES element is out of DATA bounds, id={int(i[bad][0])} axis_dim={size}")
        raise IndexError("index out of range in self")
    if a.ndim == 0:
        return np.broadcast_to(a, spec.shape).copy()
    return np.take(a, i, axis=d)


def _index_select_backward(grad, input_shape, dim, index):
    if not input_shape:
        return (grad.sum() if grad._shape else grad), None
    return index_add(_zeros(input_shape, grad), dim, index, grad), None


@op(
    tags=("index",),
    meta=_index_select_meta,
    reference=_index_select_ref,
    backward=_index_select_backward,
    methods=("index_select",),
)
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
    return DimSpec((input._shape, input._dtype, input._device, d))


def _index_add_ref(spec, a, dim, index, source, alpha=1):
    return _index_add_into(spec, _nd(a).astype(_compute_np(spec.dtype), copy=True), dim, index, source, alpha)


def _index_add_into(spec, out, dim, index, source, alpha=1):
    """``index_add``'s write into ``out`` (``input``'s values in the compute dtype), checked first."""
    d = spec.dim
    compute = _compute_np(spec.dtype)
    out = _nd(out)
    i = index.reshape(-1).astype(np.int64)
    _check_bounds(i, out.shape[d], d)
    s = source.astype(compute).reshape(out.shape[:d] + (i.size,) + out.shape[d + 1 :])
    if alpha != 1:
        s = s * np.asarray(alpha).astype(compute)
    pos = [slice(None)] * out.ndim
    pos[d] = i
    np.add.at(out, tuple(pos), s)
    return out.reshape(spec.shape)


def _index_add_backward(grad, dim, index, source_shape, alpha, needs_input_grad):
    g = None
    if needs_input_grad[2]:  # the index is read (and so saved) for the source's gradient alone
        g = index_select(grad, dim, index) if grad._shape else grad
        g = (g if alpha == 1 else g * alpha).reshape(source_shape)
    return grad, None, g


@op(
    tags=("index",),
    meta=_index_add_meta,
    reference=_index_add_ref,
    backward=_index_add_backward,
    methods=("index_add",),
)
def index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: float = 1) -> Tensor:
    """A copy of ``input`` with ``alpha * source`` added at ``index`` along ``dim`` (duplicates accumulate)."""


def _index_fill_meta(input, dim, index, value):
    d = wrap_dim(dim, len(input._shape))
    if index._dtype is not dt.int64:
        raise IndexError("index_fill_(): Expected dtype int64 for index.")
    if len(index._shape) > 1:
        raise IndexError("Index has to be a vector/scalar")
    return DimSpec((input._shape, input._dtype, input._device, d))


def _index_fill_ref(spec, a, dim, index, value):
    return _index_fill_into(spec, a.copy(), dim, index, value)


def _index_fill_into(spec, out, dim, index, value):
    """``index_fill``'s write into ``out`` (``input``'s values), checked first."""
    d = spec.dim
    out = _nd(out)
    i = _wrap_bounds(index.reshape(-1).astype(np.int64), out.shape[d], d, IndexError)
    pos = [slice(None)] * out.ndim
    pos[d] = i
    out[tuple(pos)] = np.asarray(value).astype(_compute_np(spec.dtype)).astype(out.dtype)
    return out.reshape(spec.shape)


def _index_fill_backward(grad, dim, index):
    return index_fill(grad, dim, index, 0.0), None


@op(
    tags=("index",),
    meta=_index_fill_meta,
    reference=_index_fill_ref,
    backward=_index_fill_backward,
    methods=("index_fill",),
)
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


def _check_fill_mask(mask: Tensor) -> None:  # (also x[mask] = v's where PyTorch fills: _check_byte_mask_fill)
    if mask._dtype is not dt.bool:
        raise RuntimeError(
            f"masked_fill_ only supports boolean masks, but got mask with dtype {dt.CPP_TYPE_NAMES[mask._dtype]}"
        )


def _masked_fill_meta(input, mask, value):
    _check_fill_mask(mask)
    _check_scalar_fits(value, input._dtype)
    if isinstance(value, Tensor) and value._shape:
        raise RuntimeError(
            "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
            f"{len(value._shape)} dimension(s)."
        )
    return Spec((broadcast_shapes(input._shape, mask._shape), input._dtype, input._device))


def _masked_fill_ref(spec, a, mask, value):
    return np.where(mask, _masked_fill_value(spec, a, value), a)


def _masked_fill_into(spec, out, mask, value):
    """``masked_fill``'s write into ``out`` (``input``'s values)."""
    if np.may_share_memory(mask, out):  # a bool self masked by itself: read before anything is written
        mask = mask.copy()
    np.copyto(out, _masked_fill_value(spec, out, value), where=mask)
    return out


def _masked_fill_value(spec, a, value):
    v = value if isinstance(value, np.ndarray) else np.asarray(value)
    if v.dtype.kind in "iub" and a.dtype.kind in "iu":
        return v.astype(np.int64).astype(a.dtype)  # integers wrap (-1 -> 255 for uint8), as in PyTorch
    return v.astype(_compute_np(spec.dtype)).astype(a.dtype)


def _masked_fill_backward(grad, mask, value):
    g_value = where(mask, grad, 0.0).sum() if isinstance(value, Tensor) else None
    return where(mask, 0.0, grad), None, g_value


def _masked_fill_decomposed(input, mask, value):
    """``masked_fill`` in kiln ops: ``where(mask, value, input)`` with ``value`` converted to ``input``'s
    dtype first (integers wrap, floats truncate toward zero, as the reference converts them)."""
    from kiln._ops.creation import tensor

    if not isinstance(value, Tensor):
        value = tensor(value, dtype=dt.float64 if isinstance(value, float) else None)
    return where(mask, value.to(input._dtype), input)


@op(
    tags=("index",),
    decompose=_masked_fill_decomposed,
    meta=_masked_fill_meta,
    reference=_masked_fill_ref,
    backward=_masked_fill_backward,
    methods=("masked_fill",),
)
def masked_fill(input: Tensor, mask: Tensor, value: Tensor | float) -> Tensor:
    """A copy of ``input`` with ``value`` where the boolean ``mask`` (broadcast) is True."""


def _take_meta(input, index):
    if index._dtype is not dt.int64:
        raise RuntimeError(f"take(): Expected a long tensor for index, but got {scalar_type_name(index._dtype)}")
    return Spec((index._shape, input._dtype, input._device))


def _take_ref(spec, a, index):
    n = a.size
    i = index.astype(np.int64)
    bad = (i < -n) | (i >= n)
    if bad.any():
        raise IndexError(f"out of range: tried to access index {int(i[bad].flat[0])} on a tensor of {n} elements.")
    return a.reshape(-1)[np.where(i < 0, i + n, i)].reshape(spec.shape)


def _take_backward(grad, input, index):
    n = _numel(input._shape)
    flat = where(index < 0, index + n, index).reshape(-1)
    return scatter_add(_zeros((n,), grad), 0, flat, grad.reshape(-1)).reshape(input._shape), None


def _take_decomposed(input, index):
    """``take`` in kiln ops: ``index_select`` from the flattened input, negative indices counted from the
    end (an index out of range raises, as in the reference)."""
    from kiln._ops.reduction import any as _any

    n = _numel(input._shape)
    bad = (index < -n) | (index >= n)
    if _any(bad).item():
        first = int(masked_select(index, bad)[0].item())
        raise IndexError(f"out of range: tried to access index {first} on a tensor of {n} elements.")
    flat = where(index < 0, index + n, index).reshape(-1)
    return index_select(input.reshape(-1), 0, flat).reshape(index._shape)


@op(
    tags=("index",),
    decompose=_take_decomposed,
    meta=_take_meta,
    reference=_take_ref,
    backward=_take_backward,
    methods=("take",),
)
def take(input: Tensor, index: Tensor) -> Tensor:
    """``input`` as if flattened, at ``index`` (int64; negative counts from the end); shaped like ``index``."""


for _fn, _overlaps in (  # the overlaps with self PyTorch refuses (a number-like 0-d value is read first)
    (index_add, {"index": "any", "source": "any"}),
    (index_fill, {"index": "any"}),
    (masked_fill, {"mask": "partial"}),
):
    _name = f"{_fn.op.name}_"
    _doc = f"In-place version of :func:`kiln.{_fn.op.name}`."
    setattr(Tensor, _name, inplace_variant(_fn, _name, _doc, False, _overlaps))

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
    return DimSpec((input._shape, input._dtype, input._device, d))


def _index_copy_ref(spec, a, dim, index, source):
    return _index_copy_into(spec, a.copy(), dim, index, source)


def _index_copy_into(spec, out, dim, index, source):
    """``index_copy``'s write into ``out`` (``input``'s values), checked first."""
    d = spec.dim
    out = _nd(out)
    i = index.reshape(-1).astype(np.int64)
    size = out.shape[d]
    bad = (i < 0) | (i >= size)
    if bad.any():
        raise IndexError(f"index_copy_(): index {int(i[bad][0])} is out of bounds for dimension {d} with size {size}")
    pos = [slice(None)] * out.ndim
    pos[d] = i
    if np.may_share_memory(source, out):  # a source in self's own memory: read before anything is written
        source = source.copy()
    out[tuple(pos)] = source.reshape(out.shape[:d] + (i.size,) + out.shape[d + 1 :])
    return out.reshape(spec.shape)


def _index_copy_backward(grad, dim, index, source_shape):
    g_src = index_select(grad, dim, index) if grad._shape else grad
    return index_fill(grad, dim, index, 0.0), None, g_src.reshape(source_shape)


@op(
    autocast="promote",
    tags=("index",),
    meta=_index_copy_meta,
    reference=_index_copy_ref,
    backward=_index_copy_backward,
    methods=("index_copy",),
)
def index_copy(input: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """A copy of ``input`` with the slices of ``source`` written at ``index`` along ``dim``."""


# ---------------------------------------------------------------------------------------- data-dependent sizes


def _count(t: Tensor) -> int:
    """Number of nonzero entries: the one host sync these ops need to know their output size (as PyTorch)."""
    from kiln._ops.scans import count_nonzero

    return int(count_nonzero(t.to("cpu")).item())  # counted on the host, so a device lacking the op is not blamed


def _nonzero_meta(input):
    return Spec(((_count(input), len(input._shape)), dt.int64, input._device))


def _nonzero_ref(spec, a):
    return np.argwhere(a).astype(np.int64).reshape(spec.shape)


@op(tags=("index", "dynamic_shape"), meta=_nonzero_meta, reference=_nonzero_ref)
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
    return IndexSpec(((_count(mask.expand(shape)),), input._dtype, input._device, shape))


def _masked_select_ref(spec, a, mask):
    shape = spec.index_shape
    return np.broadcast_to(a, shape)[np.broadcast_to(mask, shape)]


def _masked_select_backward(grad, input_shape, mask):
    shape = broadcast_shapes(input_shape, mask._shape)
    n = _numel(shape)
    pos = _nonzero(mask.expand(shape).reshape(-1)).reshape(-1)
    return index_add(_zeros((n,), grad), 0, pos, grad).reshape(shape), None


@op(
    tags=("index", "dynamic_shape"),
    meta=_masked_select_meta,
    reference=_masked_select_ref,
    backward=_masked_select_backward,
    methods=("masked_select",),
)
def masked_select(input: Tensor, mask: Tensor) -> Tensor:
    """The entries of ``input`` where the boolean ``mask`` (broadcast) is True, as a 1-D tensor."""


Tensor.nonzero = nonzero

_name = "index_copy_"
setattr(
    Tensor,
    _name,
    inplace_variant(
        index_copy, _name, "In-place version of :func:`kiln.index_copy`.", False, {"index": "any", "source": "any"}
    ),
)


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


# ---------------------------------------------------------------------------------------- index / index_put

_INDEX_TENSOR_DTYPES = (dt.int64, dt.int32, dt.uint8, dt.bool)
_BYTE_INDEX_DEPRECATED = "indexing with dtype kiln.uint8 is now deprecated, please use a dtype kiln.bool instead."


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
    if any(i is not None and i._dtype is dt.uint8 for i in indices):
        warnings.warn(_BYTE_INDEX_DEPRECATED, UserWarning, 3)
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
    return Spec((_check_indices(input, indices), input._dtype, input._device))


def _index_ref(spec, a, indices):
    return np.asarray(a[_np_key(list(indices), a.shape)]).reshape(spec.shape)


def _index_backward(grad, input_shape, indices):
    return index_put(_zeros(input_shape, grad), _bool_masks(indices), grad, True), None


@op(tags=("index",), meta=_index_meta, reference=_index_ref, backward=_index_backward, grad_fn_name="IndexBackward0")
def _index(input: Tensor, indices: Sequence[Tensor]) -> Tensor:
    """``input[indices]`` for a tuple of integer/boolean index tensors (advanced indexing from dim 0)."""


def _index_put_meta(input, indices, values, accumulate=False):
    _check_byte_mask_fill(indices, values, accumulate)
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
    return IndexSpec((input._shape, input._dtype, input._device, shape))


def _index_put_ref(spec, a, indices, values, accumulate=False):
    return _index_put_into(spec, a.astype(_compute_np(spec.dtype), copy=True), indices, values, accumulate)


def _index_put_into(spec, out, indices, values, accumulate=False):
    """``index_put``'s write into ``out`` (``input``'s values in the compute dtype), checked first."""
    compute = _compute_np(spec.dtype)
    key = _np_key(list(indices), out.shape)
    v = np.broadcast_to(values.astype(compute), spec.index_shape)
    if accumulate:
        np.add.at(out, key, v)
    else:
        out[key] = v
    return out


def _index_put_backward(grad, indices, values, accumulate):
    indices = _bool_masks(indices)
    g_self = grad if accumulate else index_put(grad, indices, _zeros((), grad), False)
    return g_self, None, _index(grad, indices)


def _check_byte_mask_fill(indices, values, accumulate) -> None:
    """PyTorch writes one value through one mask and whole dims with ``masked_fill_``, which refuses a uint8
    mask: ``x[m] = 7``, ``x[:, m] = t([7.])`` (a 0-d mask indexes as a Python bool)."""
    masks = [i for i in indices if i is not None and i._dtype is dt.uint8 and i._shape]
    if not accumulate and _numel(values._shape) == 1 and len(masks) == 1 == sum(i is not None for i in indices):
        _check_fill_mask(masks[0])


def _bool_masks(indices):
    """``indices`` with uint8 masks as bool ones: a backward formula's indexing (no warning; it fills with 0)."""
    return type(indices)(i.bool() if isinstance(i, Tensor) and i._dtype is dt.uint8 else i for i in indices)


@op(
    autocast="promote",
    tags=("index",),
    meta=_index_put_meta,
    reference=_index_put_ref,
    backward=_index_put_backward,
    methods=("index_put",),
)
def index_put(input: Tensor, indices: Sequence[Tensor], values: Tensor, accumulate: bool = False) -> Tensor:
    """A copy of ``input`` with ``values`` written (or, ``accumulate``, added) at ``input[indices]``."""


Tensor.index_put_ = inplace_variant(
    index_put,
    "index_put_",
    "In-place version of :func:`kiln.index_put`.",
    False,
    {"indices": "any", "values": lambda args: None if _fills_a_mask(args[1], args[2]) else "any"},
)


def _fills_a_mask(indices, values) -> bool:
    """``x[mask] = v`` with one boolean mask and a 0-d value: PyTorch's ``masked_fill_``, which reads the
    value as a number (so it may be an element of ``x``)."""
    return (
        len(indices) == 1
        and isinstance(indices[0], Tensor)
        and indices[0]._dtype in (dt.bool, dt.uint8)
        and isinstance(values, Tensor)
        and not values._shape
    )


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
    return Spec((shape, input._dtype, input._device))


def _masked_scatter_ref(spec, a, mask, source):
    out = np.broadcast_to(a, spec.shape).copy()
    m = np.broadcast_to(mask, spec.shape)
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
    tags=("index",),
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


for _ref, _into in (
    (_index_add_ref, _index_add_into),
    (_index_fill_ref, _index_fill_into),
    (_index_copy_ref, _index_copy_into),
    (_index_put_ref, _index_put_into),
    (_masked_fill_ref, _masked_fill_into),
):
    _ref.write_into = _into  # the reference in-place kernel writes into self's own array (kiln._reference)

"""Shape ops: joining (``cat``, ``stack``), splitting (``split``, ``chunk``, ``unbind``), reordering
(``movedim``, ``flip``, ``roll``), repetition (``repeat``, ``tile``) and diagonals (``diagonal``,
``diag``, ``tril``, ``triu``).

Views where PyTorch returns views: ``split``/``chunk``/``unbind`` are ``narrow``/``select`` views,
``movedim`` a ``permute``, ``unflatten`` a ``view`` and ``diagonal`` its own view op; the rest copy.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import wrap_dim
from kiln._ops.views import (
    _index_view,
    _runs_view_kernel,
    _shape_arg,
    _varargs_shape,
    _view_kernel,
    check_storage_size,
    clone,
    contiguous_format,
    make_view,
    narrow,
    permute,
    select,
    view,
)
from kiln._spec import DimSpec, Spec, StridedSpec
from kiln._tensor import Tensor, _numel

TOP_LEVEL = (
    "cat",
    "chunk",
    "concat",
    "concatenate",
    "diag",
    "diagonal",
    "flip",
    "fliplr",
    "flipud",
    "moveaxis",
    "movedim",
    "narrow_copy",
    "roll",
    "split",
    "stack",
    "tile",
    "tril",
    "triu",
    "unbind",
    "unflatten",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""

Shape = "tuple[int, ...]"


def _dims_arg(dims) -> tuple[int, ...]:
    if isinstance(dims, numbers.Integral) and not isinstance(dims, bool):
        return (int(dims),)
    return tuple(int(d) for d in dims)


# ---------------------------------------------------------------------------------------- cat


def _is_legacy_empty(t: Tensor) -> bool:
    """PyTorch still skips 1-D tensors of size 0 in ``cat`` whatever the other shapes."""
    return t._shape == (0,)


def _common_dtype_device(tensors) -> tuple:
    """The promoted dtype of ``tensors`` and their one device (PyTorch's message when they differ)."""
    device = tensors[0]._device
    dtype = tensors[0]._dtype
    for t in tensors[1:]:
        if t._device != device:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"{device} and {t._device}!"
            )
        dtype = dt.promote_types(dtype, t._dtype)
    return dtype, device


def _cat_meta(tensors, dim=0):
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(
            f"cat(): argument 'tensors' (position 1) must be tuple of Tensors, not {type(tensors).__name__}"
        )
    if not tensors:
        raise ValueError("kiln.cat(): expected a non-empty list of Tensors")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(
                f"cat(): argument 'tensors' must be tuple of Tensors, but found element of type "
                f"{type(t).__name__} at pos {i}"
            )
        if not t._shape:
            raise RuntimeError(f"zero-dimensional tensor (at position {i}) cannot be concatenated")
    dtype, device = _common_dtype_device(tensors)
    kept = [(i, t) for i, t in enumerate(tensors) if not _is_legacy_empty(t)]
    if not kept:  # PyTorch checks no dim then
        return Spec(((0,), dtype, device))
    ref = kept[0][1]
    nd = len(ref._shape)
    d = wrap_dim(dim, nd)
    size = 0
    for i, t in kept:
        if len(t._shape) != nd:
            raise RuntimeError(f"Tensors must have same number of dimensions: got {nd} and {len(t._shape)}")
        for k in range(nd):
            if k != d and t._shape[k] != ref._shape[k]:
                raise RuntimeError(
                    f"Sizes of tensors must match except in dimension {d}. Expected size {ref._shape[k]} but got "
                    f"size {t._shape[k]} for tensor number {i} in the list."
                )
        size += t._shape[d]
    shape = ref._shape[:d] + (size,) + ref._shape[d + 1 :]
    return Spec((shape, dtype, device))


def _cat_ref(spec, tensors, dim=0):
    shape, dtype = spec.shape, spec.dtype
    arrays = [a for a in tensors if a.shape != (0,)]
    if not arrays:
        return np.empty(shape, dtype.numpy)
    d = wrap_dim(dim, len(shape))
    return np.concatenate([a.astype(dtype.numpy, copy=False) for a in arrays], axis=d)


def _cat_backward(grad, tensors_shape, dim):
    from kiln._ops.creation import zeros

    legacy = (0,)  # the shape of a legacy empty tensor, which cat skips (see _is_legacy_empty)
    kept = [shape for shape in tensors_shape if shape != legacy]
    d = wrap_dim(dim, grad.dim()) if kept else 0
    out = []
    start = 0
    for shape in tensors_shape:
        if shape == legacy:
            out.append(zeros((0,), dtype=grad.dtype, device=grad.device))
            continue
        n = shape[d]
        out.append(narrow(grad, d, start, n))
        start += n
    return out


@op(autocast="promote", tags=("shape",), meta=_cat_meta, reference=_cat_ref, backward=_cat_backward)
def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """``tensors`` joined along ``dim`` (promoted to a common dtype; 1-D empty tensors are skipped)."""


concat = cat


def concatenate(tensors, axis: int = 0, out: Tensor | None = None) -> Tensor:
    """:func:`cat` under NumPy's name and parameter name (``torch.concatenate``)."""
    return cat(tensors, axis, out=out)


def _stack_meta(tensors, dim=0):
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(
            f"stack(): argument 'tensors' (position 1) must be tuple of Tensors, not {type(tensors).__name__}"
        )
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"expected Tensor as element {i} in argument 0, but got {type(t).__name__}")
    shape0 = tensors[0]._shape
    for i, t in enumerate(tensors[1:], 1):
        if t._shape != shape0:
            raise RuntimeError(
                f"stack expects each tensor to be equal size, but got {list(shape0)} at entry 0 and "
                f"{list(t._shape)} at entry {i}"
            )
    d = wrap_dim(dim, len(shape0) + 1)
    dtype, device = _common_dtype_device(tensors)
    return DimSpec((shape0[:d] + (len(tensors),) + shape0[d:], dtype, device, d))


def _stack_ref(spec, tensors, dim=0):
    return np.stack([a.astype(spec.dtype.numpy, copy=False) for a in tensors], axis=spec.dim)


def _stack_backward(grad, dim):
    return list(unbind(grad, wrap_dim(dim, grad.dim())))


def _stack_decomposed(tensors, dim=0):
    """``stack`` in kiln ops: ``cat`` of the tensors unsqueezed at ``dim``."""
    _, dtype, _, d = _stack_meta(tensors, dim)
    return cat([t.unsqueeze(d) for t in tensors], d).to(dtype)


@op(
    autocast="promote",
    decompose=_stack_decomposed,
    tags=("shape",),
    meta=_stack_meta,
    reference=_stack_ref,
    backward=_stack_backward,
    grad_fn_name="StackBackward0",
)
def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """``tensors`` (all of one shape; promoted to a common dtype) joined along a new dim ``dim``."""


# ---------------------------------------------------------------------------------------- split


def split(tensor: Tensor, split_size_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """Views of ``tensor`` split along ``dim`` into pieces of a size (the last may be smaller) or of ``sections``."""
    if tensor.dim() == 0:
        raise RuntimeError("split expects at least a 1-dimensional tensor")
    d = wrap_dim(dim, tensor.dim())
    size = tensor._shape[d]
    if isinstance(split_size_or_sections, numbers.Integral) and not isinstance(split_size_or_sections, bool):
        s = int(split_size_or_sections)
        if s < 0:
            raise RuntimeError(f"split expects split_size be non-negative, but got split_size={s}")
        if s == 0 and size != 0:
            raise RuntimeError(f"split_size can only be 0 if dimension size is 0, but got dimension size of {size}")
        n = max((size + s - 1) // s, 1) if s else 1
        return tuple(narrow(tensor, d, i * s, min(s, size - i * s)) for i in range(n))
    sections = [int(x) for x in split_size_or_sections]
    if any(s < 0 for s in sections):
        raise RuntimeError(
            f"split_with_sizes expects split_sizes have only non-negative entries, but got split_sizes={sections}"
        )
    if sum(sections) != size:
        raise RuntimeError(
            f"split_with_sizes expects split_sizes to sum exactly to {size} (input tensor's size at dimension {d}), "
            f"but got split_sizes={sections}"
        )
    out = []
    start = 0
    for s in sections:
        out.append(narrow(tensor, d, start, s))
        start += s
    return tuple(out)


def _tensor_split(self, split_size, dim=0):
    """Views of this tensor split along ``dim`` (``kiln.split``)."""
    return split(self, split_size, dim)


def chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """At most ``chunks`` views of ``input`` along ``dim``, each of size ``ceil(size / chunks)`` but the last."""
    if input.dim() == 0:
        raise RuntimeError("chunk expects at least a 1-dimensional tensor")
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    d = wrap_dim(dim, input.dim())
    size = input._shape[d]
    split_size = (size + chunks - 1) // chunks
    if split_size == 0 and size == 0:
        return split(input, [0] * chunks, d)
    return split(input, split_size, d)


def unbind(input: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """Views of every slice of ``input`` along ``dim`` (that dim removed)."""
    if input.dim() == 0:
        raise IndexError("Dimension specified as 0 but tensor has no dimensions")
    d = wrap_dim(dim, input.dim())
    n = input._shape[d]
    if _runs_view_kernel(_index_view, input):  # the views alone, without a dispatch per slice
        shape, stride = input._shape[:d] + input._shape[d + 1 :], input._stride[:d] + input._stride[d + 1 :]
        step, offset = input._stride[d], input._offset
        return tuple(make_view(input, shape, stride, offset + i * step) for i in range(n))
    return tuple(select(input, d, i) for i in range(n))


def unflatten(input: Tensor, dim: int, sizes) -> Tensor:
    """A view with dim ``dim`` split into ``sizes`` (one ``-1`` is inferred)."""
    nd = input.dim()
    if nd == 0:
        wrap_dim(dim, 0)  # out of [-1, 0]: the usual IndexError; else PyTorch reports the wrapped dim 0
        raise RuntimeError("unflatten got an unexpected error:\nDimension specified as 0 but tensor has no dimensions")
    d = wrap_dim(dim, nd)
    sizes = _shape_arg(sizes, "sizes")
    if not sizes:
        raise RuntimeError("unflatten: sizes must be non-empty")
    size = input._shape[d]
    known = 1
    infer = [i for i, s in enumerate(sizes) if s == -1]
    if len(infer) > 1:
        raise RuntimeError("only one dimension can be inferred")
    for s in sizes:
        if s != -1:
            known *= s
    if infer:
        if known == 0:
            raise RuntimeError(
                f"unflatten got an unexpected error:\ncannot reshape tensor of {size} elements into shape "
                f"{list(sizes)} because the unspecified dimension size -1 can be any value and is ambiguous"
            )
        if size % known:
            raise RuntimeError(
                f"unflatten: Provided sizes {list(sizes)} don't multiply up to the size of dim {d} ({size}) in the "
                "input tensor"
            )
        sizes = sizes[: infer[0]] + (size // known,) + sizes[infer[0] + 1 :]
    elif known != size:
        raise RuntimeError(
            f"unflatten: Provided sizes {list(sizes)} don't multiply up to the size of dim {d} ({size}) in the "
            "input tensor"
        )
    return view(input, input._shape[:d] + sizes + input._shape[d + 1 :])


# ---------------------------------------------------------------------------------------- movedim


def movedim(input: Tensor, source, destination) -> Tensor:
    """A view with dims ``source`` moved to positions ``destination`` (the others keep their order)."""
    nd = input.dim()
    src = _dims_arg(source)
    dst = _dims_arg(destination)
    if len(src) != len(dst):
        raise RuntimeError(
            f"movedim: Invalid source or destination dims: source ({list(src)} dims) should contain the same number "
            f"of dims as destination ({list(dst)} dims)"
        )
    ws = [wrap_dim(s, nd) for s in src]
    wd = [wrap_dim(s, nd) for s in dst]
    if len(set(ws)) != len(ws):
        raise RuntimeError(f"movedim: repeated dim in `source` ({list(src)})")
    if len(set(wd)) != len(wd):
        raise RuntimeError(f"movedim: repeated dim in `destination` ({list(dst)})")
    if nd == 0:  # 0-d: source and destination are 0 or -1, nothing moves
        return permute(input, ())
    order = [-1] * nd
    for s, t in zip(ws, wd):
        order[t] = s
    rest = iter(i for i in range(nd) if i not in set(ws))
    for i in range(nd):
        if order[i] == -1:
            order[i] = next(rest)
    return permute(input, tuple(order))


moveaxis = movedim

# ---------------------------------------------------------------------------------------- flip / roll


def _flip_dims(nd, dims):
    ds = [wrap_dim(d, nd) for d in _dims_arg(dims)]
    seen = set()
    for d in ds:
        if d in seen:
            raise RuntimeError(f"dim {d} appears multiple times in the list of dims")
        seen.add(d)
    return tuple(ds)


def _flip_meta(input, dims):
    _flip_dims(input.dim(), dims)
    return Spec((input._shape, input._dtype, input._device))


def _flip_ref(spec, a, dims):
    ds = _flip_dims(a.ndim, dims)
    return np.array(np.flip(a, ds) if ds and a.ndim else a, order="C")


def _flip_decomposed(input, dims):
    """``flip`` in kiln ops: ``index_select`` with the positions of each flipped dim reversed."""
    from kiln._ops.creation import arange
    from kiln._ops.index import index_select

    x = input
    if input.dim():
        for d in _flip_dims(input.dim(), dims):
            n = x._shape[d]
            x = index_select(x, d, arange(n - 1, -1, -1, device=input._device))
    return x


@op(
    decompose=_flip_decomposed,
    tags=("shape",),
    meta=_flip_meta,
    reference=_flip_ref,
    backward=lambda grad, dims: flip(grad, dims),
)
def flip(input: Tensor, dims: Shape) -> Tensor:
    """A copy of ``input`` with the order of elements along ``dims`` reversed."""


def _tensor_flip(self, *dims):
    """``t.flip(0, 1)`` or ``t.flip((0, 1))``: a copy reversed along ``dims``."""
    return flip(self, _varargs_shape(dims, "dims"))


def fliplr(input: Tensor) -> Tensor:
    """``input`` reversed along dim 1 (a copy)."""
    if input.dim() < 2:
        raise RuntimeError("Input must be >= 2-d.")
    return flip(input, (1,))


def flipud(input: Tensor) -> Tensor:
    """``input`` reversed along dim 0 (a copy)."""
    if input.dim() < 1:
        raise RuntimeError("Input must be >= 1-d.")
    return flip(input, (0,))


def _roll_args(nd, shifts, dims):
    shifts = _dims_arg(shifts)
    if dims is None or (not isinstance(dims, numbers.Integral) and len(dims) == 0):
        if len(shifts) != 1:
            raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:0")
        return shifts, None
    dims = _dims_arg(dims)
    if nd == 0:
        raise IndexError(f"Dimension specified as {dims[0]} but tensor has no dimensions")
    if len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    return shifts, tuple(wrap_dim(d, nd) for d in dims)


def _roll_meta(input, shifts, dims=None):
    _roll_args(input.dim(), shifts, dims)
    return Spec((input._shape, input._dtype, input._device))


def _roll_ref(spec, a, shifts, dims=None):
    shifts, dims = _roll_args(a.ndim, shifts, dims)
    if dims is None:
        return np.roll(a.reshape(-1), shifts[0]).reshape(a.shape)
    return np.array(np.roll(a, shifts, dims), order="C") if a.size else a.copy()


def _roll_backward(grad, shifts, dims):
    return roll(grad, tuple(-s for s in _dims_arg(shifts)), dims)


def _roll_decomposed(input, shifts, dims=None):
    """``roll`` in kiln ops: per dim, ``cat`` of the two slices in swapped order (the flattened input when
    ``dims`` is None)."""
    shifts, dims = _roll_args(input.dim(), shifts, dims)
    if dims is None:
        return _roll_decomposed(input.reshape(-1), shifts, (0,)).reshape(input._shape)
    x = input
    for s, d in zip(shifts, dims):
        n = x._shape[d]
        k = s % n if n else 0
        if k:
            x = cat([x.narrow(d, n - k, k), x.narrow(d, 0, n - k)], d)
    return x


@op(
    decompose=_roll_decomposed,
    tags=("shape",),
    meta=_roll_meta,
    reference=_roll_ref,
    backward=_roll_backward,
    methods=("roll",),
)
def roll(input: Tensor, shifts: Shape, dims: Shape | None = None) -> Tensor:
    """A copy of ``input`` with elements shifted ``shifts`` places along ``dims`` (flattened when ``dims`` is None)."""


# ---------------------------------------------------------------------------------------- repeat / tile


def _repeat_meta(input, repeats):
    repeats = _shape_arg(repeats, "repeats")
    nd = input.dim()
    if len(repeats) < nd:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor")
    padded = (1,) * (len(repeats) - nd) + input._shape
    shape = tuple(p * r for p, r in zip(padded, repeats))
    for n in shape:
        if n < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {n}: {list(shape)}")
    check_storage_size(shape, input._dtype)
    return Spec((shape, input._dtype, input._device))


def _repeat_ref(spec, a, repeats):
    if 0 in spec.shape:  # nothing to tile (np.tile would still size its intermediate by each repeat)
        return np.empty(spec.shape, a.dtype)
    repeats = _shape_arg(repeats, "repeats")
    a = a.reshape((1,) * (len(repeats) - a.ndim) + a.shape)
    return np.array(np.tile(a, repeats), order="C")


def _repeat_backward(grad, input_shape, repeats):
    repeats = _shape_arg(repeats, "repeats")
    padded = (1,) * (len(repeats) - len(input_shape)) + tuple(input_shape)
    if _numel(grad._shape) == 0:
        from kiln._ops.creation import zeros

        return zeros(input_shape, dtype=grad.dtype, device=grad.device)
    split_shape = []
    for r, s in zip(repeats, padded):
        split_shape += [r, s]
    g = grad.reshape(tuple(split_shape))
    if repeats:
        g = g.sum(tuple(range(0, 2 * len(repeats), 2)))
    return g.reshape(input_shape)


def _repeat_decomposed(input, repeats):
    """``repeat`` in kiln ops: each dim ``s`` viewed as ``(1, s)``, expanded to ``(r, s)`` and copied into
    the result's shape."""
    from kiln._ops.creation import empty

    shape, dtype, device = _repeat_meta(input, repeats)[:3]
    if 0 in shape:
        return empty(shape, dtype=dtype, device=device)
    repeats = _shape_arg(repeats, "repeats")
    padded = (1,) * (len(repeats) - input.dim()) + input._shape
    ones, tiled = [], []
    for r, s in zip(repeats, padded):
        ones += [1, s]
        tiled += [r, s]
    return input.reshape(tuple(ones)).expand(tuple(tiled)).reshape(shape)


@op(decompose=_repeat_decomposed, tags=("shape",), meta=_repeat_meta, reference=_repeat_ref, backward=_repeat_backward)
def repeat(input: Tensor, repeats: Shape) -> Tensor:
    """``input`` repeated ``repeats[i]`` times along each dim (leading dims added as needed); a copy."""


def _tensor_repeat(self, *sizes):
    """``t.repeat(2, 3)`` or ``t.repeat((2, 3))``: this tensor tiled along each dim (a copy)."""
    return repeat(self, _varargs_shape(sizes, "repeats"))


def tile(input: Tensor, dims) -> Tensor:
    """``input`` repeated along each dim; ``dims`` shorter than ``input.dim()`` is padded with leading 1s."""
    dims = _shape_arg(dims, "dims")
    if len(dims) < input.dim():
        dims = (1,) * (input.dim() - len(dims)) + dims
    return repeat(input, dims)


def _tensor_tile(self, *dims):
    """``t.tile(2, 3)`` or ``t.tile((2, 3))`` (``kiln.tile``)."""
    return tile(self, _varargs_shape(dims, "dims"))


def narrow_copy(input: Tensor, dim: int, start: int, length: int) -> Tensor:
    """A contiguous copy of ``narrow(input, dim, start, length)``."""
    if input.dim() == 0:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    return clone(narrow(input, dim, start, length), memory_format=contiguous_format)


# ---------------------------------------------------------------------------------------- diagonals


def _diagonal_geometry(shape, stride, offset, diag_offset, dim1, dim2):
    nd = len(shape)
    d1, d2 = wrap_dim(dim1, nd), wrap_dim(dim2, nd)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    if diag_offset >= 0:
        n = max(min(shape[d1], shape[d2] - diag_offset), 0)
        start = diag_offset * stride[d2]
    else:
        n = max(min(shape[d1] + diag_offset, shape[d2]), 0)
        start = -diag_offset * stride[d1]
    if n:
        offset += start
    keep = [i for i in range(nd) if i not in (d1, d2)]
    return (
        tuple(shape[i] for i in keep) + (n,),
        tuple(stride[i] for i in keep) + (stride[d1] + stride[d2],),
        offset,
    )


def _diagonal_meta(input, offset=0, dim1=0, dim2=1):
    shape, stride, off = _diagonal_geometry(input._shape, input._stride, input._offset, offset, dim1, dim2)
    return StridedSpec((shape, input._dtype, input._device, stride, off))


@op(
    meta=_diagonal_meta,
    reference=_view_kernel,
    device_generic=True,
    tags=("view",),
    backward=lambda grad, input_shape, offset, dim1, dim2: _diagonal_backward(grad, input_shape, offset, dim1, dim2),
    methods=("diagonal",),
)
def diagonal(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """A view of the diagonal ``offset`` of the ``(dim1, dim2)`` planes, appended as the last dim."""


def _diagonal_backward_meta(grad, input_shape, offset, dim1, dim2):
    return Spec((tuple(input_shape), grad._dtype, grad._device))


def _diagonal_backward_kernel(spec, grad, input_shape, offset, dim1, dim2):
    from kiln._ops.copy import copy_into
    from kiln._ops.creation import zeros
    from kiln._tensor import contiguous_strides

    shape = tuple(input_shape)
    out = zeros(shape, dtype=grad._dtype, device=grad._device)
    vshape, vstride, voff = _diagonal_geometry(shape, contiguous_strides(shape), 0, offset, dim1, dim2)
    copy_into(make_view(out, vshape, vstride, voff), grad)
    return out


@op(
    meta=_diagonal_backward_meta,
    reference=_diagonal_backward_kernel,
    device_generic=True,
    tags=("backward",),
    backward=lambda grad, offset, dim1, dim2: diagonal(grad, offset, dim1, dim2),
)
def _diagonal_backward(grad: Tensor, input_shape: Shape, offset: int, dim1: int, dim2: int) -> Tensor:
    """Zeros of ``input_shape`` with ``grad`` on the diagonal ``offset`` of ``(dim1, dim2)`` (diagonal's gradient)."""


_diagonal_view = diagonal  # diag's parameter named ``diagonal`` (PyTorch's) hides the op


def diag(input: Tensor, diagonal: int = 0) -> Tensor:
    """A 2-D matrix with the 1-D ``input`` on diagonal ``diagonal``, or the 1-D diagonal of a 2-D ``input``."""
    nd = input.dim()
    if nd == 1:
        n = input._shape[0] + abs(diagonal)
        return _diagonal_backward(input, (n, n), diagonal, 0, 1)
    if nd == 2:
        return clone(_diagonal_view(input, diagonal, 0, 1), memory_format=contiguous_format)
    raise RuntimeError("diag(): Supports 1D or 2D tensors. Got " + f"{nd}D")


def _tri_meta(name):
    def meta(input, diagonal=0):
        if input.dim() < 2:
            raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
        return Spec((input._shape, input._dtype, input._device))

    return meta


def _tri_ref(fn):
    def ref(spec, a, diagonal=0):
        if not a.size:
            return a.copy()
        # past the matrix either way the result is all kept or all zeros: NumPy's index arithmetic must
        # not overflow on a diagonal near int64's edges
        diagonal = max(-a.shape[-2] - 1, min(a.shape[-1] + 1, diagonal))
        return np.array(fn(a, diagonal), order="C")

    return ref


def _triangle_decomposed(lower: bool):
    def decomposed(input, diagonal=0):
        """``tril``/``triu`` in kiln ops: ``input`` where the column minus the row is on the kept side of
        ``diagonal``, else zero."""
        from kiln._ops.creation import arange
        from kiln._ops.elementwise import where

        rows, cols = input._shape[-2], input._shape[-1]
        diagonal = max(-rows - 1, min(cols + 1, diagonal))  # as the reference: no overflow near int64's edges
        offset = arange(cols, device=input._device) - arange(rows, device=input._device).reshape(rows, 1)
        keep = offset <= diagonal if lower else offset >= diagonal
        return where(keep, input, False if input._dtype is dt.bool else 0)

    return decomposed


_tril_decomposed = _triangle_decomposed(True)
_triu_decomposed = _triangle_decomposed(False)


@op(
    decompose=_tril_decomposed,
    tags=("shape",),
    meta=_tri_meta("tril"),
    reference=_tri_ref(np.tril),
    backward=lambda grad, diagonal: tril(grad, diagonal),
    methods=("tril",),
    inplace=True,
)
def tril(input: Tensor, diagonal: int = 0) -> Tensor:
    """A copy of ``input`` with elements above the diagonal ``diagonal`` of the last two dims zeroed."""


@op(
    decompose=_triu_decomposed,
    tags=("shape",),
    meta=_tri_meta("triu"),
    reference=_tri_ref(np.triu),
    backward=lambda grad, diagonal: triu(grad, diagonal),
    methods=("triu",),
    inplace=True,
)
def triu(input: Tensor, diagonal: int = 0) -> Tensor:
    """A copy of ``input`` with elements below the diagonal ``diagonal`` of the last two dims zeroed."""


Tensor.split = _tensor_split
Tensor.chunk = chunk
Tensor.unbind = unbind
Tensor.unflatten = unflatten
Tensor.movedim = Tensor.moveaxis = movedim
Tensor.flip = _tensor_flip
Tensor.fliplr = fliplr
Tensor.flipud = flipud
Tensor.repeat = _tensor_repeat
Tensor.tile = _tensor_tile
Tensor.narrow_copy = narrow_copy
Tensor.diag = diag

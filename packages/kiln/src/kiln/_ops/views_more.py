"""More views: ``Tensor.unfold`` (the sliding-window view), the in-place view methods ``t_``, ``transpose_``,
``swapaxes_``/``swapdims_``, ``squeeze_``, ``unsqueeze_`` and ``as_strided_`` (and ``kiln.as_strided_``),
and the storage-resizing ``resize_``/``resize_as_``.

An in-place view method gives the tensor itself the geometry the out-of-place view op computes, and, when
autograd recorded the view, its history; as in PyTorch, a leaf that requires grad may not be changed so.
``resize_`` changes the shape (and, when the storage is too small, the storage: a larger one holding the
old elements) of a tensor that does not require grad.
"""

from __future__ import annotations

import operator

from kiln._dispatch import op
from kiln._ops._meta import wrap_dim
from kiln._ops.strided import _strided_scatter, as_strided
from kiln._ops.views import (
    _varargs_shape,
    _view_kernel,
    check_storage_size,
    contiguous_format,
    preserve_format,
    squeeze,
    transpose,
)
from kiln._ops.views import t as _t
from kiln._ops.views import unsqueeze as _unsqueeze
from kiln._spec import StridedSpec
from kiln._state import state
from kiln._tensor import Tensor, _make, contiguous_strides, storage_span

__all__ = ["as_strided_", "resize_as_"]

TOP_LEVEL = tuple(sorted(__all__))
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


# ---------------------------------------------------------------------------------------- unfold


def _unfold_geometry(shape: tuple, stride: tuple, dimension: int, size: int, step: int) -> tuple[tuple, tuple]:
    """The shape and strides of the windows of length ``size``, ``step`` apart, along ``dimension``."""
    nd = len(shape)
    d = wrap_dim(dimension, max(nd, 1))
    length = shape[d] if nd else 1
    if size > length:
        raise RuntimeError(f"maximum size for tensor at dimension {d} is {length} but size is {size}")
    if size < 0:
        raise RuntimeError(f"size is {size} but must be >= 0")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    if not nd:
        return (size,), (1,)
    windows = (length - size) // step + 1
    return (
        shape[:d] + (windows,) + shape[d + 1 :] + (size,),
        stride[:d] + (stride[d] * step,) + stride[d + 1 :] + (stride[d],),
    )


def _unfold_meta(input, dimension, size, step):
    shape, stride = _unfold_geometry(input._shape, input._stride, dimension, size, step)
    return StridedSpec((shape, input._dtype, input._device, stride, input._offset))


def _unfold_backward(grad, input_shape, dimension, size, step):
    # the windows laid over a contiguous layout of the input: their sum back into it is the gradient
    base = contiguous_strides(tuple(input_shape))
    shape, stride = _unfold_geometry(tuple(input_shape), base, dimension, size, step)
    return _strided_scatter(grad, (tuple(input_shape), base, 0), (shape, stride, 0))


@op(
    name="_unfold_view",
    meta=_unfold_meta,
    reference=_view_kernel,
    device_generic=True,
    tags=("view",),
    backward=_unfold_backward,
    grad_fn_name="UnfoldBackward0",
)
def _unfold_view(input: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """A view of the windows of length ``size``, ``step`` apart, along ``dimension`` of ``input``: that dim
    becomes the window count and a last dim of length ``size`` is appended (``Tensor.unfold``)."""


def _tensor_unfold(self: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """A view of the windows of length ``size``, ``step`` apart, along ``dimension``: that dim becomes the
    number of windows, ``(length - size) // step + 1``, and a last dim of length ``size`` is appended."""
    args = [dimension, size, step]
    for pos, (name, v) in enumerate(zip(("dimension", "size", "step"), args)):
        # int-like values as ints (a NumPy integer's product would otherwise become a stride), others refused
        if isinstance(v, bool) or not hasattr(type(v), "__index__"):
            raise TypeError(f"unfold(): argument '{name}' (position {pos + 1}) must be int, not {type(v).__name__}")
        args[pos] = operator.index(v)
    return _unfold_view(self, *args)


Tensor.unfold = _tensor_unfold


# ---------------------------------------------------------------------------------------- in-place views


def _become(self: Tensor, view: Tensor) -> Tensor:
    """Give ``self`` the geometry of ``view`` (a view of ``self``) and, when autograd recorded it, its history."""
    self._shape, self._stride, self._offset = view._shape, view._stride, view._offset
    self._np = None  # the cached NumPy view has the old geometry
    if view.grad_fn is not None:
        self._grad_fn, self._output_nr = view.grad_fn, view._output_nr
    return self


def _inplace_view(self: Tensor, make_view) -> Tensor:
    if state.grad_enabled and self._requires_grad and self.grad_fn is None and self._base is None:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
    return _become(self, make_view(self))


def t_(self: Tensor) -> Tensor:
    """Transpose this tensor of at most 2 dims in place (its metadata; no data moves)."""
    if self.dim() > 2:
        raise RuntimeError(f"t_() expects a tensor with <= 2 dimensions, but self is {self.dim()}D")
    return _inplace_view(self, _t)


def transpose_(self: Tensor, dim0: int, dim1: int) -> Tensor:
    """Swap dims ``dim0`` and ``dim1`` of this tensor in place (its metadata; no data moves)."""
    return _inplace_view(self, lambda s: transpose(s, dim0, dim1))


def swapaxes_(self: Tensor, axis0: int, axis1: int) -> Tensor:
    """:meth:`transpose_` under NumPy's name."""
    return _inplace_view(self, lambda s: transpose(s, axis0, axis1))


def swapdims_(self: Tensor, dim0: int, dim1: int) -> Tensor:
    """:meth:`transpose_` under another name."""
    return _inplace_view(self, lambda s: transpose(s, dim0, dim1))


def squeeze_(self: Tensor, dim=None) -> Tensor:
    """Remove size-1 dims (all of them, or those in ``dim``) from this tensor in place."""
    return _inplace_view(self, lambda s: squeeze(s, dim))


def unsqueeze_(self: Tensor, dim: int) -> Tensor:
    """Insert a size-1 dim at ``dim`` into this tensor in place."""
    return _inplace_view(self, lambda s: _unsqueeze(s, dim))


def as_strided_(input: Tensor, size, stride, storage_offset: int | None = None) -> Tensor:
    """Give ``input`` the geometry ``size``, ``stride``, ``storage_offset`` over its storage, in place."""
    return _inplace_view(input, lambda s: as_strided(s, size, stride, storage_offset))


# ---------------------------------------------------------------------------------------- resize


def _storage_length(t: Tensor) -> int | None:
    return len(t._storage) if hasattr(t._storage, "__len__") else None


def resize_(self: Tensor, *sizes, memory_format=contiguous_format) -> Tensor:
    """Give this tensor the shape ``sizes`` in place: the same elements in row-major order as far as they go
    (unchanged when the shape is), more storage when it needs more (new elements are uninitialised, and
    other tensors that shared the old storage keep it). Not for tensors that require grad."""
    shape = _varargs_shape(sizes)
    if self.requires_grad:
        raise RuntimeError("cannot resize variables that require grad")
    if memory_format not in (None, contiguous_format):
        if memory_format is preserve_format:
            raise RuntimeError("Unsupported memory formatPreserve")
        raise NotImplementedError(f"kiln's resize_ supports only the contiguous memory format, not {memory_format!r}")
    for s in shape:
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(shape)}")
    if shape == self._shape:
        return self
    check_storage_size(shape, self._dtype)
    stride = contiguous_strides(shape)
    need = self._offset + storage_span(shape, stride)
    have = _storage_length(self)
    if have is None or need > have:
        _grow_storage(self, need)
    self._shape, self._stride = shape, stride
    self._np = None
    return self


def _grow_storage(self: Tensor, need: int) -> None:
    """Replace ``self``'s storage by one of ``need`` elements that starts with the old storage's elements."""
    from kiln._ops.copy import copy_into
    from kiln._ops.creation import _empty

    old = self._storage
    n = _storage_length(self) or 0
    fresh = _empty((need,), self._dtype, self._device)
    if n:
        src = _make(old, (n,), (1,), 0, self._dtype, self._device)
        copy_into(_make(fresh._storage, (n,), (1,), 0, self._dtype, self._device), src)
    self._storage = fresh._storage


def resize_as_(input: Tensor, the_template: Tensor, *, memory_format=None) -> Tensor:
    """:meth:`resize_` ``input`` to ``the_template``'s shape."""
    if not isinstance(the_template, Tensor):
        raise TypeError(
            f"resize_as_(): argument 'the_template' (position 1) must be Tensor, not {type(the_template).__name__}"
        )
    return resize_(input, the_template._shape, memory_format=memory_format)


for _fn in (t_, transpose_, swapaxes_, swapdims_, squeeze_, unsqueeze_, as_strided_, resize_, resize_as_):
    setattr(Tensor, _fn.__name__, _fn)
del _fn

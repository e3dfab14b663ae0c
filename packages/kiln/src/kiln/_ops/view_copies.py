"""The ``*_copy`` functions: each returns what its view op returns (``view_copy`` what ``view`` does, ...),
as new contiguous tensors that share no storage with the input (PyTorch's view-free forms, for code that
must not alias). Composites of the view and ``clone``, so autograd and every device come with them.

``detach_copy`` returns a detached copy (PyTorch's records a node whose derivative is not implemented).
"""

from __future__ import annotations

from kiln import _dtype as dt
from kiln._ops._meta import wrap_dim
from kiln._ops.shape import diagonal, split, unbind
from kiln._ops.splitting import split_with_sizes
from kiln._ops.strided import as_strided
from kiln._ops.views import (
    _index_view,
    clone,
    contiguous_format,
    expand,
    permute,
    reshape,
    select,
    squeeze,
    t,
    transpose,
    unsqueeze,
)
from kiln._ops.views_more import _unfold_view
from kiln._tensor import Tensor

__all__ = [
    "view_copy",
    "permute_copy",
    "expand_copy",
    "select_copy",
    "slice_copy",
    "split_copy",
    "split_with_sizes_copy",
    "squeeze_copy",
    "unsqueeze_copy",
    "t_copy",
    "transpose_copy",
    "diagonal_copy",
    "unbind_copy",
    "unfold_copy",
    "detach_copy",
    "alias_copy",
    "as_strided_copy",
]

TOP_LEVEL = tuple(sorted(__all__))
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


def _copy(t: Tensor) -> Tensor:
    return clone(t, memory_format=contiguous_format)


def _need_tensor(name: str, input) -> None:
    if not isinstance(input, Tensor):
        raise TypeError(f"{name}(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")


def view_copy(input: Tensor, size) -> Tensor:
    """:func:`kiln.Tensor.view` as a copy: ``size`` (one ``-1`` inferred; any input layout, as the copy needs no
    view), or a dtype of the same size to reinterpret the bytes as."""
    _need_tensor("view_copy", input)
    if isinstance(size, dt.dtype):
        return _copy(input.view(size))
    return _copy(reshape(input, size))  # PyTorch's copies what view would show, whatever the input's strides


def permute_copy(input: Tensor, dims) -> Tensor:
    """:func:`kiln.permute` as a copy."""
    _need_tensor("permute_copy", input)
    return _copy(permute(input, tuple(dims)))


def expand_copy(input: Tensor, size, *, implicit: bool = False) -> Tensor:
    """:meth:`kiln.Tensor.expand` as a copy (``implicit`` is accepted and, as in PyTorch, changes nothing)."""
    _need_tensor("expand_copy", input)
    return _copy(expand(input, size))


def select_copy(input: Tensor, dim: int, index: int) -> Tensor:
    """:func:`kiln.select` as a copy."""
    _need_tensor("select_copy", input)
    return _copy(select(input, dim, index))


def slice_copy(input: Tensor, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1) -> Tensor:
    """The slice ``start:end:step`` along ``dim`` (Python's slice rules, ``step`` positive) as a copy."""
    _need_tensor("slice_copy", input)
    if input.dim() == 0:
        raise IndexError("slice() cannot be applied to a 0-dim tensor.")
    if step <= 0:
        raise RuntimeError("slice step must be positive")
    return _copy(_index_view(input, (slice(None),) * wrap_dim(dim, input.dim()) + (slice(start, end, step),)))


def split_copy(input: Tensor, split_size: int, dim: int = 0) -> tuple[Tensor, ...]:
    """:func:`kiln.split` into pieces of ``split_size``, each a copy."""
    _need_tensor("split_copy", input)
    return tuple(_copy(p) for p in split(input, split_size, dim))


def split_with_sizes_copy(input: Tensor, split_sizes, dim: int = 0) -> tuple[Tensor, ...]:
    """:func:`kiln.split_with_sizes`, each piece a copy."""
    _need_tensor("split_with_sizes_copy", input)
    return tuple(_copy(p) for p in split_with_sizes(input, split_sizes, dim))


def squeeze_copy(input: Tensor, dim=None) -> Tensor:
    """:func:`kiln.squeeze` as a copy."""
    _need_tensor("squeeze_copy", input)
    return _copy(squeeze(input, dim))


def unsqueeze_copy(input: Tensor, dim: int) -> Tensor:
    """:func:`kiln.unsqueeze` as a copy."""
    _need_tensor("unsqueeze_copy", input)
    return _copy(unsqueeze(input, dim))


def t_copy(input: Tensor) -> Tensor:
    """:func:`kiln.t` as a copy."""
    _need_tensor("t_copy", input)
    return _copy(t(input))


def transpose_copy(input: Tensor, dim0: int, dim1: int) -> Tensor:
    """:func:`kiln.transpose` as a copy."""
    _need_tensor("transpose_copy", input)
    return _copy(transpose(input, dim0, dim1))


def diagonal_copy(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """:func:`kiln.diagonal` as a copy."""
    _need_tensor("diagonal_copy", input)
    return _copy(diagonal(input, offset, dim1, dim2))


def unbind_copy(input: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """:func:`kiln.unbind`, each slice a copy."""
    _need_tensor("unbind_copy", input)
    return tuple(_copy(p) for p in unbind(input, dim))


def unfold_copy(input: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """:meth:`kiln.Tensor.unfold` (the windows of length ``size``, ``step`` apart, along ``dimension``) as a
    copy."""
    _need_tensor("unfold_copy", input)
    return _copy(_unfold_view(input, dimension, size, step))


def detach_copy(input: Tensor) -> Tensor:
    """A copy of ``input`` outside the autograd graph."""
    _need_tensor("detach_copy", input)
    return _copy(input.detach())


def alias_copy(input: Tensor) -> Tensor:
    """A copy of ``input`` (what an alias of it holds), tracked by autograd."""
    _need_tensor("alias_copy", input)
    return _copy(input)


def as_strided_copy(input: Tensor, size, stride, storage_offset: int | None = None) -> Tensor:
    """:func:`kiln.as_strided` as a copy."""
    _need_tensor("as_strided_copy", input)
    return _copy(as_strided(input, size, stride, storage_offset))

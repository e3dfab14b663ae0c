"""Splitting tensors into views, NumPy style: ``tensor_split``, ``hsplit``, ``vsplit``, ``dsplit``,
``split_with_sizes`` and the ``unsafe_`` forms of ``split``/``chunk``/``split_with_sizes``.

Every piece is a ``narrow`` view of the input (autograd and every device come with it). PyTorch's
``unsafe_`` forms return pieces that autograd does not track as views; kiln's are the ordinary tracked
views, so an in-place write to a piece is checked as it is for :func:`kiln.split`.
"""

from __future__ import annotations

import itertools
import numbers

from kiln import _dtype as dt
from kiln._ops._meta import scalar_type_name, wrap_dim
from kiln._ops.shape import chunk, split
from kiln._ops.views import narrow
from kiln._tensor import Tensor

__all__ = [
    "tensor_split",
    "hsplit",
    "vsplit",
    "dsplit",
    "split_with_sizes",
    "unsafe_split",
    "unsafe_chunk",
    "unsafe_split_with_sizes",
]

TOP_LEVEL = tuple(sorted(__all__))
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _pieces(input: Tensor, d: int, bounds: list[int]) -> tuple[Tensor, ...]:
    """The views ``input[..., lo:hi]`` along ``d`` for consecutive ``bounds`` (Python slice rules: negative
    bounds count from the end, a piece past the end or ending before it starts is empty)."""
    size = input._shape[d]
    out = []
    for lo, hi in itertools.pairwise(bounds):
        start, stop, _ = slice(lo, hi).indices(size)
        out.append(narrow(input, d, start, max(stop - start, 0)))
    return tuple(out)


def tensor_split(input: Tensor, indices_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """Views of ``input`` split along ``dim``: into ``n`` nearly equal parts (the first ``size % n`` one
    longer) for an int ``n``, or at the given indices (like NumPy's ``array_split``; indices past the end
    give empty pieces) for a sequence or a 1-D int64 tensor (a 0-d one counts as ``n``)."""
    if input.dim() == 0:
        raise RuntimeError(
            f"tensor_split expected at least a 1-dimensional tensor, but got a tensor with {input.dim()} dims"
        )
    d = wrap_dim(dim, input.dim())
    spec = indices_or_sections
    if isinstance(spec, Tensor):
        if spec._dtype is not dt.int64:
            raise RuntimeError(
                "tensor_split expected tensor_indices_or_sections to have dtype of long, but got "
                f"{scalar_type_name(spec._dtype)}"
            )
        if spec.dim() > 1:
            raise RuntimeError(
                "tensor_split expected tensor_indices_or_sections to be a zero-dimensional or one-dimensional "
                f"tensor, but got a tensor with {spec.dim()} dims"
            )
        spec = spec.item() if spec.dim() == 0 else spec.tolist()
    size = input._shape[d]
    if _is_int(spec):
        n = int(spec)
        if n <= 0:
            raise RuntimeError(f"number of sections must be larger than 0, got {n}")
        q, r = divmod(size, n)
        bounds = [0]
        for i in range(n):
            bounds.append(bounds[-1] + q + (1 if i < r else 0))
        return _pieces(input, d, bounds)
    return _pieces(input, d, [0, *(int(i) for i in spec), size])


def _split_dim(name: str, input: Tensor, indices_or_sections, d: int, min_dims: int) -> tuple[Tensor, ...]:
    if input.dim() < min_dims:
        raise RuntimeError(
            f"kiln.{name} requires a tensor with at least {min_dims} dimension, but got a tensor with "
            f"{input.dim()} dimensions!"
        )
    if _is_int(indices_or_sections):
        n, size = int(indices_or_sections), input._shape[d]
        if n == 0 or size % n:
            raise RuntimeError(
                f"kiln.{name} attempted to split along dimension {d}, but the size of the dimension {size} is not "
                f"divisible by the split_size {n}!"
            )
    return tensor_split(input, indices_or_sections, d)


def hsplit(input: Tensor, indices_or_sections) -> tuple[Tensor, ...]:
    """:func:`tensor_split` along dim 1 (dim 0 for a 1-D tensor); ``n`` sections must divide that dim."""
    if input.dim() == 0:
        raise RuntimeError(
            "kiln.hsplit requires a tensor with at least 1 dimension, but got a tensor with 0 dimensions!"
        )
    return _split_dim("hsplit", input, indices_or_sections, 0 if input.dim() == 1 else 1, 1)


def vsplit(input: Tensor, indices_or_sections) -> tuple[Tensor, ...]:
    """:func:`tensor_split` along dim 0 of a tensor of at least 2 dims; ``n`` sections must divide it."""
    return _split_dim("vsplit", input, indices_or_sections, 0, 2)


def dsplit(input: Tensor, indices_or_sections) -> tuple[Tensor, ...]:
    """:func:`tensor_split` along dim 2 of a tensor of at least 3 dims; ``n`` sections must divide it."""
    return _split_dim("dsplit", input, indices_or_sections, 2, 3)


def _int_list(name: str, sizes, position: int) -> list[int]:
    if not isinstance(sizes, (list, tuple)) or not all(_is_int(s) for s in sizes):
        got = type(sizes).__name__
        raise TypeError(f"{name}(): argument 'split_sizes' (position {position}) must be tuple of ints, not {got}")
    return [int(s) for s in sizes]


def split_with_sizes(input: Tensor, split_sizes, dim: int = 0) -> tuple[Tensor, ...]:
    """Views of ``input`` along ``dim`` of the lengths ``split_sizes`` (which must sum to the dim's size)."""
    return split(input, _int_list("split_with_sizes", split_sizes, 2), dim)


def _tensor_split_with_sizes(self: Tensor, split_sizes, dim: int = 0) -> tuple[Tensor, ...]:
    """Views of this tensor of the lengths ``split_sizes`` along ``dim`` (:func:`kiln.split_with_sizes`)."""
    return split(self, _int_list("split_with_sizes", split_sizes, 1), dim)


def unsafe_split(input: Tensor, split_size: int, dim: int = 0) -> tuple[Tensor, ...]:
    """:func:`kiln.split` into pieces of ``split_size`` (an int; the last may be shorter)."""
    if not _is_int(split_size):
        raise TypeError(
            f"unsafe_split(): argument 'split_size' (position 2) must be int, not {type(split_size).__name__}"
        )
    return split(input, split_size, dim)


def unsafe_chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """:func:`kiln.chunk`: at most ``chunks`` pieces along ``dim``."""
    return chunk(input, chunks, dim)


def unsafe_split_with_sizes(input: Tensor, split_sizes, dim: int = 0) -> tuple[Tensor, ...]:
    """:func:`split_with_sizes`: pieces of the lengths ``split_sizes`` along ``dim``."""
    return split(input, _int_list("unsafe_split_with_sizes", split_sizes, 2), dim)


Tensor.tensor_split = tensor_split
Tensor.hsplit = hsplit
Tensor.vsplit = vsplit
Tensor.dsplit = dsplit
Tensor.split_with_sizes = _tensor_split_with_sizes
Tensor.unsafe_split = unsafe_split
Tensor.unsafe_chunk = unsafe_chunk
Tensor.unsafe_split_with_sizes = unsafe_split_with_sizes

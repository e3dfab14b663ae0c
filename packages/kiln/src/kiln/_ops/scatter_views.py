"""Out-of-place writes through a view: ``select_scatter``, ``slice_scatter``, ``diagonal_scatter``,
``as_strided_scatter`` (a copy of ``input`` with ``src`` written where the view selects), and the diagonal
builders ``diag_embed`` and ``diagflat``, and ``rot90``.

The scatters are composites: a clone of ``input`` with ``src`` copied into the view of it, so autograd
(through the in-place write into a view) and every device come with them; ``src`` is cast to ``input``'s
dtype, as ``copy_`` casts. ``diag_embed`` is the adjoint of ``diagonal`` (``_diagonal_backward``), whose
gradient is ``diagonal`` again.
"""

from __future__ import annotations

import numbers

from kiln._ops._meta import wrap_dim
from kiln._ops.shape import _diagonal_backward, flip
from kiln._ops.strided import as_strided
from kiln._ops.views import clone, select, transpose
from kiln._tensor import Tensor

__all__ = [
    "select_scatter",
    "slice_scatter",
    "diagonal_scatter",
    "as_strided_scatter",
    "diag_embed",
    "diagflat",
    "rot90",
]

TOP_LEVEL = tuple(sorted(__all__))
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


def _check_tensors(name: str, input, src) -> None:
    for arg, v, pos in (("input", input, 1), ("src", src, 2)):
        if not isinstance(v, Tensor):
            raise TypeError(f"{name}(): argument '{arg}' (position {pos}) must be Tensor, not {type(v).__name__}")


def _scatter_into(input: Tensor, src: Tensor, view) -> Tensor:
    """A clone of ``input`` with ``src`` written into ``view(clone)``, after PyTorch's size check."""
    out = clone(input)
    target = view(out)
    if target._shape != src._shape:
        raise RuntimeError(
            f"expected src to have a size equal to the slice of self. src size = {list(src._shape)}, slice size = "
            f"{list(target._shape)}"
        )
    target.copy_(src)
    return out


def select_scatter(input: Tensor, src: Tensor, dim: int, index: int) -> Tensor:
    """A copy of ``input`` with ``src`` (the shape of ``input.select(dim, index)``) written at ``index`` along
    ``dim``."""
    _check_tensors("select_scatter", input, src)
    if input.dim() == 0:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    return _scatter_into(input, src, lambda out: select(out, dim, index))


def slice_scatter(
    input: Tensor, src: Tensor, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1
) -> Tensor:
    """A copy of ``input`` with ``src`` written into the slice ``start:end:step`` along ``dim`` (Python's slice
    rules for the bounds; ``step`` positive)."""
    _check_tensors("slice_scatter", input, src)
    if input.dim() == 0:
        raise IndexError("slice() cannot be applied to a 0-dim tensor.")
    d = wrap_dim(dim, input.dim())
    if step <= 0:
        raise RuntimeError("slice step must be positive")
    key = (slice(None),) * d + (slice(start, end, step),)
    return _scatter_into(input, src, lambda out: out[key])


def diagonal_scatter(input: Tensor, src: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """A copy of ``input`` with ``src`` (the shape of ``input.diagonal(offset, dim1, dim2)``) written on that
    diagonal."""
    _check_tensors("diagonal_scatter", input, src)
    return _scatter_into(input, src, lambda out: out.diagonal(offset, dim1, dim2))


def as_strided_scatter(input: Tensor, src: Tensor, size, stride, storage_offset: int | None = None) -> Tensor:
    """A copy of ``input`` with ``src`` written where ``as_strided(size, stride, storage_offset)`` of the copy
    points (the copy keeps ``input``'s layout, with storage offset 0)."""
    _check_tensors("as_strided_scatter", input, src)
    return _scatter_into(input, src, lambda out: as_strided(out, size, stride, storage_offset))


def diag_embed(input: Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """A tensor with the last dim of ``input`` on the diagonal ``offset`` of the planes ``(dim1, dim2)`` (two new
    dims of size ``n + |offset|``) and zeros elsewhere; the other dims are ``input``'s leading ones."""
    if not isinstance(input, Tensor):
        raise TypeError(f"diag_embed(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    nd = input.dim() + 1
    d1, d2 = wrap_dim(dim1, nd), wrap_dim(dim2, nd)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    n = input._shape[-1] + abs(offset)  # input has a dim: wrapping dim1 and dim2 needs two
    rest = iter(input._shape[:-1])
    shape = tuple(n if i in (d1, d2) else next(rest) for i in range(nd))
    return _diagonal_backward(input, shape, offset, d1, d2)


def diagflat(input: Tensor, offset: int = 0) -> Tensor:
    """A 2-D tensor with the flattened ``input`` on its diagonal ``offset`` and zeros elsewhere."""
    if not isinstance(input, Tensor):
        raise TypeError(f"diagflat(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    return diag_embed(input.reshape(-1), offset, 0, 1)


def rot90(input: Tensor, k: int = 1, dims=(0, 1)) -> Tensor:
    """``input`` rotated by ``k`` quarter turns in the plane of ``dims``, from the first dim towards the second
    (negative ``k`` turns the other way)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"rot90(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"rot90(): argument 'k' (position 2) must be int, not {type(k).__name__}")
    dims = tuple(dims)
    if len(dims) != 2:
        raise RuntimeError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    if input.dim() < 2:
        raise RuntimeError(f"expected total dims >= 2, but got total dims = {input.dim()}")
    d0, d1 = wrap_dim(dims[0], input.dim()), wrap_dim(dims[1], input.dim())
    if d0 == d1:
        raise RuntimeError(f"expected rotation dims to be different, but got dim0 = {d0} and dim1 = {d1}")
    k = int(k) % 4
    if k == 1:
        return transpose(flip(input, (d1,)), d0, d1)
    if k == 2:
        return flip(input, (d0, d1))
    if k == 3:
        return transpose(flip(input, (d0,)), d0, d1)
    return clone(input)


Tensor.select_scatter = select_scatter
Tensor.slice_scatter = slice_scatter
Tensor.diagonal_scatter = diagonal_scatter
Tensor.as_strided_scatter = as_strided_scatter
Tensor.diag_embed = diag_embed
Tensor.diagflat = diagflat
Tensor.rot90 = rot90

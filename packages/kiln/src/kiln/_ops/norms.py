"""The matrix norms of ``kiln.linalg``: ``matrix_norm`` and ``norm`` (compositions of kiln ops)."""

from __future__ import annotations

from kiln._ops.decompositions import svdvals
from kiln._ops.products import _check_tensors
from kiln._tensor import Tensor

__all__ = ["matrix_norm", "norm"]


# ---------------------------------------------------------------------------------------- norms, vecdot, cross


def matrix_norm(A: Tensor, ord="fro", dim=(-2, -1), keepdim: bool = False, *, dtype=None) -> Tensor:
    """Matrix norm over the two dims ``dim``: ``'fro'``, ``'nuc'``, ``±1``, ``±2``, ``±inf``."""
    from kiln._ops.reduction import amax, amin
    from kiln._ops.scans import vector_norm

    _check_tensors("linalg_matrix_norm", A=A)
    if A.dim() < 2:
        raise RuntimeError("linalg.matrix_norm: The input tensor A must have at least 2 dimensions.")
    if dtype is not None:
        A = A.to(dtype)
    if ord == "fro":
        return vector_norm(A, 2, dim, keepdim)
    if ord not in ("nuc", 1, -1, 2, -2, float("inf"), float("-inf")):
        raise RuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")
    d0, d1 = (d % A.dim() for d in dim)
    x = A.movedim((d0, d1), (-2, -1))
    if ord == "nuc":
        r = svdvals(x).sum(-1)
    elif ord in (2, -2):
        s = svdvals(x)
        r = amax(s, -1) if ord == 2 else amin(s, -1)
    elif ord in (1, -1):
        c = x.abs().sum(-2)
        r = amax(c, -1) if ord == 1 else amin(c, -1)
    else:
        c = x.abs().sum(-1)
        r = amax(c, -1) if ord > 0 else amin(c, -1)
    if keepdim:
        for d in sorted((d0, d1)):
            r = r.unsqueeze(d)
    return r


def norm(input: Tensor, ord=None, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """``torch.linalg.norm``: a vector norm, or a matrix norm for a string ``ord`` or two ``dim`` (the
    parameter is ``input``, as PyTorch's binding names it, though its docs say ``A``)."""
    A = input
    from kiln._ops.scans import vector_norm

    _check_tensors("linalg_norm", A=input)
    if dim is not None and not isinstance(dim, int):
        dim = tuple(dim)
    if ord is None:
        if dim is None:
            return vector_norm(A.reshape(-1) if keepdim is False else A, 2, None, keepdim, dtype=dtype)
        return vector_norm(A, 2, dim, keepdim, dtype=dtype)
    if dim is None:
        if A.dim() not in (1, 2):
            raise RuntimeError(
                f"linalg.norm: If dim is not specified but ord is, the input must be 1D or 2D. Got {A.dim()}D."
            )
        dim = (-2, -1) if A.dim() == 2 else -1
    if (isinstance(dim, tuple) and len(dim) == 2) or isinstance(ord, str):
        return matrix_norm(A, ord, dim, keepdim, dtype=dtype)
    return vector_norm(A, ord, dim, keepdim, dtype=dtype)

"""nn primitives: distances (``cosine_similarity``, ``pairwise_distance``, ``pdist``;
``torch.nn.functional`` names), compositions of kiln ops as in PyTorch.
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._ops._meta import broadcast_pair, result_type, scalar_type_name, wrap_dim
from kiln._ops.activation import _need_tensor
from kiln._ops.elementwise import where
from kiln._tensor import Tensor

__all__ = ["cosine_similarity", "pairwise_distance", "pdist"]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


# ---------------------------------------------------------------------------------------- distances


def _same_grad_clamped(n: Tensor, eps: float) -> Tensor:
    """``n`` with values clamped below at ``eps`` but ``n``'s own gradient (PyTorch clamps under no_grad)."""
    d = n.detach()
    return n + (d.clamp_min(eps) - d)


def _float_pair(x1, x2, fname: str):
    _need_tensor(x1, fname, "x1", 1)
    _need_tensor(x2, fname, "x2", 2)
    d = result_type(x1, x2)
    return d


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """Cosine similarity along ``dim`` of ``x1`` and ``x2`` (broadcast), each norm clamped at ``eps``."""
    from kiln._ops.scans import vector_norm

    d = _float_pair(x1, x2, "cosine_similarity")
    if not d.is_floating_point:
        raise RuntimeError(f"expected common dtype to be floating point, yet common dtype is {scalar_type_name(d)}")
    shape = broadcast_pair(x1._shape, x2._shape)
    dim = wrap_dim(dim, len(shape))
    a = x1.to(d).expand(*shape) if x1._shape != shape or x1._dtype is not d else x1
    b = x2.to(d).expand(*shape) if x2._shape != shape or x2._dtype is not d else x2
    na = _same_grad_clamped(vector_norm(a, 2, dim, True), eps)
    nb = _same_grad_clamped(vector_norm(b, 2, dim, True), eps)
    return ((a / na) * (b / nb)).sum(dim)


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    """The ``p``-norm of ``x1 - x2 + eps`` along the last dim (inputs broadcast)."""
    from kiln._ops.scans import vector_norm

    _float_pair(x1, x2, "pairwise_distance")
    ndim = max(x1.dim(), x2.dim())
    return vector_norm(x1 - x2 + eps, p, ndim - 1 if ndim else -1, keepdim)


def pdist(input: Tensor, p: float = 2.0) -> Tensor:
    """The ``p``-norm distances between every pair of rows of a 2-D ``input`` (upper triangle, row-major)."""
    from kiln._ops.creation import tensor
    from kiln._ops.index import index_select
    from kiln._ops.scans import vector_norm

    _need_tensor(input, "pdist")
    if input.dim() != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {input.dim()}D")
    if not input._dtype.is_floating_point:
        raise RuntimeError("pdist only supports floating-point dtypes")
    if p < 0:
        raise RuntimeError("pdist only supports non-negative p values")
    if input._dtype in (dt.float16, dt.bfloat16):
        raise NotImplementedError(f"\"pdist\" not implemented for '{scalar_type_name(input._dtype)}'")
    n = input.shape[0]
    i, j = np.triu_indices(n, 1)
    rows_i = index_select(input, 0, tensor(i.astype(np.int64), device=input.device))
    rows_j = index_select(input, 0, tensor(j.astype(np.int64), device=input.device))
    diff = rows_i - rows_j
    if diff.numel() == 0:
        return diff.sum(-1)
    out = vector_norm(diff, p, -1)
    if p == 0 and diff.requires_grad:
        # PyTorch's pdist gives p = 0 a zero gradient (not none): connect ``diff`` with zeros
        from kiln._ops.creation import full

        out = out + where(full((), False, dtype=dt.bool, device=diff.device), diff, 0.0).sum(-1)
    return out

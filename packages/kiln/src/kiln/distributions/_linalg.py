"""Linear algebra the Gaussian distributions share: Mahalanobis distances, the scale factor of a
precision matrix."""

from __future__ import annotations

import kiln
from kiln._tensor import Tensor


def batch_mv(mat: Tensor, vec: Tensor) -> Tensor:
    """``mat @ vec`` for batches of matrices and vectors whose batch shapes broadcast."""
    return kiln.matmul(mat, vec.unsqueeze(-1)).squeeze(-1)


def batch_mahalanobis(lower: Tensor, x: Tensor) -> Tensor:
    """``x^T (L L^T)^-1 x`` over the last dimension of ``x``, for ``L = lower``; ``x``'s batch shape ends
    with one that ``lower``'s batch shape broadcasts to. The dimensions of ``x`` beyond ``lower``'s batch
    become columns of one solve per matrix, so ``lower`` is never expanded over them."""
    n = x.shape[-1]
    outer = x.dim() - 1 - (lower.dim() - 2)
    if outer <= 0:
        return kiln.linalg.solve_triangular(lower, x.unsqueeze(-1), upper=False).squeeze(-1).pow(2).sum(-1)
    sample, batch = tuple(x.shape[:outer]), tuple(x.shape[outer:-1])
    k = len(batch)
    cols = x.reshape((-1,) + batch + (n,)).permute(tuple(range(1, k + 2)) + (0,))  # batch, n, samples
    m = kiln.linalg.solve_triangular(lower, cols, upper=False).pow(2).sum(-2)  # batch, samples
    return m.permute((k,) + tuple(range(k))).reshape(sample + batch)


def precision_to_scale_tril(precision: Tensor) -> Tensor:
    """The lower Cholesky factor of ``precision``'s inverse, without inverting ``precision``: the Cholesky
    factor of ``precision`` with its rows and columns reversed gives that of the inverse by one triangular
    solve."""
    lf = kiln.linalg.cholesky(precision.flip((-2, -1)))
    l_inv = lf.flip((-2, -1)).mT
    eye = kiln.eye(precision.shape[-1], dtype=precision.dtype, device=precision.device)
    return kiln.linalg.solve_triangular(l_inv, eye, upper=False)

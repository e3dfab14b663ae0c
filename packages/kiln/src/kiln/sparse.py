"""Sparse COO tensors (``torch.sparse``): products, sums and softmax that keep the sparsity.

Make sparse tensors with :func:`kiln.sparse_coo_tensor` or :meth:`kiln.Tensor.to_sparse`. They support
:meth:`~kiln.Tensor.coalesce`, :meth:`~kiln.Tensor.to_dense`, ``indices()``/``values()``, ``t()``/``transpose``
of sparse dims, ``sparse + sparse``, ``dense + sparse``, ``sparse * number``, ``sparse / number`` and
``sparse @ dense`` (``kiln.mm``, ``kiln.matmul``, ``kiln.spmm``, ``kiln.addmm``); every other op raises
``NotImplementedError``. All of them are differentiable with respect to the values and the dense operands;
a sparse leaf's ``.grad`` is sparse. Hybrid tensors (dense dims in the values) support ``coalesce``,
``to_dense``, ``sum``, ``softmax`` and the elementwise ops, not products.
"""

from __future__ import annotations

from kiln import _dtype as dt
from kiln._sparse_ops import sparse_addmm, sparse_mm, sparse_softmax, sparse_sum
from kiln._tensor import Tensor

__all__ = ["addmm", "log_softmax", "mm", "softmax", "sum"]


def mm(mat1: Tensor, mat2: Tensor) -> Tensor:
    """Matrix product with a sparse COO operand (``torch.sparse.mm``): sparse @ dense or dense @ sparse,
    a dense result; differentiable with respect to the sparse values and the dense matrix."""
    return sparse_mm(mat1, mat2)


def addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    """``beta * input + alpha * (mat1 @ mat2)`` for a sparse ``mat1`` and dense ``input`` and ``mat2``
    (``torch.sparse.addmm``); ``beta=0`` ignores ``input``."""
    return sparse_addmm(input, mat1, mat2, beta=beta, alpha=alpha)


def sum(input: Tensor, dim=None, dtype: dt.dtype | None = None) -> Tensor:  # noqa: A001 - torch.sparse.sum
    """The sum of a sparse tensor over ``dim`` (an int or a tuple; all dims by default, a dense scalar)
    (``torch.sparse.sum``). Summing every sparse dim gives a dense tensor, summing some a coalesced sparse one."""
    return sparse_sum(input, dim, False, dtype)


def softmax(input: Tensor, dim: int, *, dtype: dt.dtype | None = None) -> Tensor:
    """Softmax along ``dim`` over the stored entries of a sparse tensor, the missing ones counting as minus
    infinity (``torch.sparse.softmax``): a sparse result on the coalesced indices."""
    return sparse_softmax(input, dim, dtype)


def log_softmax(input: Tensor, dim: int, *, dtype: dt.dtype | None = None) -> Tensor:
    """Log-softmax along ``dim`` over the stored entries of a sparse tensor (``torch.sparse.log_softmax``)."""
    return sparse_softmax(input, dim, dtype, log=True)

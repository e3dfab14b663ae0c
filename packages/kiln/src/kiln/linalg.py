"""``kiln.linalg``: norms, inverses, determinants, solves and decompositions (``torch.linalg``'s names).

The matrix products live in :mod:`kiln` itself."""

from __future__ import annotations

from kiln._ops.decompositions import LinAlgError, cholesky, det, eigh, eigvalsh, inv, qr, slogdet, solve, svd, svdvals
from kiln._ops.norms import matrix_norm, norm
from kiln._ops.products import cross, vecdot
from kiln._ops.scans import vector_norm

__all__ = [
    "LinAlgError",
    "cholesky",
    "cross",
    "det",
    "eigh",
    "eigvalsh",
    "inv",
    "matrix_norm",
    "norm",
    "qr",
    "slogdet",
    "solve",
    "svd",
    "svdvals",
    "vecdot",
    "vector_norm",
]

"""``kiln.linalg``: norms, inverses, determinants, solves and decompositions (``torch.linalg``'s names).

The matrix products live in :mod:`kiln` itself."""

from __future__ import annotations

import sys as _sys

from kiln._names import name_bound_functions as _name_bound_functions
from kiln._ops.decompositions import LinAlgError, cholesky, det, eigh, eigvalsh, inv, qr, slogdet, solve, svd, svdvals
from kiln._ops.ldl import ldl_factor, ldl_factor_ex, ldl_solve
from kiln._ops.linalg import matmul
from kiln._ops.lu import inv_ex, lu, lu_factor, lu_factor_ex, lu_solve, solve_ex
from kiln._ops.matrix_functions import (
    cond,
    diagonal,
    householder_product,
    lstsq,
    matrix_exp,
    matrix_power,
    matrix_rank,
    pinv,
    tensorinv,
    tensorsolve,
    vander,
)
from kiln._ops.norms import matrix_norm, norm
from kiln._ops.products import cross, vecdot
from kiln._ops.scans import vector_norm
from kiln._ops.tensor_products import multi_dot
from kiln._ops.triangular import cholesky_ex, solve_triangular

__all__ = [
    "LinAlgError",
    "cholesky",
    "cholesky_ex",
    "cond",
    "cross",
    "det",
    "diagonal",
    "eigh",
    "eigvalsh",
    "householder_product",
    "inv",
    "inv_ex",
    "ldl_factor",
    "ldl_factor_ex",
    "ldl_solve",
    "lstsq",
    "lu",
    "lu_factor",
    "lu_factor_ex",
    "lu_solve",
    "matmul",
    "matrix_exp",
    "matrix_norm",
    "matrix_power",
    "matrix_rank",
    "multi_dot",
    "norm",
    "pinv",
    "qr",
    "slogdet",
    "solve",
    "solve_ex",
    "solve_triangular",
    "svd",
    "svdvals",
    "tensorinv",
    "tensorsolve",
    "vander",
    "vecdot",
    "vector_norm",
]


def _give_out() -> None:
    """PyTorch's ``out=`` on every function here that computes new tensors (ops have it already;
    functions written in Python get it from :func:`kiln._dispatch.with_out`)."""
    import inspect

    from kiln._dispatch import with_out

    for name in __all__:
        fn = globals()[name]
        if inspect.isfunction(fn) and "out" not in inspect.signature(fn).parameters:
            globals()[name] = with_out(fn)


_give_out()


_name_bound_functions(_sys.modules[__name__])  # each function here pickles by reference (kiln._names)

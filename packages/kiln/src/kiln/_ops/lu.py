"""LU factorization with partial pivoting and what is built on it: ``linalg.lu_factor_ex`` (an op with a
reference kernel and a backward formula in kiln ops), ``linalg.lu_factor``, ``linalg.lu``, ``lu_unpack``,
``linalg.lu_solve``, ``linalg.inv_ex``, ``linalg.solve_ex`` and the legacy ``lu`` and ``lu_solve``.

Pivots are LAPACK's: 1-based int32 row interchanges, row ``i`` swapped with row ``pivots[i] - 1`` in turn.
"""

from __future__ import annotations

import warnings

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op, with_out
from kiln._ops._meta import scalar_type_name
from kiln._ops.decompositions import LinAlgError
from kiln._ops.elementwise import _compute_np
from kiln._ops.linalg import matmul
from kiln._ops.math_args import _not_implemented
from kiln._ops.reduction import _return_type
from kiln._ops.triangular import solve_triangular
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = ["lu_factor_ex", "lu_factor", "lu", "lu_unpack", "lu_solve", "inv_ex", "solve_ex"]

TOP_LEVEL = ("legacy_lu as lu", "legacy_lu_solve as lu_solve", "lu_unpack")
"""The names ``kiln`` exports at its top level (as ``torch`` does): ``kiln.lu`` and ``kiln.lu_solve`` are the
legacy functions (:func:`legacy_lu`, :func:`legacy_lu_solve`); the others here are ``kiln.linalg``'s."""

_LuFactorExResult = _return_type("linalg_lu_factor_ex", ("LU", "pivots", "info"))
_LuFactorResult = _return_type("linalg_lu_factor", ("LU", "pivots"))
_LuResult = _return_type("linalg_lu", ("P", "L", "U"))
_LuUnpackResult = _return_type("lu_unpack", ("P", "L", "U"))
_LuWithInfoResult = _return_type("_lu_with_info", ("LU", "pivots", "info"))
_InvExResult = _return_type("linalg_inv_ex", ("inverse", "info"))
_SolveExResult = _return_type("linalg_solve_ex", ("result", "info"))


# ---------------------------------------------------------------------------------------- the factorization


def _lu_meta(A, pivot=True, check_errors=False):
    if not isinstance(A, Tensor):
        raise TypeError(f"linalg_lu_factor_ex(): argument 'A' must be Tensor, not {type(A).__name__}")
    if A.dim() < 2:
        raise RuntimeError(
            f"kiln.lu_factor: Expected tensor with 2 or more dimensions. Got size: {list(A.shape)} instead"
        )
    if A.dtype not in (dt.float32, dt.float64):
        raise _not_implemented("lu_cpu", A.dtype)
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")
    m, n = A.shape[-2:]
    batch = tuple(A.shape[:-2])
    return (
        Spec((tuple(A.shape), A.dtype, A.device)),
        Spec((batch + (min(m, n),), dt.int32, A.device)),
        Spec((batch, dt.int32, A.device)),
    )


def _lu_np(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-looking LU with partial pivoting of every matrix of ``a`` (``(b, m, n)``) at once, as LAPACK's
    getrf: the first largest ``|value|`` is the pivot; a zero pivot column is left as it is (info records
    the first, 1-based) and the elimination goes on."""
    lu = a.copy()
    b, m, n = lu.shape
    k = min(m, n)
    pivots = np.zeros((b, k), np.int32)
    info = np.zeros(b, np.int32)
    rows = np.arange(b)
    with np.errstate(all="ignore"):
        for j in range(k):
            p = j + np.argmax(np.abs(lu[:, j:, j]), axis=1)
            pivots[:, j] = p + 1
            swap = lu[rows, p].copy()
            lu[rows, p] = lu[:, j]
            lu[:, j] = swap
            pivot = lu[:, j, j]
            zero = pivot == 0
            info = np.where(zero & (info == 0), j + 1, info)
            scale = np.where(zero, 1, 1 / np.where(zero, 1, pivot))
            lu[:, j + 1 :, j] *= scale[:, None]
            lu[:, j + 1 :, j + 1 :] -= lu[:, j + 1 :, j, None] * lu[:, j, None, j + 1 :]
    return lu, pivots, info


def _lu_ref(spec, A, pivot=True, check_errors=False):
    a = A.astype(_compute_np(spec[0].dtype), copy=False)
    flat = a.reshape((int(np.prod(a.shape[:-2])),) + a.shape[-2:])
    lu, pivots, info = _lu_np(np.array(flat, copy=True))
    if check_errors:
        _raise_singular("linalg.lu_factor_ex", a, info, _lu_message)
    return lu.reshape(spec[0].shape), pivots.reshape(spec[1].shape), info.reshape(spec[2].shape)


def _lu_message(name: str, prefix: str, k: int) -> str:
    return (
        f"{name}: {prefix}U[{k},{k}] is zero and using it on lu_solve would result in a division by zero. If you "
        "still want to perform the factorization, consider calling linalg.lu(A, pivot) or linalg.lu_factor_ex(A, "
        "pivot)"
    )


def _raise_singular(name: str, a, info, message, error=LinAlgError) -> None:
    """Raise ``error`` for the first matrix whose ``info`` is not 0 (``a`` gives the batch shape for the prefix)."""
    info = np.asarray(info).reshape(-1)
    bad = np.flatnonzero(info)
    if bad.size:
        i = int(bad[0])
        prefix = f"(Batch element {i}): " if len(a.shape) > 2 else ""
        raise error(message(name, prefix, int(info[i])))


def _lu_square_backward(L: Tensor, U: Tensor, gL: Tensor, gU: Tensor) -> Tensor:
    """The gradient of ``P^T A = L U`` for square factors: ``L^-T (tril(L^T gL, -1) + triu(gU U^T)) U^-T``."""
    inner = matmul(L.mT, gL).tril(-1) + matmul(gU, U.mT).triu()
    left = solve_triangular(L.mT, inner, upper=True, unitriangular=True)
    return solve_triangular(U.mT, left, upper=False, left=False)


def _lu_backward(grads, A, result):
    gLU = grads[0]
    if gLU is None:
        return None
    P, L, U = lu_unpack(result[0], result[1])
    m, n = A.shape[-2], A.shape[-1]
    k = min(m, n)
    gL, gU = gLU.tril(-1)[..., :, :k], gLU.triu()[..., :k, :]
    if m == n:
        g = _lu_square_backward(L, U, gL, gU)
    elif m < n:  # A = P L [U1 | U2]: U2 = L^-1 P^T A2 also depends on L
        U1, U2, gU1, gU2 = U[..., :, :m], U[..., :, m:], gU[..., :, :m], gU[..., :, m:]
        gA2 = solve_triangular(L.mT, gU2, upper=True, unitriangular=True)
        g1 = _lu_square_backward(L, U1, gL - matmul(gA2, U2.mT), gU1)
        from kiln._ops.shape import cat

        g = cat([g1, gA2], -1)
    else:  # P^T A = [L1; L2] U: L2 = A2 U^-1 also depends on U
        L1, L2, gL1, gL2 = L[..., :n, :], L[..., n:, :], gL[..., :n, :], gL[..., n:, :]
        gA2 = solve_triangular(U.mT, gL2, upper=False, left=False)
        g1 = _lu_square_backward(L1, U, gL1, gU - matmul(L2.mT, gA2))
        from kiln._ops.shape import cat

        g = cat([g1, gA2], -2)
    return matmul(P, g)


@op(
    tags=("linalg",),
    meta=_lu_meta,
    reference=_lu_ref,
    backward=_lu_backward,
    autocast="fp32",
    num_outputs=3,
    differentiable_outputs=(0,),
    grad_fn_name="LinalgLuFactorExBackward0",
)
def _linalg_lu_factor_ex(A: Tensor, pivot: bool = True, check_errors: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Packed LU factors, pivots and info."""


def lu_factor_ex(A: Tensor, *, pivot: bool = True, check_errors: bool = False):
    """``(LU, pivots, info)``: the LU factorization with partial pivoting of a (batch of) matrices, ``L``
    (unit diagonal left out) and ``U`` packed in ``LU``; ``info`` is 0, or the 1-based index of the first zero
    pivot (then ``check_errors`` raises). A named tuple."""
    return _LuFactorExResult(*_linalg_lu_factor_ex(A, pivot, check_errors))


def lu_factor(A: Tensor, *, pivot: bool = True):
    """``(LU, pivots)`` of :func:`lu_factor_ex`; a zero pivot raises :class:`~kiln.linalg.LinAlgError`."""
    LU, pivots, info = _linalg_lu_factor_ex(A, pivot, False)
    if info.numel():
        _raise_singular("kiln.linalg.lu_factor", A, info.to("cpu").numpy(), _lu_message, RuntimeError)
    return _LuFactorResult(LU, pivots)


def _permutation(pivots: Tensor, m: int) -> np.ndarray:
    """The row order ``perm`` with ``P^T A = A[perm]`` for LAPACK pivots (host integers)."""
    piv = pivots.to("cpu").numpy().reshape(-1, pivots.shape[-1]).astype(np.int64) - 1
    perm = np.tile(np.arange(m), (piv.shape[0], 1))
    rows = np.arange(piv.shape[0])
    for i in range(piv.shape[1]):
        j = piv[:, i]
        a, b = perm[rows, i].copy(), perm[rows, j].copy()
        perm[rows, i], perm[rows, j] = b, a
    return perm.reshape(tuple(pivots.shape[:-1]) + (m,))


@with_out
def lu_unpack(LU_data: Tensor, LU_pivots: Tensor, unpack_data: bool = True, unpack_pivots: bool = True):
    """``(P, L, U)`` from the packed factors of :func:`kiln.linalg.lu_factor` (``A = P L U``); a part not
    unpacked is an empty tensor. A named tuple."""
    for name, x in (("LU_data", LU_data), ("LU_pivots", LU_pivots)):
        if not isinstance(x, Tensor):
            raise TypeError(f"lu_unpack(): argument '{name}' (position 1) must be Tensor, not {type(x).__name__}")
    if LU_data.dim() < 2:
        raise RuntimeError(
            f"kiln.lu_unpack: Expected tensor with 2 or more dimensions. Got size: {list(LU_data.shape)} instead"
        )
    if LU_pivots.dtype is not dt.int32:
        raise RuntimeError(
            "kiln.lu_unpack: LU_pivots is expected to be a contiguous tensor of kiln.int32 dtype. Note: this "
            "function is intended to be used with the output produced by kiln.linalg.lu_factor"
        )
    from kiln._ops.creation import empty, eye, tensor

    m, n = LU_data.shape[-2:]
    k = min(m, n)
    if unpack_data:
        L = LU_data.tril(-1)[..., :, :k] + eye(m, k, dtype=LU_data.dtype, device=LU_data.device)
        U = LU_data.triu()[..., :k, :]
    else:
        L = U = empty(0, dtype=LU_data.dtype, device=LU_data.device)
    if unpack_pivots:
        perm = _permutation(LU_pivots, m)
        P = tensor(np.swapaxes(np.eye(m)[perm], -1, -2), dtype=LU_data.dtype, device=LU_data.device)
        P = P.expand(tuple(LU_data.shape[:-2]) + (m, m)) if LU_data.dim() > 2 else P
    else:
        P = empty(0, dtype=LU_data.dtype, device=LU_data.device)
    return _LuUnpackResult(P, L, U)


def lu(A: Tensor, *, pivot: bool = True):
    """``(P, L, U)`` with ``A = P L U``: ``P`` a permutation matrix, ``L`` unit lower triangular (``m x k``),
    ``U`` upper triangular (``k x n``), ``k = min(m, n)``. A named tuple."""
    LU, pivots, _ = _linalg_lu_factor_ex(A, pivot, False)
    return _LuResult(*lu_unpack(LU, pivots))


def lu_solve(LU: Tensor, pivots: Tensor, B: Tensor, *, left: bool = True, adjoint: bool = False) -> Tensor:
    """The solution of ``A X = B`` from ``A``'s LU factorization (:func:`lu_factor`); ``X A = B`` with
    ``left=False``, ``A^T`` in place of ``A`` with ``adjoint``. Batch dims broadcast."""
    for name, x in (("LU", LU), ("pivots", pivots), ("B", B)):
        if not isinstance(x, Tensor):
            raise TypeError(f"linalg_lu_solve(): argument '{name}' must be Tensor, not {type(x).__name__}")
    if LU.dim() < 2:
        raise RuntimeError("linalg.lu_solve: The input tensor A must have at least 2 dimensions.")
    if B.dim() < 2:
        raise RuntimeError("linalg.lu_solve: The input tensor B must have at least 2 dimensions.")
    n = LU.shape[-1]
    if LU.shape[-2] != n:
        raise RuntimeError(
            f"kiln.linalg.lu_solve: A must be batches of square matrices, but they are {LU.shape[-2]} by {n} matrices"
        )
    rows, cols = B.shape[-2:]
    if (rows if left else cols) != n:
        eq = "AX = B" if left else "XA = B"
        raise RuntimeError(
            f"linalg.lu_solve: Incompatible shapes of A and B for the equation {eq} ({n}x{n} and {rows}x{cols})"
        )
    if LU.dtype is not B.dtype:
        raise RuntimeError(
            f"linalg.lu_solve: Expected LU and B to have the same dtype, but found LU of type "
            f"{scalar_type_name(LU.dtype)} and B of type {scalar_type_name(B.dtype)} instead"
        )
    if pivots.dtype is not dt.int32:
        raise RuntimeError("linalg.lu_solve: pivots should be a Tensor of scalar type kiln.int32")
    P, L, U = lu_unpack(LU, pivots)
    if left and not adjoint:  # A X = B: X = U^-1 L^-1 P^T B
        y = solve_triangular(L, matmul(P.mT, B), upper=False, unitriangular=True)
        return solve_triangular(U, y, upper=True)
    if left:  # A^T X = B: X = P L^-T U^-T B
        y = solve_triangular(U.mT, B, upper=False)
        return matmul(P, solve_triangular(L.mT, y, upper=True, unitriangular=True))
    if not adjoint:  # X A = B: X = B U^-1 L^-1 P^T
        y = solve_triangular(U, B, upper=True, left=False)
        return matmul(solve_triangular(L, y, upper=False, left=False, unitriangular=True), P.mT)
    # X A^T = B: X = B P L^-T U^-T
    y = solve_triangular(L.mT, matmul(B, P), upper=True, left=False, unitriangular=True)
    return solve_triangular(U.mT, y, upper=False, left=False)


# ---------------------------------------------------------------------------------------- inverses and solves


def _inv_message(name: str, prefix: str, k: int) -> str:
    return (
        f"{name}: {prefix}The diagonal element {k} is zero, the inversion could not be completed because the input "
        "matrix is singular."
    )


def inv_ex(A: Tensor, *, check_errors: bool = False):
    """``(inverse, info)``: the inverse of a (batch of) square matrices and per matrix 0, or the 1-based index
    of the first zero pivot of its LU factorization (there the inverse holds infinities or NaN;
    ``check_errors`` raises :class:`~kiln.linalg.LinAlgError` instead). A named tuple."""
    from kiln._ops.decompositions import _square_meta, inv

    _square_meta("inv", A)
    LU, pivots, info = _linalg_lu_factor_ex(A, True, False)
    host = info.to("cpu").numpy()
    if check_errors:
        _raise_singular("linalg.inv_ex", A, host, _inv_message)
    if not host.any():
        return _InvExResult(inv(A), info)
    from kiln._ops.creation import eye

    return _InvExResult(lu_solve(LU, pivots, eye(A.shape[-1], dtype=A.dtype, device=A.device).expand(A.shape)), info)


def solve_ex(A: Tensor, B: Tensor, *, left: bool = True, check_errors: bool = False):
    """``(result, info)``: :func:`kiln.linalg.solve` that reports a singular ``A`` in ``info`` (the 1-based
    index of the first zero pivot; the result then holds infinities or NaN) unless ``check_errors``. A named
    tuple."""
    from kiln._ops.decompositions import solve

    if not isinstance(A, Tensor):
        raise TypeError(f"linalg_solve_ex(): argument 'A' must be Tensor, not {type(A).__name__}")
    from kiln._ops.decompositions import _square_meta

    _square_meta("solve_ex", A)
    LU, pivots, info = _linalg_lu_factor_ex(A, True, False)
    host = info.to("cpu").numpy()
    if host.any():
        if check_errors:
            raise LinAlgError("kiln.linalg.solve_ex: The solver failed because the input matrix is singular.")
        vector = B.dim() == 1 or (B.dim() == A.dim() - 1 and tuple(B.shape) == tuple(A.shape[:-1]))
        rhs = B.unsqueeze(-1) if vector else B
        x = lu_solve(LU, pivots, rhs, left=left)
        return _SolveExResult(x.squeeze(-1) if vector else x, info)
    return _SolveExResult(solve(A, B, left=left), info)


# ---------------------------------------------------------------------------------------- legacy names


def legacy_lu(A: Tensor, pivot: bool = True, get_infos: bool = False, out=None):
    """``(LU, pivots)`` (and ``info`` with ``get_infos``) of :func:`kiln.linalg.lu_factor_ex` (deprecated as in
    PyTorch: use :func:`kiln.linalg.lu_factor` or :func:`kiln.linalg.lu_factor_ex`)."""
    warnings.warn(
        "kiln.lu is deprecated in favor of kiln.linalg.lu_factor / kiln.linalg.lu_factor_ex and will be removed "
        "in a future kiln release.\nLU, pivots = kiln.lu(A, compute_pivots)\nshould be replaced with\nLU, pivots "
        "= kiln.linalg.lu_factor(A, compute_pivots)\nand\nLU, pivots, info = kiln.lu(A, compute_pivots, "
        "get_infos=True)\nshould be replaced with\nLU, pivots, info = kiln.linalg.lu_factor_ex(A, compute_pivots)",
        UserWarning,
        stacklevel=2,
    )
    if out is not None:
        raise NotImplementedError("kiln.lu: out= is not supported")
    LU, pivots, info = _linalg_lu_factor_ex(A, pivot, False)
    return _LuWithInfoResult(LU, pivots, info) if get_infos else (LU, pivots)


@with_out
def legacy_lu_solve(b: Tensor, LU_data: Tensor, LU_pivots: Tensor) -> Tensor:
    """``kiln.linalg.lu_solve(LU_data, LU_pivots, b)`` (deprecated as in PyTorch, which swapped the arguments)."""
    warnings.warn(
        "kiln.lu_solve is deprecated in favor of kiln.linalg.lu_solveand will be removed in a future PyTorch "
        "release.\nNote that kiln.linalg.lu_solve has its arguments reversed.\nX = kiln.lu_solve(B, LU, pivots)\n"
        "should be replaced with\nX = kiln.linalg.lu_solve(LU, pivots, B)",
        UserWarning,
        stacklevel=2,
    )
    return lu_solve(LU_data, LU_pivots, b)


legacy_lu.__name__ = legacy_lu.__qualname__ = "lu"
legacy_lu_solve.__name__ = legacy_lu_solve.__qualname__ = "lu_solve"


def _tensor_lu(self: Tensor, pivot: bool = True, get_infos: bool = False):
    """``kiln.lu(self, pivot, get_infos)``."""
    return legacy_lu(self, pivot, get_infos)


Tensor.lu = _tensor_lu
Tensor.lu_solve = legacy_lu_solve

"""The LDL factorization of symmetric matrices with Bunch-Kaufman pivoting: ``linalg.ldl_factor_ex``,
``linalg.ldl_factor`` and ``linalg.ldl_solve``, in LAPACK's compact format (``sytrf``/``sytrs``, lower
triangle): ``L`` below the diagonal, ``D``'s 1x1 and 2x2 blocks on and next to it, and 1-based pivots that
are negative (and repeated) for a 2x2 block. Neither is differentiable, as in PyTorch.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import scalar_type_name
from kiln._ops.decompositions import _flat
from kiln._ops.elementwise import _compute_np
from kiln._ops.reduction import _return_type
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = ["ldl_factor_ex", "ldl_factor", "ldl_solve"]

_LdlFactorExResult = _return_type("linalg_ldl_factor_ex", ("LD", "pivots", "info"))
_LdlFactorResult = _return_type("linalg_ldl_factor", ("LD", "pivots"))

_ALPHA = (1 + math.sqrt(17)) / 8  # Bunch and Kaufman's growth bound


def _not_differentiable(name: str):
    def backward(grads):
        raise RuntimeError(f"derivative for aten::{name} is not implemented")

    return backward


# ---------------------------------------------------------------------------------------- factor


def _ldl_factor_np(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Bunch-Kaufman ``A = P L D L^T P^T`` of one symmetric matrix from its lower triangle, step by step as
    LAPACK's unblocked ``sytf2`` ('L'): the factor in the compact format, the pivots and the info (the first
    zero 1x1 pivot, 1-based; 0 when none)."""
    a = np.tril(a).astype(a.dtype, copy=True)
    n = a.shape[0]
    pivots = np.zeros(n, np.int32)
    info = 0
    k = 0
    while k < n:
        step = 1
        absakk = abs(a[k, k])
        if k < n - 1:
            imax = k + 1 + int(np.argmax(np.abs(a[k + 1 :, k])))
            colmax = abs(a[imax, k])
        else:
            imax, colmax = k, 0.0
        if max(absakk, colmax) == 0 or math.isnan(absakk):
            info = info or k + 1
            kp = k
        else:
            if absakk >= _ALPHA * colmax:
                kp = k
            else:
                rowmax = np.max(np.abs(a[imax, k:imax]))
                if imax < n - 1:
                    rowmax = max(rowmax, np.max(np.abs(a[imax + 1 :, imax])))
                if absakk >= _ALPHA * colmax * (colmax / rowmax):
                    kp = k
                elif abs(a[imax, imax]) >= _ALPHA * rowmax:
                    kp = imax
                else:
                    kp, step = imax, 2
            kk = k + step - 1
            if kp != kk:  # symmetric interchange of rows and columns kk and kp of the trailing matrix
                a[kp + 1 :, [kk, kp]] = a[kp + 1 :, [kp, kk]]
                between = slice(kk + 1, kp)
                a[between, kk], a[kp, between] = a[kp, between].copy(), a[between, kk].copy()
                a[kk, kk], a[kp, kp] = a[kp, kp], a[kk, kk]
                if step == 2:
                    a[k + 1, k], a[kp, k] = a[kp, k], a[k + 1, k]
            if step == 1:
                if k < n - 1:
                    d11 = 1 / a[k, k]
                    x = a[k + 1 :, k].copy()
                    a[k + 1 :, k + 1 :] -= np.tril(d11 * np.outer(x, x))
                    a[k + 1 :, k] = x * d11
            elif k < n - 2:
                d21 = a[k + 1, k]
                d11 = a[k + 1, k + 1] / d21
                d22 = a[k, k] / d21
                t = 1 / (d11 * d22 - 1)
                d21 = t / d21
                for j in range(k + 2, n):
                    wk = d21 * (d11 * a[j, k] - a[j, k + 1])
                    wkp1 = d21 * (d22 * a[j, k + 1] - a[j, k])
                    a[j:, j] -= a[j:, k] * wk + a[j:, k + 1] * wkp1
                    a[j, k], a[j, k + 1] = wk, wkp1
        if step == 1:
            pivots[k] = kp + 1
        else:
            pivots[k] = pivots[k + 1] = -(kp + 1)
        k += step
    return a, pivots, info


def _ldl_meta(A, hermitian=False, check_errors=False):
    if not isinstance(A, Tensor):
        raise TypeError(f"linalg_ldl_factor_ex(): argument 'A' must be Tensor, not {type(A).__name__}")
    name = "kiln.linalg.ldl_factor_ex"
    if A.dim() < 2:
        raise RuntimeError(f"{name}: The input tensor A must have at least 2 dimensions.")
    if A.shape[-1] != A.shape[-2]:
        raise RuntimeError(
            f"{name}: A must be batches of square matrices, but they are {A.shape[-2]} by {A.shape[-1]} matrices"
        )
    if A.dtype not in (dt.float32, dt.float64):
        raise RuntimeError(
            f"{name}: Expected a floating point or complex tensor as input. Got {scalar_type_name(A.dtype)}"
        )
    batch = tuple(A.shape[:-2])
    return (
        Spec((tuple(A.shape), A.dtype, A.device)),
        Spec((batch + (A.shape[-1],), dt.int32, A.device)),
        Spec((batch, dt.int32, A.device)),
    )


def _ldl_ref(spec, A, hermitian=False, check_errors=False):
    a = A.astype(_compute_np(spec[0].dtype), copy=False)
    flat = _flat(a) if a.shape[-1] else a.reshape((-1,) + a.shape[-2:])
    out = np.zeros(flat.shape, flat.dtype)
    pivots = np.zeros(flat.shape[:2], np.int32)
    info = np.zeros(flat.shape[0], np.int32)
    with np.errstate(all="ignore"):
        for i, m in enumerate(flat):
            out[i], pivots[i], info[i] = _ldl_factor_np(m)
    if check_errors and info.any():
        i = int(np.flatnonzero(info)[0])
        prefix = f"(Batch element {i}): " if a.ndim > 2 else ""
        raise RuntimeError(
            f"kiln.linalg.ldl_factor_ex: {prefix}The factorization could not be completed because "
            f"the block diagonal matrix is singular: D[{info[i]},{info[i]}] is zero."
        )
    return out.reshape(spec[0].shape), pivots.reshape(spec[1].shape), info.reshape(spec[2].shape)


@op(
    tags=("linalg",),
    meta=_ldl_meta,
    reference=_ldl_ref,
    backward=_not_differentiable("linalg_ldl_factor_ex"),
    num_outputs=3,
    differentiable_outputs=(0,),
)
def _linalg_ldl_factor_ex(
    A: Tensor, hermitian: bool = False, check_errors: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """Compact LDL factor, pivots and info."""


def ldl_factor_ex(A: Tensor, *, hermitian: bool = False, check_errors: bool = False):
    """``(LD, pivots, info)``: the Bunch-Kaufman LDL factorization ``A = P L D L^T P^T`` of a (batch of)
    symmetric matrices read from their lower triangles, in LAPACK's compact format; ``info`` is 0 or the
    1-based index of the first zero 1x1 block of ``D`` (``check_errors`` raises then). Real matrices make
    ``hermitian`` irrelevant. Not differentiable. A named tuple."""
    return _LdlFactorExResult(*_linalg_ldl_factor_ex(A, hermitian, check_errors))


def ldl_factor(A: Tensor, *, hermitian: bool = False):
    """``(LD, pivots)`` of :func:`ldl_factor_ex`; a singular ``D`` raises ``RuntimeError``. A named tuple."""
    LD, pivots, info = _linalg_ldl_factor_ex(A, hermitian, False)
    host = info.to("cpu").numpy().reshape(-1)
    if host.any():
        i = int(np.flatnonzero(host)[0])
        prefix = f"(Batch element {i}): " if A.dim() > 2 else ""
        raise RuntimeError(
            f"kiln.linalg.ldl_factor: {prefix}The factorization could not be completed because the block diagonal "
            f"matrix is singular: D[{host[i]},{host[i]}] is zero."
        )
    return _LdlFactorResult(LD, pivots)


# ---------------------------------------------------------------------------------------- solve


def _ldl_solve_np(ld: np.ndarray, pivots: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``A X = B`` from ``A``'s compact LDL factor, as LAPACK's ``sytrs`` ('L'): ``L D`` forward, then ``L^T``
    backward, applying the interchanges on the way."""
    b = b.copy()
    n = ld.shape[0]
    k = 0
    while k < n:
        if pivots[k] > 0:
            kp = pivots[k] - 1
            b[[k, kp]] = b[[kp, k]]
            b[k + 1 :] -= np.outer(ld[k + 1 :, k], b[k])
            b[k] /= ld[k, k]
            k += 1
        else:
            kp = -pivots[k] - 1
            b[[k + 1, kp]] = b[[kp, k + 1]]
            b[k + 2 :] -= np.outer(ld[k + 2 :, k], b[k]) + np.outer(ld[k + 2 :, k + 1], b[k + 1])
            akm1k = ld[k + 1, k]
            akm1 = ld[k, k] / akm1k
            ak = ld[k + 1, k + 1] / akm1k
            denom = akm1 * ak - 1
            bkm1, bk = b[k] / akm1k, b[k + 1] / akm1k
            b[k], b[k + 1] = (ak * bkm1 - bk) / denom, (akm1 * bk - bkm1) / denom
            k += 2
    k = n - 1
    while k >= 0:
        if pivots[k] > 0:
            b[k] -= ld[k + 1 :, k] @ b[k + 1 :]
            kp = pivots[k] - 1
            b[[k, kp]] = b[[kp, k]]
            k -= 1
        else:
            b[k] -= ld[k + 1 :, k] @ b[k + 1 :]
            b[k - 1] -= ld[k + 1 :, k - 1] @ b[k + 1 :]
            kp = -pivots[k] - 1
            b[[k, kp]] = b[[kp, k]]
            k -= 2
    return b


def _ldl_solve_meta(LD, pivots, B, hermitian=False):
    for name, x in (("LD", LD), ("pivots", pivots), ("B", B)):
        if not isinstance(x, Tensor):
            raise TypeError(f"linalg_ldl_solve(): argument '{name}' must be Tensor, not {type(x).__name__}")
    if LD.dim() < 2:
        raise RuntimeError("kiln.linalg.ldl_solve: The input tensor LD must have at least 2 dimensions.")
    if B.dim() < 2:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-max(B.dim(), 1)}, {max(B.dim(), 1) - 1}], but got -2)"
        )
    if B.dtype is not LD.dtype:
        raise RuntimeError(
            f"Expected b and A to have the same dtype, but found b of type {scalar_type_name(B.dtype)} and A of type "
            f"{scalar_type_name(LD.dtype)} instead."
        )
    n = LD.shape[-1]
    if LD.shape[-2] != n or B.shape[-2] != n:
        raise RuntimeError(
            f"Incompatible matrix sizes for kiln.linalg.ldl_solve: each A matrix is {LD.shape[-2]} by {n} but each b "
            f"matrix is {B.shape[-2]} by {B.shape[-1]}"
        )
    if pivots.dtype.is_floating_point or pivots.dtype is dt.bool:
        raise RuntimeError(
            f"kiln.linalg.ldl_solve: Expected pivots to be integers. Got {scalar_type_name(pivots.dtype)}"
        )
    from kiln._ops._meta import broadcast_shapes

    batch = broadcast_shapes(tuple(LD.shape[:-2]), tuple(B.shape[:-2]))
    return Spec((tuple(batch) + tuple(B.shape[-2:]), B.dtype, B.device))


def _ldl_solve_ref(spec, LD, pivots, B, hermitian=False):
    compute = _compute_np(spec.dtype)
    batch = spec.shape[:-2]
    ld = np.broadcast_to(LD.astype(compute, copy=False), batch + LD.shape[-2:]).reshape((-1,) + LD.shape[-2:])
    piv = np.broadcast_to(pivots.astype(np.int64), batch + pivots.shape[-1:]).reshape(-1, pivots.shape[-1])
    b = np.broadcast_to(B.astype(compute, copy=False), spec.shape).reshape((-1,) + spec.shape[-2:])
    out = np.empty(b.shape, compute)
    with np.errstate(all="ignore"):
        for i in range(b.shape[0]):
            out[i] = _ldl_solve_np(ld[i], piv[i], b[i])
    return out.reshape(spec.shape)


@op(
    tags=("linalg",),
    meta=_ldl_solve_meta,
    reference=_ldl_solve_ref,
    backward=lambda grad: _not_differentiable("linalg_ldl_solve")(grad),
)
def ldl_solve(LD: Tensor, pivots: Tensor, B: Tensor, *, hermitian: bool = False) -> Tensor:
    """The solution of ``A X = B`` from ``A``'s compact LDL factorization (:func:`ldl_factor`); batch dims
    broadcast. Not differentiable."""

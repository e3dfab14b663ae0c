"""Triangular and Cholesky solves: ``linalg.solve_triangular`` and ``cholesky_solve`` (ops with reference
kernels and backward formulas in kiln ops that use the ops themselves, so higher-order gradients work),
``linalg.cholesky_ex`` (an op), and the composites ``cholesky_inverse`` and the legacy ``triangular_solve`` and
``cholesky``.
"""

from __future__ import annotations

import warnings

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op, with_out
from kiln._ops._meta import broadcast_shapes, scalar_type_name
from kiln._ops.decompositions import LinAlgError, _batch_prefix, _cholesky_backward, _flat, _square_meta
from kiln._ops.elementwise import _compute_np
from kiln._ops.linalg import matmul
from kiln._ops.math_args import _not_implemented
from kiln._ops.reduction import _return_type
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = ["solve_triangular", "cholesky_ex", "cholesky_solve", "cholesky_inverse", "triangular_solve", "cholesky"]

TOP_LEVEL = ("cholesky", "cholesky_inverse", "cholesky_solve", "triangular_solve")
"""The names ``kiln`` exports at its top level (as ``torch`` does); the others are ``kiln.linalg``'s."""

_TriangularSolveResult = _return_type("triangular_solve", ("solution", "cloned_coefficient"))
_CholeskyExResult = _return_type("linalg_cholesky_ex", ("L", "info"))


def _need_tensor(name: str, op_name: str, x) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op_name}(): argument '{name}' must be Tensor, not {type(x).__name__}")


def _float_kernel(kernel: str, *tensors) -> None:
    for t in tensors:
        if t.dtype not in (dt.float32, dt.float64):
            raise _not_implemented(kernel, t.dtype)


# ---------------------------------------------------------------------------------------- solve_triangular


def _solve_triangular_meta(A, B, upper, left=True, unitriangular=False):
    _need_tensor("A", "linalg_solve_triangular", A)
    _need_tensor("B", "linalg_solve_triangular", B)
    if B.dim() < 2:
        raise RuntimeError("linalg.solve_triangular: The input tensor B must have at least 2 dimensions.")
    _square_meta("solve_triangular", A, min_float=False)
    _float_kernel("triangular_solve_cpu", A, B)
    n = A.shape[-1]
    rows, cols = B.shape[-2], B.shape[-1]
    if (rows if left else cols) != n:
        eq = "AX = B" if left else "XA = B"
        raise RuntimeError(
            f"linalg.solve_triangular: Incompatible shapes of A and B for the equation {eq} ({n}x{n} and {rows}x{cols})"
        )
    batch = broadcast_shapes(tuple(A.shape[:-2]), tuple(B.shape[:-2]))
    return Spec((tuple(batch) + (rows, cols), A.dtype, A.device))


def _solve_triangular_np(a: np.ndarray, b: np.ndarray, upper: bool, unit: bool) -> np.ndarray:
    """``A X = B`` for triangular ``A`` (only its ``upper`` or lower triangle is read), by substitution, one
    row at a time over every batch element and right-hand side at once; a zero pivot gives inf/NaN."""
    n = a.shape[-1]
    x = np.zeros(b.shape, b.dtype)
    order = range(n - 1, -1, -1) if upper else range(n)
    with np.errstate(all="ignore"):
        for i in order:
            rest = slice(i + 1, n) if upper else slice(0, i)
            acc = b[..., i, :] - np.einsum("...j,...jk->...k", a[..., i, rest], x[..., rest, :])
            x[..., i, :] = acc if unit else acc / a[..., i, i][..., None]
    return x


def _solve_triangular_ref(spec, A, B, upper, left=True, unitriangular=False):
    compute = _compute_np(spec.dtype)
    a, b = A.astype(compute, copy=False), B.astype(compute, copy=False)
    batch = spec.shape[:-2]
    a = np.broadcast_to(a, batch + a.shape[-2:])
    b = np.broadcast_to(b, batch + b.shape[-2:])
    if left:
        return _solve_triangular_np(a, b, upper, unitriangular)
    # X A = B  <=>  A^T X^T = B^T, whose matrix is triangular the other way round
    x = _solve_triangular_np(np.swapaxes(a, -1, -2), np.swapaxes(b, -1, -2), not upper, unitriangular)
    return np.swapaxes(x, -1, -2).copy()


def _solve_triangular_backward(grad, A, upper, left, unitriangular, result, needs_input_grad):
    # X = A^-1 B: gB = A^-T gX and gA = -gB X^T (X = B A^-1: gB = gX A^-T, gA = -X^T gB), kept to the
    # triangle A's values are read from (its strict part when the diagonal is taken as ones)
    gB = solve_triangular(A.mT, grad, upper=not upper, left=left, unitriangular=unitriangular)
    gA = None
    if needs_input_grad[0]:
        gA = -matmul(gB, result.mT) if left else -matmul(result.mT, gB)
        offset = 1 if unitriangular else 0
        gA = gA.triu(offset) if upper else gA.tril(-offset)
    return (gA, gB if needs_input_grad[1] else None)


@op(
    tags=("linalg",),
    meta=_solve_triangular_meta,
    reference=_solve_triangular_ref,
    backward=_solve_triangular_backward,
    autocast="fp32",
    grad_fn_name="LinalgSolveTriangularBackward0",
)
def solve_triangular(A: Tensor, B: Tensor, *, upper: bool, left: bool = True, unitriangular: bool = False) -> Tensor:
    """The solution ``X`` of ``A X = B`` (``X A = B`` with ``left=False``) for a (batch of) triangular ``A``:
    only its ``upper`` or lower triangle is read, and its diagonal is taken as ones with ``unitriangular``.
    Batch dims broadcast; a zero on the diagonal gives infinities or NaN, not an error."""


# ---------------------------------------------------------------------------------------- cholesky_ex


def _cholesky_ex_meta(A, upper=False, check_errors=False):
    _square_meta("cholesky", A)
    return (Spec((A.shape, A.dtype, A.device)), Spec((A.shape[:-2], dt.int32, A.device)))


def _cholesky_partial(m: np.ndarray) -> tuple[np.ndarray, int]:
    """Left-looking Cholesky of the lower triangle of ``m``: the factor and 0, or, at the first column ``j``
    whose pivot is not positive, the columns before ``j``, that pivot unrooted, the rest of the lower triangle
    as given, and ``j + 1`` (what PyTorch's CPU kernel leaves behind)."""
    a = np.tril(m).astype(m.dtype, copy=True)
    n = a.shape[0]
    for j in range(n):
        d = a[j, j] - a[j, :j] @ a[j, :j]
        if not d > 0:
            a[j, j] = d
            return a, j + 1
        a[j, j] = np.sqrt(d)
        a[j + 1 :, j] = (a[j + 1 :, j] - a[j + 1 :, :j] @ a[j, :j]) / a[j, j]
    return a, 0


def _cholesky_ex_ref(spec, A, upper=False, check_errors=False):
    a = A.astype(_compute_np(spec[0].dtype), copy=False)
    if upper:  # the upper triangle is read: factor its transpose and transpose back
        a = np.swapaxes(a, -1, -2)
    flat = _flat(a) if a.size else a.reshape((0,) + a.shape[-2:])
    out = np.zeros(flat.shape, flat.dtype)
    info = np.zeros(flat.shape[0], np.int32)
    for i, m in enumerate(flat):
        out[i], info[i] = _cholesky_partial(m)
        if info[i] and check_errors:
            raise LinAlgError(
                f"linalg.cholesky_ex: {_batch_prefix(a, i)}The factorization could not be completed because the "
                f"input is not positive-definite (the leading minor of order {info[i]} is not positive-definite)."
            )
    out = out.reshape(a.shape)
    if upper:
        out = np.swapaxes(out, -1, -2).copy()
    return out, info.reshape(spec[1].shape)


@op(
    tags=("linalg",),
    meta=_cholesky_ex_meta,
    reference=_cholesky_ex_ref,
    backward=lambda grads, upper, result: None if grads[0] is None else _cholesky_backward(grads[0], result[0], upper),
    autocast="fp32",
    num_outputs=2,
    differentiable_outputs=(0,),
    grad_fn_name="LinalgCholeskyExBackward0",
)
def _cholesky_ex(A: Tensor, upper: bool = False, check_errors: bool = False) -> tuple[Tensor, Tensor]:
    """Cholesky factor and LAPACK-style info."""


def cholesky_ex(A: Tensor, *, upper: bool = False, check_errors: bool = False):
    """``(L, info)``: the Cholesky factor of a (batch of) symmetric matrices (read from the lower triangle, the
    upper with ``upper``) and per matrix 0, or the order of the first leading minor that is not
    positive-definite; there the factor holds the columns computed before it. ``check_errors`` raises
    :class:`~kiln.linalg.LinAlgError` instead. A named tuple."""
    return _CholeskyExResult(*_cholesky_ex(A, upper, check_errors))


# ---------------------------------------------------------------------------------------- composites


def _check_same_dtype(message: str, b: Tensor, a: Tensor) -> None:
    if b.dtype is not a.dtype:
        raise RuntimeError(message.format(b=scalar_type_name(b.dtype), a=scalar_type_name(a.dtype)))


def _cholesky_solve_meta(input, input2, upper=False):
    _need_tensor("input", "cholesky_solve", input)
    _need_tensor("input2", "cholesky_solve", input2)
    if input.dim() < 2:
        raise RuntimeError(f"b should have at least 2 dimensions, but has {input.dim()} dimensions instead")
    if input2.dim() < 2:
        raise RuntimeError(f"u should have at least 2 dimensions, but has {input2.dim()} dimensions instead")
    _check_same_dtype(
        "Expected b and A to have the same dtype, but found b of type {b} and A of type {a} instead.", input, input2
    )
    n = input2.shape[-1]
    if input2.shape[-2] != n or input.shape[-2] != n:
        raise RuntimeError(
            f"Incompatible matrix sizes for cholesky_solve: each A matrix is {input2.shape[-2]} by {n} but each b "
            f"matrix is {input.shape[-2]} by {input.shape[-1]}"
        )
    _float_kernel("cholesky_solve_cpu", input)
    batch = broadcast_shapes(tuple(input.shape[:-2]), tuple(input2.shape[:-2]))
    return Spec((tuple(batch) + tuple(input.shape[-2:]), input.dtype, input.device))


def _cholesky_solve_ref(spec, b, factor, upper=False):
    compute = _compute_np(spec.dtype)
    batch = spec.shape[:-2]
    f = np.broadcast_to(factor.astype(compute, copy=False), batch + factor.shape[-2:])
    rhs = np.broadcast_to(b.astype(compute, copy=False), spec.shape)
    lower = np.swapaxes(f, -1, -2) if upper else f  # A = L L^T with L read from the given triangle
    y = _solve_triangular_np(lower, rhs, False, False)
    return _solve_triangular_np(np.swapaxes(lower, -1, -2), y, True, False)


def _cholesky_solve_backward(grad, input2, upper, result, needs_input_grad):
    # X = A^-1 B with A = L L^T: gB = A^-1 gX, and L's gradient -(gB X^T + X gB^T) L (U (...) for upper), the
    # whole matrix as PyTorch's formula gives it; written with the op itself, so it is differentiable again
    gB = cholesky_solve(grad, input2, upper)
    gL = None
    if needs_input_grad[1]:
        common = matmul(gB, result.mT)
        common = common + common.mT
        gL = -matmul(input2, common) if upper else -matmul(common, input2)
    return (gB if needs_input_grad[0] else None, gL)


@op(
    tags=("linalg",),
    meta=_cholesky_solve_meta,
    reference=_cholesky_solve_ref,
    backward=_cholesky_solve_backward,
    autocast="fp32",
    methods=("cholesky_solve",),
    grad_fn_name="CholeskySolveBackward0",
)
def cholesky_solve(input: Tensor, input2: Tensor, upper: bool = False) -> Tensor:
    """The solution ``X`` of ``A X = B`` (``B`` is ``input``) given the Cholesky factor ``input2`` of ``A``
    (``A = L L^T`` from its lower triangle, or ``U^T U`` from its upper with ``upper``); batch dims broadcast."""


@with_out
def cholesky_inverse(L: Tensor, upper: bool = False) -> Tensor:
    """The inverse of ``A`` given its Cholesky factor (``A = L L^T``, or ``U^T U`` with ``upper``); raises
    :class:`~kiln.linalg.LinAlgError` when a diagonal element of the factor is zero."""
    _need_tensor("input", "cholesky_inverse", L)
    if L.dim() < 2:
        raise RuntimeError("cholesky_inverse: The input tensor A must have at least 2 dimensions.")
    if L.shape[-1] != L.shape[-2]:
        raise RuntimeError(
            f"cholesky_inverse: A must be batches of square matrices, but they are {L.shape[-2]} by {L.shape[-1]} "
            "matrices"
        )
    _float_kernel("cholesky_inverse_out_cpu", L)
    if L.numel():
        zero = (L.diagonal(0, -2, -1) == 0).reshape(-1, L.shape[-1])
        hits = zero.any(-1)
        if bool(hits.any()):
            i = int(hits.to(dt.uint8).argmax().item())
            k = int(zero[i].to(dt.uint8).argmax().item()) + 1
            prefix = f"(Batch element {i}): " if L.dim() > 2 else ""
            raise LinAlgError(
                f"cholesky_inverse: {prefix}The diagonal element {k} is zero, the inversion could not be completed "
                "because the input matrix is singular."
            )
    from kiln._ops.creation import eye

    identity = eye(L.shape[-1], dtype=L.dtype, device=L.device).expand(L.shape)
    return cholesky_solve(identity, L, upper)


@with_out
def triangular_solve(b: Tensor, A: Tensor, upper: bool = True, transpose: bool = False, unitriangular: bool = False):
    """``(solution, cloned_coefficient)``: the solution of ``A X = b`` (``A^T X = b`` with ``transpose``) for
    triangular ``A`` and a copy of ``A`` broadcast to the batch (deprecated as in PyTorch: use
    :func:`kiln.linalg.solve_triangular`, whose arguments are swapped). A named tuple."""
    warnings.warn(
        "kiln.triangular_solve is deprecated in favor of kiln.linalg.solve_triangularand will be removed in a "
        "future kiln release.\nkiln.linalg.solve_triangular has its arguments reversed and does not return a "
        "copy of one of the inputs.\nX = kiln.triangular_solve(B, A).solution\nshould be replaced with\nX = "
        "kiln.linalg.solve_triangular(A, B).",
        UserWarning,
        stacklevel=2,
    )
    _need_tensor("input", "triangular_solve", b)
    _need_tensor("A", "triangular_solve", A)
    if b.dim() < 2:
        raise RuntimeError(
            f"kiln.triangular_solve: Expected b to have at least 2 dimensions, but it has {b.dim()} dimensions instead"
        )
    if A.dim() < 2:
        raise RuntimeError(
            f"kiln.triangular_solve: Expected A to have at least 2 dimensions, but it has {A.dim()} dimensions instead"
        )
    coefficient = A.mT if transpose else A
    solution = solve_triangular(coefficient, b, upper=upper != transpose, unitriangular=unitriangular)
    batch = tuple(solution.shape[:-2])
    return _TriangularSolveResult(solution, A.expand(batch + tuple(A.shape[-2:])).clone())


def cholesky(input: Tensor, upper: bool = False) -> Tensor:
    """The Cholesky factor (deprecated as in PyTorch: use :func:`kiln.linalg.cholesky`)."""
    warnings.warn(
        "kiln.cholesky is deprecated in favor of kiln.linalg.cholesky and will be removed in a future PyTorch "
        "release.\nL = kiln.cholesky(A)\nshould be replaced with\nL = kiln.linalg.cholesky(A)\nand\nU = "
        "kiln.cholesky(A, upper=True)\nshould be replaced with\nU = kiln.linalg.cholesky(A).mH\nThis transform "
        "will produce equivalent results for all valid (symmetric positive definite) inputs.",
        UserWarning,
        stacklevel=2,
    )
    from kiln._ops.decompositions import cholesky as linalg_cholesky

    return linalg_cholesky(input, upper=upper)


Tensor.cholesky = cholesky
Tensor.cholesky_inverse = cholesky_inverse
Tensor.triangular_solve = triangular_solve

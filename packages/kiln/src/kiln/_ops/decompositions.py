"""The ``kiln.linalg`` decompositions and solvers: ``inv``, ``det``, ``slogdet``, ``solve``, ``cholesky``,
``eigh``/``eigvalsh``, ``svd``/``svdvals`` and ``qr`` (with ``LinAlgError``).

They are ops with NumPy reference kernels and backward formulas written in kiln ops (so higher-order
gradients work).
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import scalar_type_name
from kiln._ops.elementwise import _compute_np
from kiln._ops.linalg import matmul
from kiln._ops.products import _check_tensors, _zeros_like
from kiln._ops.reduction import _return_type
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = [
    "LinAlgError",
    "inv",
    "det",
    "slogdet",
    "solve",
    "cholesky",
    "eigh",
    "eigvalsh",
    "svd",
    "svdvals",
    "qr",
    "inverse",
]

TOP_LEVEL = (
    "legacy_det as det",
    "legacy_inverse as inverse",
    "legacy_slogdet as slogdet",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does): ``kiln.det(input)`` and the others take
PyTorch's top-level parameter name, ``input``; ``kiln.linalg``'s take ``A``."""


class LinAlgError(RuntimeError):
    """Raised by ``kiln.linalg`` when a matrix is singular or not positive-definite (``torch.linalg.LinAlgError``)."""


# ---------------------------------------------------------------------------------------- decompositions


def _square_meta(name, A, min_float=True):
    if not isinstance(A, Tensor):
        raise TypeError(f"linalg_{name}(): argument 'A' must be Tensor, not {type(A).__name__}")
    if A.dim() < 2:
        raise RuntimeError(f"linalg.{name}: The input tensor A must have at least 2 dimensions.")
    if A._shape[-1] != A._shape[-2]:
        raise RuntimeError(
            f"linalg.{name}: A must be batches of square matrices, but they are {A._shape[-2]} by "
            f"{A._shape[-1]} matrices"
        )
    if min_float and A._dtype not in (dt.float32, dt.float64):
        raise RuntimeError(
            f"linalg.{name}: Expected a floating point or complex tensor as input. Got {scalar_type_name(A._dtype)}"
        )


def _first_zero_pivot(a: np.ndarray) -> int:
    """1-based index of the first zero pivot of LU with partial pivoting (LAPACK getrf's ``info``)."""
    u = np.array(a, np.float64)
    n = u.shape[0]
    first = 0
    for k in range(n):
        p = k + int(np.argmax(np.abs(u[k:, k])))
        if u[p, k] == 0:
            first = first or k + 1
            continue
        u[[k, p]] = u[[p, k]]
        u[k + 1 :, k:] -= np.outer(u[k + 1 :, k] / u[k, k], u[k, k:])
    return first


def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape((int(np.prod(a.shape[:-2])),) + a.shape[-2:])


def _batch_prefix(a: np.ndarray, idx: int) -> str:
    return f"(Batch element {idx}): " if a.ndim > 2 else ""


def _inv_meta(A):
    _square_meta("inv", A)
    return Spec((A._shape, A._dtype, A._device))


def _inv_ref(spec, A):
    a = A.astype(_compute_np(spec.dtype), copy=False)
    flat = _flat(a)
    for i, m in enumerate(flat):
        k = _first_zero_pivot(m) if m.size else 0
        if k:
            raise LinAlgError(
                f"linalg.inv: {_batch_prefix(a, i)}The diagonal element {k} is zero, the inversion could not be "
                "completed because the input matrix is singular."
            )
    return np.linalg.inv(a) if a.size else np.empty(a.shape, a.dtype)


def _inv_backward(grad, result):
    r = result.mT
    return -matmul(matmul(r, grad), r)


@op(
    tags=("linalg",),
    meta=_inv_meta,
    reference=_inv_ref,
    backward=_inv_backward,
    autocast="fp32",
    grad_fn_name="LinalgInvExBackward0",
)
def inv(A: Tensor) -> Tensor:
    """Inverse of a (batch of) square matrices; raises :class:`LinAlgError` for a singular one."""


def _det_meta(A):
    _square_meta("det", A)
    return Spec((A._shape[:-2], A._dtype, A._device))


def _det_ref(spec, A):
    a = A.astype(_compute_np(spec.dtype), copy=False)
    return np.asarray(np.linalg.det(a), a.dtype)


def _det_backward(grad, A, result):
    # d det = det * tr(A^-1 dA): written with solve's formula would be singular-unsafe; this one asks
    # for an invertible A (as the tests do)
    return (grad * result).unsqueeze(-1).unsqueeze(-1) * inv(A).mT


@op(
    tags=("linalg",),
    meta=_det_meta,
    reference=_det_ref,
    backward=_det_backward,
    autocast="fp32",
    grad_fn_name="LinalgDetBackward0",
)
def det(A: Tensor) -> Tensor:
    """Determinant of a (batch of) square matrices."""


def _slogdet_meta(A):
    _square_meta("slogdet", A)
    s = Spec((A._shape[:-2], A._dtype, A._device))
    return (s, s)


def _slogdet_ref(spec, A):
    a = A.astype(_compute_np(spec[0].dtype), copy=False)
    sign, logabs = np.linalg.slogdet(a)
    return np.asarray(sign, a.dtype), np.asarray(logabs, a.dtype)


def _slogdet_backward(grads, A):
    g = grads[1]
    if g is None:
        return None
    return g.unsqueeze(-1).unsqueeze(-1) * inv(A).mT


@op(
    tags=("linalg",),
    meta=_slogdet_meta,
    reference=_slogdet_ref,
    backward=_slogdet_backward,
    autocast="fp32",
    num_outputs=2,
    grad_fn_name="LinalgSlogdetBackward0",
)
def _slogdet(A: Tensor) -> tuple[Tensor, Tensor]:
    """Sign and log of the absolute value of the determinant."""


_SlogdetResult = _return_type("linalg_slogdet", ("sign", "logabsdet"))


def slogdet(A: Tensor):
    """``(sign, logabsdet)`` of the determinant of a (batch of) square matrices (a named tuple)."""
    return _SlogdetResult(*_slogdet(A))


def legacy_det(input: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Determinant of a (batch of) square matrices (``torch.det``; :func:`kiln.linalg.det` takes ``A``)."""
    return det(input, out=out)


def legacy_slogdet(input: Tensor, *, out=None):
    """``(sign, logabsdet)`` of the determinant (``torch.slogdet``; :func:`kiln.linalg.slogdet` takes ``A``)."""
    if out is None:
        return slogdet(input)
    from kiln._dispatch import check_out_args, write_out

    check_out_args("slogdet", (input,))
    return write_out("slogdet", slogdet(input), out)


def legacy_inverse(input: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Inverse of a (batch of) square matrices (``torch.inverse``; :func:`kiln.linalg.inv` takes ``A``)."""
    return inv(input, out=out)


def solve(A: Tensor, B: Tensor, *, left: bool = True) -> Tensor:
    """The solution ``X`` of ``A X = B`` (``X A = B`` with ``left=False``); ``B`` may be a (batch of)
    vector(s) as in ``torch.linalg.solve``."""
    _check_tensors("linalg_solve", A=A, B=B)
    _square_meta("solve", A)
    if A._dtype is not B._dtype:
        raise RuntimeError(
            f"linalg.solve: Expected A and B to have the same dtype, but found A of type "
            f"{scalar_type_name(A._dtype)} and B of type {scalar_type_name(B._dtype)} instead"
        )
    vector = B.dim() == 1 or (B.dim() == A.dim() - 1 and tuple(B.shape) == tuple(A.shape[:-1]))
    n = A.shape[-1]
    rows = B.shape[-1] if vector else (B.shape[-1] if not left else B.shape[-2])
    if left and rows != n:
        cols = 1 if vector else B.shape[-1]
        raise RuntimeError(
            f"linalg.solve: Incompatible shapes of A and B for the equation AX = B ({n}x{n} and {rows}x{cols})"
        )
    try:
        Ai = inv(A)
    except LinAlgError:
        raise LinAlgError("kiln.linalg.solve: The solver failed because the input matrix is singular.") from None
    if not left:
        return matmul(B, Ai)
    if vector:
        return matmul(Ai, B.unsqueeze(-1)).squeeze(-1)
    return matmul(Ai, B)


def _cholesky_meta(A, upper=False):
    _square_meta("cholesky", A)
    return Spec((A._shape, A._dtype, A._device))


def _cholesky_ref(spec, A, upper=False):
    a = A.astype(_compute_np(spec.dtype), copy=False)
    if a.size == 0:
        return np.empty(a.shape, a.dtype)
    flat = _flat(a)
    out = np.empty_like(flat)
    for i, m in enumerate(flat):
        try:
            out[i] = np.linalg.cholesky(np.tril(m) + np.tril(m, -1).T)
        except np.linalg.LinAlgError:
            order = next(k for k in range(1, m.shape[0] + 1) if _not_pd(m[:k, :k]))
            raise LinAlgError(
                f"linalg.cholesky: {_batch_prefix(a, i)}The factorization could not be completed because the "
                f"input is not positive-definite (the leading minor of order {order} is not positive-definite)."
            ) from None
    out = out.reshape(a.shape)
    return np.swapaxes(out, -1, -2).copy() if upper else out


def _not_pd(m):
    try:
        np.linalg.cholesky(np.tril(m) + np.tril(m, -1).T)
    except np.linalg.LinAlgError:
        return True
    return False


def _cholesky_backward(grad, result, upper):
    # Murray (2016): with L lower, phi(X) = tril(X) with a halved diagonal,
    # gA = L^-H phi(L^H gL) L^-1, symmetrised.
    from kiln._ops.creation import eye

    L = result.mT if upper else result
    gL = grad.mT if upper else grad
    n = L.shape[-1]
    P = matmul(L.mT, gL)
    half = eye(n, dtype=L.dtype, device=L.device) * 0.5
    phi = P.tril() - P * half
    Li = inv(L)
    S = matmul(matmul(Li.mT, phi), Li)
    return (S + S.mT) * 0.5


@op(
    tags=("linalg",),
    meta=_cholesky_meta,
    reference=_cholesky_ref,
    backward=_cholesky_backward,
    autocast="fp32",
    grad_fn_name="LinalgCholeskyExBackward0",
)
def cholesky(A: Tensor, *, upper: bool = False) -> Tensor:
    """Cholesky factor of a (batch of) symmetric positive-definite matrices (lower, or ``upper``)."""


# ---------------------------------------------------------------------------------------- eigh / svd / qr


def _at_least_2d(name, A, square=False):
    if not isinstance(A, Tensor):
        raise TypeError(f"linalg_{name}(): argument 'A' must be Tensor, not {type(A).__name__}")
    if square:
        _square_meta(name, A)
        return
    if A.dim() < 2:
        raise RuntimeError(f"linalg.{name}: The input tensor A must have at least 2 dimensions.")
    if A._dtype not in (dt.float32, dt.float64):
        raise RuntimeError(
            f"linalg.{name}: Expected a floating point or complex tensor as input. Got {scalar_type_name(A._dtype)}"
        )


def _zeros_or(g, like):
    return g if g is not None else _zeros_like(like)


def _eigh_meta(A, UPLO="L"):
    if isinstance(A, Tensor) and not A._dtype.is_floating_point:
        raise NotImplementedError(f"\"linalg_eigh_cpu\" not implemented for '{scalar_type_name(A._dtype)}'")
    _at_least_2d("eigh", A, square=True)
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"Expected UPLO argument to be 'L' or 'U', but got {UPLO}")
    return (Spec((A._shape[:-1], A._dtype, A._device)), Spec((A._shape, A._dtype, A._device)))


def _eigh_ref(spec, A, UPLO="L"):
    a = A.astype(_compute_np(spec[0].dtype), copy=False)
    if a.size == 0:
        return np.empty(a.shape[:-1], a.dtype), np.empty(a.shape, a.dtype)
    w, v = np.linalg.eigh(a, UPLO=UPLO)
    return w.astype(a.dtype, copy=False), v.astype(a.dtype, copy=False)


# The engine hands multi-output formulas saved outputs it does not unpack, so these formulas recompute
# the decomposition from the input (differentiably, so higher-order gradients work).


def _eigh_backward(grads, A, UPLO):
    gL, gV = grads
    L, V = _eigh(A, UPLO)
    if gV is None:
        return matmul(V * _zeros_or(gL, L).unsqueeze(-2), V.mT)
    VhgV = matmul(V.mT, gV)
    VhgV = (VhgV - VhgV.mT) * 0.5
    from kiln._ops.creation import eye

    eye_n = eye(L.shape[-1], dtype=L.dtype, device=L.device)
    E = L.unsqueeze(-2) - L.unsqueeze(-1) + eye_n
    inner = VhgV / E * (1 - eye_n)
    if gL is not None:
        inner = inner + gL.unsqueeze(-1) * eye_n
    return matmul(matmul(V, inner), V.mT)


@op(
    tags=("linalg",),
    meta=_eigh_meta,
    reference=_eigh_ref,
    backward=_eigh_backward,
    autocast="fp32",
    num_outputs=2,
    grad_fn_name="LinalgEighBackward0",
)
def _eigh(A: Tensor, UPLO: str = "L") -> tuple[Tensor, Tensor]:
    """Eigenvalues (ascending) and eigenvectors of a symmetric matrix."""


_EighResult = _return_type("linalg_eigh", ("eigenvalues", "eigenvectors"))


def eigh(A: Tensor, UPLO: str = "L"):
    """``(eigenvalues, eigenvectors)`` of a (batch of) symmetric matrices, read from the ``UPLO`` triangle."""
    return _EighResult(*_eigh(A, UPLO))


def eigvalsh(A: Tensor, UPLO: str = "L") -> Tensor:
    """Eigenvalues (ascending) of a (batch of) symmetric matrices."""
    return _eigh(A, UPLO)[0]


def _svd_meta(A, full_matrices=True):
    _at_least_2d("svd", A)
    m, n = A._shape[-2:]
    k = min(m, n)
    b = A._shape[:-2]
    u = (m, m) if full_matrices else (m, k)
    vh = (n, n) if full_matrices else (k, n)
    return (
        Spec((b + u, A._dtype, A._device)),
        Spec((b + (k,), A._dtype, A._device)),
        Spec((b + vh, A._dtype, A._device)),
    )


def _svd_ref(spec, A, full_matrices=True):
    a = A.astype(_compute_np(spec[0].dtype), copy=False)
    if a.size == 0:
        u = np.zeros(spec[0].shape, a.dtype)
        vh = np.zeros(spec[2].shape, a.dtype)
        for x in (u, vh):
            if x.size:
                x[...] = np.eye(x.shape[-1], dtype=a.dtype)
        return u, np.empty(spec[1].shape, a.dtype), vh
    u, s, vh = np.linalg.svd(a, full_matrices=full_matrices)
    return u.astype(a.dtype, copy=False), s.astype(a.dtype, copy=False), vh.astype(a.dtype, copy=False)


def _svd_backward(grads, A, full_matrices):
    gU, gS, gVh = grads
    U, S, Vh = _svd(A, full_matrices)
    m, n = U.shape[-2], Vh.shape[-1]
    k = S.shape[-1]
    if full_matrices:
        U = U.narrow(-1, 0, k)
        Vh = Vh.narrow(-2, 0, k)
        gU = gU.narrow(-1, 0, k) if gU is not None else None
        gVh = gVh.narrow(-2, 0, k) if gVh is not None else None
    if gU is None and gVh is None:
        return matmul(U * _zeros_or(gS, S).unsqueeze(-2), Vh)
    from kiln._ops.creation import eye

    gU = _zeros_or(gU, U)
    gVh = _zeros_or(gVh, Vh)
    eye_k = eye(k, dtype=S.dtype, device=S.device)
    UhgU = matmul(U.mT, gU)
    UhgU = UhgU - UhgU.mT
    VhgV = matmul(Vh, gVh.mT)
    VhgV = VhgV - VhgV.mT
    S2 = S * S
    E = S2.unsqueeze(-2) - S2.unsqueeze(-1) + eye_k
    gA = (UhgU * S.unsqueeze(-2) + S.unsqueeze(-1) * VhgV) / E * (1 - eye_k)
    if gS is not None:
        gA = gA + gS.unsqueeze(-1) * eye_k
    if m > n:
        gA = matmul(U, gA)
        gUSinv = gU / S.unsqueeze(-2)
        gA = gA + gUSinv - matmul(U, matmul(U.mT, gUSinv))
        return matmul(gA, Vh)
    if m < n:
        gA = matmul(gA, Vh)
        SinvgVh = gVh / S.unsqueeze(-1)
        gA = gA + SinvgVh - matmul(matmul(SinvgVh, Vh.mT), Vh)
        return matmul(U, gA)
    return matmul(U, matmul(gA, Vh))


@op(
    tags=("linalg",),
    meta=_svd_meta,
    reference=_svd_ref,
    backward=_svd_backward,
    autocast="fp32",
    num_outputs=3,
    grad_fn_name="LinalgSvdBackward0",
)
def _svd(A: Tensor, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """Singular value decomposition ``A = U diag(S) Vh``."""


_SvdResult = _return_type("linalg_svd", ("U", "S", "Vh"))


def _check_driver(name: str, driver) -> None:
    if (
        driver is not None
    ):  # PyTorch: "torch.linalg.svd: keyword argument `driver=` is only supported on CUDA inputs with cuSOLVER backend."
        raise RuntimeError(f"kiln.linalg.{name}: keyword argument `driver=` is only supported on CUDA inputs")


def svd(A: Tensor, full_matrices: bool = True, *, driver: str | None = None):
    """``(U, S, Vh)`` with ``A = U diag(S) Vh``, singular values descending (``driver`` picks a CUDA solver
    in PyTorch; kiln's CPU kernels take only ``None``)."""
    _check_driver("svd", driver)
    return _SvdResult(*_svd(A, full_matrices))


def svdvals(A: Tensor, *, driver: str | None = None) -> Tensor:
    """Singular values (descending) of a (batch of) matrices."""
    _check_driver("svdvals", driver)
    return _svd(A, False)[1]


def _qr_meta(A, mode="reduced"):
    _at_least_2d("qr", A)
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(
            f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), 'r', or 'complete'"
        )
    m, n = A._shape[-2:]
    k = min(m, n)
    b = A._shape[:-2]
    q = (0,) if mode == "r" else b + ((m, m) if mode == "complete" else (m, k))
    r = b + ((m, n) if mode == "complete" else (k, n))
    return (Spec((q, A._dtype, A._device)), Spec((r, A._dtype, A._device)))


def _qr_ref(spec, A, mode="reduced"):
    a = A.astype(_compute_np(spec[0].dtype), copy=False)
    if a.size == 0:
        q = np.zeros(spec[0].shape, a.dtype)
        if q.ndim >= 2 and q.size:
            q[...] = np.eye(q.shape[-2], q.shape[-1], dtype=a.dtype)
        return q, np.zeros(spec[1].shape, a.dtype)
    q, r = np.linalg.qr(a, mode="complete" if mode == "complete" else "reduced")
    if mode == "r":
        q = np.empty((0,), a.dtype)
    return q.astype(a.dtype, copy=False), r.astype(a.dtype, copy=False)


def _qr_backward(grads, A, mode):
    gQ, gR = grads
    m, n = A.shape[-2], A.shape[-1]
    if mode == "r" or (mode == "complete" and m > n):
        raise RuntimeError(
            "The derivative of linalg.qr depends on Q, which is not computed when mode='r'. Please use "
            "linalg.qr(A, mode='reduced') if you are going to differentiate through linalg.qr."
            if mode == "r"
            else "The QR decomposition is not differentiable when mode='complete' and nrows > ncols."
        )
    Q, R = _qr(A, mode)
    gQ = _zeros_or(gQ, Q)
    gR = _zeros_or(gR, R)
    if m >= n:
        return _qr_backward_tall(Q, R, gQ, gR)
    # wide: A = [X | Y] with X = Q U square; Y = Q V moves Q's gradient by Y gV^T (then X's square case)
    U = R[..., :, :m]
    gU, gV = gR[..., :, :m], gR[..., :, m:]
    gX = _qr_backward_tall(Q, U, gQ + matmul(A[..., :, m:], gV.mT), gU)
    from kiln._ops.shape import cat

    return cat([gX, matmul(Q, gV)], -1)


def _qr_backward_tall(Q, R, gQ, gR):
    """The gradient of ``A = Q R`` for ``m >= n`` (``R`` square and invertible)."""
    from kiln._ops.creation import eye

    n = R.shape[-1]
    t = (matmul(gR, R.mT) - matmul(Q.mT, gQ)).triu()
    sym = t + t.mT - t * eye(n, dtype=R.dtype, device=R.device)
    return matmul(matmul(Q, sym) + gQ, inv(R).mT)


@op(
    tags=("linalg",),
    meta=_qr_meta,
    reference=_qr_ref,
    backward=_qr_backward,
    autocast="fp32",
    num_outputs=2,
    grad_fn_name="LinalgQrBackward0",
)
def _qr(A: Tensor, mode: str = "reduced") -> tuple[Tensor, Tensor]:
    """QR decomposition."""


_QrResult = _return_type("linalg_qr", ("Q", "R"))


def qr(A: Tensor, mode: str = "reduced"):
    """``(Q, R)`` with ``A = Q R`` (``mode``: ``'reduced'``, ``'complete'`` or ``'r'``)."""
    return _QrResult(*_qr(A, mode))


Tensor.det = det
Tensor.inverse = inv
Tensor.slogdet = slogdet
inverse = inv

"""Matrix functions and least squares: ``linalg.pinv`` (an op whose backward formula is the pseudo-inverse's
derivative, so it holds for rank-deficient matrices too) and the composites ``linalg.matrix_exp``,
``linalg.matrix_power``, ``linalg.matrix_rank``, ``linalg.cond``, ``linalg.lstsq``, ``linalg.tensorinv``,
``linalg.tensorsolve``, ``linalg.vander``, ``linalg.householder_product``, ``linalg.diagonal``, ``logdet``,
``pinverse`` and the legacy ``qr`` and ``svd``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import scalar_type_name
from kiln._ops.decompositions import _slogdet, _svd, inv, solve
from kiln._ops.elementwise import _compute_np, where
from kiln._ops.linalg import matmul
from kiln._ops.math_args import _not_implemented
from kiln._ops.reduction import _return_type
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = [
    "pinv",
    "matrix_exp",
    "matrix_power",
    "matrix_rank",
    "cond",
    "lstsq",
    "tensorinv",
    "tensorsolve",
    "vander",
    "householder_product",
    "diagonal",
    "logdet",
    "pinverse",
]

TOP_LEVEL = (
    "logdet",
    "matrix_exp",
    "pinverse",
    "legacy_matrix_power as matrix_power",
    "legacy_qr as qr",
    "legacy_svd as svd",
    "legacy_vander as vander",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does); ``kiln.qr`` and ``kiln.svd`` are the legacy
functions (:func:`legacy_qr`, :func:`legacy_svd`); the others are ``kiln.linalg``'s."""

_LstsqResult = _return_type("linalg_lstsq", ("solution", "residuals", "rank", "singular_values"))
_QrResult = _return_type("qr", ("Q", "R"))
_SvdResult = _return_type("svd", ("U", "S", "V"))

_EPS = {dt.float32: float(np.finfo(np.float32).eps), dt.float64: float(np.finfo(np.float64).eps)}


def _need_tensor(name: str, op_name: str, x) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op_name}(): argument '{name}' must be Tensor, not {type(x).__name__}")


def _at_least_2d(name: str, A, what: str = "A") -> None:
    if A.dim() < 2:
        raise RuntimeError(f"{name}: The input tensor {what} must have at least 2 dimensions.")


# ---------------------------------------------------------------------------------------- pinv


def _pinv_meta(A, atol=None, rtol=None, hermitian=False):
    _need_tensor("A", "linalg_pinv", A)
    if A.dim() < 2 or A.dtype not in (dt.float32, dt.float64):
        raise RuntimeError(
            f"linalg.pinv({scalar_type_name(A.dtype)}{{{list(A.shape)}}}): expected a tensor with 2 or more dimensions of "
            "float, double, cfloat or cdouble types"
        )
    return Spec((tuple(A.shape[:-2]) + (A.shape[-1], A.shape[-2]), A.dtype, A.device))


def _tolerances(a: np.ndarray, atol, rtol) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's defaults: ``rtol = eps * max(m, n)`` when neither is given, 0 when only ``atol`` is."""
    m, n = a.shape[-2:]
    if rtol is None:
        rtol = np.finfo(a.dtype).eps * max(m, n) if atol is None or np.all(np.asarray(atol) <= 0) else 0.0
    atol = 0.0 if atol is None else atol
    return np.asarray(atol, a.dtype), np.asarray(rtol, a.dtype)


def _pinv_ref(spec, A, atol=None, rtol=None, hermitian=False):
    a = A.astype(_compute_np(spec.dtype), copy=False)
    if a.size == 0:
        return np.zeros(spec.shape, a.dtype)
    atol, rtol = _tolerances(a, atol, rtol)
    if hermitian:
        w, v = np.linalg.eigh(a)
        biggest = np.max(np.abs(w), axis=-1, keepdims=True)
        keep = np.abs(w) > np.maximum(atol[..., None], rtol[..., None] * biggest)
        inv_w = np.where(keep, 1 / np.where(keep, w, 1), 0)
        return (v * inv_w[..., None, :]) @ np.swapaxes(v, -1, -2)
    u, s, vh = np.linalg.svd(a, full_matrices=False)
    keep = s > np.maximum(atol[..., None], rtol[..., None] * s[..., :1])
    inv_s = np.where(keep, 1 / np.where(keep, s, 1), 0)
    return (np.swapaxes(vh, -1, -2) * inv_s[..., None, :]) @ np.swapaxes(u, -1, -2)


def _pinv_backward(grad, A, result):
    # the derivative of X = A^+ (Golub and Pereyra): dX = -X dA X + X X^T dA^T (I - A X) + (I - X A) dA^T X^T X
    from kiln._ops.creation import eye

    X = result
    m, n = A.shape[-2], A.shape[-1]
    eye_m = eye(m, dtype=A.dtype, device=A.device)
    eye_n = eye(n, dtype=A.dtype, device=A.device)
    first = -matmul(matmul(X.mT, grad), X.mT)
    second = matmul(matmul(eye_m - matmul(A, X), grad.mT), matmul(X, X.mT))
    third = matmul(matmul(matmul(X.mT, X), grad.mT), eye_n - matmul(X, A))
    return (first + second + third, None, None)


@op(
    tags=("linalg",),
    meta=_pinv_meta,
    reference=_pinv_ref,
    backward=_pinv_backward,
    autocast="fp32",
    grad_fn_name="LinalgPinvBackward0",
)
def _linalg_pinv(
    A: Tensor, atol: Tensor | float | None = None, rtol: Tensor | float | None = None, hermitian: bool = False
) -> Tensor:
    """The pseudo-inverse."""


def pinv(A: Tensor, *, atol=None, rtol=None, hermitian: bool = False) -> Tensor:
    """The Moore-Penrose pseudo-inverse of a (batch of) matrices (``n x m`` for ``m x n``), from the SVD (the
    eigendecomposition with ``hermitian``): singular values at most ``max(atol, rtol * largest)`` count as 0.
    ``rtol`` defaults to ``eps * max(m, n)`` (to 0 when only a positive ``atol`` is given). The tolerances may
    be tensors broadcasting against the batch."""
    _need_tensor("A", "linalg_pinv", A)
    return _linalg_pinv(A, atol, rtol, hermitian)


def pinverse(input: Tensor, rcond: float = 1e-15) -> Tensor:
    """The pseudo-inverse with singular values below ``rcond`` times the largest taken as 0
    (:func:`kiln.linalg.pinv` with ``rtol=rcond``)."""
    return _linalg_pinv(input, None, rcond, False)


# ---------------------------------------------------------------------------------------- rank, cond


def _singular_values(A: Tensor, hermitian: bool) -> Tensor:
    if hermitian:
        from kiln._ops.decompositions import eigvalsh

        return eigvalsh(A).abs()
    return _svd(A, False)[1]


def matrix_rank(A: Tensor, *, atol=None, rtol=None, hermitian: bool = False) -> Tensor:
    """The numerical rank of a (batch of) matrices (int64): the number of singular values above
    ``max(atol, rtol * largest)``, the tolerances defaulting as in :func:`pinv`."""
    _need_tensor("A", "linalg_matrix_rank", A)
    _at_least_2d("kiln.linalg.matrix_rank", A, "input")
    if A.dtype not in (dt.float32, dt.float64):
        raise RuntimeError("This function doesn't handle types other than float and double")
    if A.shape[-1] * A.shape[-2] == 0:
        from kiln._ops.creation import zeros

        return zeros(tuple(A.shape[:-2]), dtype=dt.int64, device=A.device)
    s = _singular_values(A, hermitian).detach()
    m, n = A.shape[-2:]
    if rtol is None:
        positive_atol = atol is not None and _positive(atol)
        rtol = 0.0 if positive_atol else _EPS[A.dtype] * max(m, n)
    atol = 0.0 if atol is None else atol
    biggest = s.amax(-1)
    threshold = _maximum(atol, _times(rtol, biggest))
    return (s > threshold.unsqueeze(-1) if isinstance(threshold, Tensor) else s > threshold).sum(-1)


def _positive(x) -> bool:
    return bool((x > 0).all()) if isinstance(x, Tensor) else x > 0


def _times(x, t: Tensor) -> Tensor:
    return t * x


def _maximum(a, b: Tensor) -> Tensor:
    from kiln._ops.reduction import maximum

    return maximum(a.to(b.dtype), b) if isinstance(a, Tensor) else b.clamp_min(a)


_COND_ORDS = (None, 2, -2, 1, -1, math.inf, -math.inf, "fro", "nuc")


def cond(A: Tensor, p=None) -> Tensor:
    """The condition number of a (batch of) matrices in norm ``p``: for ``None``/2/-2 the ratio of the
    extreme singular values (any shape); for ``'nuc'`` ``sum(S) * sum(1 / S)``; for ``'fro'``, ``inf``,
    ``-inf``, 1, -1 ``norm(A) * norm(inv(A))`` (square matrices; infinite where ``A`` is singular)."""
    _need_tensor("A", "linalg_cond", A)
    if p not in _COND_ORDS or isinstance(p, bool):
        raise RuntimeError(f"linalg.cond got an invalid norm type: {p}")
    if A.dim() < 2:
        raise RuntimeError("linalg.cond: The input tensor must have at least 2 dimensions.")
    if p in (None, 2, -2):
        if A.dtype not in (dt.float32, dt.float64):
            raise RuntimeError(
                f"linalg.svd: Expected a floating point or complex tensor as input. Got {scalar_type_name(A.dtype)}"
            )
        s = _svd(A, False)[1]
        if s.shape[-1] == 0:
            return s.sum(-1)
        big, small = s[..., 0], s[..., -1]
        return small / big if p == -2 else big / small
    if A.shape[-1] != A.shape[-2]:
        raise RuntimeError(
            f"linalg.cond(ord={p}): A must be batches of square matrices, but they are {A.shape[-2]} by "
            f"{A.shape[-1]} matrices"
        )
    from kiln._ops.lu import _linalg_lu_factor_ex, lu_solve
    from kiln._ops.norms import matrix_norm

    if A.dtype not in (dt.float32, dt.float64):
        raise RuntimeError(
            f"linalg.cond: Expected a floating point or complex tensor as input. Got {scalar_type_name(A.dtype)}"
        )
    if p == "nuc":  # from the singular values, as PyTorch: sum(S) * sum(1 / S)
        s = _svd(A, False)[1]
        return s.sum(-1) * (1 / s).sum(-1)
    LU, pivots, info = _linalg_lu_factor_ex(A, True, False)
    singular = info != 0
    if bool(singular.any()):
        from kiln._ops.creation import eye

        inverse = lu_solve(LU, pivots, eye(A.shape[-1], dtype=A.dtype, device=A.device).expand(A.shape))
        out = matrix_norm(A, p) * matrix_norm(where(singular[..., None, None], 0.0, inverse), p)
        return where(singular, math.inf, out)
    return matrix_norm(A, p) * matrix_norm(inv(A), p)


# ---------------------------------------------------------------------------------------- lstsq

_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def lstsq(A: Tensor, B: Tensor, rcond: float | None = None, *, driver: str | None = None):
    """``(solution, residuals, rank, singular_values)``: the least-squares (minimum-norm, for rank-deficient
    ``A``) solution of ``A X = B`` and, as LAPACK's ``driver`` reports them (``'gelsy'`` by default):
    the squared residuals per column (``m > n`` full-rank inputs, drivers other than ``'gelsy'``), the ranks
    (all but ``'gels'``) and the singular values (``'gelsd'``, ``'gelss'``); what a driver does not report is
    an empty tensor. Singular values at most ``rcond`` times the largest (``eps * max(m, n)`` by default) count
    as 0 (with ``'gelsy'``, whose rank-revealing QR truncates differently, a truncated solution may differ
    from PyTorch's). A named tuple."""
    _need_tensor("A", "linalg_lstsq", A)
    _need_tensor("B", "linalg_lstsq", B)
    if driver is None:
        driver = "gelsy"
    if driver not in _DRIVERS:
        raise RuntimeError("kiln.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")
    if A.dtype not in (dt.float32, dt.float64) or B.dtype not in (dt.float32, dt.float64):
        raise RuntimeError("This function doesn't handle types other than float and double")
    if A.dtype is not B.dtype:
        raise RuntimeError(
            "kiln.linalg.lstsq: Expected input and other to have the same dtype, but got input's dtype "
            f"{scalar_type_name(A.dtype)} and other's dtype {scalar_type_name(B.dtype)}"
        )
    _at_least_2d("kiln.linalg.lstsq", A, "input")
    vector = B.dim() == A.dim() - 1
    rhs = B.unsqueeze(-1) if vector else B
    if rhs.dim() < 2:
        raise RuntimeError(
            "kiln.linalg.lstsq: input.dim() must be greater or equal to other.dim() and (input.dim() - other.dim()) <= 1"
        )
    if A.shape[-2] != rhs.shape[-2]:
        raise RuntimeError("kiln.linalg.lstsq: input.size(-2) should match other.size(-2)")
    m, n = A.shape[-2:]
    if rcond is None:
        rcond = _EPS[A.dtype] * max(m, n)
    from kiln._ops.creation import empty

    s = _svd(A, False)[1].detach() if m * n else empty(tuple(A.shape[:-2]) + (0,), dtype=A.dtype, device=A.device)
    rank = (s > s[..., :1] * rcond).sum(-1) if s.shape[-1] else s.sum(-1).to(dt.int64)
    if driver == "gels" and s.shape[-1] and bool((rank < min(m, n)).any()):
        from kiln._ops.decompositions import LinAlgError

        code = int(rank.min().item()) + 1
        raise LinAlgError(
            "kiln.linalg.lstsq: The least squares solution could not be computed because the input matrix does not "
            f"have full rank (error code: {code})."
        )
    X = matmul(_linalg_pinv(A, None, max(rcond, 0.0), False), rhs)
    nothing = A.reshape(-1)[:0] * 1  # an empty float result, connected to A as PyTorch's are
    residuals = nothing
    if driver != "gelsy" and m > n and (driver == "gels" or bool((rank == n).all())):
        residuals = ((matmul(A, X) - rhs) ** 2).sum(-2)  # (..., k); (..., 1) for a vector B, as PyTorch
    return _LstsqResult(
        X.squeeze(-1) if vector else X,
        residuals,
        rank if driver != "gels" else empty(0, dtype=dt.int64, device=A.device),
        s if driver in ("gelsd", "gelss") else empty(0, dtype=A.dtype, device=A.device),
    )


# ---------------------------------------------------------------------------------------- matrix_exp, matrix_power

# Higham (2005), "The scaling and squaring method for the matrix exponential revisited": the [13/13] Pade
# approximant's coefficients and the 1-norm up to which it is accurate to double precision.
_PADE13 = (
    64764752532480000.0,
    32382376266240000.0,
    7771770303897600.0,
    1187353796428800.0,
    129060195264000.0,
    10559470521600.0,
    670442572800.0,
    33522128640.0,
    1323241920.0,
    40840800.0,
    960960.0,
    16380.0,
    182.0,
    1.0,
)
_THETA13 = 5.371920351148152


def matrix_exp(A: Tensor) -> Tensor:
    """The matrix exponential of a (batch of) square matrices, by scaling and squaring with the [13/13] Padé
    approximant (each matrix scaled by its own power of two); half types compute in float32."""
    _need_tensor("A", "linalg_matrix_exp", A)
    _at_least_2d("linalg.matrix_exp", A)
    if A.shape[-1] != A.shape[-2]:
        raise RuntimeError(
            f"linalg.matrix_exp: A must be batches of square matrices, but they are {A.shape[-2]} by {A.shape[-1]} "
            "matrices"
        )
    if not A.dtype.is_floating_point:
        raise RuntimeError(
            f"linalg.matrix_exp: Expected a floating point or complex tensor as input. Got {scalar_type_name(A.dtype)}"
        )
    if A.numel() == 0:
        return A.clone()
    out_dtype = A.dtype
    x = A.to(dt.float32) if A.dtype in (dt.float16, dt.bfloat16) else A
    from kiln._ops.creation import eye

    n = x.shape[-1]
    norm = x.detach().abs().sum(-2).amax(-1)  # the 1-norm of each matrix
    steps = (norm / _THETA13).clamp_min(1.0).log2().ceil().clamp_min(0.0)
    top = int(steps.amax().item()) if steps.numel() else 0
    x = x / (2.0**steps).unsqueeze(-1).unsqueeze(-1)
    b = _PADE13
    identity = eye(n, dtype=x.dtype, device=x.device)
    x2 = matmul(x, x)
    x4 = matmul(x2, x2)
    x6 = matmul(x4, x2)
    u = matmul(x, matmul(x6, b[13] * x6 + b[11] * x4 + b[9] * x2) + b[7] * x6 + b[5] * x4 + b[3] * x2 + b[1] * identity)
    v = matmul(x6, b[12] * x6 + b[10] * x4 + b[8] * x2) + b[6] * x6 + b[4] * x4 + b[2] * x2 + b[0] * identity
    r = solve(v - u, v + u)
    for i in range(top):
        r = where((steps > i).unsqueeze(-1).unsqueeze(-1), matmul(r, r), r)
    return r.to(out_dtype)


def matrix_power(A: Tensor, n: int) -> Tensor:
    """``A`` to the integer power ``n`` by repeated squaring (the identity for 0; the inverse's power for
    ``n < 0``, floating matrices only)."""
    _need_tensor("A", "linalg_matrix_power", A)
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"linalg_matrix_power(): argument 'n' (position 2) must be int, not {type(n).__name__}")
    _at_least_2d("linalg.matrix_power", A)
    if A.shape[-1] != A.shape[-2]:
        raise RuntimeError(
            f"linalg.matrix_power: A must be batches of square matrices, but they are {A.shape[-2]} by "
            f"{A.shape[-1]} matrices"
        )
    if n == 0:
        from kiln._ops.creation import eye

        # the identity, connected to A (a zero gradient) as PyTorch's is
        return eye(A.shape[-1], dtype=A.dtype, device=A.device).expand(A.shape) + A.nan_to_num() * 0
    if n < 0:
        A, n = inv(A), -n
    if n == 1:
        return A.clone()
    result = None
    base = A
    while n:
        if n & 1:
            result = base if result is None else matmul(result, base)
        n >>= 1
        if n:
            base = matmul(base, base)
    return result


def legacy_matrix_power(input: Tensor, n: int) -> Tensor:
    """``input`` to the integer power ``n`` (:func:`kiln.linalg.matrix_power`)."""
    return matrix_power(input, n)


# ---------------------------------------------------------------------------------------- tensorinv, tensorsolve


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def tensorinv(A: Tensor, ind: int = 2) -> Tensor:
    """The inverse of ``A`` for :func:`kiln.tensordot` with ``ind`` dims: ``tensordot(tensorinv(A, ind), A,
    ind)`` is the identity; the result's shape is ``A.shape[ind:] + A.shape[:ind]``."""
    _need_tensor("A", "linalg_tensorinv", A)
    if ind <= 0:
        raise RuntimeError(f"Expected a strictly positive integer for 'ind', but got {ind}")
    rows, cols = _prod(A.shape[:ind]), _prod(A.shape[ind:])
    if rows != cols:
        raise RuntimeError(
            "Expected self to satisfy the requirement prod(self.shape[ind:]) == prod(self.shape[:ind]), but got "
            f"{cols} != {rows}"
        )
    from kiln._ops.decompositions import LinAlgError

    try:
        inverse = inv(A.reshape(rows, cols))
    except LinAlgError as exc:
        raise LinAlgError(str(exc).replace("linalg.inv:", "inv:", 1)) from None
    return inverse.reshape(tuple(A.shape[ind:]) + tuple(A.shape[:ind]))


def tensorsolve(A: Tensor, B: Tensor, dims=None) -> Tensor:
    """The ``X`` with ``tensordot(A, X, X.dim()) == B``: ``A``'s leading dims match ``B``'s and the rest give
    ``X``'s shape; ``dims`` first moves those dims of ``A`` to its end."""
    _need_tensor("A", "linalg_tensorsolve", A)
    _need_tensor("B", "linalg_tensorsolve", B)
    if dims is not None:
        dims = [d % A.dim() for d in dims]
        A = A.permute([d for d in range(A.dim()) if d not in dims] + dims)
    rows, cols = _prod(A.shape[: B.dim()]), _prod(A.shape[B.dim() :])
    if rows != cols:
        raise RuntimeError(
            "Expected self to satisfy the requirement prod(self.shape[other.ndim:]) == "
            f"prod(self.shape[:other.ndim]), but got {cols} != {rows}"
        )
    x = solve(A.reshape(rows, cols), B.reshape(rows))
    return x.reshape(tuple(A.shape[B.dim() :]))


# ---------------------------------------------------------------------------------------- vander, householder


def vander(x: Tensor, N: int | None = None) -> Tensor:
    """The Vandermonde matrix of ``x`` (``(..., n)`` gives ``(..., n, N)``): columns ``x ** 0, x ** 1, ...,
    x ** (N - 1)`` (increasing powers; ``N`` defaults to ``n``), computed by cumulative products."""
    _need_tensor("x", "linalg_vander", x)
    if x.dtype is dt.bool:
        raise RuntimeError("linalg.vander supports floating point, complex, and integer tensors, but got Bool")
    count = (x.shape[-1] if x.dim() else 1) if N is None else N
    if count <= 1 or x.dim() == 0:
        raise RuntimeError("N must be greater than 1.")
    from kiln._ops.shape import cat

    d = x.dtype if x.dtype.is_floating_point else dt.int64
    column = x.to(d).unsqueeze(-1)
    powers = column.expand(tuple(column.shape[:-1]) + (count - 1,)).cumprod(-1)
    return cat([powers.new_ones(tuple(column.shape)), powers], -1)


def legacy_vander(x: Tensor, N: int | None = None, increasing: bool = False) -> Tensor:
    """``kiln.vander`` (``torch.vander``, NumPy's convention): the Vandermonde matrix of the 1-D ``x`` with
    ``N`` columns (default ``len(x)``) of decreasing powers ``x ** (N - 1), ..., x ** 0``, or increasing
    ones with ``increasing=True``. Integer and bool inputs give int64."""
    _need_tensor("x", "vander", x)
    if x.dim() != 1:
        raise RuntimeError("x must be a one-dimensional tensor.")
    count = x.shape[0] if N is None else N
    if count < 0:
        raise RuntimeError("N must be non-negative.")
    d = x.dtype if x.dtype.is_floating_point else dt.int64
    if count <= 1 or x.shape[0] == 0:  # no powers to multiply: x ** 0 keeps the graph (a zero gradient)
        return x.to(d).unsqueeze(-1)[..., :count] ** 0
    out = vander(x.to(d), N=count)
    return out if increasing else out.flip(-1)


def householder_product(A: Tensor, tau: Tensor) -> Tensor:
    """The first ``n`` columns of ``H_1 ... H_k`` for the Householder reflectors ``H_i = I - tau_i v_i v_i^T``
    whose vectors ``v_i`` are stored below the diagonal of ``A``'s columns (with a unit ``i``-th element), as
    LAPACK's ``orgqr`` forms ``Q`` from a QR factorization."""
    _need_tensor("input", "linalg_householder_product", A)
    _need_tensor("tau", "linalg_householder_product", tau)
    name = "kiln.linalg.householder_product"
    if A.dim() < 2:
        raise RuntimeError(f"{name}: input must have at least 2 dimensions.")
    m, n = A.shape[-2:]
    if m < n:
        raise RuntimeError(f"{name}: input.shape[-2] must be greater than or equal to input.shape[-1]")
    if tau.shape[-1] > n if tau.dim() else False:
        raise RuntimeError(f"{name}: input.shape[-1] must be greater than or equal to tau.shape[-1]")
    if tau.dim() != A.dim() - 1 or tuple(tau.shape[:-1]) != tuple(A.shape[:-2]):
        raise RuntimeError(
            f"{name}: Expected batch dimensions of tau to be equal to input.shape[:-2], but got {list(tau.shape[:-1])}"
        )
    if tau.dtype is not A.dtype:
        raise RuntimeError(
            f"{name}: tau dtype {scalar_type_name(tau.dtype)} does not match input dtype {scalar_type_name(A.dtype)}"
        )
    if A.dtype not in (dt.float32, dt.float64):
        raise _not_implemented("orgqr_cpu", A.dtype)
    from kiln._ops.creation import eye

    identity = eye(m, dtype=A.dtype, device=A.device)
    unit_lower = A.tril(-1) + identity[:, :n]
    q = identity[:, :n].expand(tuple(A.shape[:-2]) + (m, n))
    if tau.shape[-1] == 0:  # no reflector: the identity, still a result of the op (A's gradient stays None)
        return q + tau.nan_to_num().sum(-1, keepdim=True).unsqueeze(-1) * 0
    for i in reversed(range(tau.shape[-1])):  # Q = H_1 (H_2 (... (H_k I)))
        v = unit_lower[..., :, i : i + 1]
        q = q - tau[..., i : i + 1].unsqueeze(-1) * matmul(v, matmul(v.mT, q))
    return q


# ---------------------------------------------------------------------------------------- small ones


def diagonal(A: Tensor, *, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """The diagonals of a (batch of) matrices as a view (``A.diagonal(offset, dim1, dim2)``; ``kiln.linalg``'s
    defaults take the last two dims)."""
    _need_tensor("A", "linalg_diagonal", A)
    return A.diagonal(offset, dim1, dim2)


def logdet(input: Tensor) -> Tensor:
    """The natural logarithm of the determinant of a (batch of) square matrices: NaN where it is negative,
    ``-inf`` where it is 0."""
    _need_tensor("input", "logdet", input)
    if input.dim() < 2:
        raise RuntimeError("logdet: The input tensor A must have at least 2 dimensions.")
    if input.shape[-1] != input.shape[-2]:
        raise RuntimeError(
            f"logdet: A must be batches of square matrices, but they are {input.shape[-2]} by {input.shape[-1]} "
            "matrices"
        )
    if input.dtype not in (dt.float32, dt.float64):
        raise RuntimeError(
            f"logdet: Expected a floating point or complex tensor as input. Got {scalar_type_name(input.dtype)}"
        )
    sign, logabs = _slogdet(input)
    return where(sign < 0, math.nan, logabs)


def legacy_qr(input: Tensor, some: bool = True):
    """``(Q, R)`` of :func:`kiln.linalg.qr` with mode ``'reduced'`` (``'complete'`` when not ``some``);
    deprecated as in PyTorch. A named tuple."""
    warnings.warn(
        "kiln.qr is deprecated in favor of kiln.linalg.qr and will be removed in a future kiln release.\nThe "
        "boolean parameter 'some' has been replaced with a string parameter 'mode'.\nQ, R = kiln.qr(A, some)\n"
        "should be replaced with\nQ, R = kiln.linalg.qr(A, 'reduced' if some else 'complete')",
        UserWarning,
        stacklevel=2,
    )
    from kiln._ops.decompositions import qr

    return _QrResult(*qr(input, "reduced" if some else "complete"))


def legacy_svd(input: Tensor, some: bool = True, compute_uv: bool = True):
    """``(U, S, V)`` with ``input = U diag(S) V^T`` (``V``, not ``Vh``): the reduced SVD, the full one when
    not ``some``; without ``compute_uv`` only ``S``, with zero ``U`` (``m x m``) and ``V`` (``n x n``). A named
    tuple."""
    _need_tensor("input", "svd", input)
    if not compute_uv:
        from kiln._ops.creation import zeros

        m, n = input.shape[-2:]
        batch = tuple(input.shape[:-2])
        s = _svd(input, False)[1]
        u = zeros(batch + (m, m), dtype=input.dtype, device=input.device)
        return _SvdResult(u, s, zeros(batch + (n, n), dtype=input.dtype, device=input.device))
    U, S, Vh = _svd(input, not some)
    return _SvdResult(U, S, Vh.mT)


legacy_matrix_power.__name__ = legacy_matrix_power.__qualname__ = "matrix_power"
legacy_qr.__name__ = legacy_qr.__qualname__ = "qr"
legacy_svd.__name__ = legacy_svd.__qualname__ = "svd"

Tensor.matrix_exp = matrix_exp
Tensor.matrix_power = legacy_matrix_power
Tensor.pinverse = pinverse
Tensor.logdet = logdet
Tensor.qr = legacy_qr
Tensor.svd = legacy_svd

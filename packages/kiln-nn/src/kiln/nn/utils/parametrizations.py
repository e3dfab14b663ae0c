"""Parametrizations built on :mod:`kiln.nn.utils.parametrize` (``torch.nn.utils.parametrizations``).

:func:`orthogonal` (``matrix_exp``, ``cayley`` or ``householder`` map, with the ``base`` buffer of the
dynamic trivialization), :func:`weight_norm` (``parametrizations.<name>.original0`` = magnitude ``g``, ``original1`` = direction
``v``) and :func:`spectral_norm` (``parametrizations.<name>.original`` with the power-iteration vectors
in the buffers ``parametrizations.<name>.0._u`` / ``_v``), with torch's defaults.
"""

from __future__ import annotations

import kiln
from kiln import Tensor
from kiln.nn import functional as F
from kiln.nn.modules.module import Module
from kiln.nn.utils import parametrize

__all__ = ["orthogonal", "weight_norm", "spectral_norm"]

_EPS = {
    "float16": 0.0009765625,
    "bfloat16": 0.0078125,
    "float32": 1.1920928955078125e-07,
    "float64": 2.220446049250313e-16,
}


def _dtype_eps(dtype) -> float:
    return _EPS.get(str(dtype).rsplit(".", 1)[-1], _EPS["float32"])


def _eye_like(n: int, ref: Tensor) -> Tensor:
    return kiln.eye(n, dtype=ref.dtype, device=ref.device)


def _matrix_exp(a: Tensor) -> Tensor:
    """``exp(A)`` of a (batch of) square matrices: scaling and squaring around a degree-18 Taylor polynomial.

    Written with matmuls, so it is differentiable through autograd.
    """
    import math

    n = a.size(-1)
    eye = _eye_like(n, a)
    with kiln.no_grad():
        norm = float(a.detach().abs().sum(-1).max()) if a.numel() else 0.0
    s = max(0, math.ceil(math.log2(norm / 0.5))) if norm > 0.5 else 0
    b = a / (2.0**s) if s else a
    e = eye
    for j in range(18, 0, -1):  # Horner: I + B/1 (I + B/2 (I + ... (I + B/18)))
        e = eye + (b @ e) / j
    for _ in range(s):
        e = e @ e
    return e


def _householder_product(a: Tensor, tau: Tensor) -> Tensor:
    """``H_1 H_2 ... H_k`` (first ``k`` columns), ``H_i = I - tau_i v_i v_iᴴ`` with ``v_i`` the ``i``-th column
    of ``a`` below the diagonal and an implicit 1 on it (``torch.linalg.householder_product``)."""
    n, k = a.size(-2), a.size(-1)
    rows = kiln.arange(n, device=a.device)
    q = _eye_like(n, a).expand(*a.shape[:-2], n, n)
    for i in range(k):
        below = (rows > i).to(a.dtype)
        unit = (rows == i).to(a.dtype)
        v = a[..., :, i] * below + unit  # (..., n)
        qv = (q @ v.unsqueeze(-1)).squeeze(-1)  # (..., n)
        q = q - tau[..., i, None, None] * qv.unsqueeze(-1) * v.unsqueeze(-2)
    return q[..., :, :k]


def _geqrf_numpy(a):
    """LAPACK ``geqrf`` (unblocked): R on and above the diagonal, reflectors below it, and ``tau``."""
    import numpy as np

    a = np.array(a, dtype=np.float64, copy=True)
    m, n = a.shape
    k = min(m, n)
    tau = np.zeros(k)
    for i in range(k):
        alpha = a[i, i]
        x = a[i + 1 :, i]
        xnorm = np.linalg.norm(x)
        if xnorm == 0.0:
            continue
        beta = -np.copysign(np.hypot(alpha, xnorm), alpha)
        tau[i] = (beta - alpha) / beta
        a[i + 1 :, i] = x / (alpha - beta)
        a[i, i] = beta
        v = np.concatenate([[1.0], a[i + 1 :, i]])
        if i + 1 < n:
            a[i:, i + 1 :] -= tau[i] * np.outer(v, v @ a[i:, i + 1 :])
    return a, tau


def _geqrf(x: Tensor):
    import numpy as np

    arr = np.array(x.detach().cpu().numpy())
    batch = arr.shape[:-2]
    flat = arr.reshape(-1, *arr.shape[-2:])
    outs, taus = zip(*(_geqrf_numpy(m) for m in flat)) if len(flat) else ((), ())
    out = np.stack(outs).reshape(arr.shape) if outs else arr
    tau = np.stack(taus).reshape(*batch, min(arr.shape[-2:])) if taus else np.zeros((*batch, 0))
    return (
        kiln.tensor(out, dtype=x.dtype, device=x.device),
        kiln.tensor(tau, dtype=x.dtype, device=x.device),
    )


def _is_orthogonal(q: Tensor) -> bool:
    n, k = q.size(-2), q.size(-1)
    eye = _eye_like(k, q)
    eps = 10.0 * n * _dtype_eps(q.dtype)
    diff = (q.mT @ q - eye).abs()
    return bool((diff <= eps + 1e-5 * eye.abs()).all())


def _make_orthogonal(a: Tensor) -> Tensor:
    """The Q of ``a``'s QR decomposition with R's diagonal made positive (what torch gets from geqrf)."""
    q, r = kiln.linalg.qr(a)
    return q * r.diagonal(dim1=-2, dim2=-1).sign().unsqueeze(-2)


class _OrthMaps:
    matrix_exp = "matrix_exp"
    cayley = "cayley"
    householder = "householder"


class _Orthogonal(Module):
    def __init__(self, weight: Tensor, orthogonal_map: str, *, use_trivialization: bool = True) -> None:
        super().__init__()
        if weight.is_complex() and orthogonal_map == _OrthMaps.householder:
            raise ValueError("The householder parametrization does not support complex tensors.")
        self.shape = weight.shape
        self.orthogonal_map = orthogonal_map
        if use_trivialization:
            self.register_buffer("base", None)

    def forward(self, X: Tensor) -> Tensor:
        n, k = X.size(-2), X.size(-1)
        transposed = n < k
        if transposed:
            X = X.mT
            n, k = k, n
        if self.orthogonal_map in (_OrthMaps.matrix_exp, _OrthMaps.cayley):
            X = X.tril()
            if n != k:
                X = kiln.cat([X, X.new_zeros(n, n - k).expand(*X.shape[:-2], -1, -1)], dim=-1)
            A = X - X.mT
            if self.orthogonal_map == _OrthMaps.matrix_exp:
                Q = _matrix_exp(A)
            else:
                eye = _eye_like(n, A)
                Q = kiln.linalg.solve(eye - 0.5 * A, eye + 0.5 * A)
            if n != k:
                Q = Q[..., :k]
        else:
            A = X.tril(diagonal=-1)
            tau = 2.0 / (1.0 + (A * A).sum(dim=-2))
            Q = _householder_product(A, tau)
            Q = Q * X.diagonal(dim1=-2, dim2=-1).int().unsqueeze(-2)
        if hasattr(self, "base"):
            Q = self.base @ Q
        if transposed:
            Q = Q.mT
        return Q

    def right_inverse(self, Q: Tensor) -> Tensor:
        with kiln.no_grad():
            if Q.shape != self.shape:
                raise ValueError(
                    f"Expected a matrix or batch of matrices of shape {self.shape}. Got a tensor of shape {Q.shape}."
                )
            q_init = Q
            n, k = Q.size(-2), Q.size(-1)
            transpose = n < k
            if transpose:
                Q = Q.mT
                n, k = k, n
            if not hasattr(self, "base"):
                if self.orthogonal_map in (_OrthMaps.cayley, _OrthMaps.matrix_exp):
                    raise NotImplementedError(
                        "It is not possible to assign to the matrix exponential or the Cayley parametrizations "
                        "when use_trivialization=False."
                    )
                A, tau = _geqrf(Q)
                d = A.diagonal(dim1=-2, dim2=-1).sign()
                d = kiln.where(tau == 0.0, -d, d)
                eye_k = _eye_like(k, A)
                A = A.clone()
                A[..., :k, :] = A[..., :k, :] * (1 - eye_k) + eye_k * d.unsqueeze(-1)
                return A.mT if transpose else A
            if n == k:
                Q = Q.clone() if _is_orthogonal(Q) else _make_orthogonal(Q)
            else:
                N = kiln.randn(*Q.shape[:-2], n, n - k, dtype=Q.dtype, device=Q.device)
                Q = _make_orthogonal(kiln.cat([Q, N], dim=-1))
            self.base = Q
            neg_id = kiln.zeros_like(q_init)
            m = min(q_init.size(-2), q_init.size(-1))
            neg_id[..., :m, :m] = -_eye_like(m, q_init)
            return neg_id


def orthogonal(
    module: Module, name: str = "weight", orthogonal_map: str | None = None, *, use_trivialization: bool = True
) -> Module:
    """Constrain ``module.<name>`` (a matrix or batch of matrices) to be orthogonal (or semi-orthogonal).

    ``orthogonal_map``: ``"matrix_exp"`` (default for square), ``"cayley"`` or ``"householder"`` (default
    otherwise). With ``use_trivialization`` (default) the parametrization keeps an orthogonal ``base`` buffer
    and maps the original (registered as ``-I``) around it, as torch does.
    """
    weight = getattr(module, name, None)
    if not isinstance(weight, Tensor):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    if weight.ndim < 2:
        raise ValueError(f"Expected a matrix or batch of matrices. Got a tensor of {weight.ndim} dimensions.")
    if orthogonal_map is None:
        orthogonal_map = "matrix_exp" if weight.size(-2) == weight.size(-1) or weight.is_complex() else "householder"
    orth_enum = getattr(_OrthMaps, orthogonal_map, None)
    if orth_enum is None:
        raise ValueError(
            f'orthogonal_map has to be one of "matrix_exp", "cayley", "householder". Got: {orthogonal_map}'
        )
    orth = _Orthogonal(weight, orth_enum, use_trivialization=use_trivialization)
    parametrize.register_parametrization(module, name, orth, unsafe=True)
    return module


def _norm_except_dim(v: Tensor, pow: float, dim: int) -> Tensor:
    """torch's ``norm_except_dim``: the ``pow``-norm over every dim but ``dim``, kept broadcastable
    (``dim == -1``: the norm of the whole tensor, a 0-d tensor)."""
    if dim == -1:
        return v.norm(pow)
    if dim < 0:
        dim += v.dim()
    shape = [1] * v.dim()
    shape[dim] = v.size(dim)
    moved = v.transpose(0, dim) if dim != 0 else v
    return moved.reshape(v.size(dim), -1).norm(pow, 1).reshape(shape)


def _weight_norm(v: Tensor, g: Tensor, dim: int) -> Tensor:
    """torch's ``_weight_norm``: ``v * (g / norm_except_dim(v, 2, dim))``."""
    return v * (g / _norm_except_dim(v, 2, dim))


class _WeightNorm(Module):
    def __init__(self, dim: int | None = 0) -> None:
        super().__init__()
        if dim is None:
            dim = -1
        self.dim = dim

    def forward(self, weight_g: Tensor, weight_v: Tensor) -> Tensor:
        return _weight_norm(weight_v, weight_g, self.dim)

    def right_inverse(self, weight: Tensor):
        return _norm_except_dim(weight, 2, self.dim), weight


def weight_norm(module: Module, name: str = "weight", dim: int = 0) -> Module:
    """Reparametrize ``module.<name>`` as ``g * v / ||v||`` (norm over every dim but ``dim``; ``None``: all).

    ``g`` is ``parametrizations.<name>.original0`` and ``v`` ``original1``. State dicts saved with the old
    :func:`kiln.nn.utils.weight_norm` (``<name>_g``, ``<name>_v``) load into it.
    """
    parametrize.register_parametrization(module, name, _WeightNorm(dim), unsafe=True)

    def _weight_norm_compat_hook(
        mod, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        g_key = f"{prefix}{name}_g"
        v_key = f"{prefix}{name}_v"
        if g_key in state_dict and v_key in state_dict:
            original0 = state_dict.pop(g_key)
            original1 = state_dict.pop(v_key)
            state_dict[f"{prefix}parametrizations.{name}.original0"] = original0
            state_dict[f"{prefix}parametrizations.{name}.original1"] = original1

    module.register_load_state_dict_pre_hook(_weight_norm_compat_hook)
    return module


class _SpectralNorm(Module):
    def __init__(self, weight: Tensor, n_power_iterations: int = 1, dim: int = 0, eps: float = 1e-12) -> None:
        super().__init__()
        ndim = weight.ndim
        if dim >= ndim or dim < -ndim:
            raise IndexError(f"Dimension out of range (expected to be in range of [-{ndim}, {ndim - 1}] but got {dim})")
        if n_power_iterations <= 0:
            raise ValueError(
                f"Expected n_power_iterations to be positive, but got n_power_iterations={n_power_iterations}"
            )
        self.dim = dim if dim >= 0 else dim + ndim
        self.eps = eps
        if ndim > 1:
            self.n_power_iterations = n_power_iterations
            weight_mat = self._reshape_weight_to_matrix(weight.detach())
            h, w = weight_mat.size()
            u = kiln.randn(h, dtype=weight.dtype, device=weight.device)
            v = kiln.randn(w, dtype=weight.dtype, device=weight.device)
            self.register_buffer("_u", F.normalize(u, dim=0, eps=self.eps))
            self.register_buffer("_v", F.normalize(v, dim=0, eps=self.eps))
            self._power_method(weight_mat, 15)

    def _reshape_weight_to_matrix(self, weight: Tensor) -> Tensor:
        if weight.ndim <= 1:
            raise AssertionError(f"Expected weight to have more than 1 dimension, got {weight.ndim}")
        if self.dim != 0:
            weight = weight.permute(self.dim, *(d for d in range(weight.dim()) if d != self.dim))
        return weight.flatten(1)

    def _power_method(self, weight_mat: Tensor, n_power_iterations: int) -> None:
        with kiln.no_grad():
            weight_mat = weight_mat.detach()
            for _ in range(n_power_iterations):
                self._u.copy_(F.normalize(kiln.mv(weight_mat, self._v), dim=0, eps=self.eps))
                self._v.copy_(F.normalize(kiln.mv(weight_mat.mT, self._u), dim=0, eps=self.eps))

    def forward(self, weight: Tensor) -> Tensor:
        if weight.ndim == 1:
            return F.normalize(weight, dim=0, eps=self.eps)
        weight_mat = self._reshape_weight_to_matrix(weight)
        if self.training:
            self._power_method(weight_mat, self.n_power_iterations)
        u = self._u.clone()
        v = self._v.clone()
        sigma = kiln.dot(u, kiln.mv(weight_mat, v))
        return weight / sigma

    def right_inverse(self, value: Tensor) -> Tensor:
        return value


def _is_conv_transpose(module: Module) -> bool:
    from kiln import nn

    return isinstance(module, (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d))


def spectral_norm(
    module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12, dim: int | None = None
) -> Module:
    """Divide ``module.<name>`` by its spectral norm, estimated by power iteration.

    ``dim`` (default 0, 1 for ``ConvTranspose*``) is the output dimension; the weight is reshaped to a
    matrix with that dimension first. In training mode each access runs ``n_power_iterations`` steps
    updating the ``_u``/``_v`` buffers (15 steps at registration); in eval mode they are only read.
    """
    weight = getattr(module, name, None)
    if not isinstance(weight, Tensor):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    if dim is None:
        dim = 1 if _is_conv_transpose(module) else 0
    parametrize.register_parametrization(module, name, _SpectralNorm(weight, n_power_iterations, dim, eps))
    return module

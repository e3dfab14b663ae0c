"""The multivariate normal distribution with a low-rank plus diagonal covariance
(``torch.distributions.lowrank_multivariate_normal``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions._linalg import batch_mahalanobis, batch_mv
from kiln.distributions.distribution import Distribution
from kiln.distributions.utils import _standard_normal, lazy_property

__all__ = ["LowRankMultivariateNormal"]


def _eye_like(m: Tensor) -> Tensor:
    return kiln.eye(m.shape[-1], dtype=m.dtype, device=m.device)


def _capacitance_tril(w: Tensor, d: Tensor) -> Tensor:
    """The Cholesky factor of the capacitance ``I + W^T D^-1 W``."""
    k = kiln.matmul(w.mT / d.unsqueeze(-2), w)
    return kiln.linalg.cholesky(k + _eye_like(k))


def _lowrank_logdet(w: Tensor, d: Tensor, cap_tril: Tensor) -> Tensor:
    """``log det(W W^T + D)`` by the matrix determinant lemma: ``log det C + log det D``."""
    return 2 * cap_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1) + d.log().sum(-1)


def _lowrank_mahalanobis(w: Tensor, d: Tensor, x: Tensor, cap_tril: Tensor) -> Tensor:
    """``x^T (W W^T + D)^-1 x`` by the Woodbury identity, through the capacitance ``C``."""
    wt_dinv = w.mT / d.unsqueeze(-2)
    return (x.pow(2) / d).sum(-1) - batch_mahalanobis(cap_tril, batch_mv(wt_dinv, x))


class LowRankMultivariateNormal(Distribution):
    """A multivariate normal with covariance ``cov_factor @ cov_factor.mT + diag(cov_diag)``: ``loc`` of
    shape ``batch + (n,)``, ``cov_factor`` of ``batch + (n, rank)``, ``cov_diag`` of ``batch + (n,)``.
    Determinants and solves go through the ``rank x rank`` capacitance matrix (the Woodbury identity), so
    a small rank is cheap.

    >>> d = kiln.distributions.LowRankMultivariateNormal(kiln.zeros(2), kiln.tensor([[1.0], [0.0]]), kiln.ones(2))
    >>> d.log_prob(kiln.zeros(2))
    tensor(-2.1845)
    """

    arg_constraints = {
        "loc": constraints.real_vector,
        "cov_factor": constraints.independent(constraints.real, 2),
        "cov_diag": constraints.independent(constraints.positive, 1),
    }
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc: Tensor, cov_factor: Tensor, cov_diag: Tensor, validate_args: bool | None = None) -> None:
        if loc.dim() < 1:
            raise ValueError("loc must be at least one-dimensional.")
        event_shape = loc.shape[-1:]
        if cov_factor.dim() < 2:
            raise ValueError("cov_factor must be at least two-dimensional, with optional leading batch dimensions")
        if tuple(cov_factor.shape[-2:-1]) != tuple(event_shape):
            raise ValueError(f"cov_factor must be a batch of matrices with shape {event_shape[0]} x m")
        if tuple(cov_diag.shape[-1:]) != tuple(event_shape):
            raise ValueError(f"cov_diag must be a batch of vectors with shape {event_shape}")
        try:
            shape = kiln.broadcast_shapes(
                tuple(loc.shape) + (1,), tuple(cov_factor.shape), tuple(cov_diag.shape) + (1,)
            )
        except RuntimeError as e:
            raise ValueError(
                f"Incompatible batch shapes: loc {loc.shape}, cov_factor {cov_factor.shape}, cov_diag {cov_diag.shape}"
            ) from e
        self.cov_factor = cov_factor.expand(shape)
        self.loc = loc.expand(shape[:-1])
        self.cov_diag = cov_diag.expand(shape[:-1])
        self._unbroadcasted_cov_factor = cov_factor
        self._unbroadcasted_cov_diag = cov_diag
        self._capacitance_tril = _capacitance_tril(cov_factor, cov_diag)
        super().__init__(self.loc.shape[:-1], event_shape, validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> LowRankMultivariateNormal:
        new = self._get_checked_instance(LowRankMultivariateNormal, _instance)
        batch_shape = Size(batch_shape)
        loc_shape = tuple(batch_shape) + tuple(self.event_shape)
        new.loc = self.loc.expand(loc_shape)
        new.cov_diag = self.cov_diag.expand(loc_shape)
        new.cov_factor = self.cov_factor.expand(loc_shape + tuple(self.cov_factor.shape[-1:]))
        new._unbroadcasted_cov_factor = self._unbroadcasted_cov_factor
        new._unbroadcasted_cov_diag = self._unbroadcasted_cov_diag
        new._capacitance_tril = self._capacitance_tril
        super(LowRankMultivariateNormal, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _matrix_shape(self) -> tuple:
        return tuple(self._batch_shape) + tuple(self._event_shape) * 2

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def mode(self) -> Tensor:
        return self.loc

    @lazy_property
    def variance(self) -> Tensor:  # type: ignore[override]
        """The variance (the diagonal of the covariance)."""
        v = self._unbroadcasted_cov_factor.pow(2).sum(-1) + self._unbroadcasted_cov_diag
        return v.expand(tuple(self._batch_shape) + tuple(self._event_shape))

    @lazy_property
    def scale_tril(self) -> Tensor:
        """The lower Cholesky factor of the covariance."""
        d_sqrt = self._unbroadcasted_cov_diag.sqrt().unsqueeze(-1)
        w = self._unbroadcasted_cov_factor / d_sqrt
        k = kiln.matmul(w, w.mT)
        return (d_sqrt * kiln.linalg.cholesky(k + _eye_like(k))).expand(self._matrix_shape())

    @lazy_property
    def covariance_matrix(self) -> Tensor:
        """The covariance matrix."""
        w, d = self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag
        return (kiln.matmul(w, w.mT) + d.unsqueeze(-1) * _eye_like(w.mT)).expand(self._matrix_shape())

    @lazy_property
    def precision_matrix(self) -> Tensor:
        """The precision matrix (by the Woodbury identity)."""
        d = self._unbroadcasted_cov_diag
        wt_dinv = self._unbroadcasted_cov_factor.mT / d.unsqueeze(-2)
        a = kiln.linalg.solve_triangular(self._capacitance_tril, wt_dinv, upper=False)
        eye = kiln.eye(d.shape[-1], dtype=d.dtype, device=d.device)
        return (d.reciprocal().unsqueeze(-1) * eye - a.mT @ a).expand(self._matrix_shape())

    def rsample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        eps_w = _standard_normal(tuple(shape[:-1]) + tuple(self.cov_factor.shape[-1:]), self.loc.dtype, self.loc.device)
        eps_d = _standard_normal(shape, self.loc.dtype, self.loc.device)
        return self.loc + batch_mv(self._unbroadcasted_cov_factor, eps_w) + self._unbroadcasted_cov_diag.sqrt() * eps_d

    def _log_det(self) -> Tensor:
        return _lowrank_logdet(self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag, self._capacitance_tril)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        m = _lowrank_mahalanobis(
            self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag, value - self.loc, self._capacitance_tril
        )
        return -0.5 * (self._event_shape[0] * math.log(2 * math.pi) + self._log_det() + m)

    def entropy(self) -> Tensor:
        h = 0.5 * (self._event_shape[0] * (1.0 + math.log(2 * math.pi)) + self._log_det())
        return h if len(self._batch_shape) == 0 else h.expand(self._batch_shape)

"""The multivariate normal distribution (``torch.distributions.multivariate_normal``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions._linalg import batch_mahalanobis, batch_mv, precision_to_scale_tril
from kiln.distributions.distribution import Distribution
from kiln.distributions.utils import _standard_normal, lazy_property

__all__ = ["MultivariateNormal"]


def _matrix_arg(name: str, m: Tensor, loc: Tensor, what: str) -> Size:
    if m.dim() < 2:
        raise ValueError(f"{what} must be at least two-dimensional, with optional leading batch dimensions")
    return Size(kiln.broadcast_shapes(tuple(m.shape[:-2]), tuple(loc.shape[:-1])))


class MultivariateNormal(Distribution):
    """The multivariate normal distribution with mean ``loc`` and one of a positive-definite
    ``covariance_matrix``, a positive-definite ``precision_matrix`` or ``scale_tril``, the lower Cholesky
    factor of the covariance (the cheapest: every computation runs on it, and the other two are
    factored into it with :func:`kiln.linalg.cholesky`). Leading dimensions are batch dimensions.

    >>> m = kiln.distributions.MultivariateNormal(kiln.zeros(2), kiln.eye(2))
    >>> m.log_prob(kiln.tensor([1.0, 0.0]))
    tensor(-2.3379)
    """

    arg_constraints = {
        "loc": constraints.real_vector,
        "covariance_matrix": constraints.positive_definite,
        "precision_matrix": constraints.positive_definite,
        "scale_tril": constraints.lower_cholesky,
    }
    support = constraints.real_vector
    has_rsample = True

    def __init__(
        self,
        loc: Tensor,
        covariance_matrix: Tensor | None = None,
        precision_matrix: Tensor | None = None,
        scale_tril: Tensor | None = None,
        validate_args: bool | None = None,
    ) -> None:
        if loc.dim() < 1:
            raise ValueError("loc must be at least one-dimensional.")
        if (covariance_matrix is not None) + (scale_tril is not None) + (precision_matrix is not None) != 1:
            raise ValueError("Exactly one of covariance_matrix or precision_matrix or scale_tril may be specified.")
        if scale_tril is not None:
            batch_shape = _matrix_arg("scale_tril", scale_tril, loc, "scale_tril matrix")
            self.scale_tril = scale_tril.expand(tuple(batch_shape) + (-1, -1))
        elif covariance_matrix is not None:
            batch_shape = _matrix_arg("covariance_matrix", covariance_matrix, loc, "covariance_matrix")
            self.covariance_matrix = covariance_matrix.expand(tuple(batch_shape) + (-1, -1))
        else:
            batch_shape = _matrix_arg("precision_matrix", precision_matrix, loc, "precision_matrix")
            self.precision_matrix = precision_matrix.expand(tuple(batch_shape) + (-1, -1))
        self.loc = loc.expand(tuple(batch_shape) + (-1,))
        super().__init__(batch_shape, self.loc.shape[-1:], validate_args=validate_args)
        if scale_tril is not None:
            self._unbroadcasted_scale_tril = scale_tril
        elif covariance_matrix is not None:
            self._unbroadcasted_scale_tril = kiln.linalg.cholesky(covariance_matrix)
        else:
            self._unbroadcasted_scale_tril = precision_to_scale_tril(precision_matrix)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> MultivariateNormal:
        new = self._get_checked_instance(MultivariateNormal, _instance)
        batch_shape = Size(batch_shape)
        cov_shape = tuple(batch_shape) + tuple(self.event_shape) * 2
        new.loc = self.loc.expand(tuple(batch_shape) + tuple(self.event_shape))
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril
        for name in ("covariance_matrix", "scale_tril", "precision_matrix"):
            if name in self.__dict__:
                setattr(new, name, self.__dict__[name].expand(cov_shape))
        super(MultivariateNormal, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _matrix_shape(self) -> tuple:
        return tuple(self._batch_shape) + tuple(self._event_shape) * 2

    @lazy_property
    def scale_tril(self) -> Tensor:
        """The lower Cholesky factor of the covariance."""
        return self._unbroadcasted_scale_tril.expand(self._matrix_shape())

    @lazy_property
    def covariance_matrix(self) -> Tensor:
        """The covariance matrix."""
        lower = self._unbroadcasted_scale_tril
        return kiln.matmul(lower, lower.mT).expand(self._matrix_shape())

    @lazy_property
    def precision_matrix(self) -> Tensor:
        """The precision matrix (the inverse of the covariance)."""
        return kiln.cholesky_inverse(self._unbroadcasted_scale_tril).expand(self._matrix_shape())

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def variance(self) -> Tensor:
        return self._unbroadcasted_scale_tril.pow(2).sum(-1).expand(tuple(self._batch_shape) + tuple(self._event_shape))

    def rsample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        eps = _standard_normal(self._extended_shape(sample_shape), self.loc.dtype, self.loc.device)
        return self.loc + batch_mv(self._unbroadcasted_scale_tril, eps)

    def _half_log_det(self) -> Tensor:
        return self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        m = batch_mahalanobis(self._unbroadcasted_scale_tril, value - self.loc)
        return -0.5 * (self._event_shape[0] * math.log(2 * math.pi) + m) - self._half_log_det()

    def entropy(self) -> Tensor:
        h = 0.5 * self._event_shape[0] * (1.0 + math.log(2 * math.pi)) + self._half_log_det()
        return h if len(self._batch_shape) == 0 else h.expand(self._batch_shape)

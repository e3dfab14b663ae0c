"""The Wishart distribution (``torch.distributions.wishart``)."""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions._linalg import precision_to_scale_tril
from kiln.distributions.chi2 import Chi2
from kiln.distributions.exp_family import ExponentialFamily
from kiln.distributions.utils import lazy_property, vec_to_tril_matrix

__all__ = ["Wishart"]

_LOG_2 = math.log(2)


def _bartlett_chi2(df: Tensor, batch_shape, p: int, like: Tensor) -> Chi2:
    """The chi-squared distributions of the Bartlett factor's squared diagonal: ``df - i`` degrees of
    freedom for row ``i``."""
    offsets = kiln.arange(p, dtype=like.dtype, device=like.device).expand(tuple(batch_shape) + (-1,))
    return Chi2(df=df.unsqueeze(-1) - offsets)


def _mvdigamma(x: Tensor, p: int) -> Tensor:
    """The multivariate digamma function ``sum_{j < p} digamma(x - j / 2)``."""
    if not bool((x > (p - 1) / 2).all()):
        raise AssertionError("Wrong domain for multivariate digamma function.")
    offsets = kiln.arange(p, dtype=x.dtype, device=x.device) / 2
    return kiln.digamma(x.unsqueeze(-1) - offsets).sum(-1)


class Wishart(ExponentialFamily):
    """The Wishart distribution over ``p x p`` positive-definite matrices with ``df`` degrees of freedom
    (``df > p - 1``) and one of a positive-definite ``covariance_matrix``, ``precision_matrix`` or its
    lower Cholesky factor ``scale_tril`` (the scale matrix). ``rsample`` uses the Bartlett decomposition,
    reparameterised through its chi-squared draws; a singular draw (possible when ``df < p``) is drawn
    again, up to ``max_try_correction`` times, with a warning.

    >>> d = kiln.distributions.Wishart(kiln.tensor(4.0), covariance_matrix=kiln.eye(2))
    >>> d.log_prob(kiln.eye(2))
    tensor(-4.2242)
    """

    support = constraints.positive_definite
    has_rsample = True
    _mean_carrier_measure = 0

    @property
    def arg_constraints(self):
        return {
            "covariance_matrix": constraints.positive_definite,
            "precision_matrix": constraints.positive_definite,
            "scale_tril": constraints.lower_cholesky,
            "df": constraints.greater_than(self.event_shape[-1] - 1),
        }

    def __init__(
        self,
        df: Tensor | float,
        covariance_matrix: Tensor | None = None,
        precision_matrix: Tensor | None = None,
        scale_tril: Tensor | None = None,
        validate_args: bool | None = None,
    ) -> None:
        if (covariance_matrix is not None) + (scale_tril is not None) + (precision_matrix is not None) != 1:
            raise AssertionError("Exactly one of covariance_matrix or precision_matrix or scale_tril may be specified.")
        param = next(m for m in (covariance_matrix, precision_matrix, scale_tril) if m is not None)
        if param.dim() < 2:
            raise ValueError("scale_tril must be at least two-dimensional, with optional leading batch dimensions")
        if isinstance(df, numbers.Number):
            batch_shape = Size(param.shape[:-2])
            self.df = kiln.tensor(df, dtype=param.dtype, device=param.device)
        else:
            batch_shape = Size(kiln.broadcast_shapes(tuple(param.shape[:-2]), tuple(df.shape)))
            self.df = df.expand(batch_shape)
        event_shape = param.shape[-2:]
        p = event_shape[-1]
        if bool((self.df <= p - 1).any()):
            raise ValueError(f"Value of df={df} expected to be greater than ndim - 1 = {p - 1}.")
        matrix_shape = tuple(batch_shape) + (-1, -1)
        if scale_tril is not None:
            self.scale_tril = param.expand(matrix_shape)
        elif covariance_matrix is not None:
            self.covariance_matrix = param.expand(matrix_shape)
        else:
            self.precision_matrix = param.expand(matrix_shape)
        if bool((self.df < p).any()):
            warnings.warn(
                "Low df values detected. Singular samples are highly likely to occur for ndim - 1 < df < ndim.",
                stacklevel=2,
            )
        super().__init__(batch_shape, event_shape, validate_args=validate_args)
        self._batch_dims = [-(i + 1) for i in range(len(self._batch_shape))]
        if scale_tril is not None:
            self._unbroadcasted_scale_tril = scale_tril
        elif covariance_matrix is not None:
            self._unbroadcasted_scale_tril = kiln.linalg.cholesky(covariance_matrix)
        else:
            self._unbroadcasted_scale_tril = precision_to_scale_tril(precision_matrix)
        self._dist_chi2 = _bartlett_chi2(self.df, batch_shape, p, self._unbroadcasted_scale_tril)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> Wishart:
        new = self._get_checked_instance(Wishart, _instance)
        batch_shape = Size(batch_shape)
        cov_shape = tuple(batch_shape) + tuple(self.event_shape)
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril.expand(cov_shape)
        new.df = self.df.expand(batch_shape)
        new._batch_dims = [-(i + 1) for i in range(len(batch_shape))]
        for name in ("covariance_matrix", "scale_tril", "precision_matrix"):
            if name in self.__dict__:
                setattr(new, name, self.__dict__[name].expand(cov_shape))
        new._dist_chi2 = _bartlett_chi2(new.df, batch_shape, self.event_shape[-1], new._unbroadcasted_scale_tril)
        super(Wishart, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _matrix_shape(self) -> tuple:
        return tuple(self._batch_shape) + tuple(self._event_shape)

    @lazy_property
    def scale_tril(self) -> Tensor:
        """The lower Cholesky factor of the scale matrix."""
        return self._unbroadcasted_scale_tril.expand(self._matrix_shape())

    @lazy_property
    def covariance_matrix(self) -> Tensor:
        """The scale matrix."""
        lower = self._unbroadcasted_scale_tril
        return (lower @ lower.mT).expand(self._matrix_shape())

    @lazy_property
    def precision_matrix(self) -> Tensor:
        """The inverse of the scale matrix."""
        lower = self._unbroadcasted_scale_tril
        eye = kiln.eye(lower.shape[-1], dtype=lower.dtype, device=lower.device)
        return kiln.cholesky_solve(eye, lower).expand(self._matrix_shape())

    def _df_matrix(self) -> Tensor:
        return self.df.view(tuple(self._batch_shape) + (1, 1))

    @property
    def mean(self) -> Tensor:
        return self._df_matrix() * self.covariance_matrix

    @property
    def mode(self) -> Tensor:
        factor = self.df - self.covariance_matrix.shape[-1] - 1
        factor = kiln.where(factor <= 0, math.nan, factor)
        return factor.view(tuple(self._batch_shape) + (1, 1)) * self.covariance_matrix

    @property
    def variance(self) -> Tensor:
        v = self.covariance_matrix
        d = v.diagonal(dim1=-2, dim2=-1)
        return self._df_matrix() * (v.pow(2) + d.unsqueeze(-1) * d.unsqueeze(-2))

    def _bartlett_sampling(self, sample_shape: Size) -> Tensor:
        p = self._event_shape[-1]
        eps = kiln.finfo(self.df.dtype).eps
        diag = self._dist_chi2.rsample(sample_shape).sqrt().clamp(min=eps)
        below = kiln.randn(
            tuple(sample_shape) + tuple(self._batch_shape) + (p * (p - 1) // 2,), dtype=diag.dtype, device=diag.device
        )
        noise = kiln.diag_embed(diag) + vec_to_tril_matrix(below, diag=-1)
        chol = self._unbroadcasted_scale_tril @ noise
        return chol @ chol.mT

    def rsample(self, sample_shape: Sequence[int] = Size(), max_try_correction: int | None = None) -> Tensor:
        """A reparameterised draw by the Bartlett decomposition. A draw that is not positive definite (likely
        when ``df < p``) is drawn again, up to ``max_try_correction`` times (default 10), with a warning;
        one that stays singular is returned as it is (its ``log_prob`` may be ``-inf``)."""
        max_try_correction = 10 if max_try_correction is None else max_try_correction
        sample_shape = Size(sample_shape)
        sample = self._bartlett_sampling(sample_shape)
        singular = self._singular(sample)
        if bool(singular.any()):
            warnings.warn("Singular sample detected.", stacklevel=2)
            for _ in range(max_try_correction):
                fresh = self._bartlett_sampling(sample_shape)
                where = singular.reshape(tuple(singular.shape) + (1,) * (sample.dim() - singular.dim()))
                sample = kiln.where(where, fresh, sample)
                singular = singular & self._singular(fresh)
                if not bool(singular.any()):
                    break
        return sample

    def _singular(self, sample: Tensor) -> Tensor:
        """Per sample (over the sample dimensions only): whether any matrix of the batch is not positive
        definite."""
        bad = ~self.support.check(sample)
        return bad.amax(self._batch_dims) if self._batch_shape else bad

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        nu, p = self.df, self._event_shape[-1]
        half_log_det = self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        trace = kiln.cholesky_solve(value, self._unbroadcasted_scale_tril).diagonal(dim1=-2, dim2=-1).sum(-1)
        return (
            -nu * (p * _LOG_2 / 2 + half_log_det)
            - kiln.mvlgamma(nu / 2, p=p)
            + (nu - p - 1) / 2 * kiln.linalg.slogdet(value).logabsdet
            - trace / 2
        )

    def entropy(self) -> Tensor:
        nu, p = self.df, self._event_shape[-1]
        half_log_det = self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        return (
            (p + 1) * (p * _LOG_2 / 2 + half_log_det)
            + kiln.mvlgamma(nu / 2, p=p)
            - (nu - p - 1) / 2 * _mvdigamma(nu / 2, p=p)
            + nu * p / 2
        )

    @property
    def _natural_params(self) -> tuple[Tensor, Tensor]:
        p = self._event_shape[-1]
        return -self.precision_matrix / 2, (self.df - p - 1) / 2

    def _log_normalizer(self, x, y):
        p = self._event_shape[-1]
        return (y + (p + 1) / 2) * (-kiln.linalg.slogdet(-2 * x).logabsdet + _LOG_2 * p) + kiln.mvlgamma(
            y + (p + 1) / 2, p=p
        )

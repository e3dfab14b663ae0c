"""Student's t-distribution (``torch.distributions.studentT``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions.chi2 import Chi2
from kiln.distributions.distribution import Distribution
from kiln.distributions.utils import _standard_normal, broadcast_all

__all__ = ["StudentT"]


class StudentT(Distribution):
    """Student's t-distribution with ``df`` degrees of freedom, location ``loc`` and scale ``scale``.

    ``rsample`` divides a normal draw by the square root of a reparameterised chi-squared draw, so
    gradients reach all three parameters.

    >>> kiln.distributions.StudentT(2.0).log_prob(kiln.tensor(1.0))
    tensor(-1.6479)
    """

    arg_constraints = {"df": constraints.positive, "loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(
        self,
        df: Tensor | float,
        loc: Tensor | float = 0.0,
        scale: Tensor | float = 1.0,
        validate_args: bool | None = None,
    ) -> None:
        self.df, self.loc, self.scale = broadcast_all(df, loc, scale)
        self._chi2 = Chi2(self.df)
        super().__init__(self.df.shape, validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> StudentT:
        new = self._get_checked_instance(StudentT, _instance)
        batch_shape = Size(batch_shape)
        new.df = self.df.expand(batch_shape)
        new.loc = self.loc.expand(batch_shape)
        new.scale = self.scale.expand(batch_shape)
        new._chi2 = self._chi2.expand(batch_shape)
        super(StudentT, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self) -> Tensor:
        return kiln.where(self.df <= 1, math.nan, self.loc)

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def variance(self) -> Tensor:
        df = self.df
        finite = self.scale.pow(2) * df / kiln.where(df > 2, df - 2, 1.0)
        return kiln.where(df > 2, finite, kiln.where(df > 1, math.inf, math.nan))

    def rsample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        x = _standard_normal(self._extended_shape(sample_shape), self.df.dtype, self.df.device)
        z = self._chi2.rsample(sample_shape)
        return self.loc + self.scale * x * kiln.rsqrt(z / self.df)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        df = self.df
        y = (value - self.loc) / self.scale
        z = (
            self.scale.log()
            + 0.5 * df.log()
            + 0.5 * math.log(math.pi)
            + kiln.lgamma(0.5 * df)
            - kiln.lgamma(0.5 * (df + 1.0))
        )
        return -0.5 * (df + 1.0) * kiln.log1p(y**2.0 / df) - z

    def entropy(self) -> Tensor:
        df = self.df
        lbeta = kiln.lgamma(0.5 * df) + math.lgamma(0.5) - kiln.lgamma(0.5 * (df + 1))
        return (
            self.scale.log()
            + 0.5 * (df + 1) * (kiln.digamma(0.5 * (df + 1)) - kiln.digamma(0.5 * df))
            + 0.5 * df.log()
            + lbeta
        )

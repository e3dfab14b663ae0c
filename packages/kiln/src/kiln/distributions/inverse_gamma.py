"""The inverse gamma distribution (``torch.distributions.inverse_gamma``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import kiln
from kiln._tensor import Tensor
from kiln.distributions import constraints
from kiln.distributions.gamma import Gamma
from kiln.distributions.transformed_distribution import TransformedDistribution
from kiln.distributions.transforms import PowerTransform

__all__ = ["InverseGamma"]


class InverseGamma(TransformedDistribution):
    """``1 / X`` for ``X ~ Gamma(concentration, rate)``.

    >>> kiln.distributions.InverseGamma(2.0, 1.0).log_prob(kiln.tensor(1.0))
    tensor(-1.)
    """

    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.positive
    has_rsample = True

    def __init__(self, concentration: Tensor | float, rate: Tensor | float, validate_args: bool | None = None) -> None:
        base = Gamma(concentration, rate, validate_args=validate_args)
        minus_one = -base.rate.new_ones(())
        super().__init__(base, PowerTransform(minus_one), validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> InverseGamma:
        new = self._get_checked_instance(InverseGamma, _instance)
        return super().expand(batch_shape, _instance=new)

    @property
    def concentration(self) -> Tensor:
        """The shape of the gamma distribution inverted."""
        return self.base_dist.concentration

    @property
    def rate(self) -> Tensor:
        """The rate of the gamma distribution inverted (the scale of this one)."""
        return self.base_dist.rate

    @property
    def mean(self) -> Tensor:
        a = self.concentration
        return kiln.where(a > 1, self.rate / (a - 1), math.inf)

    @property
    def mode(self) -> Tensor:
        return self.rate / (self.concentration + 1)

    @property
    def variance(self) -> Tensor:
        a = self.concentration
        return kiln.where(a > 2, self.rate.square() / ((a - 1).square() * (a - 2)), math.inf)

    def entropy(self) -> Tensor:
        a = self.concentration
        return a + self.rate.log() + a.lgamma() - (1 + a) * kiln.digamma(a)

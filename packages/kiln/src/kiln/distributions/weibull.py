"""The Weibull distribution (``torch.distributions.weibull``)."""

from __future__ import annotations

from collections.abc import Sequence

import kiln
from kiln._tensor import Tensor
from kiln.distributions import constraints
from kiln.distributions.exponential import Exponential
from kiln.distributions.transformed_distribution import TransformedDistribution
from kiln.distributions.transforms import AffineTransform, PowerTransform
from kiln.distributions.utils import broadcast_all, euler_constant

__all__ = ["Weibull"]


class Weibull(TransformedDistribution):
    """The two-parameter Weibull distribution: ``scale * X ** (1 / concentration)`` for
    ``X ~ Exponential(1)``.

    >>> kiln.distributions.Weibull(1.0, 2.0).log_prob(kiln.tensor(1.0))
    tensor(-0.3069)
    """

    arg_constraints = {"scale": constraints.positive, "concentration": constraints.positive}
    support = constraints.positive

    def __init__(self, scale: Tensor | float, concentration: Tensor | float, validate_args: bool | None = None) -> None:
        self.scale, self.concentration = broadcast_all(scale, concentration)
        self.concentration_reciprocal = self.concentration.reciprocal()
        base = Exponential(kiln.ones_like(self.scale), validate_args=validate_args)
        super().__init__(base, self._transforms(self), validate_args=validate_args)

    @staticmethod
    def _transforms(d: Weibull) -> list:
        return [PowerTransform(exponent=d.concentration_reciprocal), AffineTransform(loc=0, scale=d.scale)]

    def expand(self, batch_shape: Sequence[int], _instance=None) -> Weibull:
        new = self._get_checked_instance(Weibull, _instance)
        new.scale = self.scale.expand(batch_shape)
        new.concentration = self.concentration.expand(batch_shape)
        new.concentration_reciprocal = new.concentration.reciprocal()
        base = self.base_dist.expand(batch_shape)
        super(Weibull, new).__init__(base, self._transforms(new), validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self) -> Tensor:
        return self.scale * kiln.exp(kiln.lgamma(1 + self.concentration_reciprocal))

    @property
    def mode(self) -> Tensor:
        k = self.concentration
        return self.scale * ((k - 1) / k) ** k.reciprocal()

    @property
    def variance(self) -> Tensor:
        r = self.concentration_reciprocal
        return self.scale.pow(2) * (kiln.exp(kiln.lgamma(1 + 2 * r)) - kiln.exp(2 * kiln.lgamma(1 + r)))

    def entropy(self) -> Tensor:
        r = self.concentration_reciprocal
        return euler_constant * (1 - r) + (self.scale * r).log() + 1

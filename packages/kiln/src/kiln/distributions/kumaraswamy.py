"""The Kumaraswamy distribution (``torch.distributions.kumaraswamy``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import kiln
from kiln._tensor import Tensor
from kiln.distributions import constraints
from kiln.distributions.transformed_distribution import TransformedDistribution
from kiln.distributions.transforms import AffineTransform, PowerTransform
from kiln.distributions.uniform import Uniform
from kiln.distributions.utils import broadcast_all, euler_constant

__all__ = ["Kumaraswamy"]


def _moment(a: Tensor, b: Tensor, n: int) -> Tensor:
    """``E[X^n] = b B(1 + n/a, b)``."""
    c = 1 + n / a
    return b * kiln.exp(kiln.lgamma(c) + kiln.lgamma(b) - kiln.lgamma(c + b))


class Kumaraswamy(TransformedDistribution):
    """The Kumaraswamy distribution on ``[0, 1]``: density ``a b x^(a-1) (1 - x^a)^(b-1)`` for
    ``concentration1 = a`` and ``concentration0 = b``; ``(1 - U^(1/b))^(1/a)`` for ``U`` uniform.

    >>> kiln.distributions.Kumaraswamy(2.0, 2.0).log_prob(kiln.tensor(0.5))
    tensor(0.4055)
    """

    arg_constraints = {"concentration1": constraints.positive, "concentration0": constraints.positive}
    support = constraints.unit_interval
    has_rsample = True

    def __init__(
        self, concentration1: Tensor | float, concentration0: Tensor | float, validate_args: bool | None = None
    ) -> None:
        self.concentration1, self.concentration0 = broadcast_all(concentration1, concentration0)
        c0 = self.concentration0
        base = Uniform(kiln.full_like(c0, 0), kiln.full_like(c0, 1), validate_args=validate_args)
        transforms = [
            PowerTransform(exponent=c0.reciprocal()),
            AffineTransform(loc=1.0, scale=-1.0),
            PowerTransform(exponent=self.concentration1.reciprocal()),
        ]
        super().__init__(base, transforms, validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> Kumaraswamy:
        new = self._get_checked_instance(Kumaraswamy, _instance)
        new.concentration1 = self.concentration1.expand(batch_shape)
        new.concentration0 = self.concentration0.expand(batch_shape)
        return super().expand(batch_shape, _instance=new)

    @property
    def mean(self) -> Tensor:
        return _moment(self.concentration1, self.concentration0, 1)

    @property
    def mode(self) -> Tensor:
        a, b = self.concentration1, self.concentration0
        log_mode = b.reciprocal() * (-b).log1p() - (-b * a).log1p()
        return kiln.where((b < 1) | (a < 1), math.nan, log_mode).exp()

    @property
    def variance(self) -> Tensor:
        return _moment(self.concentration1, self.concentration0, 2) - self.mean.pow(2)

    def entropy(self) -> Tensor:
        a, b = self.concentration1, self.concentration0
        harmonic = kiln.digamma(b + 1) + euler_constant
        return (1 - b.reciprocal()) + (1 - a.reciprocal()) * harmonic - a.log() - b.log()

"""The log-normal distribution (``torch.distributions.log_normal``)."""

from __future__ import annotations

from collections.abc import Sequence

from kiln._tensor import Tensor
from kiln.distributions import constraints
from kiln.distributions.normal import Normal
from kiln.distributions.transformed_distribution import TransformedDistribution
from kiln.distributions.transforms import ExpTransform

__all__ = ["LogNormal"]


class LogNormal(TransformedDistribution):
    """``exp(X)`` for ``X ~ Normal(loc, scale)``.

    >>> kiln.distributions.LogNormal(0.0, 1.0).log_prob(kiln.tensor(1.0))
    tensor(-0.9189)
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.positive
    has_rsample = True

    def __init__(self, loc: Tensor | float, scale: Tensor | float, validate_args: bool | None = None) -> None:
        base = Normal(loc, scale, validate_args=validate_args)
        super().__init__(base, ExpTransform(), validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> LogNormal:
        new = self._get_checked_instance(LogNormal, _instance)
        return super().expand(batch_shape, _instance=new)

    @property
    def loc(self) -> Tensor:
        """The mean of the logarithm."""
        return self.base_dist.loc

    @property
    def scale(self) -> Tensor:
        """The standard deviation of the logarithm."""
        return self.base_dist.scale

    @property
    def mean(self) -> Tensor:
        return (self.loc + self.scale.pow(2) / 2).exp()

    @property
    def mode(self) -> Tensor:
        return (self.loc - self.scale.square()).exp()

    @property
    def variance(self) -> Tensor:
        s2 = self.scale.pow(2)
        return s2.expm1() * (2 * self.loc + s2).exp()

    def entropy(self) -> Tensor:
        return self.base_dist.entropy() + self.loc

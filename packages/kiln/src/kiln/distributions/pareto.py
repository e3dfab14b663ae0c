"""The Pareto (type I) distribution (``torch.distributions.pareto``)."""

from __future__ import annotations

from collections.abc import Sequence

from kiln._tensor import Tensor
from kiln.distributions import constraints
from kiln.distributions.exponential import Exponential
from kiln.distributions.transformed_distribution import TransformedDistribution
from kiln.distributions.transforms import AffineTransform, ExpTransform
from kiln.distributions.utils import broadcast_all

__all__ = ["Pareto"]


class Pareto(TransformedDistribution):
    """The Pareto distribution with minimum ``scale`` and tail index ``alpha``: ``scale * exp(X)`` for
    ``X ~ Exponential(alpha)``.

    >>> kiln.distributions.Pareto(1.0, 2.0).log_prob(kiln.tensor(2.0))
    tensor(-1.3863)
    """

    arg_constraints = {"alpha": constraints.positive, "scale": constraints.positive}

    def __init__(self, scale: Tensor | float, alpha: Tensor | float, validate_args: bool | None = None) -> None:
        self.scale, self.alpha = broadcast_all(scale, alpha)
        base = Exponential(self.alpha, validate_args=validate_args)
        super().__init__(base, [ExpTransform(), AffineTransform(loc=0, scale=self.scale)], validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> Pareto:
        new = self._get_checked_instance(Pareto, _instance)
        new.scale = self.scale.expand(batch_shape)
        new.alpha = self.alpha.expand(batch_shape)
        return super().expand(batch_shape, _instance=new)

    @property
    def mean(self) -> Tensor:
        a = self.alpha.clamp(min=1)
        return a * self.scale / (a - 1)

    @property
    def mode(self) -> Tensor:
        return self.scale

    @property
    def variance(self) -> Tensor:
        a = self.alpha.clamp(min=2)
        return self.scale.pow(2) * a / ((a - 1).pow(2) * (a - 2))

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self) -> constraints.Constraint:
        return constraints.greater_than_eq(self.scale)

    def entropy(self) -> Tensor:
        return (self.scale / self.alpha).log() + (1 + self.alpha.reciprocal())

"""The logistic-normal distribution (``torch.distributions.logistic_normal``)."""

from __future__ import annotations

from collections.abc import Sequence

from kiln._tensor import Tensor
from kiln.distributions import constraints
from kiln.distributions.normal import Normal
from kiln.distributions.transformed_distribution import TransformedDistribution
from kiln.distributions.transforms import StickBreakingTransform

__all__ = ["LogisticNormal"]


class LogisticNormal(TransformedDistribution):
    """A distribution on the simplex: a :class:`Normal` vector (``loc``, ``scale`` of size ``K - 1``) mapped
    by stick breaking (:class:`~kiln.distributions.transforms.StickBreakingTransform`) onto the simplex of
    size ``K``.

    >>> d = kiln.distributions.LogisticNormal(kiln.zeros(2), kiln.ones(2))
    >>> d.log_prob(kiln.tensor([0.2, 0.3, 0.5]))
    tensor(1.2980)
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, loc: Tensor | float, scale: Tensor | float, validate_args: bool | None = None) -> None:
        base = Normal(loc, scale, validate_args=validate_args)
        if not base.batch_shape:
            base = base.expand([1])
        super().__init__(base, StickBreakingTransform(), validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> LogisticNormal:
        new = self._get_checked_instance(LogisticNormal, _instance)
        return super().expand(batch_shape, _instance=new)

    @property
    def loc(self) -> Tensor:
        """The mean of the underlying normal."""
        return self.base_dist.base_dist.loc

    @property
    def scale(self) -> Tensor:
        """The standard deviation of the underlying normal."""
        return self.base_dist.base_dist.scale

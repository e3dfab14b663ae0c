"""The Gumbel distribution (``torch.distributions.gumbel``)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import kiln
from kiln._tensor import Tensor
from kiln.distributions import constraints
from kiln.distributions.transformed_distribution import TransformedDistribution
from kiln.distributions.transforms import AffineTransform, ExpTransform
from kiln.distributions.uniform import Uniform
from kiln.distributions.utils import broadcast_all, euler_constant

__all__ = ["Gumbel"]


class Gumbel(TransformedDistribution):
    """The Gumbel (type-I extreme value) distribution with location ``loc`` and scale ``scale``:
    ``loc - scale * log(-log(U))`` for ``U`` uniform.

    >>> kiln.distributions.Gumbel(0.0, 1.0).log_prob(kiln.tensor(0.0))
    tensor(-1.)
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real

    def __init__(self, loc: Tensor | float, scale: Tensor | float, validate_args: bool | None = None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        info = kiln.finfo(self.loc.dtype)
        tiny, top = info.tiny, 1 - info.eps
        if isinstance(loc, numbers.Number) and isinstance(scale, numbers.Number):
            base = Uniform(tiny, top, validate_args=validate_args)
        else:
            base = Uniform(kiln.full_like(self.loc, tiny), kiln.full_like(self.loc, top), validate_args=validate_args)
        transforms = [
            ExpTransform().inv,
            AffineTransform(loc=0, scale=-kiln.ones_like(self.scale)),
            ExpTransform().inv,
            AffineTransform(loc=loc, scale=-self.scale),
        ]
        super().__init__(base, transforms, validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> Gumbel:
        new = self._get_checked_instance(Gumbel, _instance)
        new.loc = self.loc.expand(batch_shape)
        new.scale = self.scale.expand(batch_shape)
        return super().expand(batch_shape, _instance=new)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        y = (self.loc - value) / self.scale
        return (y - y.exp()) - self.scale.log()

    @property
    def mean(self) -> Tensor:
        return self.loc + self.scale * euler_constant

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def stddev(self) -> Tensor:
        return (math.pi / math.sqrt(6)) * self.scale

    @property
    def variance(self) -> Tensor:
        return self.stddev.pow(2)

    def entropy(self) -> Tensor:
        return self.scale.log() + (1 + euler_constant)

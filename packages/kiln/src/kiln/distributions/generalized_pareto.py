"""The generalized Pareto distribution (``torch.distributions.generalized_pareto``)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions.distribution import Distribution
from kiln.distributions.utils import broadcast_all

__all__ = ["GeneralizedPareto"]


def _near_zero(t: Tensor) -> Tensor:
    """``isclose(t, 0)`` with the default tolerances (``atol=1e-8``)."""
    return t.abs() <= 1e-8


class GeneralizedPareto(Distribution):
    """The generalized Pareto distribution with ``loc``, ``scale`` and ``concentration`` (the shape xi):
    the exponential distribution for ``xi = 0``, a Pareto one for ``xi > 0``, bounded above for ``xi < 0``
    (uniform at ``xi = -1``).

    >>> kiln.distributions.GeneralizedPareto(0.0, 1.0, 0.5).log_prob(kiln.tensor(1.0))
    tensor(-1.2164)
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive, "concentration": constraints.real}
    has_rsample = True

    def __init__(
        self,
        loc: Tensor | float,
        scale: Tensor | float,
        concentration: Tensor | float,
        validate_args: bool | None = None,
    ) -> None:
        self.loc, self.scale, self.concentration = broadcast_all(loc, scale, concentration)
        scalar = all(isinstance(v, numbers.Number) for v in (loc, scale, concentration))
        super().__init__(Size() if scalar else self.loc.shape, validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> GeneralizedPareto:
        new = self._get_checked_instance(GeneralizedPareto, _instance)
        batch_shape = Size(batch_shape)
        new.loc = self.loc.expand(batch_shape)
        new.scale = self.scale.expand(batch_shape)
        new.concentration = self.concentration.expand(batch_shape)
        super(GeneralizedPareto, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _safe_concentration(self) -> tuple[Tensor, Tensor]:
        zero = _near_zero(self.concentration)
        return zero, kiln.where(zero, kiln.ones_like(self.concentration), self.concentration)

    def rsample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        u = kiln.rand(self._extended_shape(sample_shape), dtype=self.loc.dtype, device=self.loc.device)
        return self.icdf(u)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        z = (value - self.loc) / self.scale
        zero, xi = self._safe_concentration()
        y = 1 / xi + kiln.ones_like(z)
        nonzero = kiln.where(y == 0, y, y * kiln.log1p(xi * z))
        return -self.scale.log() - kiln.where(zero, z, nonzero)

    def log_survival_function(self, value: Tensor) -> Tensor:
        """``log(1 - cdf(value))``."""
        if self._validate_args:
            self._validate_sample(value)
        z = (value - self.loc) / self.scale
        zero, xi = self._safe_concentration()
        return kiln.where(zero, -z, -kiln.log1p(xi * z) / xi)

    def log_cdf(self, value: Tensor) -> Tensor:
        """``log(cdf(value))``."""
        return kiln.log1p(-kiln.exp(self.log_survival_function(value)))

    def cdf(self, value: Tensor) -> Tensor:
        return kiln.exp(self.log_cdf(value))

    def icdf(self, value: Tensor) -> Tensor:
        zero, xi = self._safe_concentration()
        log_u = kiln.log1p(-value)
        nonzero = self.loc + self.scale / xi * kiln.expm1(-xi * log_u)
        return kiln.where(zero, self.loc - self.scale * log_u, nonzero)

    @property
    def mean(self) -> Tensor:
        valid = self.concentration < 1
        xi = kiln.where(valid, self.concentration, 0.5)
        return kiln.where(valid, self.loc + self.scale / (1 - xi), math.nan)

    @property
    def variance(self) -> Tensor:
        valid = self.concentration < 0.5
        xi = kiln.where(valid, self.concentration, 0.25)
        return kiln.where(valid, self.scale**2 / ((1 - xi) ** 2 * (1 - 2 * xi)), math.nan)

    def entropy(self) -> Tensor:
        return kiln.broadcast_to(self.scale.log() + self.concentration + 1, self._batch_shape)

    @property
    def mode(self) -> Tensor:
        return self.loc

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self):
        lower = self.loc
        upper = kiln.where(self.concentration < 0, lower - self.scale / self.concentration, math.inf)
        return constraints.interval(lower, upper)

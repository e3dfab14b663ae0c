"""The gamma distribution (``torch.distributions.gamma``)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions._gamma import standard_gamma
from kiln.distributions.exp_family import ExponentialFamily
from kiln.distributions.utils import _xlogy, broadcast_all

__all__ = ["Gamma"]


class Gamma(ExponentialFamily):
    """The gamma distribution with shape ``concentration`` (alpha) and ``rate`` (beta, ``1 / scale``).

    ``rsample`` is reparameterised by the implicit gradient of the gamma draw (see
    ``kiln.distributions._gamma``), so gradients reach both parameters.

    >>> kiln.distributions.Gamma(2.0, 1.0).log_prob(kiln.tensor(1.0))
    tensor(-1.)
    """

    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True
    _mean_carrier_measure = 0

    def __init__(self, concentration: Tensor | float, rate: Tensor | float, validate_args: bool | None = None) -> None:
        self.concentration, self.rate = broadcast_all(concentration, rate)
        scalar = isinstance(concentration, numbers.Number) and isinstance(rate, numbers.Number)
        super().__init__(Size() if scalar else self.concentration.shape, validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> Gamma:
        new = self._get_checked_instance(Gamma, _instance)
        batch_shape = Size(batch_shape)
        new.concentration = self.concentration.expand(batch_shape)
        new.rate = self.rate.expand(batch_shape)
        super(Gamma, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self) -> Tensor:
        return self.concentration / self.rate

    @property
    def mode(self) -> Tensor:
        return ((self.concentration - 1) / self.rate).clamp(min=0)

    @property
    def variance(self) -> Tensor:
        return self.concentration / self.rate.pow(2)

    def rsample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        value = standard_gamma(self.concentration.expand(shape)) / self.rate.expand(shape)
        value.detach().clamp_(min=kiln.finfo(value.dtype).tiny)  # not recorded by autograd
        return value

    def log_prob(self, value: Tensor) -> Tensor:
        value = kiln.as_tensor(value, dtype=self.rate.dtype, device=self.rate.device)
        if self._validate_args:
            self._validate_sample(value)
        a = self.concentration
        return _xlogy(a, self.rate) + _xlogy(a - 1, value) - self.rate * value - kiln.lgamma(a)

    def cdf(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return kiln.igamma(self.concentration, self.rate * value)

    def entropy(self) -> Tensor:
        a = self.concentration
        return a - self.rate.log() + kiln.lgamma(a) + (1.0 - a) * kiln.digamma(a)

    @property
    def _natural_params(self) -> tuple[Tensor, Tensor]:
        return (self.concentration - 1, -self.rate)

    def _log_normalizer(self, x, y):
        return kiln.lgamma(x + 1) + (x + 1) * kiln.log(-y.reciprocal())

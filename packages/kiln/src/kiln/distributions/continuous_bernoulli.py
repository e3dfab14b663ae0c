"""The continuous Bernoulli distribution (``torch.distributions.continuous_bernoulli``)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions.bernoulli import _one_of
from kiln.distributions.exp_family import ExponentialFamily
from kiln.distributions.utils import broadcast_all, clamp_probs, lazy_property, logits_to_probs, probs_to_logits
from kiln.nn_functional import binary_cross_entropy_with_logits

__all__ = ["ContinuousBernoulli"]


class ContinuousBernoulli(ExponentialFamily):
    """The continuous Bernoulli distribution on ``[0, 1]`` (Loaiza-Ganem and Cunningham, 2019): density
    proportional to ``p^x (1 - p)^(1 - x)``, with ``probs`` (``p``) or ``logits``. Near ``p = 1/2``,
    inside ``lims``, the normaliser and moments use Taylor expansions, which are stable there.

    >>> kiln.distributions.ContinuousBernoulli(probs=kiln.tensor(0.2)).log_prob(kiln.tensor(0.5))
    tensor(-0.0788)
    """

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.unit_interval
    _mean_carrier_measure = 0
    has_rsample = True

    def __init__(
        self,
        probs: Tensor | float | None = None,
        logits: Tensor | float | None = None,
        lims: tuple[float, float] = (0.499, 0.501),
        validate_args: bool | None = None,
    ) -> None:
        _one_of(probs, logits)
        given = probs if probs is not None else logits
        (param,) = broadcast_all(given)
        if probs is not None:
            if validate_args is not None and not bool(self.arg_constraints["probs"].check(param).all()):
                raise ValueError("The parameter probs has invalid values")
            self.probs = param = clamp_probs(param)
        else:
            self.logits = param
        self._param = param
        self._lims = lims
        super().__init__(Size() if isinstance(given, numbers.Number) else param.shape, validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> ContinuousBernoulli:
        new = self._get_checked_instance(ContinuousBernoulli, _instance)
        new._lims = self._lims
        batch_shape = Size(batch_shape)
        if "probs" in self.__dict__:
            new.probs = new._param = self.probs.expand(batch_shape)
        if "logits" in self.__dict__:
            new.logits = new._param = self.logits.expand(batch_shape)
        super(ContinuousBernoulli, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _outside_unstable_region(self) -> Tensor:
        return (self.probs <= self._lims[0]) | (self.probs > self._lims[1])

    def _cut_probs(self) -> Tensor:
        return kiln.where(self._outside_unstable_region(), self.probs, self._lims[0] * kiln.ones_like(self.probs))

    def _cont_bern_log_norm(self) -> Tensor:
        """The log-normaliser as a function of ``probs``."""
        p = self._cut_probs()
        below = kiln.where(p <= 0.5, p, kiln.zeros_like(p))
        above = kiln.where(p >= 0.5, p, kiln.ones_like(p))
        exact = kiln.log((kiln.log1p(-p) - p.log()).abs()) - kiln.where(
            p <= 0.5, kiln.log1p(-2.0 * below), kiln.log(2.0 * above - 1.0)
        )
        x = (self.probs - 0.5).pow(2)
        taylor = math.log(2.0) + (4.0 / 3.0 + 104.0 / 45.0 * x) * x
        return kiln.where(self._outside_unstable_region(), exact, taylor)

    @property
    def mean(self) -> Tensor:
        p = self._cut_probs()
        exact = p / (2.0 * p - 1.0) + 1.0 / (kiln.log1p(-p) - p.log())
        x = self.probs - 0.5
        taylor = 0.5 + (1.0 / 3.0 + 16.0 / 45.0 * x.pow(2)) * x
        return kiln.where(self._outside_unstable_region(), exact, taylor)

    @property
    def stddev(self) -> Tensor:
        return self.variance.sqrt()

    @property
    def variance(self) -> Tensor:
        p = self._cut_probs()
        exact = p * (p - 1.0) / (1.0 - 2.0 * p).pow(2) + 1.0 / (kiln.log1p(-p) - p.log()).pow(2)
        x = (self.probs - 0.5).pow(2)
        taylor = 1.0 / 12.0 - (1.0 / 15.0 - 128.0 / 945.0 * x) * x
        return kiln.where(self._outside_unstable_region(), exact, taylor)

    @lazy_property
    def logits(self) -> Tensor:
        """The logit of ``probs``."""
        return probs_to_logits(self.probs, is_binary=True)

    @lazy_property
    def probs(self) -> Tensor:
        """The shape parameter ``p`` (clamped into the open unit interval)."""
        return clamp_probs(logits_to_probs(self.logits, is_binary=True))

    @property
    def param_shape(self) -> Size:
        """The shape of the parameter the distribution was made with."""
        return self._param.shape

    def sample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        u = kiln.rand(self._extended_shape(sample_shape), dtype=self.probs.dtype, device=self.probs.device)
        with kiln.no_grad():
            return self.icdf(u)

    def rsample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        u = kiln.rand(self._extended_shape(sample_shape), dtype=self.probs.dtype, device=self.probs.device)
        return self.icdf(u)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        return -binary_cross_entropy_with_logits(logits, value, reduction="none") + self._cont_bern_log_norm()

    def cdf(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        p = self._cut_probs()
        exact = (p.pow(value) * (1.0 - p).pow(1.0 - value) + p - 1.0) / (2.0 * p - 1.0)
        inside = kiln.where(self._outside_unstable_region(), exact, value)
        return kiln.where(value <= 0.0, kiln.zeros_like(value), kiln.where(value >= 1.0, kiln.ones_like(value), inside))

    def icdf(self, value: Tensor) -> Tensor:
        p = self._cut_probs()
        exact = (kiln.log1p(-p + value * (2.0 * p - 1.0)) - kiln.log1p(-p)) / (p.log() - kiln.log1p(-p))
        return kiln.where(self._outside_unstable_region(), exact, value)

    def entropy(self) -> Tensor:
        log0, log1 = kiln.log1p(-self.probs), self.probs.log()
        return self.mean * (log0 - log1) - self._cont_bern_log_norm() - log0

    @property
    def _natural_params(self) -> tuple[Tensor]:
        return (self.logits,)

    def _log_normalizer(self, x):
        outside = (x <= self._lims[0] - 0.5) | (x > self._lims[1] - 0.5)
        cut = kiln.where(outside, x, (self._lims[0] - 0.5) * kiln.ones_like(x))
        exact = kiln.log(kiln.expm1(cut).abs()) - kiln.log(cut.abs())
        taylor = 0.5 * x + x.pow(2) / 24.0 - x.pow(4) / 2880.0
        return kiln.where(outside, exact, taylor)

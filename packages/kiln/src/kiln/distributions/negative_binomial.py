"""The negative binomial distribution (``torch.distributions.negative_binomial``)."""

from __future__ import annotations

from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions.bernoulli import _one_of
from kiln.distributions.distribution import Distribution
from kiln.distributions.gamma import Gamma
from kiln.distributions.utils import broadcast_all, lazy_property, logits_to_probs, probs_to_logits
from kiln.nn_functional import logsigmoid

__all__ = ["NegativeBinomial"]


class NegativeBinomial(Distribution):
    """The number of successes before ``total_count`` failures in Bernoulli trials of success probability
    ``probs`` (or log-odds ``logits``; give one of them). ``total_count`` may be any non-negative real.

    >>> kiln.distributions.NegativeBinomial(2.0, probs=kiln.tensor(0.5)).log_prob(kiln.tensor(1.0))
    tensor(-1.3863)
    """

    arg_constraints = {
        "total_count": constraints.greater_than_eq(0),
        "probs": constraints.half_open_interval(0.0, 1.0),
        "logits": constraints.real,
    }
    support = constraints.nonnegative_integer

    def __init__(
        self,
        total_count: Tensor | float,
        probs: Tensor | None = None,
        logits: Tensor | None = None,
        validate_args: bool | None = None,
    ) -> None:
        _one_of(probs, logits)
        count, param = broadcast_all(total_count, probs if probs is not None else logits)
        self.total_count = count.to(param.dtype)
        if probs is not None:
            self.probs = param
        else:
            self.logits = param
        self._param = param
        super().__init__(param.shape, validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> NegativeBinomial:
        new = self._get_checked_instance(NegativeBinomial, _instance)
        batch_shape = Size(batch_shape)
        new.total_count = self.total_count.expand(batch_shape)
        if "probs" in self.__dict__:
            new.probs = new._param = self.probs.expand(batch_shape)
        if "logits" in self.__dict__:
            new.logits = new._param = self.logits.expand(batch_shape)
        super(NegativeBinomial, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @lazy_property
    def logits(self) -> Tensor:
        """The log-odds of success."""
        return probs_to_logits(self.probs, is_binary=True)

    @lazy_property
    def probs(self) -> Tensor:
        """The probability of success."""
        return logits_to_probs(self.logits, is_binary=True)

    @property
    def param_shape(self) -> Size:
        """The shape of the parameter the distribution was made with."""
        return self._param.shape

    @property
    def mean(self) -> Tensor:
        return self.total_count * kiln.exp(self.logits)

    @property
    def mode(self) -> Tensor:
        return ((self.total_count - 1) * self.logits.exp()).floor().clamp(min=0.0)

    @property
    def variance(self) -> Tensor:
        return self.mean / kiln.sigmoid(-self.logits)

    @lazy_property
    def _gamma(self) -> Gamma:
        return Gamma(concentration=self.total_count, rate=kiln.exp(-self.logits), validate_args=False)

    def sample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        with kiln.no_grad():
            return kiln.poisson(self._gamma.sample(sample_shape=sample_shape))

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        n = self.total_count
        unnormalised = n * logsigmoid(-self.logits) + value * logsigmoid(self.logits)
        normaliser = -kiln.lgamma(n + value) + kiln.lgamma(1.0 + value) + kiln.lgamma(n)
        normaliser = normaliser.masked_fill(n + value == 0.0, 0.0)
        return unnormalised - normaliser

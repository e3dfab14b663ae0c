"""The binomial distribution (``torch.distributions.binomial``)."""

from __future__ import annotations

from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions.bernoulli import _one_of
from kiln.distributions.distribution import Distribution
from kiln.distributions.utils import broadcast_all, lazy_property, logits_to_probs, probs_to_logits

__all__ = ["Binomial"]


def _clamp_by_zero(x: Tensor) -> Tensor:
    """``max(x, 0)`` with gradient 1/2 at 0, as PyTorch's."""
    return (x.clamp(min=0) + x - x.clamp(max=0)) / 2


def _homogeneous_count(total_count: Tensor, what: str) -> int:
    n = int(total_count.max())
    if not total_count.min() == n:
        raise NotImplementedError(f"Inhomogeneous total count not supported by `{what}`.")
    return n


class Binomial(Distribution):
    """The number of successes in ``total_count`` Bernoulli trials of probability ``probs`` (or log-odds
    ``logits``; give one of them). ``total_count`` broadcasts with the probabilities.

    >>> kiln.distributions.Binomial(4, probs=kiln.tensor(0.5)).log_prob(kiln.tensor(2.0))
    tensor(-0.9808)
    """

    arg_constraints = {
        "total_count": constraints.nonnegative_integer,
        "probs": constraints.unit_interval,
        "logits": constraints.real,
    }
    has_enumerate_support = True

    def __init__(
        self,
        total_count: Tensor | int = 1,
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

    def expand(self, batch_shape: Sequence[int], _instance=None) -> Binomial:
        new = self._get_checked_instance(Binomial, _instance)
        batch_shape = Size(batch_shape)
        new.total_count = self.total_count.expand(batch_shape)
        if "probs" in self.__dict__:
            new.probs = new._param = self.probs.expand(batch_shape)
        if "logits" in self.__dict__:
            new.logits = new._param = self.logits.expand(batch_shape)
        super(Binomial, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return constraints.integer_interval(0, self.total_count)

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
        return self.total_count * self.probs

    @property
    def mode(self) -> Tensor:
        return ((self.total_count + 1) * self.probs).floor().clamp(max=self.total_count)

    @property
    def variance(self) -> Tensor:
        return self.total_count * self.probs * (1 - self.probs)

    def sample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        with kiln.no_grad():
            return kiln.binomial(self.total_count.expand(shape), self.probs.expand(shape))

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        n, logits = self.total_count, self.logits
        log_n = kiln.lgamma(n + 1)
        log_k = kiln.lgamma(value + 1)
        log_nmk = kiln.lgamma(n - value + 1)
        normalise = n * _clamp_by_zero(logits) + n * kiln.log1p(kiln.exp(-logits.abs())) - log_n
        return value * logits - log_k - log_nmk - normalise

    def entropy(self) -> Tensor:
        _homogeneous_count(self.total_count, "entropy")
        lp = self.log_prob(self.enumerate_support(False))
        return -(kiln.exp(lp) * lp).sum(0)

    def enumerate_support(self, expand: bool = True) -> Tensor:
        n = _homogeneous_count(self.total_count, "enumerate_support")
        values = kiln.arange(1 + n, dtype=self._param.dtype, device=self._param.device)
        values = values.view((-1,) + (1,) * len(self._batch_shape))
        return values.expand((-1,) + tuple(self._batch_shape)) if expand else values

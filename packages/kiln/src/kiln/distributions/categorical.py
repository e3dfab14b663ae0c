"""The categorical distribution (``torch.distributions.categorical``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions.bernoulli import _one_of
from kiln.distributions.distribution import Distribution
from kiln.distributions.utils import lazy_property, logits_to_probs, probs_to_logits

__all__ = ["Categorical"]


def _event_param(name: str, value) -> Tensor:
    if value.dim() < 1:
        raise ValueError(f"`{name}` parameter must be at least one-dimensional.")
    return value


class Categorical(Distribution):
    """A distribution over the integers 0 to K-1 (``K = probs.size(-1)``), as :func:`kiln.multinomial`
    samples: give either ``probs`` (non-negative weights, normalised over the last dimension) or
    ``logits`` (unnormalised log-probabilities), not both. The leading dimensions are batch dimensions.

    >>> m = kiln.distributions.Categorical(probs=kiln.tensor([0.25, 0.25, 0.5]))
    >>> m.log_prob(kiln.tensor(2)), m.entropy()
    (tensor(-0.6931), tensor(1.0397))
    """

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}
    has_enumerate_support = True

    def __init__(
        self, probs: Tensor | None = None, logits: Tensor | None = None, validate_args: bool | None = None
    ) -> None:
        _one_of(probs, logits)
        if probs is not None:
            self.probs = self._param = _event_param("probs", probs) / probs.sum(-1, keepdim=True)
        else:
            self.logits = self._param = _event_param("logits", logits) - logits.logsumexp(-1, keepdim=True)
        self._num_events = self._param.shape[-1]
        batch = self._param.shape[:-1] if self._param.dim() > 1 else Size()
        super().__init__(batch, validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> Categorical:
        new = self._get_checked_instance(Categorical, _instance)
        batch_shape = Size(batch_shape)
        param_shape = tuple(batch_shape) + (self._num_events,)
        if "probs" in self.__dict__:
            new.probs = new._param = self.probs.expand(param_shape)
        if "logits" in self.__dict__:
            new.logits = new._param = self.logits.expand(param_shape)
        new._num_events = self._num_events
        super(Categorical, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return constraints.integer_interval(0, self._num_events - 1)

    @lazy_property
    def logits(self) -> Tensor:
        """The normalised log-probabilities."""
        return probs_to_logits(self.probs)

    @lazy_property
    def probs(self) -> Tensor:
        """The normalised probabilities."""
        return logits_to_probs(self.logits)

    @property
    def param_shape(self) -> Size:
        """The shape of the parameter the distribution was made with."""
        return self._param.shape

    @property
    def mean(self) -> Tensor:
        return kiln.full(self._extended_shape(), math.nan, dtype=self.probs.dtype, device=self.probs.device)

    @property
    def mode(self) -> Tensor:
        return self.probs.argmax(dim=-1)

    @property
    def variance(self) -> Tensor:
        return kiln.full(self._extended_shape(), math.nan, dtype=self.probs.dtype, device=self.probs.device)

    def sample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        sample_shape = Size(sample_shape)
        with kiln.no_grad():
            probs = self.probs.reshape(-1, self._num_events)
            draws = kiln.multinomial(probs, sample_shape.numel(), True).mT
            return draws.reshape(self._extended_shape(sample_shape))

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        index, log_pmf = kiln.broadcast_tensors(value.long().unsqueeze(-1), self.logits)
        return log_pmf.gather(-1, index[..., :1]).squeeze(-1)

    def entropy(self) -> Tensor:
        logits = self.logits.clamp(min=kiln.finfo(self.logits.dtype).min)
        return -(logits * self.probs).sum(-1)

    def enumerate_support(self, expand: bool = True) -> Tensor:
        values = kiln.arange(self._num_events, dtype=kiln.long, device=self._param.device)
        values = values.view((-1,) + (1,) * len(self._batch_shape))
        return values.expand((-1,) + tuple(self._batch_shape)) if expand else values

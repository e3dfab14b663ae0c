"""The multinomial distribution (``torch.distributions.multinomial``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions.binomial import Binomial
from kiln.distributions.categorical import Categorical
from kiln.distributions.distribution import Distribution
from kiln.distributions.utils import broadcast_all

__all__ = ["Multinomial"]


class Multinomial(Distribution):
    """The counts of ``total_count`` draws from a :class:`Categorical` (``probs`` or ``logits``): events
    are count vectors over the last dimension. ``total_count`` is one int for the whole batch; it is
    needed by ``sample`` and ``entropy``, not by ``log_prob``.

    >>> m = kiln.distributions.Multinomial(2, kiln.tensor([0.5, 0.5]))
    >>> m.log_prob(kiln.tensor([1.0, 1.0]))
    tensor(-0.6931)
    """

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}

    def __init__(
        self,
        total_count: int = 1,
        probs: Tensor | None = None,
        logits: Tensor | None = None,
        validate_args: bool | None = None,
    ) -> None:
        if not isinstance(total_count, int):
            raise NotImplementedError("inhomogeneous total_count is not supported")
        self.total_count = total_count
        self._categorical = Categorical(probs=probs, logits=logits)
        self._binomial = Binomial(total_count=total_count, probs=self.probs)
        super().__init__(self._categorical.batch_shape, self._categorical.param_shape[-1:], validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> Multinomial:
        new = self._get_checked_instance(Multinomial, _instance)
        batch_shape = Size(batch_shape)
        new.total_count = self.total_count
        new._categorical = self._categorical.expand(batch_shape)
        new._binomial = Binomial(total_count=self.total_count, probs=new._categorical.probs)
        super(Multinomial, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        return constraints.multinomial(self.total_count)

    @property
    def logits(self) -> Tensor:
        """The normalised log-probabilities."""
        return self._categorical.logits

    @property
    def probs(self) -> Tensor:
        """The normalised probabilities."""
        return self._categorical.probs

    @property
    def param_shape(self) -> Size:
        """The shape of the parameter the distribution was made with."""
        return self._categorical.param_shape

    @property
    def mean(self) -> Tensor:
        return self.probs * self.total_count

    @property
    def variance(self) -> Tensor:
        return self.total_count * self.probs * (1 - self.probs)

    def sample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        sample_shape = Size(sample_shape)
        draws = self._categorical.sample(Size((self.total_count,) + tuple(sample_shape)))
        draws = draws.permute(tuple(range(1, draws.dim())) + (0,))
        counts = kiln.zeros(self._extended_shape(sample_shape), dtype=draws.dtype, device=draws.device)
        counts = counts.scatter_add(-1, draws, kiln.ones_like(draws))
        return counts.to(self.probs.dtype)

    def entropy(self) -> Tensor:
        n = kiln.tensor(float(self.total_count), dtype=self.probs.dtype, device=self.probs.device)
        term1 = n * self._categorical.entropy() - kiln.lgamma(n + 1)
        support = self._binomial.enumerate_support(expand=False)[1:]
        probs = kiln.exp(self._binomial.log_prob(support))
        term2 = (probs * kiln.lgamma(support + 1)).sum((0, -1))
        return term1 + term2

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        log_n = kiln.lgamma(value.sum(-1) + 1)
        log_xs = kiln.lgamma(value + 1).sum(-1)
        logits = kiln.where((value == 0) & (logits == -math.inf), 0.0, logits)  # 0 * log(0) is 0 here
        return log_n - log_xs + (logits * value).sum(-1)

"""The Dirichlet distribution (``torch.distributions.dirichlet``)."""

from __future__ import annotations

from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions._gamma import standard_gamma
from kiln.distributions.exp_family import ExponentialFamily
from kiln.distributions.utils import _xlogy
from kiln.nn_functional import one_hot

__all__ = ["Dirichlet"]


class Dirichlet(ExponentialFamily):
    """The Dirichlet distribution over the simplex of the last dimension, with ``concentration`` (alpha,
    positive; leading dimensions are batch dimensions).

    ``rsample`` normalises reparameterised gamma draws (implicit gradients), so gradients reach the
    concentration; the per-sample gradients differ from PyTorch's (which differentiates the Beta marginals),
    their expectations agree.

    >>> d = kiln.distributions.Dirichlet(kiln.tensor([1.0, 2.0]))
    >>> d.log_prob(kiln.tensor([0.25, 0.75]))
    tensor(0.4055)
    """

    arg_constraints = {"concentration": constraints.independent(constraints.positive, 1)}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, concentration: Tensor, validate_args: bool | None = None) -> None:
        if concentration.dim() < 1:
            raise ValueError("`concentration` parameter must be at least one-dimensional.")
        self.concentration = concentration
        super().__init__(concentration.shape[:-1], concentration.shape[-1:], validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> Dirichlet:
        new = self._get_checked_instance(Dirichlet, _instance)
        batch_shape = Size(batch_shape)
        new.concentration = self.concentration.expand(tuple(batch_shape) + tuple(self.event_shape))
        super(Dirichlet, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def rsample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        g = standard_gamma(self.concentration.expand(self._extended_shape(sample_shape)))
        return g / g.sum(-1, keepdim=True)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        a = self.concentration
        return _xlogy(a - 1.0, value).sum(-1) + kiln.lgamma(a.sum(-1)) - kiln.lgamma(a).sum(-1)

    @property
    def mean(self) -> Tensor:
        return self.concentration / self.concentration.sum(-1, True)

    @property
    def mode(self) -> Tensor:
        am1 = (self.concentration - 1).clamp(min=0.0)
        mode = am1 / am1.sum(-1, True)
        # every alpha < 1: the density peaks at the corners, PyTorch's convention picks one corner
        corner = one_hot(mode.argmax(dim=-1), am1.shape[-1]).to(mode.dtype)
        all_small = (self.concentration < 1).all(dim=-1, keepdim=True)
        return kiln.where(all_small, corner, mode)

    @property
    def variance(self) -> Tensor:
        a0 = self.concentration.sum(-1, True)
        return self.concentration * (a0 - self.concentration) / (a0.pow(2) * (a0 + 1))

    def entropy(self) -> Tensor:
        a = self.concentration
        k = a.size(-1)
        a0 = a.sum(-1)
        return (
            kiln.lgamma(a).sum(-1)
            - kiln.lgamma(a0)
            - (k - a0) * kiln.digamma(a0)
            - ((a - 1.0) * kiln.digamma(a)).sum(-1)
        )

    @property
    def _natural_params(self) -> tuple[Tensor]:
        return (self.concentration,)

    def _log_normalizer(self, x):
        return kiln.lgamma(x).sum(-1) - kiln.lgamma(x.sum(-1))

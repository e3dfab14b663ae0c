"""The base class of exponential-family distributions (``torch.distributions.exp_family``)."""

from __future__ import annotations

import kiln
from kiln._tensor import Tensor
from kiln.distributions.distribution import Distribution

__all__ = ["ExponentialFamily"]


class ExponentialFamily(Distribution):
    """A distribution whose density is ``exp(<t(x), theta> - F(theta) + k(x))``: natural parameters
    ``theta``, sufficient statistic ``t``, log-normaliser ``F`` and carrier measure ``k``.

    A subclass gives ``_natural_params``, ``_log_normalizer(*theta)`` and ``_mean_carrier_measure``; the
    entropy then comes from the log-normaliser by autograd (a Bregman divergence), and so does the KL
    divergence between two members of the same family.
    """

    @property
    def _natural_params(self) -> tuple[Tensor, ...]:
        raise NotImplementedError

    def _log_normalizer(self, *natural_params):
        raise NotImplementedError

    @property
    def _mean_carrier_measure(self) -> float:
        raise NotImplementedError

    def entropy(self) -> Tensor:
        """The entropy, from the gradient of the log-normaliser."""
        params = [p.detach().requires_grad_() for p in self._natural_params]
        log_norm = self._log_normalizer(*params)
        grads = kiln.autograd.grad(log_norm.sum(), params, create_graph=True)
        result = log_norm - self._mean_carrier_measure
        for p, g in zip(params, grads):
            result = result - (p * g).reshape(tuple(self._batch_shape) + (-1,)).sum(-1)
        return result

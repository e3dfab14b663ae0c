"""The LKJ distribution over Cholesky factors of correlation matrices
(``torch.distributions.lkj_cholesky``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions.beta import Beta
from kiln.distributions.distribution import Distribution
from kiln.distributions.utils import broadcast_all

__all__ = ["LKJCholesky"]


class LKJCholesky(Distribution):
    """The LKJ distribution (Lewandowski, Kurowicka and Joe, 2009) over lower Cholesky factors ``L`` of
    ``dim x dim`` correlation matrices: ``L L^T`` has density proportional to ``det(L L^T)^(eta - 1)`` for
    ``concentration = eta`` (uniform at 1). Samples come from the onion method.

    >>> d = kiln.distributions.LKJCholesky(2, 2.0)
    >>> d.log_prob(kiln.tensor([[1.0, 0.0], [0.6, 0.8]]))
    tensor(-0.7340)
    """

    arg_constraints = {"concentration": constraints.positive}
    support = constraints.corr_cholesky

    def __init__(self, dim: int, concentration: Tensor | float = 1.0, validate_args: bool | None = None) -> None:
        if dim < 2:
            raise ValueError(f"Expected dim to be an integer greater than or equal to 2. Found dim={dim}.")
        self.dim = dim
        (self.concentration,) = broadcast_all(concentration)
        conc = self.concentration
        marginal = conc + 0.5 * (dim - 2)
        offset = kiln.arange(dim - 1, dtype=conc.dtype, device=conc.device)
        offset = kiln.cat([offset.new_zeros((1,)), offset])
        self._beta = Beta(offset + 0.5, marginal.unsqueeze(-1) - 0.5 * offset)
        super().__init__(conc.shape, Size((dim, dim)), validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> LKJCholesky:
        new = self._get_checked_instance(LKJCholesky, _instance)
        batch_shape = Size(batch_shape)
        new.dim = self.dim
        new.concentration = self.concentration.expand(batch_shape)
        new._beta = self._beta.expand(tuple(batch_shape) + (self.dim,))
        super(LKJCholesky, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def sample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        """Onion-method draws: each row ``i`` of ``L`` is a uniform direction in its first ``i`` coordinates
        scaled by the square root of a beta draw, with the diagonal completing it to unit length."""
        with kiln.no_grad():
            y = self._beta.sample(sample_shape).unsqueeze(-1)
            u = kiln.randn(self._extended_shape(sample_shape), dtype=y.dtype, device=y.device).tril(-1)
            norm = u.norm(dim=-1, keepdim=True)
            w = y.sqrt() * (u / kiln.where(norm == 0, 1.0, norm))  # row 0 stays zero
            tiny = kiln.finfo(w.dtype).tiny
            diag = (1 - (w**2).sum(-1)).clamp(min=tiny).sqrt()
            return w + diag.unsqueeze(-1) * kiln.eye(self.dim, dtype=w.dtype, device=w.device)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        diag = value.diagonal(dim1=-1, dim2=-2)[..., 1:]
        order = kiln.arange(2, self.dim + 1, device=self.concentration.device)
        order = 2 * (self.concentration - 1).unsqueeze(-1) + self.dim - order
        unnormalised = (order * diag.log()).sum(-1)
        dm1 = self.dim - 1
        alpha = self.concentration + 0.5 * dm1
        normaliser = 0.5 * dm1 * math.log(math.pi) + kiln.mvlgamma(alpha - 0.5, dm1) - kiln.lgamma(alpha) * dm1
        return unnormalised - normaliser

"""The von Mises distribution on the circle (``torch.distributions.von_mises``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions.distribution import Distribution
from kiln.distributions.utils import broadcast_all, lazy_property

__all__ = ["VonMises"]


def _log_i0(x: Tensor) -> Tensor:
    """``log I_0(x)`` for ``x > 0``, through the exponentially scaled Bessel function (no overflow)."""
    return kiln.special.i0e(x).log() + x


def _log_i1(x: Tensor) -> Tensor:
    """``log I_1(x)`` for ``x > 0``."""
    return kiln.special.i1e(x).log() + x


class VonMises(Distribution):
    """The von Mises (circular normal) distribution with mean angle ``loc`` and ``concentration`` kappa:
    density ``exp(kappa cos(x - loc)) / (2 pi I_0(kappa))``. ``loc`` and values may be any reals (they are
    angles modulo ``2 pi``); samples lie in ``[-pi, pi)``. The mean and variance are the circular ones.

    >>> kiln.distributions.VonMises(kiln.tensor(0.0), kiln.tensor(2.0)).log_prob(kiln.tensor(0.5))
    tensor(-0.9067)
    """

    arg_constraints = {"loc": constraints.real, "concentration": constraints.positive}
    support = constraints.real
    has_rsample = False

    def __init__(self, loc: Tensor | float, concentration: Tensor | float, validate_args: bool | None = None) -> None:
        self.loc, self.concentration = broadcast_all(loc, concentration)
        super().__init__(self.loc.shape, Size(), validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> VonMises:
        new = self._get_checked_instance(VonMises, _instance)
        batch_shape = Size(batch_shape)
        new.loc = self.loc.expand(batch_shape)
        new.concentration = self.concentration.expand(batch_shape)
        super(VonMises, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        k = self.concentration
        return k * kiln.cos(value - self.loc) - math.log(2 * math.pi) - _log_i0(k)

    @lazy_property
    def _proposal_r(self) -> Tensor:
        """The parameter of Best and Fisher's wrapped-Cauchy proposal, in float64."""
        kappa = self.concentration.to(kiln.float64)
        tau = 1 + (1 + 4 * kappa**2).sqrt()
        rho = (tau - (2 * tau).sqrt()) / (2 * kappa)
        return kiln.where(kappa < 1e-5, 1 / kappa + kappa, (1 + rho**2) / (2 * rho))

    def sample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        """Draws by Best and Fisher's rejection sampler (Applied Statistics, 1979), in float64 (in lower
        precision a small concentration could reject for a very long time), returned in ``loc``'s dtype."""
        with kiln.no_grad():
            shape = self._extended_shape(sample_shape)
            loc = self.loc.to(kiln.float64)
            kappa = self.concentration.to(kiln.float64)
            r = self._proposal_r.detach()
            x = kiln.zeros(shape, dtype=kiln.float64, device=loc.device)
            done = kiln.zeros(shape, dtype=kiln.bool, device=loc.device)
            while not bool(done.all()):
                u1, u2, u3 = kiln.rand((3,) + tuple(shape), dtype=kiln.float64, device=loc.device).unbind()
                z = kiln.cos(math.pi * u1)
                f = (1 + r * z) / (r + z)
                c = kappa * (r - f)
                accept = ((c * (2 - c) - u2) > 0) | ((c / u2).log() + 1 - c >= 0)
                x = kiln.where(accept & ~done, (u3 - 0.5).sign() * f.acos(), x)
                done = done | accept
            return ((x + math.pi + loc) % (2 * math.pi) - math.pi).to(self.loc.dtype)

    @property
    def mean(self) -> Tensor:
        """The circular mean: ``loc``."""
        return self.loc

    @property
    def mode(self) -> Tensor:
        return self.loc

    @lazy_property
    def variance(self) -> Tensor:  # type: ignore[override]
        """The circular variance ``1 - I_1(kappa) / I_0(kappa)``."""
        k = self.concentration
        return 1 - (_log_i1(k) - _log_i0(k)).exp()

"""The chi-squared distribution (``torch.distributions.chi2``)."""

from __future__ import annotations

from collections.abc import Sequence

from kiln._tensor import Tensor
from kiln.distributions import constraints
from kiln.distributions.gamma import Gamma

__all__ = ["Chi2"]


class Chi2(Gamma):
    """The chi-squared distribution with ``df`` degrees of freedom: exactly ``Gamma(0.5 * df, 0.5)``.

    >>> kiln.distributions.Chi2(2.0).log_prob(kiln.tensor(2.0))
    tensor(-1.6931)
    """

    arg_constraints = {"df": constraints.positive}

    def __init__(self, df: Tensor | float, validate_args: bool | None = None) -> None:
        super().__init__(0.5 * df, 0.5, validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> Chi2:
        new = self._get_checked_instance(Chi2, _instance)
        return super().expand(batch_shape, new)

    @property
    def df(self) -> Tensor:
        """The degrees of freedom."""
        return self.concentration * 2

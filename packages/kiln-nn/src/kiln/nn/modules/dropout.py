"""Dropout layers: ``Dropout``, ``Dropout1d/2d/3d``, ``AlphaDropout``, ``FeatureAlphaDropout``."""

from __future__ import annotations

from kiln import Tensor
from kiln.nn import functional as F
from kiln.nn.modules.module import Module

__all__ = ["Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout"]


class _DropoutNd(Module):
    __constants__ = ["p", "inplace"]
    _fn = None

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def extra_repr(self) -> str:
        """``p=..., inplace=...``."""
        return f"p={self.p}, inplace={self.inplace}"

    def forward(self, input: Tensor) -> Tensor:
        """``input`` with elements (or channels) zeroed with probability ``p`` in training mode; unchanged in eval."""
        return type(self)._fn(input, self.p, self.training, self.inplace)


class Dropout(_DropoutNd):
    """Zero each element with probability ``p`` and scale the rest by ``1/(1-p)`` (``torch.nn.Dropout``)."""

    _fn = staticmethod(F.dropout)


class Dropout1d(_DropoutNd):
    """Zero whole channels of ``(N, C, L)`` or ``(C, L)`` input (``torch.nn.Dropout1d``)."""

    _fn = staticmethod(F.dropout1d)


class Dropout2d(_DropoutNd):
    """Zero whole channels of ``(N, C, H, W)`` or ``(C, H, W)`` input (``torch.nn.Dropout2d``)."""

    _fn = staticmethod(F.dropout2d)


class Dropout3d(_DropoutNd):
    """Zero whole channels of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input (``torch.nn.Dropout3d``)."""

    _fn = staticmethod(F.dropout3d)


class AlphaDropout(_DropoutNd):
    """Dropout that keeps SELU's zero mean and unit variance (``torch.nn.AlphaDropout``)."""

    _fn = staticmethod(F.alpha_dropout)


class FeatureAlphaDropout(_DropoutNd):
    """Channel-wise alpha dropout (``torch.nn.FeatureAlphaDropout``)."""

    _fn = staticmethod(F.feature_alpha_dropout)

"""Padding layers (``torch.nn.*Pad1d/2d/3d``): constant, zero, reflection, replication and circular."""

from __future__ import annotations

from kiln import Tensor
from kiln.nn import functional as F
from kiln.nn.modules._utils import _check_input_dims, _ntuple
from kiln.nn.modules.module import Module

__all__ = [
    "CircularPad1d",
    "CircularPad2d",
    "CircularPad3d",
    "ConstantPad1d",
    "ConstantPad2d",
    "ConstantPad3d",
    "ReflectionPad1d",
    "ReflectionPad2d",
    "ReflectionPad3d",
    "ReplicationPad1d",
    "ReplicationPad2d",
    "ReplicationPad3d",
    "ZeroPad1d",
    "ZeroPad2d",
    "ZeroPad3d",
]


class _PadNd(Module):
    """Pads the last ``_nd`` dims by ``padding`` (an int, or ``2*_nd`` ints, last dim first)."""

    __constants__ = ["padding"]
    _nd = 0
    _mode = ""

    def __init__(self, padding) -> None:
        super().__init__()
        self.padding = _ntuple(2 * self._nd)(padding)

    def _check_input_dim(self, input: Tensor) -> None:
        """Circular padding checks the rank first (torch does so only for this mode)."""

    def forward(self, input: Tensor) -> Tensor:
        """The padded input."""
        self._check_input_dim(input)
        return F.pad(input, self.padding, self._mode)

    def extra_repr(self) -> str:
        """The padding tuple."""
        return f"{self.padding}"


class _CircularPadNd(_PadNd):
    _mode = "circular"

    def _check_input_dim(self, input: Tensor) -> None:
        _check_input_dims(input, (self._nd + 1, self._nd + 2))


class CircularPad1d(_CircularPadNd):
    """Wrap-around padding of ``(N, C, W)`` or ``(C, W)`` (``torch.nn.CircularPad1d``)."""

    _nd = 1


class CircularPad2d(_CircularPadNd):
    """Wrap-around padding of ``(N, C, H, W)`` or ``(C, H, W)`` (``torch.nn.CircularPad2d``)."""

    _nd = 2


class CircularPad3d(_CircularPadNd):
    """Wrap-around padding of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` (``torch.nn.CircularPad3d``)."""

    _nd = 3


class _ReflectionPadNd(_PadNd):
    _mode = "reflect"


class ReflectionPad1d(_ReflectionPadNd):
    """Mirror padding (edge not repeated) of the last dim (``torch.nn.ReflectionPad1d``)."""

    _nd = 1


class ReflectionPad2d(_ReflectionPadNd):
    """Mirror padding of the last two dims (``torch.nn.ReflectionPad2d``)."""

    _nd = 2


class ReflectionPad3d(_ReflectionPadNd):
    """Mirror padding of the last three dims (``torch.nn.ReflectionPad3d``)."""

    _nd = 3


class _ReplicationPadNd(_PadNd):
    _mode = "replicate"


class ReplicationPad1d(_ReplicationPadNd):
    """Edge-repeating padding of the last dim (``torch.nn.ReplicationPad1d``)."""

    _nd = 1


class ReplicationPad2d(_ReplicationPadNd):
    """Edge-repeating padding of the last two dims (``torch.nn.ReplicationPad2d``)."""

    _nd = 2


class ReplicationPad3d(_ReplicationPadNd):
    """Edge-repeating padding of the last three dims (``torch.nn.ReplicationPad3d``)."""

    _nd = 3


class _ConstantPadNd(Module):
    __constants__ = ["padding", "value"]
    _nd = 0

    def __init__(self, padding, value: float) -> None:
        super().__init__()
        self.value = value
        self.padding = _ntuple(2 * self._nd)(padding)

    def forward(self, input: Tensor) -> Tensor:
        """The input padded with ``value`` (negative padding crops)."""
        return F.pad(input, self.padding, "constant", self.value)

    def extra_repr(self) -> str:
        """``padding=..., value=...``."""
        return f"padding={self.padding}, value={self.value}"


class ConstantPad1d(_ConstantPadNd):
    """Pad the last dim with ``value`` (``torch.nn.ConstantPad1d``)."""

    _nd = 1


class ConstantPad2d(_ConstantPadNd):
    """Pad the last two dims with ``value`` (``torch.nn.ConstantPad2d``)."""

    _nd = 2


class ConstantPad3d(_ConstantPadNd):
    """Pad the last three dims with ``value`` (``torch.nn.ConstantPad3d``)."""

    _nd = 3


class _ZeroPadNd:
    """``ConstantPad{1,2,3}d`` with ``value=0``, shown by its padding alone."""

    def __init__(self, padding) -> None:
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        """The padding tuple."""
        return f"{self.padding}"


class ZeroPad1d(_ZeroPadNd, ConstantPad1d):
    """Pad the last dim with zeros (``torch.nn.ZeroPad1d``)."""


class ZeroPad2d(_ZeroPadNd, ConstantPad2d):
    """Pad the last two dims with zeros (``torch.nn.ZeroPad2d``)."""


class ZeroPad3d(_ZeroPadNd, ConstantPad3d):
    """Pad the last three dims with zeros (``torch.nn.ZeroPad3d``)."""

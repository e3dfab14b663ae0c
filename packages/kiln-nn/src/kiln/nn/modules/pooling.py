"""Pooling layers: ``MaxPool1d/2d/3d``, ``AvgPool1d/2d``, ``AdaptiveAvgPool1d/2d``, ``AdaptiveMaxPool1d/2d``."""

from __future__ import annotations

import math

import kiln
from kiln import Tensor, zeros
from kiln.nn import functional as F
from kiln.nn.modules._utils import _pair, _single
from kiln.nn.modules.module import Module

__all__ = [
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "LPPool1d",
    "LPPool2d",
    "MaxUnpool1d",
    "MaxUnpool2d",
]


class _MaxPoolNd(Module):
    __constants__ = ["kernel_size", "stride", "padding", "dilation", "return_indices", "ceil_mode"]
    _fn = None

    def __init__(
        self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False, ceil_mode: bool = False
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.return_indices = return_indices
        self.ceil_mode = ceil_mode

    def extra_repr(self) -> str:
        """``kernel_size=..., stride=..., padding=..., dilation=..., ceil_mode=...``."""
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
            f", dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )

    def forward(self, input: Tensor):
        """The pooled input (and the argmax indices when ``return_indices``)."""
        return type(self)._fn(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.dilation,
            ceil_mode=self.ceil_mode,
            return_indices=self.return_indices,
        )


class MaxPool1d(_MaxPoolNd):
    """1-d max pooling over ``(N, C, L)`` or ``(C, L)`` (``torch.nn.MaxPool1d``)."""

    _fn = staticmethod(F.max_pool1d)


class MaxPool2d(_MaxPoolNd):
    """2-d max pooling over ``(N, C, H, W)`` or ``(C, H, W)`` (``torch.nn.MaxPool2d``)."""

    _fn = staticmethod(F.max_pool2d)


class MaxPool3d(_MaxPoolNd):
    """3-d max pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)`` (``torch.nn.MaxPool3d``)."""

    _fn = staticmethod(F.max_pool3d)


class _AvgPoolNd(Module):
    """What average pooling of every rank shares: its repr."""

    def extra_repr(self) -> str:
        """``kernel_size=..., stride=..., padding=...``."""
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool1d(_AvgPoolNd):
    """1-d average pooling over ``(N, C, L)`` or ``(C, L)`` (``torch.nn.AvgPool1d``)."""

    __constants__ = ["kernel_size", "stride", "padding", "ceil_mode", "count_include_pad"]

    def __init__(
        self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True
    ) -> None:
        super().__init__()
        self.kernel_size = _single(kernel_size)
        self.stride = _single(stride if stride is not None else kernel_size)
        self.padding = _single(padding)
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad

    def forward(self, input: Tensor) -> Tensor:
        """The window means of ``input``."""
        return F.avg_pool1d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)


class AvgPool2d(_AvgPoolNd):
    """2-d average pooling over ``(N, C, H, W)`` or ``(C, H, W)`` (``torch.nn.AvgPool2d``)."""

    __constants__ = ["kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"]

    def __init__(
        self,
        kernel_size,
        stride=None,
        padding=0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input: Tensor) -> Tensor:
        """The window means of ``input`` (divided by ``divisor_override`` when set)."""
        return F.avg_pool2d(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )


class _AdaptivePoolNd(Module):
    __constants__ = ["output_size"]

    def __init__(self, output_size) -> None:
        super().__init__()
        self.output_size = output_size

    def extra_repr(self) -> str:
        """``output_size=...``."""
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_AdaptivePoolNd):
    """Average pooling of ``(N, C, L)`` to length ``output_size`` (``torch.nn.AdaptiveAvgPool1d``)."""

    def forward(self, input: Tensor) -> Tensor:
        """The adaptively pooled input."""
        return F.adaptive_avg_pool1d(input, self.output_size)


class AdaptiveAvgPool2d(_AdaptivePoolNd):
    """Average pooling of ``(N, C, H, W)`` to ``output_size`` (``torch.nn.AdaptiveAvgPool2d``)."""

    def forward(self, input: Tensor) -> Tensor:
        """The adaptively pooled input."""
        return F.adaptive_avg_pool2d(input, self.output_size)


class _AdaptiveMaxPoolNd(_AdaptivePoolNd):
    __constants__ = ["output_size", "return_indices"]

    def __init__(self, output_size, return_indices: bool = False) -> None:
        super().__init__(output_size)
        self.return_indices = return_indices


class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    """Max pooling of ``(N, C, L)`` to length ``output_size`` (``torch.nn.AdaptiveMaxPool1d``)."""

    def forward(self, input: Tensor):
        """The adaptively pooled input (and indices when ``return_indices``)."""
        return F.adaptive_max_pool1d(input, self.output_size, self.return_indices)


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    """Max pooling of ``(N, C, H, W)`` to ``output_size`` (``torch.nn.AdaptiveMaxPool2d``)."""

    def forward(self, input: Tensor):
        """The adaptively pooled input (and indices when ``return_indices``)."""
        return F.adaptive_max_pool2d(input, self.output_size, self.return_indices)


class _LPPoolNd(Module):
    """Power-average pooling ``(Σ x^p)^(1/p)`` over windows, composed from average pooling as torch does."""

    __constants__ = ["norm_type", "kernel_size", "stride", "ceil_mode"]
    _nd = 0

    def __init__(self, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False) -> None:
        super().__init__()
        self.norm_type = norm_type
        self.kernel_size = kernel_size
        self.stride = stride
        self.ceil_mode = ceil_mode

    def extra_repr(self) -> str:
        """``norm_type=..., kernel_size=..., stride=..., ceil_mode=...``."""
        return (
            f"norm_type={self.norm_type}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"ceil_mode={self.ceil_mode}"
        )

    def forward(self, input: Tensor) -> Tensor:
        """The p-norm of every window."""
        p = float(self.norm_type)
        one = self._nd == 1
        max_pool, avg_pool = (F.max_pool1d, F.avg_pool1d) if one else (F.max_pool2d, F.avg_pool2d)
        if p == math.inf:
            return max_pool(input.abs(), self.kernel_size, self.stride, 0, 1, self.ceil_mode)
        if p == -math.inf:
            return -max_pool(-input.abs(), self.kernel_size, self.stride, 0, 1, self.ceil_mode)
        stride = self.stride if self.stride is not None else self.kernel_size
        out = avg_pool(input.pow(p), self.kernel_size, stride, 0, self.ceil_mode)
        window = _single(self.kernel_size)[0] if one else math.prod(_pair(self.kernel_size))
        return (kiln.sign(out) * F.relu(out.abs())).mul(window).pow(1.0 / p)


class LPPool1d(_LPPoolNd):
    """1-d power-average pooling (``torch.nn.LPPool1d``)."""

    _nd = 1


class LPPool2d(_LPPoolNd):
    """2-d power-average pooling (``torch.nn.LPPool2d``)."""

    _nd = 2


class _MaxUnpoolNd(Module):
    """Place pooled values back at their argmax ``indices`` in a zero tensor (the inverse of max pooling).

    Composed from ``scatter`` because the core has no ``max_unpool`` op.
    """

    _nd = 0

    def __init__(self, kernel_size, stride=None, padding=0) -> None:
        super().__init__()
        tup = _single if self._nd == 1 else _pair
        self.kernel_size = tup(kernel_size)
        self.stride = tup(stride if stride is not None else kernel_size)
        self.padding = tup(padding)

    def extra_repr(self) -> str:
        """``kernel_size=..., stride=..., padding=...``."""
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"

    def _output_size(self, input: Tensor, output_size) -> list[int]:
        nd = self._nd
        default = [
            (input.shape[-nd + d] - 1) * self.stride[d] + self.kernel_size[d] - 2 * self.padding[d] for d in range(nd)
        ]
        if output_size is None:
            return default
        output_size = list(output_size)
        if len(output_size) == nd + 2:
            output_size = output_size[2:]
        if len(output_size) != nd:
            raise ValueError(
                f"output_size should be a sequence containing {nd} or {nd + 2} elements, but it has a length of "
                f"'{len(output_size)}'"
            )
        for d in range(nd):
            lo, hi = default[d] - self.stride[d], default[d] + self.stride[d]
            if not (lo < output_size[d] < hi):
                raise ValueError(f'invalid output_size "{output_size}" (dim {d} must be between {lo} and {hi})')
        return output_size

    def forward(self, input: Tensor, indices: Tensor, output_size=None) -> Tensor:
        """A zero tensor of the unpooled size holding ``input`` at ``indices`` (per channel, flattened)."""
        nd = self._nd
        if tuple(indices.shape) != tuple(input.shape):
            raise RuntimeError(
                f"Expected shape of indices to be same as that of the input tensor ({list(input.shape)}) but got "
                f"indices tensor with shape: {list(indices.shape)}"
            )
        size = self._output_size(input, output_size)
        lead = tuple(input.shape[:-nd])
        flat_in = input.reshape(*lead, -1)
        out = zeros((*lead, math.prod(size)), dtype=input.dtype, device=input.device)
        return out.scatter(-1, indices.reshape(*lead, -1), flat_in).reshape(*lead, *size)


class MaxUnpool1d(_MaxUnpoolNd):
    """Partial inverse of :class:`MaxPool1d` (``torch.nn.MaxUnpool1d``)."""

    _nd = 1


class MaxUnpool2d(_MaxUnpoolNd):
    """Partial inverse of :class:`MaxPool2d` (``torch.nn.MaxUnpool2d``)."""

    _nd = 2

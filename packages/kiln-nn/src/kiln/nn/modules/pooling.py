"""Pooling layers: ``MaxPool1d/2d/3d``, ``AvgPool1d/2d/3d``, ``AdaptiveAvgPool1d/2d/3d``,
``AdaptiveMaxPool1d/2d/3d``, ``LPPool1d/2d/3d``, ``MaxUnpool1d/2d/3d``, ``FractionalMaxPool2d/3d``."""

from __future__ import annotations

from kiln import Tensor
from kiln.nn import functional as F
from kiln.nn.modules._utils import _pair, _single, _triple
from kiln.nn.modules.module import Module

__all__ = [
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "LPPool1d",
    "LPPool2d",
    "LPPool3d",
    "MaxUnpool1d",
    "MaxUnpool2d",
    "MaxUnpool3d",
    "FractionalMaxPool2d",
    "FractionalMaxPool3d",
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


class _AvgPoolWithDivisor(_AvgPoolNd):
    """2-d and 3-d average pooling: ``divisor_override`` beside 1-d's arguments."""

    __constants__ = ["kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"]
    _fn = None

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
        return type(self)._fn(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )


class AvgPool2d(_AvgPoolWithDivisor):
    """2-d average pooling over ``(N, C, H, W)`` or ``(C, H, W)`` (``torch.nn.AvgPool2d``)."""

    _fn = staticmethod(F.avg_pool2d)


class AvgPool3d(_AvgPoolWithDivisor):
    """3-d average pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)`` (``torch.nn.AvgPool3d``)."""

    _fn = staticmethod(F.avg_pool3d)


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


class AdaptiveAvgPool3d(_AdaptivePoolNd):
    """Average pooling of ``(N, C, D, H, W)`` to ``output_size`` (``torch.nn.AdaptiveAvgPool3d``)."""

    def forward(self, input: Tensor) -> Tensor:
        """The adaptively pooled input."""
        return F.adaptive_avg_pool3d(input, self.output_size)


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


class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd):
    """Max pooling of ``(N, C, D, H, W)`` to ``output_size`` (``torch.nn.AdaptiveMaxPool3d``)."""

    def forward(self, input: Tensor):
        """The adaptively pooled input (and indices when ``return_indices``)."""
        return F.adaptive_max_pool3d(input, self.output_size, self.return_indices)


class _LPPoolNd(Module):
    """Power-average pooling ``(Σ x^p)^(1/p)`` over windows (``F.lp_pool1d/2d/3d``)."""

    __constants__ = ["norm_type", "kernel_size", "stride", "ceil_mode"]
    _fn = None

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
        return type(self)._fn(input, float(self.norm_type), self.kernel_size, self.stride, self.ceil_mode)


class LPPool1d(_LPPoolNd):
    """1-d power-average pooling (``torch.nn.LPPool1d``)."""

    _fn = staticmethod(F.lp_pool1d)


class LPPool2d(_LPPoolNd):
    """2-d power-average pooling (``torch.nn.LPPool2d``)."""

    _fn = staticmethod(F.lp_pool2d)


class LPPool3d(_LPPoolNd):
    """3-d power-average pooling (``torch.nn.LPPool3d``)."""

    _fn = staticmethod(F.lp_pool3d)


class _MaxUnpoolNd(Module):
    """Place pooled values back at their argmax ``indices`` in a zero tensor (the inverse of max pooling)."""

    _tuple = None
    _fn = None

    def __init__(self, kernel_size, stride=None, padding=0) -> None:
        super().__init__()
        tup = type(self)._tuple
        self.kernel_size = tup(kernel_size)
        self.stride = tup(stride if stride is not None else kernel_size)
        self.padding = tup(padding)

    def extra_repr(self) -> str:
        """``kernel_size=..., stride=..., padding=...``."""
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"

    def forward(self, input: Tensor, indices: Tensor, output_size=None) -> Tensor:
        """A zero tensor of the unpooled size holding ``input`` at ``indices`` (flat in each plane)."""
        return type(self)._fn(input, indices, self.kernel_size, self.stride, self.padding, output_size)


class MaxUnpool1d(_MaxUnpoolNd):
    """Partial inverse of :class:`MaxPool1d` (``torch.nn.MaxUnpool1d``)."""

    _tuple = staticmethod(_single)
    _fn = staticmethod(F.max_unpool1d)


class MaxUnpool2d(_MaxUnpoolNd):
    """Partial inverse of :class:`MaxPool2d` (``torch.nn.MaxUnpool2d``)."""

    _tuple = staticmethod(_pair)
    _fn = staticmethod(F.max_unpool2d)


class MaxUnpool3d(_MaxUnpoolNd):
    """Partial inverse of :class:`MaxPool3d` (``torch.nn.MaxUnpool3d``)."""

    _tuple = staticmethod(_triple)
    _fn = staticmethod(F.max_unpool3d)


class _FractionalMaxPoolNd(Module):
    """Fractional max pooling: ``output_size`` or ``output_ratio`` (in (0, 1)), optional fixed
    ``_random_samples`` (a buffer, ``None`` unless given)."""

    __constants__ = ["kernel_size", "return_indices", "output_size", "output_ratio"]
    _tuple = None
    _fn = None

    def __init__(
        self, kernel_size, output_size=None, output_ratio=None, return_indices: bool = False, _random_samples=None
    ) -> None:
        super().__init__()
        name = type(self).__name__
        tup = type(self)._tuple
        self.kernel_size = tup(kernel_size)
        self.return_indices = return_indices
        self.register_buffer("_random_samples", _random_samples)
        self.output_size = tup(output_size) if output_size is not None else None
        self.output_ratio = tup(output_ratio) if output_ratio is not None else None
        if output_size is None and output_ratio is None:
            raise ValueError(f"{name} requires specifying either an output size, or a pooling ratio")
        if output_size is not None and output_ratio is not None:
            raise ValueError("only one of output_size and output_ratio may be specified")
        if self.output_ratio is not None and not all(0 < r < 1 for r in self.output_ratio):
            raise ValueError(f"output_ratio must be between 0 and 1 (got {output_ratio})")

    def forward(self, input: Tensor):
        """The pooled input (and the argmax indices when ``return_indices``)."""
        return type(self)._fn(
            input,
            self.kernel_size,
            self.output_size,
            self.output_ratio,
            self.return_indices,
            _random_samples=self._random_samples,
        )


class FractionalMaxPool2d(_FractionalMaxPoolNd):
    """2-d fractional max pooling over ``(N, C, H, W)`` or ``(C, H, W)`` (``torch.nn.FractionalMaxPool2d``)."""

    _tuple = staticmethod(_pair)
    _fn = staticmethod(F.fractional_max_pool2d)


class FractionalMaxPool3d(_FractionalMaxPoolNd):
    """3-d fractional max pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)`` (``torch.nn.FractionalMaxPool3d``)."""

    _tuple = staticmethod(_triple)
    _fn = staticmethod(F.fractional_max_pool3d)

"""Convolution layers: ``Conv1d/2d/3d`` and ``ConvTranspose1d/2d/3d`` (``torch.nn.Conv*``)."""

from __future__ import annotations

import math

from kiln import Tensor, empty
from kiln.nn import functional as F
from kiln.nn import init
from kiln.nn.modules._lazy import _LazyModuleMixin
from kiln.nn.modules._utils import _optional_parameter, _pair, _reverse_repeat_tuple, _single, _triple
from kiln.nn.modules.module import Module
from kiln.nn.parameter import Parameter, UninitializedParameter

__all__ = [
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "LazyConv1d",
    "LazyConv2d",
    "LazyConv3d",
    "LazyConvTranspose1d",
    "LazyConvTranspose2d",
    "LazyConvTranspose3d",
]

_VALID_PADDING_STRINGS = {"same", "valid"}
_VALID_PADDING_MODES = {"zeros", "reflect", "replicate", "circular"}


def _weight_shape(in_channels, out_channels, groups, kernel_size, transposed) -> tuple:
    """``(out, in/groups, *kernel)``, or ``(in, out/groups, *kernel)`` for a transposed convolution."""
    if transposed:
        return (in_channels, out_channels // groups, *kernel_size)
    return (out_channels, in_channels // groups, *kernel_size)


class _ConvNd(Module):
    """State and initialisation shared by every convolution layer."""

    __constants__ = [
        "stride",
        "padding",
        "dilation",
        "groups",
        "padding_mode",
        "output_padding",
        "in_channels",
        "out_channels",
        "kernel_size",
    ]

    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride,
        padding,
        dilation,
        transposed,
        output_padding,
        groups,
        bias,
        padding_mode,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        if isinstance(padding, str):
            if padding not in _VALID_PADDING_STRINGS:
                raise ValueError(f"Invalid padding string {padding!r}, should be one of {_VALID_PADDING_STRINGS}")
            if padding == "same" and any(s != 1 for s in stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
        if padding_mode not in _VALID_PADDING_MODES:
            raise ValueError(
                f"padding_mode must be one of {_VALID_PADDING_MODES}, but got padding_mode='{padding_mode}'"
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.transposed = transposed
        self.output_padding = output_padding
        self.groups = groups
        self.padding_mode = padding_mode
        # F.pad order (last dim first, each side once) of the padding non-'zeros' modes apply before the conv
        if isinstance(self.padding, str):
            rev = [0, 0] * len(kernel_size)
            if padding == "same":
                for d, k, i in zip(dilation, kernel_size, range(len(kernel_size) - 1, -1, -1)):
                    total = d * (k - 1)
                    left = total // 2
                    rev[2 * i] = left
                    rev[2 * i + 1] = total - left
            self._reversed_padding_repeated_twice = rev
        else:
            self._reversed_padding_repeated_twice = list(_reverse_repeat_tuple(self.padding, 2))
        shape = _weight_shape(in_channels, out_channels, groups, kernel_size, transposed)
        self.weight = Parameter(empty(shape, device=device, dtype=dtype))
        _optional_parameter(self, "bias", bias, out_channels, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Kaiming-uniform ``weight`` (``a=sqrt(5)``) and ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` ``bias``."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        """Channels, kernel and stride, then every setting that differs from its default."""
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * len(self.padding):
            s += f", padding={self.padding}"
        if self.dilation != (1,) * len(self.dilation):
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * len(self.output_padding):
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s

    def __setstate__(self, state):
        super().__setstate__(state)
        if not hasattr(self, "padding_mode"):
            self.padding_mode = "zeros"


def _make_tuple(nd: int):
    return {1: _single, 2: _pair, 3: _triple}[nd]


class _ConvForward(_ConvNd):
    _nd = 0
    _fn = None

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device=None,
        dtype=None,
    ) -> None:
        tup = _make_tuple(self._nd)
        super().__init__(
            in_channels,
            out_channels,
            tup(kernel_size),
            tup(stride),
            padding if isinstance(padding, str) else tup(padding),
            tup(dilation),
            False,
            tup(0),
            groups,
            bias,
            padding_mode,
            device,
            dtype,
        )

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        fn = type(self)._fn
        if self.padding_mode != "zeros":
            padded = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return fn(padded, weight, bias, self.stride, _make_tuple(self._nd)(0), self.dilation, self.groups)
        return fn(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, input: Tensor) -> Tensor:
        """Convolve ``input`` (batched ``(N, C_in, *spatial)`` or unbatched ``(C_in, *spatial)``)."""
        return self._conv_forward(input, self.weight, self.bias)


class Conv1d(_ConvForward):
    """1-d convolution over ``(N, C_in, L)`` (``torch.nn.Conv1d``); ``padding`` may be ``'same'``/``'valid'``."""

    _nd = 1
    _fn = staticmethod(F.conv1d)


class Conv2d(_ConvForward):
    """2-d convolution over ``(N, C_in, H, W)`` (``torch.nn.Conv2d``); ``padding`` may be ``'same'``/``'valid'``."""

    _nd = 2
    _fn = staticmethod(F.conv2d)


class Conv3d(_ConvForward):
    """3-d convolution over ``(N, C_in, D, H, W)`` (``torch.nn.Conv3d``)."""

    _nd = 3
    _fn = staticmethod(F.conv3d)


class _ConvTransposeNd(_ConvNd):
    _nd = 0
    _fn = None

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        output_padding=0,
        groups: int = 1,
        bias: bool = True,
        dilation=1,
        padding_mode: str = "zeros",
        device=None,
        dtype=None,
    ) -> None:
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for {self.__class__.__name__}')
        tup = _make_tuple(self._nd)
        super().__init__(
            in_channels,
            out_channels,
            tup(kernel_size),
            tup(stride),
            tup(padding),
            tup(dilation),
            True,
            tup(output_padding),
            groups,
            bias,
            padding_mode,
            device,
            dtype,
        )

    def _output_padding(self, input, output_size, stride, padding, kernel_size, num_spatial_dims, dilation=None):
        if output_size is None:
            return tuple(self.output_padding)
        has_batch_dim = input.dim() == num_spatial_dims + 2
        num_non_spatial_dims = 2 if has_batch_dim else 1
        output_size = list(output_size)
        if len(output_size) == num_non_spatial_dims + num_spatial_dims:
            output_size = output_size[num_non_spatial_dims:]
        if len(output_size) != num_spatial_dims:
            raise ValueError(
                f"ConvTranspose{num_spatial_dims}D: for {input.dim()}D input, output_size must have "
                f"{num_spatial_dims} or {num_non_spatial_dims + num_spatial_dims} elements (got {len(output_size)})"
            )
        min_sizes, max_sizes = [], []
        for d in range(num_spatial_dims):
            dim_size = (
                (input.size(d + num_non_spatial_dims) - 1) * stride[d]
                - 2 * padding[d]
                + (dilation[d] if dilation is not None else 1) * (kernel_size[d] - 1)
                + 1
            )
            min_sizes.append(dim_size)
            max_sizes.append(dim_size + stride[d] - 1)
        for size, lo, hi in zip(output_size, min_sizes, max_sizes):
            if size < lo or size > hi:
                raise ValueError(
                    f"requested an output size of {output_size}, but valid sizes range "
                    f"from {min_sizes} to {max_sizes} (for an input of {input.size()[2:]})"
                )
        return tuple(output_size[d] - min_sizes[d] for d in range(num_spatial_dims))

    def forward(self, input: Tensor, output_size=None) -> Tensor:
        """Transposed convolution; ``output_size`` picks ``output_padding`` to hit that spatial size."""
        output_padding = self._output_padding(
            input, output_size, self.stride, self.padding, self.kernel_size, self._nd, self.dilation
        )
        return type(self)._fn(
            input, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups, self.dilation
        )


class ConvTranspose1d(_ConvTransposeNd):
    """1-d transposed convolution (``torch.nn.ConvTranspose1d``); ``weight`` is ``(C_in, C_out/groups, k)``."""

    _nd = 1
    _fn = staticmethod(F.conv_transpose1d)


class ConvTranspose2d(_ConvTransposeNd):
    """2-d transposed convolution (``torch.nn.ConvTranspose2d``); ``weight`` is ``(C_in, C_out/groups, kh, kw)``."""

    _nd = 2
    _fn = staticmethod(F.conv_transpose2d)


class ConvTranspose3d(_ConvTransposeNd):
    """3-d transposed convolution (``torch.nn.ConvTranspose3d``)."""

    _nd = 3
    _fn = staticmethod(F.conv_transpose3d)


# ---------------------------------------------------------------------------------------- lazy variants


class _LazyConvMixin(_LazyModuleMixin):
    """``in_channels`` inferred from the first input; the module then becomes ``cls_to_become``.

    Until the first call (or a ``load_state_dict``), ``weight`` and ``bias`` are
    :class:`~kiln.nn.UninitializedParameter` and ``in_channels`` is 0, as in torch.
    """

    _in_attr = "in_channels"

    def _lazy_setup(self, out_channels: int, bias: bool, device, dtype) -> None:
        self.weight = UninitializedParameter()
        self.out_channels = out_channels
        if bias:
            self.bias = UninitializedParameter()
        self._factory = {"device": device, "dtype": dtype}  # the hook: LazyModuleMixin.__init__ registered it

    def _get_in_channels(self, input: Tensor) -> int:
        nd = self._nd
        if input.dim() not in (nd + 1, nd + 2):
            raise RuntimeError(
                f"Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to {self.__class__.__name__}, "
                f"but got input of size: {input.shape}"
            )
        return input.shape[1] if input.dim() == nd + 2 else input.shape[0]

    def initialize_parameters(self, input: Tensor, *args, **kwargs) -> None:
        """Materialise ``weight``/``bias`` for ``input``'s channel count, then initialise them."""
        if not self.has_uninitialized_params():
            self.in_channels = self.weight.shape[0 if self.transposed else 1] * (1 if self.transposed else self.groups)
            return
        from kiln.autograd.grad_mode import no_grad

        with no_grad():
            self.in_channels = self._get_in_channels(input)
            if self.in_channels % self.groups != 0:
                raise ValueError("in_channels must be divisible by groups")
            shape = _weight_shape(self.in_channels, self.out_channels, self.groups, self.kernel_size, self.transposed)
            dev = self._factory["device"] or input.device
            self.weight.materialize(shape, device=dev, dtype=self._factory["dtype"])
            if self.bias is not None:
                self.bias.materialize((self.out_channels,), device=dev, dtype=self._factory["dtype"])
            self.reset_parameters()


class _LazyConvForward(_LazyConvMixin):
    def __init__(
        self,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device=None,
        dtype=None,
    ) -> None:
        # bias=False here: the eager constructor must not allocate a real bias; _lazy_setup adds a lazy one
        super().__init__(0, 0, kernel_size, stride, padding, dilation, groups, False, padding_mode, device, dtype)
        self._lazy_setup(out_channels, bias, device, dtype)


class _LazyConvTransposeForward(_LazyConvMixin):
    def __init__(
        self,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        output_padding=0,
        groups: int = 1,
        bias: bool = True,
        dilation=1,
        padding_mode: str = "zeros",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(
            0, 0, kernel_size, stride, padding, output_padding, groups, False, dilation, padding_mode, device, dtype
        )
        self._lazy_setup(out_channels, bias, device, dtype)


class LazyConv1d(_LazyConvForward, Conv1d):
    """A :class:`Conv1d` whose ``in_channels`` is inferred from the first input (``torch.nn.LazyConv1d``)."""

    cls_to_become = Conv1d


class LazyConv2d(_LazyConvForward, Conv2d):
    """A :class:`Conv2d` whose ``in_channels`` is inferred from the first input (``torch.nn.LazyConv2d``)."""

    cls_to_become = Conv2d


class LazyConv3d(_LazyConvForward, Conv3d):
    """A :class:`Conv3d` whose ``in_channels`` is inferred from the first input (``torch.nn.LazyConv3d``)."""

    cls_to_become = Conv3d


class LazyConvTranspose1d(_LazyConvTransposeForward, ConvTranspose1d):
    """A :class:`ConvTranspose1d` with ``in_channels`` inferred (``torch.nn.LazyConvTranspose1d``)."""

    cls_to_become = ConvTranspose1d


class LazyConvTranspose2d(_LazyConvTransposeForward, ConvTranspose2d):
    """A :class:`ConvTranspose2d` with ``in_channels`` inferred (``torch.nn.LazyConvTranspose2d``)."""

    cls_to_become = ConvTranspose2d


class LazyConvTranspose3d(_LazyConvTransposeForward, ConvTranspose3d):
    """A :class:`ConvTranspose3d` with ``in_channels`` inferred (``torch.nn.LazyConvTranspose3d``)."""

    cls_to_become = ConvTranspose3d

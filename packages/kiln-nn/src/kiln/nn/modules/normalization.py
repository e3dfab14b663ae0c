"""Normalisation layers: ``BatchNorm1d/2d/3d``, ``InstanceNorm1d/2d/3d`` and their lazy forms, ``LayerNorm``,
``GroupNorm``, ``RMSNorm``, ``LocalResponseNorm``, ``CrossMapLRN2d``.

:mod:`kiln.nn.modules.batchnorm` and :mod:`kiln.nn.modules.instancenorm` name them under PyTorch's paths."""

from __future__ import annotations

import numbers
import warnings

import kiln
from kiln import Tensor, ones, zeros
from kiln.nn import functional as F
from kiln.nn import init
from kiln.nn.modules._lazy import _LazyModuleMixin
from kiln.nn.modules._utils import _check_input_dims, _optional_parameter
from kiln.nn.modules.module import Module
from kiln.nn.parameter import UninitializedBuffer, UninitializedParameter

__all__ = [
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "LazyBatchNorm1d",
    "LazyBatchNorm2d",
    "LazyBatchNorm3d",
    "LazyInstanceNorm1d",
    "LazyInstanceNorm2d",
    "LazyInstanceNorm3d",
    "LayerNorm",
    "GroupNorm",
    "RMSNorm",
    "LocalResponseNorm",
    "CrossMapLRN2d",
]


def _affine_parameters(module: Module, shape, affine: bool, bias: bool, device, dtype) -> None:
    """Register ``weight`` (and ``bias`` when ``bias``) of ``shape`` on ``module``, or ``None`` for each."""
    _optional_parameter(module, "weight", affine, shape, device, dtype)
    _optional_parameter(module, "bias", affine and bias, shape, device, dtype)


def _shape_tuple(normalized_shape) -> tuple:
    """``normalized_shape`` as a tuple (an int ``n`` is ``(n,)``)."""
    if isinstance(normalized_shape, numbers.Integral):
        return (normalized_shape,)
    return tuple(normalized_shape)


def _reset_affine(module: Module, affine: bool) -> None:
    """``weight`` to ones and ``bias`` (if any) to zeros, when ``affine``."""
    if affine:
        init.ones_(module.weight)
        if module.bias is not None:
            init.zeros_(module.bias)


class _NormBase(Module):
    """Affine parameters and running statistics shared by batch and instance norm."""

    _version = 2
    __constants__ = ["track_running_stats", "momentum", "eps", "num_features", "affine"]

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        _affine_parameters(self, num_features, affine, bias, device, dtype)
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, device=device, dtype=dtype))
            self.register_buffer("running_var", ones(num_features, device=device, dtype=dtype))
            self.register_buffer("num_batches_tracked", kiln.tensor(0, dtype=kiln.int64, device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        """Running mean 0, running variance 1, batch count 0."""
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        """Reset the running statistics; ``weight`` to ones and ``bias`` to zeros."""
        self.reset_running_stats()
        _reset_affine(self, self.affine)

    _input_dims: tuple[int, ...] = ()  # the accepted input ranks

    def _check_input_dim(self, input: Tensor) -> None:
        _check_input_dims(input, self._input_dims)

    def extra_repr(self) -> str:
        """``num_features, eps=..., momentum=..., affine=..., bias=..., track_running_stats=...``."""
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}"
        )

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        version = local_metadata.get("version", None) if local_metadata else None
        if (version is None or version < 2) and self.track_running_stats:
            key = prefix + "num_batches_tracked"
            if key not in state_dict:
                state_dict[key] = (
                    self.num_batches_tracked
                    if self.num_batches_tracked is not None
                    else kiln.tensor(0, dtype=kiln.int64)
                )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


class _BatchNorm(_NormBase):
    def forward(self, input: Tensor) -> Tensor:
        """Normalise with batch statistics in training (updating the running ones), running ones in eval."""
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            # momentum=None: cumulative moving average over every batch seen so far
            factor = 1.0 / float(self.num_batches_tracked.item()) if self.momentum is None else self.momentum
        bn_training = True if self.training else (self.running_mean is None and self.running_var is None)
        use_buffers = not self.training or self.track_running_stats
        return F.batch_norm(
            input,
            self.running_mean if use_buffers else None,
            self.running_var if use_buffers else None,
            self.weight,
            self.bias,
            bn_training,
            factor,
            self.eps,
        )


class BatchNorm1d(_BatchNorm):
    """Batch normalisation over ``(N, C)`` or ``(N, C, L)`` (``torch.nn.BatchNorm1d``)."""

    _input_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation over ``(N, C, H, W)`` (``torch.nn.BatchNorm2d``)."""

    _input_dims = (4,)


class BatchNorm3d(_BatchNorm):
    """Batch normalisation over ``(N, C, D, H, W)`` (``torch.nn.BatchNorm3d``)."""

    _input_dims = (5,)


class _InstanceNorm(_NormBase):
    _no_batch_dim = 0

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)

    @property
    def _input_dims(self) -> tuple[int, int]:
        return (self._no_batch_dim, self._no_batch_dim + 1)

    def _apply_instance_norm(self, input: Tensor) -> Tensor:
        return F.instance_norm(
            input,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            self.training or not self.track_running_stats,
            self.momentum if self.momentum is not None else 0.0,
            self.eps,
        )

    def forward(self, input: Tensor) -> Tensor:
        """Normalise each sample's channels over their spatial positions (unbatched input allowed)."""
        self._check_input_dim(input)
        feature_dim = input.dim() - self._no_batch_dim
        if input.size(feature_dim) != self.num_features:
            if self.affine:
                raise ValueError(
                    f"expected input's size at dim={feature_dim} to match num_features"
                    f" ({self.num_features}), but got: {input.size(feature_dim)}."
                )
            warnings.warn(
                f"input's size at dim={feature_dim} does not match num_features. "
                "You can silence this warning by not passing in num_features, "
                "which is not used because affine=False",
                stacklevel=2,
            )
        if input.dim() == self._no_batch_dim:
            return self._apply_instance_norm(input.unsqueeze(0)).squeeze(0)
        return self._apply_instance_norm(input)


class InstanceNorm1d(_InstanceNorm):
    """Instance normalisation over ``(N, C, L)`` or ``(C, L)`` (``torch.nn.InstanceNorm1d``)."""

    _no_batch_dim = 2


class InstanceNorm2d(_InstanceNorm):
    """Instance normalisation over ``(N, C, H, W)`` or ``(C, H, W)`` (``torch.nn.InstanceNorm2d``)."""

    _no_batch_dim = 3


class InstanceNorm3d(_InstanceNorm):
    """Instance normalisation over ``(N, C, D, H, W)`` or ``(C, D, H, W)`` (``torch.nn.InstanceNorm3d``)."""

    _no_batch_dim = 4


class _LazyNormBase(_LazyModuleMixin, _NormBase):
    """``num_features`` (0 until then), ``weight``/``bias`` and the running statistics come from the first
    input's dim 1; the module then becomes ``cls_to_become``."""

    _in_attr = "num_features"

    def __init__(
        self,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ) -> None:
        factory = {"device": device, "dtype": dtype}
        super().__init__(0, eps, momentum, False, False, device, dtype, bias=bias)
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = UninitializedParameter(**factory)
            if bias:
                self.bias = UninitializedParameter(**factory)
        if track_running_stats:
            self.running_mean = UninitializedBuffer(**factory)
            self.running_var = UninitializedBuffer(**factory)
            self.num_batches_tracked = kiln.tensor(0, dtype=kiln.int64, device=device)

    def initialize_parameters(self, input: Tensor) -> None:
        """Materialise the parameters and statistics for ``input.shape[1]`` features, then reset them."""
        if not self.has_uninitialized_params():
            return
        self.num_features = input.shape[1]
        from kiln.autograd.grad_mode import no_grad

        with no_grad():
            for t in (self.weight, self.bias, self.running_mean, self.running_var):
                if t is not None:
                    t.materialize((self.num_features,))
            self.reset_parameters()


class LazyBatchNorm1d(_LazyNormBase, _BatchNorm):
    """A :class:`BatchNorm1d` whose ``num_features`` is inferred from the first input (``torch.nn.LazyBatchNorm1d``)."""

    cls_to_become = BatchNorm1d
    _input_dims = (2, 3)


class LazyBatchNorm2d(_LazyNormBase, _BatchNorm):
    """A :class:`BatchNorm2d` whose ``num_features`` is inferred from the first input (``torch.nn.LazyBatchNorm2d``)."""

    cls_to_become = BatchNorm2d
    _input_dims = (4,)


class LazyBatchNorm3d(_LazyNormBase, _BatchNorm):
    """A :class:`BatchNorm3d` whose ``num_features`` is inferred from the first input (``torch.nn.LazyBatchNorm3d``)."""

    cls_to_become = BatchNorm3d
    _input_dims = (5,)


class LazyInstanceNorm1d(_LazyNormBase, _InstanceNorm):
    """An :class:`InstanceNorm1d` whose ``num_features`` is inferred from the first input's dim 1, as PyTorch
    reads it (``torch.nn.LazyInstanceNorm1d``)."""

    cls_to_become = InstanceNorm1d
    _no_batch_dim = 2


class LazyInstanceNorm2d(_LazyNormBase, _InstanceNorm):
    """An :class:`InstanceNorm2d` whose ``num_features`` is inferred from the first input's dim 1
    (``torch.nn.LazyInstanceNorm2d``)."""

    cls_to_become = InstanceNorm2d
    _no_batch_dim = 3


class LazyInstanceNorm3d(_LazyNormBase, _InstanceNorm):
    """An :class:`InstanceNorm3d` whose ``num_features`` is inferred from the first input's dim 1
    (``torch.nn.LazyInstanceNorm3d``)."""

    cls_to_become = InstanceNorm3d
    _no_batch_dim = 4


class LayerNorm(Module):
    """Normalise over the trailing ``normalized_shape`` dims (``torch.nn.LayerNorm``)."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.normalized_shape = _shape_tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        _affine_parameters(self, self.normalized_shape, elementwise_affine, bias, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``weight`` to ones, ``bias`` to zeros."""
        _reset_affine(self, self.elementwise_affine)

    def forward(self, input: Tensor) -> Tensor:
        """Layer-normalised ``input``."""
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        """``normalized_shape, eps=..., elementwise_affine=..., bias=...``."""
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"bias={self.bias is not None}"
        )


class GroupNorm(Module):
    """Normalise ``(N, C, *)`` over groups of ``C / num_groups`` channels (``torch.nn.GroupNorm``)."""

    __constants__ = ["num_groups", "num_channels", "eps", "affine"]

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if num_channels % num_groups != 0:
            raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        _affine_parameters(self, num_channels, affine, bias, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``weight`` to ones, ``bias`` to zeros."""
        _reset_affine(self, self.affine)

    def forward(self, input: Tensor) -> Tensor:
        """Group-normalised ``input``."""
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        """``num_groups, num_channels, eps=..., affine=..., bias=...``."""
        return (
            f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
            f"bias={self.bias is not None}"
        )


class RMSNorm(Module):
    """Root-mean-square normalisation over the trailing ``normalized_shape`` dims (``torch.nn.RMSNorm``)."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(
        self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, device=None, dtype=None
    ) -> None:
        super().__init__()
        self.normalized_shape = _shape_tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        _optional_parameter(self, "weight", elementwise_affine, self.normalized_shape, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``weight`` to ones."""
        if self.elementwise_affine:
            init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        """RMS-normalised ``x`` (``eps`` defaults to the dtype's machine epsilon)."""
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        """``normalized_shape, eps=..., elementwise_affine=...``."""
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class LocalResponseNorm(Module):
    """Normalise each channel by the activity of ``size`` neighbouring channels (``torch.nn.LocalResponseNorm``)."""

    __constants__ = ["size", "alpha", "beta", "k"]

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> None:
        super().__init__()
        self.size = size
        self.alpha = alpha
        self.beta = beta
        self.k = k

    def forward(self, input: Tensor) -> Tensor:
        """The normalised input."""
        return F.local_response_norm(input, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        """``size, alpha=..., beta=..., k=...``."""
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


class CrossMapLRN2d(Module):
    """Local response normalisation across the channels of ``(N, C, H, W)`` input, Lua Torch's
    ``SpatialCrossMapLRN`` (``torch.nn.CrossMapLRN2d``): ``x / (k + alpha/size * S)^beta`` with ``S`` the sum of
    squares over a window of channels.

    The window is PyTorch's, which runs a sum along the channels: channel ``c`` sums channels
    ``c - (size-1)//2 .. c + (size-1)//2``, except that channel 0, once added, is never dropped again. The
    gradient is the derivative of that forward; PyTorch's hand-written backward is not (its own
    ``gradcheck`` fails), so gradients differ from PyTorch's. Use :class:`LocalResponseNorm` for the
    standard definition.
    """

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1) -> None:
        super().__init__()
        self.size = size
        self.alpha = alpha
        self.beta = beta
        self.k = k

    def _window(self, channels: int):
        """(channels, channels) 0/1 matrix: which channels' squares each channel's scale sums."""
        import numpy as np

        pre_pad = int((self.size - 1) / 2 + 1)
        window = np.zeros((channels, channels))
        window[0, : min(pre_pad, channels)] = 1
        for c in range(1, channels):
            window[c] = window[c - 1]
            if c < channels - pre_pad + 1:
                window[c, c + pre_pad - 1] += 1
            if c > pre_pad:
                window[c, c - pre_pad] -= 1
        return window

    def forward(self, input: Tensor) -> Tensor:
        """The normalised input."""
        if input.dim() != 4:
            raise ValueError(f"CrossMapLRN2d: Expected input to be 4D, got {input.dim()}D instead.")
        window = kiln.tensor(self._window(input.shape[1]), dtype=input.dtype, device=input.device)
        sums = kiln.einsum("dc,nchw->ndhw", window, input * input)
        return input * (sums * (self.alpha / self.size) + self.k).pow(-self.beta)

    def extra_repr(self) -> str:
        """``size, alpha=..., beta=..., k=...``."""
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"

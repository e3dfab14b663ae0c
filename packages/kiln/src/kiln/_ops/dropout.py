"""nn primitives: the dropout family (``dropout``, ``alpha_dropout``, ``feature_alpha_dropout``,
``dropout1d``/``2d``/``3d``; ``torch.nn.functional`` names).

Masks are drawn from kiln's default generator of the input's device (``kiln.manual_seed`` makes them
reproducible) once in forward and saved by the product for backward (``_fused_dropout``).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import scalar_type_name
from kiln._ops.elementwise import _compute_np
from kiln._ops.softmax import _check_tensor
from kiln._spec import Spec
from kiln._tensor import Tensor, _numel

__all__ = ["dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"]

TOP_LEVEL = (
    "alpha_dropout",
    "alpha_dropout_",
    "dropout",
    "dropout_",
    "feature_alpha_dropout",
    "feature_alpha_dropout_",
    "feature_dropout",
    "feature_dropout_",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""


# ---------------------------------------------------------------------------------------- dropout


def _check_p(p) -> None:
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _noise(input: Tensor, p: float, feature: bool) -> Tensor:
    """A 0/1 keep mask (probability ``1 - p``) of the input's dtype, drawn from kiln's default generator
    of its device: elementwise, or one value per (sample, channel) for feature dropout."""
    from kiln._ops.random_ops import rand

    shape = input._shape
    if feature:
        if len(shape) < 2:
            raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
        shape = shape[:2] + (1,) * (len(shape) - 2)
    if not input._dtype.is_floating_point:
        raise RuntimeError(
            f"result type Float can't be cast to the desired output type {scalar_type_name(input._dtype)}"
        )
    return (rand(shape, dtype=dt.float64, device=input.device) < (1.0 - p)).to(input.dtype)


def _fused_dropout_meta(input, uniform, p):
    if not isinstance(input, Tensor) or not isinstance(uniform, Tensor) or uniform._shape != input._shape:
        raise RuntimeError("_fused_dropout: uniform must be a tensor of the input's shape")
    if uniform._dtype is not dt.float64 or not input._dtype.is_floating_point:
        raise RuntimeError("_fused_dropout: a floating input and float64 uniform draws are expected")
    spec = Spec((input._shape, input._dtype, input._device))
    return spec, spec


def _fused_dropout_ref(spec, x, u, p):
    d = spec[0].dtype
    compute = _compute_np(d)
    # the arithmetic of the composite it replaces: keep = u < 1 - p as 0/1 in x's dtype, noise = keep /
    # (1 - p) (a Python float: computed in the compute dtype, then rounded to x's), out = x * noise
    keep = (u < (1.0 - p)).astype(compute)
    noise = np.true_divide(keep, 1.0 - p, dtype=compute).astype(d.numpy, copy=False)
    out = np.multiply(x.astype(compute, copy=False), noise.astype(compute, copy=False), dtype=compute)
    return out.astype(d.numpy, copy=False), noise


def _fused_dropout_backward(grads, result):
    return grads[0] * result[1], None


@op(
    tags=("nn", "random"),
    meta=_fused_dropout_meta,
    reference=_fused_dropout_ref,
    backward=_fused_dropout_backward,
    num_outputs=2,
    differentiable_outputs=(0,),
    grad_fn_name="MulBackward0",  # PyTorch's CPU dropout is a multiplication by the scaled mask too
)
def _fused_dropout(input: Tensor, uniform: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """Dropout's arithmetic in one op, given the uniform draws ``uniform`` (float64, input's shape):
    ``noise = (uniform < 1 - p) / (1 - p)`` in the input's dtype and ``input * noise``; returns both (the
    backward multiplies by ``noise``). Backends fuse the passes; the draws stay with kiln's generator."""


def _dropout_impl(input, p, train, inplace, feature, alpha):
    _check_tensor(input, "dropout")
    if p == 0 or not train or _numel(input._shape) == 0:
        return input
    if p == 1:
        if feature and len(input._shape) < 2:
            raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
        zero = input.new_zeros(())
        return input.mul_(zero) if inplace else input * zero
    if not (alpha or feature or inplace):
        if not input._dtype.is_floating_point:
            _noise(input, p, feature)  # raises PyTorch's error
        from kiln._ops.random_ops import rand

        return _fused_dropout(input, rand(input._shape, dtype=dt.float64, device=input.device), p)[0]
    noise = _noise(input, p, feature)
    if not alpha:
        noise = noise / (1.0 - p)
        return input.mul_(noise) if inplace else input * noise
    a_coef = 1.7580993408473766
    a = 1.0 / math.sqrt((a_coef * a_coef * p + 1) * (1 - p))
    shift = (noise - 1) * (a_coef * a) + a_coef * a * p
    noise = noise * a
    out = input.mul_(noise) if inplace else input * noise
    return out.add_(shift) if inplace else out + shift


def dropout(input, p=0.5, training=True, inplace=False):
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)`` (identity when not
    ``training``); the mask comes from kiln's default generator."""
    _check_p(p)
    return _dropout_impl(input, p, training, inplace, False, False)


def alpha_dropout(input, p=0.5, training=False, inplace=False):
    """Dropout that keeps a SELU network's mean and variance: dropped elements take SELU's negative
    saturation value, then an affine correction is applied."""
    _check_p(p)
    return _dropout_impl(input, p, training, inplace, False, True)


def feature_alpha_dropout(input, p=0.5, training=False, inplace=False):
    """Alpha dropout of whole channels (one draw per sample and channel)."""
    _check_p(p)
    return _dropout_impl(input, p, training, inplace, True, True)


_FEATURE_NOTE = (
    "Note that dropout{k}d exists to provide channel-wise dropout on inputs with {k} spatial dimension{s}, a "
    "channel dimension, and an optional batch dimension (i.e. {lo}D or {hi}D inputs)."
)


def dropout1d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of ``(N, C, L)`` or ``(C, L)`` input with probability ``p`` (scaling the rest)."""
    _check_p(p)
    _check_tensor(input, "dropout1d")
    nd = input.dim()
    if nd not in (2, 3):
        raise RuntimeError(
            f"dropout1d: Expected 2D or 3D input, but received a {nd}D input. "
            + _FEATURE_NOTE.format(k=1, s="", lo=2, hi=3)
        )
    return _batched_feature_dropout(input, p, training, inplace, nd == 3)


def _batched_feature_dropout(input, p, training, inplace, batched):
    if batched:
        return _dropout_impl(input, p, training, inplace, True, False)
    out = _dropout_impl(input.unsqueeze(0), p, training, inplace, True, False)
    return input if inplace else out.squeeze(0)


def _deprecated_rank(k: int, nd: int) -> None:
    warnings.warn(
        f"dropout{k}d: Received a {nd}-D input to dropout{k}d, which is deprecated and will result in an error in a "
        "future release. To retain the behavior and silence this warning, please use dropout instead. "
        + _FEATURE_NOTE.format(k=k, s="s", lo=k + 1, hi=k + 2),
        UserWarning,
        stacklevel=3,
    )


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of ``(N, C, H, W)`` or ``(C, H, W)`` input with probability ``p``."""
    _check_p(p)
    _check_tensor(input, "dropout2d")
    nd = input.dim()
    if nd not in (3, 4):
        _deprecated_rank(2, nd)
    if nd == 3:
        warnings.warn(
            "dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout behavior is "
            "desired - input is interpreted as shape (N, C, L), where C is the channel dim. This behavior will "
            "change in a future release to interpret the input as one without a batch dimension, i.e. shape "
            "(C, H, W). To maintain the 1D channel-wise dropout behavior, please switch to using dropout1d instead.",
            UserWarning,
            stacklevel=2,
        )
    return _dropout_impl(input, p, training, inplace, True, False)


def dropout3d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input with probability ``p``."""
    _check_p(p)
    _check_tensor(input, "dropout3d")
    nd = input.dim()
    if nd not in (4, 5):
        _deprecated_rank(3, nd)
    return _batched_feature_dropout(input, p, training, inplace, nd == 5)


# ---------------------------------------------------------------------------------------- torch's low-level names


def _low_level(feature: bool, alpha: bool, inplace: bool):
    """``torch.dropout``-style functions ``(input, p, train)`` (``p`` outside ``[0, 1]`` is a RuntimeError)."""

    def fn(input: Tensor, p: float, train: bool) -> Tensor:
        if not 0.0 <= p <= 1.0:
            raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {p}")
        if p == 1 and train and not alpha:
            return input.mul_(0) if inplace else input * 0
        out = _dropout_impl(input, p, train, inplace, feature, alpha)
        return out if inplace or out is not input else input.clone()

    return fn


dropout_ = _low_level(False, False, True)
dropout_.__doc__ = "In-place :func:`dropout` with PyTorch's low-level signature ``(input, p, train)``."
alpha_dropout_ = _low_level(False, True, True)
alpha_dropout_.__doc__ = "In-place :func:`alpha_dropout` with the signature ``(input, p, train)``."
feature_alpha_dropout_ = _low_level(True, True, True)
feature_alpha_dropout_.__doc__ = "In-place :func:`feature_alpha_dropout` with the signature ``(input, p, train)``."
feature_dropout = _low_level(True, False, False)
feature_dropout.__doc__ = (
    "Dropout of whole channels (one draw per sample and channel) with the signature ``(input, p, train)``."
)
feature_dropout_ = _low_level(True, False, True)
feature_dropout_.__doc__ = "In-place :func:`feature_dropout`."
for _name in ("dropout_", "alpha_dropout_", "feature_alpha_dropout_", "feature_dropout", "feature_dropout_"):
    globals()[_name].__name__ = globals()[_name].__qualname__ = _name
del _name
